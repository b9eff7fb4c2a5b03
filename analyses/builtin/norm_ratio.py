"""`norm-ratio`: the vision/text norm ratio at the LLM input (layer 0) in the reference condition
(`norms.vision_text_ratio`), one row per model. Figure `norms_updates.png`: ‖h_l‖ and
‖h_l − h_{l−1}‖ per layer, by modality, one column per model.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import norms, updates
from ..figures import FigureFile, Plot, two_layers
from ..plotting import MODALITY_COLORS, band, layer_axis
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, estimate, lacks_modalities, missing


def norm_ratio_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref = options.reference
    b = Builder("norm-ratio", f"Vision/text norm ratio at the LLM input (layer 0, condition {ref})",
                ["model", "vision/text norm ratio"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        ratio = norms.vision_text_ratio(ds, layer=0, text_set=text_set, **options.boot()).sel(condition=ref)
        b.table.rows.append([model, estimate(ratio, 2)])
        b.count(model, ratio)
        return ratio.to_dataset(name="norm_ratio")

    return b.run(models, lambda ds: missing(ds, ("hidden",), (ref,), (0,)) + lacks_modalities(ds, ref), fill)


def norms_updates(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    plot = Plot("norms_updates", f"Residual-stream norm and update magnitude per layer ({ref})", options, out)
    ready = plot.ready(models, lambda ds: missing(ds, ("hidden",), (ref,)) or two_layers(ds))
    if not ready:
        return plot.file
    _, axes = plot.grid(2, len(ready))
    for col, (model, ds) in enumerate(ready.items()):
        norm = norms.norm_curves(ds, text_set=options.definitions_for(ds)["text_set"], **options.boot()).sel(condition=ref)
        update = updates.absolute_update(ds, **options.boot()).sel(condition=ref)
        for modality, color in MODALITY_COLORS.items():
            band(axes[0, col], norm.layer, norm.sel(modality=modality), color, modality)
            band(axes[1, col], update.layer, update.sel(modality=modality), color, modality)
        axes[0, col].set(title=f"{model}: ‖h_l‖₂", ylabel="mean token L2 norm (activation units)", yscale="log")
        axes[1, col].set(title=f"{model}: ‖h_l − h_(l−1)‖₂", ylabel="mean update L2 norm (activation units)",
                         yscale="log")
        for ax in axes[:, col]:
            layer_axis(ax.xaxis)
    return plot.finish("modality")


register_analysis(Analysis(
    name="norm-ratio", section="Vision and text token norms at the LLM input", inputs=("hidden",),
    metrics=(norms.vision_text_ratio, norms.norm_curves, updates.absolute_update),
    table=norm_ratio_table, figures=(norms_updates,),
    claim="vision tokens enter the LLM with higher norms than text tokens (Observation 1)", order=10))
