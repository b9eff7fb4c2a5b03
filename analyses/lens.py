"""The logit lens on vision and text tokens per layer, from the stored lens (site `logit_lens`:
the top-k ids and log-probabilities of log_softmax(lm_head(final_norm(h_l))) at every position;
analyses never load weights).

Per token t and residual layer l (F = the last layer stored, the model's own prediction when it is
L):
- `agreement`: 1 if the lens's top-1 token at layer l is the top-1 token at layer F, else 0 (how
  early a position's final prediction is already readable);
- `top1_prob`: exp of the top-1 log-probability at layer l (the lens's confidence).

Per (condition, modality, layer): the mean over a sample's tokens of that modality
(`grouping.sample_means`), then the mean over samples with a 95% bootstrap CI.
Pure numpy/xarray, never torch.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .grouping import sample_means

VARIABLES = ("lens_ids", "lens_logprobs")
MEASURES = ("agreement", "top1_prob")


def token_lens(ds: xr.Dataset) -> xr.Dataset:
    """Per (token, layer): `agreement` with the last stored layer's top-1 and `top1_prob`."""
    missing = [v for v in VARIABLES if v not in ds.data_vars]
    if missing:
        raise ValueError(f"the logit lens needs {', '.join(missing)} (capture site logit_lens)")
    top1 = ds["lens_ids"].isel(lens_rank=0)
    last = top1.isel(layer=-1)
    agreement = (top1 == last).astype("float64")
    top1_prob = np.exp(ds["lens_logprobs"].isel(lens_rank=0).astype("float64"))
    return xr.Dataset({"agreement": agreement, "top1_prob": top1_prob}).drop_vars("lens_rank", errors="ignore")


def logit_lens(ds: xr.Dataset, *, text_set: str = "text", per_sample: bool = False,
               n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`agreement`, `top1_prob` per (condition, modality, layer), summarized over samples with CI
    (per_sample: dim `sample` kept). attrs `final_layer`: the layer agreement is measured against."""
    tokens = token_lens(ds)
    data = xr.Dataset({name: sample_means(ds, tokens[name].compute(), text_set) for name in MEASURES})
    data.attrs["final_layer"] = int(ds["layer"].values[-1])
    return data if per_sample else summarize(data, n_resamples=n_resamples, seed=seed)
