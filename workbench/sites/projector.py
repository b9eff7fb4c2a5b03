"""`projector`: the output of every module whose output enters the LLM as image features
(Qwen3-VL: the merger and every DeepStack merger); edited, not captured (it is `layer` 0 at the
vision tokens)."""

from __future__ import annotations

from .base import Site, register_site


register_site(Site("projector", 3, vision=True, editable=True, access="modules"))
