"""Rotation of the residual stream per layer and modality (the study's Observation 2).

For token t:
- cosine to layer 0: cos(h_l, h_0) = h_l·h_0 / (‖h_l‖₂ ‖h_0‖₂) (at l = 1 the study's cos(h₁,h₀));
- cosine to the previous layer: cos(h_l, h_{l−1}) (l ≥ 1).
Each is the mean over the tokens of a (condition, sample, modality), then the mean over samples
with a 95% bootstrap CI (`stat` dim). Computed in `residual.residual_geometry` (cached).
"""

from __future__ import annotations

import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .residual import geometry


def cosine_to_first(ds: xr.Dataset, *, per_sample: bool = False, force: bool = False, cache: bool = True,
                    n_resamples: int = N_RESAMPLES, seed: int = SEED, text_set: str = "text") -> xr.DataArray:
    """cos(h_l, h_0) per (condition, modality, layer), with CI; per_sample: (…, sample, …)."""
    values = geometry(ds, text_set, force=force, cache=cache)["cos_first"].rename("cos_first")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def cosine_to_previous(ds: xr.Dataset, *, per_sample: bool = False, force: bool = False, cache: bool = True,
                       n_resamples: int = N_RESAMPLES, seed: int = SEED, text_set: str = "text") -> xr.DataArray:
    """cos(h_l, h_{l−1}) per (condition, modality, layer ≥ 1), with CI."""
    values = geometry(ds, text_set, force=force, cache=cache)["cos_prev"]
    values = values.sel(layer=values.layer >= 1).rename("cos_prev")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)
