"""Any condition against a reference: how far each condition moved the model's output and its
residual stream, sample by sample (the `compare` analysis).

For a condition c and the reference r (default `baseline`), paired by sample (and, for the
residual stream, by token), each metric reads only its own variables:

- from `logprobs (run, step, vocab)`, at every decode step s (the runs' own greedy contexts: from
  the first step where their greedy tokens differ, they continue from different texts):
  - `kl`: KL(p_r ‖ p_c) = Σ_v p_r(v) (ln p_r(v) − ln p_c(v)) in nats (`logits.kl_from_logprobs`);
  - `rank`: how many tokens p_c scores strictly above t = argmax_v p_r(v) (0: still on top);
  - `agree`: 1 if argmax_v p_c(v) = argmax_v p_r(v) (the greedy tokens agree), else 0;
- from `logprobs` and `run_answer_ids` (the sample's answer tokenized at run time, without
  special tokens; none where the sample has no answer): `answer_delta` = ln p_c(a₀) − ln p_r(a₀)
  at step 0, a₀ the answer's first token: the one step whose context (the prompt) every
  condition shares;
- from `hidden (token, layer, dim)`, per layer and modality, over the tokens that both
  conditions hold with the same token sequence (`streaming.pair_rows`): `norm_ratio` = the mean
  of ‖h_c(t)‖₂ / ‖h_r(t)‖₂ and `cos` = the mean of cos(h_c(t), h_r(t)) (a zero reference vector
  has no ratio, a zero vector no direction: left out);
- from the scored responses (`accuracy.run_scores`): `accuracy` of c and `accuracy_delta` =
  score_c − score_r per sample.

Each is one value per (condition, sample[, step | modality, layer]); the summaries are the mean
over samples (rank: the median) with a 95% bootstrap CI (`bootstrap.summarize`). Never torch.
"""

from __future__ import annotations

import json

import dask
import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from . import accuracy as accuracy_module
from .bootstrap import N_RESAMPLES, SEED, summarize
from .cache import MissingInputs, cached
from .logits import kl_from_logprobs, top_token_rank
from .streaming import as_dask, as_str, condition_sort_key, group_sums, layer_values, layout, means, paired_groups, \
    pair_runs, per_group_dataset, row_map, take_rows

OUTPUT_METRICS = ("kl", "rank", "agree")
HIDDEN_METRICS = ("norm_ratio", "cos")
ANSWER_LABEL = "run_answer_ids"
ANSWER_LACKING = f"{ANSWER_LABEL} (the answer's token ids; a store written before runs recorded them lacks it)"


def conditions_of(ds: xr.Dataset) -> list[str]:
    """Every condition the model holds, along `token` or `run`, baseline first."""
    held = set(layout(ds, "token").conditions) | set(layout(ds, "run").conditions)
    return sorted(held, key=condition_sort_key)


def log_normalized(logprobs: np.ndarray) -> np.ndarray:
    """Rows of log-probabilities renormalized in float64 (log-sum-exp), as `logits.kl_from_logprobs` does."""
    x = logprobs.astype(np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    return x - (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))


def kl_direction(reference: str) -> str:
    """The KL's direction, named: the reference's distribution first."""
    return f"KL({reference} ‖ condition)"


def _output_rows(log_r: np.ndarray, log_c: np.ndarray) -> np.ndarray:
    """(runs, steps, vocab) × 2 -> (runs, 3 · steps): kl, rank and agree at every step."""
    kl = kl_from_logprobs(log_r, log_c)
    top, rank = top_token_rank(log_r, log_c)
    agree = (np.argmax(log_c, axis=-1) == top).astype(float)
    return np.concatenate([kl, rank, agree], axis=1)


