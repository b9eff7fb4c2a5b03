"""The runner: for every model x sample x condition, one trace, written to the store at once.

Order of work: all plans are compiled first (nothing runs if any model cannot do what the spec
asks); then per model, per sample, per condition. A (model, sample, condition) already committed
in the store is skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata as _md
import itertools
import json
import logging
import os
import platform
import signal
import sys
import threading
import warnings
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
from tqdm.auto import tqdm

from .checks import nonfinite_report
from .errors import Interrupted, Terminated
from .models.protocol import ClientModel
from .plan import ModelPlan, compile_plan
from .sites import VARIABLE_DIMS  # dims of every stored capture, from the site registry
from .store import StoreWriter, Variable

_LOG = logging.getLogger("workbench.runner")
_VERSIONED = ("torch", "transformers", "nnsight", "zarr", "xarray", "numpy")


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


def package_versions() -> dict[str, str | None]:
    from . import __version__

    # the source's own version: the distribution is named vlm-workbench, and a checkout on
    # PYTHONPATH has none installed
    versions: dict[str, str | None] = {"workbench": __version__}
    for name in _VERSIONED:
        try:
            versions[name] = _md.version(name)
        except _md.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(spec: Any, command: list[str] | None = None) -> dict[str, Any]:
    """What a run was: the spec as written and as it ran (after CLI overrides), the command line,
    versions, time."""
    return {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "spec_name": spec.name,
        "spec_hash": spec.spec_hash,
        "spec": spec.source_text,
        "effective_spec": spec.model_dump(mode="json", by_alias=True),
        "overrides": dict(getattr(spec, "_overrides", {}) or {}),
        "command": list(sys.argv if command is None else command),
        "models": list(spec.models),
        "versions": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def data_identity(data: Any) -> dict[str, Any]:
    """What decides which inputs a condition's samples are: everything in `data` but how many."""
    return {k: v for k, v in data.model_dump(mode="json").items() if k != "n"}


def condition_identity(spec: Any, plan: ModelPlan, condition: Any) -> dict[str, Any]:
    """A stored condition's meaning: resolved interventions, image mode, kv_swap, sweep values,
    data source and seed, capture layout. A resume with another identity is refused."""
    return {**condition.store_attrs(), "data": data_identity(spec.data), "capture": repr(plan.capture)}


def check_resume(store: StoreWriter, spec: Any, plans: list[ModelPlan],
                 hashes: dict[str, str]) -> dict[tuple[str, str], set[str]]:
    """Refuse, before any model loads, a resume that would mix meanings under one name: a
    condition whose identity changed, or a stored sample whose input changed under its id
    (`hashes`: sample id -> input hash). Returns the samples already stored per (model, condition)."""
    from .plan import condition_names, renamed_runs
    from .store import StoreIdentityError

    done = {}  # only the conditions the store holds: a sweep's names are generated, not held
    for plan in plans:
        held = store.committed_conditions(plan.info.model_id)
        renamed = renamed_runs(held, plan.conditions)
        if renamed:
            raise StoreIdentityError(f"{plan.info.model_id}: {renamed}",
                                     hint="write to a new store (--store); this one still opens and analyses as it is")
        for i, name in enumerate(condition_names(plan.conditions)):
            if name not in held:
                continue
            condition = plan.conditions[i]
            store.check_condition(plan.info.model_id, condition.name, condition_identity(spec, plan, condition))
            stored = store.committed_inputs(plan.info.model_id, condition.name)
            changed = [sid for sid, h in stored.items() if h and sid in hashes and hashes[sid] != h]
            if changed:
                raise StoreIdentityError(
                    f"{len(changed)} sample(s) of {plan.info.model_id} / {condition.name} changed since they were "
                    f"stored under the same id (e.g. {changed[0]}: its image or question differs)",
                    hint="write to a new store (--store), or restore the original inputs")
            done[(plan.info.model_id, condition.name)] = set(stored)
    return done


def compile_all(spec: Any) -> list[ModelPlan]:
    """Every model's plan; a model that cannot be read is reported at its place in the spec."""
    from .models.refs import resolve_model

    plans = []
    for i, model_id in enumerate(spec.models):
        where = (f"command line: --models[{i}]" if "models" in spec.overrides
                 else spec.problem(("models", i), "").format(spec.source).rstrip(": "))
        plans.append(compile_plan(spec, resolve_model(model_id, where)))
    return plans


