"""Per-token values → per-sample means by (condition, modality): the first step of every
"mean over a sample's tokens, then over samples with a CI" in the analyses.

Modality: the store's token labels; `text_set = "text+boundary"` counts boundary tokens as text
(workbench.definitions). Only `vision` and `text` rows are kept.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from .streaming import as_str

MODALITIES = ("vision", "text")


def token_groups(ds: xr.Dataset, text_set: str = "text") -> pd.DataFrame:
    """(condition, modality, sample) of every token row, modality by `text_set`."""
    modality = as_str(ds["modality"].values)
    if text_set == "text+boundary":
        modality = np.where(modality == "boundary", "text", modality)
    elif text_set != "text":
        raise ValueError(f"text_set: got {text_set!r}; expected 'text' or 'text+boundary'")
    return pd.DataFrame({"condition": as_str(ds["condition"].values), "modality": modality,
                         "sample": as_str(ds["sample"].values)})


def sample_means(ds: xr.Dataset, values: xr.DataArray, text_set: str = "text") -> xr.DataArray:
    """`values` (token, X) averaged over each (condition, modality, sample)'s tokens (NaN skipped):
    (condition, modality, X, sample), X keeping its labels as integers."""
    (dim,) = [d for d in values.dims if d != "token"]
    labels = token_groups(ds, text_set)
    keep = labels["modality"].isin(MODALITIES).to_numpy()
    frame = pd.DataFrame(np.asarray(values.transpose("token", dim).values)[keep], columns=values[dim].values)
    frame = pd.concat([labels[keep].reset_index(drop=True), frame], axis=1)
    means = frame.groupby(["condition", "modality", "sample"]).mean().stack(future_stack=True)
    if not isinstance(means, pd.Series):  # one column level stacks to a Series (pandas-stubs: either)
        raise TypeError(f"expected the stacked means as a Series, got {type(means).__name__}")
    means.index = means.index.set_names(["condition", "modality", "sample", dim])
    out = xr.DataArray.from_series(means).transpose("condition", "modality", dim, "sample")
    return out.assign_coords({dim: out[dim].values.astype(np.int64), "modality": out["modality"].values.astype(str)})
