"""The runner: for every model x sample x condition, one trace, written to the store at once.

The flow of `run_spec`: the spec's plans (all compiled first: nothing runs if any model cannot
do what the spec asks), the executor that runs their traces (`workbench.executors`, local or
NDIF, chosen once), the store's answer for what it already holds (`workbench.resume`), then
per model, per sample, per condition the traces, each result labelled (`workbench.labels`) and
handed to the store writer (`workbench.writer`). A (model, sample, condition) already committed
in the store is skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np
from tqdm.std import tqdm

from .checks import nonfinite_report
from .errors import BadInputError, Interrupted, Terminated
from .executors import Executor, LazyInputs, Outcome, SampleWork, choose_executor
from .labels import TokenTexts, sample_variables, text_labels
from .plan import ModelPlan, compile_plan
from .progress import library_bars_off, progress_bar
from .provenance import provenance
from .resume import condition_identity, resume_state
from .signals import signal_drill, signals_deferred
from .spec.problems import _dotted
from .spec.schema import remote_attribution_problems
from .store import StoreWriter, Variable
from .writer import ResultSink, StoredResult

if TYPE_CHECKING:
    from .data import Sample
    from .models.protocol import ClientModel
    from .spec import Spec
    from .worklist import PendingRun

_LOG = logging.getLogger("workbench.runner")


@dataclass
class RunSummary:
    store: str
    written: int = 0
    skipped: int = 0
    total: int = 0
    repairs: list[str] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)  # model | sample | condition | variable layer: counts
    tag: str | None = None  # the snapshot tag of this run's last commit (`open_store(..., snapshot=tag)`)


def tune_allocator() -> bool:
    """glibc: serve large allocations from the heap and keep freed memory, so each sample's
    temporaries reuse the last sample's pages instead of being faulted in and zeroed again
    (benchmarks/: store writes 0.27-0.39x -> 0.84-0.93x of np.save); and one arena for all
    threads, or each thread that ever held a capture (the writer, zarr's codec pool) keeps its
    own high-water mark (peak RSS over 1 -> 16 samples of a 2048-wide model: x1.19 -> x1.10).
    For the capture process only; returns whether glibc accepted it (elsewhere a no-op)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    return (bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, (1 << 31) - 1))
            and bool(libc.mallopt(m_arena_max, 1)))


def compile_all(spec: Spec) -> list[ModelPlan]:
    """Every model's plan; a model that cannot be read is reported at its place in the spec."""
    from .models.refs import resolve_model

    plans = []
    for i, model_id in enumerate(spec.models):
        where = (f"command line: --models[{i}]" if "models" in spec.overrides
                 else spec.problem(("models", i), "").format(spec.source).rstrip(": "))
        plans.append(compile_plan(spec, resolve_model(model_id, where)))
    return plans


def preflight_positions(spec: Spec, plans: list[ModelPlan], samples: Iterable[Sample]) -> None:
    """Explicit token positions are checked against every sample's sequence before anything
    runs (this encodes the prompts with each model's processor; no weights are loaded)."""
    from .models.model import InputEncoder
    from .plan import check_positions, explicit_positions

    if not explicit_positions(spec):
        return
    modes = sorted({c.image for p in plans for c in p.conditions})
    for plan in plans:
        encoder = InputEncoder(plan.info)
        lengths: dict[str, list[tuple[str, int]]] = {m: [(s.id, encoder.encode(s.image, s.question, m).n_tokens) for s in samples] for m in modes}
        check_positions(spec, plan.info, lengths)


