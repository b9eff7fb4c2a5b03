"""`heads`: per model and decoder layer, the text → vision attention mass averaged over heads and
its largest head, and the attention-sink mass of the decode step and its largest head
(`heads.head_vision_mass`, `heads.attention_sink`). Figure `heads.png`: heat maps per model.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from ..bootstrap import summarize
from ..figures import FigureFile, Plot
from ..plotting import DECODER_LAYER_LABEL, heatmap, not_stored
from ..heads import attention_sink, head_vision_mass
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, estimate, extreme_head, missing


def heads_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Per decoder layer: the text→vision attention mass averaged over heads and its largest head,
    and the attention-sink mass of the decode step (`analyses.heads`), in the reference condition."""
    ref = options.reference
    b = Builder("heads", f"Attention per head: text→vision mass and the sink (condition {ref}, decode step "
                f"{options.step})", ["model", "layer", "text→vision mass, head mean", "most vision-attending head",
                                     "sink mass (first position), head mean", "largest sink head"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, (), (ref,))
        if "prefill_vision_mass" not in ds.data_vars and "decode_attention" not in ds.data_vars:
            lacking.append("prefill_vision_mass or decode_attention (capture `attention`)")
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        per_head = {}
        if "prefill_vision_mass" in ds.data_vars:
            per_head["vision_mass"] = head_vision_mass(ds, force=options.force)["mass"].sel(
                condition=ref, modality="text")
        if "decode_attention" in ds.data_vars:
            per_head["sink"] = attention_sink(ds, force=options.force)["sink"].sel(condition=ref, step=options.step)
        per_head = {k: v.drop_vars(["condition", "modality", "step"], errors="ignore") for k, v in per_head.items()}
        by_head = {k: summarize(v, **options.boot()) for k, v in per_head.items()}
        head_mean = {k: summarize(v.mean("head"), **options.boot()) for k, v in per_head.items()}
        layers = next(iter(per_head.values()))["decoder_layer"].values
        for layer in layers:
            cells = []
            for name in ("vision_mass", "sink"):
                mean = head_mean.get(name)
                cells += [estimate(mean.sel(decoder_layer=layer), 3) if mean is not None else "n/a",
                          extreme_head(by_head[name].sel(decoder_layer=layer), "head") if name in by_head else "n/a"]
            b.table.rows.append([model, str(int(layer)), *cells])
            b.count(model, *(m.sel(decoder_layer=layer) for m in head_mean.values()))
        return xr.Dataset({f"{k}_by_head": v for k, v in by_head.items()} | {f"{k}_head_mean": v for k, v in head_mean.items()})

    return b.run(models, need, fill, first_note=(
        "Text→vision mass: per text query token, the head's prefill attention on vision keys, "
        "averaged over the sample's text tokens. Sink: the decode query's attention on the first "
        "prompt position. The most vision-attending / largest sink head is the one with the "
        "largest mean over samples (its CI beside it)."))


def heads(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `heads` table as heat maps, one row per model: each head's text→vision attention mass
    and its attention-sink mass (mean over samples) by decoder layer. A model that lacks one of
    them says so in its panel."""
    plot = Plot("heads", f"Attention per head: text→vision mass and the sink ({options.reference}, step "
                f"{options.step})", options, out)
    data = plot.table(heads_table, models, options)
    if data is None:
        return plot.file
    panels = [(k, label, need) for k, label, need in (
        ("vision_mass_by_head", "text→vision mass", "prefill_vision_mass"),
        ("sink_by_head", "sink mass (first position)", "decode_attention")) if k in data]
    names = [str(m) for m in data.model.values]
    fig, axes = plot.grid(len(names), len(panels), width=4.6)
    for i, model in enumerate(names):
        for j, (key, label, need) in enumerate(panels):
            ax = axes[i, j]
            values = data[key].sel(model=model, stat="value").dropna("head", how="all").dropna("decoder_layer", how="all")
            if not values.size:
                not_stored(ax, f"{model}: no {label} (needs {need})")
                continue
            heatmap(fig, ax, values, "head", "decoder_layer", "attention probability", vmin=0.0)
            ax.set(title=f"{model}: {label}", xlabel="head", ylabel=DECODER_LAYER_LABEL)
    return plot.finish()


register_analysis(Analysis(
    name="heads", section="Attention per head: vision mass and the sink", inputs=("prefill_vision_mass", "decode_attention"),
    metrics=(head_vision_mass, attention_sink), table=heads_table, figures=(heads,), order=90))
