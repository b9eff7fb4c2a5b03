"""`StoreWriter`: results appended and committed, one icechunk commit per batch, on a local store
(one writer, locked) or an object store (several writers, re-staged on conflict); run tags,
compaction, and the repair a run starts with."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import zarr
from zarr.abc.store import Store

from .. import verified
from ..errors import StoreError, StorePathError
from ..names import reserved_name_problem
from .appending import append_block
from .layout import _ZARR_WRITE_CONFIG, Variable
from .objects import ObjectStore, _short, location
from .paths import (
    _ABANDONED_WRITES, StoreIOError, _FaultStore, _NoLock, _WriterLock, check_store_path, fault_point, io_failure,
)
from .readers import compact
from .repair import repair as _repair_metadata
from .repository import (
    BRANCH, RUN_END, RUN_TAG, STORE_FORMAT, _icechunk, _open_repo, _repo_config, _root_of, _storage, array_at, group_at,
    is_store, json_dict, json_list, model_key, read_all,
)
from .staging import (
    MODEL_IDENTITY, StoredResult, StoreIdentityError, _commit_message, _concat_rows, _ConditionState, _jsonable,
    _Layout, _same_names, _Staged, _staged_rows, identity_diff,
)
from .verify import Damage, _array_extents, _blocks_since, _verify_repo

if TYPE_CHECKING:
    import icechunk


# The writer keeps arrays' partial last chunk rows in memory (`appending`), so that an append
# does not read them back and decode them: _TAIL_CACHE_BYTES in all
_TAIL_CACHE_BYTES = 64 << 20


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
        self._lock: _WriterLock | _NoLock = _WriterLock(real, self.path) if isinstance(real, Path) else _NoLock()
        try:
            # damaged metadata (branch pointer, config, the branch's snapshot): back to the newest
            # intact snapshot first, so the run re-captures only what that snapshot lacks
            self.repairs: list[str] = _repair_metadata(real) if is_store(real) else []
            # a new store is created with its first commit: a run that fails before any result
            # leaves nothing behind but the lock file
            self.repo: icechunk.Repository | None = self._open_existing(real) if is_store(real) else None
        except BaseException:
            self._lock.release()
            raise
        self._session: icechunk.Session | None = None
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
        self.compacted: dict[str, int] = {}  # what the run's compaction deleted
        self.checked = ""  # what the last `damage_since_check` read
        self._checked_state: verified.Ledger | None = None

    def _open_existing(self, real: Path | ObjectStore) -> icechunk.Repository:
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

    @property
    def _local(self) -> Path:
        """The real path of a local store (what only a local store's writer does reads it)."""
        if not isinstance(self._real, Path):
            raise AssertionError(f"{self.path} is an object store, not a local one")
        return self._real

    def _create_repo(self) -> icechunk.Repository:
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

    def _create_local_repo(self) -> icechunk.Repository:
        """icechunk writes a new repository's first snapshot before its branch: a kill in between
        would leave a directory that is neither empty nor a store, which the rerun must refuse.
        So it is created beside the store and renamed into place (rename is atomic, and replaces
        the empty directory a user may have made). A leftover from a killed creation is this
        writer's own (it holds the lock, whose file made the parent directory) and is removed."""
        ic = _icechunk()
        real = self._local
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
            store: Store = self._session.store
            if os.environ.get("WORKBENCH_KILL_AT", "").startswith("store.write:"):
                store = _FaultStore(store)
            self._root = zarr.open_group(store, mode="a", zarr_format=3)
        return self._root

    def _commit(self, message: str, results: int = 1) -> str:
        """Commit what is staged, holding `results` results of this run (counted in `commits`).
        BranchMovedError if another writer committed since the session began (nothing committed)."""
        if self._session is None:
            raise AssertionError("a commit follows `_stage`")
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
        if key not in root or condition not in group_at(root, key):
            return
        stored = json_dict(group_at(root, f"{key}/{condition}").attrs.get("identity"))
        diff = identity_diff(stored, _jsonable(identity))
        if diff:
            raise StoreIdentityError(
                f"condition {condition!r} of {model_id} in {self.path} was stored with another meaning:\n    "
                + "\n    ".join(diff),
                hint="give the changed condition a new name, or write to a new store (--store)")

    def committed_conditions(self, model_id: str) -> set[str]:
        """Names of the conditions of `model_id` the committed store holds."""
        root = self.committed_root()
        key = model_key(model_id)
        return set(group_at(root, key).group_keys()) if key in root else set()

    def committed_inputs(self, model_id: str, condition: str) -> dict[str, str]:
        """sample id -> input hash of every committed sample of (model, condition), in order."""
        root = self.committed_root()
        key = model_key(model_id)
        if key not in root or condition not in group_at(root, key):
            return {}
        group = group_at(root, f"{key}/{condition}")
        samples = [str(s) for s in read_all(array_at(group, "run_sample"))] if "run_sample" in group else []
        hashes = [str(s) for s in read_all(array_at(group, "run_input"))] if "run_input" in group else [""] * len(samples)
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
        return self.write_samples([StoredResult(model_id, condition, sample_id, variables, condition_attrs, input_hash)])

    def write_samples(self, results: Sequence[StoredResult]) -> str:
        """`_write_once`, on an object store retried while other writers commit first: each try
        discards its session, starts one on the new branch tip (which rereads the touched
        conditions' layout and the root's provenance list), stages the same results again and
        commits, after a short random wait (at most COMMIT_TRIES tries). Returns the snapshot id."""
        batch = [StoredResult(*result) for result in results]  # plain tuples in the same field order too
        if not self.shared:
            return self._write_once(batch)
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
                snapshot = self._write_once(batch, note=f" (try {tries})" if tries > 1 else "")
        return snapshot

    def _write_once(self, results: list[StoredResult], note: str = "") -> str:
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
        staged: list[tuple[_ConditionState, list[_Staged], dict[str, np.ndarray]]] = []
        with zarr.config.set(_ZARR_WRITE_CONFIG), self._io(f"writing {what}"), self._discard_on_error(set(self._states)):
            root = self._stage()
            by_condition: dict[tuple[str, str], list[StoredResult]] = {}
            for result in results:
                by_condition.setdefault((result.model_id, result.condition), []).append(result)
            for (model_id, condition), items in by_condition.items():
                group = self._condition_group(root, model_id, condition, items[0].condition_attrs or {})
                state = self._state(model_id, condition, group)
                # each result is checked against what is committed and the results before it
                known = _Layout.of(state)
                pending = [_staged_rows(group.path, state, sample_id, variables, input_hash, known)
                           for _, _, sample_id, variables, _, input_hash in items]
                layout = _Layout.of(state)
                tails = dict(state.tails)  # the state's own copy changes only once committed
                # the group's arrays in this session: one read of their metadata, all at once
                arrays = dict(group.arrays()) if state.shapes else {}
                for run in _same_names(pending):
                    block = _concat_rows([p.rows for p in run])
                    append_block(group, arrays, block, layout, tails)
                    layout.advance(block)
                staged.append((state, pending, tails))
            if self._pending_provenance is not None:
                root.attrs["provenance"] = [*json_list(root.attrs.get("provenance")), *self._pending_provenance]
            snapshot = self._commit(what + note, len(results))
        if self._pending_provenance is not None:
            self._provenance_written += self._pending_provenance
        self._pending_provenance = None
        for state, pending, tails in staged:
            for item in pending:
                state.commit(item.sample_id, item.n_tokens, item.shapes, item.rows, item.n_patches)
            state.tails = tails
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
            return group_at(root, f"{key}/{condition}")
        # each group's attributes in one metadata write (`attrs.update` rewrites it once per key)
        if "workbench_format" not in root.attrs:
            root.update_attributes({"workbench_format": STORE_FORMAT, "provenance": []})
        if key not in root:
            root.create_group(key, attributes=self._models.get(model_id) or {"model_id": model_id})
        model = group_at(root, key)
        if condition not in model:
            return model.create_group(condition, attributes=_jsonable({**attrs, "condition": condition}))
        return group_at(model, condition)

    def _state(self, model_id: str, condition: str, group: zarr.Group) -> _ConditionState:
        """What this writer knows of a condition's committed arrays (read once, then kept)."""
        key = (model_key(model_id), condition)
        if key not in self._states:
            self._states[key] = _ConditionState.read(group)
        return self._states[key]

    # -- the end of a run, and repair -----------------------------------------------------------
    def finish_run(self) -> str | None:
        """Tag the current snapshot `run-<n>` (n counts the store's runs), a past state users can
        read back with `open_store(path, snapshot="run-<n>")`; then move the branch to a copy of
        that snapshot (RUN_END, a fallback for `repair`) and compact (`readers.compact`):
        the per-sample snapshots before it are expired and the chunks only they referenced deleted
        (every append rewrites the partial last chunk of each array, so old versions pile up),
        except what a live reader's announced snapshot needs.
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
        n = len(json_list(self.committed_root().attrs.get("provenance")))
        tag = RUN_TAG.format(n)
        with self._io("tagging the run"):
            if tag in self.repo.list_tags():
                self.repo.delete_tag(tag)
            self.repo.create_tag(tag, self.repo.lookup_branch(BRANCH))
            # the branch moves to a copy of the tagged snapshot (same chunks, its own snapshot and
            # manifest files): a damaged branch snapshot is then repaired back to the tag's, the
            # newest intact one, which compaction no longer leaves anything older than
            self._tip = self.repo.rewrite_manifests(RUN_END.format(tag), branch=BRANCH)
            try:
                self.compacted = compact(self.repo, self._local)
            except Exception as err:  # an old tag's damaged metadata: compaction waits, the data is fine
                if io_failure(err):
                    raise
                self.compaction_skipped = _short(err)
        return tag

    def _tag_shared_run(self) -> str | None:
        records = json_list(self.committed_root().attrs.get("provenance"))
        own = [i for i, r in enumerate(records) if r in self._provenance_written]
        if not own or self._tip is None or self.repo is None:
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
        ledger, now = verified.load(self._local), verified.file_stats(self._local)
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
                verified.save(self._local, self._checked_state)
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
                group = group_at(root, f"{key}/{condition}")
                stored = {str(s) for s in read_all(array_at(group, "run_sample"))} if "run_sample" in group else set()
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
