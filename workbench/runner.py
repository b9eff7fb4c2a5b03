"""The runner: for every model x sample x condition, one trace, written to the store at once.

Order of work: all plans are compiled first (nothing runs if any model cannot do what the spec
asks); then per model, per sample, per condition. A (model, sample, condition) already committed
in the store is skipped, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import itertools
import platform
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from tqdm.auto import tqdm

from .checks import nonfinite_report
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
_VERSIONED = ("workbench", "torch", "transformers", "nnsight", "zarr", "xarray", "numpy")


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


def check_resume(store: StoreWriter, spec: Any, plans: list[ModelPlan], samples: list[Any]) -> None:
    """Refuse, before any model loads, a resume that would mix meanings under one name: a
    condition whose identity changed, or a stored sample whose input changed under its id."""
    from .data import input_hash
    from .store import StoreIdentityError

    hashes = {s.id: input_hash(s) for s in samples}
    for plan in plans:
        for condition in plan.conditions:
            store.check_condition(plan.info.model_id, condition.name, condition_identity(spec, plan, condition))
            stored = store.committed_inputs(plan.info.model_id, condition.name)
            changed = [sid for sid, h in stored.items() if h and sid in hashes and hashes[sid] != h]
            if changed:
                raise StoreIdentityError(
                    f"{len(changed)} sample(s) of {plan.info.model_id} / {condition.name} changed since they were "
                    f"stored under the same id (e.g. {changed[0]}: its image or question differs)",
                    hint="write to a new store (--store), or restore the original inputs")


def compile_all(spec: Any) -> list[ModelPlan]:
    from .models.model import model_info

    return [compile_plan(spec, model_info(model_id)) for model_id in spec.models]


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
    log: Callable[[str], None] = print,
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
    share the work, each into its own store, and `workbench merge` joins their stores."""
    from .data import input_hash, load_samples

    backend = spec.backend
    remote_config = None
    if remote is not None or getattr(backend, "kind", "local") == "remote":
        from .backends.remote import RemoteConfig

        remote_config = RemoteConfig.resolve(remote, getattr(backend, "kind", "local"))
    device = device if device != "auto" else getattr(backend, "device", "auto")
    dtype = dtype if dtype != "auto" else getattr(backend, "dtype", "auto")
    plans = compile_all(spec)
    samples = load_samples(spec.data)
    if shard is not None:  # a disjoint share of the samples; `workbench merge` joins the shards
        samples = samples[shard[0]::shard[1]]
    preflight_positions(spec, plans, samples)
    remote_models: dict[str, Any] = {}
    if remote_config is not None:
        from .backends.remote import prepare_remote

        # the key, versions and served models are checked before the store is created or opened
        remote_models = prepare_remote(plans, remote_config, log)
    # a new store is created only once the first remote result is in: a run that fails at its
    # first job (a refused request, an error in the trace) leaves nothing on disk
    first = None
    if remote_models and samples and not Path(spec.store.path).exists():
        plan, sample = plans[0], samples[0]
        first = ((plan.info.model_id, sample.id), _execute_sample(
            remote_models[plan.info.model_id], LazyInputs(remote_models[plan.info.model_id], sample),
            list(plan.conditions), plan, remote_config, tqdm(disable=True), log))
        first = (first[0], list(first[1]))
    summary = RunSummary(store=str(spec.store.path))
    with StoreWriter(spec.store.path) as store:
        summary.repairs = store.repairs + store.repair({s.id for s in samples})
        for repair in summary.repairs:
            log(f"repaired: {repair}")
        check_resume(store, spec, plans, samples)
        done = {
            (p.info.model_id, c.name): set(store.committed_samples(p.info.model_id, c.name))
            for p in plans for c in p.conditions
        }
        todo = [
            (p, s, c) for p in plans for s in samples for c in p.conditions
            if s.id not in done[(p.info.model_id, c.name)]
        ]
        hashes = {s.id: input_hash(s) for s in samples}
        summary.total = sum(len(samples) * len(p.conditions) for p in plans)
        summary.skipped = summary.total - len(todo)
        if summary.skipped:
            log(f"resuming: {summary.skipped} of {summary.total} (model, sample, condition) results "
                f"are already in {spec.store.path}; skipping them")
        if not todo:
            return summary
        record = provenance(spec, command)
        if shard is not None:
            record["shard"] = list(shard)
        if remote_config is not None:
            record["backend"] = remote_config.describe()  # where it ran; never the API key
        store.add_provenance(record)
        bar = tqdm(total=len(todo), disable=not progress, unit="run", dynamic_ncols=True)
        note = bar.write if log is print else log  # keep the bar intact when printing
        model, model_id = None, None
        for _, group in itertools.groupby(todo, key=lambda t: (t[0].info.model_id, t[1].id)):
            group = list(group)
            plan, sample = group[0][0], group[0][1]
            if plan.info.model_id != model_id:
                del model  # free the previous model before loading the next
                model_id = plan.info.model_id
                bar.set_description(f"loading {model_id}")
                # attention probabilities are computed from q and k (capture.attention_probabilities),
                # under the implementation NDIF also runs: no eager switch, locally or remotely
                attn = "sdpa"
                model = remote_models.get(model_id) or _load_model(plan, device, dtype, attn, remote_config, note)
                store.ensure_model(model_id, model.describe())
            inputs_by_image = LazyInputs(model, sample)
            conditions = [condition for _, _, condition in group]
            if first is not None and first[0] == (model_id, sample.id):
                results, first = first[1], None  # run before the store existed (see above)
            else:
                results = _execute_sample(model, inputs_by_image, conditions, plan, remote_config, bar, note)
            for condition, result in results:
                inputs = inputs_by_image[condition.image]
                variables = sample_variables(inputs, result, plan.capture.coords())
                problems = nonfinite_report(variables)
                variables["nonfinite"] = Variable(("run",), np.array([len(problems)], dtype=np.int64))
                for line in problems:
                    summary.nonfinite.append(f"{model_id} | {sample.id} | {condition.name} | {line}")
                    bar.write(f"warning: non-finite capture: {summary.nonfinite[-1]}")
                attrs = {**condition.store_attrs(), "identity": condition_identity(spec, plan, condition)}
                store.write_sample(model_id, condition.name, sample.id, variables, condition_attrs=attrs,
                                   input_hash=hashes[sample.id])
                summary.written += 1
                bar.update(1)
        bar.close()
        summary.tag = store.finish_run()
    return summary


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
    from .store import fault_point

    return run_condition(model, inputs_by_image, condition, plan, on_trace=fault_point)


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
