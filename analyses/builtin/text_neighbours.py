"""`text-neighbours`: what vision tokens read as in words, per layer (`analyses.neighbours`, after
LatentLens): each vision token's nearest text tokens of the store by cosine, its nearest rows of
the input embedding table (with an `embed_lens` capture) and the logit lens's top tokens (with a
`logit_lens` capture). One row per (model, layer): the mean top-1 cosine of each readout over the
vision tokens read out and its most frequent top-1 word. Figures: `text_neighbours_cosine` (the
mean top-1 cosine per layer, contextual and embedding) and `text_neighbours_patches` (chosen
samples' images, a few vision tokens' boxes outlined, each labelled with its nearest words).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.patches import Rectangle

from .. import neighbours, overlays
from ..commands import DEFAULT_OVERLAY_SAMPLES
from ..figures import FigureFile, Plot, two_layers
from ..plotting import layer_axis
from ..registry import Analysis, register_analysis
from ..streaming import as_str
from ..tables import Builder, Options, Table, missing

BOXES_DRAWN = 6     # vision tokens outlined per sample
READOUTS = (("context", "nearest text token (contextual)", "#1f77b4"), ("embed", "nearest embedding row", "#d62728"))


def _need(ds: xr.Dataset) -> list[str]:
    return missing(ds, ("hidden",))


def _result(ds: xr.Dataset, options: Options) -> xr.Dataset:
    samples = neighbours.query_samples(ds, options.reference, options.samples)
    return neighbours.text_neighbours(ds, options.reference, samples, force=options.force)


def _word(text: str) -> str:
    return repr(text)[1:-1] or "''"


def text_neighbours_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    b = Builder("text-neighbours", f"Vision tokens read as words: nearest text tokens by layer ({options.reference})", [
        "model", "layer", "vision tokens", "contextual top-1 cos", "most frequent contextual word",
        "embedding top-1 cos", "most frequent embedding word", "logit-lens top-1 p", "most frequent lens word"],
        options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        summary = neighbours.layer_summary(_result(ds, options))
        for layer in summary.layer.values:
            at = summary.sel(layer=layer)
            cells = []
            for prefix in ("context", "embed", "lens"):
                if f"{prefix}_mean" not in at:
                    cells += ["not stored", "—"]
                    continue
                mean, share = float(at[f"{prefix}_mean"]), float(at[f"{prefix}_top_share"])
                cells += [f"{mean:.3f}" if math.isfinite(mean) else "—",
                          f"{_word(str(at[f'{prefix}_top'].values))} ({share:.0%})" if math.isfinite(share) else "—"]
            b.table.rows.append([model, str(int(layer)), str(summary.attrs["n_vision"]), *cells])
        return summary.drop_vars([v for v in summary.data_vars if summary[v].dtype.kind in "OU"])

    table = b.run(models, _need, fill, first_note=(
        "Per vision token of the samples read out (`--samples`, else the first "
        f"{neighbours.QUERY_SAMPLES}) and layer l: the text tokens of the whole store (same condition) whose h_l is "
        "nearest by cosine (LatentLens, arXiv 2602.00462), the nearest rows of the input embedding table (capture "
        "site embed_lens) and the logit lens's top token (capture site logit_lens). Columns: the mean over vision "
        "tokens of the top-1 cosine (lens: probability) and the most frequent top-1 word with its share of the "
        f"vision tokens. Every token's {neighbours.K} neighbours: analyses.neighbours.text_neighbours."))
    table.notes = [note for note in table.notes if not note.startswith("Estimates are")]  # no interval here
    return table


def text_neighbours_cosine(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The mean top-1 cosine per layer of each readout, one panel per model."""
    plot = Plot("text_neighbours_cosine", f"How close vision tokens come to words, by layer ({options.reference})",
                options, out)
    data = plot.table(text_neighbours_table, models, options)
    if data is None:
        return plot.file
    lacking = two_layers(data)
    if lacking:
        return plot.skip("; ".join(lacking))
    _, axes = plot.grid(1, len(data.model))
    for col, model in enumerate(data.model.values):
        ax = axes[0, col]
        values = data.sel(model=model)
        for prefix, label, color in READOUTS:
            if f"{prefix}_mean" in values and np.isfinite(values[f"{prefix}_mean"].values).any():
                ax.plot(values.layer.values, values[f"{prefix}_mean"].values, marker="o", color=color, label=label)
        ax.set(title=str(model), ylabel="mean top-1 cosine over vision tokens")
        layer_axis(ax.xaxis)
    return plot.finish(legend="readout")