def preflight_positions(spec: Any, plans: list[ModelPlan], samples: Iterable[Any]) -> None:
    """Explicit token positions are checked against every sample's sequence before anything
    runs (this encodes the prompts with each model's processor; no weights are loaded)."""
    from .models.model import InputEncoder
    from .plan import check_positions, explicit_positions

    if not explicit_positions(spec):
        return
    modes = sorted({c.image for p in plans for c in p.conditions})
    for plan in plans:
        encoder = InputEncoder(plan.info)
        lengths = {m: [(s.id, encoder.encode(s.image, s.question, m).n_tokens) for s in samples] for m in modes}
        check_positions(spec, plan.info, lengths)


def sample_variables(inputs: Any, result: Any, coords: dict[str, dict[str, np.ndarray]],
                     text: dict[str, Variable] | None = None) -> dict[str, Variable]:
    """The store's variables for one run: token labels plus every capture, with their dims, and
    the readable labels of `text_labels`."""
    variables = {
        "position": Variable(("token",), np.arange(inputs.n_tokens, dtype=np.int64)),
        "modality": Variable(("token",), inputs.modality.astype(str)),
        "token_id": Variable(("token",), inputs.input_ids.astype(np.int64)),
        **(text or {}),
    }
    for name, data in {**result.tokens, **result.run, **result.patches}.items():
        variables[name] = Variable(VARIABLE_DIMS[name], data, coords.get(name, {}))
    if result.patches:  # each patch's index within its sample's tower rows
        n_patches = next(iter(result.patches.values())).shape[0]
        variables["patch_position"] = Variable(("vision_patch",), np.arange(n_patches, dtype=np.int64))
    return variables


class TokenTexts:
    """Each token id decoded on its own (`token_text`), remembered per id: a run meets the same
    ids again and again (image placeholders, the chat template), and a decode call per token
    cost more than the rest of a tiny model's labels."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.texts: dict[int, str] = {}
        self.prompts: dict[tuple[int, ...], str] = {}  # the last sample's prompts: its conditions share them

    def __call__(self, ids: list[int]) -> list[str]:
        new = [i for i in dict.fromkeys(ids) if i not in self.texts]
        if new:
            decoded = self.tokenizer.batch_decode([[i] for i in new], skip_special_tokens=False,
                                                  clean_up_tokenization_spaces=False)
            self.texts.update(zip(new, decoded))
        return [self.texts[i] for i in ids]

    def prompt(self, ids: list[int]) -> str:
        """The whole prompt decoded (special tokens kept), once per distinct prompt of a sample."""
        key = tuple(ids)
        if key not in self.prompts:
            if len(self.prompts) >= 8:
                self.prompts.clear()
            self.prompts[key] = self.tokenizer.decode(ids, skip_special_tokens=False)
        return self.prompts[key]


def text_labels(tokenizer: Any, inputs: Any, sample: Any, result: Any,
                token_texts: TokenTexts | None = None) -> dict[str, Variable]:
    """What a reader wants next to the ids: each token decoded on its own (`token_text`), and per
    run the prompt as the model saw it, the question, the generated text (with a `logits`
    capture; `run_response`: the same cut before the first special token, e.g. the end of the
    turn, with special tokens dropped: what the accuracy analysis scores) and the sample's
    category, answer, scoring mode (`run_eval_mode`, "" where the sample has none) and every
    accepted answer (`run_all_answers`, a JSON list)."""
    ids = np.asarray(inputs.input_ids).reshape(-1).tolist()
    token_texts = token_texts or TokenTexts(tokenizer)
    tokens = token_texts(ids)
    generated = result.run.get("generated")
    labels = {
        "token_text": Variable(("token",), np.array(tokens, dtype=object)),
        "run_prompt": Variable(("run",), np.array([token_texts.prompt(ids)], dtype=object)),
        "run_question": Variable(("run",), np.array([sample.question], dtype=object)),
        "run_category": Variable(("run",), np.array([sample.category or ""], dtype=object)),
        "run_answer": Variable(("run",), np.array([sample.answer or ""], dtype=object)),
        "run_eval_mode": Variable(("run",), np.array([sample.eval_mode or ""], dtype=object)),
        "run_all_answers": Variable(("run",), np.array([json.dumps(list(sample.all_answers))], dtype=object)),
    }
    if generated is not None:
        steps = [int(i) for i in np.asarray(generated).reshape(-1)]
        text = tokenizer.decode(steps, skip_special_tokens=False)
        labels["run_generated_text"] = Variable(("run",), np.array([text], dtype=object))
        labels["run_response"] = Variable(("run",), np.array([response_text(tokenizer, steps)], dtype=object))
    return labels


def response_text(tokenizer: Any, ids: list[int]) -> str:
    """The generated ids as an answer: cut before the first special token (the end of the turn;
    greedy decoding runs its fixed number of steps past it), decoded, stripped."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    end = next((i for i, token in enumerate(ids) if token in special), len(ids))
    return tokenizer.decode(ids[:end], skip_special_tokens=True).strip()


