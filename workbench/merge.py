"""Merge the stores of a sharded run (`workbench run SPEC --shard k/N`) into one store equal to the
single run's: the same models, conditions, identities, rows in the same order, labels, and every
shard's provenance (plus a record of the merge).

Shard k of N holds samples k, k+N, k+2N, ... of the spec's data, so the single run's order is the
shards' samples taken round-robin. Each merged sample, all its conditions, is one commit (split
where its captures exceed `GATHER_BYTES`): an interrupted merge resumes where it stopped."""

from __future__ import annotations

import datetime as _dt
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import zarr

from .errors import BadInputError
from .progress import progress_bar
from .store import (
    MODEL_IDENTITY, StoredResult, StoreWriter, Variable, _open_repo, _reading, _root_of, identity_diff, is_store,
)
from .store.repository import array_at, dimension_names, group_at, json_dict, json_list, read_all
from .writer import GATHER_BYTES, captured_bytes

_LOG = logging.getLogger("workbench.merge")
_WRITTEN_BY_STORE = {"run_sample", "run_tokens", "run_input", "run_patches"}  # write_sample adds these


class MergeError(BadInputError):
    """The stores cannot be merged (not shards of one run, or shards that disagree)."""


class _Shard:
    """One shard store, read at its last commit."""

    def __init__(self, path: Path):
        if not is_store(path):
            raise MergeError(f"no workbench store at {path}")
        repo = _open_repo(path)
        self.path = path
        self.root = _root_of(repo, repo.readonly_session(branch="main"))
        self.provenance: list[dict[str, Any]] = [
            dict(r) for r in json_list(self.root.attrs.get("provenance")) if isinstance(r, Mapping)]
        shards = {tuple(r["shard"]) for r in self.provenance if r.get("shard")}
        if len(shards) != 1 or len(shards) != len({tuple(r.get("shard") or ()) for r in self.provenance}):
            raise MergeError(f"{path} is not the store of one shard (`workbench run SPEC --shard k/N`): "
                             f"its runs record shards {sorted(shards) or 'none'}")
        self.index, self.count = shards.pop()

    def models(self) -> dict[str, zarr.Group]:
        return {key: g for key, g in self.root.groups()}


def _check_shards(shards: list[_Shard]) -> None:
    counts = {s.count for s in shards}
    indices = sorted(s.index for s in shards)
    if len(counts) != 1 or indices != list(range(counts.pop())):
        raise MergeError(f"the stores are shards {', '.join(f'{s.index}/{s.count}' for s in shards)}; "
                         f"expected every shard 0..N-1 of one N exactly once")
    first = shards[0]
    for other in shards[1:]:
        for key, model in first.models().items():
            if key not in other.models():
                continue
            theirs = other.models()[key]
            diff = identity_diff({k: model.attrs.get(k) for k in MODEL_IDENTITY},
                                 {k: theirs.attrs.get(k) for k in MODEL_IDENTITY})
            for name, group in model.groups():
                if name in theirs:
                    diff += identity_diff(json_dict(group.attrs.get("identity")),
                                          json_dict(group_at(theirs, name).attrs.get("identity")), f"{name}.")
            if diff:
                raise MergeError(f"{first.path} and {other.path} ran {key} differently:\n    " + "\n    ".join(diff))


class _Row(NamedTuple):
    """One sample of a condition in a shard."""

    sample_id: str
    rows: dict[str, slice]  # its rows per row dim (token, patch)
    run: int  # its run row
    input_hash: str


def _sample_rows(group: zarr.Group) -> list[_Row]:
    """(sample id, its rows per row dim (token, patch), its run row, input hash) of every sample of
    a condition."""
    samples = [str(s) for s in read_all(array_at(group, "run_sample"))]
    hashes = [str(h) for h in read_all(array_at(group, "run_input"))] if "run_input" in group else [""] * len(samples)
    counts = {"token": np.asarray(read_all(array_at(group, "run_tokens")), dtype=np.int64)}
    if "run_patches" in group:
        counts["vision_patch"] = np.asarray(read_all(array_at(group, "run_patches")), dtype=np.int64)
    ends = {dim: np.cumsum(c) for dim, c in counts.items()}
    return [_Row(s, {dim: slice(int(ends[dim][i] - counts[dim][i]), int(ends[dim][i])) for dim in counts}, i, h)
            for i, (s, h) in enumerate(zip(samples, hashes))]


def _variables(group: zarr.Group, rows_of: dict[str, slice], run: int) -> dict[str, Variable]:
    """One sample's stored variables, as the runner handed them to the store."""
    arrays = dict(group.arrays())
    coords = {name: a for name, a in arrays.items() if dimension_names(a) == (name,)}
    out = {}
    for name, array in arrays.items():
        if name in coords or name in _WRITTEN_BY_STORE:
            continue
        dims = tuple(str(d) for d in dimension_names(array))
        rows = rows_of.get(dims[0], slice(run, run + 1))
        out[name] = Variable(dims, np.asarray(array[rows]), {d: read_all(coords[d]) for d in dims[1:] if d in coords})
    return out


