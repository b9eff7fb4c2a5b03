"""`training-norms`: per checkpoint of a trained model, the projector's mean output norm at the
vision tokens, the text tokens' embedding norm at the LLM input, and their ratio
(`training.training_norms`), one row per checkpoint in step order. Figure `training_norms.png`:
the norms (top) and the ratio (bottom) against the training step, one column per trained model,
the stage boundaries marked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from .. import training
from ..figures import FigureFile, Plot
from ..plotting import MODALITY_COLORS, band, plain_log_ticks
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, estimate, lacks_modalities, missing

STEP_LABEL = "training step"


def _need(options: Options):
    def need(ds: xr.Dataset) -> list[str]:
        lacking = [] if training.training_point(ds) else [training.NEEDS]
        return lacking or missing(ds, ("hidden",), (options.reference,), (0,)) or lacks_modalities(ds, options.reference)
    return need


def _ordered(models: dict[str, xr.Dataset]) -> dict[str, xr.Dataset]:
    """The models in (trained model, step) order."""
    def key(item: tuple[str, xr.Dataset]) -> tuple[str, int]:
        point = training.training_point(item[1]) or {}
        return str(point.get("name", "")), int(point.get("step", -1))
    return dict(sorted(models.items(), key=key))


def _norms(ds: xr.Dataset, options: Options) -> xr.Dataset:
    return training.training_norms(ds, reference=options.reference,
                                   text_set=options.definitions_for(ds)["text_set"], **options.boot())


def training_norms_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    b = Builder("training-norms", f"Vision and text norms at the LLM input over training (layer 0, {options.reference})",
                ["model", "trained model", "step", "stage", "vision norm (projector output)", "text norm (embeddings)",
                 "vision/text norm ratio"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        point = training.training_point(ds) or {}
        data = _norms(ds, options)
        b.table.rows.append([model, str(point["name"]), str(point["step"]), str(point.get("stage", "")),
                             estimate(data["vision_norm"], 2), estimate(data["text_norm"], 2),
                             estimate(data["ratio"], 2)])
        b.count(model, data["ratio"])
        return data.assign_coords(step=int(point["step"]))

    return b.run(_ordered(models), _need(options), fill, first_note=(
        "Norms: the mean L2 norm of the vision tokens (the projector's output) and of the text tokens at the LLM "
        "input; ratio: per sample vision / text, then the mean over samples (analyses.training)."))


def training_norms(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """One column per trained model: the vision and text norms (log y) and their ratio against the
    step of its checkpoints, each stage's start a dotted line named at the top."""
    plot = Plot("training_norms", "Vision (projector output) and text norms at the LLM input over training", options,
                out)
    ready = plot.ready(_ordered(models), _need(options))
    if not ready:
        return plot.file
    runs: dict[str, list[tuple[int, xr.Dataset, list[dict]]]] = {}
    for ds in ready.values():
        point = training.training_point(ds) or {}
        runs.setdefault(str(point["name"]), []).append((int(point["step"]), _norms(ds, options), point["stages"]))
    _, axes = plot.grid(2, len(runs), width=5.2, height=3.4)
    for col, (name, checkpoints) in enumerate(runs.items()):
        steps = np.array([s for s, _, _ in checkpoints])
        data = xr.concat([d for _, d, _ in checkpoints], dim="step")
        top, bottom = axes[0, col], axes[1, col]
        band(top, steps, data["vision_norm"], MODALITY_COLORS["vision"], "vision (projector output)", marker="o")
        band(top, steps, data["text_norm"], MODALITY_COLORS["text"], "text (embeddings)", marker="o")
        band(bottom, steps, data["ratio"], "#000000", "vision / text", marker="o")
        top.set(title=f"{name}: mean token norm at the LLM input", ylabel="mean L2 norm (activation units)",
                yscale="log")
        bottom.set(title=f"{name}: vision/text norm ratio", ylabel="vision / text (ratio)", yscale="log")
        for ax in (top, bottom):
            plain_log_ticks(ax.yaxis)
            ax.set_xlabel(STEP_LABEL)
            for i, stage in enumerate(checkpoints[0][2]):
                ax.axvline(stage["start"], color="#999999", linestyle=":", linewidth=0.9)
                # names in three staggered rows: a short stage's start sits close to the next one's
                ax.annotate(stage["stage"], (stage["start"], 1.0), xycoords=("data", "axes fraction"),
                            xytext=(2, -10 - 8 * (i % 3)), textcoords="offset points", fontsize=7, color="#555555")
    return plot.finish("norm at layer 0 (dotted: a stage's first step)")


register_analysis(Analysis(
    name="training-norms", section="Projector output and text norms over training", inputs=("hidden",),
    metrics=(training.training_norms,), table=training_norms_table, figures=(training_norms,),
    claim="the projector's mean output norm rises during vision-language alignment to about two orders of "
          "magnitude above the text embeddings", order=15))
