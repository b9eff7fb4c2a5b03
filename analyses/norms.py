"""Residual-stream norms by modality, and the vision/text norm ratio (the study's Observation 1).

Definitions:
- token norm: ‖h_l(t)‖₂, the L2 norm over `dim` of the residual stream of token t at layer l;
- modality mean: the mean of token norms over all tokens of that modality of one sample, then the
  mean over samples (each sample weighs the same, however many tokens it has);
- vision/text norm ratio at layer l: mean vision norm / mean text norm, per sample, averaged over
  samples (layer 0 is the LLM input: the study's table).

`norm_curves` and `vision_text_ratio` read the cached streaming pass `residual.residual_geometry`
and carry 95% bootstrap CIs over samples (`bootstrap.summarize`); `norm_ratio` / `norm_table`
(the summary printed after `workbench run`) read one layer only and give the same estimates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .residual import geometry, residual_geometry  # noqa: F401  (residual_geometry: re-exported)
from .streaming import condition_sort_key  # noqa: F401  (re-exported: workbench.cli uses it from here)


def token_norms(ds: xr.Dataset) -> xr.DataArray:
    """‖h‖₂ per (token, layer), computed chunk by chunk (dask) and loaded: D times smaller."""
    return xr.ufuncs.sqrt((ds["hidden"].astype("float64") ** 2).sum("dim")).compute()


def _frame(norms: xr.DataArray) -> pd.DataFrame:
    index = norms.indexes["token"].to_frame(index=False)
    frame = pd.DataFrame(norms.values, columns=[int(l) for l in norms["layer"].values])
    return pd.concat([index[["condition", "sample", "modality"]].astype(str), frame], axis=1)


def modality_norms(ds: xr.Dataset) -> xr.DataArray:
    """Mean token norm per (condition, modality, layer): per-sample means, then the mean over samples."""
    frame = _frame(token_norms(ds))
    per_sample = frame.groupby(["condition", "modality", "sample"]).mean()
    means = per_sample.groupby(level=["condition", "modality"]).mean()
    stacked = means.stack()
    if not isinstance(stacked, pd.Series):  # one column level stacks to a Series (pandas-stubs: either)
        raise TypeError(f"expected the stacked means as a Series, got {type(stacked).__name__}")
    stacked.index = stacked.index.set_names(["condition", "modality", "layer"])
    return xr.DataArray.from_series(stacked).rename("norm")


def norm_ratio(ds: xr.Dataset, layer: int = 0) -> pd.Series:
    """Vision/text norm ratio at `layer` per condition: per-sample ratios averaged over samples."""
    frame = _frame(token_norms(ds.sel(layer=[layer])))
    per_sample = frame.groupby(["condition", "sample", "modality"])[layer].mean().unstack("modality")
    if "vision" not in per_sample or "text" not in per_sample:
        return pd.Series(dtype=float, name="vision/text norm ratio")
    ratio = (per_sample["vision"] / per_sample["text"]).groupby(level="condition").mean()
    return ratio.rename("vision/text norm ratio")


def norm_table(store: str | Path, layer: int = 0) -> str:
    """Markdown: model | condition | vision/text norm ratio at `layer` (the first captured layer
    where a model's store lacks `layer`). A condition without vision tokens (`image: none`) says
    so instead of printing NaN."""
    from workbench.store import list_models, open_store

    rows = ["| model | condition | layer | vision/text norm ratio |", "|---|---|---|---|"]
    for model in list_models(store):
        ds = open_store(store, model=model)
        if "hidden" not in ds or not ds.sizes.get("layer"):
            continue
        layers = [int(l) for l in ds["layer"].values]
        at = layer if layer in layers else layers[0]
        ratios = norm_ratio(ds, at)
        for condition in sorted(set(ds["condition"].values.tolist()), key=condition_sort_key):
            value = ratios.get(condition, float("nan"))
            shown = f"{value:.3f}" if np.isfinite(value) else "n/a (no vision or text tokens)"
            rows.append(f"| {model} | {condition} | {at} | {shown} |")
    return "\n".join(rows)


def print_norm_table(store: str | Path) -> None:
    print(norm_table(store))


def norm_curves(ds: xr.Dataset, *, per_sample: bool = False, force: bool = False, cache: bool = True,
                n_resamples: int = N_RESAMPLES, seed: int = SEED, text_set: str = "text") -> xr.DataArray:
    """Mean token norm ‖h_l‖₂ per (condition, modality, layer) with its bootstrap CI (`stat` dim);
    `per_sample=True`: the per-sample means (condition, sample, modality, layer) instead."""
    values = geometry(ds, text_set, force=force, cache=cache)["norm"].rename("norm")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def vision_text_ratio(ds: xr.Dataset, layer: int | None = 0, *, per_sample: bool = False, force: bool = False,
                      cache: bool = True, n_resamples: int = N_RESAMPLES, seed: int = SEED,
                      text_set: str = "text") -> xr.DataArray:
    """Vision/text norm ratio per condition at `layer` (None: every layer): per sample
    mean vision norm / mean norm of the `text_set` tokens (workbench.definitions), then the mean
    over samples with its bootstrap CI."""
    norms = geometry(ds, text_set, force=force, cache=cache)["norm"]
    ratio = (norms.sel(modality="vision", drop=True) / norms.sel(modality="text", drop=True)).rename("norm_ratio")
    if layer is not None:
        ratio = ratio.sel(layer=layer, drop=True)
    return ratio if per_sample else summarize(ratio, n_resamples=n_resamples, seed=seed)
