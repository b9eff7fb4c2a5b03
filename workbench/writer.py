"""The background writer: results are committed to the store on a thread while the next forward
runs, so compression and commits overlap compute.

Memory stays bounded: the captures waiting in the queue are capped in bytes (`max_bytes`), and
`put` blocks while a new result would exceed the cap (one result is always admitted, however
large), and a gathered commit's joined copy counts against the cap while it is written. Results
are committed in the order they were put. The thread gathers what arrives within
`commit_interval` seconds of its last commit into one store commit (`StoreWriter.write_samples`;
while it is behind, everything already waiting, up to a quarter of the cap):
a commit's fixed cost (about 12 arrays' metadata and chunks per condition and the icechunk commit, ~35 ms of CPU on a 2-vCPU VM)
is then paid once per interval instead of once per forward, which is what lets the workbench run
near a plain loop's speed on a fast forward. The interval stretches with what commits cost
(`pace`: commits take about COMMIT_SHARE of the time). A gathered commit is still atomic, so a crash or kill
loses no committed result and leaves nothing torn: what was queued but not committed (at most
an interval's worth, or the queue's) is simply captured again by the next run. `close()` (also on
Ctrl-C, through the context manager) writes what is queued before returning; an error in the
thread is raised in the caller at the next `put` or at `close`. With `commit_interval=0` each
`put_group` (one batched forward's results) is its own commit.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, NamedTuple, Protocol

from .store import StoredResult, StoreWriter, Variable

_STOP = object()
# captures gathered into one commit while the writer keeps up: results wait in memory for their
# commit, so this bounds what a run holds beyond the forward (peak RSS stays flat in the number
# of samples). A commit never goes over it by taking one more result (a result larger than half
# of it is committed alone), so large results are committed as they come; small ones share a
# commit's fixed cost (~20-25 ms a condition) with hundreds of others: a tiny result's commit
# cost 0.40-0.49 ms in commits of 128 against 0.55-0.72 ms in commits of 110 and 18, what the
# 16 MiB cap before this made of a 128-sample run (benchmarks/README.md)
GATHER_BYTES = 32 << 20
# While it falls behind (a fast forward: a GPU), a commit takes everything already waiting, up to
# this share of the queue's cap: those results are in memory anyway, and a commit's fixed cost is
# per condition it touches (~35 ms for ~12 arrays), so an alpha sweep's commits of one result per
# condition cost twice or more per result what commits of several do (a 4 MB result: 57 ms CPU
# in commits of 4, 21 ms in commits of 88; benchmarks/README.md)
BACKLOG_SHARE = 4
# A commit's cost hardly depends on what it holds (~100 ms for a condition of tiny results on
# this project's 2-vCPU CI machine), so a fixed interval would cost a fixed share of a fast run:
# after a commit that took d seconds the writer gathers for at least d * (1 / COMMIT_SHARE - 1),
# so that commits take about COMMIT_SHARE of the run's time, but never longer than PACE_LIMIT_S
# (what a kill can lose) unless `commit_interval` itself is longer. 2 %, not 5 %: a run's whole
# budget over a plain loop is 5 % at real size and 25 % on a fast forward, of which nnsight's
# tracing alone takes ~9 % (benchmarks/README.md, section 8); a second more of uncommitted work
# at a kill is captured again by the rerun
COMMIT_SHARE = 0.02
PACE_LIMIT_S = 10.0


class _Queued(NamedTuple):
    """A `put_group`'s results waiting for the writer thread, with their captures' bytes."""

    size: int
    results: list[StoredResult]


class ResultSink(Protocol):
    """What the runner's loop hands each forward's results to (`BackgroundWriter`, `SyncWriter`)."""

    def put_group(self, results: list[StoredResult]) -> None:
        """Take results to be committed together."""


def captured_bytes(variables: dict[str, Variable]) -> int:
    return sum(getattr(v.data, "nbytes", 0) for v in variables.values())


class _Writer:
    """What the runner calls: `put` one result, or `put_group` results committed together."""

    def put(self, model_id: str, condition: str, sample_id: str, variables: dict[str, Variable],
            condition_attrs: dict[str, Any] | None = None, input_hash: str = "") -> None:
        self.put_group([StoredResult(model_id, condition, sample_id, variables, condition_attrs, input_hash)])

    def put_group(self, results: list[StoredResult]) -> None:
        raise NotImplementedError


class BackgroundWriter(_Writer):
    """`put` results; a thread writes them with `StoreWriter.write_samples`. A context manager."""

    def __init__(self, store: StoreWriter, max_bytes: int = 1 << 30,
                 on_written: Callable[[str, str, str], None] | None = None, commit_interval: float = 0.0):
        self.store = store
        self.max_bytes = max_bytes
        self.commit_interval = commit_interval
        self.commits = 0
        self._gather_bytes = min(GATHER_BYTES, max(1, max_bytes // 2))
        self._backlog_bytes = max(self._gather_bytes, max_bytes // BACKLOG_SHARE)
        self._cut = threading.Event()  # commit now: the caller waits for room, or a stop
        self._closing = False
        self.on_written = on_written or (lambda model, condition, sample: None)
        self.queued_bytes = 0  # captures put and not yet committed (those being written included)
        self._waiting_bytes = 0  # of those, the ones no commit has taken yet
        self.peak_bytes = 0
        self._room = threading.Condition()
        self._queue: queue.Queue = queue.Queue()
        self._carried: _Queued | None = None  # taken from the queue, left for the next commit (no room in the last)
        self._error: BaseException | None = None
        self._last_commit = time.monotonic()
        self._last_commit_s = 0.0  # how long the last commit took (wall)
        self._thread = threading.Thread(target=self._work, name="workbench-store-writer", daemon=True)
        self._thread.start()

    # -- the caller's side ---------------------------------------------------------------------
    def put_group(self, results: list[StoredResult]) -> None:
        """Queue results to be committed together (`StoreWriter.write_samples`)."""
        size = sum(captured_bytes(r.variables) for r in results)
        with self._room:
            while self.queued_bytes and self.queued_bytes + size > self.max_bytes and self._error is None:
                self._cut.set()  # no room: the thread commits what it holds now
                self._room.wait(0.05)
            self._raise_error()
            self.queued_bytes += size
            self._waiting_bytes += size
            self.peak_bytes = max(self.peak_bytes, self.queued_bytes)
            self._queue.put(_Queued(size, results))  # before the cut, so the thread finds it queued
            # a commit's worth is waiting, or one more result like this one would not fit in it:
            # commit it now (large results are then committed as they come, holding no second one
            # in memory; what is being written does not count, or every commit would be cut at
            # about half its size while the one before it is written)
            if self._waiting_bytes + max(size, 1) > self._gather_bytes:
                self._cut.set()

    def close(self) -> None:
        """Write everything queued, stop the thread, raise its error if it had one."""
        if self._thread.is_alive():
            self._closing = True  # no more waiting out intervals: write what is queued, then stop
            self._queue.put(_STOP)
            self._cut.set()
            self._thread.join()
        self._raise_error()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        try:
            self.close()  # also on Ctrl-C: the results already captured are committed
        except BaseException:
            if error is None:
                raise  # the writer's own error is the one to see; otherwise the caller's wins

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            self._drain()
            raise error

    # -- the thread ----------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item, self._carried = self._carried or self._queue.get(), None  # idle until there is something to write
            if item is _STOP:
                return
            if self.commit_interval > 0 and not self._closing:
                # sleep out the interval instead of waking per put: a woken writer takes the GIL
                # from the forward's thread (measured: a fifth of a tiny run's wall time)
                self._cut.wait(max(0.0, self._last_commit + self.pace() - time.monotonic()))
                self._cut.clear()
            gathered, size, stop = self._gather(item)
            # a commit of several results joins each condition's rows into one block per array, a
            # copy of at most their size: it counts against the queue's cap while it is written
            copy = size if len(gathered) > 1 or len(gathered[0].results) > 1 else 0
            with self._room:
                self._waiting_bytes -= size
                self.queued_bytes += copy
                if self._carried is not None or self._waiting_bytes >= self._gather_bytes:
                    # a backlog of another commit's worth, or a result this one had no room for:
                    # no interval to wait out (it would have been in this commit but for the cap)
                    self._cut.set()
            try:
                if self._error is None:
                    self._write([r for item in gathered for r in item.results], [item.results for item in gathered])
            except BaseException as err:  # reported to the caller; later items are dropped
                self._error = err
                stop = True
            finally:
                with self._room:
                    self.queued_bytes -= size + copy
                    self._room.notify_all()
            if stop:
                return

    def pace(self) -> float:
        """Seconds to gather before the next commit: `commit_interval`, stretched so that commits
        take about COMMIT_SHARE of the time (at most PACE_LIMIT_S)."""
        stretched = min(PACE_LIMIT_S, self._last_commit_s * (1 / COMMIT_SHARE - 1))
        return max(self.commit_interval, stretched)

    def _gather(self, first: _Queued) -> tuple[list[_Queued], int, bool]:
        """`first` and what is queued behind it, up to GATHER_BYTES of captures (or half the
        queue's bytes); where two commits' worth or more already wait (the writer is behind),
        everything waiting, up to BACKLOG_SHARE of the queue's cap. A result that would take the
        commit over its limit waits for the next one. Returns them, their bytes and whether a
        stop came. With commit_interval 0, `first` alone: a commit per put_group."""
        gathered, size = [first], first.size
        with self._room:
            waiting = self._waiting_bytes
        limit = self._gather_bytes if waiting < 2 * self._gather_bytes else min(waiting, self._backlog_bytes)
        while self.commit_interval > 0 and size < limit:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                return gathered, size, True
            if size + item.size > limit:
                self._carried = item
                break
            gathered.append(item)
            size += item.size
        return gathered, size, False

    def _write(self, results: list[StoredResult], groups: list[list[StoredResult]]) -> None:
        """One commit of everything gathered; if the store refuses it (a result it cannot take),
        each put_group again on its own, so every result before the bad one is committed."""
        from .store import StoreError, StoreIOError

        started = time.monotonic()
        try:
            self.store.write_samples(results)
        except StoreError as err:
            if len(groups) == 1 or isinstance(err, StoreIOError):
                raise
            for group in groups:
                self.store.write_samples(group)
                self.commits += 1
                self._written(group)
        else:
            self.commits += 1
            self._written(results)
        finally:
            self._last_commit = time.monotonic()
            self._last_commit_s = self._last_commit - started

    def _written(self, results: list[StoredResult]) -> None:
        for result in results:
            self.on_written(result.model_id, result.condition, result.sample_id)

    def _drain(self) -> None:
        """After an error: stop the thread without writing what is still queued."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()


class SyncWriter(_Writer):
    """The same interface, writing each result before `put` returns (`backend.write_queue_mb: 0`)."""

    def __init__(self, store: StoreWriter, on_written: Callable[[str, str, str], None] | None = None):
        self.store = store
        self.on_written = on_written or (lambda model, condition, sample: None)

    def put_group(self, results: list[StoredResult]) -> None:
        self.store.write_samples(results)
        for result in results:
            self.on_written(result.model_id, result.condition, result.sample_id)

    def __enter__(self) -> SyncWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None