def merge_arguments(out: str | None, stores: list[str]) -> tuple[str, list[str]]:
    """The output and the shards of `workbench merge [--out OUT] STORE...`. Without --out, the
    older form `merge OUT SHARD...` is read only where it cannot be mistaken: OUT must not be a
    shard store (`merge s0 s1 s2` would otherwise merge s1 and s2 into s0)."""
    if out is not None:
        return out, stores
    first, rest = stores[0], stores[1:]
    if _is_shard_store(Path(first)):
        raise MergeError(f"name the merged store with --out: `workbench merge --out OUT {' '.join(stores)}` "
                         f"({first} is a shard store, not an output)")
    if not rest:
        raise MergeError(f"no shard stores to merge into {first}: `workbench merge --out OUT SHARD...`")
    _LOG.warning(f"the first argument, {first}, is read as the merged store; "
                 f"`workbench merge --out {first} SHARD...` says so explicitly")
    return first, rest


def _is_shard_store(path: Path) -> bool:
    try:
        _Shard(path)
    except MergeError:
        return False
    return True


def merge_stores(out: str | Path, shard_paths: Sequence[str | Path], log: Callable[[str], None] = print,
                 progress: bool = False) -> int:
    """Merge shard stores into `out` (new, or a merge in progress); returns results written.
    progress: draw a bar over the samples (on a terminal, `workbench.progress`)."""
    out = Path(out)
    with _reading(out):
        shards = sorted((_Shard(Path(p)) for p in shard_paths), key=lambda s: s.index)
        _check_shards(shards)
        written = 0
        pending: list[StoredResult] = []

        def flush() -> None:
            if pending:
                store.write_samples(pending)
                pending.clear()

        with StoreWriter(out) as store:
            done_before = _committed(store)
            record = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                      "merge": [str(s.path) for s in shards], "command": list(sys.argv)}
            # the shards' own run records, then the merge's (the shards' only on the first pass)
            store.add_provenance(*([] if done_before else [r for s in shards for r in s.provenance]), record)
            models = list(dict.fromkeys(k for s in shards for k in s.models()))
            orders = {key: _model_order(shards, key) for key in models}
            with progress_bar(sum(len(order) for _, _, order in orders.values()), desc="merge", unit="sample",
                              enabled=progress) as bar:
                for key, (conditions, per_shard, order) in orders.items():
                    first = next(s for s in shards if key in s.models())
                    model_attrs: dict[str, Any] = dict(first.models()[key].attrs)
                    store.ensure_model(model_attrs["model_id"], model_attrs)
                    for sample in order:
                        flush()
                        for condition in conditions:
                            found = [(i, r) for i, rows in enumerate(per_shard[condition]) for r in rows
                                     if r.sample_id == sample]
                            if not found or (key, condition, sample) in done_before:
                                continue
                            i, (sid, tokens, run, input_hash) = found[0]
                            group = group_at(shards[i].models()[key], condition)
                            attrs = {k: v for k, v in group.attrs.items() if k != "condition"}
                            variables = _variables(group, tokens, run)
                            if sum(captured_bytes(r.variables) for r in pending) + captured_bytes(variables) > GATHER_BYTES:
                                flush()
                            pending.append(StoredResult(model_attrs["model_id"], condition, sid, variables, attrs,
                                                        input_hash))
                            written += 1
                        bar.update(1)
            flush()
            store.finish_run()
    log(f"merged {len(shards)} shard(s) into {out}: wrote {written} result(s)")
    return written


def _model_order(shards: list[_Shard], key: str) -> tuple[list[str], dict[str, list[list[_Row]]], list[str]]:
    """(conditions, each condition's rows per shard, samples in the single run's order) of model `key`."""
    conditions = list(dict.fromkeys(c for s in shards if key in s.models() for c, _ in s.models()[key].groups()))
    per_shard = {c: [_sample_rows(group_at(s.models()[key], c)) if key in s.models() and c in s.models()[key] else []
                     for s in shards] for c in conditions}
    # the single run's order: per sample (round-robin over shards), per condition
    order = _round_robin([list(dict.fromkeys(r.sample_id for c in conditions for r in per_shard[c][i]))
                          for i in range(len(shards))])
    return conditions, per_shard, order


def _committed(store: StoreWriter) -> set[tuple[str, str, str]]:
    root = store.committed_root()
    return {(key, condition, s) for key, model in root.groups() for condition, group in model.groups()
            for s in (str(x) for x in read_all(array_at(group, "run_sample")))} if "workbench_format" in root.attrs else set()


def _round_robin(lists: list[list[str]]) -> list[str]:
    out: list[str] = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x) and x[i] not in out]
    return out
