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

import torch

from .records import Record
from .sites import EDITABLE_SITES, PROJECTOR_SITES, order, position_index, site, site_envoys, site_tensor

__all__ = ["EDITABLE_SITES", "PROJECTOR_SITES", "Intervention", "Scale", "Zero", "Normalize", "Add", "Patch",
           "build_intervention", "needs_source"]


class Intervention(Record):
    _fields = ("site", "positions", "layers")
    _defaults = {"positions": "all", "layers": None}

    def targets(self) -> list[tuple[tuple[int, int, int], int | None]]:
        if site(self.site).index:  # layer, vision_layer
            return [(order(self.site, l, 0), l) for l in self.layers or ()]
        return [(order(self.site, None, 0), None)]

    def apply(self, model: Any, inputs: Any, layer: int | None = None) -> None:
        access = site(self.site).access
        if access == "modules":
            for envoy in site_envoys(model, self.site):
                envoy.output[:] = self.edit(envoy.output, None)
            return
        hidden = site_tensor(model, self.site, layer)
        if access == "patches":  # the tower's rows are patches, not LLM positions: every row
            hidden[:] = self.edit(hidden, layer)
            return
        index = torch.as_tensor(position_index(self.positions, inputs.modality), device=hidden.device)
        hidden[:, index] = self.edit(hidden[:, index], layer)

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        raise NotImplementedError


class Scale(Intervention):
    """Multiply the site's value by `factor` at the selected positions (on `projector`: the
    study's alpha)."""

    _fields = Intervention._fields + ("factor",)
    _defaults = {**Intervention._defaults, "factor": 1.0}

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        return x * self.factor


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


class Add(Intervention):
    """Add `factor` x a vector at the selected positions. The vector is given (`vector`, length
    = the site's width) or taken from another condition (`source`): the mean, over the selected
    positions, of (source's value - this condition's value without this edit)."""

    _fields = Intervention._fields + ("factor", "vector", "source", "bound")
    _defaults = {**Intervention._defaults, "factor": 1.0, "vector": None, "source": None}
    _factories = {"bound": dict}
    _hidden = ("bound",)

    def bind(self, values: dict[Any, torch.Tensor], own: dict[Any, torch.Tensor]) -> "Add":
        directions = {k: (values[k] - own[k]).mean(dim=0) for k in values}
        return self.replace(bound=directions)

    def edit(self, x: torch.Tensor, layer: int | None) -> torch.Tensor:
        if self.source is None:
            direction = torch.tensor(self.vector, dtype=x.dtype, device=x.device)
        else:
            direction = self.bound[layer].to(x.device, x.dtype)
        return x + self.factor * direction


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
        return self.bound[layer].to(x.device, x.dtype).reshape(x.shape)


def needs_source(item: Any) -> str | None:
    """The condition whose values `item` needs before it can run, if any."""
    return getattr(item, "source", None)


def build_intervention(raw: Any, layers: tuple[int, ...] | None) -> Intervention:
    """An intervention from a validated spec entry (sweep variables already substituted)."""
    positions = getattr(raw, "positions", "all")
    positions = positions if isinstance(positions, str) else tuple(positions)
    common = {"site": raw.site, "positions": positions, "layers": layers}
    if raw.kind == "scale":
        return Scale(**common, factor=float(raw.factor))
    if raw.kind == "zero":
        return Zero(**common)
    if raw.kind == "normalize":
        return Normalize(**{**common, "positions": "all"}, target=raw.target)
    if raw.kind == "add":
        vector = tuple(float(v) for v in raw.vector) if raw.vector is not None else None
        return Add(**common, factor=float(raw.factor), vector=vector, source=raw.direction_from)
    if raw.kind == "patch":
        return Patch(**common, source=raw.from_)
    raise ValueError(f"unknown intervention kind {raw.kind!r}")
