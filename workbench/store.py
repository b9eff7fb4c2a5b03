"""The activation store: captured tensors on disk as zarr, read back as labeled xarray objects.

Layout (zarr v3, one directory tree):

    <store>/                          root attrs: format version, provenance of every run
      <model key>/                    one group per model (models differ in depth and width)
        <condition>/                  one group per condition: one writer, cheap to delete
          hidden    (token, layer, dim)  float32   the residual stream
          sample, position, modality, token_id (token)      per-token labels
          layer     (layer)                                 layer index of each stored slice
          run_sample (run), run_tokens (run)                the commit record, one row per sample

Every sample is appended as one "long" block of tokens (no padding across samples).

Crash safety. A zarr append touches several arrays and is not atomic across them, but each chunk
file is written atomically (temp file + rename). So a sample is committed by a protocol:
token arrays are extended first, then `run_sample`, and LAST `run_tokens` (fill value -1). A row
of `run_tokens` >= 0 is the commit; the committed token count is the sum of those rows. On open for
writing, every array is truncated to what was committed (repair); readers never see uncommitted
rows. One writer per store, enforced by a lock file.

Dtype and codec (measured, see FIELD-NOTES and benchmarks/): float32 with Blosc lz4 (level 1) +
byte shuffle. zarr has no bfloat16; fp16 overflows on massive activations. fp32 holds bf16 values
exactly, and lz4+shuffle stores bf16-valued fp32 at ~0.45 of its size (~0.9 of the 16-bit size);
level 1 writes ~30% faster than level 5 for 4% more bytes (600x29x2048 bf16-valued blocks here).
Chunks: ~2 MiB, one layer per chunk, the whole hidden dimension, so per-layer reductions stream.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
import zarr

from .errors import StoreError, StorePathError  # noqa: F401  (re-exported)

STORE_FORMAT = 1
COMMIT_ARRAYS = ("run_sample", "run_tokens")
TOKEN_LABELS = ("sample", "position", "modality", "token_id")
MODALITIES = ("vision", "boundary", "text")
_CHUNK_BYTES = 2 * 1024 * 1024

# Skipping "empty" chunks compares every chunk with the fill value: 4-6x slower writes.
zarr.config.set({"array.write_empty_chunks": True})


def fault_point(name: str) -> None:
    """Fault drills: `WORKBENCH_KILL_AT=<name>:<n>` kills this process with SIGKILL the n-th time
    it reaches point `name`, so tests can interrupt a run at an exact place (mid-write, between
    samples, mid-trace). Unset, it costs one dictionary lookup."""
    target = os.environ.get("WORKBENCH_KILL_AT")
    if not target:
        return
    point, _, count = target.rpartition(":")
    if point != name:
        return
    _FAULT_HITS[name] = _FAULT_HITS.get(name, 0) + 1
    if _FAULT_HITS[name] >= int(count):
        os.kill(os.getpid(), signal.SIGKILL)


_FAULT_HITS: dict[str, int] = {}


ANALYSIS_KIND = "analysis"  # attrs["workbench_kind"] of a top-level group of cached analyses (not a model)


def _model_groups(root: zarr.Group) -> list[tuple[str, zarr.Group]]:
    """The model groups of a store: every top-level group but the analysis caches."""
    return sorted((name, g) for name, g in root.groups() if g.attrs.get("workbench_kind") != ANALYSIS_KIND)




class StoreBusyError(StoreError):
    """Another process holds the store's writer lock."""


@dataclass
class Variable:
    """One captured array for one sample. `dims[0]` is "token" (per position) or "run"
    (one row per sample); `coords` labels the other dims (e.g. {"layer": [0, 1, 2]})."""

    dims: tuple[str, ...]
    data: np.ndarray
    coords: dict[str, np.ndarray] = field(default_factory=dict)


def lock_path(store: Path) -> Path:
    return store.with_name(store.name + ".lock")


def model_key(model_id: str) -> str:
    """Group name of a model: HF ids contain '/', which zarr and DataTree reserve."""
    key = model_id.strip("/").replace("/", "--")
    return re.sub(r"[^\w.=,+-]", "_", key)


