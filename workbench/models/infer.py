"""A model nobody registered: its module map inferred from the layouts of the registered families.

A checkpoint whose config names no registered class (e.g. `vipllava`, whose modules are LLaVA's)
is built on the meta device from its config alone (no weights: accelerate's `init_empty_weights`
idea, with torch's own `torch.device("meta")` context), and its module tree is matched against
every registered family's declared module paths (`declared_paths`). A family fits when all its
paths resolve, its layer lists are `ModuleList`s as long as the config says and its sub-configs
exist; of the families that fit, the one whose language model and vision tower (in its config
class's defaults) are of the model's own types is taken, then the first registered. The model is
read with that family's paths, quirks and processor loader, under its own model type. A model that
follows no layout gets one message naming, for the nearest layouts, the paths it lacks.

Client side only (transformers, torch): never shipped to a server.
"""

from __future__ import annotations

from typing import Any

from ..errors import ModelError
from .architectures import ARCHITECTURES, Architecture
from .model import ModelInfo, UnregisteredModelError, info_from_config, model_info

__all__ = ["Layout", "declared_paths", "infer_architecture", "inferred_info", "layout_problems", "meta_model"]


def declared_paths(arch: Architecture) -> dict[str, str]:
    """{role: module path} of every module the family declares, e.g. {"embed":
    "model.language_model.embed_tokens", "projector.linear_1": ..., "attn_out": ".../layers.0.self_attn"}.
    Decoder-layer branches are given inside the first decoder layer."""
    paths = {"embed": arch.embed, "decoder_layers": arch.decoder_layers, "final_norm": arch.final_norm,
             "lm_head": arch.lm_head}
    if arch.is_multimodal:
        paths.update(vision=arch.vision or "", vision_layers=arch.vision_layers or "",
                     vision_output=arch.vision_output[0] if arch.vision_output else "")
        paths.update({f"projector[{i}]": p for i, p in enumerate(arch.projector)})
        if arch.projector_merger:
            paths["projector.merger"] = arch.projector_merger
        paths.update({f"projector.{part}": p for part, p in arch.projector_parts.items()})
    paths.update({site: f"{arch.decoder_layers}.0.{p}" for site, p in arch.branch_outputs.items()})
    return {role: path for role, path in paths.items() if path}


def _resolves(model: Any, path: str) -> bool:
    """Whether `path` names a module of `model`; a `*` component (as `WorkbenchModel.module` reads
    it) stands for every child of a non-empty list of modules."""
    head, star, rest = path.partition(".*")
    try:
        found = model.get_submodule(head)
    except AttributeError:
        return False
    if not star:
        return True
    children = list(found.children())
    rest = rest.removeprefix(".")
    return bool(children) and all(_resolves(child, rest) if rest else True for child in children)


def layout_problems(arch: Architecture, model: Any, config: Any) -> list[str]:
    """What `model` (a transformers model built from `config`) lacks to be read as family `arch`:
    module paths that do not resolve, sub-configs that are absent, layer lists of another length."""
    import torch

    missing = [path for path in declared_paths(arch).values() if not _resolves(model, path)]
    problems = [f"no module {path}" for path in missing]
    for sub in (arch.text_config, arch.vision_config if arch.is_multimodal else None):
        if sub and getattr(config, sub, None) is None:
            problems.append(f"no config.{sub}")
    if problems:
        return problems
    text = getattr(config, arch.text_config) if arch.text_config else config
    lists = [(arch.decoder_layers, getattr(text, "num_hidden_layers", None))]
    if arch.is_multimodal and arch.vision_layers:
        vision = getattr(config, arch.vision_config)
        depth = getattr(vision, "num_hidden_layers", None)
        lists.append((arch.vision_layers, depth if depth is not None else getattr(vision, "depth", None)))
    for path, expected in lists:
        layers = model.get_submodule(path)
        if not isinstance(layers, torch.nn.ModuleList):
            problems.append(f"{path} is a {type(layers).__name__}, not a ModuleList of layers")
        elif expected is None or len(layers) != int(expected):
            problems.append(f"{path} holds {len(layers)} layers, the config {expected}")
    return problems


