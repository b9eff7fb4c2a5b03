"""One streaming pass over the residual stream `hidden (token, layer, dim)` that every
residual-stream metric (norms, updates, rotation, text-curve correlations) is read from.

Per token t and stored layer l (h_l = the residual stream after l decoder layers, h_0 = the LLM
input), in float64:

- norm            ‖h_l‖₂
- update          ‖u_l‖₂ with u_l = h_l − h_{l−1}            (l ≥ 1: the update made by layer l)
- relative_update ‖u_l‖₂ / ‖h_{l−1}‖₂                        (l ≥ 1; so ‖u₁‖/‖h₀‖ at l = 1)
- cos_first       cos(h_l, h_0) = h_l·h_0 / (‖h_l‖ ‖h_0‖)    (1 at l = 0)
- cos_prev        cos(h_l, h_{l−1})                           (l ≥ 1)

(`update`, `relative_update` and `cos_prev` need layer l−1 stored; NaN otherwise, and at l = 0.)
Each is averaged over the tokens of one (condition, sample, modality): the result holds one value
per sample, so that every sample weighs the same in later means and bootstrap intervals over
samples. Token rows are read in chunk-aligned blocks (all layers of a block at once), so memory is
bounded by a block.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from .cache import cached
from .streaming import GroupSums, iter_row_blocks, layer_values, layout, per_group_dataset

METRICS = ("norm", "update", "relative_update", "cos_first", "cos_prev")


def token_metrics(x: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """(rows, layers, dim) residual rows -> (rows, 5, layers): the METRICS of every token and layer."""
    x = x.astype(np.float64, copy=False)
    rows, n_layers = x.shape[:2]
    out = np.full((rows, len(METRICS), n_layers), np.nan)
    norm = np.sqrt(np.einsum("rld,rld->rl", x, x))
    out[:, 0] = norm
    with np.errstate(invalid="ignore", divide="ignore"):
        if n_layers > 1:
            consecutive = np.diff(layers) == 1
            u = x[:, 1:] - x[:, :-1]
            update = np.sqrt(np.einsum("rld,rld->rl", u, u))
            del u
            dot_prev = np.einsum("rld,rld->rl", x[:, 1:], x[:, :-1])
            out[:, 1, 1:] = np.where(consecutive, update, np.nan)
            out[:, 2, 1:] = np.where(consecutive, update / norm[:, :-1], np.nan)
            out[:, 4, 1:] = np.where(consecutive, dot_prev / (norm[:, 1:] * norm[:, :-1]), np.nan)
        first = np.flatnonzero(layers == 0)
        if len(first):
            i0 = int(first[0])
            out[:, 3] = np.einsum("rld,rd->rl", x, x[:, i0]) / (norm * norm[:, i0:i0 + 1])
    return out


@cached("residual_geometry", version=1, variables=("hidden",))
def residual_geometry(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, modality, layer): the token means of METRICS (module doc), plus
    `tokens (condition, sample, modality)`, the number of tokens averaged."""
    lay = layout(ds, "token")
    da = ds["hidden"]
    dim, layers = layer_values(ds, da)
    n_mod = len(MODALITIES)
    shape = (len(lay.conditions), len(lay.samples), n_mod, len(METRICS), len(layers))
    means = np.full(shape, np.nan)
    tokens = np.zeros(shape[:3])
    for c, condition in enumerate(lay.conditions):
        acc = GroupSums(len(lay.samples) * n_mod, (len(METRICS), len(layers)))
        for rows, block in iter_row_blocks(da, lay.condition_rows[condition]):
            codes = lay.sample_code[rows] * n_mod + lay.modality_code[rows]
            acc.add(codes, token_metrics(block, layers))
        means[c] = acc.mean().reshape(len(lay.samples), n_mod, len(METRICS), len(layers))
        tokens[c] = acc.count[:, 0, 0].reshape(len(lay.samples), n_mod)
    data = {name: np.moveaxis(means, 3, 0)[i] for i, name in enumerate(METRICS)}
    result = per_group_dataset(lay, data, lay.conditions, ("layer",), {"layer": layers})
    result["tokens"] = (("condition", "sample", "modality"), tokens)
    result.attrs["model_id"] = ds.attrs.get("model_id", "")
    return result
