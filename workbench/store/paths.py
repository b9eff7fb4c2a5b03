"""Where a store may be written, and by whom: path checks, the writer lock of a local store,
disk failures in words, and the kill drills' fault points."""

from __future__ import annotations

import errno
import logging
import os
import signal
from pathlib import Path
from typing import Any

import zarr

from ..errors import StoreError, StorePathError
from .objects import ObjectStore, location
from .repository import is_store


def fault_point(name: str) -> None:
    """Fault drills: `WORKBENCH_KILL_AT=<name>:<n>` kills this process with SIGKILL the n-th time
    it reaches point `name`, so tests can interrupt a run at an exact place (after any store
    write, after a commit, mid-trace). Unset, it costs one dictionary lookup."""
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


class StoreBusyError(StoreError):
    """Another process holds the store's writer lock."""


def lock_path(store: Path) -> Path:
    return store.with_name(store.name + ".lock")
_IO_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the file system is read-only",
    errno.EFBIG: "a file exceeds the size limit",
    errno.EACCES: "permission denied",
}
_IO_PATTERNS = {
    "no space left on device": "the disk is full",
    "read-only file system": "the file system is read-only",
    "file too large": "a file exceeds the size limit",
    "quota exceeded": "the disk quota is exhausted",
    "permission denied": "permission denied",
}


def io_failure(err: BaseException) -> str | None:
    """What an OS-level write failure means, in words, or None if `err` is not one."""
    if isinstance(err, OSError) and err.errno in _IO_ERRNOS:
        return _IO_ERRNOS[err.errno]
    text = str(err).lower()
    return next((what for pattern, what in _IO_PATTERNS.items() if pattern in text), None)


class _AbandonedWrites(logging.Filter):
    """After one chunk write failed (disk full, file too large), zarr's other chunk writes of that
    commit fail the same way, and asyncio logs each failure no one awaited, with its traceback,
    when it is collected. The failure is already reported once, in one line (StoreIOError)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith(("Task exception was never retrieved", "Task was destroyed but it is pending"))
                    and "zarr" in text)
_ABANDONED_WRITES = _AbandonedWrites()


class StoreIOError(StoreError):
    """The disk refused a write (full, read-only, file size limit). The store keeps its last commit."""


def check_store_path(path: str | Path | ObjectStore) -> Path | ObjectStore:
    """The real path a store may be written at, or a StorePathError saying why not: a file, a
    directory that is not a workbench store, a path inside another store. An object store
    (s3://) only needs an endpoint that answers."""
    path = location(path)
    if isinstance(path, ObjectStore):
        path.check_reachable()
        return path
    real = Path(os.path.realpath(path))
    if real.exists() and not real.is_dir():
        raise StorePathError(f"store path {path} is a file, not a store",
                             hint="pass a directory path for the store, e.g. --store stores/NAME.zarr")
    for parent in real.parents:
        if is_store(parent) or (parent / "zarr.json").is_file():
            raise StorePathError(f"store path {path} lies inside the store {parent}",
                                 hint="pass a path outside any store, e.g. beside it")
    if real.is_dir() and any(real.iterdir()) and not is_store(real):
        if (real / "zarr.json").is_file():
            raise StorePathError(
                f"{path} is a store in the old format (plain zarr, before transactional commits)",
                hint="write to a new store path; the old store stays readable with workbench 0.1")
        raise StorePathError(f"{path} is a non-empty directory that is not a workbench store; refusing to write into it",
                             hint="pass a new or empty directory path for the store")
    return real


class _WriterLock:
    """An exclusive lock on `<real path>.lock`: one writing process per store. POSIX only; the
    import is local so that reading a store works everywhere."""

    def __init__(self, real: Path, shown: Path | ObjectStore):
        import fcntl

        self._fcntl = fcntl
        try:
            real.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(lock_path(real), "a+")
        except OSError as err:
            meaning = io_failure(err)
            if meaning is None:
                raise
            raise StoreIOError(f"cannot lock store {shown} for writing: {meaning}; nothing was written",
                               hint="fix the file system or pass another --store") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "unknown"
            self._file.close()
            raise StoreBusyError(
                f"store {shown} is being written by another workbench process ({holder})",
                hint="wait for it to finish or pass another --store") from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}")
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
            self._fcntl.flock(self._file, self._fcntl.LOCK_UN)
            self._file.close()


class _NoLock:
    """An object store has no lock: its writers' commits are ordered by icechunk instead."""

    def release(self) -> None:
        pass


class _FaultStore(zarr.storage.WrapperStore):
    """For kill drills only: a fault point after every write the store makes."""

    async def set(self, key: str, value: Any) -> None:
        await super().set(key, value)
        fault_point("store.write")

    async def delete(self, key: str) -> None:
        await super().delete(key)
        fault_point("store.write")
