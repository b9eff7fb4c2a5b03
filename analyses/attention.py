"""Text → vision attention: prefill and decode attention mass, and the attention KL of Experiment 1.

Definitions (`decoder_layer` l is the l-th decoder layer; heads h = 1..H):

- prefill vision mass of query token t at layer l: m_l(t) = (1/H) Σ_h Σ_{k ∈ vision} A_{l,h}(t, k)
  (the store's `prefill_vision_mass`, averaged over heads); per (condition, sample, modality of the
  query) the mean over query tokens. The study's "prefill text → vision" is the text queries.
- decode vision mass at step s, layer l: (1/H) Σ_h Σ_{k ∈ vision} a_{s,l,h}(k), where a is the
  decode query's attention over the prompt keys (`decode_attention`); step s's query predicts
  generated token s. Per (condition, sample, step, layer); NaN for a sample without vision keys.
- attention KL at step s, layer l: for each head, p = a_{s,l,h} of the reference condition over
  the sample's vision keys renormalized to sum 1 (p_k = a_k / Σ_{vision} a), q the same for the
  condition, KL(p ‖ q) = Σ_k p_k (ln p_k − ln q_k) in nats (0 ln 0 = 0); averaged over heads
  → per (condition, sample, layer); the table averages over layers per sample, then over samples.
  The two conditions are matched token by token (same sample and position, same token sequence).

Every summary is the mean over samples with a 95% bootstrap CI (`stat` dim). Each analysis is one
dask pass (two for the KL) over blocks of rows of one decode step (`streaming.group_sums`).
"""

from __future__ import annotations

import dask
import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from .bootstrap import N_RESAMPLES, SEED, summarize
from .cache import MissingInputs, cached
from .streaming import (as_dask, group_sums, layer_mean, layer_values, layout, means, pair_rows, per_group_dataset,
                        take_rows, token_rows)

VISION = MODALITIES.index("vision")


@cached("prefill_attention", version=1, variables=("prefill_vision_mass",))
def prefill_attention(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, modality, decoder_layer): mean over query tokens of the head-mean
    prefill mass on vision keys (`mass`)."""
    lay = layout(ds, "token")
    var = ds["prefill_vision_mass"]                                  # (token, decoder_layer, head)
    _, layers = layer_values(ds, var)
    n_groups = len(lay.samples) * len(MODALITIES)
    lazies = []
    for condition in lay.conditions:
        rows, codes = token_rows(lay, condition)
        lazies.append(group_sums(lambda c, m: m.astype(np.float64).mean(-1), [take_rows(var.data, rows)], codes,
                                 n_groups, len(layers)))
    shape = (len(lay.samples), len(MODALITIES), len(layers))
    mass = np.stack([means(r).reshape(shape) for r in dask.compute(*lazies)]) if lazies else np.zeros((0, *shape))
    return per_group_dataset(lay, {"mass": mass}, lay.conditions, ("decoder_layer",), {"decoder_layer": layers})


@cached("decode_attention_mass", version=1, variables=("decode_attention",))
def decode_attention_mass(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, step, decoder_layer): Σ over the sample's vision keys of the
    head-mean decode attention (`mass`); NaN where the sample has no vision key."""
    lay = layout(ds, "token")
    var = ds["decode_attention"]                                     # (token, step, decoder_layer, head)
    _, layers = layer_values(ds, var)
    steps = var.sizes["step"]
    data = as_dask(var.data)
    lazies = []
    for condition in lay.conditions:
        rows = lay.condition_rows[condition]
        rows = rows[lay.modality_code[rows] == VISION]
        for s in range(steps):
            lazies.append(group_sums(lambda c, a: a.astype(np.float64).mean(-1), [take_rows(data[:, s], rows)],
                                     lay.sample_code[rows], len(lay.samples), len(layers)))
    results = dask.compute(*lazies)
    mass = np.full((len(lay.conditions), len(lay.samples), steps, len(layers)), np.nan)
    for i, r in enumerate(results):
        c, s = divmod(i, steps)
        mass[c, :, s] = np.where(r[1] > 0, r[0], np.nan)             # the sum over vision keys
    return per_group_dataset(lay, {"mass": mass}, lay.conditions, ("step", "decoder_layer"),
                             {"step": np.arange(steps), "decoder_layer": layers}, by_modality=False)


