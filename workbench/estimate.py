"""How big a run will be before it starts (`workbench validate --estimate`, and the free-disk
check of `workbench run`): its runs and forward passes, and the bytes its captures will store per
condition and in all, from each model's config and processor (no weights are loaded).

Bytes are the captured arrays' own sizes, uncompressed (what `store_info` shapes times the item
size give; on disk, zarr's compression makes the store smaller): every capture is stored as
float32 (workbench/capture.py), ids as int64. A variable's rows are the prompt's tokens (counted by
encoding the first `ENCODED_SAMPLES` samples with the model's processor, the rest taken at their
mean) or one per run; its other dims come from the model's config and the plan (layers captured,
steps generated). A dim the config does not give (attention heads, the vision tower's patches and
width) leaves its variables out, named as not estimated.

`measure_forward` times one forward of a loaded model (`--models-check --estimate`).
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .sites import site, variable_dims
from .spec.scans import BASE_VAR, DONOR_VAR, METHOD_VAR, SITE_VAR

if TYPE_CHECKING:
    from .worklist import SampleStream
    from .data import Sample
    from .plan import ModelPlan
    from .spec import Spec
    from .models.model import ImageMode

ENCODED_SAMPLES = 16  # samples encoded per model and image mode; the rest are taken at their mean
INT64_VARIABLES = frozenset({"generated", "lens_ids"})


@dataclass
class ModelEstimate:
    model: str
    runs: int = 0
    forwards: int = 0
    bytes_per_condition: dict[str, int] = field(default_factory=dict)
    variables: dict[str, int] = field(default_factory=dict)  # variable -> bytes over every condition
    not_estimated: dict[str, str] = field(default_factory=dict)  # variable -> the dim its size needs
    tokens_extrapolated: bool = False  # token counts beyond the encoded samples taken at their mean


@dataclass
class Estimate:
    samples: int
    models: list[ModelEstimate]

    @property
    def runs(self) -> int:
        return sum(m.runs for m in self.models)

    @property
    def forwards(self) -> int:
        return sum(m.forwards for m in self.models)

    @property
    def bytes(self) -> int:
        return sum(sum(m.bytes_per_condition.values()) for m in self.models)


def _dim_sizes(plan: ModelPlan, variable: str) -> dict[str, int]:
    from .sites.embed_lens import EMBED_TOP_K
    from .sites.logit_lens import LENS_TOP_K

    info, capture = plan.info, plan.capture
    sizes = {"run": 1, "dim": info.hidden_size, "vocab": info.vocab_size, "embed_row": info.vocab_size,
             "step": capture.max_new_tokens, "lens_rank": LENS_TOP_K,
             "embed_rank": EMBED_TOP_K}
    if info.kv_heads and info.head_dim:
        sizes["kv"] = info.kv_heads * info.head_dim
    sizes.update({dim: len(labels) for dim, labels in capture.coords().get(variable, {}).items()})
    return sizes


def _variables(spec: Spec) -> list[str]:
    """The variables the spec's captures store, in the order captured."""
    return list(dict.fromkeys(v for item in spec.capture for v in site(item.site).stores))


def _row_bytes(plan: ModelPlan, variable: str) -> tuple[str, int] | tuple[None, str]:
    """(row dim, bytes per row) of `variable`, or (None, the dim whose size is unknown)."""
    dims = variable_dims()[variable]
    sizes = _dim_sizes(plan, variable)
    unknown = [d for d in dims[1:] if d not in sizes]
    if dims[0] not in ("token", "run") or unknown:
        return None, (unknown or [dims[0]])[0]
    item = 8 if variable in INT64_VARIABLES else 4
    return dims[0], item * math.prod(sizes[d] for d in dims[1:])


def _token_counts(plan: ModelPlan, samples: Iterable[Any], n_samples: int, modes: set[ImageMode]) -> tuple[dict[str, int], bool]:
    """Total prompt tokens over every sample, per image mode, and whether any was extrapolated."""
    from .models.model import InputEncoder

    encoder = InputEncoder(plan.info)
    counts: dict[str, list[int]] = {m: [] for m in modes}
    for i, sample in enumerate(samples):
        if i == ENCODED_SAMPLES:
            break
        for mode in modes:
            counts[mode].append(encoder.encode(sample.image, sample.question, mode).n_tokens)
    extrapolated = n_samples > ENCODED_SAMPLES
    totals = {m: sum(c) + round(statistics.fmean(c) * (n_samples - len(c))) if c else 0 for m, c in counts.items()}
    return totals, extrapolated


