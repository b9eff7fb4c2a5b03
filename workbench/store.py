"""The activation store: captured tensors in a transactional zarr repository, read back as labeled
xarray objects.

A store is an **icechunk** repository (Earthmover's transactional storage engine for zarr v3) on
the local filesystem, or on object storage at `s3://bucket/prefix` (`workbench.objectstore`: the
one place that handles URLs; endpoint and credentials from the AWS_* environment). Its zarr
hierarchy:

    /                                 root attrs: format version, provenance of every run
      <model key>/                    one group per model (models differ in depth and width);
                                      attrs: the model's identity (architecture, revision, dtype, ...)
        <condition>/                  one group per condition; attrs["identity"]: what it means
          hidden    (token, layer, dim)  float32   the residual stream
          modality, token_id, token_text (token)            per-token labels (modality: int8
                                                            codes into MODALITIES)
          layer     (layer)                                 layer index of each stored slice
          run_sample, run_tokens, run_input (run)           one row per sample
          run_text  (run)                                   the per-run text labels, one JSON object

Every sample is appended as one "long" block of tokens (no padding across samples). Each token's
`sample` and `position` (and each vision-tower row's `patch_sample` and `patch_position`) follow
from the run rows (`run_sample`, `run_tokens`, `run_patches`) and are derived when a store is
read, not stored (format 3): every array costs a commit a few milliseconds whatever it holds.

Guarantees.
- Atomic commits: each (model, sample, condition) result is one icechunk commit: its groups,
  arrays, attrs, coordinates, rows and labels appear together or not at all. A process killed at
  any instant leaves the store at its last commit; the chunks it wrote after that are unreferenced.
- Consistent readers: `open_store`, `store_info` and `verify` read one committed snapshot, so
  they never see partial rows while a run writes. Every run's last snapshot is tagged
  `run-<n>`; `open_store(path, snapshot="run-1")` reads a past state.
- Checksums: every chunk ends with a CRC-32C (zarr v3's `crc32c` codec); `verify` reads everything
  and reports each damaged chunk by model, condition, variable and row range. A rerun drops the
  damaged conditions (in one commit) and re-captures them.
- No silent mixing: a condition's identity (resolved interventions, data source and seed, capture
  layout) and a model's (revision, dtype, device kind) are stored; a resume whose identity differs
  is refused, as is a sample whose input changed under the same id.
- One writer at a time on a local store (a lock file beside the store, on its real path); any
  number of readers.
- Several writers on an object store (shards: `workbench run SPEC --shard k/N` with an s3:// store):
  no lock; icechunk refuses a commit whose branch moved since its session began, and the writer
  re-stages it on the new tip (`StoreWriter.write_samples`: the touched conditions' layout and the
  provenance list are read again) and retries with a random back-off. A session that starts on a
  tip this writer did not commit drops every cached layout first, so a stale row count never
  overwrites another writer's rows. Run tags are per writer and nothing is compacted (see
  `finish_run`).

Dtype and codec (measured, see FIELD-NOTES and benchmarks/): float32 with Blosc lz4 (level 1) +
byte shuffle, then CRC-32C. zarr has no bfloat16; fp16 overflows on massive activations. fp32
holds bf16 values exactly. Chunks: ~2 MiB, one layer per chunk, the whole hidden dimension, so
per-layer reductions stream.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import os
import re
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import xarray as xr
import zarr

from .errors import StoreError, StorePathError
from .names import (
    DERIVED_LABELS, PATCH_LABELS, RESERVED_NAMES, RUN_LABELS, RUN_TEXT, RUN_TEXT_LABELS, TEXT_LABELS, TOKEN_LABELS,
    reserved_name_problem,
)
from . import verified
from .objectstore import ObjectStore, location

# 3: no per-token sample/position arrays (derived from the run rows), per-run text labels in one array
STORE_FORMAT = 3
BRANCH = "main"
RUN_TAG = "run-{}"
# a reader holding a snapshot younger than this keeps working through a writer's compaction
COMPACT_GRACE = _dt.timedelta(seconds=float(os.environ.get("WORKBENCH_COMPACT_GRACE_S", 600)))
MODALITIES = ("vision", "boundary", "text")
# ~2 MiB of rows per chunk. 512 KiB was measured (Qwen3-VL-2B-sized captures, alternating
# stores): a sample's write 0.73x the CPU (a commit re-encodes less of each partial last chunk),
# but an analysis pass over the store 1.45x (4x the chunks read, ~0.85 ms each): not kept
_CHUNK_BYTES = 2 * 1024 * 1024
# The writer keeps each array's partial last chunk row in memory, so that an append does not read
# it back and decode it: the label arrays', and captures' where a chunk row is small (a tiny
# model's: 8 MiB; a 2B model's spans every layer, ~50 MB, and caching it raised the peak RSS of
# `wide` in benchmarks section 4 by 70-270 MB at 16 samples: the tails and the block written
# with its tail). Arrays whose chunk row is at most _TAIL_ARRAY_BYTES; _TAIL_CACHE_BYTES in all.
_TAIL_ARRAY_BYTES = 4 * _CHUNK_BYTES
_TAIL_CACHE_BYTES = 64 << 20
# the writer's own chunk encoding (`_encoded_appends`) sets chunks in batches of about this many bytes
_ENCODED_BATCH_BYTES = 32 << 20
# attrs["workbench_kind"] of the analysis cache (analyses.cache), a plain zarr folder beside the repository
ANALYSIS_KIND = "analysis"
# Skipping "empty" chunks compares every chunk with the fill value: 4-6x slower writes. Applied
# per write (a context), not process-wide.
_ZARR_WRITE_CONFIG = {"array.write_empty_chunks": True}


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


class StoreIdentityError(StoreError):
    """A resume whose condition or model means something else than what the store holds."""

    exit_code = 2


@dataclass
class Variable:
    """One captured array for one sample. `dims[0]` is "token" (per position), "vision_patch" (per
    vision-tower row) or "run" (one row per sample); `coords` labels the other dims (e.g.
    {"layer": [0, 1, 2]})."""

    dims: tuple[str, ...]
    data: np.ndarray
    coords: dict[str, np.ndarray] = field(default_factory=dict)


def lock_path(store: Path) -> Path:
    return store.with_name(store.name + ".lock")


def model_key(model_id: str) -> str:
    """Group name of a model: HF ids contain '/', which zarr and DataTree reserve."""
    key = model_id.strip("/").replace("/", "--")
    key = re.sub(r"[^\w.=,+-]", "_", key)
    return f"_{key}" if key in RESERVED_NAMES or key.startswith("_") else key


# -- icechunk plumbing ---------------------------------------------------------------------------


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


def _open_repo(path: Path) -> Any:
    ic = _icechunk()
    try:
        return ic.Repository.open(_storage(path), config=_repo_config())
    except Exception as err:  # icechunk raises its own error types for a damaged repository
        raise StoreError(f"cannot open store {path}: {_short(err)}",
                         hint=f"run `workbench verify {path}` to see what is damaged") from None


def _short(err: BaseException) -> str:
    """An error's gist on one line: icechunk's first line, without its context trace."""
    text = " ".join(str(err).split("| \n")[0].split("context:")[0].split()).strip(" |")
    text = text[2:] if text.startswith("x ") else text
    return text[:300] + ("..." if len(text) > 300 else "")


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


# -- paths --------------------------------------------------------------------------------------


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

    def __init__(self, real: Path, shown: Path):
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


def _chunk_rows(row_shape: tuple[int, ...], itemsize: int, floor: int) -> int:
    row_bytes = max(1, int(np.prod(row_shape[-1:], dtype=np.int64)) * itemsize)
    rows = 2 ** int(np.floor(np.log2(max(1, _CHUNK_BYTES // row_bytes))))
    return int(min(max(rows, floor), 65536))


_LABEL_CHUNK = {"token": 4096, "run": 256}
# the row dim of vision-tower captures (one row per patch, before the connector merges them)
PATCH_DIM = "vision_patch"


def _chunks(shape: tuple[int, ...], itemsize: int, leading: str) -> tuple[int, ...]:
    # first dim: ~2 MiB worth of rows; middle dims one at a time (a layer per chunk); last whole.
    # Per-run rows can be large (a vocabulary of log-probs): no floor on their count, or every
    # append would rewrite a huge partial chunk. 1-D labels: a few thousand rows, since every
    # append rewrites the partial last chunk (and a transactional store keeps the old one until
    # compaction).
    if len(shape) == 1:
        return (_LABEL_CHUNK.get(leading, 4096),)
    middle = (1,) * max(0, len(shape) - 2)
    last = (shape[-1],) if len(shape) >= 2 else ()
    floor = 64 if leading == "token" else 1
    return (_chunk_rows(shape, itemsize, floor),) + middle + tuple(max(1, s) for s in last)


def _storage_dtype(data: np.ndarray) -> Any:
    if data.dtype.kind in "USO":
        return str
    if data.dtype.kind == "f":
        return np.float32
    return data.dtype


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def identity_diff(stored: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """'field: stored X, now Y' for every field that differs (nested dicts are walked)."""
    lines = []
    for key in sorted(set(stored) | set(now)):
        a, b = stored.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += identity_diff(a, b, f"{prefix}{key}.")
        elif a != b:
            lines.append(f"{prefix}{key}: stored {json.dumps(a)}, now {json.dumps(b)}")
    return lines


MODEL_IDENTITY = ("model_id", "architecture", "revision", "dtype", "device_kind", "n_layers", "hidden_size", "vocab_size")


class _NoLock:
    """An object store has no lock: its writers' commits are ordered by icechunk instead."""

    def release(self) -> None:
        pass


