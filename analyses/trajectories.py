"""Vision-token trajectories against α: how scaling the projector output moves the residual stream
of the vision tokens at every layer (from an α sweep that captures every layer, e.g.
`specs/alpha_sweep.yaml`).

Per condition c (each swept α), sample and residual layer l, over the sample's `vision` tokens:
- `norm`: the mean of ‖h_l^c(t)‖₂ (`residual.residual_geometry`);
- `cos_reference`: the mean of cos(h_l^c(t), h_l^ref(t)), the same token (sample, position) of
  the reference condition (the unmodified real image; `kv.paired_cosine`). 1 = the trajectory
  keeps the reference's direction at that depth.
Then the mean over samples with a 95% bootstrap CI. Pure numpy/xarray, never torch.
"""

from __future__ import annotations

import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .kv import paired_cosine
from .residual import residual_geometry

MEASURES = ("norm", "cos_reference")


def vision_trajectories(ds: xr.Dataset, reference: str = "baseline", modality: str = "vision", *,
                        per_sample: bool = False, force: bool = False, cache: bool = True,
                        n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`norm` and `cos_reference` per (condition, layer) at `modality` tokens, with CI (per_sample:
    dim `sample` kept)."""
    norm = residual_geometry(ds, force=force, cache=cache)["norm"].sel(modality=modality, drop=True)
    cos = paired_cosine(ds, reference, ["hidden"])["cos_hidden"].sel(modality=modality, drop=True)
    data = xr.Dataset({"norm": norm, "cos_reference": cos.reindex_like(norm)})
    return data if per_sample else summarize(data, n_resamples=n_resamples, seed=seed)
