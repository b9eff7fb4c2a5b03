"""Tidy rows from a store: pandas DataFrames with one row per token (and layer), every label a
column, for the users who would rather `groupby` in pandas than in xarray.

A store's Dataset has two kinds of rows, tokens and runs (one per sample and condition), so
`Dataset.to_dataframe()` on all of it would cross them. `to_dataframe(ds, variable)` keeps them
apart: the token labels, the chosen variable's L2 norm over its last dim (one row per token and
layer where it has layers), and the run labels of the token's (condition, sample) joined on.
Torch-free: it needs xarray and pandas only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from .names import RUN_LABELS, TEXT_LABELS


def _labels(ds: xr.Dataset, dim: str) -> pd.DataFrame:
    names = [n for n, c in ds.coords.items() if c.dims == (dim,) and n != dim]
    return pd.DataFrame({n: np.asarray(ds[n].values) for n in names})


def to_dataframe(ds: xr.Dataset, variable: str = "hidden") -> pd.DataFrame:
    """Tidy rows of `variable` (a per-token variable of `open_store(path, model)`): one per token,
    and per layer if it has a layer dim, with its L2 norm over the last dim as `norm`."""
    flat = ds.reset_index([d for d in ("token", "run") if d in ds.indexes])
    data = flat[variable]
    if data.dims[0] != "token":
        raise ValueError(f"{variable} has dims {data.dims}; expected a per-token variable (first dim 'token')")
    tokens = _labels(flat, "token")
    # xarray's own ufunc: numpy's stubs type np.sqrt of a DataArray as an ndarray
    norm: xr.DataArray = xr.ufuncs.sqrt((data.astype("float64") ** 2).sum(data.dims[-1:])) if data.ndim > 1 else data
    layer_dim = next((d for d in norm.dims if d != "token"), None)
    if layer_dim is None:
        frame = tokens.assign(norm=np.asarray(norm.values))
    else:
        values = np.asarray(norm.transpose("token", layer_dim).values)
        layers = np.asarray(flat[layer_dim].values) if layer_dim in flat.coords else np.arange(values.shape[1])
        frame = tokens.loc[tokens.index.repeat(len(layers))].reset_index(drop=True)
        frame[layer_dim] = np.tile(layers, len(tokens))
        frame["norm"] = values.reshape(-1)
    if "run" in flat.dims:
        runs = _labels(flat, "run")
        keep = [c for c in runs.columns if c in ("run_condition", "run_sample") or c in TEXT_LABELS
                or c not in RUN_LABELS and not c.startswith("run_")]
        runs = runs[keep].rename(columns={"run_condition": "condition", "run_sample": "sample"})
        frame = frame.merge(runs, on=["condition", "sample"], how="left")
    return frame
