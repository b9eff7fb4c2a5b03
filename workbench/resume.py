"""What a store already holds of a run, asked once before any model loads (`resume_state`).

An interrupted run resumes where it stopped: every (model, sample, condition) committed is
skipped. A resume that would mix meanings under one name is refused instead: a condition whose
identity changed (`condition_identity`), or a stored sample whose input changed under its id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .worklist import PendingRun, SampleStream, count_done, pending_runs

if TYPE_CHECKING:
    from .plan import ConditionPlan, ModelPlan
    from .spec import Spec
    from .store import StoreWriter


def data_identity(data: Any) -> dict[str, Any]:
    """What decides which inputs a condition's samples are: everything in `data` but how many."""
    return {k: v for k, v in data.model_dump(mode="json").items() if k != "n"}


def condition_identity(spec: Spec, plan: ModelPlan, condition: ConditionPlan) -> dict[str, Any]:
    """A stored condition's meaning: resolved interventions, image mode, kv_swap, sweep values,
    data source and seed, capture layout. A resume with another identity is refused."""
    return {**condition.store_attrs(), "data": data_identity(spec.data), "capture": repr(plan.capture)}


@dataclass
class ResumeState:
    """The store's answer for one run: what it repaired on opening, which samples it holds per
    (model, condition) it holds anything of, and how many of this run's runs that is."""

    repairs: list[str] = field(default_factory=list)
    done: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    total: int = 0
    skipped: int = 0

    @property
    def finished(self) -> bool:
        return self.skipped == self.total

    def pending(self, plans: list[ModelPlan], samples: SampleStream) -> Iterator[PendingRun]:
        """The runs still to do, generated as the loop takes them."""
        return pending_runs(plans, samples, self.done)


def resume_state(store: StoreWriter, spec: Spec, plans: list[ModelPlan], hashes: dict[str, str],
                 log: Callable[[str], None] = print) -> ResumeState:
    """Repair what an earlier run left half-written (each repair logged), then check every
    condition the store holds against this run (`hashes`: sample id -> input hash):
    StoreIdentityError, before any model loads, where a condition's identity or a stored sample's
    input changed."""
    from .plan import condition_names, renamed_runs
    from .store import StoreIdentityError

    state = ResumeState(repairs=store.repairs + store.repair(set(hashes)))
    for repair in state.repairs:
        log(f"repaired: {repair}")
    for plan in plans:  # only the conditions the store holds: a sweep's names are generated, not held
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
            state.done[(plan.info.model_id, condition.name)] = set(stored)
    state.total = sum(len(hashes) * len(p.conditions) for p in plans)
    state.skipped = count_done(plans, hashes, state.done)
    return state
