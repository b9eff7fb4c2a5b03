"""Depth: how the residual stream grows, how much each layer changes it, and massive activations.

For the residual stream `hidden (token, layer, dim)` of a store (h_l = the stream after l decoder
layers; h_0 = the LLM input; see workbench.sites), all in float64:

- `token_norms`: ‖h_l‖₂ per (token, layer); `mean_norm`: its mean over tokens, per layer (norm
  growth with depth; in a Pre-LN model it grows since the stream is never renormalized).
- `update_ratio`: ‖h_{l+1} − h_l‖₂ / ‖h_l‖₂ per (token, decoder_layer l): the size of what decoder
  layer l writes (attention + MLP branches) relative to the stream it reads. Needs layers l and
  l+1 stored; `mean_update_ratio` averages it over tokens. A ratio falling towards 0 with depth
  is the "deep layers barely change the stream" signature.
- `top_activations`: per (token, layer), the k channels of largest |h|, with |h| and its ratio
  to the median |h| over channels of that token and layer. Massive activations (Sun et al.
  2024) are a few fixed channels, on a few tokens (typically the first token and delimiters),
  whose magnitude is ~10²–10⁴ × the median, appearing after an early layer and staying;
  `massive_activations` keeps the entries above a ratio threshold.

Pure numpy/xarray (lazy dask arrays from `workbench.open_store` are reduced chunk by chunk);
never imports torch or nnsight. Reductions over tokens are plain means over the token rows
given: select first (e.g. `ds.hidden.sel(condition="baseline")`) or group with xarray.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr


def token_norms(hidden: xr.DataArray) -> xr.DataArray:
    """‖h‖₂ over `dim`, per (token, layer), float64."""
    # xarray's ufuncs keep the DataArray type that numpy's stubs lose (np.sqrt -> ndarray)
    return xr.ufuncs.sqrt((hidden.astype("float64") ** 2).sum("dim")).rename("norm")


def mean_norm(hidden: xr.DataArray) -> xr.DataArray:
    """Mean ‖h_l‖₂ over tokens, per layer."""
    return token_norms(hidden).mean("token").rename("mean_norm")


def update_ratio(hidden: xr.DataArray) -> xr.DataArray:
    """‖h_{l+1} − h_l‖₂ / ‖h_l‖₂ per (token, decoder_layer l), for every stored l with l+1 stored."""
    layers = [int(l) for l in hidden["layer"].values]
    pairs = [l for l in layers if l + 1 in set(layers)]
    if not pairs:
        raise ValueError(f"update_ratio needs two consecutive layers; the stream has layers {layers}")
    x = hidden.astype("float64")
    before = x.sel(layer=pairs)
    after = x.sel(layer=[l + 1 for l in pairs]).assign_coords(layer=pairs)
    delta = xr.ufuncs.sqrt(((after - before) ** 2).sum("dim"))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = delta / xr.ufuncs.sqrt((before**2).sum("dim"))
    return ratio.rename({"layer": "decoder_layer"}).rename("update_ratio")


def mean_update_ratio(hidden: xr.DataArray) -> xr.DataArray:
    """`update_ratio` averaged over tokens, per decoder layer."""
    return update_ratio(hidden).mean("token").rename("mean_update_ratio")


def _top_k(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    magnitude = np.abs(values.astype(np.float64, copy=False))
    order = np.argsort(-magnitude, axis=-1, kind="stable")[..., :k]          # largest first
    top = np.take_along_axis(magnitude, order, axis=-1)
    median = np.median(magnitude, axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = top / median
    return order.astype(np.int64), top, ratio


def top_activations(hidden: xr.DataArray, k: int = 4) -> xr.Dataset:
    """Per (token, layer), the k channels with the largest |h| (rank 0 = largest): `channel`
    (index along `dim`), `magnitude` (|h|) and `ratio` (|h| / median |h| over channels)."""
    if not 1 <= k <= hidden.sizes["dim"]:
        raise ValueError(f"k={k}; expected 1 <= k <= {hidden.sizes['dim']} (the width)")
    data = hidden.chunk({"dim": -1}) if hidden.chunks is not None else hidden
    channel, magnitude, ratio = xr.apply_ufunc(
        _top_k, data, kwargs={"k": k},
        input_core_dims=[["dim"]], output_core_dims=[["rank"], ["rank"], ["rank"]],
        dask="parallelized", output_dtypes=[np.int64, np.float64, np.float64],
        dask_gufunc_kwargs={"output_sizes": {"rank": k}},
    )
    out = xr.Dataset({"channel": channel, "magnitude": magnitude, "ratio": ratio})
    return out.assign_coords(rank=np.arange(k))


def massive_activations(hidden: xr.DataArray, k: int = 4, min_ratio: float = 100.0) -> pd.DataFrame:
    """The (token, layer, channel) entries among each token's top k whose |h| is at least
    `min_ratio` x the median |h| of that token and layer, as a table with the token's labels,
    sorted by ratio (largest first)."""
    top = top_activations(hidden, k).compute()
    frame = top.to_dataframe().reset_index()
    frame = frame[frame["ratio"] >= min_ratio]
    columns = [c for c in frame.columns if c not in ("rank",)]
    return pd.DataFrame(frame[columns]).sort_values("ratio", ascending=False, kind="stable").reset_index(drop=True)