def run_spec(
    spec: Spec,
    *,
    device: str = "auto",
    dtype: str = "auto",
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    remote: Any = None,
    command: list[str] | None = None,
    shard: tuple[int, int] | None = None,
) -> RunSummary:
    """Run every (model, sample, condition) of `spec` not yet in its store.

    remote: None runs where the spec's `backend.kind` says; False runs locally; True (NDIF),
    "local" (nnsight's in-process simulation), a server URL or a
    `workbench.backends.remote.RemoteConfig` run remotely: one job per sample, covering that
    sample's conditions not yet stored (see workbench.backends.remote).

    shard: (k, n) runs only samples k, k+n, k+2n, ... (0 <= k < n): n processes with k = 0..n-1
    share the work, each into its own store, and `workbench merge` joins their stores.

    log: where progress notes go (default: the `workbench.runner` logger at INFO). Ctrl-C or
    SIGTERM (raised as `Terminated` by the CLI) stop it between samples, never inside a write,
    with `Interrupted` saying how much is stored: results already captured are committed first.

    Results are committed by a background writer (`workbench.writer`) while the next forward
    runs, through a queue of at most `backend.write_queue_mb` MB (0: each result is written
    before the next forward), what arrives within `backend.commit_interval_s` seconds as one
    commit."""
    from .worklist import SampleStream, survey

    log = log or _LOG.info
    # `run --remote` of a spec whose backend is local: refused as validate refuses a remote backend's
    problems = remote_attribution_problems(spec, remote=remote not in (None, False))
    if problems:
        raise BadInputError(f"{_dotted(problems[0][0])}: {problems[0][1]}")
    executor = choose_executor(spec, remote, device, dtype, log)  # where the traces run, for the whole run
    plans = compile_all(spec)
    samples = SampleStream(spec.data, shard)  # read afresh on each pass, never all held (workbench/worklist.py)
    hashes = survey(samples)  # every sample read once: a file that cannot be decoded is refused before any write
    preflight_positions(spec, plans, samples)
    _log_unbatched(spec.backend.batch_size, plans, log)
    executor.prepare(plans, samples, Path(spec.store.path).exists())
    summary = RunSummary(store=str(spec.store.path))
    with StoreWriter(spec.store.path) as store:
        state = resume_state(store, spec, plans, hashes, log)
        _LOG.debug(f"store check: read {store.checked}")
        summary.repairs, summary.total, summary.skipped = state.repairs, state.total, state.skipped
        if summary.skipped:
            log(f"resuming: {summary.skipped} of {summary.total} (model, sample, condition) results "
                f"are already in {spec.store.path}; skipping them")
        if state.finished:
            return summary
        record = provenance(spec, command)
        if shard is not None:
            record["shard"] = list(shard)
        if executor.describe() is not None:
            record["backend"] = executor.describe()
        store.add_provenance(record)
        # stderr, and only on a terminal or in a notebook: logs of a batch job get no bar
        bar = progress_bar(summary.total - summary.skipped, unit="run", enabled=progress)
        run = _Run(RunContext(spec, store, executor, summary, hashes, bar, log))
        try:
            with known_warnings_silenced(), library_bars_off(not progress), result_writer(store, spec, summary, bar, executor.write_note(), log) as writer:
                run.todo(state.pending(plans, samples), writer)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM through the CLI's handler
            bar.close()
            stored = summary.skipped + summary.written
            raise Interrupted(f"interrupted: {stored} of {summary.total} stored; rerun to resume",
                              terminated=isinstance(exc, Terminated)) from None
        bar.close()
        summary.tag = store.finish_run()
    return summary


@dataclass(frozen=True)
class RunContext:
    """What the loop of one run works with: the spec, its open store, the executor its traces
    run on, the summary it counts into, each sample's input hash, the progress bar, the log."""

    spec: Spec
    store: StoreWriter
    executor: Executor
    summary: RunSummary
    hashes: dict[str, str]
    bar: tqdm
    log: Callable[[str], None] = _LOG.info


