"""`expert-load`: per mixture-of-experts model and decoder layer, which experts vision and text
tokens are routed to (`experts.expert_load`): each modality's most-loaded expert and the
total-variation distance between the two loads. Figure `expert_load.png`: per model, the vision
and the text load as heat maps (expert x decoder layer, one colour scale) and the distance per
decoder layer.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import experts
from ..figures import FigureFile, Plot
from ..plotting import DECODER_LAYER_LABEL, MODALITY_COLORS, band, heatmap, layer_axis, not_stored
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, estimate, lacks_modalities, missing


def _top(load: xr.DataArray) -> str:
    """`expert e: share [CI]` of the expert with the largest mean load (n/a where none has one)."""
    values = load.sel(stat="value")
    if not values.notnull().any():
        return "n/a"
    e = int(values.fillna(-1).argmax("expert"))
    return f"expert {int(load['expert'][e])}: {estimate(load.isel(expert=e), 3)}"


def expert_load_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref = options.reference
    b = Builder("expert-load", f"Expert load of vision and text tokens by MoE layer (condition {ref})",
                ["model", "decoder layer", "experts", "vision: most-loaded expert", "text: most-loaded expert",
                 "vision–text distance (TV)"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        data = experts.expert_load(ds, text_set=text_set, **options.boot()).sel(condition=ref)
        for layer in data["decoder_layer"].values:
            row = data.sel(decoder_layer=layer)
            if not row["load"].sel(stat="value").notnull().any():
                continue   # a dense layer of an interleaved model
            b.table.rows.append([model, str(int(layer)), str(data.sizes["expert"]),
                                 _top(row["load"].sel(modality="vision")), _top(row["load"].sel(modality="text")),
                                 estimate(row["distance"], 3)])
            b.count(model, row["distance"])
        return data

    def need(ds: xr.Dataset) -> list[str]:
        return missing(ds, experts.VARIABLES, (ref,)) or lacks_modalities(ds, ref)

    return b.run(models, need, fill, first_note=(
        "Load: the share of a modality's routing slots (k per token) that go to an expert, over a "
        "sample's tokens (summing to 1 over the experts; uniform routing gives 1/E). Distance: "
        "½ Σ_e |load_vision − load_text| per sample (0: the modalities use the experts alike; 1: no "
        "expert serves both). Dense layers are left out. Per-token shares: analyses.experts.token_shares."))


def expert_load(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `expert-load` table's data drawn: per model, the vision and the text load per expert
    and decoder layer (heat maps on one colour scale), and the vision–text distance per layer."""
    plot = Plot("expert_load", f"Expert load of vision and text tokens ({options.reference})", options, out)
    data = plot.table(expert_load_table, models, options)
    if data is None:
        return plot.file
    names = [str(m) for m in data.model.values]
    fig, axes = plot.grid(len(names), 3, width=4.6)
    for i, model in enumerate(names):
        values = data.sel(model=model).dropna("decoder_layer", how="all", subset=["distance"])
        top = float(values["load"].sel(stat="value").max())
        for j, modality in enumerate(("vision", "text")):
            ax = axes[i, j]
            load = values["load"].sel(modality=modality, stat="value").dropna("expert", how="all")
            if load.sizes.get("decoder_layer", 0) < 1 or load.size < 2:
                not_stored(ax, f"{model}: no {modality} routing to draw")
                continue
            heatmap(fig, ax, load, "expert", "decoder_layer", "share of routing slots", vmin=0.0, vmax=top)
            ax.set(title=f"{model}: {modality} load", xlabel="expert", ylabel=DECODER_LAYER_LABEL)
        ax = axes[i, 2]
        if values.sizes["decoder_layer"] < 2:
            not_stored(ax, f"{model}: one MoE layer stored (a curve over layers needs two or more)")
            continue
        band(ax, values["decoder_layer"], values["distance"], MODALITY_COLORS["boundary"], None, marker="o")
        ax.set(title=f"{model}: vision–text distance", ylabel="total-variation distance")
        ax.set_ylim(bottom=0.0)
        layer_axis(ax.xaxis, DECODER_LAYER_LABEL)
    return plot.finish()


register_analysis(Analysis(
    name="expert-load", section="Expert load of vision and text tokens (mixture of experts)",
    inputs=experts.VARIABLES, metrics=(experts.expert_load,), table=expert_load_table, figures=(expert_load,),
    order=155))
