"""`values`: each listed layer's V at every prompt position, read from the KV
cache after the prompt forward, heads flattened."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Site, register_site
from .readers import add_kv

if TYPE_CHECKING:
    from ..capture import CapturePlan


def capture(plan: CapturePlan, layers: tuple[int, ...]) -> str | None:
    return add_kv(plan, "values", layers)


register_site(Site("values", 4, index="decoder_layer", stores={"values": ("token", "decoder_layer", "kv")}, access="cache",
                   capture=capture))
