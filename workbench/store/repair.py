"""A store whose repository metadata is damaged, diagnosed and brought back to its newest intact
snapshot: its branch pointer deleted, truncated or garbled, its config unparseable, or the
snapshot its branch names unreadable.

Every result lives in a snapshot, and a snapshot is found through a ref: the branch `main`, the
run tags `run-<n>`. icechunk 1.1 opens a repository only through `main`: `Repository.open`
fails with "the repository doesn't exist" when `refs/branch.main/ref.json` is missing and with
"cannot serialize ref json" when it does not parse, and `Repository.create` works only in an
empty prefix (icechunk 1.1.21, `icechunk/src/repository.rs`: `open`, `create`). So a repair
1. deletes the damaged file whole (the pointer, or `config.yaml`): its bytes name nothing that
   reads back;
2. puts in the pointer's place the pointer of a fresh repository, written by icechunk itself (it
   names the first, empty snapshot, whose id every icechunk 1.x repository shares);
3. opens the store and moves the branch to the newest intact snapshot with `reset_branch`, and
   writes the config back with `save_config`.
Which snapshots are intact is read through icechunk's API (`list_tags`, `lookup_tag`,
`lookup_snapshot`, `readonly_session`) on a *view*: a scratch folder holding the store's refs,
snapshots and manifests (links for a local store, copies for an object store) and a fresh
pointer, so that `verify` writes nothing to the store. The candidates are the tagged snapshots
and every stored snapshot file (by name: a killed run's last commits carry no tag yet).
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import zarr

from ..errors import StoreError, StorePathError
from .objects import ObjectStore, _short, location
from .paths import _NoLock, _WriterLock, check_store_path
from .repository import (
    BRANCH, _condition_groups, _icechunk, _repo_config, _root_of, _snapshot_problem, _storage, is_store,
)

if TYPE_CHECKING:
    import icechunk

# where icechunk 1.1 keeps a repository's branch pointer and config (icechunk/src/refs.rs,
# icechunk/src/repository.rs): named in messages, and deleted or replaced only as whole files
POINTER = f"refs/branch.{BRANCH}/ref.json"
CONFIG = "config.yaml"
# the folders a view needs: snapshot metadata (attrs, array metadata) lives in these two
_METADATA = ("snapshots", "manifests")


@dataclass(frozen=True)
class IntactSnapshot:
    """A snapshot whose metadata reads back: its groups, attrs and array metadata."""

    id: str
    written_at: _dt.datetime
    message: str
    tags: tuple[str, ...]
    results: int  # (condition, sample) results it holds: the rows of its run tables

    def describe(self) -> str:
        tags = ", ".join(self.tags) or "no tag"
        return f"{self.id} of {self.written_at:%Y-%m-%d %H:%M:%S} UTC ({tags}; {self.results} result(s))"


@dataclass
class Diagnosis:
    """What is wrong with a store's repository metadata, and what is left to restore."""

    kind: str  # "branch pointer", "repository config" or "snapshot"
    problem: str
    damaged: list[str] = field(default_factory=list)  # files the repair deletes, relative to the store
    replace_pointer: bool = False  # the pointer is missing or damaged: a fresh one goes in its place
    intact: list[IntactSnapshot] = field(default_factory=list)  # newest first
    stored: int = 0  # snapshot files the store holds

    @property
    def target(self) -> IntactSnapshot | None:
        return self.intact[0] if self.intact else None

    def report(self, path: Path | ObjectStore) -> list[str]:
        """The lines `workbench verify` prints under the problem: what is left, what to do."""
        lines = ["intact snapshots, newest first:", *(f"  {s.describe()}" for s in self.intact)]
        if self.kind == "repository config":
            return lines + [f"to repair: `workbench verify {path} --repair` writes {CONFIG} anew, the branch kept "
                            "where it is; rerunning the spec does the same by itself"]
        if self.target is None:
            return _nothing_left(path, self.stored)
        lines.append(f"to repair: `workbench verify {path} --repair` points the branch at {self.target.id}; "
                     "rerunning the spec does the same by itself, then captures only what that snapshot lacks")
        return lines


def _nothing_left(path: Path | ObjectStore, stored: int) -> list[str]:
    delete = f"aws s3 rm --recursive {path}" if isinstance(path, ObjectStore) else f"rm -r {path}"
    return [f"no intact snapshot is left: none of the {stored} snapshot file(s) under {path}/snapshots holds "
            "results and reads back, so no stored result can be located (chunks/ holds values, but only a "
            "snapshot says where they belong)",
            f"to recover: delete the store (`{delete}`) and rerun its spec into the same path; keep a copy "
            "first only if you want the damaged files examined"]


def nothing_left_error(path: Path | ObjectStore, diagnosis: Diagnosis) -> StoreError:
    first, second = _nothing_left(path, diagnosis.stored)
    return StoreError(f"store {path}: {diagnosis.problem}; {first}", hint=second.removeprefix("to recover: "))


