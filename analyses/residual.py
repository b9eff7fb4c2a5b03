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
samples. A zero vector has no direction: its cosines and relative update are left out (NaN). One
dask pass over blocks of token rows (all layers of a block at once; `streaming.group_sums`), so
memory is bounded by a block per thread.
"""

from __future__ import annotations

import dask
import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from .cache import cached
from .streaming import group_sums, layer_values, layout, means, per_group_dataset, take_rows, token_rows

METRICS = ("norm", "update", "relative_update", "cos_first", "cos_prev")


def token_metrics(x: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """(rows, layers, dim) residual rows -> (rows, 5, layers): the METRICS of every token and layer
    (float64, computed a few rows at a time to bound temporaries)."""
    rows, n_layers = x.shape[:2]
    out = np.full((rows, len(METRICS), n_layers), np.nan)
    step = max(1, (8 << 20) // max(1, x[0].size * 8))
    consecutive = np.diff(layers) == 1
    first = np.flatnonzero(layers == 0)
    for a in range(0, rows, step):
        h = x[a:a + step].astype(np.float64)
        norm = np.sqrt(np.einsum("rld,rld->rl", h, h))
        safe = np.where(norm > 0, norm, np.nan)                      # a zero vector has no direction
        part = out[a:a + step]
        part[:, 0] = norm
        if n_layers > 1:
            u = h[:, 1:] - h[:, :-1]
            update = np.sqrt(np.einsum("rld,rld->rl", u, u))
            dot_prev = np.einsum("rld,rld->rl", h[:, 1:], h[:, :-1])
            part[:, 1, 1:] = np.where(consecutive, update, np.nan)
            part[:, 2, 1:] = np.where(consecutive, update / safe[:, :-1], np.nan)
            part[:, 4, 1:] = np.where(consecutive, dot_prev / (safe[:, 1:] * safe[:, :-1]), np.nan)
        if len(first):
            i0 = int(first[0])
            part[:, 3] = np.einsum("rld,rd->rl", h, h[:, i0]) / (safe * safe[:, i0:i0 + 1])
    return out


@cached("residual_geometry", version=1, variables=("hidden",))
def residual_geometry(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample, modality, layer): the token means of METRICS (module doc), plus
    `tokens (condition, sample, modality)`, the number of tokens averaged."""
    lay = layout(ds, "token")
    hidden = ds["hidden"]
    _, layers = layer_values(ds, hidden)
    n_groups, width = len(lay.samples) * len(MODALITIES), len(METRICS) * len(layers)
    lazies = []
    for condition in lay.conditions:
        rows, codes = token_rows(lay, condition)
        lazies.append(group_sums(lambda c, h: token_metrics(h, layers), [take_rows(hidden.data, rows)], codes,
                                 n_groups, width))
    shape = (len(lay.samples), len(MODALITIES), len(METRICS), len(layers))
    results = dask.compute(*lazies)
    mean = np.stack([means(r).reshape(shape) for r in results]) if results else np.zeros((0, *shape))
    tokens = np.stack([r[1].reshape(shape)[:, :, 0, 0] for r in results]) if results else np.zeros((0, *shape[:2]))
    data = {name: mean[:, :, :, i] for i, name in enumerate(METRICS)}
    result = per_group_dataset(lay, data, lay.conditions, ("layer",), {"layer": layers})
    result["tokens"] = (("condition", "sample", "modality"), tokens)
    result.attrs["model_id"] = ds.attrs.get("model_id", "")
    return result


def with_text_set(geometry: xr.Dataset, text_set: str = "text") -> xr.Dataset:
    """`geometry` with its `text` group defined as `text_set` (workbench.definitions): `text`
    leaves it as it is; `text+boundary` replaces each sample's text means by the token-weighted
    mean of its text and boundary means (= the mean over all its non-vision tokens) and adds the
    counts. The `boundary` group stays as it was."""
    if text_set == "text":
        return geometry
    if text_set != "text+boundary":
        raise ValueError(f"text_set: got {text_set!r}; expected 'text' or 'text+boundary'")
    groups = ["text", "boundary"]
    tokens = geometry["tokens"].sel(modality=groups)
    out = geometry.copy()
    for name in METRICS:
        values = geometry[name].sel(modality=groups)
        weight = tokens.where(np.isfinite(values), 0)          # a group without a value weighs nothing
        total = weight.sum("modality")
        merged = (values.fillna(0) * weight).sum("modality") / total.where(total > 0)
        out[name] = geometry[name].where(geometry.modality != "text", merged)
    out["tokens"] = geometry["tokens"].where(geometry.modality != "text", tokens.sum("modality"))
    return out


def geometry(ds: xr.Dataset, text_set: str = "text", *, force: bool = False, cache: bool = True) -> xr.Dataset:
    """`residual_geometry` (cached) with the text group defined by `text_set`."""
    return with_text_set(residual_geometry(ds, force=force, cache=cache), text_set)
