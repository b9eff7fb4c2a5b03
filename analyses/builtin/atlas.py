"""`atlas`: the norm atlas (specs/norm_atlas.yaml), one row per model: norms across the
vision-language interface: vision layers, tower output, connector output, text, embedding table,
boundary tokens and the ratio (`atlas.norm_atlas`). Figure `norm_ladder.png`: mean norm per stage
(vision layers → LLM input), vision vs text, per model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from .. import atlas
from ..bootstrap import STATS
from ..figures import FigureFile, Plot
from ..plotting import MODALITY_COLORS, band
from ..registry import Analysis, register_analysis
from ..streaming import as_str
from ..tables import Builder, Options, Table, estimate, missing


ATLAS_COLUMNS = ["model", "family", "vision layers ‖v_l‖ (l = 0, 1, …)", "tower output ‖v‖",
                 "connector output ‖p‖ (LLM input)", "text ‖t‖ (LLM input)", "embedding table ‖e‖ mean (p5, p50, p95)",
                 "boundary tokens ‖e‖ (rank of V)", "vision/text ratio (LLM input)"]


def _boundary_cell(data: xr.Dataset, vocab: int) -> str:
    if not data.sizes.get("boundary_id"):
        return "none"
    return ", ".join(f"{text} {norm:.2f} ({int(rank)}/{vocab})" for text, norm, rank in
                     zip(as_str(data["boundary_text"].values), data["boundary_norm"].values, data["boundary_rank"].values))


def atlas_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """The norm atlas (specs/norm_atlas.yaml), one row per model: where each family's vision tokens
    and text tokens sit in norm, from the tower to the LLM input."""
    ref = options.reference
    b = Builder("atlas", f"Norm atlas across the vision-language interface (condition {ref})", ATLAS_COLUMNS, options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        data = atlas.norm_atlas(ds, ref, **options.boot())
        vocab = ds.sizes["embed_row"]
        layers = ", ".join(f"{v:.2f}" for v in data["vision_layer_norm"].sel(stat="value").values)
        table = f"{float(data['table_mean']):.3f} ({float(data['table_p05']):.3f}, {float(data['table_p50']):.3f}, " \
                f"{float(data['table_p95']):.3f})"
        cells = [estimate(data[name], 2) if name in data else "n/a"
                 for name in ("vision_norm", "connector_norm", "text_input_norm")]
        ratio = estimate(data["input_ratio"], 2) if "input_ratio" in data else "n/a"
        b.table.rows.append([model, str(ds.attrs.get("family", "?")), layers, *cells, table,
                             _boundary_cell(data, vocab), ratio])
        b.count(model, *(data[n] for n in ("vision_norm", "connector_norm") if n in data))
        return data.drop_vars(["boundary_text", "boundary_id"], errors="ignore").drop_dims("boundary_id", errors="ignore")

    return b.run(models, lambda ds: missing(ds, atlas.VARIABLES, (ref,), (0,)), fill, first_note=(
        "Mean L2 norms: per sample over its patches (vision tower) or tokens (LLM input), then "
        "over samples. ‖p‖ is the residual stream at layer 0 on vision tokens; ‖e‖ the rows of the "
        "input embedding table as the embedding module outputs them (the whole vocabulary, no "
        "CI: one matrix); rank 1 = the largest row norm of V rows."))


def ladder_stages(n_vision_layers: int) -> list[str]:
    """The x axis of a norm ladder: the tower's layers, its output, the embedding table, the LLM input."""
    return [f"vision L{l}" for l in range(n_vision_layers)] + ["tower output", "embedding table", "LLM input"]


def norm_ladder(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `atlas` table as a ladder per model: mean norm (log) at each stage of the interface, on
    one y scale for every model, so that families compare by eye. Vision: each tower layer, the
    tower's output, the connector's output at the LLM input (CI bands). Text: the embedding table's
    mean row norm (error bar: p5–p95 of the vocabulary) and the text tokens at the LLM input."""
    plot = Plot("norm_ladder", f"Norm ladder across the vision-language interface ({options.reference})", options, out)
    data = plot.table(atlas_table, models, options)
    if data is None:
        return plot.file
    names = [str(m) for m in data.model.values]
    n_cols = min(4, len(names))
    _, axes = plot.grid(-(-len(names) // n_cols), n_cols, width=4.2, sharey=True)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, names):
        row = data.sel(model=model)
        layers = row["vision_layer_norm"].dropna("vision_layer", how="all")
        n = layers.sizes["vision_layer"]
        stages = ladder_stages(n)
        # vision: tower layers 0..n-1, the tower's output at n, the connector's output at n + 2
        vision = np.concatenate([layers.transpose("vision_layer", "stat").values,
                                 row["vision_norm"].values[None], row["connector_norm"].values[None]])
        x = [*range(n + 1), n + 2]
        band(ax, x, xr.DataArray(vision, dims=("x", "stat"), coords={"stat": list(STATS)}),
             MODALITY_COLORS["vision"], "vision", marker="o")
        mean, low, high = (float(row[k]) for k in ("table_mean", "table_p05", "table_p95"))
        ax.errorbar([n + 1], [mean], yerr=[[mean - low], [high - mean]], color=MODALITY_COLORS["text"], marker="s",
                    capsize=3, linestyle="none", label="text: embedding table (p5–p95)")
        band(ax, [n + 2], row["text_input_norm"].expand_dims(x=1), MODALITY_COLORS["text"], "text: LLM input",
             marker="o")
        ax.set_xticks(range(len(stages)), stages, rotation=45, ha="right", fontsize=7)
        ax.set(title=f"{model} ({models[model].attrs.get('family', '?')})", yscale="log")
        ax.tick_params(axis="y", labelleft=True)
    for ax in axes[:, 0]:
        ax.set_ylabel("mean L2 norm (log)")
    return plot.finish("norm")


# no claim quoted: the study measured two models; the cross-family question is the guide's
register_analysis(Analysis(
    name="atlas", section="Norms across the vision-language interface (norm atlas)", inputs=atlas.VARIABLES,
    metrics=(atlas.norm_atlas,), table=atlas_table, figures=(norm_ladder,), order=100))
