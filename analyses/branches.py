"""The update decomposition: what each branch of a decoder layer adds, relative to the stream it reads.

Decoder layer l reads the residual stream h_l and writes h_{l+1} = h_l + a_l + m_l, where a_l is
its attention branch's output and m_l its MLP branch's output as added to the stream (stored
`attn_out`, `mlp_out`; Gemma-3's post norms included, see workbench.sites). Per token t:

- attention share: ‖a_l(t)‖₂ / ‖h_l(t)‖₂;
- MLP share:       ‖m_l(t)‖₂ / ‖h_l(t)‖₂.

Per (condition, modality, decoder_layer): the mean over a sample's tokens of that modality
(`grouping.sample_means`: `text_set = "text+boundary"` counts boundary tokens as text), then the
mean over samples with a 95% bootstrap CI (`bootstrap.summarize`, dim `stat`). "Same absolute update, different share": compare ‖a_l‖ or ‖m_l‖ (the
`absolute` option) across modalities with the shares.

Pure numpy/pandas/xarray, never torch.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .grouping import sample_means

VARIABLES = ("hidden", "attn_out", "mlp_out")
BRANCHES = {"attn_share": "attn_out", "mlp_share": "mlp_out"}


def _norms(var: xr.DataArray) -> np.ndarray:
    """‖·‖₂ over `dim` in float64, per (token, layer)."""
    return cast(xr.DataArray, np.sqrt((var.astype("float64") ** 2).sum("dim"))).values  # a DataArray: __array_ufunc__


def branch_layers(ds: xr.Dataset) -> list[int]:
    """Decoder layers l with both branches and the residual h_l stored."""
    stored = set(int(l) for l in ds["layer"].values)
    attn = [int(l) for l in ds["attn_out"]["decoder_layer"].values]
    mlp = set(int(l) for l in ds["mlp_out"]["decoder_layer"].values)
    return [l for l in attn if l in mlp and l in stored]


def token_shares(ds: xr.Dataset, absolute: bool = False) -> xr.Dataset:
    """Per (token, decoder_layer): `attn_share` ‖a_l‖/‖h_l‖ and `mlp_share` ‖m_l‖/‖h_l‖
    (absolute: the norms ‖a_l‖, ‖m_l‖ themselves)."""
    missing = [v for v in VARIABLES if v not in ds.data_vars]
    if missing:
        raise ValueError(f"the update decomposition needs {', '.join(missing)} (capture sites layer, attn_out, mlp_out)")
    layers = branch_layers(ds)
    if not layers:
        raise ValueError("no decoder layer l has attn_out, mlp_out and the residual layer l stored")
    h = _norms(ds["hidden"].sel(layer=layers))
    out = {}
    for name, variable in BRANCHES.items():
        branch = _norms(ds[variable].sel(decoder_layer=layers))
        with np.errstate(divide="ignore", invalid="ignore"):
            out[name] = (("token", "decoder_layer"), branch if absolute else branch / h)
    return xr.Dataset(out, coords={"decoder_layer": layers})


def update_decomposition(ds: xr.Dataset, *, text_set: str = "text", absolute: bool = False, per_sample: bool = False,
                         n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`attn_share`, `mlp_share` per (condition, modality, decoder_layer) for `vision` and `text`:
    the per-sample token means, summarized over samples with CI (per_sample: dim `sample` kept)."""
    shares = token_shares(ds, absolute)
    data = xr.Dataset({name: sample_means(ds, shares[name], text_set) for name in BRANCHES})
    return data if per_sample else summarize(data, n_resamples=n_resamples, seed=seed)