def _chunk_rows(row_shape: tuple[int, ...], itemsize: int, floor: int) -> int:
    row_bytes = max(1, int(np.prod(row_shape[-1:], dtype=np.int64)) * itemsize)
    rows = 2 ** int(np.floor(np.log2(max(1, _CHUNK_BYTES // row_bytes))))
    return int(min(max(rows, floor), 65536))


def _chunks(shape: tuple[int, ...], itemsize: int, leading: str) -> tuple[int, ...]:
    # first dim: ~2 MiB worth of rows; middle dims one at a time (a layer per chunk); last whole.
    # Per-run rows can be large (a vocabulary of log-probs): no floor on their count, or every
    # append would rewrite a huge partial chunk.
    middle = (1,) * max(0, len(shape) - 2)
    last = (shape[-1],) if len(shape) >= 2 else ()
    floor = 64 if leading == "token" else 1
    return (_chunk_rows(shape, itemsize, floor),) + middle + tuple(max(1, s) for s in last)


def _storage_dtype(data: np.ndarray) -> Any:
    if data.dtype.kind in "US":
        return str
    if data.dtype.kind == "f":
        return np.float32
    return data.dtype


class StoreWriter:
    """The single writer of a store. Use as a context manager; it holds an exclusive lock."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        # the lock lives beside the store: zarr warns about foreign files inside a hierarchy
        self._lock_file = open(lock_path(self.path), "a+")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.seek(0)
            holder = self._lock_file.read().strip() or "unknown"
            self._lock_file.close()
            raise StoreBusyError(
                f"store {self.path} is being written by another workbench process ({holder}); "
                "wait for it to finish or pass another --store"
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(f"pid {os.getpid()}")
        self._lock_file.flush()
        self.root = zarr.open_group(self.path, mode="a", zarr_format=3)
        if "workbench_format" not in self.root.attrs:
            self.root.attrs.update({"workbench_format": STORE_FORMAT, "provenance": []})
        self.repairs: list[str] = self._repair_all()

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()

    # -- provenance and groups ----------------------------------------------------------------
    def add_provenance(self, record: dict[str, Any]) -> None:
        """Append one run's provenance (spec text and hash, versions, time) to the root."""
        history = list(self.root.attrs.get("provenance", []))
        history.append(json.loads(json.dumps(record, default=str)))
        self.root.attrs["provenance"] = history

    def ensure_model(self, model_id: str, attrs: dict[str, Any]) -> zarr.Group:
        key = model_key(model_id)
        if key in self.root:
            group = self.root[key]
            if group.attrs.get("model_id") != model_id:
                raise StoreError(
                    f"store group {key!r} holds model {group.attrs.get('model_id')!r}, not {model_id!r}"
                )
            return group
        group = self.root.create_group(key)
        group.attrs.update({**attrs, "model_id": model_id})
        return group

    def _condition_group(self, model_id: str, condition: str, attrs: dict[str, Any]) -> zarr.Group:
        model = self.root[model_key(model_id)]
        if condition in model:
            return model[condition]
        group = model.create_group(condition)
        group.attrs.update({**attrs, "condition": condition})
        return group

    def committed_samples(self, model_id: str, condition: str) -> list[str]:
        key = model_key(model_id)
        if key not in self.root or condition not in self.root[key]:
            return []
        return _committed(self.root[key][condition])[0]

    # -- writing ------------------------------------------------------------------------------
    def write_sample(
        self,
        model_id: str,
        condition: str,
        sample_id: str,
        variables: dict[str, Variable],
        condition_attrs: dict[str, Any] | None = None,
    ) -> None:
        """Append one sample's captures to (model, condition) and commit it.

        `variables` must include the token labels position/modality/token_id (dims ("token",)).
        Token arrays first, then per-run arrays, then the commit record."""
        group = self._condition_group(model_id, condition, condition_attrs or {})
        samples, counts = _committed(group)
        if sample_id in samples:
            raise StoreError(f"sample {sample_id!r} is already stored for {model_id} / {condition}")
        n_tokens = _token_count(variables)
        token_offset, run_offset = int(sum(counts)), len(samples)
        token_vars = dict(variables)
        token_vars["sample"] = Variable(("token",), np.full(n_tokens, sample_id, dtype=object).astype(str))
        for name, var in token_vars.items():
            offset = token_offset if var.dims[0] == "token" else run_offset
            self._append(group, name, var, offset)
        fault_point("store.before_commit")
        self._append(group, "run_sample", Variable(("run",), np.array([sample_id])), run_offset)
        # the commit: a run_tokens row >= 0 makes the sample visible
        self._append(group, "run_tokens", Variable(("run",), np.array([n_tokens], dtype=np.int64)), run_offset)
        fault_point("store.after_commit")

    def _append(self, group: zarr.Group, name: str, var: Variable, offset: int) -> None:
        data = np.asarray(var.data)
        if name not in group:
            self._create(group, name, var)
        array = group[name]
        if tuple(array.shape[1:]) != data.shape[1:]:
            raise StoreError(
                f"{name}: shape {data.shape[1:]} per {var.dims[0]} does not match the stored "
                f"{tuple(array.shape[1:])} in {group.path}; write to a new store"
            )
        for dim, values in var.coords.items():
            if dim in group and not np.array_equal(group[dim][:], np.asarray(values)):
                raise StoreError(f"{name}: coordinate {dim} differs from the stored one in {group.path}")
        array.resize((offset + data.shape[0],) + tuple(array.shape[1:]))
        # asarray: no copy when the capture already has the stored dtype (float32)
        array[offset : offset + data.shape[0]] = data if data.dtype.kind == "U" else np.asarray(data, dtype=array.dtype)

    def _create(self, group: zarr.Group, name: str, var: Variable) -> None:
        data = np.asarray(var.data)
        dtype = _storage_dtype(data)
        itemsize = 4 if dtype is str else np.dtype(dtype).itemsize
        kwargs: dict[str, Any] = {}
        if np.dtype(dtype if dtype is not str else object).kind == "f":
            kwargs["compressors"] = zarr.codecs.BloscCodec(cname="lz4", clevel=1, shuffle="shuffle")
        fill = -1 if name == "run_tokens" else None
        group.create_array(
            name,
            shape=(0,) + data.shape[1:],
            chunks=_chunks((0,) + data.shape[1:], itemsize, var.dims[0]),
            dtype=dtype,
            dimension_names=list(var.dims),
            fill_value=fill,
            **kwargs,
        )
        for dim, values in var.coords.items():
            if dim not in group:
                values = np.asarray(values)
                coord = group.create_array(dim, shape=values.shape, dtype=values.dtype, dimension_names=[dim])
                coord[:] = values

    # -- repair -------------------------------------------------------------------------------
    def _repair_all(self) -> list[str]:
        repairs = []
        for model_name, model in _model_groups(self.root):
            for condition, group in model.groups():
                message = _truncate_to_committed(group)
                if message:
                    repairs.append(f"{model_name}/{condition}: {message}")
        for partial in self.path.rglob("*.partial"):  # temp files of a killed chunk write
            partial.unlink(missing_ok=True)
        return repairs


def _token_count(variables: dict[str, Variable]) -> int:
    lengths = {v.data.shape[0] for v in variables.values() if v.dims[0] == "token"}
    if len(lengths) != 1:
        raise StoreError(f"token variables disagree on the number of tokens: {sorted(lengths)}")
    return lengths.pop()


def _committed(group: zarr.Group) -> tuple[list[str], list[int]]:
    """(sample ids, token counts) of the committed rows, in order."""
    if "run_tokens" not in group or "run_sample" not in group:
        return [], []
    counts = np.asarray(group["run_tokens"][:])
    n = int(np.argmax(counts < 0)) if (counts < 0).any() else len(counts)
    n = min(n, group["run_sample"].shape[0])
    return [str(s) for s in group["run_sample"][:n]], [int(c) for c in counts[:n]]


def _committed_extent(group: zarr.Group) -> dict[str, int]:
    samples, counts = _committed(group)
    return {"token": int(sum(counts)), "run": len(samples)}


def _truncate_to_committed(group: zarr.Group) -> str | None:
    """Cut every array back to the committed rows; return what was cut, or None."""
    extent = _committed_extent(group)
    cut = []
    for name, array in group.arrays():
        first = (array.metadata.dimension_names or (None,))[0]
        if first not in extent or array.shape[0] == extent[first]:
            continue
        cut.append(f"{name} {array.shape[0]}->{extent[first]}")
        array.resize((extent[first],) + tuple(array.shape[1:]))
    return ", ".join(cut) or None


# -- reading -----------------------------------------------------------------------------------


def _damage(group: zarr.Group) -> list[str]:
    extent = _committed_extent(group)
    torn = []
    for name, array in group.arrays():
        first = (array.metadata.dimension_names or (None,))[0]
        if first in extent and array.shape[0] != extent[first]:
            torn.append(f"{name}: {array.shape[0]} rows stored, {extent[first]} committed")
    return torn


RUN_PREFIX = "run_"  # per-run labels: `condition` would clash with the token labels of that name


def _open_condition(path: Path, model: str, condition: str, attrs: dict[str, Any]) -> tuple[xr.Dataset, xr.Dataset]:
    """(token part, run part) of one condition group, cut to its committed rows and labeled."""
    group = f"{model}/{condition}"
    ds = xr.open_zarr(path, group=group, consolidated=False, chunks={}, zarr_format=3)
    extent = {k: v for k, v in _committed_extent(zarr.open_group(path / group, mode="r")).items() if k in ds.dims}
    ds = ds.isel({dim: slice(0, n) for dim, n in extent.items()}).rename_vars({"run_tokens": "n_tokens"})
    ds.attrs = {}
    sweep = {name: float(value) for name, value in (attrs.get("sweep") or {}).items()}
    tokens = ds[[v for v in ds.data_vars if "token" in ds[v].dims]]
    n = tokens.sizes.get("token", 0)
    tokens = tokens.assign_coords(
        condition=("token", np.full(n, condition, dtype=object).astype(str)),
        **{name: ("token", np.full(n, value)) for name, value in sweep.items()},
    )
    tokens = tokens.set_coords([v for v in TOKEN_LABELS if v in tokens.data_vars])
    runs = ds[[v for v in ds.data_vars if "run" in ds[v].dims]]
    m = runs.sizes.get("run", 0)
    runs = runs.assign_coords(
        run_condition=("run", np.full(m, condition, dtype=object).astype(str)),
        **{RUN_PREFIX + name: ("run", np.full(m, value)) for name, value in sweep.items()},
    ).set_coords("run_sample")
    return tokens, runs


def _label_index(ds: xr.Dataset, dim: str, levels: list[str]) -> xr.Dataset:
    """Build a MultiIndex on `dim` over its labels, so `.sel` takes several of them at once
    (zarr cannot store a MultiIndex, so it is rebuilt on every open)."""
    levels = [c for c in levels if c in ds.coords]
    for level in levels:  # small 1-D labels: load them, the index needs values
        ds[level] = ds[level].load()
    return ds.set_index({dim: levels}) if levels else ds


def list_models(path: str | Path) -> list[str]:
    root = zarr.open_group(Path(path), mode="r", zarr_format=3)
    return [g.attrs.get("model_id", name) for name, g in _model_groups(root)]


def _concat(parts: list[xr.Dataset], dim: str, fill: dict[str, str]) -> xr.Dataset:
    # a condition without a sweep variable gets NaN there (baseline has no alpha)
    for i, part in enumerate(parts):
        size = part.sizes.get(dim, 0)
        parts[i] = part.assign_coords({c: (dim, np.full(size, np.nan)) for c in fill if c not in part.coords})
    return xr.concat(parts, dim=dim, data_vars="minimal", coords="minimal", compat="override", join="outer")


def _open_model(path: Path, root: zarr.Group, key: str) -> xr.Dataset:
    model_group = root[key]
    token_parts, run_parts, sweep_vars = [], [], []
    for condition, group in sorted(model_group.groups()):
        attrs = dict(group.attrs)
        sweep_vars += [name for name in attrs.get("sweep") or {} if name not in sweep_vars]
        tokens, runs = _open_condition(path, key, condition, attrs)
        token_parts.append(tokens)
        run_parts.append(runs)
    if not token_parts:
        return xr.Dataset(attrs=dict(model_group.attrs))
    tokens = _concat(token_parts, "token", {v: v for v in sweep_vars})
    tokens = _label_index(tokens, "token", ["condition", *sweep_vars, "sample", "position", "modality", "token_id"])
    runs = _concat(run_parts, "run", {RUN_PREFIX + v: v for v in sweep_vars})
    runs = _label_index(runs, "run", ["run_condition", *(RUN_PREFIX + v for v in sweep_vars), "run_sample"])
    ds = xr.merge([tokens, runs], compat="override", join="outer")
    ds.attrs = {**dict(model_group.attrs), "provenance": json.dumps(root.attrs.get("provenance", []))}
    return ds


def open_store(path: str | Path, model: str | None = None) -> xr.DataTree | xr.Dataset:
    """Open a store for reading.

    Without `model`: an `xarray.DataTree` with one node per model (named by `model_key`, the
    model id in the node's attrs). With `model` (the id exactly as the spec gives it): that model's
    Dataset across all its conditions, with `hidden (token, layer, dim)` and the token labels
    `condition`, sweep values (e.g. `alpha`), `sample`, `position`, `modality`, `token_id`
    indexed together so `ds.sel(condition="baseline", modality="vision", layer=0)` works.
    Arrays are lazy (dask): nothing is loaded until used. Rows a crashed writer left uncommitted
    are never returned."""
    path = Path(path)
    if not (path / "zarr.json").exists():
        raise StoreError(f"no workbench store at {path}")
    root = zarr.open_group(path, mode="r", zarr_format=3)
    if model is not None:
        key = model_key(model)
        if key not in root or root[key].attrs.get("workbench_kind") == ANALYSIS_KIND:
            raise StoreError(f"model {model!r} is not in store {path}; it holds: {', '.join(list_models(path))}")
        return _open_model(path, root, key)
    children = {key: xr.DataTree(_open_model(path, root, key)) for key, _ in _model_groups(root)}
    tree = xr.DataTree(children=children)
    tree.attrs = {k: (json.dumps(v) if k == "provenance" else v) for k, v in root.attrs.items()}
    return tree


def store_info(path: str | Path) -> dict[str, Any]:
    """What a store holds: per model and condition, samples, tokens, variables, layers, bytes,
    and any damage (rows written but not committed by a crashed writer)."""
    path = Path(path)
    if not (path / "zarr.json").exists():
        raise StoreError(f"no workbench store at {path}")
    root = zarr.open_group(path, mode="r", zarr_format=3)
    info: dict[str, Any] = {"path": str(path), "models": {}, "runs": len(root.attrs.get("provenance", []))}
    for key, model in _model_groups(root):
        conditions = {}
        for condition, group in sorted(model.groups()):
            samples, counts = _committed(group)
            variables = {
                name: {"dims": list(a.metadata.dimension_names or ()), "shape": list(a.shape)}
                for name, a in sorted(group.arrays())
                # labels, commit records and coordinate arrays (named after their own dim) are not data
                if name not in COMMIT_ARRAYS + TOKEN_LABELS and list(a.metadata.dimension_names or ()) != [name]
            }
            conditions[condition] = {
                "samples": len(samples),
                "tokens": int(sum(counts)),
                "variables": variables,
                "layers": [int(x) for x in group["layer"][:]] if "layer" in group else [],
                "bytes": _disk_bytes(path / key / condition),
                "damage": _damage(group),
                "nonfinite_runs": int((np.asarray(group["nonfinite"][: len(samples)]) > 0).sum()) if "nonfinite" in group else 0,
                "sweep": dict(group.attrs.get("sweep") or {}),
            }
        info["models"][model.attrs.get("model_id", key)] = {"key": key, "conditions": conditions, **{
            k: v for k, v in model.attrs.items() if k in ("family", "n_layers", "hidden_size", "revision")
        }}
    return info


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
