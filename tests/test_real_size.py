"""Real-size paths without weights: every registered family's model, built at its config class's
default (real) size on the meta device (no weights, nothing downloaded), has every module the family
declares, and its layer counts and hidden size are the config's and the workbench's reading of it."""

from __future__ import annotations

import re

import pytest
import torch
import transformers

from workbench.models.architectures import ARCHITECTURES
from workbench.models.model import info_from_config, vision_depth

# A default config that transformers itself cannot build, and the real checkpoint's value that fixes it.
# transformers 5.25 models/aya_vision/configuration_aya_vision.py: the default SigLIP tower has
# hidden_size 1152 and 14 heads, which SiglipAttention refuses (1152 % 14); aya-vision-8b's has 16.
CORRECTIONS = {"aya_vision": {"vision_config": {"num_attention_heads": 16}}}


def real_config(arch):
    config = getattr(transformers, arch.model_class).config_class()
    for sub, changes in CORRECTIONS.get(arch.family, {}).items():
        for name, value in changes.items():
            setattr(getattr(config, sub), name, value)
    return config


def module_paths(arch) -> list[str]:
    """Every module path the family's record names (decoder-layer branches are relative to a layer)."""
    paths = [arch.embed, arch.decoder_layers, arch.final_norm, arch.lm_head]
    if arch.vision is not None:
        paths += [arch.vision, arch.vision_layers, arch.vision_output[0] if arch.vision_output else None,
                  *arch.projector, *arch.projector_parts.values(), arch.projector_merger]
    return [p for p in paths if p is not None]  # Mllama declares no tower layers whose rows are patches


def resolves(modules: dict, path: str) -> bool:
    """`path` is a module's name; a `*` stands for every index of a module list (which has some)."""
    if "*" not in path:
        return path in modules
    pattern = re.compile(re.escape(path).replace(r"\*", r"\d+") + "$")
    head = path.split(".*", 1)[0]
    indices = {name[len(head) + 1:].split(".")[0] for name in modules if name.startswith(head + ".")}
    return bool(indices) and all(any(pattern.match(n) for n in modules if n.startswith(f"{head}.{i}"))
                                 for i in indices)


@pytest.mark.parametrize("arch", ARCHITECTURES, ids=lambda a: f"{a.family}-{a.model_class}")
def test_the_declared_paths_resolve_at_real_size_on_the_meta_device(arch):
    config = real_config(arch)
    with torch.device("meta"):
        model = getattr(transformers, arch.model_class)(config)
    assert all(p.is_meta for p in model.parameters())  # no weights were made
    modules = dict(model.named_modules())
    missing = [p for p in module_paths(arch) if not resolves(modules, p)]
    assert not missing, f"{arch.family}: no module {missing} in {arch.model_class} at its default size"
    layers = modules[arch.decoder_layers]
    for site, path in arch.branch_outputs.items():
        assert any(path in dict(layer.named_modules()) for layer in layers), f"{arch.family}: no {path} ({site})"

    text = getattr(config, arch.text_config) if arch.text_config else config
    hidden = modules[arch.embed].weight.shape[-1]
    assert isinstance(layers, torch.nn.ModuleList) and len(layers) == text.num_hidden_layers
    assert hidden == text.hidden_size == modules[arch.lm_head].in_features
    info = info_from_config(arch.family, "", config, arch)  # what the workbench reads from the config
    assert (info.n_layers, info.hidden_size) == (len(layers), hidden)
    if arch.vision_layers is not None:
        vision_layers = modules[arch.vision_layers]
        assert isinstance(vision_layers, torch.nn.ModuleList)
        assert len(vision_layers) == vision_depth(config, arch) == info.n_vision_layers
