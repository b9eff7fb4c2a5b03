"""`patch`: replace the site's value at the selected positions with the `from` condition's value
at the same positions (same layer). The source must have the same token sequence. Sites: `embed`,
the residual stream `layer`, a decoder layer's branch outputs `attn_out` and `mlp_out` (what the
branch adds to the residual stream, before the add), and the connector's modules."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from ..extend import InterventionSpec, register_intervention
from ..sites import to_device
from ..spec.fields import ConditionName
from .base import Intervention


class PatchSpec(InterventionSpec):
    kind: Literal["patch"]
    from_: ConditionName = Field(alias="from")


@register_intervention(PatchSpec, accesses=("sequence", "modules", "branch"), source="from_")
class Patch(Intervention):
    """Replace the site's value with the `source` condition's (bound before the run)."""

    source: str
    bound: dict[int | None, torch.Tensor]
    _fields = Intervention._fields + ("source", "bound")
    _defaults = {**Intervention._defaults, "source": ""}
    _factories = {"bound": dict}
    _hidden = ("bound",)
    reads_own = False  # `bind` uses the source's values only (`backends.local._resolve` skips its own read)

    def bind(self, values: dict[Any, torch.Tensor], own: dict[Any, torch.Tensor]) -> "Patch":
        return self.replace(bound=values)

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return to_device(self.bound[layer], x, x.dtype).reshape(x.shape)

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Patch":
        return cls(**common, source=raw.from_)
