"""`trajectories`: per model, swept α and layer, the vision tokens' mean ‖h_l‖₂ and their cosine to
the reference's same token (`trajectories.vision_trajectories`). Figure
`trajectories_vs_alpha.png`: both as curves over layers, one line per swept value.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import trajectories
from ..figures import LAYER_LABEL, FigureFile, band, condition_colors, finish, from_table, grid
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
    """The `trajectories` table as curves over layers, one line per swept value: the vision tokens'
    norm and their cosine to the reference."""
    title = f"Vision-token trajectories against {sweep_name(options.sweep)} ({options.reference})"
    fig_file, data = from_table("trajectories_vs_alpha.png", title, trajectories_table, models, options)
    if data is None:
        return fig_file
    fig, axes = grid(len(data.model), 2)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model).dropna("condition", how="all")
        colors = condition_colors([str(c) for c in values.condition.values])
        for condition in values.condition.values:
            curve = values.sel(condition=condition)
            band(axes[row, 0], curve.layer, curve["norm"], colors[str(condition)], str(condition), marker="o")
            band(axes[row, 1], curve.layer, curve["cos_reference"], colors[str(condition)], str(condition), marker="o")
        axes[row, 0].set(title=f"{model}: vision ‖h_l‖₂", xlabel=LAYER_LABEL, ylabel="L2 norm (activation units)",
                         yscale="log")
        axes[row, 1].set(title=f"{model}: cos(h_l, h_l of {options.reference})", xlabel=LAYER_LABEL,
                         ylabel="cosine (unitless)")
    return finish(fig, axes, "condition", title, fig_file, out)


register_analysis(Analysis(
    name="trajectories", section="Vision-token trajectories against α", inputs=("hidden",),
    metrics=(trajectories.vision_trajectories,), table=trajectories_table, figures=(trajectories_vs_alpha,),
    claim="inference-time downscaling breaks visual trajectories, decode-time attention patterns, and output logits",
    order=120))
