"""How analyses read a store in bounded memory: token/run labels, row blocks, paired rows and
per-group accumulation.

A model's Dataset (from `workbench.open_store(path, model=...)`) concatenates its conditions
along `token` (and `run`); each condition is a contiguous range of rows, chunked by zarr in ~2 MiB
blocks of rows of one layer each. Analyses here never load a variable whole: they walk a
condition's rows in blocks aligned to those chunks (`iter_row_blocks`, at most `BLOCK_BYTES` of
decoded data per block, or one chunk if a chunk is larger) and reduce every block at once into
small per-(sample, modality) sums (`GroupSums`). Memory is bounded by a block, not by the store.

Nothing here imports torch or nnsight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pandas as pd
import xarray as xr

from workbench.store import MODALITIES, RUN_PREFIX

TOKEN_LABELS = ("condition", "sample", "position", "modality", "token_id")
BLOCK_BYTES = 64 * 1024 * 1024   # decoded bytes per block read (tests lower it to force many blocks)
LAYER_DIMS = ("layer", "decoder_layer")


def condition_sort_key(name: str) -> tuple:
    """Baseline first, then conditions by name with swept values in numeric order."""
    parts = []
    for part in name.split(","):
        key, _, value = part.partition("=")
        try:
            parts.append((key, float(value)))
        except ValueError:
            parts.append((part, float("-inf")))
    return (name != "baseline", parts)


@dataclass
class Layout:
    """Labels of one dim (`token` or `run`) of a model's Dataset, as integer codes.

    `condition_rows[c]` are the row indices of condition c (ascending); `sample_code[row]` indexes
    `samples`, `modality_code[row]` indexes `MODALITIES` (-1 on the run dim); `sweep[name][c]` the
    condition's swept value (NaN where it has none)."""

    dim: str
    conditions: list[str]
    samples: list[str]
    condition_rows: dict[str, np.ndarray]
    sample_code: np.ndarray
    modality_code: np.ndarray
    position: np.ndarray | None
    token_id: np.ndarray | None
    sweep: dict[str, dict[str, float]]

    def sweep_coords(self, conditions: list[str] | None = None) -> dict[str, tuple[str, np.ndarray]]:
        """Coordinates along `condition` for every sweep variable (NaN where a condition has none)."""
        conditions = self.conditions if conditions is None else conditions
        return {name: ("condition", np.array([values.get(c, np.nan) for c in conditions], dtype=float))
                for name, values in self.sweep.items()}


def as_str(values) -> np.ndarray:
    """Labels as a fixed-width numpy str array (zarr v3 strings open as numpy StringDType, which
    cannot be cast to `str` directly)."""
    return np.asarray(values).astype(object).astype(str)


def layout(ds: xr.Dataset, dim: str = "token") -> Layout:
    """The labels of `dim` ("token" or "run") of a model's Dataset."""
    prefix = RUN_PREFIX if dim == "run" else ""
    if dim not in ds.dims or ds.sizes[dim] == 0:
        return Layout(dim, [], [], {}, np.zeros(0, int), np.zeros(0, int), None, None, {})
    index_names = list(ds.indexes[dim].names) if dim in ds.indexes else []
    known = {prefix + n for n in TOKEN_LABELS}
    sweep_names = [n for n in index_names if n not in known]
    condition = as_str(ds[prefix + "condition"].values)
    sample = as_str(ds[prefix + "sample"].values)
    conditions = sorted(set(condition.tolist()), key=condition_sort_key)
    samples = sorted(set(sample.tolist()))
    sample_code = pd.Index(samples).get_indexer(sample)
    if dim == "token":
        modality_code = pd.Index(list(MODALITIES)).get_indexer(as_str(ds["modality"].values))
        position = np.asarray(ds["position"].values).astype(np.int64)
        token_id = np.asarray(ds["token_id"].values).astype(np.int64)
    else:
        modality_code, position, token_id = np.full(len(sample), -1), None, None
    rows = {c: np.flatnonzero(condition == c) for c in conditions}
    sweep: dict[str, dict[str, float]] = {}
    for name in sweep_names:
        values = np.asarray(ds[name].values, dtype=float)
        sweep[name[len(prefix):]] = {c: float(values[r[0]]) for c, r in rows.items() if len(r)}
    return Layout(dim, conditions, samples, rows, sample_code, modality_code, position, token_id, sweep)


# -- reading rows in blocks -------------------------------------------------------------------


def _chunk_bounds(data, n: int) -> np.ndarray:
    chunks = getattr(data, "chunks", None)
    if chunks and isinstance(chunks[0], tuple):
        return np.cumsum((0,) + tuple(chunks[0]))
    return np.array([0, n])


def _contiguous_runs(rows: np.ndarray) -> list[tuple[int, int]]:
    if len(rows) == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(rows)]])
    return [(int(rows[s]), int(rows[e - 1]) + 1) for s, e in zip(starts, ends)]


def load(data, index) -> np.ndarray:
    """Rows `index` (a slice or ascending integer array) of a numpy or dask array, as numpy."""
    if isinstance(index, np.ndarray) and len(index) and np.all(np.diff(index) == 1):
        index = slice(int(index[0]), int(index[-1]) + 1)
    part = data[index]
    return np.asarray(part.compute() if hasattr(part, "compute") else part)


