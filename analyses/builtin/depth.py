"""`depth`: per model and layer, the mean ‖h_l‖₂ and ‖h_l − h_{l−1}‖₂/‖h_{l−1}‖₂ over all
tokens of the reference condition (`residual.residual_geometry`; `analyses.depth` has the
per-token versions). Figure `depth.png`: both as curves, one line per model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from ..bootstrap import summarize
from ..figures import FigureFile, Plot
from ..plotting import band, layer_axis, model_colors
from ..registry import Analysis, register_analysis
from ..residual import residual_geometry
from ..tables import Builder, Options, Table, estimate, missing


def depth_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Norm growth and per-layer update size with depth over all tokens of the reference condition
    (each sample's token mean, then the mean over samples with its CI)."""
    ref = options.reference
    b = Builder("depth", f"Residual-stream norm and update size by depth (all tokens, condition {ref})",
                ["model", "layer", "mean ‖h_l‖₂", "‖h_l − h_(l−1)‖₂ / ‖h_(l−1)‖₂"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("hidden",), (ref,))
        if not lacking and ds.sizes.get("layer", 0) < 2:
            lacking = [f"two or more layers (the store holds layer {', '.join(str(int(l)) for l in ds['layer'].values)})"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        geometry = residual_geometry(ds, force=options.force).sel(condition=ref)
        tokens = geometry["tokens"]
        weights = tokens / tokens.sum("modality")  # each modality by its share of a sample's tokens
        per_sample = xr.Dataset({name: (geometry[name] * weights).sum("modality", min_count=1)
                                 .where(np.isfinite(geometry[name]).any("modality"))
                                 for name in ("norm", "relative_update")})
        data = summarize(per_sample, **options.boot())
        for layer in data.layer.values:
            row = data.sel(layer=layer)
            b.table.rows.append([model, str(int(layer)), estimate(row["norm"], 2), estimate(row["relative_update"], 3)])
            b.count(model, row["norm"])
        return data

    return b.run(models, need, fill, first_note=(
        "h_l: the residual stream after l decoder layers (0 = the LLM input). The ratio at "
        "layer l is what the l-th decoder layer wrote relative to the stream it read (n/a at "
        "layer 0, or where layer l−1 is not stored). Per-token values and massive "
        "activations: analyses.depth."))


def depth(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `depth` table as curves: norm growth and the update ratio per layer, one line per model."""
    plot = Plot("depth", f"Residual-stream norm and update ratio by depth (all tokens, {options.reference})",
                options, out)
    data = plot.table(depth_table, models, options)
    if data is None:
        return plot.file
    colors = model_colors(list(models))
    _, axes = plot.grid(1, 2)
    for model in data.model.values:
        row = data.sel(model=model)
        band(axes[0, 0], row.layer, row["norm"], colors[str(model)], str(model), marker="o")
        band(axes[0, 1], row.layer, row["relative_update"], colors[str(model)], str(model), marker="o")
    axes[0, 0].set(title="‖h_l‖₂ (mean over tokens)", ylabel="L2 norm (activation units)", yscale="log")
    axes[0, 1].set(title="‖h_l − h_(l−1)‖₂ / ‖h_(l−1)‖₂", ylabel="update ratio (unitless)")
    for ax in axes[0]:
        layer_axis(ax.xaxis)
    return plot.finish("model")


register_analysis(Analysis(
    name="depth", section="Norm growth and update size with depth", inputs=("hidden",),
    metrics=(residual_geometry,), table=depth_table, figures=(depth,), order=80))