class BranchMovedError(StoreError):
    """Another writer of an object store kept committing first, more often than this writer retries."""


# how long a writer whose object-store creation lost the race waits for the winner's branch
CREATE_WAIT_S = 30.0
# an object store's writer re-stages a commit whose branch moved at most this many times
COMMIT_TRIES = int(os.environ.get("WORKBENCH_COMMIT_TRIES", 20))


class StoreWriter:
    """The single writer of a local store (it holds an exclusive lock), or one of several writers
    of an object store (s3://: no lock; a commit that loses the race is re-staged on the new
    branch tip and committed again, see `write_samples`). Use as a context manager.

    Changes are staged in an icechunk session and committed once per sample (`write_sample`):
    the model and condition groups, the provenance record and the rows appear with the first
    sample that needs them."""

    def __init__(self, path: str | Path | ObjectStore):
        self.path = location(path)
        real = check_store_path(self.path)
        self._real = real
        # several processes may write one object store at once (shards); a local store has one writer
        self.shared = isinstance(real, ObjectStore)
        self._lock = _NoLock() if self.shared else _WriterLock(real, self.path)
        try:
            # damaged metadata (branch pointer, config, the branch's snapshot): back to the newest
            # intact snapshot first, so the run re-captures only what that snapshot lacks
            self.repairs: list[str] = _repair_metadata(real) if is_store(real) else []
            # a new store is created with its first commit: a run that fails before any result
            # leaves nothing behind but the lock file
            self.repo = self._open_existing(real) if is_store(real) else None
        except BaseException:
            self._lock.release()
            raise
        self._session: Any = None
        self._root: zarr.Group | None = None
        self._pending_provenance: list[dict[str, Any]] | None = None
        self._models: dict[str, dict[str, Any]] = {}
        self._states: dict[tuple[str, str], _ConditionState] = {}
        # the snapshot `_states` describes: a session on another one (another writer committed) rereads them
        self._tip: str | None = None
        self.conflicts = 0  # commits re-staged because another writer committed first
        self._provenance_written: list[dict[str, Any]] = []
        self.commits = 0
        self.compaction_skipped: str | None = None
        self.checked = ""  # what the last `damage_since_check` read
        self._checked_state: verified.Ledger | None = None

    def _open_existing(self, real: Path) -> Any:
        repo = _open_repo(real)
        try:
            root = _root_of(repo, repo.readonly_session(branch=BRANCH))
        except Exception:
            return repo  # an unreadable snapshot: `damage` names it
        fmt = root.attrs.get("workbench_format")
        if fmt is None and any(True for _ in root.groups()):
            raise StorePathError(f"{self.path} is an icechunk repository but not a workbench store",
                                 hint="pass a new store path")
        if fmt is not None and fmt != STORE_FORMAT:
            raise StorePathError(f"{self.path} has store format {fmt}; this workbench writes format {STORE_FORMAT}",
                                 hint="write to a new store path")
        return repo

    # -- context manager -------------------------------------------------------------------
    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock. Uncommitted changes (a sample in flight) are dropped."""
        self._session = self._root = None
        self._lock.release()

    # -- transactions -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _io(self, what: str) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except Exception as err:
            meaning = io_failure(err)
            if meaning is None:
                raise
            self._session = self._root = None
            logging.getLogger("asyncio").addFilter(_ABANDONED_WRITES)
            raise StoreIOError(
                f"{what} in {self.path} failed: {meaning}; the store keeps its last commit "
                f"({self.commits} sample(s) committed by this run)",
                hint="free space or fix the file system, then rerun the same command to finish") from None

    @contextlib.contextmanager
    def _discard_on_error(self, known: set[tuple[str, str]] | None = None) -> Iterator[None]:
        """A write that fails halfway leaves nothing staged: the next commit must not carry it,
        nor the layout of a condition first met in it (`known`: the conditions met before)."""
        try:
            yield
        except BaseException:
            self._session = self._root = None
            if known is not None:
                for key in set(self._states) - known:
                    del self._states[key]
            raise

    def committed_root(self) -> zarr.Group:
        if self.repo is None:
            return zarr.open_group(zarr.storage.MemoryStore(), mode="w", zarr_format=3)
        return _root_of(self.repo, self.repo.readonly_session(branch=BRANCH))

    def _create_repo(self) -> Any:
        ic = _icechunk()
        if not self.shared:
            return self._create_local_repo()
        try:
            return ic.Repository.create(_storage(self._real), config=_repo_config())
        except ic.IcechunkError:  # another shard created it first ("only in clean prefixes")
            import tenacity

            # its files appear before its branch does: wait until it opens (a foreign repository
            # there is refused at once)
            try:
                for attempt in tenacity.Retrying(stop=tenacity.stop_after_delay(CREATE_WAIT_S), reraise=True,
                                                 retry=tenacity.retry_if_not_exception_type(StorePathError),
                                                 wait=tenacity.wait_random(0.05, 0.3)):
                    with attempt:
                        return self._open_existing(self._real)
            except StorePathError:
                raise
            except StoreError:
                # an object store has no rename to make creation atomic: a writer killed between
                # the first snapshot and the branch leaves files no writer can create over
                raise StorePathError(
                    f"{self.path} holds files but no store that opens (no branch after {CREATE_WAIT_S:g} s); "
                    "a writer killed while creating the store leaves it so",
                    hint=f"delete what lies under {self.path} (e.g. `aws s3 rm --recursive {self.path}`) "
                         "or pass another store path") from None
            raise AssertionError("unreachable")  # pragma: no cover

    def _create_local_repo(self) -> Any:
        """icechunk writes a new repository's first snapshot before its branch: a kill in between
        would leave a directory that is neither empty nor a store, which the rerun must refuse.
        So it is created beside the store and renamed into place (rename is atomic, and replaces
        the empty directory a user may have made). A leftover from a killed creation is this
        writer's own (it holds the lock, whose file made the parent directory) and is removed."""
        ic = _icechunk()
        real = self._real
        creating = real.with_name(real.name + ".creating")
        shutil.rmtree(creating, ignore_errors=True)
        ic.Repository.create(_storage(creating), config=_repo_config())
        fault_point("store.create")
        os.replace(creating, real)
        return ic.Repository.open(_storage(real), config=_repo_config())

    def _forget_layout(self) -> None:
        """Drop what this writer knows of committed arrays: another writer moved the branch."""
        self._states.clear()

    def _stage(self) -> zarr.Group:
        if self.repo is None:
            with self._io("creating the store"):
                self.repo = self._create_repo()
        if self._root is None:
            self._session = self.repo.writable_session(BRANCH)
            if self._session.snapshot_id != self._tip:
                self._forget_layout()
                self._tip = self._session.snapshot_id
            store = self._session.store
            if os.environ.get("WORKBENCH_KILL_AT", "").startswith("store.write:"):
                store = _FaultStore(store)
            self._root = zarr.open_group(store, mode="a", zarr_format=3)
        return self._root

    def _commit(self, message: str, results: int = 1) -> str:
        """Commit what is staged, holding `results` results of this run (counted in `commits`).
        BranchMovedError if another writer committed since the session began (nothing committed)."""
        try:
            with self._io("committing"):
                snapshot = self._session.commit(message)
        except _icechunk().ConflictError:
            self._session = self._root = None
            raise BranchMovedError(f"another writer committed to {self.path} while this one wrote {message}",
                                   hint="rerun the same command to resume") from None
        self._session = self._root = None
        self._tip = snapshot
        self.commits += results
        fault_point("store.commit")
        return snapshot

    # -- provenance and groups ----------------------------------------------------------------
    def add_provenance(self, *records: dict[str, Any]) -> None:
        """A run's provenance record(s) (effective spec, command line, versions, time): committed
        with the run's first sample, so a run that stores nothing leaves no record."""
        self._pending_provenance = [_jsonable(r) for r in records]

    def ensure_model(self, model_id: str, attrs: dict[str, Any]) -> None:
        """Declare a model before its samples; refused if the store holds it with another identity
        (revision, dtype, device kind, shape)."""
        attrs = _jsonable({**attrs, "model_id": model_id})
        device = str(attrs.get("device") or "")
        attrs.setdefault("device_kind", device.split(":")[0] or None)
        root = self.committed_root()
        key = model_key(model_id)
        if key in root:
            stored = dict(root[key].attrs)
            diff = identity_diff({k: stored.get(k) for k in MODEL_IDENTITY if k in stored},
                                 {k: attrs.get(k) for k in MODEL_IDENTITY if k in stored})
            if diff:
                raise StoreIdentityError(
                    f"store {self.path} holds {model_id} with another identity:\n    " + "\n    ".join(diff),
                    hint="write to a new store (--store), or run with the stored settings")
        self._models[model_id] = attrs

    def check_condition(self, model_id: str, condition: str, identity: dict[str, Any]) -> None:
        """Refuse a resume into `condition` if the store holds it with another meaning."""
        root = self.committed_root()
        key = model_key(model_id)
        if key not in root or condition not in root[key]:
            return
        stored = dict(root[key][condition].attrs).get("identity")
        diff = identity_diff(stored or {}, _jsonable(identity))
        if diff:
            raise StoreIdentityError(
                f"condition {condition!r} of {model_id} in {self.path} was stored with another meaning:\n    "
                + "\n    ".join(diff),
                hint="give the changed condition a new name, or write to a new store (--store)")

    def committed_inputs(self, model_id: str, condition: str) -> dict[str, str]:
        """sample id -> input hash of every committed sample of (model, condition), in order."""
        root = self.committed_root()
        key = model_key(model_id)
        if key not in root or condition not in root[key]:
            return {}
        group = root[key][condition]
        samples = [str(s) for s in group["run_sample"][:]] if "run_sample" in group else []
        hashes = [str(s) for s in group["run_input"][:]] if "run_input" in group else [""] * len(samples)
        return dict(zip(samples, hashes))

    # -- writing ------------------------------------------------------------------------------
    def write_sample(
        self,
        model_id: str,
        condition: str,
        sample_id: str,
        variables: dict[str, Variable],
        condition_attrs: dict[str, Any] | None = None,
        input_hash: str = "",
    ) -> str:
        """Append one sample's captures to (model, condition) and commit them as one snapshot.

        `variables` must include the token labels position/modality/token_id (dims ("token",)).
        Returns the snapshot id."""
        return self.write_samples([(model_id, condition, sample_id, variables, condition_attrs, input_hash)])

    def write_samples(self, results: list[tuple[str, str, str, dict[str, Variable], dict[str, Any] | None, str]]) -> str:
        """`_write_once`, on an object store retried while other writers commit first: each try
        discards its session, starts one on the new branch tip (which rereads the touched
        conditions' layout and the root's provenance list), stages the same results again and
        commits, after a short random wait (at most COMMIT_TRIES tries). Returns the snapshot id."""
        if not self.shared:
            return self._write_once(results)
        import tenacity

        def count(state: tenacity.RetryCallState) -> None:
            self.conflicts += 1

        # random waits (20 ms doubling, at most 1 s) so that shards that collided do not collide again
        for attempt in tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(BranchMovedError), stop=tenacity.stop_after_attempt(COMMIT_TRIES),
                wait=tenacity.wait_random_exponential(multiplier=0.02, max=1.0), before_sleep=count, reraise=True):
            with attempt:
                tries = attempt.retry_state.attempt_number
                # the commit message says it was retried (`workbench info --history`)
                snapshot = self._write_once(results, note=f" (try {tries})" if tries > 1 else "")
        return snapshot

    def _write_once(self, results: list[tuple[str, str, str, dict[str, Variable], dict[str, Any] | None, str]],
                    note: str = "") -> str:
        """Append several results, each (model_id, condition, sample_id, variables,
        condition_attrs, input_hash) as `write_sample` takes them, and commit them together as
        ONE snapshot: stored all or none. A batched forward's results are one commit; the
        background writer gathers the forwards of a commit interval into one. The results of
        one (model, condition) are appended as one block per array, so a commit's cost hardly
        grows with the number of results in it. Returns the snapshot id."""
        seen: set[tuple[str, str, str]] = set()
        for model_id, condition, sample_id, *_ in results:
            problem = reserved_name_problem(condition)
            if problem:
                raise StoreError(f"condition name {problem}")
            if (model_id, condition, sample_id) in seen:
                raise StoreError(f"sample {sample_id!r} appears twice for {model_id} / {condition} in one commit")
            seen.add((model_id, condition, sample_id))
        what = _commit_message(results)
        staged: list[tuple[_ConditionState, list[_Staged], dict[str, Any]]] = []
        with zarr.config.set(_ZARR_WRITE_CONFIG), self._io(f"writing {what}"), self._discard_on_error(set(self._states)):
            root = self._stage()
            by_condition: dict[tuple[str, str], list[tuple]] = {}
            for result in results:
                by_condition.setdefault((result[0], result[1]), []).append(result)
            for (model_id, condition), items in by_condition.items():
                group = self._condition_group(root, model_id, condition, items[0][4] or {})
                state = self._state(model_id, condition, group)
                # each result is checked against what is committed and the results before it
                known = _Layout.of(state)
                pending = [_staged_rows(group.path, state, sample_id, variables, input_hash, known)
                           for _, _, sample_id, variables, _, input_hash in items]
                layout = _Layout.of(state)
                # the state's own copies change only once committed
                metadata, tails = dict(state.metadata), dict(state.tails)
                for run in _same_names(pending):
                    block = _concat_rows([p.rows for p in run])
                    # every array's create/resize/write in one batch: one trip through zarr's event loop
                    zarr.core.sync.sync(self._append_all(group._async_group, block, layout, metadata, tails))
                    layout.advance(block)
                staged.append((state, pending, metadata, tails))
            if self._pending_provenance is not None:
                root.attrs["provenance"] = [*root.attrs.get("provenance", []), *self._pending_provenance]
            snapshot = self._commit(what + note, len(results))
        if self._pending_provenance is not None:
            self._provenance_written += self._pending_provenance
        self._pending_provenance = None
        for state, pending, metadata, tails in staged:
            for item in pending:
                state.commit(item.sample_id, item.n_tokens, item.shapes, item.rows, item.n_patches)
            state.metadata, state.tails = metadata, tails
        self._trim_tails()
        return snapshot

    def _trim_tails(self) -> None:
        """Keep the cached partial last chunk rows under _TAIL_CACHE_BYTES in all (a dropped one
        is read back from the store at its array's next append, as zarr itself would)."""
        total = 0
        for state in self._states.values():
            for name, tail in list(state.tails.items()):
                total += tail.nbytes
                if total > _TAIL_CACHE_BYTES:
                    total -= tail.nbytes
                    del state.tails[name]

    def _condition_group(self, root: zarr.Group, model_id: str, condition: str, attrs: dict[str, Any]) -> zarr.Group:
        key = model_key(model_id)
        if (key, condition) in self._states:  # known to exist: skip the lookups
            return root[f"{key}/{condition}"]
        # each group's attributes in one metadata write (`attrs.update` rewrites it once per key)
        if "workbench_format" not in root.attrs:
            root.update_attributes({"workbench_format": STORE_FORMAT, "provenance": []})
        if key not in root:
            root.create_group(key, attributes=self._models.get(model_id) or {"model_id": model_id})
        model = root[key]
        if condition not in model:
            return model.create_group(condition, attributes=_jsonable({**attrs, "condition": condition}))
        return model[condition]

    def _state(self, model_id: str, condition: str, group: zarr.Group) -> _ConditionState:
        """What this writer knows of a condition's committed arrays (read once, then kept)."""
        key = (model_key(model_id), condition)
        if key not in self._states:
            self._states[key] = _ConditionState.read(group)
        return self._states[key]

    async def _append_all(self, group: Any, rows: dict[str, Variable], layout: _Layout,
                          metadata: dict[str, Any], tails: dict[str, np.ndarray]) -> None:
        """Create or resize and write every array of `rows` at the layout's offsets. `metadata`:
        the arrays' zarr metadata as this writer last committed them, updated here; an array
        known there is not looked up again (a read and parse of its zarr.json, ~0.5 ms per array
        per commit, a tenth of a small commit's cost). `tails`: each array's rows after its last
        chunk boundary, as committed, updated here. An append that starts inside a chunk is
        written from that chunk's start with the tail before it, so zarr encodes the chunk
        without first reading and decoding the stored one.

        Arrays with small chunk rows (labels; a tiny model's captures) are written by
        `_encoded_appends`: their chunks encoded here through the array's own codecs and set in
        the store with their new metadata, all arrays' at once. zarr's resize and setitem cost
        ~0.7 and ~1.5-2.4 ms of CPU per call however few rows they write (its asyncio codec
        pipeline, a trip to the store's threads per step), which made a commit's fixed cost
        (~12 arrays a condition) most of what a small run's store costs. Captures whose chunk row
        is over _TAIL_ARRAY_BYTES (a 2B model's) keep zarr's own path: their bytes are the cost
        there, and zarr merges their partial chunks without a tail kept in memory."""
        import asyncio

        from zarr.core.array import AsyncArray

        new_coords = {dim: np.asarray(values) for var in rows.values() for dim, values in var.coords.items()
                      if dim not in layout.coords}
        await asyncio.gather(*(self._create_coord(group, dim, values) for dim, values in new_coords.items()))
        direct: list[tuple[Any, Any, int, np.ndarray]] = []  # (new metadata, store path, first row, rows)

        async def append(name: str, var: Variable) -> None:
            data = np.asarray(var.data)
            offset = layout.offsets[var.dims[0]]
            new = name not in metadata and name not in layout.shapes
            if name in metadata:
                array = AsyncArray(metadata=metadata[name], store_path=group.store_path / name)
            elif not new:
                array = await group.getitem(name)
            else:  # a new array: its zarr.json is written with its first rows
                array = AsyncArray(metadata=await _new_array_metadata(name, var), store_path=group.store_path / name)
            if data.dtype.kind in "USO":
                data = data.astype(object)
            elif data.dtype != array.dtype:  # no copy when the capture already is float32
                data = data.astype(array.dtype)
            end = offset + data.shape[0]
            new_shape = (end,) + data.shape[1:]
            chunk = array.metadata.chunks[0]
            start = offset - offset % chunk
            cached = chunk * (data.nbytes // max(1, len(data))) <= _TAIL_ARRAY_BYTES
            if not cached:  # zarr merges the rows into the stored chunk (a read and decode of it)
                await array.resize(new_shape)
                metadata[name] = array.metadata
                await array.setitem(slice(offset, end), data)
                return
            if start < offset:  # the last chunk row is partial: write it whole
                tail = tails.get(name)
                if new:  # a variable new to the condition: the rows before its first are fill values
                    tail = np.full((offset - start,) + data.shape[1:], array.metadata.fill_value, dtype=data.dtype)
                elif tail is None or len(tail) != offset - start:  # not cached: read it back, once
                    tail = await array.getitem(slice(start, offset))
                data = np.concatenate([np.asarray(tail, dtype=data.dtype), data])
            metadata[name] = array.metadata.update_shape(new_shape)
            direct.append((metadata[name], array.store_path, start, data))
            tails[name] = data[end - end % chunk - start:].copy()  # not a view: that would keep the block alive

        await asyncio.gather(*(append(name, var) for name, var in rows.items()))
        if direct:
            await _encoded_appends(direct)

    @staticmethod
    async def _create_coord(group: Any, dim: str, values: np.ndarray) -> None:
        coord = await group.create_array(dim, shape=values.shape, dtype=values.dtype, dimension_names=[dim],
                                         compressors=[zarr.codecs.Crc32cCodec()])
        await coord.setitem(slice(None), values)

    # -- the end of a run, and repair -----------------------------------------------------------
    def finish_run(self) -> str | None:
        """Tag the current snapshot `run-<n>` (n counts the store's runs), a past state users can
        read back with `open_store(path, snapshot="run-<n>")`; then compact: per-sample snapshots
        older than COMPACT_GRACE are expired and the chunks only they referenced deleted (every
        append rewrites the partial last chunk of each array, so old versions pile up).
        Returns the tag, or None when this run committed nothing.

        On an object store (several writers) the tag is `run-<n>` with n the position of this
        run's own provenance record (each shard appends its own, so tags never clash), on this
        writer's last commit; and nothing is compacted: another writer's open session may be
        based on a snapshot that expiry would drop, or have written chunks that no snapshot
        references yet, which garbage collection would delete under it, and no grace period
        bounds how long a session stays open (a stalled process). Old chunk versions stay
        until the store is compacted with no writer running."""
        if not self.commits or self.repo is None:
            return None
        if self.shared:
            return self._tag_shared_run()
        n = len(self.committed_root().attrs.get("provenance", []))
        tag = RUN_TAG.format(n)
        with self._io("tagging the run"):
            if tag in self.repo.list_tags():
                self.repo.delete_tag(tag)
            self.repo.create_tag(tag, self.repo.lookup_branch(BRANCH))
            cutoff = _dt.datetime.now(_dt.timezone.utc) - COMPACT_GRACE
            try:
                self.repo.expire_snapshots(older_than=cutoff)
                verified.collect(self._real, lambda: self.repo.garbage_collect(cutoff))
            except Exception as err:  # an old tag's damaged metadata: compaction waits, the data is fine
                if io_failure(err):
                    raise
                self.compaction_skipped = _short(err)
        return tag

    def _tag_shared_run(self) -> str | None:
        records = list(self.committed_root().attrs.get("provenance", []))
        own = [i for i, r in enumerate(records) if r in self._provenance_written]
        if not own or self._tip is None:
            return None
        tag = RUN_TAG.format(own[-1] + 1)
        with self._io("tagging the run"):
            if tag not in self.repo.list_tags():
                self.repo.create_tag(tag, self._tip)
        self.compaction_skipped = "an object store is not compacted while writers may be active"
        return tag

    def damage(self) -> list[Damage]:
        """`verify_store` of the committed state (reads every chunk)."""
        return [] if self.repo is None else _verify_repo(self.repo, self._real)

    def damage_since_check(self) -> list[Damage]:
        """The committed state checked as a run's start needs it: on a local store whose record
        of this writer's last check (`workbench.verified`) lists files none of which changed
        since, only the row chunks written since are read (`_blocks_since`); otherwise every
        chunk (an object store, no or a stale record, a snapshot restored at open). `checked`
        says which; `repair` saves the new record."""
        self._checked_state = None
        if self.repo is None:
            self.checked = "nothing to check (a new store)"
            return []
        if self.shared or self.repairs:
            self.checked = "every chunk"
            return self.damage()
        ledger, now = verified.load(self._real), verified.file_stats(self._real)
        tip = self.repo.lookup_branch(BRANCH)
        try:
            extents = _array_extents(self.repo, tip)
        except Exception:  # an unreadable snapshot: the full check names it
            self.checked = "every chunk"
            return self.damage()
        only, count = None, 0
        if ledger is not None and not ledger.changed(now):
            only, count = _blocks_since(ledger.arrays, extents)
        self._checked_state = verified.Ledger(tip, now, {path: (node, rows) for path, (node, rows, _) in extents.items()})
        damage = _verify_repo(self.repo, self._real, only=only)
        self.checked = ("every chunk" if only is None else
                        f"the {count} row chunks written since the last check, in {len(only)} arrays")
        return damage

    def repair(self, sample_ids: set[str]) -> list[str]:
        """Check the committed state (`damage_since_check`) and drop each damaged condition so
        that this run re-captures it; then record the check. What was restored at open (an
        unreadable snapshot) is in `repairs`."""
        repairs = self.drop_damaged(self.damage_since_check(), sample_ids)
        if self._checked_state is not None:
            try:
                verified.save(self._real, self._checked_state)
            except OSError:  # no record: the next run reads every chunk again
                pass
        return repairs

    def drop_damaged(self, damage: list[Damage], sample_ids: set[str]) -> list[str]:
        """Drop every condition with a damaged chunk, in one commit, so the run re-captures it.
        Refused when the run would not re-capture all its samples (e.g. a smaller --limit)."""
        conditions = sorted({(d.model_key, d.condition) for d in damage if d.condition})
        if not conditions:
            return []
        root = self.committed_root()
        for key, condition in conditions:
            try:
                stored = {str(s) for s in root[key][condition]["run_sample"][:]} if "run_sample" in root[key][condition] else set()
            except Exception:  # the sample list itself is damaged: its samples are named by the damage, if at all
                stored = {s for d in damage if (d.model_key, d.condition) == (key, condition) for s in d.samples}
            missing = sorted(stored - sample_ids)
            if missing:
                raise StoreError(
                    f"{key}/{condition} holds damaged chunks, and this run would not re-capture "
                    f"{len(missing)} of its samples (e.g. {missing[0]})",
                    hint="rerun with the spec's full data (no --limit) to repair it")
        with zarr.config.set(_ZARR_WRITE_CONFIG), self._io("dropping damaged conditions"):
            staged = self._stage()
            for key, condition in conditions:
                del staged[f"{key}/{condition}"]
                self._states.pop((key, condition), None)
            self._commit("drop damaged: " + ", ".join(f"{k}/{c}" for k, c in conditions), results=0)
        return [f"{k}/{c}: damaged chunks; dropped, re-captured by this run" for k, c in conditions]


class _FaultStore(zarr.storage.WrapperStore):
    """For kill drills only: a fault point after every write the store makes."""

    async def set(self, key: str, value: Any) -> None:
        await self._store.set(key, value)
        fault_point("store.write")

    async def delete(self, key: str) -> None:
        await self._store.delete(key)
        fault_point("store.write")


@dataclass
class _ConditionState:
    """A condition group's committed layout as the writer tracks it: samples, row counts, the
    per-row shape of each array, coordinate values."""

    samples: set[str]
    tokens: int
    runs: int
    shapes: dict[str, tuple[int, ...]]
    coords: dict[str, np.ndarray]
    patches: int = 0
    # each array's zarr metadata as last committed by this writer (filled as it appends)
    metadata: dict[str, Any] = field(default_factory=dict)
    # each array's committed rows after its last chunk boundary (filled as it appends)
    tails: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def read(cls, group: zarr.Group) -> _ConditionState:
        arrays = dict(group.arrays())
        coords = {name: a[:] for name, a in arrays.items() if list(a.metadata.dimension_names or ()) == [name]}
        shapes = {name: tuple(a.shape[1:]) for name, a in arrays.items() if name not in coords}
        samples = {str(s) for s in arrays["run_sample"][:]} if "run_sample" in arrays else set()
        return cls(samples, _rows_along(arrays, "token"), len(samples), shapes, coords, _rows_along(arrays, PATCH_DIM))

    def offset(self, dim: str) -> int:
        """Rows already committed along a row dim (token, patch or run)."""
        return {"token": self.tokens, PATCH_DIM: self.patches, "run": self.runs}[dim]

    def commit(self, sample_id: str, n_tokens: int, shapes: dict[str, tuple[int, ...]], rows: dict[str, Variable],
               n_patches: int = 0) -> None:
        self.samples.add(sample_id)
        self.tokens += n_tokens
        self.patches += n_patches
        self.runs += 1
        self.shapes.update(shapes)
        for var in rows.values():
            self.coords.update({dim: np.asarray(v) for dim, v in var.coords.items() if dim not in self.coords})


def _check_layout(where: str, rows: dict[str, Variable], known: dict[str, tuple[int, ...]],
                  coords: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Each row's shape and coordinates against what the condition already holds (`known`
    per-row shapes, `coords`)."""
    shapes = {}
    for name, var in rows.items():
        tail = tuple(np.shape(var.data)[1:])
        if name in known and known[name] != tail:
            raise StoreError(f"{name}: shape {tail} per {var.dims[0]} does not match the stored "
                             f"{known[name]} in {where}; write to a new store")
        for dim, values in var.coords.items():
            if dim in coords and not np.array_equal(coords[dim], np.asarray(values)):
                raise StoreError(f"{name}: coordinate {dim} differs from the stored one in {where}")
        shapes[name] = tail
    return shapes


class _Staged:
    """One result's rows as staged for a commit, with what `_ConditionState.commit` needs."""

    def __init__(self, sample_id: str, rows: dict[str, Variable], n_tokens: int, n_patches: int,
                 shapes: dict[str, tuple[int, ...]]):
        self.sample_id, self.rows, self.n_tokens, self.n_patches, self.shapes = sample_id, rows, n_tokens, n_patches, shapes


def _staged_rows(where: str, state: _ConditionState, sample_id: str, variables: dict[str, Variable],
                 input_hash: str, known: _Layout) -> _Staged:
    """A result's variables plus the store's own labels of it (sample, run rows, input hash),
    its shapes and coordinates checked against `known` (what the condition holds so far,
    committed or staged before it in this commit), which then holds it too."""
    if sample_id in state.samples:
        raise StoreError(f"sample {sample_id!r} is already stored for {where}")
    n_tokens = _token_count(variables)
    rows = _stored_rows(where, sample_id, variables)
    rows["run_sample"] = Variable(("run",), np.array([sample_id], dtype=object))
    rows["run_tokens"] = Variable(("run",), np.array([n_tokens], dtype=np.int64))
    rows["run_input"] = Variable(("run",), np.array([input_hash], dtype=object))
    n_patches = _row_count(variables, PATCH_DIM)
    if n_patches is not None:  # vision-tower rows: their own row dim, labelled like tokens
        rows["run_patches"] = Variable(("run",), np.array([n_patches], dtype=np.int64))
    shapes = _check_layout(where, rows, known.shapes, known.coords)
    known.advance(rows)
    return _Staged(sample_id, rows, n_tokens, n_patches or 0, shapes)


def _stored_rows(where: str, sample_id: str, variables: dict[str, Variable]) -> dict[str, Variable]:
    """A result's variables as stored: the labels a reader derives from the run rows (each
    token's sample and position in it, the same per vision-tower row) are checked and left out,
    and the per-run text labels (`run_prompt`, `run_question`, ...) become one JSON object in
    RUN_TEXT."""
    rows: dict[str, Variable] = {}
    text: dict[str, str] = {}
    for name, var in variables.items():
        data = np.asarray(var.data)
        if name in DERIVED_LABELS:
            expected = np.full(len(data), sample_id) if name.endswith("sample") else np.arange(len(data))
            if data.ndim != 1 or not np.array_equal(data, expected):
                raise StoreError(f"{name}: expected {'the sample id' if name.endswith('sample') else '0, 1, 2, ...'} "
                                 f"on every row (the store derives it) in {where}")
        elif name == "modality" and data.dtype.kind in "USO":
            rows[name] = Variable(var.dims, _modality_codes(where, data), var.coords)
        elif name in RUN_TEXT_LABELS:
            if data.shape != (1,):
                raise StoreError(f"{name}: expected one text per run, got shape {data.shape} in {where}")
            text[name] = str(data[0])
        else:
            rows[name] = var
    if text:
        if RUN_TEXT in rows:
            raise StoreError(f"{RUN_TEXT} and {', '.join(text)} in one result in {where}; expected one or the other")
        rows[RUN_TEXT] = Variable(("run",), np.array([json.dumps(text, ensure_ascii=False)], dtype=object))
    return rows


def _modality_codes(where: str, data: np.ndarray) -> np.ndarray:
    """`modality` as stored: int8 codes into MODALITIES (one byte a token instead of a string).
    One comparison per known modality, not a sort of the strings (np.unique): a third of a tiny
    result's staging on the writer's thread."""
    data = data.astype(str, copy=False).reshape(-1)
    codes = np.full(data.shape, -1, dtype=np.int8)
    for code, name in enumerate(MODALITIES):
        codes[data == name] = code
    if (codes < 0).any():
        unknown = sorted(set(data[codes < 0].tolist()))
        raise StoreError(f"modality: {', '.join(map(repr, unknown))} in {where}; expected one of {', '.join(MODALITIES)}")
    return codes


def _rows_along(arrays: dict[str, Any], dim: str) -> int:
    """Rows stored along a row dim (token, patch), from the arrays' shapes."""
    return max((a.shape[0] for a in arrays.values() if a.ndim and (a.metadata.dimension_names or (None,))[0] == dim),
               default=0)


def _same_names(pending: list[_Staged]) -> list[list[_Staged]]:
    """Consecutive results with the same variables: each run is appended as one block."""
    runs: list[list[_Staged]] = []
    for item in pending:
        if runs and set(runs[-1][0].rows) == set(item.rows):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def _concat_rows(parts: list[dict[str, Variable]]) -> dict[str, Variable]:
    """Results' rows joined along each variable's row dim (token, patch or run)."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for name, first in parts[0].items():  # shapes and coordinates agree (checked in _staged_rows)
        data = np.concatenate([np.asarray(p[name].data) for p in parts])
        if data.dtype.kind in "US":  # strings: one conversion of the block (zarr writes objects)
            data = data.astype(object)
        out[name] = Variable(first.dims, data, first.coords)
    return out


class _Layout:
    """Where the next block of a condition goes within one commit: row offsets per row dim, the
    arrays and coordinates that exist (committed, or staged earlier in this commit)."""

    def __init__(self, offsets: dict[str, int], shapes: dict[str, tuple[int, ...]], coords: dict[str, np.ndarray]):
        self.offsets, self.shapes, self.coords = offsets, shapes, coords

    @classmethod
    def of(cls, state: _ConditionState) -> _Layout:
        return cls({dim: state.offset(dim) for dim in ("token", PATCH_DIM, "run")}, dict(state.shapes),
                   dict(state.coords))

    def advance(self, block: dict[str, Variable]) -> None:
        for dim in self.offsets:
            counts = {np.shape(v.data)[0] for v in block.values() if v.dims[0] == dim}
            self.offsets[dim] += counts.pop() if counts else 0
        self.shapes.update({name: tuple(np.shape(v.data)[1:]) for name, v in block.items()})
        for var in block.values():
            self.coords.update({dim: np.asarray(v) for dim, v in var.coords.items() if dim not in self.coords})


def _commit_message(results: list[tuple]) -> str:
    """'model | condition[ + condition...] | sample' (`info --history`); a gathered commit names
    its first and last sample and how many it holds."""
    def joined(values: list[str]) -> str:
        return " + ".join(dict.fromkeys(values))

    samples = list(dict.fromkeys(r[2] for r in results))
    which = samples[0] if len(samples) == 1 else f"{samples[0]} ... {samples[-1]} ({len(samples)} samples)"
    return f"{joined([r[0] for r in results])} | {joined([r[1] for r in results])} | {which}"


def _array_layout(name: str, var: Variable) -> dict[str, Any]:
    """create_array keywords of a new variable: dtype, chunks, codecs (checksum last)."""
    data = np.asarray(var.data)
    dtype = _storage_dtype(data)
    itemsize = 4 if dtype is str else np.dtype(dtype).itemsize
    compressors: list[Any] = []
    if dtype is not str and np.dtype(dtype).kind == "f":
        compressors.append(zarr.codecs.BloscCodec(cname="lz4", clevel=1, shuffle="shuffle"))
    compressors.append(zarr.codecs.Crc32cCodec())  # every chunk carries its checksum
    return {"shape": (0,) + data.shape[1:], "chunks": _chunks((0,) + data.shape[1:], itemsize, var.dims[0]),
            "dtype": dtype, "dimension_names": list(var.dims), "compressors": compressors}


# the zarr metadata of a new, empty array, by its layout: zarr builds one in ~3 ms of Python (codec
# parsing and validation), paid once per process here instead of once per array of every
# condition (an alpha sweep's 8 conditions create ~100 arrays of a few layouts)
_NEW_ARRAYS: dict[tuple, Any] = {}


async def _new_array_metadata(name: str, var: Variable) -> Any:
    """The metadata `_array_layout` gives `var` as a new array named `name` (shape 0 rows),
    built once per layout in a memory store and reused: metadata objects are immutable."""
    from zarr.core.array import init_array
    from zarr.storage import MemoryStore, StorePath

    layout = _array_layout(name, var)
    key = (name, repr(sorted(layout.items())))
    if key not in _NEW_ARRAYS:
        _NEW_ARRAYS[key] = (await init_array(store_path=StorePath(MemoryStore(), name), **layout)).metadata
    return _NEW_ARRAYS[key]


async def _encoded_appends(writes: list[tuple[Any, Any, int, np.ndarray]]) -> None:
    """Write appends without zarr's per-call machinery: each (metadata with the new shape, the
    array's store path, first row, rows through the array's end). Every array's new metadata is
    set in the store first, then its chunks, encoded here by the array's own codecs (zarr's
    synchronous encoders, as its pipeline calls them) and set concurrently in batches of about
    _ENCODED_BATCH_BYTES, so that the encoded copy in memory stays bounded."""
    from zarr.core.buffer import default_buffer_prototype

    prototype = default_buffer_prototype()
    # the new shapes first: a chunk beyond an array's stored shape would be refused
    await _settled([(path / key).set(buf) for meta, path, _, _ in writes
                    for key, buf in meta.to_buffer_dict(prototype).items()])
    batch, size = [], 0
    for meta, path, start, data in writes:
        for key, encoded in _encoded_chunks(meta, start, data, prototype):
            batch.append((path / key).set(encoded))
            size += len(encoded)
            if size >= _ENCODED_BATCH_BYTES:
                await _settled(batch)
                batch, size = [], 0
    await _settled(batch)


def _encoded_chunks(meta: Any, start: int, data: np.ndarray, prototype: Any) -> Iterator[tuple[str, Any]]:
    """(chunk key, encoded bytes) of every chunk that rows `data`, written from row `start` (a
    chunk boundary) to the array's end, touch. No stored rows need merging: an edge chunk is
    padded with the fill value as zarr pads it, and every chunk is written, as
    `array.write_empty_chunks` asks."""
    from zarr.core.array_spec import ArrayConfig
    from zarr.core.codec_pipeline import codecs_from_list, fill_value_or_default
    from zarr.core.indexing import BasicIndexer

    config = ArrayConfig.from_dict({})
    array_array, array_bytes, bytes_bytes = codecs_from_list(meta.codecs)
    value = data.astype(meta.data_type.to_native_dtype(), copy=False) if data.dtype.kind == "O" else data
    selection = (slice(start, start + len(data)),) + (slice(None),) * (data.ndim - 1)
    for coords, chunk_selection, out_selection, _ in BasicIndexer(selection, meta.shape, meta.chunk_grid):
        spec = meta.get_chunk_spec(coords, config, prototype)
        rows = value[out_selection]
        if rows.shape != spec.shape:  # an edge chunk: padded as zarr pads it
            encoded = prototype.nd_buffer.create(shape=spec.shape, dtype=spec.dtype.to_native_dtype(),
                                                 order=spec.order, fill_value=fill_value_or_default(spec))
            encoded[chunk_selection] = prototype.nd_buffer.from_ndarray_like(rows)
        else:
            encoded = prototype.nd_buffer.from_ndarray_like(np.ascontiguousarray(rows))
        for codec in array_array:
            encoded, spec = codec._encode_sync(encoded, spec), codec.resolve_metadata(spec)
        encoded, spec = array_bytes._encode_sync(encoded, spec), array_bytes.resolve_metadata(spec)
        for codec in bytes_bytes:
            encoded, spec = codec._encode_sync(encoded, spec), codec.resolve_metadata(spec)
        yield meta.encode_chunk_key(coords), encoded


async def _settled(writes: list[Any]) -> None:
    """Await every write, then raise the first failure: a write still in flight in the store's
    threads when the error reaches the caller (who may then exit) can abort the interpreter."""
    import asyncio

    for outcome in await asyncio.gather(*writes, return_exceptions=True):
        if isinstance(outcome, BaseException):
            raise outcome


def _token_count(variables: dict[str, Variable]) -> int:
    count = _row_count(variables, "token")
    if count is None:
        raise StoreError("no token variables: expected the token labels position/modality/token_id")
    return count


ROW_NAMES = {"token": "tokens", PATCH_DIM: "patches"}


def _row_count(variables: dict[str, Variable], dim: str) -> int | None:
    """The number of rows the variables with leading `dim` share (None: there are none)."""
    lengths = {v.data.shape[0] for v in variables.values() if v.dims[0] == dim}
    if len(lengths) > 1:
        raise StoreError(f"{dim} variables disagree on the number of {ROW_NAMES.get(dim, dim)}: {sorted(lengths)}")
    return lengths.pop() if lengths else None


# -- verification --------------------------------------------------------------------------------


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


def _root_of(repo: Any, session: Any) -> zarr.Group:
    """The root group of a snapshot; an empty one for a repository created but never committed to
    (a run killed before its first result). A later snapshot without a root is damage."""
    try:
        return zarr.open_group(session.store, mode="r", zarr_format=3)
    except zarr.errors.GroupNotFoundError:
        try:
            first = len(list(repo.ancestry(snapshot_id=session.snapshot_id))) == 1
        except Exception as err:
            raise StoreError(f"snapshot {session.snapshot_id} is unreadable: {_short(err)}") from None
        if not first:
            raise StoreError(f"snapshot {session.snapshot_id} has no root group: its metadata is damaged") from None
        return zarr.open_group(zarr.storage.MemoryStore(), mode="w", zarr_format=3)


def _snapshot_problem(repo: Any, session: Any = None) -> str | None:
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


def _repair_metadata(path: Path | ObjectStore) -> list[str]:
    from .repair import repair

    return repair(path)


def _row_samples(group: zarr.Group) -> tuple[np.ndarray, list[str]]:
    """(cumulative token ends, sample ids) of a condition group, for naming damaged rows."""
    try:
        samples = [str(s) for s in group["run_sample"][:]]
        counts = np.asarray(group["run_tokens"][:], dtype=np.int64)
    except Exception:  # the run table itself is damaged: rows cannot be named
        return np.zeros(0, dtype=np.int64), []
    return np.cumsum(counts), samples


def verify_store(path: str | Path | ObjectStore, progress: bool = False) -> list[Damage]:
    """Read every chunk of the committed snapshot and check it (CRC-32C, decompression, presence).
    Returns what is damaged; an empty list means everything read back."""
    path = location(path)
    if not is_store(path):
        raise StorePathError(f"no workbench store at {path}")
    from .repair import diagnose

    diagnosis = diagnose(path)
    if diagnosis is not None:  # chunks are found through the metadata: they are checked after its repair
        return [Damage("", "", diagnosis.kind, None, [], diagnosis.problem, diagnosis.report(path))]
    return _verify_repo(_open_repo(path), path, progress)


def _array_extents(repo: Any, snapshot: str) -> dict[str, tuple[str, int, int]]:
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


def _condition_groups(root: zarr.Group) -> list[tuple[str, str, zarr.Group]]:
    """(model key, condition, group) of every condition group, in order."""
    return [(k, c, g) for k, m in sorted(root.groups()) for c, g in sorted(m.groups())]


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


def _verify_repo(repo: Any, path: Path | ObjectStore, progress: bool = False,
                 only: dict[str, set[int]] | None = None) -> list[Damage]:
    """Read back the branch's snapshot; `only`: just these row chunks of these arrays (`_blocks_since`)."""
    problem = _snapshot_problem(repo)
    if problem is not None:
        return [Damage("", "", "snapshot", None, [], problem)]
    root = _root_of(repo, repo.readonly_session(branch=BRANCH))
    damage: list[Damage] = []
    groups = _condition_groups(root)
    from tqdm.auto import tqdm

    if only is not None:
        touched = {tuple(p.split("/")[:2]) for p in only}
        groups = [(k, c, g) for k, c, g in groups if (k, c) in touched]
    for key, condition, group in tqdm(groups, disable=not progress, unit="condition", desc="verify"):
        ends, samples = _row_samples(group)
        for name, array in sorted(group.arrays()):
            blocks = None if only is None else only.get(f"{key}/{condition}/{name}")
            if only is None or blocks:
                damage += _verify_array(key, condition, name, array, ends, samples, blocks)
    return damage