def kl_terms(p: np.ndarray, q: np.ndarray, p_total: np.ndarray, q_total: np.ndarray) -> np.ndarray:
    """p_k (ln p_k − ln q_k) after renormalizing the weights p, q by their totals (0 where p_k = 0;
    +inf where q_k = 0 < p_k; NaN where a total is 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        p = p.astype(np.float64) / np.where(p_total > 0, p_total, np.nan)
        q = q.astype(np.float64) / np.where(q_total > 0, q_total, np.nan)
        return np.where(p > 0, p * (np.log(p) - np.log(q)), np.where(np.isnan(p) | np.isnan(q), np.nan, 0.0))


@cached("attention_kl", version=1, variables=("decode_attention",))
def attention_kl_per_sample(ds: xr.Dataset, reference: str = "baseline", step: int = 0) -> xr.Dataset:
    """Per (condition, sample, decoder_layer): head-mean KL(reference ‖ condition) of the decode
    attention at `step` renormalized over the vision keys (`kl`, nats). Two streaming passes:
    the per-sample totals over vision keys, then the KL terms."""
    lay = layout(ds, "token")
    if reference not in lay.condition_rows:
        raise MissingInputs(f"attention KL needs the reference condition {reference!r}")
    var = ds["decode_attention"]
    _, layers = layer_values(ds, var)
    heads = var.sizes["head"]
    width = len(layers) * heads
    data = as_dask(var.data)[:, step]                                # (token, decoder_layer, head)
    n = len(lay.samples)
    pairs = {}
    for condition in lay.conditions:
        rows_c, rows_r = pair_rows(lay, condition, reference)
        vision = lay.modality_code[rows_c] == VISION
        if vision.any():
            pairs[condition] = (rows_c[vision], rows_r[vision])

    def flat(c: np.ndarray, *blocks: np.ndarray) -> np.ndarray:
        return np.concatenate([b.reshape(len(c), -1) for b in blocks], axis=1)

    kl = np.full((len(lay.conditions), n, len(layers)), np.nan)
    # one condition at a time: the reference's blocks are read again for each condition, but never
    # held in memory for all of them at once
    for condition, (rows_c, rows_r) in pairs.items():
        arrays = [take_rows(data, rows_r), take_rows(data, rows_c)]
        codes = lay.sample_code[rows_c]
        (total,) = dask.compute(group_sums(flat, arrays, codes, n, 2 * width))
        p_total, q_total = total[0][:, :width], total[0][:, width:]

        def terms(c: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
            return kl_terms(p.reshape(len(c), -1), q.reshape(len(c), -1), p_total[c], q_total[c])

        (result,) = dask.compute(group_sums(terms, arrays, codes, n, width))
        present = (result[1] > 0) & (p_total > 0) & (q_total > 0)
        per_head = np.where(present, result[0], np.nan).reshape(n, len(layers), heads)
        kl[lay.conditions.index(condition)] = per_head.mean(-1)
    return per_group_dataset(lay, {"kl": kl}, lay.conditions, ("decoder_layer",), {"decoder_layer": layers},
                             by_modality=False).assign_attrs(reference=reference, step=step)


# -- summaries with CIs ------------------------------------------------------------------------


def prefill_vision_mass(ds: xr.Dataset, modality: str = "text", *, per_sample: bool = False, force: bool = False,
                        cache: bool = True, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.DataArray:
    """Prefill attention mass of `modality` queries on vision keys per (condition, decoder_layer)."""
    values = prefill_attention(ds, force=force, cache=cache)["mass"].sel(modality=modality, drop=True)
    values = values.rename("prefill_vision_mass")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def decode_vision_mass(ds: xr.Dataset, step: int | None = None, *, per_sample: bool = False, force: bool = False,
                       cache: bool = True, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.DataArray:
    """Decode attention mass on vision keys per (condition, decoder_layer), at `step` (None: the
    per-sample mean over every decode step)."""
    values = decode_attention_mass(ds, force=force, cache=cache)["mass"]
    values = values.mean("step") if step is None else values.sel(step=step, drop=True)
    values = values.rename("decode_vision_mass")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


def vision_attention_kl(ds: xr.Dataset, reference: str = "baseline", step: int = 0, *, per_layer: bool = False,
                        per_sample: bool = False, force: bool = False, cache: bool = True,
                        n_resamples: int = N_RESAMPLES, seed: int = SEED, average_layers: str = "all") -> xr.DataArray:
    """Attention KL(reference ‖ condition) over vision keys per condition (per_layer: and layer);
    without per_layer each sample's KL is first averaged over the layers `average_layers` names."""
    values = attention_kl_per_sample(ds, reference, step, force=force, cache=cache)["kl"]
    if not per_layer:
        values = layer_mean(values, average_layers)
    values = values.rename("attention_kl")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)
