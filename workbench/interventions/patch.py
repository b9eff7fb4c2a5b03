"""`patch`: replace the site's value at the selected positions with the `from` condition's value
at the same positions (same layer). The source must have the same token sequence. Sites: `embed`,
the residual stream `layer`, a decoder layer's branch outputs `attn_out` and `mlp_out` (what the
branch adds to the residual stream, before the add), the heads' outputs before the output
projection `attn_heads` (with `heads`: only those heads' columns), and the connector's modules."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field, PlainValidator

from ..extend import InterventionSpec, register_intervention
from ..models.protocol import ModelLike
from ..sites import to_device
from ..spec.fields import ConditionName, _fail, _index_list
from ..spec.problems import _got
from .base import Intervention


def _heads(value: Any) -> list[int]:
    if not isinstance(value, list) or not value:
        _fail(f"{_got(value)}; expected a non-empty list of head indices")
    return _index_list(value, "head index")


class PatchSpec(InterventionSpec):
    kind: Literal["patch"]
    from_: ConditionName = Field(alias="from")
    heads: Annotated[list[int] | None, PlainValidator(lambda v: None if v is None else _heads(v))] = None


@register_intervention(PatchSpec, accesses=("sequence", "modules", "branch", "heads"), source="from_")
class Patch(Intervention):
    """Replace the site's value with the `source` condition's (bound before the run); with
    `heads`, only those heads' slices of a per-head site (`head_dim` columns each, resolved from
    the model)."""

    source: str
    bound: dict[int | None, torch.Tensor]
    heads: tuple[int, ...] | None
    head_dim: int | None
    _fields = Intervention._fields + ("source", "bound", "heads", "head_dim")
    _defaults = {**Intervention._defaults, "source": "", "heads": None, "head_dim": None}
    _factories = {"bound": dict}
    _hidden = ("bound",)
    reads_own = False  # `bind` uses the source's values only (`backends.local._resolve` skips its own read)

    def bind(self, values: dict[Any, torch.Tensor], own: dict[Any, torch.Tensor]) -> "Patch":
        return self.replace(bound=values)

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        donor = to_device(self.bound[layer], x, x.dtype).reshape(x.shape)
        if self.heads is None:
            return donor
        if self.head_dim is None or x.shape[-1] % self.head_dim or max(self.heads) >= x.shape[-1] // self.head_dim:
            raise ValueError(f"patch heads {list(self.heads)}: the site has {x.shape[-1] // (self.head_dim or 1)} "
                             f"heads of {self.head_dim} columns; expected head indices below that")
        per_head = (*x.shape[:-1], x.shape[-1] // self.head_dim, self.head_dim)
        mixed = x.reshape(per_head).clone()
        heads = list(self.heads)
        mixed[..., heads, :] = donor.reshape(per_head)[..., heads, :]
        return mixed.reshape(x.shape)

    def resolve(self, model: ModelLike) -> "Patch":
        return self.replace(head_dim=model.info.head_dim) if self.heads is not None else self

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Patch":
        return cls(**common, source=raw.from_, heads=None if raw.heads is None else tuple(raw.heads))
