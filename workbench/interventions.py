"""Interventions: what a condition changes in the prompt forward, each with its exact semantics.

Each intervention is a small frozen `Record` (it travels to NDIF servers) built from the spec (sweep values substituted)
and applied inside an nnsight trace by `apply(model, inputs, layer)`. `targets()` lists the
(execution-order key, layer) pairs it acts at; the backend sorts every request of a trace by
those keys. Interventions that need values from another run (`patch`, `add` with
`direction_from`) name a `source` condition; the backend runs it first and `bind`s the values.

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
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .models.protocol import ModelLike
from .records import Record
from .sites import (EDITABLE_SITES, PROJECTOR_SITES, batch_rows, connector_modules, order, position_index, site,
                    site_modules, site_tensor, to_device)

__all__ = ["EDITABLE_SITES", "PROJECTOR_SITES", "Intervention", "Scale", "Zero", "Normalize", "Add", "Patch",
           "apply_rows", "build_intervention", "needs_source"]


def apply_rows(model: ModelLike, edits: list[tuple[Any, Any, int | None, tuple[int, int] | None]]) -> None:
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
    _fields = ("site", "positions", "layers")
    _defaults = {"positions": "all", "layers": None}

    def targets(self) -> list[tuple[tuple[int, int, int], int | None]]:
        if site(self.site).index:  # layer, vision_layer
            return [(order(self.site, l, 0), l) for l in self.layers or ()]
        return [(order(self.site, None, 0), None)]

    def apply(self, model: ModelLike, inputs: Any, layer: int | None = None, row: tuple[int, int] | None = None) -> None:
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
        raise NotImplementedError

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Intervention":
        """The runtime intervention of a validated spec entry; `common`: site, positions, layers."""
        return cls(**common)


class Scale(Intervention):
    """Multiply the site's value by `factor` at the selected positions (on `projector`: the
    study's alpha)."""

    _fields = Intervention._fields + ("factor",)
    _defaults = {**Intervention._defaults, "factor": 1.0}

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return x * self.factor

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Scale":
        return cls(**common, factor=float(raw.factor))


class Zero(Intervention):
    """Set the site's value to zero at the selected positions (NaN and Inf included)."""

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return torch.zeros_like(x)


class Normalize(Intervention):
    """Rescale every projector output token to L2 norm `target`: x * target / ‖x‖.

    The default target is the mean L2 norm of the model's text-token embeddings (the rows of the
    input embedding matrix), resolved by the backend; it is the inference-time counterpart of a
    post-projector LayerNorm with gain T/√D."""

    _fields = Intervention._fields + ("target",)
    _defaults = {**Intervention._defaults, "target": "text_embedding_mean"}

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        norm = x.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
        return x * (float(self.target) / norm)

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Normalize":
        return cls(**{**common, "positions": "all"}, target=raw.target)  # every projector row


def random_direction(seed: int, width: int) -> np.ndarray:
    """The unit direction of `add` with `direction: random`: g / ‖g‖ with g ~ N(0, I_width) drawn
    by numpy's PCG64 generator from `seed`, in float64: the same vector on any device or dtype."""
    g = np.random.default_rng(int(seed)).standard_normal(int(width))
    return g / np.linalg.norm(g)


class Add(Intervention):
    """Add `factor` x a vector at the selected positions. The vector is given (`vector`, length
    = the site's width), taken from another condition (`source`): the mean, over the selected
    positions, of (source's value - this condition's value without this edit), or, as a control
    for both, random (`direction == "random"`): n_t · u with u = `random_direction(seed, width)`
    (one direction for every position and layer) and n_t = `norm`, or with norm "matched" the
    token's own ‖x_t‖ at the site, so the edit has the size of the value it edits."""

    _fields = Intervention._fields + ("factor", "vector", "source", "direction", "seed", "norm", "bound")
    _defaults = {**Intervention._defaults, "factor": 1.0, "vector": None, "source": None, "direction": None,
                 "seed": 0, "norm": "matched"}
    _factories = {"bound": dict}
    _hidden = ("bound",)

    def bind(self, values: dict[Any, torch.Tensor], own: dict[Any, torch.Tensor]) -> "Add":
        directions = {k: (values[k] - own[k]).mean(dim=0) for k in values}
        return self.replace(bound=directions)

    def random_step(self, x: torch.Tensor) -> torch.Tensor:
        """n_t · u for every row of x (before `factor`)."""
        u = to_device(torch.as_tensor(random_direction(self.seed, x.shape[-1])), x, x.dtype)
        size = x.norm(dim=-1, keepdim=True) if self.norm == "matched" else float(self.norm)
        return size * u

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        if self.direction == "random":
            return x + self.factor * self.random_step(x)
        if self.source is None:
            direction = to_device(torch.tensor(self.vector, dtype=x.dtype), x)
        else:
            direction = to_device(self.bound[layer], x, x.dtype)
        return x + self.factor * direction

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Add":
        vector = tuple(float(v) for v in raw.vector) if raw.vector is not None else None
        norm = raw.norm if raw.norm == "matched" else float(raw.norm)
        return cls(**common, factor=float(raw.factor), vector=vector, source=raw.direction_from,
                   direction=raw.direction, seed=int(raw.seed), norm=norm)


class Patch(Intervention):
    """Replace the site's value at the selected positions with the `source` condition's value at
    the same positions (same layer). The source must have the same token sequence."""

    _fields = Intervention._fields + ("source", "bound")
    _defaults = {**Intervention._defaults, "source": ""}
    _factories = {"bound": dict}
    _hidden = ("bound",)

    def bind(self, values: dict[Any, torch.Tensor], own: dict[Any, torch.Tensor]) -> "Patch":
        return self.replace(bound=values)

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return to_device(self.bound[layer], x, x.dtype).reshape(x.shape)

    @classmethod
    def from_spec(cls, raw: Any, common: dict[str, Any]) -> "Patch":
        return cls(**common, source=raw.from_)


def needs_source(item: Any) -> str | None:
    """The condition whose values `item` needs before it can run, if any."""
    return getattr(item, "source", None)


# The runtime half of the intervention registry: kind -> the class that runs it. The spec half
# (kind -> spec model) is `workbench.spec.INTERVENTION_SPECS`; `workbench.plan.intervention_registry()`
# joins the two (not here: this module travels to NDIF, where the spec's pydantic cannot). Adding
# a kind is: a spec model there, a class here with `edit` and `from_spec`, one entry in each map.
RUNTIME: dict[str, type[Intervention]] = {
    "scale": Scale,
    "zero": Zero,
    "add": Add,
    "patch": Patch,
    "normalize": Normalize,
}


def build_intervention(raw: Any, layers: tuple[int, ...] | None) -> Intervention:
    """An intervention from a validated spec entry (sweep variables already substituted)."""
    if raw.kind not in RUNTIME:
        raise ValueError(f"unknown intervention kind {raw.kind!r}; expected one of {', '.join(RUNTIME)}")
    positions = getattr(raw, "positions", "all")
    positions = positions if isinstance(positions, str) else tuple(positions)
    common = {"site": raw.site, "positions": positions, "layers": layers}
    return RUNTIME[raw.kind].from_spec(raw, common)
