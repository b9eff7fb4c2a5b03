"""Interventions: what a condition changes in the forward pass, each with its exact semantics.

Each intervention is a small frozen dataclass built from the spec (sweep values already
substituted) and applied inside an nnsight trace by `apply(model, inputs)`. `order` places it
among the trace's other requests (nnsight needs them in execution order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .sites import order, position_index, residual_envoy

# sites each kind can act on (others are refused when the plan is compiled)
SCALABLE_SITES = ("projector", "projector.merger", "embed", "layer")


@dataclass(frozen=True)
class Scale:
    """Multiply a site's output by `factor` at the selected positions.

    - `projector`: every module whose output enters the LLM as image features: SmolVLM's connector;
      for Qwen3-VL the merger AND every DeepStack merger (the study's alpha). All of a projector's
      outputs are vision tokens, so positions must be `vision` or `all`.
    - `projector.merger`: the main merger alone (for Qwen3-VL the DeepStack features stay unscaled).
    - `embed`: the token-embedding output (before image features are scattered in).
    - `layer`: the residual stream at each listed layer index (see `workbench.sites`)."""

    site: str
    factor: float
    positions: Any = "all"
    layers: tuple[int, ...] | None = None

    def targets(self) -> list[tuple[tuple[int, int, int], int | None]]:
        if self.site == "layer":
            return [(order("layer", l, 0), l) for l in self.layers or ()]
        return [(order(self.site, None, 0), None)]

    def apply(self, model: Any, inputs: Any, layer: int | None = None) -> None:
        if self.site in ("projector", "projector.merger"):
            paths = model.arch.projector if self.site == "projector" else (model.arch.projector_merger,)
            for path in paths:
                for envoy in model.module(path):
                    envoy.output[:] = envoy.output * self.factor
            return
        index = torch.as_tensor(position_index(self.positions, inputs.modality))
        if self.site == "embed":
            hidden = model.module(model.arch.embed)[0].output
        else:
            hidden = residual_envoy(model, layer).input
        hidden[:, index] = hidden[:, index] * self.factor


@dataclass(frozen=True)
class Zero(Scale):
    """Set a site's output to zero at the selected positions (`Scale` with factor 0, except that
    NaN or Inf values are zeroed too)."""

    factor: float = 0.0

    def apply(self, model: Any, inputs: Any, layer: int | None = None) -> None:
        if self.site in ("projector", "projector.merger"):
            paths = model.arch.projector if self.site == "projector" else (model.arch.projector_merger,)
            for path in paths:
                for envoy in model.module(path):
                    envoy.output[:] = 0
            return
        index = torch.as_tensor(position_index(self.positions, inputs.modality))
        hidden = model.module(model.arch.embed)[0].output if self.site == "embed" else residual_envoy(model, layer).input
        hidden[:, index] = 0


def build_intervention(spec_item: Any) -> Scale:
    """An intervention object from a validated spec entry (sweep variables already substituted)."""
    kind = spec_item.kind
    positions = spec_item.positions if isinstance(spec_item.positions, str) else tuple(spec_item.positions)
    layers = None if getattr(spec_item, "layers", "all") == "all" else tuple(spec_item.layers)
    if kind == "scale":
        return Scale(site=spec_item.site, factor=float(spec_item.factor), positions=positions, layers=layers)
    if kind == "zero":
        return Zero(site=spec_item.site, positions=positions, layers=layers)
    raise NotImplementedError(f"intervention kind {kind!r} is not implemented yet")
