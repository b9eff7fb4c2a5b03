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
import logging
import os
import platform
import signal
import sys
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from .checks import nonfinite_report
from .errors import Interrupted, Terminated
from .plan import ModelPlan, compile_plan
from .store import StoreWriter, Variable

# dims of every stored capture (see workbench.capture)
VARIABLE_DIMS = {
    "hidden": ("token", "layer", "dim"),
    "keys": ("token", "decoder_layer", "kv"),
    "values": ("token", "decoder_layer", "kv"),
    "prefill_vision_mass": ("token", "decoder_layer", "head"),
    "decode_attention": ("token", "step", "decoder_layer", "head"),
    "logprobs": ("run", "step", "vocab"),
    "generated": ("run", "step"),
    "embed": ("token", "dim"),
    "final_norm": ("token", "dim"),
}
_LOG = logging.getLogger("workbench.runner")
_VERSIONED = ("workbench", "torch", "transformers", "nnsight", "zarr", "xarray", "numpy")


@dataclass
class RunSummary:
    store: str
    written: int = 0
    skipped: int = 0
    total: int = 0
    repairs: list[str] = field(default_factory=list)
    nonfinite: list[str] = field(default_factory=list)  # model | sample | condition | variable layer: counts


def tune_allocator() -> bool:
    """glibc: serve large allocations from the heap and keep freed memory, so each sample's
    temporaries reuse the last sample's pages instead of being faulted in and zeroed again
    (benchmarks/: store writes 0.27-0.39x -> 0.84-0.93x of np.save). For the capture process
    only; returns whether glibc accepted it (elsewhere a no-op)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, (1 << 31) - 1))


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = _md.version(name)
        except _md.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(spec: Any) -> dict[str, Any]:
    return {
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "spec_name": spec.name,
        "spec_hash": spec.spec_hash,
        "spec": spec.source_text,
        "models": list(spec.models),
        "versions": package_versions(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def compile_all(spec: Any) -> list[ModelPlan]:
    """Every model's plan; a model that cannot be read is reported at its place in the spec."""
    from .errors import ModelError
    from .models.model import model_info

    plans = []
    for i, model_id in enumerate(spec.models):
        try:
            info = model_info(model_id)
        except ModelError as err:
            where = (f"command line: --models[{i}]" if "models" in spec.overrides
                     else spec.problem(("models", i), "").format(spec.source).rstrip(": "))
            raise ModelError(f"{where}: {err}", hint=err.hint) from err
        plans.append(compile_plan(spec, info))
    return plans


def preflight_positions(spec: Any, plans: list[ModelPlan], samples: list[Any]) -> None:
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


def sample_variables(inputs: Any, result: Any, coords: dict[str, dict[str, np.ndarray]]) -> dict[str, Variable]:
    """The store's variables for one run: token labels plus every capture, with their dims."""
    variables = {
        "position": Variable(("token",), np.arange(inputs.n_tokens, dtype=np.int64)),
        "modality": Variable(("token",), inputs.modality.astype(str)),
        "token_id": Variable(("token",), inputs.input_ids.astype(np.int64)),
    }
    for name, data in {**result.tokens, **result.run}.items():
        variables[name] = Variable(VARIABLE_DIMS[name], data, coords.get(name, {}))
    return variables


def run_spec(
    spec: Any,
    *,
    device: str = "auto",
    dtype: str = "auto",
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    remote: Any = None,
) -> RunSummary:
    """Run every (model, sample, condition) of `spec` not yet in its store.

    remote: None runs where the spec's `backend.kind` says; False runs locally; True (NDIF),
    "local" (nnsight's in-process simulation), a server URL or a
    `workbench.backends.remote.RemoteConfig` run remotely: one job per sample, covering that
    sample's conditions not yet stored (see workbench.backends.remote).

    log: where progress notes go (default: the `workbench.runner` logger at INFO). Ctrl-C or
    SIGTERM (raised as `Terminated` by the CLI) stop it between samples, never inside a write,
    with `Interrupted` saying how much is stored."""
    from .data import load_samples

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
    samples = load_samples(spec.data)
    preflight_positions(spec, plans, samples)
    summary = RunSummary(store=str(spec.store.path))
    with StoreWriter(spec.store.path) as store:
        summary.repairs = store.repairs
        for repair in store.repairs:
            log(f"repaired a torn write left by an interrupted run: {repair}")
        done = {
            (p.info.model_id, c.name): set(store.committed_samples(p.info.model_id, c.name))
            for p in plans for c in p.conditions
        }
        todo = [
            (p, s, c) for p in plans for s in samples for c in p.conditions
            if s.id not in done[(p.info.model_id, c.name)]
        ]
        summary.total = sum(len(samples) * len(p.conditions) for p in plans)
        summary.skipped = summary.total - len(todo)
        if summary.skipped:
            log(f"resuming: {summary.skipped} of {summary.total} (model, sample, condition) results "
                f"are already in {spec.store.path}; skipping them")
        if not todo:
            return summary
        record = provenance(spec)
        if remote_config is not None:
            record["backend"] = remote_config.describe()  # where it ran; never the API key
        store.add_provenance(record)
        # stderr, and only on a terminal (disable=None): logs of a batch job get no bar
        bar = tqdm(total=len(todo), disable=None if progress else True, unit="run", dynamic_ncols=True, file=sys.stderr)
        try:
            with known_warnings_silenced():
                _run_todo(todo, store, summary, device, dtype, remote_config, bar, log)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM through the CLI's handler
            bar.close()
            stored = summary.skipped + summary.written
            raise Interrupted(f"interrupted: {stored} of {summary.total} stored; rerun to resume",
                              terminated=isinstance(exc, Terminated)) from None
        bar.close()
    return summary