def _labelled_tokens(result: xr.Dataset, where: overlays.Patches) -> list[tuple[int, np.ndarray]]:
    """Up to BOXES_DRAWN of the painted vision tokens, evenly spread: (query index, box)."""
    index = {int(r): q for q, r in enumerate(result["query_row"].values)}
    placed = [(index[int(r)], box) for r, box in zip(where.rows, where.boxes) if int(r) in index]
    if not placed:
        return []
    picks = np.unique(np.linspace(0, len(placed) - 1, min(BOXES_DRAWN, len(placed))).round().astype(int))
    return [placed[int(i)] for i in picks]


def text_neighbours_patches(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """Per (model, sample) of those the table reads out (the first `DEFAULT_OVERLAY_SAMPLES` unless
    `--samples` names them): the image at the middle and last stored layers, a few vision tokens'
    boxes outlined, each labelled with its nearest contextual word (c:), embedding row (e:) and
    logit-lens token (l:)."""
    plot = Plot("text_neighbours_patches", f"Image patches and their nearest words ({options.reference})", options, out)
    rows, lacking = [], []
    for model, ds in models.items():
        reason = overlays.geometry_reason(ds) if not _need(ds) else f"needs {', '.join(_need(ds))}"
        if reason is None and options.reference not in set(as_str(ds["run_condition"].values)):
            reason = f"no condition {options.reference!r}"
        if reason is not None:
            lacking.append(f"{model}: {reason}")
            continue
        result = _result(ds, options)                   # the table's (cached) readout
        read_out = list(dict.fromkeys(result["query_sample"].values.tolist()))
        samples = read_out if options.samples else read_out[:DEFAULT_OVERLAY_SAMPLES]
        images, _ = overlays.sample_images(ds, samples)
        for sample in samples:
            where = overlays.patches(ds, overlays.token_rows(ds, options.reference, sample), images.get(sample))
            if where is None:   # nothing to outline: no panel of it
                lacking.append(f"{model} {sample}: no vision token has a place in the image")
                continue
            rows.append((model, sample, images.get(sample), where, result))
    if not rows:
        return plot.skip("; ".join(lacking) or "no model in the store")
    def shown_layers(result: xr.Dataset) -> list[int]:   # the middle and the last stored layer
        layers = [int(l) for l in result.layer.values]
        return list(dict.fromkeys([layers[len(layers) // 2], layers[-1]]))

    fig, axes = plot.grid(len(rows), max(len(shown_layers(r[-1])) for r in rows), width=5.2, height=4.2)
    for i, (model, sample, image, where, result) in enumerate(rows):
        for j, layer in enumerate(shown_layers(result)):
            ax = axes[i, j]
            width, height = where.size
            shown = np.asarray(image.convert("RGB")) if image is not None else np.full((1, 1, 3), 0.85)
            ax.imshow(shown, extent=(0, width, height, 0), interpolation="nearest")
            at = result.sel(layer=layer)
            for n, (q, (x0, y0, x1, y1)) in enumerate(_labelled_tokens(result, where)):
                color = f"C{n % 10}"
                ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=color, linewidth=2))
                words = [f"{tag}: {_word(str(at[f'{p}_text'].values[q, 0]))}" for tag, p in
                         (("c", "context"), ("e", "embed"), ("l", "lens")) if f"{p}_text" in at]
                ax.text(x0 + 1, y0 + 1, "\n".join(words), color="white", fontsize=7, va="top",
                        bbox={"facecolor": color, "alpha": 0.75, "pad": 1, "linewidth": 0})
            ax.set_xlim(0, width)
            ax.set_ylim(height, 0)
            ax.set_title(f"{model} · {sample}, layer {layer}", fontsize=9)
    return plot.finish(None)


register_analysis(Analysis(
    name="text-neighbours", section="What vision tokens read as: nearest text tokens, embedding rows and the logit lens",
    inputs=("hidden", "embed_nn_ids", "lens_ids"), metrics=(neighbours.text_neighbours, neighbours.layer_summary),
    table=text_neighbours_table, figures=(text_neighbours_cosine, text_neighbours_patches), order=135))
