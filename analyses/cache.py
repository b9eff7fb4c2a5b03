"""Analysis results cached inside the store they were computed from.

Layout (a plain zarr v3 folder inside the store's directory, beside the icechunk repository's own
folders and outside its transactions: derived data, safe to delete; attrs `workbench_kind:
"analysis"`):

    <store>/_analyses/                          attrs {"workbench_kind": "analysis"}
      <model key>/<analysis name>/<fingerprint>/   one xarray Dataset (to_zarr), attrs below

An entry's fingerprint is a SHA-256 over the analysis name, its code version, its parameters and
its inputs: for every dim of the variables it reads (`token`, `run`) a hash of all row labels
(condition, sweep values, sample, position, modality, token id), the shape and dtype of each
variable read, the model's attrs, and the store's provenance (every `workbench run` that writes
appends a record there). A new sample, a new condition, a rerun condition, a subset Dataset
(`ds.sel(...)`) or other parameters give another fingerprint; an unchanged store gives the same
one, and the cached Dataset is read back instead of recomputed. `force=True` recomputes (and
overwrites). Of the entries of one analysis and parameters for different inputs (older states of
the store, subsets) the newest `KEEP_PER_PARAMS` are kept. Entries are written to a temporary
group and renamed into place, so a reader never sees half an entry; a store that cannot be
written (read-only copy) still gets results, uncached. Within a process, entries read or written
are also kept in memory (`_MEMO`), so tables sharing an analysis read it once.

Values edited in memory (`ds["hidden"] = ds.hidden * 2`) keep the labels, shapes and provenance
of the store: pass `cache=False` (or `force=True`) when analysing such a Dataset.

Caching applies to Datasets opened with `open_model` (which records where the store is); a
Dataset from `workbench.open_store` is analysed without a cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import shutil
import time
import uuid
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import xarray as xr
import zarr

from workbench.store import ANALYSES_GROUP, ANALYSIS_KIND, model_key, open_store

from .streaming import as_str

CACHE_GROUP = ANALYSES_GROUP
STORE_ATTR = "workbench_store"
KEEP_PER_PARAMS = 3  # entries kept per (model, analysis, parameters) for different inputs
COMPUTED: Counter = Counter()  # analysis name -> times computed in this process (not read from cache)


class MissingInputs(LookupError):
    """The Dataset lacks a variable or condition an analysis needs."""


def open_model(store: str | Path, model: str) -> xr.Dataset:
    """`workbench.open_store(store, model=model)`, remembering the store so analyses cache there."""
    from workbench.objectstore import is_url

    ds = open_store(store, model=model)
    if not is_url(store):  # the cache is a folder beside a local store; an object store's analyses are not cached
        ds.attrs[STORE_ATTR] = str(Path(store).resolve())
    return ds


def _label_frame(ds: xr.Dataset, dim: str) -> pd.DataFrame:
    if dim not in ds.dims:
        return pd.DataFrame()
    names = list(ds.indexes[dim].names) if dim in ds.indexes else [c for c in ds.coords if ds[c].dims == (dim,)]
    return pd.DataFrame({n: ds[n].values if ds[n].dtype.kind in "fiub" else as_str(ds[n].values) for n in names})


def _hash_frame(frame: pd.DataFrame) -> str:
    h = hashlib.sha256(json.dumps([list(frame.columns), len(frame)]).encode())
    if len(frame):
        h.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    return h.hexdigest()


_LABEL_HASHES: dict[int, tuple[Any, str]] = {}  # id(index) -> (the index, kept alive; its labels' hash)


def labels_hash(ds: xr.Dataset, dim: str) -> str:
    """Hash of every row label of `dim`, memoized per (immutable) pandas index object."""
    index = ds.indexes.get(dim)
    if index is not None and id(index) in _LABEL_HASHES and _LABEL_HASHES[id(index)][0] is index:
        return _LABEL_HASHES[id(index)][1]
    value = _hash_frame(_label_frame(ds, dim))
    if index is not None:
        if len(_LABEL_HASHES) > 64:
            _LABEL_HASHES.clear()
        _LABEL_HASHES[id(index)] = (index, value)
    return value


def inputs_record(ds: xr.Dataset, variables: tuple[str, ...]) -> dict[str, Any]:
    """What an analysis reads, summarised: labels hashes per dim, shapes, model attrs, provenance."""
    present = [v for v in variables if v in ds.data_vars]
    dims = sorted({str(ds[v].dims[0]) for v in present})
    return {
        "variables": {v: {"dims": list(ds[v].dims), "shape": list(ds[v].shape), "dtype": str(ds[v].dtype)}
                      for v in present},
        "labels": {d: labels_hash(ds, d) for d in dims},
        "model": {k: v for k, v in ds.attrs.items() if k in ("model_id", "n_layers", "hidden_size", "family", "revision")},
        "provenance": hashlib.sha256(str(ds.attrs.get("provenance", "")).encode()).hexdigest(),
    }


def fingerprint(name: str, version: int, params: dict[str, Any], inputs: dict[str, Any]) -> str:
    payload = json.dumps({"analysis": name, "version": version, "params": params, "inputs": inputs},
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


# -- on-disk entries ---------------------------------------------------------------------------


def _entry_dir(store: Path, model: str, name: str) -> Path:
    return store / CACHE_GROUP / model_key(model) / name


def _ensure_groups(store: Path, model: str, name: str) -> None:
    root = zarr.open_group(store / CACHE_GROUP, mode="a", zarr_format=3)
    if root.attrs.get("workbench_kind") != ANALYSIS_KIND:
        root.attrs.update({"workbench_kind": ANALYSIS_KIND,
                           "description": "cached analysis results (analyses.cache); safe to delete"})
    zarr.open_group(store / CACHE_GROUP / model_key(model), mode="a", zarr_format=3)
    zarr.open_group(_entry_dir(store, model, name), mode="a", zarr_format=3)


def _for_zarr(result: xr.Dataset) -> xr.Dataset:
    # fixed-width unicode has no zarr v3 spec (warns); object strings are stored as vlen-utf8
    out = result.copy()
    for name, var in out.variables.items():
        if var.dtype.kind == "U" or str(var.dtype).startswith("StringDType"):
            out[name] = var.astype(object)
    return out


def _from_zarr(result: xr.Dataset) -> xr.Dataset:
    for name, var in list(result.variables.items()):
        if var.dtype.kind in "OTU" or str(var.dtype).startswith("StringDType"):
            labels = (var.dims, as_str(var.values))
            result = result.assign_coords({name: labels}) if name in result.coords else result.assign({name: labels})
    return result


_MEMO: dict[tuple[str, str], xr.Dataset] = {}  # (entry path, fingerprint) -> result read or written here


def read_entry(store: Path, model: str, name: str, key: str) -> xr.Dataset | None:
    path = _entry_dir(store, model, name) / key[:24]
    if (str(path), key) in _MEMO:
        return _MEMO[(str(path), key)].copy(deep=True)
    if not (path / "zarr.json").exists():
        return None
    try:
        group = f"{CACHE_GROUP}/{model_key(model)}/{name}/{key[:24]}"
        result = xr.open_zarr(store, group=group, consolidated=False, zarr_format=3, chunks=None).load()
    except Exception:  # a damaged entry is recomputed
        return None
    if result.attrs.get("fingerprint") != key:
        return None
    result.attrs.pop("fingerprint", None)
    result = _from_zarr(result)
    _remember(str(path), key, result)
    return result.copy(deep=True)


def _remember(path: str, key: str, result: xr.Dataset) -> None:
    if len(_MEMO) > 256:
        _MEMO.clear()
    _MEMO[(path, key)] = result.copy(deep=True)


def write_entry(store: Path, model: str, name: str, key: str, result: xr.Dataset, meta: dict[str, Any]) -> None:
    _ensure_groups(store, model, name)
    base = _entry_dir(store, model, name)
    final, tmp = base / key[:24], base / f".tmp-{uuid.uuid4().hex}"
    data = _for_zarr(result)
    data.attrs = {**{k: v for k, v in result.attrs.items() if k != "cache"}, **meta, "fingerprint": key}
    group = f"{CACHE_GROUP}/{model_key(model)}/{name}/{tmp.name}"
    try:
        data.to_zarr(store, group=group, mode="w", consolidated=False, zarr_format=3)
        if final.exists():
            trash = base / f".old-{uuid.uuid4().hex}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # entries of the same analysis and parameters for other inputs (an older state of the store,
    # or a subset of it): keep the newest few
    siblings = []
    for other in base.iterdir():
        if other.name == final.name or not other.is_dir() or other.name.startswith("."):
            continue
        try:
            meta_file = other / "zarr.json"
            if json.loads(meta_file.read_text()).get("attributes", {}).get("params") == meta["params"]:
                siblings.append((meta_file.stat().st_mtime, other.name, other))
        except (OSError, ValueError):
            continue
    for *_, other in sorted(siblings, reverse=True)[KEEP_PER_PARAMS - 1:]:
        shutil.rmtree(other, ignore_errors=True)


def cache_entries(store: str | Path) -> list[dict[str, Any]]:
    """Every cached entry of a store: model, analysis, parameters, when it was computed, bytes."""
    root = Path(store) / CACHE_GROUP
    entries = []
    for meta in sorted(root.glob("*/*/*/zarr.json")):
        entry = meta.parent
        if entry.name.startswith("."):
            continue
        attrs = json.loads(meta.read_text()).get("attributes", {})
        entries.append({"model": attrs.get("model"), "analysis": attrs.get("analysis"), "params": attrs.get("params"),
                        "computed": attrs.get("computed"), "path": str(entry),
                        "bytes": sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())})
    return entries


def clear_cache(store: str | Path) -> None:
    """Delete every cached analysis of a store (they are recomputed on demand)."""
    shutil.rmtree(Path(store) / CACHE_GROUP, ignore_errors=True)


# -- the decorator -----------------------------------------------------------------------------

_FORCING: set[str] | None = None  # fingerprints recomputed in the current `forcing()` scope


@contextlib.contextmanager
def forcing() -> Iterator[None]:
    """Within this scope every cached analysis is recomputed, once per fingerprint: later calls
    for the same inputs reuse that result (what `--force` means for a set of tables sharing
    analyses). Nested scopes share the outer one."""
    global _FORCING
    if _FORCING is not None:
        yield
        return
    _FORCING = set()
    try:
        yield
    finally:
        _FORCING = None



def cached(name: str, version: int, variables: tuple[str, ...]) -> Callable:
    """Make `fn(ds, **params) -> xr.Dataset` cached in the store of `ds`, keyed by `fingerprint`.

    The wrapped function takes two more keywords: `force` (recompute and overwrite) and `cache`
    (False: neither read nor write). Its result's attrs["cache"] says "hit", "computed" or "off"."""

    def decorate(fn: Callable[..., xr.Dataset]) -> Callable[..., xr.Dataset]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(ds: xr.Dataset, *args: Any, force: bool = False, cache: bool = True, **kwargs: Any) -> xr.Dataset:
            missing = [v for v in variables if v not in ds.data_vars]
            if missing:
                raise MissingInputs(f"{name} needs {', '.join(missing)}, which the store does not hold "
                                    f"for {ds.attrs.get('model_id', 'this model')}")
            bound = signature.bind(ds, *args, **kwargs)
            bound.apply_defaults()
            params = json.loads(json.dumps({k: v for k, v in bound.arguments.items() if k != "ds"}, default=list))
            store = ds.attrs.get(STORE_ATTR) if cache else None
            model = ds.attrs.get("model_id", "model")
            key = meta = None
            if store is not None:
                store = Path(store)
                inputs = inputs_record(ds, variables)
                key = fingerprint(name, version, params, inputs)
                meta = {"analysis": name, "version": version, "params": json.dumps(params, sort_keys=True),
                        "model": model}
                if _FORCING is not None and key not in _FORCING:
                    force = True
                    _FORCING.add(key)
                if not force:
                    hit = read_entry(store, model, name, key)
                    if hit is not None:
                        hit.attrs["cache"] = "hit"
                        return hit
            COMPUTED[name] += 1
            result = fn(*bound.args, **bound.kwargs)
            result.attrs.update({"analysis": name, "params": json.dumps(params, sort_keys=True)})
            if store is not None and key is not None and meta is not None:  # both set with the store
                meta["computed"] = time.strftime("%Y-%m-%dT%H:%M:%S")
                _remember(str(_entry_dir(store, model, name) / key[:24]), key, result.assign_attrs(meta))
                try:
                    write_entry(store, model, name, key, result, meta)
                    result.attrs["cache"] = "computed"
                except (OSError, PermissionError, ValueError) as err:
                    warnings.warn(f"could not cache {name} in {store}: {err}", stacklevel=2)
                    result.attrs["cache"] = "off"
            else:
                result.attrs["cache"] = "off"
            return result

        wrapper.analysis_name = name  # type: ignore[attr-defined]
        wrapper.variables = variables  # type: ignore[attr-defined]
        return wrapper

    return decorate