def _run_todo(todo: list, store: StoreWriter, summary: RunSummary, device: str, dtype: str, remote_config: Any,
              bar: Any, log: Callable[[str], None]) -> None:
    model, model_id = None, None
    for _, group in itertools.groupby(todo, key=lambda t: (t[0].info.model_id, t[1].id)):
        group = list(group)
        plan, sample = group[0][0], group[0][1]
        if plan.info.model_id != model_id:
            del model  # free the previous model before loading the next
            model_id = plan.info.model_id
            bar.set_description(f"loading {model_id}")
            attn = "eager" if plan.capture.needs_eager_attention else "sdpa"
            model = _load_model(plan, device, dtype, attn, remote_config, log)
            store.ensure_model(model_id, model.describe())
        inputs_by_image = LazyInputs(model, sample)
        conditions = [condition for _, _, condition in group]
        for condition, result in _execute_sample(model, inputs_by_image, conditions, plan, remote_config, bar, log):
            inputs = inputs_by_image[condition.image]
            variables = sample_variables(inputs, result, plan.capture.coords())
            problems = nonfinite_report(variables)
            variables["nonfinite"] = Variable(("run",), np.array([len(problems)], dtype=np.int64))
            for line in problems:
                summary.nonfinite.append(f"{model_id} | {sample.id} | {condition.name} | {line}")
                _LOG.warning(f"non-finite capture: {summary.nonfinite[-1]}")
            with signals_deferred():
                _signal_drill(summary.written)
                store.write_sample(model_id, condition.name, sample.id, variables, condition_attrs=condition.store_attrs())
                summary.written += 1
            bar.update(1)


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
    protocol would repair it, but a clean stop needs no repair). Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: received.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
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

    def __init__(self, model: Any, sample: Any):
        super().__init__()
        self.model, self.sample = model, sample

    def __missing__(self, image_mode: str) -> Any:
        self[image_mode] = self.model.encode(self.sample.image, self.sample.question, image_mode)
        return self[image_mode]


def _execute(model: Any, inputs_by_image: LazyInputs, condition: Any, plan: ModelPlan) -> Any:
    from .backends.local import run_condition

    return run_condition(model, inputs_by_image, condition, plan)


def _load_model(plan: ModelPlan, device: str, dtype: str, attn: str, remote: Any, log: Callable[[str], None]) -> Any:
    if remote is None:
        from .models.model import WorkbenchModel

        return WorkbenchModel(plan.info, device=device, dtype=dtype, attn=attn)
    from .backends.remote import load_remote_model

    return load_remote_model(plan.info, remote, attn=attn, log=log)


def _execute_sample(model: Any, inputs_by_image: LazyInputs, conditions: list[Any], plan: ModelPlan,
                    remote: Any, bar: Any, log: Callable[[str], None]) -> Any:
    """(condition, result) of one sample's conditions: locally one run at a time (each written
    before the next runs); remotely all in one job, then written one by one."""
    sample_id = inputs_by_image.sample.id
    if remote is None:
        for condition in conditions:
            bar.set_description(f"{plan.info.model_id} | {sample_id} | {condition.name}")
            yield condition, _execute(model, inputs_by_image, condition, plan)
        return
    from .backends.remote import run_sample

    bar.set_description(f"{plan.info.model_id} | {sample_id} | {len(conditions)} condition(s) on {remote.label}")
    results = run_sample(model, inputs_by_image, conditions, plan, remote, log=log,
                         what=f"{plan.info.model_id} | {sample_id}")
    for condition in conditions:
        yield condition, results[condition.name]
