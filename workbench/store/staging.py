"""A result's rows on their way into a commit: identity checks, a condition's committed layout
as the writer tracks it, the rows staged per result and where each block goes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np
import zarr

from ..errors import StoreError
from ..names import DERIVED_LABELS, GEOMETRY, GEOMETRY_DIM, GEOMETRY_LABELS, RUN_TEXT, RUN_TEXT_LABELS
from .layout import MODALITIES, PATCH_DIM, Variable
from .repository import dimension_names, read_all


class StoredResult(NamedTuple):
    """One result as the store takes it (`StoreWriter.write_samples`): a sample's captures of
    one (model, condition)."""

    model_id: str
    condition: str
    sample_id: str
    variables: dict[str, Variable]
    condition_attrs: dict[str, Any] | None = None
    input_hash: str = ""


class StoreIdentityError(StoreError):
    """A resume whose condition or model means something else than what the store holds."""

    exit_code = 2


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def identity_diff(stored: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """'field: stored X, now Y' for every field that differs (nested dicts are walked)."""
    lines = []
    for key in sorted(set(stored) | set(now)):
        a, b = stored.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += identity_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: stored {json.dumps(a)}, now {json.dumps(b)}")
    return lines
MODEL_IDENTITY = ("model_id", "architecture", "revision", "dtype", "device_kind", "n_layers", "hidden_size", "vocab_size")


@dataclass
class _ConditionState:
    """A condition group's committed layout as the writer tracks it: samples, row counts, the
    per-row shape of each array, coordinate values."""

    samples: set[str]
    tokens: int
    runs: int
    shapes: dict[str, tuple[int, ...]]
    coords: dict[str, np.ndarray]
    patches: int = 0
    # each array's committed rows after its last chunk boundary (filled as it appends)
    tails: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def read(cls, group: zarr.Group) -> _ConditionState:
        arrays = dict(group.arrays())
        coords = {name: read_all(a) for name, a in arrays.items() if dimension_names(a) == (name,)}
        shapes = {name: tuple(a.shape[1:]) for name, a in arrays.items() if name not in coords}
        samples = {str(s) for s in read_all(arrays["run_sample"])} if "run_sample" in arrays else set()
        return cls(samples, _rows_along(arrays, "token"), len(samples), shapes, coords, _rows_along(arrays, PATCH_DIM))

    def offset(self, dim: str) -> int:
        """Rows already committed along a row dim (token, patch or run)."""
        return {"token": self.tokens, PATCH_DIM: self.patches, "run": self.runs}[dim]

    def commit(self, sample_id: str, n_tokens: int, shapes: dict[str, tuple[int, ...]], rows: dict[str, Variable],
               n_patches: int = 0) -> None:
        self.samples.add(sample_id)
        self.tokens += n_tokens
        self.patches += n_patches
        self.runs += 1
        self.shapes.update(shapes)
        for var in rows.values():
            self.coords.update({dim: np.asarray(v) for dim, v in var.coords.items() if dim not in self.coords})


def _check_layout(where: str, rows: dict[str, Variable], known: dict[str, tuple[int, ...]],
                  coords: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Each row's shape and coordinates against what the condition already holds (`known`
    per-row shapes, `coords`)."""
    shapes = {}
    for name, var in rows.items():
        tail = tuple(np.shape(var.data)[1:])
        if name in known and known[name] != tail:
            raise StoreError(f"{name}: shape {tail} per {var.dims[0]} does not match the stored "
                             f"{known[name]} in {where}; write to a new store")
        for dim, values in var.coords.items():
            if dim in coords and not np.array_equal(coords[dim], np.asarray(values)):
                raise StoreError(f"{name}: coordinate {dim} differs from the stored one in {where}")
        shapes[name] = tail
    return shapes


class _Staged:
    """One result's rows as staged for a commit, with what `_ConditionState.commit` needs."""

    def __init__(self, sample_id: str, rows: dict[str, Variable], n_tokens: int, n_patches: int,
                 shapes: dict[str, tuple[int, ...]]):
        self.sample_id, self.rows, self.n_tokens, self.n_patches, self.shapes = sample_id, rows, n_tokens, n_patches, shapes


