"""The KV cache under intervention: key/value cosines (Experiment 2) and KV substitution (Experiment 3).

- cos(K′, K) at decoder layer l: for a token of a condition and the same token (sample, position,
  same token sequence) of the reference, the cosine of the two flattened key vectors
  (kv = kv_heads · head_dim, after RoPE: the KV cache's content); averaged over the tokens of a
  (condition, sample, modality), then (table) over layers per sample, then over samples with a
  95% bootstrap CI. cos(V′, V) the same for values. The study reports vision tokens.
- KV substitution: with z_real, z_blank and z_hybrid the next-token distributions (step 0) of the
  real image, the blank image, and the real image decoding from a KV cache whose vision positions
  hold the blank image's keys/values: D_KL(z_real ‖ z_hybrid) and D_KL(z_blank ‖ z_hybrid) per
  sample (as in `logits.kl_from_logprobs`), mean over samples with a 95% bootstrap CI.
- head-resolved: the same cosines per KV head (each head's head_dim-wide slice of the vector;
  `kv_cosine_heads_per_sample`), so one head that breaks is not averaged away.
"""

from __future__ import annotations

import dask
import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from .bootstrap import N_RESAMPLES, SEED, summarize
from .cache import MissingInputs, cached
from .logits import next_token_comparison
from .streaming import (group_sums, layer_mean, layer_values, layout, means, paired_groups, per_group_dataset,
                        take_rows)


def row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of matching rows (last axis), float64; NaN for a zero vector."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))


