"""Plan: a validated spec compiled against one model's config into what its traces must do.

Everything a spec asks that a model cannot give (a vision site on a text model, a layer beyond its
depth, an intervention kind not implemented) is refused here, before anything runs or is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .capture import CAPTURABLE_SITES, ResidualCapture
from .interventions import SCALABLE_SITES, build_intervention
from .sites import PER_LAYER_SITES, VISION_SITES


class PlanError(ValueError):
    """A spec that is valid on its own but asks for something a model lacks."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


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


def _layers(value: Any, n_layers: int, field_path: str, problems: list[str], model_id: str) -> tuple[int, ...]:
    if value in (None, "all"):
        return tuple(range(n_layers + 1))
    bad = [l for l in value if l > n_layers]
    if bad:
        problems.append(f"{field_path}: layers {bad} out of range for {model_id}; expected 0..{n_layers}")
    return tuple(sorted(set(l for l in value if l <= n_layers)))


def _check_site(site: str, info: Any, field_path: str, problems: list[str], allowed: tuple[str, ...], what: str) -> None:
    if site in VISION_SITES and not info.arch.is_multimodal:
        problems.append(f"{field_path}: {info.model_id} is a text-only model and has no site {site!r}")
    elif site not in allowed:
        problems.append(f"{field_path}: site {site!r} cannot be {what} yet; expected one of {', '.join(allowed)}")


def compile_plan(spec: Any, info: Any) -> ModelPlan:
    """Compile `spec` for one model; raise PlanError listing every problem."""
    problems: list[str] = []
    captures = []
    for i, item in enumerate(spec.capture):
        path = f"capture[{i}]"
        _check_site(item.site, info, f"{path}.site", problems, CAPTURABLE_SITES, "captured")
        if item.positions != "all":
            problems.append(f"{path}.positions: only 'all' is supported for {item.site!r} captures yet")
        if item.site == "layer":
            captures.append(ResidualCapture(_layers(item.layers, info.n_layers, f"{path}.layers", problems, info.model_id)))
    conditions = []
    for instance in spec.expand_conditions():
        items = []
        for j, raw in enumerate(instance.interventions):
            path = f"conditions.{instance.base}.interventions[{j}]"
            if raw.kind not in ("scale", "zero"):
                problems.append(f"{path}.kind: {raw.kind!r} is not implemented yet; expected scale or zero")
                continue
            _check_site(raw.site, info, f"{path}.site", problems, SCALABLE_SITES, f"given '{raw.kind}'")
            if raw.site in VISION_SITES and raw.positions not in ("vision", "all"):
                problems.append(f"{path}.positions: the projector outputs only vision tokens; expected vision or all")
            item = build_intervention(raw)
            if raw.site in PER_LAYER_SITES:
                layers = _layers(getattr(raw, "layers", "all"), info.n_layers, f"{path}.layers", problems, info.model_id)
                item = type(item)(**{**item.__dict__, "layers": layers})
            items.append(item)
        if getattr(instance, "kv_swap", None) is not None:
            problems.append(f"conditions.{instance.base}.kv_swap: not implemented yet")
        if instance.image != "real" and not info.arch.is_multimodal:
            problems.append(f"conditions.{instance.base}.image: {info.model_id} takes no image")
        conditions.append(ConditionPlan(instance.name, dict(instance.sweep), instance.image, tuple(items)))
    if problems:
        raise PlanError([f"{info.model_id}: {p}" for p in problems])
    return ModelPlan(info=info, conditions=conditions, captures=captures)