def _staged_rows(where: str, state: _ConditionState, sample_id: str, variables: dict[str, Variable],
                 input_hash: str, known: _Layout) -> _Staged:
    """A result's variables plus the store's own labels of it (sample, run rows, input hash),
    its shapes and coordinates checked against `known` (what the condition holds so far,
    committed or staged before it in this commit), which then holds it too."""
    if sample_id in state.samples:
        raise StoreError(f"sample {sample_id!r} is already stored for {where}")
    n_tokens = _token_count(variables)
    rows = _stored_rows(where, sample_id, variables)
    rows["run_sample"] = Variable(("run",), np.array([sample_id], dtype=object))
    rows["run_tokens"] = Variable(("run",), np.array([n_tokens], dtype=np.int64))
    rows["run_input"] = Variable(("run",), np.array([input_hash], dtype=object))
    n_patches = _row_count(variables, PATCH_DIM)
    if n_patches is not None:  # vision-tower rows: their own row dim, labelled like tokens
        rows["run_patches"] = Variable(("run",), np.array([n_patches], dtype=np.int64))
    shapes = _check_layout(where, rows, known.shapes, known.coords)
    known.advance(rows)
    return _Staged(sample_id, rows, n_tokens, n_patches or 0, shapes)


def _stored_rows(where: str, sample_id: str, variables: dict[str, Variable]) -> dict[str, Variable]:
    """A result's variables as stored: the labels a reader derives from the run rows (each
    token's sample and position in it, the same per vision-tower row) are checked and left out,
    and the per-run text labels (`run_prompt`, `run_question`, ...) become one JSON object in
    RUN_TEXT; the geometry labels (`image`, `tile`, ..., `box_y1`) one (token, 8) float32 array,
    GEOMETRY (a commit appends one array for them, not eight)."""
    rows: dict[str, Variable] = {}
    text: dict[str, str] = {}
    geometry = [name for name in GEOMETRY_LABELS if name in variables]
    if geometry:
        if geometry != list(GEOMETRY_LABELS):
            raise StoreError(f"{', '.join(geometry)} without {', '.join(sorted(set(GEOMETRY_LABELS) - set(geometry)))} "
                             f"in {where}; expected all eight geometry labels or none")
        rows[GEOMETRY] = Variable(("token", GEOMETRY_DIM), np.stack(
            [np.asarray(variables[name].data, dtype=np.float32) for name in GEOMETRY_LABELS], axis=1))
    for name, var in variables.items():
        data = np.asarray(var.data)
        if name in DERIVED_LABELS:
            expected = np.full(len(data), sample_id) if name.endswith("sample") else np.arange(len(data))
            if data.ndim != 1 or not np.array_equal(data, expected):
                raise StoreError(f"{name}: expected {'the sample id' if name.endswith('sample') else '0, 1, 2, ...'} "
                                 f"on every row (the store derives it) in {where}")
        elif name in GEOMETRY_LABELS:
            continue
        elif name == "modality" and data.dtype.kind in "USO":
            rows[name] = Variable(var.dims, _modality_codes(where, data), var.coords)
        elif name in RUN_TEXT_LABELS:
            if data.shape != (1,):
                raise StoreError(f"{name}: expected one text per run, got shape {data.shape} in {where}")
            text[name] = str(data[0])
        else:
            rows[name] = var
    if text:
        if RUN_TEXT in rows:
            raise StoreError(f"{RUN_TEXT} and {', '.join(text)} in one result in {where}; expected one or the other")
        rows[RUN_TEXT] = Variable(("run",), np.array([json.dumps(text, ensure_ascii=False)], dtype=object))
    return rows


