"""Norms over the course of training: for every checkpoint of a trained model in a store (the
model's attrs `training`: its name, step, stage and the stage boundaries, kept by `workbench run`
for a `tiny-…-trained@step-N` checkpoint), at the LLM input (layer 0, the reference condition):

- vision norm: the mean ‖h₀‖₂ of the vision tokens, i.e. the projector's output scattered into
  the LLM input;
- text norm: the mean ‖h₀‖₂ of the text tokens (their embeddings);
- ratio: per sample vision norm / text norm, then the mean over samples.

Each with its 95% bootstrap CI over samples (`norms.norm_curves`, `norms.vision_text_ratio`); the
checkpoints of one trained model form one curve against the training step.
"""

from __future__ import annotations

from typing import Any

import xarray as xr

from .bootstrap import N_RESAMPLES, SEED
from .norms import norm_curves, vision_text_ratio

NEEDS = "a trained checkpoint (attrs `training`: run a tiny-…-trained@step-N model)"


def training_point(ds: xr.Dataset) -> dict[str, Any] | None:
    """The model's place in its training ({name, step, stage, stages}), or None if it is none."""
    point = ds.attrs.get("training")
    return point if isinstance(point, dict) and {"name", "step", "stages"} <= set(point) else None


def training_norms(ds: xr.Dataset, *, reference: str = "baseline", text_set: str = "text",
                   n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`vision_norm`, `text_norm` and `ratio` at layer 0 in `reference`, each with its CI (`stat`),
    with the checkpoint's `step` and `stage` as attrs."""
    labels = ["condition", "layer", "modality"]  # dropped; the n_samples coordinates stay
    norms = norm_curves(ds, text_set=text_set, n_resamples=n_resamples, seed=seed).sel(condition=reference, layer=0)
    ratio = vision_text_ratio(ds, 0, text_set=text_set, n_resamples=n_resamples, seed=seed).sel(condition=reference)
    point = training_point(ds) or {}
    return xr.Dataset({"vision_norm": norms.sel(modality="vision").drop_vars(labels, errors="ignore"),
                       "text_norm": norms.sel(modality="text").drop_vars(labels, errors="ignore"),
                       "ratio": ratio.drop_vars(labels, errors="ignore")},
                      attrs={"step": point.get("step"), "stage": point.get("stage")})
