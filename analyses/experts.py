"""Expert load per modality in mixture-of-experts models, from the stored router choices (site
`router`: `router_experts`, the top-k experts of each prompt position at each MoE decoder layer).

Per token t, decoder layer l and expert e: `share` = the fraction of t's k routing slots that go
to e (1/k if e is among t's top-k, else 0; a token's shares sum to 1; NaN at a dense layer).

- `load` per (condition, modality, decoder_layer, expert): the mean share over a sample's tokens
  of that modality (`grouping.sample_means`), the share of that modality's routing that expert e
  receives (summing to 1 over experts; uniform routing gives 1/E), then the mean over samples
  with a 95% bootstrap CI;
- `distance` per (condition, decoder_layer): the total-variation distance between one sample's
  vision and text loads, ½ Σ_e |load_vision − load_text| (0: both modalities use the experts
  alike; 1: no expert serves both), then the mean over samples with its CI.

Pure numpy/xarray, never torch.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .grouping import sample_means

VARIABLES = ("router_experts",)


def token_shares(ds: xr.Dataset) -> xr.DataArray:
    """(token, decoder_layer, expert): the share of each token's routing slots per expert. The
    experts are 0..E-1, E from `router_logits` where stored, else one past the largest chosen."""
    if "router_experts" not in ds.data_vars:
        raise ValueError("the expert load needs router_experts (capture site router)")
    chosen = np.asarray(ds["router_experts"].transpose("token", "decoder_layer", "expert_rank").values)
    n_experts = (ds.sizes["expert"] if "router_logits" in ds.data_vars and "expert" in ds.dims
                 else int(chosen.max()) + 1)
    k = chosen.shape[-1]
    counts = (chosen[..., None] == np.arange(n_experts)).sum(axis=-2).astype("float64") / k
    counts[(chosen < 0).all(axis=-1)] = np.nan          # a dense layer: nothing routed
    return xr.DataArray(counts, dims=("token", "decoder_layer", "expert"),
                        coords={"decoder_layer": ds["decoder_layer"].values, "expert": np.arange(n_experts)})


def expert_load(ds: xr.Dataset, *, text_set: str = "text", per_sample: bool = False,
                n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`load` (condition, modality, decoder_layer, expert) and `distance` (condition,
    decoder_layer), summarized over samples with CI (per_sample: dim `sample` kept)."""
    shares = token_shares(ds)
    layers = [sample_means(ds, shares.sel(decoder_layer=l), text_set) for l in shares["decoder_layer"].values]
    load = xr.concat(layers, dim=xr.DataArray(shares["decoder_layer"].values, dims="decoder_layer"))
    load = load.transpose("condition", "modality", "decoder_layer", "expert", "sample")
    if {"vision", "text"} <= set(load["modality"].values.tolist()):
        distance = 0.5 * abs(load.sel(modality="vision") - load.sel(modality="text")).sum("expert", skipna=False)
    else:  # no vision tokens (a text model, `image: none`): no distance
        distance = xr.full_like(load.isel(modality=0, expert=0, drop=True), np.nan)
    data = xr.Dataset({"load": load, "distance": distance.drop_vars("modality", errors="ignore")})
    return data if per_sample else summarize(data, n_resamples=n_resamples, seed=seed)
