"""Plan: a validated spec compiled against one model's config into what its traces must do.

Everything a spec asks that a model cannot give (a vision site on a text model, a layer beyond its
depth, an intervention kind not implemented yet) is refused here, located in the spec file like
any other spec error, before anything runs or is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .capture import CAPTURABLE_SITES, ResidualCapture
from .interventions import SCALABLE_SITES, build_intervention
from .sites import PER_LAYER_SITES, VISION_SITES
from .spec import SpecError

Path_ = tuple[Any, ...]


class PlanError(SpecError):
    """A spec that is valid on its own but asks for something a model lacks."""


@dataclass(frozen=True)
class ConditionPlan:
    name: str
    sweep: dict[str, float]
    image: str                        # real | blank | none
    interventions: tuple[Any, ...]

    def store_attrs(self) -> dict[str, Any]:
        return {
            "sweep": dict(self.sweep),
            "image": self.image,
            "interventions": [repr(i) for i in self.interventions],
        }


@dataclass
class ModelPlan:
    info: Any                         # workbench.models.ModelInfo
    conditions: list[ConditionPlan]
    captures: list[Any] = field(default_factory=list)


class _Checker:
    """Collects (spec path, message) problems for one model."""

    def __init__(self, info: Any):
        self.info = info
        self.problems: list[tuple[Path_, str]] = []

    def add(self, path: Path_, message: str) -> None:
        self.problems.append((path, message))

    def layers(self, value: Any, path: Path_) -> tuple[int, ...]:
        n = self.info.n_layers
        if value in (None, "all"):
            return tuple(range(n + 1))
        bad = [l for l in value if l > n]
        if bad:
            self.add(path, f"layers {bad} out of range ({n} decoder layers); expected 0..{n}")
        return tuple(sorted(set(l for l in value if l <= n)))

    def site(self, site: str, path: Path_, allowed: tuple[str, ...], what: str) -> None:
        if site in VISION_SITES and not self.info.arch.is_multimodal:
            self.add(path, f"a text-only model has no site {site!r}; expected a site of a text model")
        elif site not in allowed:
            self.add(path, f"site {site!r} cannot be {what} yet; expected one of {', '.join(allowed)}")


def compile_plan(spec: Any, info: Any) -> ModelPlan:
    """Compile `spec` for one model; raise PlanError (located in the spec) listing every problem."""
    check = _Checker(info)
    captures = []
    for i, item in enumerate(spec.capture):
        check.site(item.site, ("capture", i, "site"), CAPTURABLE_SITES, "captured")
        if item.positions != "all":
            check.add(("capture", i, "positions"), f"only 'all' is supported for {item.site!r} captures yet; expected all")
        if item.site == "layer":
            captures.append(ResidualCapture(check.layers(item.layers, ("capture", i, "layers"))))
    conditions = []
    for instance in spec.expand_conditions():
        base: Path_ = ("conditions", instance.base)
        items = []
        for j, raw in enumerate(instance.interventions):
            path = base + ("interventions", j)
            if raw.kind not in ("scale", "zero"):
                check.add(path + ("kind",), f"{raw.kind!r} is not implemented yet; expected scale or zero")
                continue
            check.site(raw.site, path + ("site",), SCALABLE_SITES, f"given '{raw.kind}'")
            if raw.site in VISION_SITES and raw.positions not in ("vision", "all"):
                check.add(path + ("positions",), "the projector outputs only vision tokens; expected vision or all")
            item = build_intervention(raw)
            if raw.site in PER_LAYER_SITES:
                item = replace(item, layers=check.layers(getattr(raw, "layers", "all"), path + ("layers",)))
            items.append(item)
        if instance.kv_swap is not None:
            check.add(base + ("kv_swap",), "kv_swap is not implemented yet; expected no kv_swap")
        if instance.image != "real" and not info.arch.is_multimodal:
            check.add(base + ("image",), "a text-only model takes no image; expected real")
        conditions.append(ConditionPlan(instance.name, dict(instance.sweep), instance.image, tuple(items)))
    if check.problems:
        raise PlanError([spec.problem(p, f"{info.model_id}: {m}") for p, m in dict.fromkeys(check.problems)], spec.source)
    return ModelPlan(info=info, conditions=conditions, captures=captures)
