"""The norm atlas (specs/norm_atlas.yaml): token norms across the vision-language interface.

For one model and one condition, from the store only (no weights, no torch):
- `vision_layer_norm (vision_layer)`: mean ‖·‖₂ over a sample's patches of each vision-tower
  layer's output (`vision_hidden`), then the mean over samples;
- `vision_norm`: the same for the tower's output as the connector receives it (`vision`);
- `connector_norm`: the connector's output as it enters the LLM: the residual stream at layer 0
  (`hidden`) on the `vision` tokens;
- `text_input_norm`: layer 0 on the `text` tokens (what the decoder reads for text);
- `input_ratio`: per sample connector_norm / text_input_norm, averaged over samples (the
  study's vision/text ratio at the LLM input);
- the embedding table (`embed_table_norms`: every row's norm, the whole vocabulary, as the
  embedding module outputs it): `table_mean`, `table_p05`, `table_p50`, `table_p95`, `table_max`;
- each boundary token of the condition's prompts: its row norm (`boundary_norm`) and its rank
  within the vocabulary (`boundary_rank`: 1 = the largest row norm).

Per-sample values carry a 95% bootstrap CI over samples (`bootstrap.summarize`: a `stat` dim);
the table statistics describe one matrix and have none.
"""

from __future__ import annotations

from typing import cast

import numpy as np
import pandas as pd
import xarray as xr

from .bootstrap import N_RESAMPLES, SEED, summarize
from .cache import MissingInputs
from .streaming import as_str

PATCH_DIM = "vision_patch"  # workbench.store.PATCH_DIM (not imported: analyses stay light)

VARIABLES = ("hidden", "vision", "vision_hidden", "embed_table_norms")
TABLE_QUANTILES = {"table_p05": 0.05, "table_p50": 0.5, "table_p95": 0.95}


def row_norms(var: xr.DataArray, width: str) -> np.ndarray:
    """‖·‖₂ over `width` of every row (computed chunk by chunk: the rows stay lazy until reduced)."""
    return cast(xr.DataArray, np.sqrt((var.astype("float64") ** 2).sum(width))).values  # a DataArray: __array_ufunc__


def _per_sample_mean(values: np.ndarray, samples: np.ndarray) -> pd.DataFrame | pd.Series:
    """Rows (and any trailing columns) averaged per sample: every sample weighs the same."""
    frame = pd.DataFrame(values.reshape(len(samples), -1))
    return frame.groupby(samples, sort=True).mean()


def _rows_of(ds: xr.Dataset, dim: str, condition: str) -> np.ndarray:
    labels = {"token": "condition", PATCH_DIM: "patch_condition", "run": "run_condition"}[dim]
    return np.flatnonzero(as_str(ds[labels].values) == condition)


def _vision_side(ds: xr.Dataset, condition: str) -> dict[str, xr.DataArray]:
    """Per-sample mean norms of the tower's layers and output."""
    rows = _rows_of(ds, PATCH_DIM, condition)
    samples = as_str(ds["patch_sample"].values)[rows]
    out = {}
    if "vision_hidden" in ds:
        per_layer = _per_sample_mean(row_norms(ds["vision_hidden"].isel({PATCH_DIM: rows}), "vision_dim"), samples)
        out["vision_layer_norm"] = xr.DataArray(per_layer.values, dims=("sample", "vision_layer"),
                                                coords={"sample": per_layer.index.values,
                                                        "vision_layer": ds["vision_layer"].values})
    if "vision" in ds:
        mean = _per_sample_mean(row_norms(ds["vision"].isel({PATCH_DIM: rows}), "vision_dim"), samples)[0]
        out["vision_norm"] = xr.DataArray(mean.values, dims="sample", coords={"sample": mean.index.values})
    return out


def _llm_input(ds: xr.Dataset, condition: str) -> dict[str, xr.DataArray]:
    """Per-sample mean norms at layer 0 on vision and text tokens, and their ratio."""
    rows = _rows_of(ds, "token", condition)
    layer0 = ds["hidden"].isel(token=rows).sel(layer=0)
    norms = row_norms(layer0, "dim")
    frame = pd.DataFrame({"sample": as_str(ds["sample"].values)[rows],
                          "modality": as_str(ds["modality"].values)[rows], "norm": norms})
    means = frame.groupby(["sample", "modality"])["norm"].mean().unstack("modality")
    out = {}
    for modality, name in (("vision", "connector_norm"), ("text", "text_input_norm")):
        if modality in means:
            out[name] = xr.DataArray(means[modality].values, dims="sample", coords={"sample": means.index.values})
    if "vision" in means and "text" in means:
        ratio = means["vision"] / means["text"]
        out["input_ratio"] = xr.DataArray(ratio.values, dims="sample", coords={"sample": ratio.index.values})
    return out


def embedding_table(ds: xr.Dataset, condition: str) -> tuple[np.ndarray, xr.Dataset]:
    """The row norms of the embedding table (one run's copy: every run stores the same matrix's)
    and their statistics."""
    runs = _rows_of(ds, "run", condition)
    table = np.asarray(ds["embed_table_norms"].isel(run=int(runs[0])).values, dtype=np.float64)
    stats = {"table_mean": table.mean(), "table_max": table.max(),
             **{name: np.quantile(table, q) for name, q in TABLE_QUANTILES.items()}}
    return table, xr.Dataset({name: xr.DataArray(float(v)) for name, v in stats.items()})


def boundary_tokens(ds: xr.Dataset, condition: str, table: np.ndarray) -> xr.Dataset:
    """Each distinct boundary token id of the condition's prompts: its text, row norm and rank
    within the vocabulary (1 = the largest row norm; ties share the better rank)."""
    rows = _rows_of(ds, "token", condition)
    boundary = rows[as_str(ds["modality"].values)[rows] == "boundary"]
    ids = np.asarray(ds["token_id"].values)[boundary]
    texts = as_str(ds["token_text"].values)[boundary] if "token_text" in ds.coords else ids.astype(str)
    unique, first = np.unique(ids, return_index=True)
    norms = table[unique]
    ranks = 1 + (table[None, :] > norms[:, None]).sum(axis=1)
    coords = {"boundary_id": unique, "boundary_text": ("boundary_id", texts[first])}
    return xr.Dataset({"boundary_norm": ("boundary_id", norms), "boundary_rank": ("boundary_id", ranks)},
                      coords=coords)


def norm_atlas(ds: xr.Dataset, condition: str = "baseline", *, per_sample: bool = False,
               n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """The atlas of one model (see the module doc); `per_sample=True`: the per-sample values
    (dim `sample`) instead of estimates with CIs. Raises MissingInputs naming what is lacking."""
    lacking = [v for v in VARIABLES if v not in ds.data_vars]
    if lacking:
        raise MissingInputs(f"needs {', '.join(lacking)} (capture layer 0, vision, vision_layer, embed_table)")
    if condition not in set(as_str(ds["patch_condition"].values).tolist()):
        raise MissingInputs(f"needs vision-tower rows under {condition!r} (a condition with an image)")
    samples = xr.Dataset({**_vision_side(ds, condition), **_llm_input(ds, condition)})
    table, stats = embedding_table(ds, condition)
    values = samples if per_sample else summarize(samples, n_resamples=n_resamples, seed=seed)
    return xr.merge([values, stats, boundary_tokens(ds, condition, table)], compat="override")
