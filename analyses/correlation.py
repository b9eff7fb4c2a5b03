"""Do vision tokens change the trajectory of text tokens? (the study's Ablation 1 table).

For a sample s and condition c, the text curve of a metric is its per-layer mean over the text
tokens of s under c: the norm curve ‖h_l‖₂ and the cosine curve cos(h_l, h_0), l = 0..L (every
stored layer). Conditions may differ in how many text tokens a sample has and where they are (the
image removed shifts every position), so curves are compared, never tokens.

correlation(reference, c) for a metric = the Pearson correlation coefficient, over layers, between
the sample's text curve under `reference` and under c; then the mean over the samples present in
both conditions, with a 95% bootstrap CI. The study's real-blank and real-text-only columns are
reference "baseline" (real image) against "blank" and "none".
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from . import residual

CURVES = {"norm": "norm", "cosine": "cos_first"}


def pearson(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson r along `axis` over the entries finite in both (NaN for fewer than 2 or a flat curve)."""
    a, b = np.broadcast_arrays(np.asarray(a, float), np.asarray(b, float))
    ok = np.isfinite(a) & np.isfinite(b)
    n = ok.sum(axis, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        ma = np.where(ok, a, 0).sum(axis, keepdims=True) / n
        mb = np.where(ok, b, 0).sum(axis, keepdims=True) / n
        da, db = np.where(ok, a - ma, 0), np.where(ok, b - mb, 0)
        r = (da * db).sum(axis) / np.sqrt((da**2).sum(axis) * (db**2).sum(axis))
    return np.where(np.squeeze(n, axis) >= 2, r, np.nan)


def text_curve_correlation(ds: xr.Dataset, reference: str = "baseline", others: list[str] | tuple[str, ...] | None = None,
                           *, modality: str = "text", per_sample: bool = False, force: bool = False, cache: bool = True,
                           n_resamples: int = N_RESAMPLES, seed: int = SEED, text_set: str = "text") -> xr.Dataset:
    """Correlation of the per-sample `modality` curves of `reference` with each of `others`
    (default: every other condition without a swept value), for the norm and cosine curves.

    Returns a Dataset with `norm` and `cosine` (condition, stat); per_sample: (condition, sample)."""
    geometry = residual.geometry(ds, text_set, force=force, cache=cache)
    conditions = [str(c) for c in geometry.condition.values]
    if reference not in conditions:
        raise KeyError(f"reference condition {reference!r} is not in the store (it holds {', '.join(conditions)})")
    if others is None:
        swept = np.zeros(len(conditions), bool)
        for name, coord in geometry.coords.items():
            if name != "condition" and coord.dims == ("condition",):
                swept |= np.isfinite(np.asarray(coord.values, float))
        others = [c for c, s in zip(conditions, swept) if not s and c != reference]
    others = [c for c in others if c in conditions]
    result = {}
    for label, metric in CURVES.items():
        curves = geometry[metric].sel(modality=modality, drop=True)            # (condition, sample, layer)
        ref = curves.sel(condition=reference, drop=True).transpose("sample", "layer").values
        r = np.stack([pearson(ref, curves.sel(condition=c, drop=True).transpose("sample", "layer").values)
                      for c in others]) if others else np.zeros((0, len(curves.sample)))
        result[label] = xr.DataArray(r, dims=("condition", "sample"),
                                     coords={"condition": np.array(others, dtype=str), "sample": curves.sample.values})
    out = xr.Dataset(result, attrs={"reference": reference, "modality": modality})
    return out if per_sample else summarize(out, n_resamples=n_resamples, seed=seed)