def _verify_array(key: str, condition: str, name: str, array: Any, ends: np.ndarray, samples: list[str],
                  blocks: set[int] | None = None) -> list[Damage]:
    """Read `array` one row chunk at a time (`blocks`: only these row chunks)."""
    found = []
    leading = (array.metadata.dimension_names or (None,))[0]
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


# -- reading -----------------------------------------------------------------------------------


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


def _open_condition(store: Any, model: str, condition: str, attrs: dict[str, Any]) -> tuple[xr.Dataset, ...]:
    """(token part, run part, patch part) of one condition group, labeled."""
    ds = xr.open_zarr(store, group=f"{model}/{condition}", consolidated=False, chunks={}, zarr_format=3)
    ds = _with_derived_labels(ds, f"{model}/{condition}").rename_vars({"run_tokens": "n_tokens"})
    ds.attrs = {}
    sweep = {name: _sweep_label(value) for name, value in (attrs.get("sweep") or {}).items()}
    tokens = ds[[v for v in ds.data_vars if "token" in ds[v].dims]]
    n = tokens.sizes.get("token", 0)
    tokens = tokens.assign_coords(
        condition=("token", np.full(n, condition, dtype=object).astype(str)),
        **{name: ("token", np.full(n, value)) for name, value in sweep.items()},
    )
    tokens = tokens.set_coords([v for v in (*TOKEN_LABELS, *TEXT_LABELS) if v in tokens.data_vars])
    runs = ds[[v for v in ds.data_vars if "run" in ds[v].dims]]
    m = runs.sizes.get("run", 0)
    runs = runs.assign_coords(
        run_condition=("run", np.full(m, condition, dtype=object).astype(str)),
        **{RUN_PREFIX + name: ("run", np.full(m, value)) for name, value in sweep.items()},
    ).set_coords([c for c in ("run_sample", "run_input", *TEXT_LABELS) if c in runs.data_vars])
    patches = ds[[v for v in ds.data_vars if PATCH_DIM in ds[v].dims]]
    k = patches.sizes.get(PATCH_DIM, 0)
    patches = patches.assign_coords(
        patch_condition=(PATCH_DIM, np.full(k, condition, dtype=object).astype(str)),
        **{PATCH_PREFIX + name: (PATCH_DIM, np.full(k, value)) for name, value in sweep.items()},
    ).set_coords([c for c in PATCH_LABELS if c in patches.data_vars])
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
    return ds.set_index({dim: levels}) if levels and index else ds


