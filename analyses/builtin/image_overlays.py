"""`image-overlays`: per-patch values drawn over chosen samples' own images (`report --samples`, the
first few by default), from the store's patch geometry (`analyses.overlays`). Table: per model
and sample, the vision tokens placed and the view drawn. Figures: `overlay_norms` (each vision
token's ‖h_l‖ at the first and last stored layers), `overlay_attention` (the attention each
vision token receives from the prompt's text queries at prefill, and from the decode query at each
step), `overlay_effects` (each other condition's Δnorm and cosine to the reference per token, at
the last stored layer), `overlay_patching` (each patching scan over token indices: the sample's
normalized effect of patching each vision token, on the scan metric `--metric`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from PIL import Image

from .. import overlays, patching
from ..cache import MissingInputs
from ..figures import FigureFile, Plot
from ..plotting import not_stored
from ..registry import Analysis, register_analysis
from ..streaming import as_str
from ..tables import Options, Table

MAX_STEPS = 4       # decode steps drawn
MAX_CONDITIONS = 3  # conditions whose effect is drawn
MAX_SCANS = 4       # (scan, direction, layer) patching panels drawn


class Drawn:
    """The samples of every model with geometry, their images and why any are missing."""

    def __init__(self, models: dict[str, xr.Dataset], options: Options):
        self.rows: list[tuple[str, xr.Dataset, str, np.ndarray, Image.Image | None]] = []
        self.lacking: list[str] = []
        self.notes: list[str] = []
        for model, ds in models.items():
            reason = overlays.geometry_reason(ds)
            if reason is None and options.reference not in set(as_str(ds["run_condition"].values)):
                reason = f"no condition {options.reference!r}"
            if reason is not None:
                self.lacking.append(f"{model}: {reason}")
                continue
            samples = overlays.chosen_samples(ds, options.reference, options.samples)
            if not samples:
                self.lacking.append(f"{model}: none of the samples {', '.join(options.samples)}")
                continue
            images, why = overlays.sample_images(ds, samples)
            if why:
                self.notes.append(f"{model}: {why}; drawn on a plain canvas")
            for sample in samples:
                self.rows.append((model, ds, sample, overlays.token_rows(ds, options.reference, sample), images.get(sample)))

    def skipped(self) -> str | None:
        return None if self.rows else ("; ".join(self.lacking) or "no model in the store")


def overlay_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    table = Table("image-overlays", f"Vision tokens placed on each drawn sample's image ({options.reference})",
                  ["model", "sample", "vision tokens placed", "tiles", "view drawn", "image"])
    drawn = Drawn(models, options)
    if drawn.skipped():
        table.skipped = drawn.skipped()
        return table
    for model, ds, sample, rows, image in drawn.rows:
        tile = np.asarray(ds["tile"].values)[rows]
        vision = as_str(ds["modality"].values)[rows] == "vision"
        where = overlays.patches(ds, rows, image)
        table.rows.append([model, sample, f"{int((tile >= 0).sum())} of {int(vision.sum())}",
                           str(len(np.unique(tile[tile >= 0]))), where.view if where else "none",
                           f"{image.size[0]}x{image.size[1]} regenerated" if image else "plain canvas"])
    table.notes += [f"Not drawn: {line}" for line in drawn.lacking] + drawn.notes
    table.notes.append("Each vision token covers the box of the original image stored with it (`box_x0` ... "
                       "`box_y1`); where crops and a global view cover a pixel, the crops are drawn.")
    return table


Panel = Callable[[Figure, Axes, xr.Dataset, np.ndarray, overlays.Patches, Image.Image | None], str | None]


def _figure(name: str, title: str, models: dict[str, xr.Dataset], options: Options, out: Path,
            columns: Callable[[xr.Dataset], list[tuple[str, Panel]] | str]) -> FigureFile:
    """One row per (model, sample), one panel per column `columns(ds)` gives (or the reason it gives none)."""
    plot = Plot(name, title, options, out)
    drawn = Drawn(models, options)
    if drawn.skipped():
        return plot.skip(str(drawn.skipped()))
    rows = []
    for model, ds, sample, token_rows, image in drawn.rows:
        made = columns(ds)
        if isinstance(made, str):
            drawn.lacking.append(f"{model}: {made}")
            continue
        rows.append((model, ds, sample, token_rows, image, made))
    if not rows:
        return plot.skip("; ".join(dict.fromkeys(drawn.lacking)))
    width = max(len(r[-1]) for r in rows)
    fig, axes = plot.grid(len(rows), width, width=4.2, height=3.4)
    for i, (model, ds, sample, token_rows, image, made) in enumerate(rows):
        where = overlays.patches(ds, token_rows, image)
        for j in range(width):
            ax = axes[i, j]
            if where is None or j >= len(made):
                not_stored(ax, "no vision token of this sample has a place" if where is None else "")
                continue
            label, draw = made[j]
            reason = draw(fig, ax, ds, token_rows, where, image)
            if reason:
                not_stored(ax, reason)
            else:
                ax.set_title(f"{model} · {sample}\n{label} ({where.view})", fontsize=9)
    return plot.finish(None)


def _layers(ds: xr.Dataset) -> list[int]:
    layers = [int(l) for l in np.asarray(ds["layer"].values)]
    return sorted({layers[0], layers[-1]})


def overlay_norms(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    def columns(ds: xr.Dataset) -> list[tuple[str, Panel]] | str:
        if "hidden" not in ds.data_vars:
            return "needs hidden"

        def norm_at(layer: int) -> Panel:
            def draw(fig: Figure, ax: Axes, ds: xr.Dataset, rows: np.ndarray, where: overlays.Patches,
                     image: Image.Image | None) -> str | None:
                overlays.paint(fig, ax, image, where, overlays.hidden_norm(ds, where.rows, layer), f"‖h_{layer}‖₂")
                return None
            return draw

        return [(f"token norm ‖h_{layer}‖₂, layer {layer}", norm_at(layer)) for layer in _layers(ds)]

    return _figure("overlay_norms", f"Vision-token norm over the image ({options.reference})", models, options, out,
                   columns)


def overlay_attention(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    def columns(ds: xr.Dataset) -> list[tuple[str, Panel]] | str:
        made: list[tuple[str, Panel]] = []
        if "prefill_text_attention" in ds.data_vars:
            def prefill(fig: Figure, ax: Axes, ds: xr.Dataset, rows: np.ndarray, where: overlays.Patches,
                        image: Image.Image | None) -> str | None:
                overlays.paint(fig, ax, image, where, overlays.prefill_attention(ds, where.rows),
                               "Σ over text queries (mean over layers, heads)", cmap="viridis")
                return None
            made.append(("prefill: text queries' attention on each patch", prefill))
        if "decode_attention" in ds.data_vars:
            def at(step: int) -> Panel:
                def draw(fig: Figure, ax: Axes, ds: xr.Dataset, rows: np.ndarray, where: overlays.Patches,
                         image: Image.Image | None) -> str | None:
                    overlays.paint(fig, ax, image, where, overlays.decode_attention(ds, where.rows, step),
                                   "attention (mean over layers, heads)", cmap="viridis")
                    return None
                return draw

            steps = [int(s) for s in np.asarray(ds["step"].values)][:MAX_STEPS]
            made += [(f"decode step {s}: attention on each patch", at(s)) for s in steps]
        return made or "needs prefill_text_attention or decode_attention (capture site attention)"

    return _figure("overlay_attention", f"Text→vision attention on each vision token ({options.reference})", models,
                   options, out, columns)


def overlay_effects(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    reference = options.reference

    def columns(ds: xr.Dataset) -> list[tuple[str, Panel]] | str:
        if "hidden" not in ds.data_vars:
            return "needs hidden"
        conditions = [c for c in dict.fromkeys(as_str(ds["run_condition"].values)) if c != reference][:MAX_CONDITIONS]
        if not conditions:
            return f"a condition beside {reference!r}"
        layer = _layers(ds)[-1]

        def panel(condition: str, part: int) -> Panel:
            def draw(fig: Figure, ax: Axes, ds: xr.Dataset, rows: np.ndarray, where: overlays.Patches,
                     image: Image.Image | None) -> str | None:
                sample = str(as_str(ds["sample"].values)[rows[0]])
                other = overlays.token_rows(ds, condition, sample)
                ids = np.asarray(ds["token_id"].values)
                if len(other) != len(rows) or not np.array_equal(ids[other], ids[rows]):
                    return f"{condition}: not the reference's token sequence (no patch to compare)"
                index = {int(r): i for i, r in enumerate(rows)}  # same position, the other condition
                matched = other[[index[int(r)] for r in where.rows]]
                values = overlays.effect(ds, matched, where.rows, layer)[part]
                if part == 0:
                    overlays.paint(fig, ax, image, where, values, "Δ‖h‖₂", cmap="RdBu_r", centred=True)
                else:
                    overlays.paint(fig, ax, image, where, values, "cosine", cmap="viridis", limits=(-1.0, 1.0))
                return None
            return draw

        return [(f"{c}: {'Δnorm' if part == 0 else 'cos to ' + reference}, layer {layer}", panel(c, part))
                for c in conditions for part in (0, 1)]

    return _figure("overlay_effects", f"Each condition's effect per vision token against {reference}", models,
                   options, out, columns)


def overlay_patching(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """Each scan over token indices: the sample's normalized patching effect on each patch."""
    label = patching.METRIC_LABELS[options.metric]

    def columns(ds: xr.Dataset) -> list[tuple[str, Panel]] | str:
        scans = overlays.patch_scans(ds)
        if not scans:
            return "needs a patching scan over single vision tokens (positions: token indices)"
        try:
            values = {base: patching.metric_values(ds, options.metric, base, options.tokens)
                      for base in {s.base for s in scans}}
        except MissingInputs as exc:
            return f"needs {exc}"

        def panel(scan: overlays.PatchScan) -> Panel:
            def draw(fig: Figure, ax: Axes, ds: xr.Dataset, rows: np.ndarray, where: overlays.Patches,
                     image: Image.Image | None) -> str | None:
                sample = str(as_str(ds["sample"].values)[rows[0]])
                base = overlays.token_rows(ds, scan.base, sample)
                ids = np.asarray(ds["token_id"].values)
                if len(base) != len(rows) or not np.array_equal(ids[base], ids[rows]):
                    return f"{scan.base}: not the reference's token sequence (no patch to place)"
                positions = np.asarray(ds["position"].values)[where.rows]
                effect = overlays.patch_effect(values[scan.base], scan, sample, positions)
                if not np.isfinite(effect).any():
                    return f"{scan.scan}: no run patched vision tokens of {sample} alone"
                overlays.paint(fig, ax, image, where, effect, f"normalized effect on {label}", cmap="RdBu_r",
                               centred=True)
                return None
            return draw

        return [(f"{s.scan} ({s.site}) l={s.layer}, {s.direction}: {s.base} ← {s.donor}", panel(s))
                for s in scans[:MAX_SCANS]]

    return _figure("overlay_patching", f"Patching effect per vision token (0 = base run, 1 = donor run; {label})",
                   models, options, out, columns)


register_analysis(Analysis(
    name="image-overlays", section="Vision tokens on the image",
    inputs=("hidden", "prefill_text_attention", "decode_attention", "logprobs", "run_answer_ids"),
    metrics=(overlays.hidden_norm, overlays.prefill_attention, overlays.decode_attention, overlays.effect,
             overlays.patch_effect),
    table=overlay_table, figures=(overlay_norms, overlay_attention, overlay_effects, overlay_patching), order=160))
