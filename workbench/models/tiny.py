"""Tiny random-weight models built from the real transformers classes, one per registered family.

Each family's builder (`build_tiny` in `workbench/models/architectures/tiny_<family>.py`) writes a
complete checkpoint directory (config + safetensors weights, tokenizer, image processor config,
chat template) that loads back through the same code path as a real checkpoint:

    cfg = transformers.AutoConfig.from_pretrained(d)
    model = transformers.SmolVLMForConditionalGeneration.from_pretrained(d)   # the family's class
    processor = load_processor(d, "smolvlm")                                  # the family's name

Weights are a pure function of the seed (``torch.manual_seed`` before ``_from_config``); the shared
parts (offline byte-level tokenizers, saving) are in `workbench.models.tinykit`.

Processors: several composite processors (SmolVLM, Qwen-VL, LLaVA-OneVision) insist on a video
processor, and the video processors need torchvision, which must not be installed beside this
torch. ``load_processor`` therefore builds image-only subclasses from the tokenizer and the PIL
image processor (each family's `load_processor`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from .architectures import Architecture
from .architectures import family as _family
from .architectures import tiny_architectures
from .architectures.tiny_llama import LLAMA_CHAT_TEMPLATE, LLAMA_SPECIAL_TOKENS  # noqa: F401
from .architectures.tiny_qwen3vl import QWEN3VL_CHAT_TEMPLATE, QWEN3VL_SPECIAL_TOKENS  # noqa: F401
from .architectures.tiny_smolvlm import SMOLVLM_CHAT_TEMPLATE, SMOLVLM_SPECIAL_TOKENS  # noqa: F401

# Bump when a builder changes: the version is part of the cache directory name, so stale builds
# are never reused.
_VERSION = "v2"  # bump when a builder changes: a cached build of another version is never reused
_DEFAULT_SEED = 0
_MARKER = "tiny_model.json"  # written last; its presence marks a finished build
_BUILD_LOCK = threading.RLock()  # a trained build builds its base tiny model inside


def client(arch):
    """The family's client-only module (`tiny_<family>.py`): `build_tiny`, `load_processor`."""
    return importlib.import_module(f"{__package__}.architectures.{arch.client}")


def _builder(arch) -> Callable[[Path, int], None]:
    def build(out_dir: Path, seed: int) -> None:
        client(arch).build_tiny(Path(out_dir), seed)

    build.__name__ = f"build_{arch.tiny.replace('-', '_')}"
    return build


# name -> builder(out_dir, seed), one per family with a tiny model, in registry order
TINY_MODELS: dict[str, Callable[[Path, int], None]] = {a.tiny: _builder(a) for a in tiny_architectures() if a.tiny}
_FAMILY = {a.tiny: a.family for a in tiny_architectures() if a.tiny}


def _default_root() -> Path:
    cache = os.environ.get("WORKBENCH_CACHE")
    base = Path(cache).expanduser() if cache else Path.home() / ".cache" / "workbench"
    return base / "models"


def tiny_model_dir(name: str, root: Path | None = None) -> Path:
    """Directory of tiny model `name`, building it on first use.

    The directory is ``<root>/<name>-v2``; root defaults to ``$WORKBENCH_CACHE/models`` or
    ``~/.cache/workbench/models``. The model is built into a temporary sibling directory and moved
    into place with ``os.replace``, so a directory that exists is complete; concurrent callers each
    build, one rename wins and the others discard their copy (builds are identical for the seed).
    """
    if name not in TINY_MODELS:
        raise KeyError(f"unknown tiny model {name!r}; known: {sorted(TINY_MODELS)}")
    root = Path(root).expanduser() if root is not None else _default_root()
    marker = {"name": name, "version": _VERSION, "seed": _DEFAULT_SEED, "family": _FAMILY[name]}
    return cached_build(root / f"{name}-{_VERSION}", lambda tmp: TINY_MODELS[name](tmp, _DEFAULT_SEED), marker)


def cached_build(final: Path, build: Callable[[Path], object], marker: dict) -> Path:
    """`final`, built by `build(tmp)` into a temporary sibling and renamed into place unless it
    exists; `marker` is written last into `tiny_model.json`, whose presence marks a finished build."""
    if (final / _MARKER).is_file():
        return final
    if final.exists():
        raise RuntimeError(f"{final} exists but has no {_MARKER}: not a finished tiny-model build; remove it")
    # The lock serialises builds within one process (threads would otherwise share the global
    # torch RNG while seeding); other processes are handled by the atomic rename below.
    with _BUILD_LOCK:
        if (final / _MARKER).is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
            build(tmp)
            (tmp / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            try:
                os.replace(tmp, final)
            except OSError:
                # Another process renamed its finished build into place first (renaming onto a
                # non-empty directory fails). Use theirs.
                if not (final / _MARKER).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_processor(model_dir: Path | str, family: str | Architecture):
    """The processor of a saved checkpoint directory (real or tiny), or a hub id, for `family`
    (a registered family name, or an `Architecture`): the family's own `load_processor` (image-only
    composite processor for VLMs, the tokenizer alone for text models). family "llama" gives the
    tokenizer of any checkpoint."""
    arch = family if isinstance(family, Architecture) else _family(family)  # ValueError naming the known families
    return client(arch).load_processor(model_dir)