def run_spec(
    spec: Any,
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
    from .worklist import SampleStream, count_done, pending_runs, survey

    log = log or _LOG.info
    backend = spec.backend
    remote_config = None
    if remote is not None or getattr(backend, "kind", "local") == "remote":
        from .backends.remote import RemoteConfig

        remote_config = RemoteConfig.resolve(remote, getattr(backend, "kind", "local"))
    device = device if device != "auto" else getattr(backend, "device", "auto")
    dtype = dtype if dtype != "auto" else getattr(backend, "dtype", "auto")
    if remote_config is None:
        from .models.model import pick_device

        pick_device(device)  # a missing GPU is refused before anything is loaded or written
    plans = compile_all(spec)
    samples = SampleStream(spec.data, shard)  # read afresh on each pass, never all held (workbench/worklist.py)
    hashes = survey(samples)  # every sample read once: a file that cannot be decoded is refused before any write
    preflight_positions(spec, plans, samples)
    _log_unbatched(getattr(backend, "batch_size", 1), plans, log)
    remote_models: dict[str, ClientModel] = {}
    if remote_config is not None:
        from .backends.remote import prepare_remote

        # the key, versions and served models are checked before the store is created or opened
        remote_models = prepare_remote(plans, remote_config, log)
    # a new store is created only once the first remote result is in: a run that fails at its
    # first job (a refused request, an error in the trace) leaves nothing on disk
    first = None
    if remote_models and hashes and not Path(spec.store.path).exists():
        plan, sample = plans[0], next(iter(samples))
        first = ((plan.info.model_id, sample.id), _execute_remote_sample(
            remote_models[plan.info.model_id], LazyInputs(remote_models[plan.info.model_id], sample),
            list(plan.conditions), plan, remote_config, tqdm(disable=True), log))
        first = (first[0], list(first[1]))
    summary = RunSummary(store=str(spec.store.path))
    with StoreWriter(spec.store.path) as store:
        summary.repairs = store.repairs + store.repair(set(hashes))
        _LOG.debug(f"store check: read {store.checked}")
        for repair in summary.repairs:
            log(f"repaired: {repair}")
        done = check_resume(store, spec, plans, hashes)
        summary.total = sum(len(hashes) * len(p.conditions) for p in plans)
        summary.skipped = count_done(plans, hashes, done)
        todo = pending_runs(plans, samples, done)  # generated as the loop takes them
        if summary.skipped:
            log(f"resuming: {summary.skipped} of {summary.total} (model, sample, condition) results "
                f"are already in {spec.store.path}; skipping them")
        if summary.skipped == summary.total:
            return summary
        record = provenance(spec, command)
        if shard is not None:
            record["shard"] = list(shard)
        if remote_config is not None:
            record["backend"] = remote_config.describe()  # where it ran; never the API key
        store.add_provenance(record)
        # stderr, and only on a terminal (disable=None): logs of a batch job get no bar
        bar = tqdm(total=summary.total - summary.skipped, disable=None if progress else True, unit="run", dynamic_ncols=True, file=sys.stderr)
        run = _Run(spec, store, summary, hashes, bar, log, device, dtype, remote_config, remote_models, first)
        try:
            with known_warnings_silenced(), result_writer(store, spec, summary, bar, remote_config, log) as writer:
                run.todo(todo, writer)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM through the CLI's handler
            bar.close()
            stored = summary.skipped + summary.written
            raise Interrupted(f"interrupted: {stored} of {summary.total} stored; rerun to resume",
                              terminated=isinstance(exc, Terminated)) from None
        bar.close()
        summary.tag = store.finish_run()
    return summary


class _Run:
    """The loop of one run: per model, per sample, its conditions' traces, each result handed to
    the store writer."""

    def __init__(self, spec: Any, store: StoreWriter, summary: RunSummary, hashes: dict[str, str], bar: Any,
                 log: Callable[[str], None], device: str, dtype: str, remote_config: Any,
                 remote_models: dict[str, ClientModel], first: Any):
        self.spec, self.store, self.summary, self.hashes, self.bar, self.log = spec, store, summary, hashes, bar, log
        self.device, self.dtype, self.remote_config = device, dtype, remote_config
        self.remote_models, self.first = remote_models, first
        self.submitted = 0
        self.token_texts: TokenTexts | None = None  # the current model's
        # each condition's store attributes, built once: they are the same for all its results
        # (a pydantic dump and the capture plan's repr per result were a sixth of a tiny result's labels)
        self.condition_attrs: dict[tuple[str, str], dict[str, Any]] = {}

    def todo(self, todo: Iterable[tuple], writer: Any) -> None:
        model, model_id = None, None
        for _, window in itertools.groupby(todo, key=self._window_key()):
            window = list(window)
            plan = window[0][0]
            if plan.info.model_id != model_id:
                del model  # free the previous model before loading the next
                model_id = plan.info.model_id
                self.bar.set_description(f"loading {model_id}")
                # attention probabilities are computed from q and k (capture.attention_probabilities),
                # under the implementation NDIF also runs: no eager switch, locally or remotely
                model = self.remote_models.get(model_id) or _load_model(
                    plan, self.device, self.dtype, "sdpa", self.remote_config, self.log,
                    getattr(self.spec.backend, "device_map", None))
                # the analysis definitions the spec chose travel with the data (workbench.definitions);
                # a JSON string, as netCDF attributes cannot hold a mapping (ds.to_netcdf)
                definitions = json.dumps(self.spec.analysis.model_dump(), sort_keys=True)
                self.store.ensure_model(model_id, {**model.describe(), "definitions": definitions})
                self.token_texts = TokenTexts(model.tokenizer)
                if self.remote_config is None and plan.batch_size > 1:
                    from .backends.local import unbatched_notes

                    for line in unbatched_notes(model, plan):
                        self.log(line)
            # (sample, its inputs, its conditions still to run), in todo order
            samples = []
            for _, runs in itertools.groupby(window, key=lambda t: t[1].id):
                runs = list(runs)
                samples.append((runs[0][1], LazyInputs(model, runs[0][1]), [c for _, _, c in runs]))
            sample, inputs_by_image, conditions = samples[0]  # remotely, a window is one sample
            if self.first is not None and self.first[0] == (model_id, sample.id):
                pairs, self.first = self.first[1], None  # run before the store existed (see run_spec)
            elif self.remote_config is not None:
                pairs = _execute_remote_sample(model, inputs_by_image, conditions, plan, self.remote_config,
                                               self.bar, self.log)
            else:
                pairs = None
            if pairs is None:
                results = _execute_window(model, samples, plan, self.bar)
            else:  # groups of (condition, result) of that one sample
                results = ([(sample, inputs_by_image, c, r) for c, r in group] for group in pairs)
            for group in results:  # one forward's results (of one sample or several): committed together
                stored = [self._variables(model, plan, sample, inputs_by_image, condition, result)
                          for sample, inputs_by_image, condition, result in group]
                with signals_deferred():
                    _signal_drill(self.submitted)
                    writer.put_group(stored)
                    self.submitted += len(stored)

    def _window_key(self) -> Callable[[tuple], tuple]:
        """The todo entries that may share forwards: per model, consecutive samples holding up to
        2 x `batch_size` runs locally (a window bounds the inputs held at once and lets
        `group_rows` pack samples of like shapes), each sample on its own remotely (one NDIF job
        per sample)."""
        state = {"model": None, "sample": None, "window": 0, "runs": 0}

        def key(entry: tuple) -> tuple:
            plan, sample = entry[0], entry[1]
            room = 2 * max(1, plan.batch_size)
            if plan.info.model_id != state["model"]:
                state.update(model=plan.info.model_id, sample=sample.id, window=state["window"] + 1, runs=0)
            elif sample.id != state["sample"]:
                state["sample"] = sample.id
                if self.remote_config is not None or plan.batch_size <= 1 or state["runs"] >= room:
                    state.update(window=state["window"] + 1, runs=0)
            state["runs"] += 1
            return plan.info.model_id, state["window"]

        return key

    def _variables(self, model: ClientModel, plan: ModelPlan, sample: Any, inputs_by_image: LazyInputs, condition: Any,
                   result: Any) -> tuple:
        """One result as the writer takes it: (model, condition, sample, variables, attrs, input hash)."""
        model_id = plan.info.model_id
        inputs = inputs_by_image[condition.image]
        variables = sample_variables(inputs, result, plan.capture.coords(),
                                     text_labels(model.tokenizer, inputs, sample, result, self.token_texts))
        problems = nonfinite_report(variables)
        variables["nonfinite"] = Variable(("run",), np.array([len(problems)], dtype=np.int64))
        for line in problems:
            self.summary.nonfinite.append(f"{model_id} | {sample.id} | {condition.name} | {line}")
            _LOG.warning(f"non-finite capture: {self.summary.nonfinite[-1]}")
        key = (model_id, condition.name)
        if key not in self.condition_attrs:
            self.condition_attrs[key] = {**condition.store_attrs(), "identity": condition_identity(self.spec, plan, condition)}
        return model_id, condition.name, sample.id, variables, self.condition_attrs[key], self.hashes[sample.id]


def _log_unbatched(batch_size: int, plans: list[ModelPlan], log: Callable[[str], None]) -> None:
    """Say which runs `backend.batch_size` does not batch, and why."""
    if batch_size <= 1:
        return
    swaps = sorted({c.name for plan in plans for c in plan.conditions if c.kv_swap is not None})
    if swaps:
        log(f"note: {', '.join(swaps)} run unbatched: a KV swap edits its own cache between a truncated "
            "prefill and a decode step")


@contextlib.contextmanager
def result_writer(store: StoreWriter, spec: Any, summary: RunSummary, bar: Any, remote_config: Any = None,
                  log: Callable[[str], None] = _LOG.info) -> Any:
    """The background writer (or, with `backend.write_queue_mb: 0`, a synchronous one), counting
    committed results into `summary` and the progress bar."""
    from .writer import BackgroundWriter, SyncWriter

    def written(*_: str) -> None:
        summary.written += 1
        bar.update(1)

    queue_mb = spec.backend.write_queue_mb
    if queue_mb and remote_config is not None and remote_config.simulated:
        # nnsight's remote="local" pops every non-installed module from sys.modules, process-wide,
        # while it deserializes a request: a writer thread importing (icechunk, zarr, ...) in that
        # window gets half-built modules. So the simulation writes between traces, on this thread.
        log("note: nnsight's local simulation hides modules process-wide; results are written "
            "synchronously (no background writer)")
        queue_mb = 0
    interval = spec.backend.commit_interval_s
    writer = BackgroundWriter(store, queue_mb << 20, written, interval) if queue_mb else SyncWriter(store, written)
    with writer:
        yield writer


@contextlib.contextmanager
def known_warnings_silenced() -> Any:
    """The local backend passes `past_key_values` on purpose (see backends/local.py:
    _cache_kwargs): silence transformers' rename notice for the runs inside this block only, not
    process-wide at import."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*`past_key_values` is deprecated.*", category=FutureWarning)
        yield


@contextlib.contextmanager
def signals_deferred() -> Any:
    """Hold SIGINT and SIGTERM while a sample is written: one arriving meanwhile takes effect
    right after the write commits, so an interrupt never cuts a write (the store's commit
    protocol would repair it, but a clean stop needs no repair). Main thread only. A signal
    that was ignored when the write began is left ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    # a signal the process was started ignoring stays ignored (POSIX: a background job's SIGINT)
    held = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if received:
            signal.raise_signal(received[0])


def _signal_drill(written: int) -> None:
    """Interrupt drills: `WORKBENCH_SIGNAL_AT=<SIGINT|SIGTERM>:<n>` sends this process that signal
    while the n-th sample of this run is being written (tests check the write completes and the
    run stops cleanly). Unset, it costs one lookup."""
    target = os.environ.get("WORKBENCH_SIGNAL_AT")
    if target:
        name, _, count = target.partition(":")
        if written + 1 == int(count):
            os.kill(os.getpid(), getattr(signal, name))


class LazyInputs(dict):
    """A sample's model inputs per image mode (real, blank, none), encoded on first use."""

    def __init__(self, model: ClientModel, sample: Any):
        super().__init__()
        self.model, self.sample = model, sample

    def __missing__(self, image_mode: str) -> Any:
        self[image_mode] = self.model.encode(self.sample.image, self.sample.question, image_mode)
        return self[image_mode]


def _load_model(plan: ModelPlan, device: str, dtype: str, attn: str, remote: Any, log: Callable[[str], None],
                device_map: str | None = None) -> ClientModel:
    if remote is None:
        from .models.model import WorkbenchModel

        return WorkbenchModel(plan.info, device=device, dtype=dtype, attn=attn, device_map=device_map)
    from .backends.remote import load_remote_model

    return load_remote_model(plan.info, remote, attn=attn, log=log)


def _execute_window(model: ClientModel, samples: list[tuple[Any, LazyInputs, list[Any]]], plan: ModelPlan,
                    bar: Any) -> Any:
    """Consecutive samples' runs on this machine as forwards of up to `plan.batch_size` rows
    (`backends.local.group_rows`: rows of one sample or of several, padded where their prompts
    differ), each forward's results yielded as one group of (sample, inputs, condition, result)
    before the next forward runs."""
    from .backends.local import group_rows, pad_requirements, padding_limit, run_rows
    from .store import fault_point

    jobs = [(sample, inputs_by_image, condition) for sample, inputs_by_image, conditions in samples
            for condition in conditions]
    groups = group_rows([(inputs_by_image, condition) for _, inputs_by_image, condition in jobs], plan.batch_size,
                        model.arch.per_token_keys, padding_limit(model, plan.capture), pad_requirements(model),
                        model.arch.deepstack)
    for group in groups:
        rows = [jobs[i] for i in group]
        ids = list(dict.fromkeys(sample.id for sample, _, _ in rows))
        names = list(dict.fromkeys(condition.name for _, _, condition in rows))
        # shown at the bar's next update: a forced redraw per forward cost ~20 us (a tiny forward's 0.3 %)
        bar.set_description(f"{plan.info.model_id} | {ids[0] if len(ids) == 1 else f'{len(ids)} samples'} | "
                            f"{names[0] if len(names) == 1 else f'{len(names)} conditions'}", refresh=False)
        results = run_rows(model, [(inputs_by_image, condition) for _, inputs_by_image, condition in rows], plan,
                           on_trace=fault_point)
        yield [(sample, inputs_by_image, condition, result)
               for (sample, inputs_by_image, condition), result in zip(rows, results)]


def _execute_remote_sample(model: ClientModel, inputs_by_image: LazyInputs, conditions: list[Any], plan: ModelPlan,
                           remote: Any, bar: Any, log: Callable[[str], None]) -> Any:
    """One sample's conditions in one remote job (batched there as locally), its results yielded
    as groups of one (condition, result) each. Local runs go through `_execute_window`."""
    from .backends.remote import run_sample

    sample_id = inputs_by_image.sample.id
    bar.set_description(f"{plan.info.model_id} | {sample_id} | {len(conditions)} condition(s) on {remote.label}")
    results = run_sample(model, inputs_by_image, conditions, plan, remote, log=log,
                         what=f"{plan.info.model_id} | {sample_id}")
    for condition in conditions:
        yield [(condition, results[condition.name])]