@cached("compare_outputs", version=1, variables=("logprobs",))
def output_comparison(ds: xr.Dataset, reference: str = "baseline") -> xr.Dataset:
    """Per (condition, sample, step): `kl`, `rank`, `agree` against `reference` (module doc)."""
    lay = layout(ds, "run")
    if reference not in lay.condition_rows:
        raise MissingInputs(f"output comparisons need the reference condition {reference!r} with logprobs")
    logprobs = ds["logprobs"]
    steps = logprobs.sizes["step"]
    lazies, jobs = [], []
    for c, condition in enumerate(lay.conditions):
        rows_c, rows_r = pair_runs(lay, condition, reference)
        if len(rows_c):
            jobs.append((c, lay.sample_code[rows_c]))
            lazies.append(row_map(_output_rows, [take_rows(logprobs.data, rows_r), take_rows(logprobs.data, rows_c)],
                                  len(OUTPUT_METRICS) * steps))
    out = np.full((len(OUTPUT_METRICS), len(lay.conditions), len(lay.samples), steps), np.nan)
    for (c, samples), values in zip(jobs, dask.compute(*lazies)):
        out[:, c, samples] = values.reshape(len(samples), len(OUTPUT_METRICS), steps).transpose(1, 0, 2)
    coords = {"condition": np.array(lay.conditions, dtype=str), "sample": np.array(lay.samples, dtype=str),
              "step": np.arange(steps), **lay.sweep_coords()}
    return xr.Dataset({name: (("condition", "sample", "step"), out[i]) for i, name in enumerate(OUTPUT_METRICS)},
                      coords=coords, attrs={"reference": reference})


def answer_ids(ds: xr.Dataset) -> np.ndarray:
    """The first answer token of every run (-1 where the run's sample has no answer)."""
    if ANSWER_LABEL not in ds.variables:
        raise MissingInputs(ANSWER_LACKING)
    first = []
    for text in as_str(ds[ANSWER_LABEL].values):
        ids = json.loads(text) if text else []
        first.append(int(ids[0]) if ids else -1)
    return np.array(first, dtype=np.int64)


def answer_comparison(ds: xr.Dataset, reference: str = "baseline") -> xr.DataArray:
    """Per (condition, sample): ln p_c(a₀) − ln p_r(a₀) at step 0 (`answer_delta`; NaN: no answer)."""
    if "logprobs" not in ds.data_vars:
        raise MissingInputs("logprobs")
    lay = layout(ds, "run")
    if reference not in lay.condition_rows:
        raise MissingInputs(f"the answer's log-prob needs the reference condition {reference!r}")
    ids = answer_ids(ds)
    first_step = as_dask(ds["logprobs"].data)[:, 0]

    def delta(log_r: np.ndarray, log_c: np.ndarray, token: np.ndarray) -> np.ndarray:
        token = token.reshape(-1).astype(np.int64)
        ok = token >= 0
        at = np.where(ok, token, 0)[:, None]
        d = np.take_along_axis(log_normalized(log_c), at, -1)[:, 0] - np.take_along_axis(log_normalized(log_r), at, -1)[:, 0]
        return np.where(ok, d, np.nan)

    out = np.full((len(lay.conditions), len(lay.samples)), np.nan)
    jobs, lazies = [], []
    for c, condition in enumerate(lay.conditions):
        rows_c, rows_r = pair_runs(lay, condition, reference)
        if len(rows_c):
            jobs.append((c, lay.sample_code[rows_c]))
            lazies.append(row_map(delta, [take_rows(first_step, rows_r), take_rows(first_step, rows_c),
                                          ids[rows_r].reshape(-1, 1)], 1))
    for (c, samples), values in zip(jobs, dask.compute(*lazies)):
        out[c, samples] = values[:, 0]
    coords = {"condition": np.array(lay.conditions, dtype=str), "sample": np.array(lay.samples, dtype=str),
              **lay.sweep_coords()}
    return xr.DataArray(out, dims=("condition", "sample"), coords=coords, name="answer_delta",
                        attrs={"reference": reference})


def _hidden_rows(layers: int):
    def compute(codes: np.ndarray, h_c: np.ndarray, h_r: np.ndarray) -> np.ndarray:
        h_c, h_r = h_c.astype(np.float64), h_r.astype(np.float64)
        norm_c = np.sqrt(np.einsum("rld,rld->rl", h_c, h_c))
        norm_r = np.sqrt(np.einsum("rld,rld->rl", h_r, h_r))
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(norm_r > 0, norm_c / norm_r, np.nan)
            cos = np.where((norm_c > 0) & (norm_r > 0), np.einsum("rld,rld->rl", h_c, h_r) / (norm_c * norm_r), np.nan)
        return np.concatenate([ratio, cos], axis=1).reshape(len(codes), 2 * layers)

    return compute