def _modality_codes(where: str, data: np.ndarray) -> np.ndarray:
    """`modality` as stored: int8 codes into MODALITIES (one byte a token instead of a string).
    One comparison per known modality, not a sort of the strings (np.unique): a third of a tiny
    result's staging on the writer's thread."""
    data = data.astype(str, copy=False).reshape(-1)
    codes = np.full(data.shape, -1, dtype=np.int8)
    for code, name in enumerate(MODALITIES):
        codes[data == name] = code
    if (codes < 0).any():
        unknown = sorted(set(data[codes < 0].tolist()))
        raise StoreError(f"modality: {', '.join(map(repr, unknown))} in {where}; expected one of {', '.join(MODALITIES)}")
    return codes


def _rows_along(arrays: dict[str, zarr.Array], dim: str) -> int:
    """Rows stored along a row dim (token, patch), from the arrays' shapes."""
    return max((a.shape[0] for a in arrays.values() if a.ndim and (dimension_names(a) or (None,))[0] == dim),
               default=0)


def _same_names(pending: list[_Staged]) -> list[list[_Staged]]:
    """Consecutive results with the same variables: each run is appended as one block."""
    runs: list[list[_Staged]] = []
    for item in pending:
        if runs and set(runs[-1][0].rows) == set(item.rows):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def _concat_rows(parts: list[dict[str, Variable]]) -> dict[str, Variable]:
    """Results' rows joined along each variable's row dim (token, patch or run)."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for name, first in parts[0].items():  # shapes and coordinates agree (checked in _staged_rows)
        data = np.concatenate([np.asarray(p[name].data) for p in parts])
        if data.dtype.kind in "US":  # strings: one conversion of the block (zarr writes objects)
            data = data.astype(object)
        out[name] = Variable(first.dims, data, first.coords)
    return out


class _Layout:
    """Where the next block of a condition goes within one commit: row offsets per row dim, the
    arrays and coordinates that exist (committed, or staged earlier in this commit)."""

    def __init__(self, offsets: dict[str, int], shapes: dict[str, tuple[int, ...]], coords: dict[str, np.ndarray]):
        self.offsets, self.shapes, self.coords = offsets, shapes, coords

    @classmethod
    def of(cls, state: _ConditionState) -> _Layout:
        return cls({dim: state.offset(dim) for dim in ("token", PATCH_DIM, "run")}, dict(state.shapes),
                   dict(state.coords))

    def advance(self, block: dict[str, Variable]) -> None:
        for dim in self.offsets:
            counts = {np.shape(v.data)[0] for v in block.values() if v.dims[0] == dim}
            self.offsets[dim] += counts.pop() if counts else 0
        self.shapes.update({name: tuple(np.shape(v.data)[1:]) for name, v in block.items()})
        for var in block.values():
            self.coords.update({dim: np.asarray(v) for dim, v in var.coords.items() if dim not in self.coords})


def _commit_message(results: Sequence[StoredResult]) -> str:
    """'model | condition[ + condition...] | sample' (`info --history`); a gathered commit names
    its first and last sample and how many it holds."""
    def joined(values: list[str]) -> str:
        return " + ".join(dict.fromkeys(values))

    samples = list(dict.fromkeys(r.sample_id for r in results))
    which = samples[0] if len(samples) == 1 else f"{samples[0]} ... {samples[-1]} ({len(samples)} samples)"
    return f"{joined([r.model_id for r in results])} | {joined([r.condition for r in results])} | {which}"


def _token_count(variables: dict[str, Variable]) -> int:
    count = _row_count(variables, "token")
    if count is None:
        raise StoreError("no token variables: expected the token labels position/modality/token_id")
    return count
ROW_NAMES = {"token": "tokens", PATCH_DIM: "patches"}


def _row_count(variables: dict[str, Variable], dim: str) -> int | None:
    """The number of rows the variables with leading `dim` share (None: there are none)."""
    lengths = {v.data.shape[0] for v in variables.values() if v.dims[0] == dim}
    if len(lengths) > 1:
        raise StoreError(f"{dim} variables disagree on the number of {ROW_NAMES.get(dim, dim)}: {sorted(lengths)}")
    return lengths.pop() if lengths else None
