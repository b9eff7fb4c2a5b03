"""95% bootstrap confidence intervals over samples.

`summarize(per_sample)` turns per-sample values (any dims, one of them `sample`) into a point
estimate and a percentile bootstrap interval for every other coordinate:

- estimate: the statistic (mean, or median) over the samples that have a value (NaN = no value);
- interval: draw `n_resamples` resamples of the sample axis with replacement (numpy Generator
  seeded with `seed`, the same resamples for every element, so paired comparisons stay paired),
  compute the statistic on each (ignoring samples without a value), and take the
  (1 - level)/2 and (1 + level)/2 percentiles.

The result has a new last dim `stat` = ("value", "ci_low", "ci_high") and a coordinate
`n_samples` (samples with a value, per element).

Below `MIN_SAMPLES` samples with a value there is no interval (ci_low and ci_high are NaN): one
sample resamples only to itself, so its "interval" would have zero width and look certain. From
`MIN_SAMPLES` to below `SMALL_SAMPLES` an interval is given, and tables say it is rough: the
percentile interval is too narrow in small samples (it covers the true mean less often than its
level says; Hesterberg 2015, "What Teachers Should Know About the Bootstrap", The American
Statistician 69(4), section on the narrowness bias).
"""

from __future__ import annotations

import warnings
from typing import overload

import numpy as np
import xarray as xr

N_RESAMPLES = 1000
SEED = 0
LEVEL = 0.95
STATS = ("value", "ci_low", "ci_high")
MIN_SAMPLES = 2  # fewer samples with a value: no interval (module doc)
SMALL_SAMPLES = 10  # fewer: the interval is given, and called rough (module doc)


def resample_indices(n: int, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(n_resamples, n) sample indices drawn with replacement, reproducible from `seed`."""
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def _boot_mean(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """(rows, n) -> (rows, B): the mean over each resample, skipping NaN, as matrix products."""
    b, n = idx.shape
    weights = np.zeros((b, n))
    np.add.at(weights, (np.arange(b)[:, None], idx), 1.0)
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(finite, values, 0.0) @ weights.T) / (finite.astype(float) @ weights.T)


def _boot_median(values: np.ndarray, idx: np.ndarray) -> np.ndarray:
    out = np.empty((values.shape[0], idx.shape[0]))
    for i, row in enumerate(values):
        out[i] = np.nanmedian(row[idx], axis=1)
    return out


def bootstrap_array(values: np.ndarray, stat: str = "mean", n_resamples: int = N_RESAMPLES, seed: int = SEED,
                    level: float = LEVEL) -> np.ndarray:
    """(..., n) per-sample values -> (..., 3): estimate, CI low, CI high (NaN where fewer than
    `MIN_SAMPLES` values)."""
    values = np.asarray(values, dtype=np.float64)
    values = np.where(np.isfinite(values), values, np.nan)  # an Inf is no value either (it would own the mean)
    shape, n = values.shape[:-1], values.shape[-1]
    flat = values.reshape(-1, n)
    if stat not in ("mean", "median"):
        raise ValueError(f"stat must be 'mean' or 'median', not {stat!r}")
    out = np.full((flat.shape[0], 3), np.nan)
    if n and flat.shape[0]:
        idx = resample_indices(n, n_resamples, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN
            point = np.nanmean(flat, axis=1) if stat == "mean" else np.nanmedian(flat, axis=1)
            boot = _boot_mean(flat, idx) if stat == "mean" else _boot_median(flat, idx)
            tail = (1 - level) / 2 * 100
            out[:, 0] = point
            out[:, 1:] = np.nanpercentile(boot, [tail, 100 - tail], axis=1).T
        out[np.isfinite(flat).sum(axis=1) < MIN_SAMPLES, 1:] = np.nan  # no interval from a single sample
    return out.reshape(*shape, 3)


@overload
def summarize(per_sample: xr.DataArray, dim: str = ..., stat: str = ..., n_resamples: int = ..., seed: int = ...,
              level: float = ...) -> xr.DataArray: ...


@overload
def summarize(per_sample: xr.Dataset, dim: str = ..., stat: str = ..., n_resamples: int = ..., seed: int = ...,
              level: float = ...) -> xr.Dataset: ...


def summarize(per_sample: xr.DataArray | xr.Dataset, dim: str = "sample", stat: str = "mean",
              n_resamples: int = N_RESAMPLES, seed: int = SEED, level: float = LEVEL) -> xr.DataArray | xr.Dataset:
    """Estimate and bootstrap CI over `dim` of every element of `per_sample` (see module doc)."""
    if isinstance(per_sample, xr.Dataset):
        parts = {name: summarize(v, dim, stat, n_resamples, seed, level) for name, v in per_sample.data_vars.items()}
        counts = [p["n_samples"].values for p in parts.values()]
        if any(not np.array_equal(counts[0], c) for c in counts[1:]):  # variables differ in samples present
            parts = {name: p.rename(n_samples=f"n_samples_{name}") for name, p in parts.items()}
        return xr.Dataset(parts, attrs=per_sample.attrs)
    da = per_sample.transpose(..., dim)
    result = bootstrap_array(da.values, stat, n_resamples, seed, level)
    dims = [d for d in da.dims if d != dim]
    coords = {name: c for name, c in da.coords.items() if dim not in c.dims}
    out = xr.DataArray(result, dims=[*dims, "stat"], coords={**coords, "stat": list(STATS)}, name=da.name,
                       attrs={**da.attrs, "statistic": stat, "ci_level": level, "n_resamples": n_resamples,
                              "seed": seed})
    return out.assign_coords(n_samples=(dims, np.isfinite(da.values).sum(-1)))
