"""Reading a store: one committed snapshot (the branch, a tag or a snapshot id) as labeled xarray
objects (`open_store`), what it holds (`store_info`), its history and models."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Hashable, Iterator, Sequence, overload

import numpy as np
import xarray as xr
import zarr

from ..errors import StoreError, StorePathError
from ..names import GEOMETRY, GEOMETRY_LABELS, PATCH_LABELS, RUN_LABELS, RUN_TEXT, RUN_TEXT_LABELS, TEXT_LABELS, TOKEN_LABELS
from .layout import MODALITIES, PATCH_DIM
from .objects import ObjectStore, _short, location
from .readers import announced_reader
from .repository import (
    BRANCH, STORE_FORMAT, _open_repo, _root_of, array_at, dimension_names, group_at, is_store, json_dict, json_list, model_key,
    read_all,
)
from .staging import ROW_NAMES, _rows_along


# attrs["workbench_kind"] of the analysis cache (analyses.cache), a plain zarr folder beside the repository
ANALYSIS_KIND = "analysis"
ANALYSES_GROUP = "_analyses"  # that folder's name inside the store's directory
RUN_PREFIX = "run_"  # per-run labels: `condition` would clash with the token labels of that name
PATCH_PREFIX = "patch_"  # per-patch labels (vision-tower rows, dim PATCH_DIM), likewise


@contextlib.contextmanager
def _reading(path: Path | ObjectStore) -> Iterator[None]:
    """Metadata that does not parse (a damaged file) becomes a StoreError that points to verify."""
    try:
        yield
    except StoreError:
        raise
    except Exception as err:
        if type(err).__name__ not in ("IcechunkError", "JSONDecodeError", "UnicodeDecodeError") and not isinstance(err, OSError):
            raise
        raise StoreError(f"cannot read store {path}: {_short(err)}",
                         hint=f"run `workbench verify {path}` to see what is damaged") from None


def _read_session(path: Path | ObjectStore, snapshot: str | None = None) -> tuple[Any, Any]:
    """A read-only session on the committed state (the branch), a tag (`run-3`) or a snapshot id."""
    if not is_store(path):
        if isinstance(path, Path) and (path / "zarr.json").is_file():
            raise StorePathError(f"{path} is a store in the old format (plain zarr); this workbench reads format "
                                 f"{STORE_FORMAT}", hint="rerun its spec into a new store")
        raise StorePathError(f"no workbench store at {path}")
    repo = _open_repo(path)
    try:
        if snapshot is None:
            return repo, repo.readonly_session(branch=BRANCH)
        if snapshot in repo.list_tags():
            return repo, repo.readonly_session(tag=snapshot)
        return repo, repo.readonly_session(snapshot_id=snapshot)
    except Exception as err:
        tags = ", ".join(sorted(repo.list_tags())) or "none"
        raise StoreError(f"cannot read snapshot {snapshot or BRANCH!r} of {path}: {_short(err)}",
                         hint=f"tags: {tags}; `workbench info {path} --history` lists snapshots") from None


def _announced_session(path: Path | ObjectStore, snapshot: str | None = None) -> tuple[Any, Any, Any]:
    """`_read_session` and the one zarr store every read goes through, its snapshot announced to
    a local store's writer for as long as that store object lives (`readers`): a run's compaction
    keeps what it reads."""
    if isinstance(path, ObjectStore) or not is_store(path):  # an object store is not compacted by its writers
        repo, session = _read_session(path, snapshot)
        return repo, session, session.store
    with announced_reader(path) as hold:
        repo, session = _read_session(path, snapshot)
        store = session.store
        hold(session.snapshot_id, store)
    return repo, session, store


def _open_condition(store: Any, model: str, condition: str, attrs: dict[str, Any]) -> tuple[xr.Dataset, ...]:
    """(token part, run part, patch part) of one condition group, labeled."""
    ds = xr.open_zarr(store, group=f"{model}/{condition}", consolidated=False, chunks={}, zarr_format=3)
    ds = _with_derived_labels(ds, f"{model}/{condition}").rename_vars({"run_tokens": "n_tokens"})
    ds.attrs = {}
    sweep = {name: _sweep_label(value) for name, value in (attrs.get("sweep") or {}).items()}
    tokens = ds[[v for v in ds.data_vars if "token" in ds[v].dims]]
    n = tokens.sizes.get("token", 0)
    tokens = tokens.assign_coords({
        "condition": ("token", np.full(n, condition, dtype=object).astype(str)),
        **{name: ("token", np.full(n, value)) for name, value in sweep.items()},
    })
    tokens = tokens.set_coords([v for v in (*TOKEN_LABELS, *GEOMETRY_LABELS, *TEXT_LABELS) if v in tokens.data_vars])
    runs = ds[[v for v in ds.data_vars if "run" in ds[v].dims]]
    m = runs.sizes.get("run", 0)
    runs = runs.assign_coords({
        "run_condition": ("run", np.full(m, condition, dtype=object).astype(str)),
        **{RUN_PREFIX + name: ("run", np.full(m, value)) for name, value in sweep.items()},
    }).set_coords([c for c in ("run_sample", "run_input", *TEXT_LABELS) if c in runs.data_vars])
    patches = ds[[v for v in ds.data_vars if PATCH_DIM in ds[v].dims]]
    k = patches.sizes.get(PATCH_DIM, 0)
    patches = patches.assign_coords({
        "patch_condition": (PATCH_DIM, np.full(k, condition, dtype=object).astype(str)),
        **{PATCH_PREFIX + name: (PATCH_DIM, np.full(k, value)) for name, value in sweep.items()},
    }).set_coords([c for c in PATCH_LABELS if c in patches.data_vars])
    return tokens, runs, patches


def _with_derived_labels(ds: xr.Dataset, where: str) -> xr.Dataset:
    """The labels a format-3 store does not hold per row, from its run rows: each token's
    `sample` and `position` within it (`run_sample`, `run_tokens`), the same per vision-tower row
    (`run_patches`); `modality` from its int8 codes, and the per-run text labels unpacked from
    RUN_TEXT. Labels a group holds as arrays (a format-2 store's) are left as they are."""
    if "run_sample" not in ds:
        return ds
    samples = ds["run_sample"].values
    for dim, count, prefix in (("token", "run_tokens", ""), (PATCH_DIM, "run_patches", PATCH_PREFIX)):
        if count not in ds or prefix + "sample" in ds:
            continue
        counts = np.asarray(ds[count].values, dtype=np.int64)
        if counts.sum() != ds.sizes.get(dim, 0):
            raise StoreError(f"{where}: its run rows count {counts.sum()} {ROW_NAMES.get(dim, dim)} but it holds "
                             f"{ds.sizes.get(dim, 0)}", hint="run `workbench verify` on the store")
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        ds = ds.assign({prefix + "sample": (dim, np.repeat(samples, counts)),
                        prefix + "position": (dim, np.arange(len(starts), dtype=np.int64) - starts)})
    if "modality" in ds and ds["modality"].dtype.kind in "iu":  # int8 codes (`_modality_codes`)
        ds["modality"] = ("token", np.array(MODALITIES, dtype=np.dtypes.StringDType())[ds["modality"].values])
    if GEOMETRY in ds:  # each token's place in its image, one column per label (ints: the first four)
        packed = ds[GEOMETRY]
        ds = ds.drop_vars(GEOMETRY).assign({
            name: ("token", packed[:, i].data.astype(np.int32 if i < 4 else np.float32))
            for i, name in enumerate(GEOMETRY_LABELS)})
    if RUN_TEXT in ds:
        # "" (zarr's fill value): a run stored before its condition's first text label
        records = [json.loads(str(text)) if str(text) else {} for text in ds[RUN_TEXT].values]
        names = [name for name in RUN_TEXT_LABELS if any(name in r for r in records)]
        ds = ds.drop_vars(RUN_TEXT).assign({name: ("run", np.array([r.get(name, "") for r in records],
                                                                     dtype=np.dtypes.StringDType()))
                                            for name in names})
    return ds


def _label_index(ds: xr.Dataset, dim: str, levels: list[str], index: bool = True) -> xr.Dataset:
    """Load the labels of `dim` (small, 1-D: the index and groupby need values) and, with
    `index`, build a MultiIndex over them, so `.sel` takes several at once (zarr cannot store a
    MultiIndex, so it is rebuilt on every open)."""
    labels = [c for c, v in ds.coords.items() if v.dims == (dim,)]
    for label in labels:
        ds[label] = ds[label].load()
    levels = [c for c in levels if c in ds.coords]
    indexes: dict[Hashable, Sequence[Hashable]] = {dim: levels}  # mypy takes a bare dict for the Hashable case
    return ds.set_index(indexes) if levels and index else ds


def _model_groups(root: zarr.Group) -> list[tuple[str, zarr.Group]]:
    return sorted(root.groups())


def list_models(path: str | Path, snapshot: str | None = None) -> list[str]:
    with _reading(location(path)):
        root = _root_of(*_read_session(location(path), snapshot))
        return [str(g.attrs.get("model_id", name)) for name, g in _model_groups(root)]


def _sweep_label(value: Any) -> float | str:
    """A sweep value as a label: a number as float; a word (a kv_swap part set) as itself."""
    return value if isinstance(value, str) else float(value)


def _concat(parts: list[xr.Dataset], dim: str, fill: dict[str, str]) -> xr.Dataset:
    # a condition without a sweep variable gets NaN there (baseline has no alpha), or "" where
    # the variable's values are words (parts=keys)
    words = {c for part in parts for c in fill if c in part.coords and part[c].dtype.kind in "UOT"}
    for i, part in enumerate(parts):
        size = part.sizes.get(dim, 0)
        parts[i] = part.assign_coords({c: (dim, np.full(size, "" if c in words else np.nan)) for c in fill
                                       if c not in part.coords})
    return xr.concat(parts, dim=dim, data_vars="minimal", coords="minimal", compat="override", join="outer")


def _open_model(store: Any, root: zarr.Group, key: str, index: bool = True) -> xr.Dataset:
    model_group = group_at(root, key)
    token_parts: list[xr.Dataset] = []
    run_parts: list[xr.Dataset] = []
    patch_parts: list[xr.Dataset] = []
    sweep_vars: list[str] = []
    interventions: dict[str, list[str]] = {}   # each condition's interventions, as the run recorded them (repr)
    for condition, group in sorted(model_group.groups()):
        attrs: dict[str, Any] = dict(group.attrs)
        interventions[condition] = [str(x) for x in json_list(attrs.get("interventions"))]
        sweep_vars += [name for name in json_dict(attrs.get("sweep")) if name not in sweep_vars]
        tokens, runs, patches = _open_condition(store, key, condition, attrs)
        token_parts.append(tokens)
        run_parts.append(runs)
        patch_parts.append(patches)
    if not token_parts:
        return xr.Dataset(attrs=dict(model_group.attrs))
    tokens = _concat(token_parts, "token", {v: v for v in sweep_vars})
    # a run's text labels where only some conditions have them (an attribution scan's runs generate no text): ""
    texts = {name: name for name in RUN_TEXT_LABELS if any(name in part.coords for part in run_parts)}
    runs = _concat(run_parts, "run", {**{RUN_PREFIX + v: v for v in sweep_vars}, **texts})
    tokens = _label_index(tokens, "token", ["condition", *sweep_vars, "sample", "position", "modality", "token_id"], index)
    runs = _label_index(runs, "run", ["run_condition", *(RUN_PREFIX + v for v in sweep_vars), "run_sample"], index)
    parts = [tokens, runs]
    if any(p.sizes.get(PATCH_DIM, 0) for p in patch_parts):
        patches = _concat([p for p in patch_parts if p.sizes.get(PATCH_DIM, 0)], PATCH_DIM,
                          {PATCH_PREFIX + v: v for v in sweep_vars})
        parts.append(_label_index(patches, PATCH_DIM, ["patch_condition", *(PATCH_PREFIX + v for v in sweep_vars),
                                                     *PATCH_LABELS], index))
    ds = xr.merge(parts, compat="override", join="outer")
    for variable in ds.variables.values():  # the source arrays' chunking says nothing of the concatenation
        variable.encoding = {}
    # None has no netCDF/zarr attribute form (a local model's revision): such attrs are left out
    attrs = {**dict(model_group.attrs), "provenance": json.dumps(root.attrs.get("provenance", [])),
             "interventions": json.dumps(interventions)}
    ds.attrs = {k: v for k, v in attrs.items() if v is not None}
    return ds


@overload
def open_store(path: str | Path, model: str, *, snapshot: str | None = None, index: bool = True) -> xr.Dataset: ...
@overload
def open_store(path: str | Path, model: None = None, *, snapshot: str | None = None,
               index: bool = True) -> xr.DataTree: ...
@overload
def open_store(path: str | Path, model: str | None = None, *, snapshot: str | None = None,
               index: bool = True) -> xr.DataTree | xr.Dataset: ...


def open_store(path: str | Path, model: str | None = None, *, snapshot: str | None = None,
               index: bool = True) -> xr.DataTree | xr.Dataset:
    """Open a store for reading, at its last commit (or at `snapshot`: a tag such as `run-1`, or a
    snapshot id from `store_history`).

    Without `model`: an `xarray.DataTree` with one node per model (named by `model_key`, the
    model id in the node's attrs). With `model` (the id exactly as the spec gives it): that model's
    Dataset across all its conditions, with `hidden (token, layer, dim)` and the token labels
    `condition`, sweep values (e.g. `alpha`), `sample`, `position`, `modality`, `token_id`
    indexed together so `ds.sel(condition="baseline", modality="vision", layer=0)` works.
    Arrays are lazy (dask) and read from that one snapshot, whatever a writer commits meanwhile.

    `index=False` leaves the labels as plain coordinates (no MultiIndex): then `groupby` over
    several labels, `query`, `to_netcdf` and `to_zarr` work as on any Dataset (select with
    `ds.where(...)` or `ds.isel(token=mask)` instead of `.sel`)."""
    with _reading(location(path)):
        return _open(location(path), model, snapshot, index)


def _open(path: Path | ObjectStore, model: str | None, snapshot: str | None, index: bool = True) -> xr.DataTree | xr.Dataset:
    repo, session, store = _announced_session(path, snapshot)
    root = _root_of(repo, session, store)
    if model is not None:
        key = model_key(model)
        if key not in root:
            held = ", ".join(str(g.attrs.get("model_id", k)) for k, g in _model_groups(root)) or "no model yet"
            raise StoreError(f"model {model!r} is not in store {path}; it holds: {held}")
        return _open_model(store, root, key, index)
    children = {key: xr.DataTree(_open_model(store, root, key, index)) for key, _ in _model_groups(root)}
    tree = xr.DataTree(children=children)
    tree.attrs = {k: (json.dumps(v) if k == "provenance" else v) for k, v in root.attrs.items()}
    return tree


def store_history(path: str | Path) -> list[dict[str, Any]]:
    """Every snapshot of the store's branch, and every tagged one (a run's end drops the others from
    the branch's history), newest first: id, time, message, tags."""
    repo, _ = _read_session(location(path))
    tags: dict[str, list[str]] = {}
    for tag in repo.list_tags():
        tags.setdefault(repo.lookup_tag(tag), []).append(tag)
    snapshots = {s.id: s for s in repo.ancestry(branch=BRANCH)}
    for snapshot_id in set(tags) - set(snapshots):
        snapshots[snapshot_id] = repo.lookup_snapshot(snapshot_id)
    return [{"snapshot": s.id, "time": s.written_at.isoformat(timespec="seconds"), "message": s.message,
             "tags": sorted(tags.get(s.id, []))} for s in sorted(snapshots.values(), key=lambda s: s.written_at, reverse=True)]


def store_info(path: str | Path, snapshot: str | None = None) -> dict[str, Any]:
    """What a store holds: per model and condition, samples, tokens, variables, layers and
    identity, read from its last commit (or `snapshot`)."""
    with _reading(location(path)):
        return _info(location(path), snapshot)


def _info(path: Path | ObjectStore, snapshot: str | None) -> dict[str, Any]:
    repo, session, store = _announced_session(path, snapshot)
    root = _root_of(repo, session, store)
    info: dict[str, Any] = {"path": str(path), "models": {}, "runs": len(json_list(root.attrs.get("provenance"))),
                            "snapshot": session.snapshot_id, "bytes": _disk_bytes(path)}
    for key, model in _model_groups(root):
        conditions = {}
        for condition, group in sorted(model.groups()):
            n_runs = array_at(group, "run_sample").shape[0] if "run_sample" in group else 0
            arrays = dict(group.arrays())
            n_tokens = _rows_along(arrays, "token")
            variables = {
                name: {"dims": list(dimension_names(a)), "shape": list(a.shape)}
                for name, a in sorted(arrays.items())
                # labels, per-run records and coordinate arrays (named after their own dim) are not data
                if name not in (*RUN_LABELS, *TOKEN_LABELS, GEOMETRY, *PATCH_LABELS, *TEXT_LABELS, RUN_TEXT) and dimension_names(a) != (name,)
            }
            conditions[condition] = {
                "samples": int(n_runs),
                "tokens": int(n_tokens),
                "variables": variables,
                "layers": [int(x) for x in read_all(array_at(group, "layer"))] if "layer" in group else [],
                "nonfinite_runs": int((read_all(array_at(group, "nonfinite")) > 0).sum()) if "nonfinite" in group else 0,
                "sweep": json_dict(group.attrs.get("sweep")),
                "identity": json_dict(group.attrs.get("identity")),
            }
        info["models"][model.attrs.get("model_id", key)] = {"key": key, "conditions": conditions, **{
            k: v for k, v in model.attrs.items() if k in ("family", "n_layers", "hidden_size", "revision", "dtype", "device")
        }}
    return info


def _disk_bytes(path: Path | ObjectStore) -> int | None:
    if isinstance(path, ObjectStore):
        return None  # not listed: the bucket's own tools tell its size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