def per_head(var: xr.DataArray, kv_heads: int) -> xr.DataArray:
    """`keys`, `values` or `keys_pre` (token, decoder_layer, kv) with the head dim restored:
    (token, decoder_layer, kv_head, head_dim). The captures flatten each position's
    (kv_heads, head_dim) heads first, so this is a reshape; `kv_heads` is the model group's attr
    (`ds.attrs["kv_heads"]`). Lazy arrays stay lazy."""
    width = var.sizes["kv"]
    if kv_heads < 1 or width % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} does not divide the kv width {width}")
    shape = (*var.shape[:-1], kv_heads, width // kv_heads)
    data = var.data.reshape(shape)
    coords = {name: c for name, c in var.coords.items() if "kv" not in c.dims}
    return xr.DataArray(data, dims=(*var.dims[:-1], "kv_head", "head_dim"), coords=coords, name=var.name,
                        attrs=var.attrs).assign_coords(kv_head=np.arange(kv_heads))


def paired_cosine(ds: xr.Dataset, reference: str, names: list[str], heads: int | None = None) -> xr.Dataset:
    """Per (condition, sample, modality, layer dim of the variables): the mean over tokens of the
    cosine of each variable in `names` (`cos_<name>`) between a token and the same token (sample,
    position, token sequence: `pair_rows`) of `reference`. `heads`: the last axis is that many
    equal slices (KV heads), each its own cosine, along a `kv_head` dim."""
    lay = layout(ds, "token")
    if reference not in lay.condition_rows:
        raise MissingInputs(f"cosines to a reference need the reference condition {reference!r}")
    dim, layers = layer_values(ds, ds[names[0]])
    n_mod, n_heads = len(MODALITIES), heads or 1
    width = len(layers) * n_heads

    def cosine(g: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        split = (len(g), len(layers), n_heads, -1)
        return row_cosine(x.reshape(split), y.reshape(split)).reshape(len(g), width)

    shape = (len(lay.samples), n_mod, len(layers), *((n_heads,) if heads else ()))
    out = {f"cos_{n}": np.full((len(lay.conditions), *shape), np.nan) for n in names}
    for c, condition in enumerate(lay.conditions):
        rows_c, rows_r, codes = paired_groups(lay, condition, reference, n_mod)
        if not len(rows_c):
            continue
        lazies = [group_sums(cosine, [take_rows(ds[name].data, rows_c), take_rows(ds[name].data, rows_r)], codes,
                             len(lay.samples) * n_mod, width) for name in names]
        # one compute per condition: the reference's blocks are read again for each condition,
        # but never held in memory for all of them at once
        for name, result in zip(names, dask.compute(*lazies)):
            out[f"cos_{name}"][c] = means(result).reshape(shape)
    extra = {dim: layers, **({"kv_head": np.arange(n_heads)} if heads else {})}
    return per_group_dataset(lay, out, lay.conditions, tuple(extra), extra)


def _kv_cosine(ds: xr.Dataset, reference: str) -> xr.Dataset:
    names = [n for n in ("keys", "values") if n in ds.data_vars]
    return paired_cosine(ds, reference, names).rename({f"cos_{n}": f"cos_{n[0]}" for n in names})


@cached("kv_cosine", version=1, variables=("keys", "values"))
def kv_cosine_per_sample(ds: xr.Dataset, reference: str = "baseline") -> xr.Dataset:
    """Per (condition, sample, modality, decoder_layer): mean over tokens of cos(K′, K) (`cos_k`)
    and cos(V′, V) (`cos_v`) against the same token of `reference`."""
    return _kv_cosine(ds, reference)


def kv_cosine(ds: xr.Dataset, reference: str = "baseline", modality: str = "vision", *, per_layer: bool = False,
              per_sample: bool = False, force: bool = False, cache: bool = True, n_resamples: int = N_RESAMPLES,
              seed: int = SEED, average_layers: str = "all") -> xr.Dataset:
    """cos(K′, K) and cos(V′, V) at `modality` tokens per condition (per_layer: and layer), with
    CIs; without per_layer each sample's cosine is averaged over the decoder layers that
    `average_layers` names (workbench.definitions)."""
    values = kv_cosine_per_sample(ds, reference, force=force, cache=cache).sel(modality=modality, drop=True)
    values = values[["cos_k", "cos_v"]]
    if not per_layer:
        values = layer_mean(values, average_layers)
    values.attrs = {"reference": reference, "modality": modality}
    return values if per_sample else summarize(values, n_resamples=n_resamples, seed=seed)


@cached("kv_cosine_heads", version=1, variables=("keys", "values"))
def kv_cosine_heads_per_sample(ds: xr.Dataset, reference: str = "baseline") -> xr.Dataset:
    """Per (condition, sample, modality, decoder_layer, kv_head): mean over tokens of the cosine of
    one KV head's key (`cos_k`) and value (`cos_v`) vector (head_dim wide) against the same token
    of `reference`. Needs the model's `kv_heads` attr (stored by every run)."""
    if "kv_heads" not in ds.attrs:
        raise MissingInputs("head-resolved K/V needs the model's kv_heads attr (stores written since it is recorded)")
    values = paired_cosine(ds, reference, ["keys", "values"], heads=int(ds.attrs["kv_heads"]))
    return values.rename({"cos_keys": "cos_k", "cos_values": "cos_v"})


def kv_substitution(ds: xr.Dataset, real: str = "baseline", blank: str = "blank", hybrid: str = "hybrid",
                    step: int = 0, *, self_swap: str | None = "self_swap", per_sample: bool = False,
                    force: bool = False, cache: bool = True, n_resamples: int = N_RESAMPLES,
                    seed: int = SEED) -> xr.Dataset:
    """D_KL(z_real ‖ z_hybrid) (`kl_real_hybrid`), D_KL(z_blank ‖ z_hybrid) (`kl_blank_hybrid`)
    and the scale to read them against: D_KL(z_real ‖ z_blank) (`kl_real_blank`), what replacing
    the whole image moves. Where the store holds the `self_swap` control (the sample as its own
    donor, which must reproduce the real distribution), also D_KL(z_real ‖ z_self) (`kl_real_self`)."""
    runs = layout(ds, "run")
    missing = [c for c in (real, blank, hybrid) if c not in runs.condition_rows]
    if "logprobs" not in ds.data_vars or missing:
        raise MissingInputs("KV substitution needs logprobs and the conditions "
                            f"{real!r}, {blank!r}, {hybrid!r}" + (f" (missing: {', '.join(missing)})" if missing else ""))

    def kl(reference: str, condition: str) -> xr.DataArray:
        compared = next_token_comparison(ds, reference, step, [condition], force=force, cache=cache)["kl"]
        compared = compared.sel(condition=condition, drop=True)
        return compared.drop_vars([c for c in compared.coords if c != "sample"])

    pairs = {"kl_real_hybrid": (real, hybrid), "kl_blank_hybrid": (blank, hybrid), "kl_real_blank": (real, blank)}
    if self_swap is not None and self_swap in runs.condition_rows:
        pairs["kl_real_self"] = (real, self_swap)
    out = xr.Dataset({name: kl(*pair) for name, pair in pairs.items()})
    out.attrs = {"real": real, "blank": blank, "hybrid": hybrid, "self_swap": self_swap or "", "step": step}
    return out if per_sample else summarize(out, n_resamples=n_resamples, seed=seed)
