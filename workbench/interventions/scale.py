"""`scale`: multiply the site's value by `factor` at the selected positions (on `projector`: the
study's alpha)."""

from __future__ import annotations

from typing import Any, Literal

import torch

from ..extend import InterventionSpec, register_intervention
from ..spec.fields import NumberOrVar
from .base import Intervention


class ScaleSpec(InterventionSpec):
    kind: Literal["scale"]
    factor: NumberOrVar


@register_intervention(ScaleSpec)
class Scale(Intervention):
    """Multiply the site's value by `factor` at the selected positions."""

    factor: float
    _fields = Intervention._fields + ("factor",)
    _defaults = {**Intervention._defaults, "factor": 1.0}

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return x * self.factor

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Scale":
        return cls(**common, factor=float(raw.factor))