def forwards_per_sample(plan: ModelPlan) -> int:
    """Forward passes of one sample's runs, as the local backend issues them: the runs batched
    `batch_size` to a forward, each step decoded (`backends.local.run_rows`); one more forward per
    source a patch or add reads at a site (`want_sources`: a scan's donor once, for every layer its
    runs patch); an attribution scan's runs none of their own, but a forward (and backward) of each
    base and a forward of each donor per site (`workbench.attribution`)."""
    steps = plan.capture.max_new_tokens if plan.capture.decoding else 1
    estimated = [c for c in plan.conditions if c.sweep.get(METHOD_VAR) == "attribution"]
    run = [c for c in plan.conditions if c.sweep.get(METHOD_VAR) != "attribution"]
    sources: set[tuple[str, str]] = set()
    for condition in run:
        for item in condition.interventions:
            source = getattr(item, "source", None)
            if source:
                sources.add((source, item.site))
                if getattr(item, "reads_own", True):
                    sources.add((f"{condition.image} image", item.site))
    pairs = {(c.sweep.get(BASE_VAR), c.sweep.get(DONOR_VAR), c.sweep.get(SITE_VAR)) for c in estimated}
    return math.ceil(len(run) / max(1, plan.batch_size)) * steps + len(sources) + 2 * len(pairs)


def estimate_run(spec: Spec, plans: list[ModelPlan] | None = None, samples: SampleStream | None = None) -> Estimate:
    """The estimate of `spec` (its plans and sample stream when the caller already has them)."""
    from .runner import compile_all
    from .worklist import SampleStream, survey

    plans = compile_all(spec) if plans is None else plans
    samples = SampleStream(spec.data) if samples is None else samples
    n_samples = len(survey(samples))
    variables = _variables(spec)
    models = []
    for plan in plans:
        est = ModelEstimate(plan.info.model_id)
        conditions = [(c.name, c.image) for c in plan.conditions]
        est.runs, est.forwards = n_samples * len(conditions), n_samples * forwards_per_sample(plan)
        tokens, est.tokens_extrapolated = _token_counts(plan, samples, n_samples, {image for _, image in conditions})
        rows = [(v, *_row_bytes(plan, v)) for v in variables if v in variable_dims()]
        est.not_estimated = {v: size for v, dim, size in rows if dim is None}
        for name, image in conditions:
            per_variable = {v: size * (tokens[image] if dim == "token" else n_samples)
                            for v, dim, size in rows if dim is not None}
            est.bytes_per_condition[name] = sum(per_variable.values())
            for v, b in per_variable.items():
                est.variables[v] = est.variables.get(v, 0) + b
        models.append(est)
    return Estimate(n_samples, models)


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def describe(estimate: Estimate, shown: int = 12) -> list[str]:
    """The estimate as lines of text: forwards, then bytes per model and condition, then in all."""
    lines = [f"estimate: {estimate.runs} run(s) (model, sample, condition) over {estimate.samples} sample(s), "
             f"{estimate.forwards} forward pass(es) (prompt and decode steps)"]
    for m in estimate.models:
        lines.append(f"  {m.model}: {m.runs} run(s), {m.forwards} forward(s), "
                     f"{human(sum(m.bytes_per_condition.values()))}")
        for name, b in list(m.bytes_per_condition.items())[:shown]:
            lines.append(f"    {name}: {human(b)}")
        if len(m.bytes_per_condition) > shown:
            lines.append(f"    ... {len(m.bytes_per_condition) - shown} more condition(s)")
        if m.not_estimated:
            lines.append("    not estimated: " + ", ".join(f"{v} (its '{d}' size is known only after a forward)"
                                                          for v, d in m.not_estimated.items()))
        if m.tokens_extrapolated:
            lines.append(f"    token counts: the first {ENCODED_SAMPLES} samples encoded, the rest taken at their mean")
    lines.append(f"  in all: {human(estimate.bytes)} of captures, uncompressed (the store on disk is smaller)")
    return lines


def free_disk_problem(store_path: str, needed: int, free: int | None = None) -> str | None:
    """A message when `needed` more bytes exceed the free space of the disk holding `store_path`
    (an s3:// store: None, its bucket's size is not ours to tell); `free` overrides the measure."""
    if "://" in store_path:
        return None
    path = Path(store_path).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    free = shutil.disk_usage(existing).free if free is None else free
    if needed <= free:
        return None
    held = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0  # a resumed run's
    if needed - held <= free:
        return None
    return (f"this run's captures are estimated at {human(needed)} uncompressed"
            f"{f' ({human(held)} already in the store)' if held else ''}, more than the {human(free)} free on the "
            f"disk of {store_path}; zarr's compression may make it fit, or use --limit, fewer captures or another --store")


def measure_forward(plan: ModelPlan, sample: Sample, device: str = "auto", dtype: str = "auto", repeats: int = 3) -> float:
    """Seconds of one prompt forward of `plan`'s model on `sample` (the median of `repeats`, after one
    warm-up), with the model loaded as a run loads it."""
    import torch

    from .models.model import WorkbenchModel

    model = WorkbenchModel(plan.info, device=device, dtype=dtype)
    inputs = model.encode(sample.image, sample.question)
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            start = time.perf_counter()
            model.hf(**inputs.encoding)
            if str(model.device).startswith("cuda"):
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - start)
    return statistics.median(times)
