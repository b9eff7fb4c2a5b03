"""`trajectories`: per model, swept α and layer, the vision tokens' mean ‖h_l‖₂ and their cosine to
the reference's same token (`trajectories.vision_trajectories`). Figure
`trajectories_vs_alpha.png`: both as curves over layers, one line per swept value.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import trajectories
from ..figures import FigureFile, Plot
from ..plotting import ALPHA_LABEL, band, colorbar, layer_axis, sweep_colors
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, estimate, missing, sweep_conditions, sweep_name


def trajectories_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Vision trajectories against α (`trajectories.vision_trajectories`): per swept value and
    layer, the vision tokens' mean norm and their cosine to the reference's same token."""
    ref, sweep = options.reference, options.sweep
    symbol = sweep if sweep != "alpha" else "α"
    b = Builder("trajectories", f"Vision-token trajectories against {symbol} (cosine to {ref})",
                ["model", symbol, "layer", "vision ‖h_l‖₂", "cos(h_l, h_l^ref)"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("hidden",), (ref,))
        if not lacking and not sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = sweep_conditions(ds, sweep)
        data = trajectories.vision_trajectories(ds, ref, force=options.force, **options.boot())
        data = data.reindex(condition=[c for c, _, _ in conditions])
        for condition, _, label in conditions:
            for layer in data.layer.values:
                row = data.sel(condition=condition, layer=layer)
                b.table.rows.append([model, label, str(int(layer)), estimate(row["norm"], 2),
                                     estimate(row["cos_reference"], 3)])
                b.count(model, row["norm"])
        return data

    return b.run(models, need, fill, first_note=(
        f"Means over a sample's vision tokens, then over samples. cos(h_l, h_l^ref): the same token "
        f"(sample, position) of {ref}. Every stored layer; capture all layers in the sweep."))


def trajectories_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `trajectories` table as curves over layers, one line per swept value, coloured along a
    sequential map of the value (the colour bar reads it): the vision tokens' norm and their
    cosine to the reference."""
    sweep, ref = options.sweep, options.reference
    plot = Plot("trajectories_vs_alpha", f"Vision-token trajectories against {sweep_name(sweep)} ({ref})", options, out)
    data = plot.table(trajectories_table, models, options)
    if data is None:
        return plot.file
    if data.sizes["layer"] < 2:
        return plot.skip(f"two or more layers for a curve over layers (the store holds layer "
                         f"{', '.join(str(int(l)) for l in data.layer.values)})")
    fig, axes = plot.grid(len(data.model), 2)
    swept = {c: v for ds in models.values() for c, v, _ in sweep_conditions(ds, sweep)}
    values = sorted(set(swept.values()))
    colors, mappable = sweep_colors(values)
    color_of = dict(zip(values, colors))
    for row, model in enumerate(data.model.values):
        curves = data.sel(model=model).dropna("condition", how="all")
        for condition in [str(c) for c in curves.condition.values]:
            curve = curves.sel(condition=condition)
            color, label = color_of[swept[condition]], f"{sweep_name(sweep)} = {swept[condition]:g}"
            band(axes[row, 0], curve.layer, curve["norm"], color, label, marker="o")
            band(axes[row, 1], curve.layer, curve["cos_reference"], color, label, marker="o")
        axes[row, 0].set(title=f"{model}: vision ‖h_l‖₂", ylabel="L2 norm (activation units)", yscale="log")
        axes[row, 1].set(title=f"{model}: cos(h_l, h_l of {ref})", ylabel="cosine (unitless)")
        for ax in axes[row]:
            layer_axis(ax.xaxis)
    colorbar(fig, mappable, axes.ravel(), ALPHA_LABEL if sweep == "alpha" else sweep)
    return plot.finish(legend=None)


register_analysis(Analysis(
    name="trajectories", section="Vision-token trajectories against α", inputs=("hidden",),
    metrics=(trajectories.vision_trajectories,), table=trajectories_table, figures=(trajectories_vs_alpha,),
    claim="inference-time downscaling breaks visual trajectories, decode-time attention patterns, and output logits",
    order=120))