class _Run:
    """The loop of one run: per model, per window of samples, the executor's outcomes, each
    labelled and handed to the store writer."""

    def __init__(self, context: RunContext):
        self.context = context
        self.submitted = 0
        self.token_texts: TokenTexts | None = None  # the current model's
        # each condition's store attributes, built once: they are the same for all its results
        # (a pydantic dump and the capture plan's repr per result were a sixth of a tiny result's labels)
        self.condition_attrs: dict[tuple[str, str], dict[str, Any]] = {}

    def todo(self, todo: Iterable[PendingRun], writer: ResultSink) -> None:
        """Every pending run, in order; `writer` takes each forward's results (`put_group`)."""
        context = self.context
        model, model_id = None, None
        for _, entries in itertools.groupby(todo, key=self._window_key()):
            window = list(entries)
            plan = window[0].plan
            if plan.info.model_id != model_id:
                del model  # free the previous model before loading the next
                model_id = plan.info.model_id
                model = self._load(plan)
            assert model is not None  # loaded with the window's first model
            work = [SampleWork(runs[0].sample, LazyInputs(model, runs[0].sample), [r.condition for r in runs])
                    for runs in (list(g) for _, g in itertools.groupby(window, key=lambda r: r.sample.id))]
            for group in context.executor.execute(model, work, plan, context.bar):
                # one forward's results (of one sample or several): committed together
                stored = [self._stored(model, plan, outcome) for outcome in group]
                with signals_deferred():
                    signal_drill(self.submitted)
                    writer.put_group(stored)
                    self.submitted += len(stored)

    def _load(self, plan: ModelPlan) -> ClientModel:
        context = self.context
        model_id = plan.info.model_id
        context.bar.set_description(f"loading {model_id}")
        model = context.executor.load(plan)
        # the analysis definitions the spec chose travel with the data (workbench.definitions);
        # a JSON string, as netCDF attributes cannot hold a mapping (ds.to_netcdf)
        definitions = json.dumps(context.spec.analysis.model_dump(), sort_keys=True)
        context.store.ensure_model(model_id, {**model.describe(), "definitions": definitions})
        self.token_texts = TokenTexts(model.tokenizer)
        for line in context.executor.notes(model, plan):
            context.log(line)
        return model

    def _window_key(self) -> Callable[[PendingRun], tuple[str, int]]:
        """The pending runs that may share forwards: per model, consecutive samples holding up to
        2 x `batch_size` runs where the executor shares windows (a window bounds the inputs held
        at once and lets `group_rows` pack samples of like shapes), else `samples_per_job`
        consecutive samples (remotely: one NDIF job, one nnsight session, for them all)."""
        shares = self.context.executor.shares_windows
        per_job = max(1, self.context.executor.samples_per_job)
        state: dict[str, Any] = {"model": None, "sample": None, "window": 0, "runs": 0, "samples": 1}

        def key(entry: PendingRun) -> tuple[str, int]:
            plan, sample = entry.plan, entry.sample
            room = 2 * max(1, plan.batch_size)
            if plan.info.model_id != state["model"]:
                state.update(model=plan.info.model_id, sample=sample.id, window=state["window"] + 1, runs=0,
                             samples=1)
            elif sample.id != state["sample"]:
                state["sample"] = sample.id
                state["samples"] += 1
                if (not shares and state["samples"] > per_job) or (shares and (plan.batch_size <= 1
                                                                              or state["runs"] >= room)):
                    state.update(window=state["window"] + 1, runs=0, samples=1)
            state["runs"] += 1
            return plan.info.model_id, state["window"]

        return key

    def _stored(self, model: ClientModel, plan: ModelPlan, outcome: Outcome) -> StoredResult:
        """One outcome as the writer takes it: its captures, labels and non-finite counts."""
        context = self.context
        sample, condition, result = outcome.sample, outcome.condition, outcome.result
        model_id = plan.info.model_id
        inputs = outcome.inputs[condition.image]
        variables = sample_variables(inputs, result, plan.capture.coords(),
                                     text_labels(model.tokenizer, inputs, sample, result, self.token_texts))
        problems = nonfinite_report(variables)
        variables["nonfinite"] = Variable(("run",), np.array([len(problems)], dtype=np.int64))
        for line in problems:
            context.summary.nonfinite.append(f"{model_id} | {sample.id} | {condition.name} | {line}")
            _LOG.warning(f"non-finite capture: {context.summary.nonfinite[-1]}")
        key = (model_id, condition.name)
        if key not in self.condition_attrs:
            self.condition_attrs[key] = {**condition.store_attrs(),
                                         "identity": condition_identity(context.spec, plan, condition)}
        return StoredResult(model_id, condition.name, sample.id, variables, self.condition_attrs[key],
                            context.hashes[sample.id])


def _log_unbatched(batch_size: int, plans: list[ModelPlan], log: Callable[[str], None]) -> None:
    """Say which runs `backend.batch_size` does not batch, and why."""
    if batch_size <= 1:
        return
    swaps = sorted({c.name for plan in plans for c in plan.conditions if c.kv_swap is not None})
    if swaps:
        log(f"note: {', '.join(swaps)} run unbatched: a KV swap edits its own cache between a truncated "
            "prefill and a decode step")


@contextlib.contextmanager
def result_writer(store: StoreWriter, spec: Spec, summary: RunSummary, bar: tqdm, synchronous: str | None = None,
                  log: Callable[[str], None] = _LOG.info) -> Iterator[ResultSink]:
    """The background writer (or, with `backend.write_queue_mb: 0`, a synchronous one), counting
    committed results into `summary` and the progress bar. synchronous: why this run's results
    must be written on its own thread (the executor's `write_note`, logged), or None."""
    from .writer import BackgroundWriter, SyncWriter

    def written(*_: str) -> None:
        summary.written += 1
        bar.update(1)

    queue_mb = spec.backend.write_queue_mb
    if queue_mb and synchronous:
        log(synchronous)
        queue_mb = 0
    interval = spec.backend.commit_interval_s
    writer = BackgroundWriter(store, queue_mb << 20, written, interval) if queue_mb else SyncWriter(store, written)
    with writer:
        yield writer


@contextlib.contextmanager
def known_warnings_silenced() -> Iterator[None]:
    """The local backend passes `past_key_values` on purpose (see backends/local.py:
    _cache_kwargs): silence transformers' rename notice for the runs inside this block only, not
    process-wide at import."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*`past_key_values` is deprecated.*", category=FutureWarning)
        yield
