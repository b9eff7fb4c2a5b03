"""Reading a store back to check it: every chunk (CRC-32C, decompression, presence), named by
model, condition, variable, row range and samples; or only the row chunks written since a
recorded check. Damaged metadata (branch pointer, config, snapshot) is `repair`'s."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import zarr

from ..errors import StorePathError
from .objects import ObjectStore, _short, location
from .readers import announced_reader
from .repair import diagnose
from .repository import (
    BRANCH, _condition_groups, _open_repo, _root_of, _snapshot_problem, array_at, dimension_names, is_store, read_all,
)

if TYPE_CHECKING:
    import icechunk


@dataclass
class Damage:
    """One unreadable piece of a store: a chunk (model, condition, variable, rows) or a snapshot."""

    model_key: str
    condition: str
    variable: str
    rows: tuple[int, int] | None
    samples: list[str]
    error: str
    details: list[str] = field(default_factory=list)  # for damaged metadata: what is left, what to do

    def describe(self) -> str:
        if not self.condition:
            return f"{self.variable}: {self.error}"
        where = f"{self.model_key} | {self.condition} | {self.variable}"
        if self.rows is not None:
            dim = "rows"
            where += f" | {dim} {self.rows[0]}:{self.rows[1]}"
        if self.samples:
            shown = ", ".join(self.samples[:3]) + (f" (+{len(self.samples) - 3})" if len(self.samples) > 3 else "")
            where += f" | samples {shown}"
        return f"{where}: {self.error}"


def _row_samples(group: zarr.Group) -> tuple[np.ndarray, list[str]]:
    """(cumulative token ends, sample ids) of a condition group, for naming damaged rows."""
    try:
        samples = [str(s) for s in read_all(array_at(group, "run_sample"))]
        counts = np.asarray(read_all(array_at(group, "run_tokens")), dtype=np.int64)
    except Exception:  # the run table itself is damaged: rows cannot be named
        return np.zeros(0, dtype=np.int64), []
    return np.cumsum(counts), samples


def verify_store(path: str | Path | ObjectStore, progress: bool = False) -> list[Damage]:
    """Read every chunk of the committed snapshot and check it (CRC-32C, decompression, presence).
    Returns what is damaged; an empty list means everything read back."""
    path = location(path)
    if not is_store(path):
        raise StorePathError(f"no workbench store at {path}")
    diagnosis = diagnose(path)
    if diagnosis is not None:  # chunks are found through the metadata: they are checked after its repair
        return [Damage("", "", diagnosis.kind, None, [], diagnosis.problem, diagnosis.report(path))]
    return _verify_repo(_open_repo(path), path, progress)


def _array_extents(repo: icechunk.Repository, snapshot: str) -> dict[str, tuple[str, int, int]]:
    """{"model/condition/variable": (icechunk node id, rows, rows per chunk)} of the arrays of
    `snapshot`'s condition groups. A workbench array only grows (rows appended, its partial last
    chunk rewritten), and one dropped and written again is a new node."""
    nodes = json.loads(repo.inspect_snapshot(snapshot))["nodes"]
    ids = {n["path"].strip("/"): n["id"] for n in nodes if n.get("node_type") == "array"}
    extents = {}
    for key, condition, group in _condition_groups(_root_of(repo, repo.readonly_session(snapshot_id=snapshot))):
        for name, array in group.arrays():
            path = f"{key}/{condition}/{name}"
            rows, step = (array.shape[0], array.chunks[0]) if array.ndim else (1, 1)
            extents[path] = (ids.get(path, ""), int(rows), max(int(step), 1))
    return extents


def _blocks_since(before: dict[str, tuple[str, int]], now: dict[str, tuple[str, int, int]]) -> tuple[dict[str, set[int]], int]:
    """{"model/condition/variable": row-chunk indices} written since the extents `before`: from
    the chunk that held an array's last row then (rewritten by the next append) to its end, and
    all of an array that is new or a new node; with how many row chunks that is."""
    only = {}
    for path, (node, rows, step) in now.items():
        old_node, old_rows = before.get(path, ("", 0))
        same = bool(node) and node == old_node
        if same and old_rows == rows:
            continue
        first = old_rows // step if same else 0
        only[path] = set(range(first, max(-(-rows // step), first + 1)))
    return only, sum(map(len, only.values()))


def _verify_repo(repo: icechunk.Repository, path: Path | ObjectStore, progress: bool = False,
                 only: dict[str, set[int]] | None = None) -> list[Damage]:
    """Read back the branch's snapshot; `only`: just these row chunks of these arrays (`_blocks_since`)."""
    problem = _snapshot_problem(repo)
    if problem is not None:
        return [Damage("", "", "snapshot", None, [], problem)]
    if isinstance(path, ObjectStore):
        session = repo.readonly_session(branch=BRANCH)
        store = session.store
    else:  # announced: a writer's run ending meanwhile keeps the chunks read here (`readers`)
        with announced_reader(path) as hold:
            session = repo.readonly_session(branch=BRANCH)
            store = session.store
            hold(session.snapshot_id, store)
    root = _root_of(repo, session, store)
    damage: list[Damage] = []
    groups = _condition_groups(root)
    from ..progress import progress_bar

    if only is not None:
        touched = {tuple(p.split("/")[:2]) for p in only}
        groups = [(k, c, g) for k, c, g in groups if (k, c) in touched]
    with progress_bar(len(groups), desc="verify", unit="condition", enabled=progress) as bar:
        for key, condition, group in groups:
            damage += _verify_group(key, condition, group, only)
            bar.update(1)
    return damage


def _verify_group(key: str, condition: str, group: zarr.Group, only: dict[str, set[int]] | None) -> list[Damage]:
    """Every array of one condition's group (`only`: just these row chunks of these arrays)."""
    damage: list[Damage] = []
    ends, samples = _row_samples(group)
    for name, array in sorted(group.arrays()):
        blocks = None if only is None else only.get(f"{key}/{condition}/{name}")
        if only is None or blocks:
            damage += _verify_array(key, condition, name, array, ends, samples, blocks)
    return damage


def _verify_array(key: str, condition: str, name: str, array: zarr.Array, ends: np.ndarray, samples: list[str],
                  blocks: set[int] | None = None) -> list[Damage]:
    """Read `array` one row chunk at a time (`blocks`: only these row chunks)."""
    found = []
    leading = (dimension_names(array) or (None,))[0]
    step = max(array.chunks[0] if array.ndim else 1, 1)
    n = array.shape[0] if array.ndim else 1
    starts = range(0, max(n, 1), step) if blocks is None else [b * step for b in sorted(blocks) if b * step < max(n, 1)]
    for start in starts:
        stop = min(start + step, n)
        try:
            (array[start:stop] if array.ndim else array[...])
        except Exception as err:
            if leading == "token":
                first = int(np.searchsorted(ends, start, side="right"))
                last = int(np.searchsorted(ends, max(stop - 1, start), side="right"))
                hit = samples[first : last + 1]
            elif leading == "run":
                hit = samples[start:stop]
            else:
                hit = list(samples)
            found.append(Damage(key, condition, name, (start, stop), hit, _short(err)))
    return found
