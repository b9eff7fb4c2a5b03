"""What a local store's writer last read back whole: the snapshot it checked, and the size and
mtime of every chunk and manifest file at the time, and how many rows each array had (with its
icechunk node id). A run's start then reads only the row chunks written since: an array only
grows, rewriting the chunk that held its last row, and one dropped and written again is a new
node. That holds as long as none of the recorded files changed; when one did (damage, or a hand
in the store), or the record is missing or unreadable, it reads everything, as `workbench
verify` always does. (Icechunk's own diff cannot serve: it needs the checked snapshot in the
branch's ancestry, which the compaction at the end of every run rewrites.)

Without it every run's start read every chunk of the store: minutes for the tens of GB a full
sweep holds, paid again by each resume. Icechunk never rewrites a chunk or manifest file in place
(a new version is a new file), so a changed size or mtime means the file was touched from
outside. What this record cannot see is a bit flip that keeps both: `workbench verify` reads
that back.

The record is a JSON file beside the store (`<store>.verified`, like its lock file); a store
moved without it is simply read whole once more.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

# the repository's immutable data files; snapshots are checked by reading the branch's own
WATCHED = ("chunks", "manifests")
SUFFIX = ".verified"


def ledger_path(store: Path) -> Path:
    return store.with_name(store.name + SUFFIX)


def file_stats(store: Path) -> dict[str, tuple[int, int]]:
    """{"chunks/<id>": (size, mtime_ns)} of every data file of the repository at `store`."""
    stats: dict[str, tuple[int, int]] = {}
    for top in WATCHED:
        try:
            entries = os.scandir(store / top)
        except FileNotFoundError:
            continue
        with entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    stats[f"{top}/{entry.name}"] = (st.st_size, st.st_mtime_ns)
    return stats


@dataclass
class Ledger:
    """The snapshot checked (for a reader of the record; the check does not consult it), the data
    files then ({name: (size, mtime_ns)}) and its arrays' extents ({"model/condition/variable":
    (icechunk node id, rows)})."""

    snapshot: str
    files: dict[str, tuple[int, int]]
    arrays: dict[str, tuple[str, int]]

    def changed(self, now: dict[str, tuple[int, int]]) -> list[str]:
        """The recorded files that are gone or differ in size or mtime (new files are not listed:
        they belong to later commits, whose rows the extents cover, or to no snapshot at all)."""
        return [name for name, stat in self.files.items() if now.get(name) != stat]


def load(store: Path) -> Ledger | None:
    """The record beside `store`; None when there is none or it cannot be read (read everything)."""
    try:
        data = json.loads(ledger_path(store).read_text())
        return Ledger(str(data["snapshot"]), {k: (int(v[0]), int(v[1])) for k, v in data["files"].items()},
                      {k: (str(v[0]), int(v[1])) for k, v in data["arrays"].items()})
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def save(store: Path, ledger: Ledger) -> None:
    """Write the record atomically (a killed writer leaves the old one or none, never half)."""
    path = ledger_path(store)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"snapshot": ledger.snapshot, "files": ledger.files, "arrays": ledger.arrays},
                              separators=(",", ":")))
    os.replace(tmp, path)


def collect(store: Path, garbage_collect: Callable[[], Any]) -> None:
    """Run `garbage_collect` (icechunk's, at the end of a run) and drop the files it deleted
    (referenced by no kept snapshot) from the record; every other entry stays as it was checked.
    With no record, the store's files are not listed at all."""
    ledger = load(store)
    if ledger is None:
        garbage_collect()
        return
    before = file_stats(store)
    garbage_collect()
    deleted = before.keys() - file_stats(store).keys()
    if deleted & ledger.files.keys():
        save(store, Ledger(ledger.snapshot, {k: v for k, v in ledger.files.items() if k not in deleted}, ledger.arrays))
