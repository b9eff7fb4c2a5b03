"""`zero`: set the site's value to zero at the selected positions (NaN and Inf included)."""

from __future__ import annotations

from typing import Literal

import torch

from ..extend import InterventionSpec, register_intervention
from .base import Intervention


class ZeroSpec(InterventionSpec):
    kind: Literal["zero"]


@register_intervention(ZeroSpec)
class Zero(Intervention):
    """Set the site's value to zero at the selected positions."""

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return torch.zeros_like(x)
