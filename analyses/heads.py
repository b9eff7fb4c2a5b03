"""Attention per head: where each head looks at vision tokens, and how much it parks on the sink.

Definitions (`decoder_layer` l, head h; A_{l,h}(t, k) the attention probability of query t on key k):

- head vision mass of query modality M: m_{l,h} = mean over the sample's query tokens t of
  modality M of Σ_{k ∈ vision} A_{l,h}(t, k) (the store's `prefill_vision_mass`, NOT averaged over
  heads); per (condition, sample, modality, layer, head). The study's "text → vision" is M = text.
- sink mass at decode step s: a_{s,l,h}(0), the step's query attention on the first prompt
  position (the attention sink of the StreamingLLM / massive-activation literature); per
  (condition, sample, step, layer, head), from `decode_attention`.

Per-sample values; the `heads` table (`analyses.builtin.heads`) takes the mean over samples with a 95%
bootstrap CI. Torch-free: reads the store only.
"""

from __future__ import annotations

import dask
import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from .cache import cached
from .streaming import as_dask, group_sums, layer_values, layout, means, per_group_dataset, take_rows, token_rows


@cached("head_vision_mass", version=1, variables=("prefill_vision_mass",))
def head_vision_mass(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, modality, decoder_layer, head): mean over query tokens of the
    head's prefill attention mass on vision keys (`mass`)."""
    lay = layout(ds, "token")
    var = ds["prefill_vision_mass"]                                  # (token, decoder_layer, head)
    _, layers = layer_values(ds, var)
    heads = var.sizes["head"]
    width = len(layers) * heads
    n_groups = len(lay.samples) * len(MODALITIES)
    lazies = []
    for condition in lay.conditions:
        rows, codes = token_rows(lay, condition)
        lazies.append(group_sums(lambda c, m: m.astype(np.float64).reshape(len(c), width),
                                 [take_rows(var.data, rows)], codes, n_groups, width))
    shape = (len(lay.samples), len(MODALITIES), len(layers), heads)
    mass = np.stack([means(r).reshape(shape) for r in dask.compute(*lazies)]) if lazies else np.zeros((0, *shape))
    return per_group_dataset(lay, {"mass": mass}, lay.conditions, ("decoder_layer", "head"),
                             {"decoder_layer": layers, "head": np.arange(heads)})


@cached("attention_sink", version=1, variables=("decode_attention",))
def attention_sink(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, step, decoder_layer, head): the decode query's attention on the
    first prompt position (`sink`)."""
    lay = layout(ds, "token")
    var = ds["decode_attention"]                                     # (token, step, decoder_layer, head)
    _, layers = layer_values(ds, var)
    steps, heads = var.sizes["step"], var.sizes["head"]
    width = len(layers) * heads
    data = as_dask(var.data)
    lazies = []
    for condition in lay.conditions:
        rows = lay.condition_rows[condition]
        rows = rows[lay.token_labels()[0][rows] == 0]                # one row per sample
        for s in range(steps):
            lazies.append(group_sums(lambda c, a: a.astype(np.float64).reshape(len(c), width),
                                     [take_rows(data[:, s], rows)], lay.sample_code[rows], len(lay.samples), width))
    results = dask.compute(*lazies)
    sink = np.full((len(lay.conditions), len(lay.samples), steps, len(layers), heads), np.nan)
    for i, r in enumerate(results):
        c, s = divmod(i, steps)
        sink[c, :, s] = means(r).reshape(len(lay.samples), len(layers), heads)
    return per_group_dataset(lay, {"sink": sink}, lay.conditions, ("step", "decoder_layer", "head"),
                             {"step": np.arange(steps), "decoder_layer": layers, "head": np.arange(heads)},
                             by_modality=False)
