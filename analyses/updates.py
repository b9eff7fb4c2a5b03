"""Update magnitudes of the residual stream per layer and modality (the study's Observation 2).

For token t, u_l = h_l − h_{l−1} is the update written by decoder layer l (l ≥ 1):
- absolute update: ‖u_l‖₂;
- relative update: ‖u_l‖₂ / ‖h_{l−1}‖₂ (at l = 1: ‖u₁‖/‖h₀‖, the study's table).
Each is the mean over the tokens of a (condition, sample, modality), then the mean over samples
with a 95% bootstrap CI (`stat` dim). Computed in `residual.residual_geometry` (cached).
"""

from __future__ import annotations

import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .residual import geometry


def _metric(ds: xr.Dataset, name: str, per_sample: bool, force: bool, cache: bool, n_resamples: int,
            seed: int, text_set: str = "text") -> xr.DataArray:
    values = geometry(ds, text_set, force=force, cache=cache)[name]
    values = values.sel(layer=values.layer >= 1).rename(name)
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def absolute_update(ds: xr.Dataset, *, per_sample: bool = False, force: bool = False, cache: bool = True,
                    n_resamples: int = N_RESAMPLES, seed: int = SEED, text_set: str = "text") -> xr.DataArray:
    """‖h_l − h_{l−1}‖₂ per (condition, modality, layer ≥ 1), with CI; per_sample: (…, sample, …)."""
    return _metric(ds, "update", per_sample, force, cache, n_resamples, seed, text_set)


def relative_update(ds: xr.Dataset, *, per_sample: bool = False, force: bool = False, cache: bool = True,
                    n_resamples: int = N_RESAMPLES, seed: int = SEED, text_set: str = "text") -> xr.DataArray:
    """‖h_l − h_{l−1}‖₂ / ‖h_{l−1}‖₂ per (condition, modality, layer ≥ 1), with CI."""
    return _metric(ds, "relative_update", per_sample, force, cache, n_resamples, seed, text_set)