@cached("compare_hidden", version=1, variables=("hidden",))
def hidden_comparison(ds: xr.Dataset, reference: str = "baseline") -> xr.Dataset:
    """Per (condition, sample, modality, layer): `norm_ratio` and `cos` against the same token of
    `reference` (module doc)."""
    lay = layout(ds, "token")
    if reference not in lay.condition_rows:
        raise MissingInputs(f"residual-stream comparisons need the reference condition {reference!r} with hidden")
    hidden = ds["hidden"]
    _, layers = layer_values(ds, hidden)
    n_mod = len(MODALITIES)
    shape = (len(lay.samples), n_mod, len(HIDDEN_METRICS), len(layers))
    out = np.full((len(lay.conditions), *shape), np.nan)
    for c, condition in enumerate(lay.conditions):
        rows_c, rows_r, codes = paired_groups(lay, condition, reference, n_mod)
        if not len(rows_c):
            continue
        lazy = group_sums(_hidden_rows(len(layers)), [take_rows(hidden.data, rows_c), take_rows(hidden.data, rows_r)],
                          codes, len(lay.samples) * n_mod, len(HIDDEN_METRICS) * len(layers))
        # one condition at a time: the reference's blocks are never all held at once (as kv.paired_cosine)
        out[c] = means(dask.compute(lazy)[0]).reshape(shape)
    values = {name: out[:, :, :, i] for i, name in enumerate(HIDDEN_METRICS)}
    result = per_group_dataset(lay, values, lay.conditions, ("layer",), {"layer": layers})
    result.attrs["reference"] = reference
    return result


def accuracy_comparison(ds: xr.Dataset, reference: str = "baseline") -> xr.Dataset:
    """Per (condition, sample): `accuracy` (the response's score: 1, 0, NaN unscored) and
    `accuracy_delta` = score_c − score_r."""
    scores = accuracy_module.run_scores(ds)["score"]
    if reference not in scores.condition.values:
        raise MissingInputs(f"the accuracy difference needs the reference condition {reference!r} with responses")
    return xr.Dataset({"accuracy": scores, "accuracy_delta": scores - scores.sel(condition=reference, drop=True)},
                      attrs={"reference": reference})


# -- per-model functions with CIs ---------------------------------------------------------------


def output_metrics(ds: xr.Dataset, reference: str = "baseline", *, per_sample: bool = False, force: bool = False,
                   cache: bool = True, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`kl` (mean), `rank` (median) and `agree` (mean: the fraction of samples whose greedy tokens
    agree) per (condition, step), with CIs; `kl` carries its direction in attrs."""
    values = output_comparison(ds, reference, force=force, cache=cache)
    values.attrs["kl_direction"] = kl_direction(reference)
    if per_sample:
        return values
    def boot(per_sample: xr.DataArray, stat: str = "mean") -> xr.DataArray:
        return summarize(per_sample, stat=stat, n_resamples=n_resamples, seed=seed)

    out = xr.Dataset({"kl": boot(values["kl"]), "rank": boot(values["rank"], "median"), "agree": boot(values["agree"])})
    out.attrs = {"reference": reference, "kl_direction": kl_direction(reference)}
    return out


def answer_logprob_delta(ds: xr.Dataset, reference: str = "baseline", *, per_sample: bool = False,
                         n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.DataArray:
    """Δ ln p of the answer's first token at step 0 per condition, mean with CI."""
    values = answer_comparison(ds, reference)
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def hidden_metrics(ds: xr.Dataset, reference: str = "baseline", *, per_sample: bool = False, force: bool = False,
                   cache: bool = True, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`norm_ratio` and `cos` per (condition, modality, layer), means with CIs."""
    values = hidden_comparison(ds, reference, force=force, cache=cache)[list(HIDDEN_METRICS)]
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def accuracy_metrics(ds: xr.Dataset, reference: str = "baseline", *, per_sample: bool = False,
                     n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """`accuracy` and `accuracy_delta` per condition, means with CIs."""
    values = accuracy_comparison(ds, reference)
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)
