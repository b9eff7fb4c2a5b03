"""Captures: which tensors a trace saves, read at their sites and moved to CPU float32 at once.

The stored residual stream `hidden` has dims (token, layer, dim); `layer` follows the convention in
`workbench.sites` (0 = LLM input, l = after l decoder layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .sites import order, residual_envoy

CAPTURABLE_SITES = ("layer",)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    # copy=True: on CPU in float32 `.to` would return the same tensor, which later in-place
    # edits in the forward could still change.
    return tensor.detach().to("cpu", dtype=torch.float32, copy=True)


@dataclass(frozen=True)
class ResidualCapture:
    """The residual stream at each listed layer index, for every position of the sequence."""

    layers: tuple[int, ...]
    variable: str = "hidden"

    def targets(self) -> list[tuple[tuple[int, int, int], int]]:
        return [(order("layer", l, 1), l) for l in self.layers]

    def read(self, model: Any, inputs: Any, layer: int, saved: dict[str, Any]) -> None:
        saved.setdefault(self.variable, []).append(to_host(residual_envoy(model, layer).input[0]))

    def finish(self, saved: dict[str, Any]) -> dict[str, Any]:
        """Stack per-layer captures into the stored (token, layer, dim) array."""
        return {self.variable: torch.stack(saved[self.variable], dim=1).numpy()}
