"""The registry of model families: one file per family beside this one, registered here.

Each family file declares its `Architecture` (module paths, image and boundary tokens, how inputs
are nested and which processor outputs are kept, per-token input keys) and names its client-only
companion `tiny_<family>.py` (the tiny offline builder and the processor loader, which need
transformers and are never shipped). Adding a family is adding those two files, one name in
`FAMILIES` below, and its tests.

Shipped to NDIF servers with the plan: imports only workbench modules that obey the whitelist.
"""

from __future__ import annotations

from . import aya_vision, gemma3, glm4v, idefics2, idefics3, internvl, llama, llava_onevision, paligemma, qwen2_5_vl, qwen3vl, smolvlm
from . import deepseek_vl, janus, lfm2_vl, llava, llava_next, mistral3, mllama, qwen2_vl, qwen3_vl_moe
from .base import Architecture, PatchGeometry, is_boundary_token, no_positions

# The registered family modules, in the order tables list them.
FAMILIES = (smolvlm, qwen3vl, llama, qwen2_5_vl, llava_onevision, gemma3, internvl, idefics2, paligemma, idefics3,
            aya_vision, glm4v, llava, llava_next, qwen2_vl, mistral3, qwen3_vl_moe, deepseek_vl, janus, mllama, lfm2_vl)

ARCHITECTURES: tuple[Architecture, ...] = tuple(a for family in FAMILIES for a in family.ARCHITECTURES)

SMOLVLM = smolvlm.SMOLVLM
IDEFICS3 = idefics3.IDEFICS3
QWEN3VL = qwen3vl.QWEN3VL
LLAMA = llama.LLAMA

__all__ = ["ARCHITECTURES", "Architecture", "FAMILIES", "PatchGeometry", "no_positions", "architecture_for", "family", "is_boundary_token",
           "tiny_architectures"]


def architecture_for(config_architectures: list[str] | None) -> Architecture:
    """The registered description for a config's `architectures` list."""
    for name in config_architectures or []:
        for arch in ARCHITECTURES:
            if name in arch.config_architectures:
                return arch
    known = sorted(n for a in ARCHITECTURES for n in a.config_architectures)
    raise ValueError(f"unsupported architecture {config_architectures}; supported: {', '.join(known)}")


def family(name: str) -> Architecture:
    """The (first) registered description of family `name`."""
    for arch in ARCHITECTURES:
        if arch.family == name:
            return arch
    raise ValueError(f"unknown family {name!r}; expected one of {', '.join(sorted({a.family for a in ARCHITECTURES}))}")


def tiny_architectures() -> tuple[Architecture, ...]:
    """The families with a tiny offline model, in registry order."""
    return tuple(a for a in ARCHITECTURES if a.tiny)