def iter_row_blocks(da: xr.DataArray, rows: np.ndarray, block_bytes: int | None = None
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(row indices, values) of `rows` of `da` (first dim), block by block.

    Blocks follow the array's chunks along its first dim and join whole chunks while they stay
    within `block_bytes` of decoded data (default `BLOCK_BYTES`); a block is never smaller than
    one chunk's rows within `rows`."""
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    data = da.data
    n = da.shape[0]
    row_bytes = max(1, int(np.prod(da.shape[1:], dtype=np.int64)) * da.dtype.itemsize)
    max_rows = max(1, block_bytes // row_bytes)
    bounds = _chunk_bounds(data, n)
    for start, stop in _contiguous_runs(np.asarray(rows)):
        cuts = [start, *[int(b) for b in bounds if start < b < stop], stop]
        a = cuts[0]
        for i in range(1, len(cuts)):
            b = cuts[i]
            nxt = cuts[i + 1] if i + 1 < len(cuts) else None
            if nxt is not None and nxt - a <= max_rows:
                continue  # the next chunk still fits in this block
            yield np.arange(a, b), load(data, slice(a, b))
            a = b


# -- pairing rows of two conditions ---------------------------------------------------------


def pair_rows(lay: Layout, condition: str, reference: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `condition` and the `reference` rows of the same token (same sample and position).

    A sample is paired only if both conditions hold it with the same token sequence (same count,
    token ids and modalities): an image removed shifts positions, and such a sample is left out.
    Returns (condition rows, reference rows), aligned, in condition row order."""
    if condition not in lay.condition_rows or reference not in lay.condition_rows:
        return np.zeros(0, int), np.zeros(0, int)
    frames = []
    for name in (condition, reference):
        rows = lay.condition_rows[name]
        frames.append(pd.DataFrame({
            "sample": lay.sample_code[rows], "position": lay.position[rows], "token_id": lay.token_id[rows],
            "modality": lay.modality_code[rows], "row": rows,
        }))
    cond, ref = frames
    merged = cond.merge(ref, on=["sample", "position"], how="outer", suffixes=("", "_ref"), indicator=True)
    merged["ok"] = (merged["_merge"] == "both") & (merged["token_id"] == merged["token_id_ref"]) & (
        merged["modality"] == merged["modality_ref"])
    good = merged.groupby("sample")["ok"].transform("all")
    merged = merged[good & merged["ok"]].sort_values("row")
    return merged["row"].to_numpy(np.int64), merged["row_ref"].to_numpy(np.int64)


def pair_runs(lay: Layout, condition: str, reference: str) -> tuple[np.ndarray, np.ndarray]:
    """Runs of `condition` and of `reference` for the same sample, aligned."""
    if condition not in lay.condition_rows or reference not in lay.condition_rows:
        return np.zeros(0, int), np.zeros(0, int)
    rc, rr = lay.condition_rows[condition], lay.condition_rows[reference]
    by_sample = dict(zip(lay.sample_code[rr].tolist(), rr.tolist()))
    pairs = [(r, by_sample[s]) for r, s in zip(rc.tolist(), lay.sample_code[rc].tolist()) if s in by_sample]
    if not pairs:
        return np.zeros(0, int), np.zeros(0, int)
    a, b = np.array(pairs, dtype=np.int64).T
    return a, b


# -- accumulation ----------------------------------------------------------------------------


class GroupSums:
    """Sums and counts of finite values per group (a row of `codes`), for a mean per group."""

    def __init__(self, n_groups: int, shape: tuple[int, ...]):
        self.sum = np.zeros((n_groups, *shape))
        self.count = np.zeros((n_groups, *shape))

    def add(self, codes: np.ndarray, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        finite = np.isfinite(values)
        np.add.at(self.sum, codes, np.where(finite, values, 0.0))
        np.add.at(self.count, codes, finite)

    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.sum / np.maximum(self.count, 1), np.nan)


def layer_dim(da: xr.DataArray) -> str:
    """The layer dim of a variable: `layer` (residual stream) or `decoder_layer` (K/V/attention)."""
    for dim in da.dims:
        if dim in LAYER_DIMS:
            return dim
    raise ValueError(f"{da.name} has no layer dim (expected one of {LAYER_DIMS}); dims {da.dims}")


def layer_values(ds: xr.Dataset, da: xr.DataArray) -> tuple[str, np.ndarray]:
    dim = layer_dim(da)
    values = ds[dim].values if dim in ds.coords else np.arange(da.sizes[dim])
    return dim, np.asarray(values).astype(np.int64)


def per_group_dataset(lay: Layout, means: dict[str, np.ndarray], conditions: list[str], extra_dims: tuple[str, ...],
                      extra_coords: dict[str, np.ndarray], by_modality: bool = True) -> xr.Dataset:
    """Wrap arrays (condition, sample, [modality,] *extra) as a labeled Dataset."""
    dims = ("condition", "sample", *(("modality",) if by_modality else ()), *extra_dims)
    coords: dict = {"condition": np.array(conditions, dtype=str), "sample": np.array(lay.samples, dtype=str)}
    if by_modality:
        coords["modality"] = np.array(MODALITIES, dtype=str)
    coords.update(extra_coords)
    coords.update(lay.sweep_coords(conditions))
    return xr.Dataset({name: (dims, value) for name, value in means.items()}, coords=coords)


def iter_paired_blocks(data, rows_a: np.ndarray, rows_b: np.ndarray, block_bytes: int | None = None
                       ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(rows_a part, rows_b part, values at rows_a part, values at rows_b part) of a 2-D+ array
    (rows first), in pieces of at most `block_bytes` of decoded data for both sides together."""
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    row_bytes = max(1, int(np.prod(data.shape[1:], dtype=np.int64)) * data.dtype.itemsize * 2)
    step = max(1, block_bytes // row_bytes)
    for start in range(0, len(rows_a), step):
        a, b = rows_a[start:start + step], rows_b[start:start + step]
        yield a, b, load(data, a), load(data, b)
