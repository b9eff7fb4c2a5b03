"""`projector.merger`: the main merger alone (Qwen3-VL's DeepStack features stay untouched)."""

from __future__ import annotations

from .base import Site, register_site


register_site(Site("projector.merger", 3, vision=True, editable=True, access="modules"))
