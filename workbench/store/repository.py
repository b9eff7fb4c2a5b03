"""The icechunk repository under a store, and its snapshots: opening it (local or s3://), the
branch and run tags, a snapshot's root group and whether its metadata reads back."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import zarr

from ..errors import StoreError
from ..names import RESERVED_NAMES
from .objects import ObjectStore, _short, location

if TYPE_CHECKING:
    import icechunk


# 3: no per-token sample/position arrays (derived from the run rows), per-run text labels in one array
STORE_FORMAT = 3
BRANCH = "main"
RUN_TAG = "run-{}"
# the message of the snapshot a local store's run ends with: its last snapshot's copy (`finish_run`)
RUN_END = "{} ended: the branch on a copy of its last snapshot"


def model_key(model_id: str) -> str:
    """Group name of a model: HF ids contain '/', which zarr and DataTree reserve."""
    key = model_id.strip("/").replace("/", "--")
    key = re.sub(r"[^\w.=,+-]", "_", key)
    return f"_{key}" if key in RESERVED_NAMES or key.startswith("_") else key


def _icechunk() -> Any:
    import icechunk

    if not getattr(_icechunk, "quiet", False):
        # its local storage warns on every open that it is not for concurrent writers: one writer
        # per store is what the lock enforces
        icechunk.set_logs_filter(os.environ.get("ICECHUNK_LOG", "error"))
        _icechunk.quiet = True  # type: ignore[attr-defined]
    return icechunk


def _storage(path: Path | ObjectStore) -> Any:
    if isinstance(path, ObjectStore):
        _icechunk()  # its logs filtered, as for a local store
        return path.storage()
    return _icechunk().local_filesystem_storage(str(path))


def is_store(path: str | Path | ObjectStore) -> bool:
    """Whether `path` holds an icechunk repository (a workbench store or a foreign one)."""
    path = location(path)
    if isinstance(path, ObjectStore):
        return path.exists()
    return path.is_dir() and (path / "refs").is_dir() and (path / "snapshots").is_dir()


def _repo_config() -> Any:
    ic = _icechunk()
    # every chunk in its own file (none inlined into manifests), so each carries its CRC-32C and
    # damage stays local to a chunk
    return ic.RepositoryConfig(inline_chunk_threshold_bytes=0)


# zarr 3.1.6 types a group's member as `Array | Group` and an array's read as any array-like or
# scalar (zarr/core/group.py `Group.__getitem__`, zarr/core/array.py `Array.__getitem__`): these
# say which one the store's layout holds there


def group_at(group: zarr.Group, path: str) -> zarr.Group:
    """The group at `path` under `group` (a StoreError if an array is there)."""
    node = group[path]
    if not isinstance(node, zarr.Group):
        raise StoreError(f"{group.path}/{path} is an array where the store holds a group")
    return node


def array_at(group: zarr.Group, path: str) -> zarr.Array:
    """The array at `path` under `group` (a StoreError if a group is there)."""
    node = group[path]
    if not isinstance(node, zarr.Array):
        raise StoreError(f"{group.path}/{path} is a group where the store holds an array")
    return node


def read_all(array: zarr.Array) -> np.ndarray:
    """Every value of an array (the store's arrays have at least one dim: zarr reads a numpy array)."""
    return np.asarray(array[:])


def dimension_names(array: zarr.Array) -> tuple[str | None, ...]:
    """An array's dim names (zarr v3 metadata: the store's format; none for a v2 array)."""
    metadata = array.metadata
    return tuple(metadata.dimension_names or ()) if metadata.zarr_format == 3 else ()


def json_list(value: object) -> list[Any]:
    """A JSON attribute that holds a list (e.g. the root's provenance records), or [] if unset."""
    return list(value) if isinstance(value, (list, tuple)) else []


def json_dict(value: object) -> dict[str, Any]:
    """A JSON attribute that holds an object (e.g. a condition's sweep values), or {} if unset."""
    return dict(value) if isinstance(value, Mapping) else {}


def _open_repo(path: Path | ObjectStore) -> icechunk.Repository:
    ic = _icechunk()
    try:
        return ic.Repository.open(_storage(path), config=_repo_config())
    except Exception as err:  # icechunk raises its own error types for a damaged repository
        raise StoreError(f"cannot open store {path}: {_short(err)}",
                         hint=f"run `workbench verify {path}` to see what is damaged") from None


def _root_of(repo: icechunk.Repository, session: icechunk.Session, store: Any = None) -> zarr.Group:
    """The root group of a snapshot (through `store`, one of the session's stores, if given); an
    empty one for a repository created but never committed to (a run killed before its first
    result). A later snapshot without a root is damage."""
    try:
        return zarr.open_group(session.store if store is None else store, mode="r", zarr_format=3)
    except zarr.errors.GroupNotFoundError:
        try:
            first = len(list(repo.ancestry(snapshot_id=session.snapshot_id))) == 1
        except Exception as err:
            raise StoreError(f"snapshot {session.snapshot_id} is unreadable: {_short(err)}") from None
        if not first:
            raise StoreError(f"snapshot {session.snapshot_id} has no root group: its metadata is damaged") from None
        return zarr.open_group(zarr.storage.MemoryStore(), mode="w", zarr_format=3)


def _snapshot_problem(repo: icechunk.Repository, session: icechunk.Session | None = None) -> str | None:
    """Why a snapshot's metadata (the branch's, by default) does not read back, or None: its root,
    every group and its attrs, every array's metadata."""
    try:
        session = session or repo.readonly_session(branch=BRANCH)
        root = _root_of(repo, session)
        dict(root.attrs)
        for _, model in root.groups():
            dict(model.attrs)
            for _, group in model.groups():
                dict(group.attrs)
                for _, array in group.arrays():
                    array.metadata
        return None
    except Exception as err:
        return _short(err)


def _condition_groups(root: zarr.Group) -> list[tuple[str, str, zarr.Group]]:
    """(model key, condition, group) of every condition group, in order."""
    return [(k, c, g) for k, m in sorted(root.groups()) for c, g in sorted(m.groups())]
