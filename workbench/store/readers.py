"""The end of a run's compaction, and the readers it must not break.

Every commit rewrites the partial last chunk of each array it appends to, so a run leaves
superseded chunk versions behind. The writer deletes them when the run ends (`compact`) through
icechunk's public administration API (icechunk 1.1 python/icechunk/repository.py):
`Repository.expire_snapshots(older_than)` drops the snapshots older than a cutoff from the history
(tags and branch tips stay), and `Repository.garbage_collect(delete_object_older_than)` deletes
the objects no branch or tag reaches any more that are older than the cutoff.

A reader holding an older snapshot of a local store would lose chunks under it. So such a reader
announces the snapshot it reads (`announced_reader`): one file per open reader in
`<store>.readers/`, holding the snapshot id, with an exclusive flock held on it for as long as the
reader's zarr store lives (the OS drops the lock when the process ends, so a crashed reader's file
is seen as stale and removed). The compaction's cutoff is the commit time of the oldest announced
snapshot: that snapshot and every later one stay in the history, with every chunk they reference.
Between a reader's look at the branch and its announcement the writer must not compact: a gate
file, held shared by a reader while it opens its session and exclusively by the compaction.
A reader that does not announce itself (another tool opening the repository) is kept safe only
by the grace `WORKBENCH_COMPACT_GRACE_S` gives (seconds; 0 unless set), which also keeps a run's
per-commit history that long (`workbench info --history`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import secrets
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, TextIO

from .. import verified

if TYPE_CHECKING:
    import icechunk



def compact_grace() -> dt.timedelta:
    """The age a snapshot must have before compaction drops it (read at each compaction)."""
    return dt.timedelta(seconds=float(os.environ.get("WORKBENCH_COMPACT_GRACE_S", 0)))


def readers_dir(store: Path) -> Path:
    """Beside the store, as its lock file is: icechunk owns what lies inside it."""
    return store.with_name(store.name + ".readers")


@contextlib.contextmanager
def _gate(store: Path, mode: int) -> Iterator[bool]:
    """The gate held in `mode` (fcntl.LOCK_SH or LOCK_EX); False where its folder cannot be made
    (a read-only parent): then no reader of this store can announce itself."""
    try:
        folder = readers_dir(store)
        folder.mkdir(exist_ok=True)
        gate = open(folder / "gate", "a+")
    except OSError:
        yield False
        return
    try:
        fcntl.flock(gate, mode)
        yield True
    finally:
        gate.close()  # releases the lock


class _Announcement:
    """One reader's file, locked while the reader lives."""

    def __init__(self, store: Path):
        self.path = readers_dir(store) / f"{os.getpid()}-{secrets.token_hex(6)}"
        self.file: TextIO | None = open(self.path, "w")
        fcntl.flock(self.file, fcntl.LOCK_EX)

    def hold(self, snapshot_id: str, reader: Any) -> None:
        """Name the snapshot, and keep the announcement until `reader` is garbage collected."""
        assert self.file is not None
        self.file.write(snapshot_id)
        self.file.flush()
        weakref.finalize(reader, _withdraw, self.path, self.file)
        self.file = None

    def drop(self) -> None:
        if self.file is not None:
            _withdraw(self.path, self.file)


def _withdraw(path: Path, file: TextIO) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
    file.close()


@contextlib.contextmanager
def announced_reader(store: Path) -> Iterator[Callable[[str, Any], None]]:
    """While a reader of local store `store` opens its session: yields `hold(snapshot_id,
    reader)`, to call once the session is open, which announces the snapshot until `reader`
    (the zarr store the reads go through) is garbage collected. Where the store's folder
    cannot be written to, nothing is announced (and that process cannot compact it either)."""
    with _gate(store, fcntl.LOCK_SH) as open_gate:
        if not open_gate:
            yield lambda snapshot_id, reader: None
            return
        try:
            announcement = _Announcement(store)
        except OSError:
            yield lambda snapshot_id, reader: None
            return
        try:
            yield announcement.hold
        finally:
            announcement.drop()  # not held (an error opening the session): withdrawn


def _announced(store: Path) -> set[str]:
    """The snapshot ids live readers announce; a dead reader's file (its lock free) is removed."""
    out = set()
    for path in readers_dir(store).glob("*-*"):
        try:
            with open(path) as file:
                try:
                    fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # held: a live reader
                    out.add(file.read().strip())
                    continue
            path.unlink()
        except OSError:  # withdrawn meanwhile
            continue
    return {s for s in out if s}


def compact(repo: icechunk.Repository, store: Path) -> dict[str, int]:
    """Expire the snapshots older than the oldest one a live reader announces (or than now), less
    `compact_grace()`, and delete what only they referenced. Returns what was deleted, counted."""
    with _gate(store, fcntl.LOCK_EX):
        cutoff = dt.datetime.now(dt.timezone.utc) - compact_grace()
        for snapshot_id in _announced(store):
            with contextlib.suppress(Exception):  # a snapshot already gone pins nothing
                cutoff = min(cutoff, repo.lookup_snapshot(snapshot_id).written_at)
        repo.expire_snapshots(older_than=cutoff)
        summary: list[Any] = []
        verified.collect(store, lambda: summary.append(repo.garbage_collect(cutoff)))
    done = summary[0] if summary else None
    return {name: int(getattr(done, name, 0) or 0) for name in ("chunks_deleted", "bytes_deleted")}