def meta_model(config: Any, class_name: str) -> Any:
    """The transformers model `class_name` built from `config` on the meta device: every module,
    no weights, nothing read or downloaded."""
    import torch
    import transformers

    model_class = getattr(transformers, class_name, None)
    if model_class is None:
        raise ModelError(f"model class {class_name!r} (the config's architectures) is not in transformers "
                         f"{transformers.__version__}; expected a class transformers ships (no remote code)")
    with torch.device("meta"):
        return model_class(config)


def _sub_types(config: Any, arch: Architecture) -> tuple[str | None, str | None]:
    """(model type of the language model, of the vision tower) of a config read as `arch`."""
    text = getattr(config, arch.text_config, None) if arch.text_config else config
    vision = getattr(config, arch.vision_config, None) if arch.is_multimodal else None
    return getattr(text, "model_type", None), getattr(vision, "model_type", None)


def _same_parts(arch: Architecture, config: Any) -> int:
    """How many of the family's parts (language model, vision tower) are, in its config class's
    defaults, of the same model type as in `config`."""
    import transformers

    family_config = getattr(transformers, arch.model_class).config_class()
    return sum(a == b and a is not None for a, b in zip(_sub_types(family_config, arch), _sub_types(config, arch)))


class Layout:
    """An inferred module map: `arch` (the matched family's paths and quirks under the model's own
    type and class) and `matched` (the registered family whose layout it follows)."""

    def __init__(self, arch: Architecture, matched: Architecture):
        self.arch, self.matched = arch, matched

    def describe(self) -> str:
        return (f"model type {self.arch.family!r} ({self.arch.model_class}) is not registered; its modules follow "
                f"the layout of family {self.matched.family!r} ({self.matched.model_class}): read with its module "
                f"paths, quirks and processor")


def infer_architecture(config: Any) -> Layout:
    """The layout of the first registered family that `config`'s model follows (ModelError naming
    what the nearest layouts lack where none fits)."""
    model_type = getattr(config, "model_type", "?")
    names = list(getattr(config, "architectures", None) or [])
    if not names:
        raise ModelError(f"model type {model_type!r} is not registered and its config names no model class "
                         "(`architectures`); expected a config saved with save_pretrained")
    model = meta_model(config, names[0])
    tried = [(arch, layout_problems(arch, model, config)) for arch in ARCHITECTURES]
    fits = [arch for arch, problems in tried if not problems]
    if fits:
        # several layouts can fit (LLaVA's paths are LLaVA-OneVision's): the one whose own
        # language model and vision tower are of this model's types, then the first registered
        best = max(fits, key=lambda arch: _same_parts(arch, config))
        inferred = best.replace(family=model_type, model_class=names[0], config_architectures=tuple(names),
                                tiny=None, hub_id=None)
        return Layout(inferred, best)
    nearest = sorted(tried, key=lambda t: len(t[1]))[:3]
    lacks = "; ".join(f"{a.family}: {', '.join(p[:4])}{' ...' if len(p) > 4 else ''}" for a, p in nearest)
    raise ModelError(f"model type {model_type!r} ({names[0]}) is not registered and its modules follow no known "
                     f"layout; the nearest layouts lack what this model does not have ({lacks})",
                     hint="add a family file under workbench/models/architectures/ (docs/families.md)")


def inferred_info(model_id: str) -> tuple[ModelInfo, Layout | None]:
    """`model_info(model_id)`, or, for a model of an unregistered type, its info read through the
    inferred layout (with that layout; None for a registered model)."""
    try:
        return model_info(model_id), None
    except UnregisteredModelError as exc:
        layout = infer_architecture(exc.config)
        return info_from_config(model_id, exc.path, exc.config, layout.arch), layout
