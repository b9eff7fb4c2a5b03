"""A run's work, never all held: its samples are read afresh on every pass, one at a time, and
its (model, sample, condition) runs are generated as the loop takes them.

Before the store is touched, one pass reads every sample (so a file that cannot be decoded is
refused with nothing written) and keeps only its id and input hash; the runs still to do are
counted from those ids and what the store holds, and generated in order when the work starts.
Memory before work starts grows by an id and a hash per sample, never by an image or a run.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Mapping, NamedTuple

from .data import Sample, input_hash, iter_samples
from .plan import ConditionPlan, ModelPlan, condition_names


class PendingRun(NamedTuple):
    """One (model, sample, condition) run not yet stored."""

    plan: ModelPlan
    sample: Sample
    condition: ConditionPlan


class SampleStream:
    """A spec's samples (its `data` section; with `shard` (k, n), samples k, k+n, k+2n, ...), read
    again on each iteration: sample i is the same sample on every pass."""

    def __init__(self, data: Any, shard: tuple[int, int] | None = None):
        self.data, self.shard = data, shard

    def __iter__(self) -> Iterator[Sample]:
        samples = iter_samples(self.data)
        if self.shard is not None:  # a disjoint share of the samples; `workbench merge` joins the shards
            samples = itertools.islice(samples, self.shard[0], None, self.shard[1])
        return samples


def survey(samples: SampleStream) -> dict[str, str]:
    """Every sample read once, in order (a file that cannot be decoded is refused here, before
    anything is written): sample id -> input hash; the samples themselves are not kept."""
    return {sample.id: input_hash(sample) for sample in samples}


def count_done(plans: list[Any], ids: Mapping[str, Any], done: Mapping[tuple[str, str], set[str]]) -> int:
    """Runs of this spec's samples (`ids`) the store already holds (`done` may leave out the
    conditions the store holds nothing of)."""
    return sum(sum(1 for sid in done.get((p.info.model_id, name), ()) if sid in ids)
               for p in plans for name in condition_names(p.conditions))


def pending_runs(plans: list[Any], samples: SampleStream,
                 done: Mapping[tuple[str, str], set[str]]) -> Iterator[PendingRun]:
    """(plan, sample, condition) of every run not yet stored, per model, per sample, per condition;
    each model's pass reads the samples again, skipping those it holds entirely. A condition's plan
    is compiled when its first run is taken, and kept for the next samples."""
    for plan in plans:
        taken: dict[int, Any] = {}
        for sample in samples:
            for i, name in enumerate(condition_names(plan.conditions)):
                if sample.id not in done.get((plan.info.model_id, name), ()):
                    if i not in taken:
                        taken[i] = plan.conditions[i]
                    yield PendingRun(plan, sample, taken[i])