# -- the store's files, local or on object storage ------------------------------------------------


class _Files(Protocol):
    def names(self, folder: str) -> list[str]: ...
    def delete(self, name: str) -> None: ...
    def write(self, name: str, data: bytes) -> None: ...
    def fill_view(self, view: Path) -> None: ...


class _LocalFiles:
    def __init__(self, root: Path):
        self.root = root

    def names(self, folder: str) -> list[str]:
        where = self.root / folder
        return sorted(p.name for p in where.iterdir()) if where.is_dir() else []

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)

    def write(self, name: str, data: bytes) -> None:
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(data)
        os.replace(partial, target)  # a pointer appears whole or not at all

    def fill_view(self, view: Path) -> None:
        for folder in _METADATA:
            if (self.root / folder).is_dir():
                (view / folder).symlink_to(self.root / folder)
        for ref in self.names("refs"):
            if ref != f"branch.{BRANCH}":
                (view / "refs" / ref).symlink_to(self.root / "refs" / ref)


class _S3Files:
    """The store's objects through boto3 (endpoint and credentials as `ObjectStore` reads them)."""

    def __init__(self, store: ObjectStore):
        try:
            import boto3
        except ImportError:
            raise StoreError(f"repairing the metadata of {store} needs boto3",
                             hint="pip install 'workbench[s3]'") from None
        settings = store.settings()
        self.bucket, self.prefix = store.bucket, store.prefix
        self.client = boto3.client(
            "s3", endpoint_url=settings.get("endpoint_url"), region_name=settings.get("region"),
            aws_access_key_id=settings.get("access_key_id"), aws_secret_access_key=settings.get("secret_access_key"),
            aws_session_token=settings.get("session_token"))

    def _keys(self, folder: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/{folder}/")
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def names(self, folder: str) -> list[str]:
        start = len(f"{self.prefix}/{folder}/")
        return sorted({key[start:].split("/")[0] for key in self._keys(folder)})

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{name}")

    def write(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{name}", Body=data)

    def fill_view(self, view: Path) -> None:
        for folder in (*_METADATA, "refs"):
            for key in self._keys(folder):
                name = key[len(self.prefix) + 1:]
                if name.startswith(f"refs/branch.{BRANCH}/"):
                    continue
                (view / name).parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, key, str(view / name))


def _files(path: Path | ObjectStore) -> _Files:
    return _S3Files(path) if isinstance(path, ObjectStore) else _LocalFiles(path)


@contextmanager
def _fresh_pointer() -> Iterator[tuple[bytes, str]]:
    """The branch pointer of a new, empty repository (written by icechunk) and the snapshot it names."""
    ic = _icechunk()
    with tempfile.TemporaryDirectory(prefix="workbench-pointer-") as scratch:
        repo = ic.Repository.create(ic.local_filesystem_storage(scratch))
        yield (Path(scratch) / POINTER).read_bytes(), repo.lookup_branch(BRANCH)


@contextmanager
def _view(files: _Files) -> Iterator[Any]:
    """An icechunk repository over the store's refs, snapshots and manifests, with a fresh
    pointer, opened read-only in a scratch folder (chunks are not there: only metadata is read)."""
    ic = _icechunk()
    with tempfile.TemporaryDirectory(prefix="workbench-view-") as scratch, _fresh_pointer() as (pointer, _):
        view = Path(scratch)
        (view / "refs").mkdir()
        files.fill_view(view)
        _LocalFiles(view).write(POINTER, pointer)
        yield ic.Repository.open(ic.local_filesystem_storage(str(view)), config=_repo_config())


# -- diagnosis -------------------------------------------------------------------------------------


def _results(repo: icechunk.Repository, snapshot_id: str) -> int | None:
    """How many results a snapshot holds, or None if its metadata does not read back."""
    try:
        session = repo.readonly_session(snapshot_id=snapshot_id)
        if _snapshot_problem(repo, session) is not None:
            return None
        rows = [group.get("run_sample") for _, _, group in _condition_groups(_root_of(repo, session))]
        return sum(int(array.shape[0]) for array in rows if isinstance(array, zarr.Array))
    except Exception:  # icechunk's own errors for a snapshot or manifest that does not read back
        return None


def _tagged(repo: icechunk.Repository) -> dict[str, list[str]]:
    """snapshot id -> the tags that name it."""
    tags: dict[str, list[str]] = {}
    for tag in sorted(repo.list_tags()):
        try:
            tags.setdefault(repo.lookup_tag(tag), []).append(tag)
        except Exception:  # a tag whose ref does not parse names nothing
            continue
    return tags


def _intact(repo: icechunk.Repository, stored: list[str]) -> list[IntactSnapshot]:
    """Every tagged snapshot that reads back, and the newest stored one that does, newest first.
    The repository's first snapshot (empty, no parent) is not counted: restoring it restores nothing."""
    tags = _tagged(repo)
    infos = []
    for snapshot_id in sorted(set(stored) | set(tags)):
        try:
            info = repo.lookup_snapshot(snapshot_id)
        except Exception:  # a snapshot file that does not parse
            continue
        if info.parent_id is not None:
            infos.append(info)
    found: list[IntactSnapshot] = []
    for info in sorted(infos, key=lambda i: i.written_at, reverse=True):
        if found and info.id not in tags:
            continue  # older untagged snapshots: the per-result history, not worth listing
        results = _results(repo, info.id)
        if results is not None:
            found.append(IntactSnapshot(info.id, info.written_at, info.message, tuple(tags.get(info.id, [])), results))
    return found


def _metadata_problems(storage: Any) -> tuple[list[str], list[str], bool]:
    """(problems, damaged files, pointer to replace) of the config and the branch pointer."""
    ic = _icechunk()
    problems, damaged, replace = [], [], False
    try:
        ic.Repository.fetch_config(storage)
    except Exception as err:  # icechunk: "error in config deserialization"
        problems.append(f"the repository config {CONFIG} does not parse ({_short(err)})")
        damaged.append(CONFIG)
    try:
        present = ic.Repository.exists(storage)
    except Exception as err:  # icechunk: "cannot serialize ref json"
        problems.append(f"the branch pointer {POINTER} does not parse ({_short(err)})")
        damaged.append(POINTER)
        replace = True
    else:
        if not present:
            problems.append(f"the branch pointer {POINTER} is missing")
            replace = True
    return problems, damaged, replace


def _branch_problem(repo: icechunk.Repository) -> str | None:
    """Why the branch's snapshot is not the store's state: it does not read back, or it is the
    empty first snapshot while run tags name later ones (a repair stopped halfway)."""
    problem = _snapshot_problem(repo)
    tip = repo.lookup_branch(BRANCH)
    if problem is not None:
        return f"the branch's snapshot {tip} does not read back ({problem})"
    if repo.lookup_snapshot(tip).parent_id is None and set(_tagged(repo)) - {tip}:
        return (f"the branch pointer {POINTER} names the repository's first, empty snapshot, "
                "while its run tags name later ones")
    return None


def diagnose(path: Path | ObjectStore) -> Diagnosis | None:
    """What is wrong with a store's config, branch pointer or branch snapshot, with the intact
    snapshots left; None if they are all sound (chunks are `verify_store`'s to check)."""
    storage = _storage(path)
    problems, damaged, replace = _metadata_problems(storage)
    if problems:
        files = _files(path)
        stored = files.names("snapshots")
        with _view(files) as repo:
            intact = _intact(repo, stored)
        kind = "branch pointer" if replace else "repository config"
        return Diagnosis(kind, "; ".join(problems), damaged, replace, intact, len(stored))
    repo = _icechunk().Repository.open(storage, config=_repo_config())
    problem = _branch_problem(repo)
    if problem is None:
        return None
    stored = _files(path).names("snapshots")
    return Diagnosis("snapshot", problem, [], False, _intact(repo, stored), len(stored))


def repair(path: Path | ObjectStore) -> list[str]:
    """Bring a store whose metadata is damaged back to its newest intact snapshot (see the module
    docstring); what was done, in words ([] if nothing was wrong). A StoreError naming what to
    delete when no intact snapshot is left (nothing is changed then). The caller holds the
    store's writer lock (a local store)."""
    diagnosis = diagnose(path)
    if diagnosis is None:
        return []
    files = _files(path)
    ic = _icechunk()
    if CONFIG in diagnosis.damaged and not diagnosis.replace_pointer:  # the branch is kept where it is
        files.delete(CONFIG)
        ic.Repository.open(_storage(path), config=_repo_config()).save_config()
        return [f"{diagnosis.problem}; written anew", *repair(path)]
    target = diagnosis.target
    if target is None:
        raise nothing_left_error(path, diagnosis)
    for name in diagnosis.damaged:
        files.delete(name)
    with _fresh_pointer() as (pointer, first):
        if diagnosis.replace_pointer:
            files.write(POINTER, pointer)
        repo = ic.Repository.open(_storage(path), config=_repo_config())
        if CONFIG in diagnosis.damaged:
            repo.save_config()
        try:
            # only from the pointer put there: a concurrent repair (another shard) may have moved it
            repo.reset_branch(BRANCH, target.id, from_snapshot_id=first if diagnosis.replace_pointer else None)
        except ic.IcechunkError:
            if repo.lookup_branch(BRANCH) != target.id:
                raise
    return [f"{diagnosis.problem}; the branch now points at the newest intact snapshot, {target.describe()}"]


def repair_store(path: str | Path | ObjectStore) -> list[str]:
    """`workbench verify STORE --repair`: `repair` under the store's writer lock (a local store)."""
    path = location(path)
    if not is_store(path):
        raise StorePathError(f"no workbench store at {path}")
    real = check_store_path(path)
    lock = _NoLock() if isinstance(real, ObjectStore) else _WriterLock(real, Path(str(path)))
    try:
        return repair(real)
    finally:
        lock.release()
