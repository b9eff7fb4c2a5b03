"""`logits`: float32 log-softmax of the next-token logits at each step, and the greedy token."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Site, register_site

if TYPE_CHECKING:
    from ..capture import CapturePlan


def capture(plan: CapturePlan, layers: None) -> None:
    plan.logits = True


register_site(Site("logits", 6, stores={"logprobs": ("run", "step", "vocab"), "generated": ("run", "step")},
                   access="head", steps="decode", capture=capture))
