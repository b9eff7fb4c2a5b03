"""Next-token distributions: logit KL and the rank of the reference's top token (Experiments 1, 3).

From `logprobs (run, step, vocab)` (log-softmax of the next-token logits; step 0 = the prediction
right after the prompt), for a sample and a condition c against a reference condition r (same
sample), in float64 after renormalizing each row (log-sum-exp):

- logit KL: KL(p_r ‖ p_c) = Σ_v p_r(v) (ln p_r(v) − ln p_c(v)) in nats (terms with p_r(v) = 0
  are 0);
- rank of the reference's top token: t = argmax_v p_r(v); rank = #{v : ln p_c(v) > ln p_c(t)}
  (0 = still the top token); the table reports the median over samples.

One dask pass over blocks of runs of one step (`streaming.row_map`).
"""

from __future__ import annotations

import dask
import numpy as np
import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .cache import MissingInputs, cached
from .streaming import as_dask, layout, pair_runs, row_map, take_rows


def _normalized(logprobs: np.ndarray) -> np.ndarray:
    x = logprobs.astype(np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    return x - (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))


def kl_from_logprobs(log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """KL(p ‖ q) along the last axis from log-probabilities (renormalized), in nats."""
    log_p, log_q = _normalized(log_p), _normalized(log_q)
    p = np.exp(log_p)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (log_p - log_q), 0.0)
    return terms.sum(-1)


def top_token_rank(log_ref: np.ndarray, log_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top token of the reference, its rank under q: how many tokens q scores strictly higher)."""
    top = np.argmax(log_ref, axis=-1)
    score = np.take_along_axis(log_q, top[..., None], axis=-1)
    return top, (log_q > score).sum(-1)


@cached("next_token", version=1, variables=("logprobs",))
def next_token_comparison(ds: xr.Dataset, reference: str = "baseline", step: int = 0,
                          conditions: list[str] | None = None) -> xr.Dataset:
    """Per (condition, sample): `kl` = KL(reference ‖ condition) of the step's next-token
    distribution, `rank` of the reference's top token under the condition, `top_token` (the
    reference's) and `condition_top` (the condition's own argmax)."""
    lay = layout(ds, "run")
    if reference not in lay.condition_rows:
        raise MissingInputs(f"logit comparisons need the reference condition {reference!r}")
    conditions = lay.conditions if conditions is None else [c for c in lay.conditions if c in conditions]
    part = as_dask(ds["logprobs"].data)[:, step]                          # (run, vocab)

    def compare(log_p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
        top, rank = top_token_rank(log_p, log_q)
        return np.stack([kl_from_logprobs(log_p, log_q), rank, top, np.argmax(log_q, axis=-1)], axis=1)

    jobs, lazies = [], []
    for c, condition in enumerate(conditions):
        rows_c, rows_r = pair_runs(lay, condition, reference)
        if len(rows_c):
            jobs.append((c, lay.sample_code[rows_c]))
            lazies.append(row_map(compare, [take_rows(part, rows_r), take_rows(part, rows_c)], 4))
    shape = (len(conditions), len(lay.samples))
    out = {k: np.full(shape, np.nan) for k in ("kl", "rank", "top_token", "condition_top")}
    for (c, samples), values in zip(jobs, dask.compute(*lazies)):
        for i, key in enumerate(out):
            out[key][c, samples] = values[:, i]
    coords = {"condition": np.array(conditions, dtype=str), "sample": np.array(lay.samples, dtype=str),
              **lay.sweep_coords(conditions)}
    return xr.Dataset({k: (("condition", "sample"), v) for k, v in out.items()}, coords=coords,
                      attrs={"reference": reference, "step": step})


def logit_kl(ds: xr.Dataset, reference: str = "baseline", step: int = 0, *, per_sample: bool = False,
             force: bool = False, cache: bool = True, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.DataArray:
    """KL(reference ‖ condition) of the next-token distribution at `step`, per condition: mean
    over samples with a 95% bootstrap CI."""
    values = next_token_comparison(ds, reference, step, force=force, cache=cache)["kl"].rename("logit_kl")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def median_rank(ds: xr.Dataset, reference: str = "baseline", step: int = 0, *, per_sample: bool = False,
                force: bool = False, cache: bool = True, n_resamples: int = N_RESAMPLES, seed: int = SEED,
                rank_base: int = 0) -> xr.DataArray:
    """Rank under each condition of the reference's top token at `step`: the median over samples
    with a 95% bootstrap CI of the median (`rank_base` = the reference's top token stays on top)."""
    values = next_token_comparison(ds, reference, step, force=force, cache=cache)["rank"] + rank_base
    values = values.rename("median_rank")
    return values if per_sample else summarize(values, stat="median", n_resamples=n_resamples, seed=seed)