def _model_groups(root: zarr.Group) -> list[tuple[str, zarr.Group]]:
    return sorted(root.groups())


def list_models(path: str | Path, snapshot: str | None = None) -> list[str]:
    with _reading(location(path)):
        root = _root_of(*_read_session(location(path), snapshot))
        return [g.attrs.get("model_id", name) for name, g in _model_groups(root)]


def _sweep_label(value: Any) -> float | str:
    """A sweep value as a label: a number as float; a word (a kv_swap part set) as itself."""
    return value if isinstance(value, str) else float(value)


def _concat(parts: list[xr.Dataset], dim: str, fill: dict[str, str]) -> xr.Dataset:
    # a condition without a sweep variable gets NaN there (baseline has no alpha), or "" where
    # the variable's values are words (parts=keys)
    words = {c for part in parts for c in fill if c in part.coords and part[c].dtype.kind in "UO"}
    for i, part in enumerate(parts):
        size = part.sizes.get(dim, 0)
        parts[i] = part.assign_coords({c: (dim, np.full(size, "" if c in words else np.nan)) for c in fill
                                       if c not in part.coords})
    return xr.concat(parts, dim=dim, data_vars="minimal", coords="minimal", compat="override", join="outer")


def _open_model(store: Any, root: zarr.Group, key: str, index: bool = True) -> xr.Dataset:
    model_group = root[key]
    token_parts, run_parts, patch_parts, sweep_vars = [], [], [], []
    for condition, group in sorted(model_group.groups()):
        attrs = dict(group.attrs)
        sweep_vars += [name for name in attrs.get("sweep") or {} if name not in sweep_vars]
        tokens, runs, patches = _open_condition(store, key, condition, attrs)
        token_parts.append(tokens)
        run_parts.append(runs)
        patch_parts.append(patches)
    if not token_parts:
        return xr.Dataset(attrs=dict(model_group.attrs))
    tokens = _concat(token_parts, "token", {v: v for v in sweep_vars})
    runs = _concat(run_parts, "run", {RUN_PREFIX + v: v for v in sweep_vars})
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
    attrs = {**dict(model_group.attrs), "provenance": json.dumps(root.attrs.get("provenance", []))}
    ds.attrs = {k: v for k, v in attrs.items() if v is not None}
    return ds


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
    repo, session = _read_session(path, snapshot)
    root = _root_of(repo, session)
    if model is not None:
        key = model_key(model)
        if key not in root:
            held = ", ".join(g.attrs.get("model_id", k) for k, g in _model_groups(root)) or "no model yet"
            raise StoreError(f"model {model!r} is not in store {path}; it holds: {held}")
        return _open_model(session.store, root, key, index)
    children = {key: xr.DataTree(_open_model(session.store, root, key, index)) for key, _ in _model_groups(root)}
    tree = xr.DataTree(children=children)
    tree.attrs = {k: (json.dumps(v) if k == "provenance" else v) for k, v in root.attrs.items()}
    return tree


