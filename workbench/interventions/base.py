"""The runtime side every intervention kind shares: `Intervention` (a frozen `Record`: it travels
to NDIF servers) and `apply_rows`, which serves the edits of one execution-order key.

An intervention is built from its validated spec entry (sweep values substituted) by its kind's
`from_spec`, and applied inside an nnsight trace by `apply(model, inputs, layer)`, which reads the
site's tensor and writes back `edit(x, layer)`. `targets()` lists the (execution-order key, layer)
pairs it acts at; the backend sorts every request of a trace by those keys. Before a run the
backend calls `resolve(model)` (defaults taken from the model) and, for a kind that names a
`source` condition, runs that condition first and `bind`s the values read there.

Each kind is one module beside this one, declared with `workbench.extend.register_intervention`.

Sites and what "the site's value" is:
- `projector`: the output of every module whose output enters the LLM as image features:
  SmolVLM's connector; for Qwen3-VL the merger AND every DeepStack merger. All rows are vision
  tokens, so positions must be `vision` or `all`.
- `projector.merger`: the main merger alone (Qwen3-VL's DeepStack features stay untouched).
- `projector.<part>`: one declared connector part's output (`Architecture.projector_parts`).
- `vision`, `vision_layer`: the tower's output as the connector receives it / the output of each
  listed vision layer; every patch row is edited (positions name LLM tokens, so `all` only).
- `embed`: the token-embedding output (before image features are scattered in).
- `layer`: the residual stream at each listed layer index (`workbench.sites` convention), edited
  where it enters decoder layer l (or the final norm for l = L).
- `attn_out`, `mlp_out`: what decoder layer l's attention / MLP branch adds to the residual
  stream, edited in the branch module's output (before the add).

Shipped to NDIF servers: imports only torch, typing and workbench modules that do the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..models.protocol import ModelLike
from ..records import Record
from ..sites import batch_rows, connector_modules, order, position_index, site, site_modules, site_tensor, to_device

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..models.model import ModelInputs
    from ..sites import BatchRow

__all__ = ["Intervention", "apply_rows", "needs_source"]


def apply_rows(model: ModelLike,
               edits: Sequence[tuple[Intervention, ModelInputs, int | None, BatchRow | tuple[int, int] | None]]) -> None:
    """Interventions at one execution-order key, as (intervention, inputs, layer, batch row)s
    (several rows of a batched forward). Connector sites are modules, each served once in
    execution order (parts before the projector's output; Qwen3-VL: the DeepStack mergers, then
    the merger): so every row's edit of one module is made before the next module is requested."""
    if site(edits[0][0].site).access != "modules":
        for item, inputs, layer, row in edits:
            item.apply(model, inputs, layer, row)
        return
    wanted = [set(site_modules(model, item.site)) for item, _, _, _ in edits]
    for key, envoy in connector_modules(model).items():
        takers = [(item, row) for (item, _, _, row), keys in zip(edits, wanted) if key in keys]
        if not takers:
            continue
        output = envoy.output
        for item, row in takers:
            block = batch_rows(output, row)
            block[:] = item.edit(block, None)


class Intervention(Record):
    site: str
    positions: str | tuple[int, ...]
    layers: tuple[int, ...] | None
    _fields: tuple[str, ...] = ("site", "positions", "layers")
    _defaults = {"positions": "all", "layers": None}

    # whether `bind` reads the condition's own values too (add's direction_from does; patch not)
    reads_own = True

    def targets(self) -> list[tuple[tuple[int, int, float], int | None]]:
        # a site read at its stage's input is edited before (phase 0); one read inside its stage
        # (a decoder layer's module, a branch output once its module has run) at that read's key:
        # edits are listed before reads at one key (`backends.local._operations`), so the read
        # sees the edit
        entry = site(self.site)
        phase = entry.phase if entry.phase > 1 else 0
        if entry.index:  # layer, vision_layer, attn_out, mlp_out
            return [(order(self.site, l, phase), l) for l in self.layers or ()]
        return [(order(self.site, None, phase), None)]

    def apply(self, model: ModelLike, inputs: ModelInputs, layer: int | None = None, row: BatchRow | tuple[int, int] | None = None) -> None:
        """Edit the site in place; `row` = (index, of): only that batch row's block (see
        `workbench.sites.batch_rows`), None: the whole batch."""
        access = site(self.site).access
        if access == "modules":
            apply_rows(model, [(self, inputs, layer, row)])
            return
        hidden = batch_rows(site_tensor(model, self.site, layer), row)
        if access == "patches":  # the tower's rows are patches, not LLM positions: every row
            hidden[:] = self.edit(hidden, layer)
            return
        index = to_device(torch.as_tensor(position_index(self.positions, inputs.modality)), hidden)
        hidden[:, index] = self.edit(hidden[:, index], layer)

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        """The site's new value at the selected rows `x` (layer: the per-layer site's index)."""
        raise NotImplementedError

    def bind(self, values: dict[Any, torch.Tensor], own: dict[Any, torch.Tensor]) -> "Intervention":
        """This intervention with the values read at its `source` condition (`values`) and at its
        own (`own`) bound, by layer (kinds that name a source: `needs_source`)."""
        raise NotImplementedError

    def resolve(self, model: ModelLike) -> "Intervention":
        """This intervention with defaults that depend on the model filled in (before a run)."""
        return self

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Intervention":
        """The runtime intervention of a validated spec entry; `common`: site, positions, layers."""
        return cls(**common)


def needs_source(item: Any) -> str | None:
    """The condition whose values `item` needs before it can run, if any."""
    return getattr(item, "source", None)
