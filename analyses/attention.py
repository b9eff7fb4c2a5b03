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

Every summary is the mean over samples with a 95% bootstrap CI (`stat` dim). Each (condition,
step, layer) slice is read in chunk-aligned row blocks.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from .bootstrap import N_RESAMPLES, SEED, summarize
from .cache import MissingInputs, cached
from .streaming import GroupSums, iter_row_blocks, layer_values, layout, load, pair_rows, per_group_dataset

VISION = MODALITIES.index("vision")


@cached("prefill_attention", version=1, variables=("prefill_vision_mass",))
def prefill_attention(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, modality, decoder_layer): mean over query tokens of the head-mean
    prefill mass on vision keys (`mass`)."""
    lay = layout(ds, "token")
    da = ds["prefill_vision_mass"]
    dim, layers = layer_values(ds, da)
    n_mod = len(MODALITIES)
    mass = np.full((len(lay.conditions), len(lay.samples), n_mod, len(layers)), np.nan)
    for c, condition in enumerate(lay.conditions):
        for i in range(len(layers)):
            acc = GroupSums(len(lay.samples) * n_mod, ())
            part = da.isel({dim: i})                                   # (token, head)
            for rows, block in iter_row_blocks(part, lay.condition_rows[condition]):
                acc.add(lay.sample_code[rows] * n_mod + lay.modality_code[rows], block.astype(np.float64).mean(-1))
            mass[c, :, :, i] = acc.mean().reshape(len(lay.samples), n_mod)
    return per_group_dataset(lay, {"mass": mass}, lay.conditions, ("decoder_layer",), {"decoder_layer": layers})


@cached("decode_attention_mass", version=1, variables=("decode_attention",))
def decode_attention_mass(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, step, decoder_layer): Σ over the sample's vision keys of the
    head-mean decode attention (`mass`); NaN where the sample has no vision key."""
    lay = layout(ds, "token")
    da = ds["decode_attention"]
    dim, layers = layer_values(ds, da)
    steps = da.sizes["step"]
    mass = np.full((len(lay.conditions), len(lay.samples), steps, len(layers)), np.nan)
    for c, condition in enumerate(lay.conditions):
        rows_c = lay.condition_rows[condition]
        has_vision = np.zeros(len(lay.samples), bool)
        has_vision[lay.sample_code[rows_c][lay.modality_code[rows_c] == VISION]] = True
        sums = np.zeros((len(lay.samples), steps, len(layers)))
        for s in range(steps):
            for i in range(len(layers)):
                part = da.isel({"step": s, dim: i})                    # (token, head)
                for rows, block in iter_row_blocks(part, rows_c):
                    vision = lay.modality_code[rows] == VISION
                    np.add.at(sums[:, s, i], lay.sample_code[rows][vision],
                              block[vision].astype(np.float64).mean(-1))
        mass[c] = np.where(has_vision[:, None, None], sums, np.nan)
    return per_group_dataset(lay, {"mass": mass}, lay.conditions, ("step", "decoder_layer"),
                             {"step": np.arange(steps), "decoder_layer": layers}, by_modality=False)


def renormalized_kl(p_rows: np.ndarray, q_rows: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    """KL(p ‖ q) per (group, column) after renormalizing p and q over the rows of each group.

    p_rows, q_rows: (rows, columns) nonnegative weights; groups: (rows,) group index. Returns
    (n_groups, columns) in nats; NaN for a group without rows or with zero total weight."""
    p_rows, q_rows = p_rows.astype(np.float64), q_rows.astype(np.float64)
    cols = p_rows.shape[1]
    p_tot, q_tot = np.zeros((n_groups, cols)), np.zeros((n_groups, cols))
    np.add.at(p_tot, groups, p_rows)
    np.add.at(q_tot, groups, q_rows)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = p_rows / p_tot[groups]
        q = q_rows / q_tot[groups]
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    kl = np.zeros((n_groups, cols))
    np.add.at(kl, groups, terms)
    return np.where((p_tot > 0) & (q_tot > 0), kl, np.nan)


@cached("attention_kl", version=1, variables=("decode_attention",))
def attention_kl_per_sample(ds: xr.Dataset, reference: str = "baseline", step: int = 0) -> xr.Dataset:
    """Per (condition, sample, decoder_layer): head-mean KL(reference ‖ condition) of the decode
    attention at `step` renormalized over the vision keys (`kl`, nats)."""
    lay = layout(ds, "token")
    if reference not in lay.condition_rows:
        raise MissingInputs(f"attention KL needs the reference condition {reference!r}")
    da = ds["decode_attention"]
    dim, layers = layer_values(ds, da)
    kl = np.full((len(lay.conditions), len(lay.samples), len(layers)), np.nan)
    for c, condition in enumerate(lay.conditions):
        rows_c, rows_r = pair_rows(lay, condition, reference)
        vision = lay.modality_code[rows_c] == VISION
        rows_c, rows_r = rows_c[vision], rows_r[vision]
        if not len(rows_c):
            continue
        groups = lay.sample_code[rows_c]
        present = np.isin(np.arange(len(lay.samples)), groups)
        for i in range(len(layers)):
            part = da.isel({"step": step, dim: i}).data               # (token, head)
            p, q = load(part, rows_r), load(part, rows_c)
            per_head = renormalized_kl(p, q, groups, len(lay.samples))
            kl[c, :, i] = np.where(present, per_head.mean(-1), np.nan)
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
                        n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.DataArray:
    """Attention KL(reference ‖ condition) over vision keys per condition (per_layer: and layer);
    without per_layer each sample's KL is first averaged over layers."""
    values = attention_kl_per_sample(ds, reference, step, force=force, cache=cache)["kl"]
    if not per_layer:
        values = values.mean("decoder_layer")
    values = values.rename("attention_kl")
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)