def store_history(path: str | Path) -> list[dict[str, Any]]:
    """Every snapshot of the store's branch, newest first: id, time, message, tags."""
    repo, _ = _read_session(location(path))
    tags: dict[str, list[str]] = {}
    for tag in repo.list_tags():
        tags.setdefault(repo.lookup_tag(tag), []).append(tag)
    return [{"snapshot": s.id, "time": s.written_at.isoformat(timespec="seconds"), "message": s.message,
             "tags": sorted(tags.get(s.id, []))} for s in repo.ancestry(branch=BRANCH)]


def store_info(path: str | Path, snapshot: str | None = None) -> dict[str, Any]:
    """What a store holds: per model and condition, samples, tokens, variables, layers and
    identity, read from its last commit (or `snapshot`)."""
    with _reading(location(path)):
        return _info(location(path), snapshot)


def _info(path: Path | ObjectStore, snapshot: str | None) -> dict[str, Any]:
    repo, session = _read_session(path, snapshot)
    root = _root_of(repo, session)
    info: dict[str, Any] = {"path": str(path), "models": {}, "runs": len(root.attrs.get("provenance", [])),
                            "snapshot": session.snapshot_id, "bytes": _disk_bytes(path)}
    for key, model in _model_groups(root):
        conditions = {}
        for condition, group in sorted(model.groups()):
            n_runs = group["run_sample"].shape[0] if "run_sample" in group else 0
            arrays = dict(group.arrays())
            n_tokens = _rows_along(arrays, "token")
            variables = {
                name: {"dims": list(a.metadata.dimension_names or ()), "shape": list(a.shape)}
                for name, a in sorted(arrays.items())
                # labels, per-run records and coordinate arrays (named after their own dim) are not data
                if name not in (*RUN_LABELS, *TOKEN_LABELS, *PATCH_LABELS, *TEXT_LABELS, RUN_TEXT) and list(a.metadata.dimension_names or ()) != [name]
            }
            conditions[condition] = {
                "samples": int(n_runs),
                "tokens": int(n_tokens),
                "variables": variables,
                "layers": [int(x) for x in group["layer"][:]] if "layer" in group else [],
                "nonfinite_runs": int((np.asarray(group["nonfinite"][:]) > 0).sum()) if "nonfinite" in group else 0,
                "sweep": dict(group.attrs.get("sweep") or {}),
                "identity": dict(group.attrs.get("identity") or {}),
            }
        info["models"][model.attrs.get("model_id", key)] = {"key": key, "conditions": conditions, **{
            k: v for k, v in model.attrs.items() if k in ("family", "n_layers", "hidden_size", "revision", "dtype", "device")
        }}
    return info


def _disk_bytes(path: Path | ObjectStore) -> int | None:
    if isinstance(path, ObjectStore):
        return None  # not listed: the bucket's own tools tell its size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
