"""`layer`: the residual stream at each listed index (the convention in `workbench.sites.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..models.protocol import ModelLike
from ..records import Record
from .base import Site, order, register_site, residual_envoy, running_layer, token_rows
from .readers import saved_copy

if TYPE_CHECKING:
    from ..capture import CapturePlan


class ResidualCapture(Record):
    """The residual stream at each listed layer index, for every position."""

    layers: tuple[int, ...]
    variable: str
    _fields = ("layers", "variable")
    _defaults = {"variable": "hidden"}

    def targets(self) -> list[tuple[tuple[int, int, float], int]]:
        return [(order("layer", l, 1), l) for l in self.layers]

    def read(self, model: ModelLike, layer: int, saved: dict[Any, Any], inputs: Any, row: Any = None) -> None:
        hidden = token_rows(residual_envoy(model, running_layer(model, layer, inputs)).input, row)
        saved.setdefault(("hidden", layer), []).append(saved_copy(hidden[0]))




def tensor(model: ModelLike, layer: int) -> Any:
    return residual_envoy(model, layer).input


def capture(plan: CapturePlan, layers: tuple[int, ...]) -> None:
    plan.residual = ResidualCapture(layers)


register_site(Site("layer", 4, index="layer", stores={"hidden": ("token", "layer", "dim")}, editable=True,
                   access="sequence", tensor=tensor, capture=capture))
