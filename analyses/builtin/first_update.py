"""`first-update`: per model and modality, the relative first update ‖u₁‖/‖h₀‖
(`updates.relative_update`) and the rotation cos(h₁, h₀) (`rotation.cosine_to_first`) in the
reference condition. Figure `cosine_to_first.png`: cos(h_l, h_0) per layer, by modality, one panel
per model.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import rotation, updates
from ..figures import FigureFile, Plot, two_layers
from ..plotting import MODALITY_COLORS, band, layer_axis
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, estimate, missing, modalities


def first_update_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref = options.reference
    b = Builder("first-update", f"Relative first update and rotation (layer 1, condition {ref})",
                ["model", "modality", "‖u₁‖/‖h₀‖", "cos(h₁,h₀)"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        rel = updates.relative_update(ds, text_set=text_set, **options.boot()).sel(condition=ref, layer=1)
        cos = rotation.cosine_to_first(ds, text_set=text_set, **options.boot()).sel(condition=ref, layer=1)
        for modality in [m for m in ("vision", "text") if m in modalities(ds, ref)]:
            b.table.rows.append([model, modality.capitalize(), estimate(rel.sel(modality=modality), 2),
                                 estimate(cos.sel(modality=modality), 2)])
            b.count(model, rel.sel(modality=modality), cos.sel(modality=modality))
        return xr.Dataset({"relative_update": rel.drop_vars("n_samples"), "cos_first": cos.drop_vars("n_samples")})

    return b.run(models, lambda ds: missing(ds, ("hidden",), (ref,), (0, 1)), fill)


def cosine_to_first(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    plot = Plot("cosine_to_first", f"Cosine similarity to the layer-0 hidden state ({ref})", options, out)
    ready = plot.ready(models, lambda ds: missing(ds, ("hidden",), (ref,), (0,)) or two_layers(ds))
    if not ready:
        return plot.file
    _, axes = plot.grid(1, len(ready))
    for ax, (model, ds) in zip(axes[0], ready.items()):
        cos = rotation.cosine_to_first(ds, text_set=options.definitions_for(ds)["text_set"], **options.boot()).sel(condition=ref)
        for modality, color in MODALITY_COLORS.items():
            band(ax, cos.layer, cos.sel(modality=modality), color, modality)
        ax.axhline(0, color="#999999", linewidth=0.8)
        ax.set(title=model, ylabel="mean cos(h_l, h_0) (unitless)")
        ax.set_ylim(top=1.05)
        layer_axis(ax.xaxis)
    return plot.finish("modality")


register_analysis(Analysis(
    name="first-update", section="First-layer update and rotation by modality", inputs=("hidden",),
    metrics=(updates.relative_update, rotation.cosine_to_first), table=first_update_table, figures=(cosine_to_first,),
    claim="high norms dilute vision-token updates: the first layer changes vision tokens less, relative to their "
          "norm, than text tokens (Observation 2)", order=20))
