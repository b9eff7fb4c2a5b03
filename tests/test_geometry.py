"""Patch geometry: every VLM family declares where its vision tokens sit in the image, and each
tiny model's stored boxes agree with an independent measurement.

The measurement (plain torch and transformers, no workbench code on the model's side): the tiny
model with every vision-tower layer made the identity (a forward hook returns the layer's input),
so a vision token depends only on the pixels of the patches its connector merges into it (patch
embedding, per-row norms, pixel shuffle, 2x2 merges, average pooling and per-token MLPs are all
local; the tower's attention is what would spread a change over the whole image). One region R of
the image is repainted, and the changed tokens are the rows of the first decoder layer's input
(the projector output as the LLM receives it) that differ between the two forwards.

What is asserted, with M = 7 pixels (the reach of a bicubic kernel, 2 source pixels, at the
processors' largest downscale of the 96 x 64 test image, 3x, plus one):
- every changed token's stored box meets R grown by M (nothing outside R's neighbourhood moves);
- every token whose box meets R shrunk by M changed (every token that sees R moves);
- some tokens changed and some did not (the region is local).
A family declaring no positions (Idefics2's perceiver resampler) is checked the other way: every
one of its latents changes, so no latent has a place. A cross-attention family (Mllama) has no
vision token at all: its image marker is a boundary token, no token holds geometry, and the
repainted region moves the projector output (the cross-attention K/V) but not one row of the
first decoder layer's input.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from workbench.models.architectures import ARCHITECTURES, Architecture, PatchGeometry, tiny_architectures
from workbench.models.geometry import GEOMETRY_LABELS, LAYOUTS, NONE, layout_for
from workbench.models.model import InputEncoder, model_info
from workbench.models.tiny import tiny_model_dir
from workbench.names import GEOMETRY_LABELS as STORED_LABELS

VLMS = [a for a in ARCHITECTURES if a.is_multimodal]
TINY_VLMS = [a for a in tiny_architectures() if a.is_multimodal]
REGION = (4, 4, 36, 28)  # x0, y0, x1, y1 in the 96 x 64 image: a corner, so that even a 2 x 2 grid has tokens that do not see it
MARGIN = 7


@pytest.mark.parametrize("arch", VLMS, ids=lambda a: a.family)
def test_every_vlm_family_declares_geometry_or_no_positions(arch: Architecture) -> None:
    declared = arch.geometry
    assert isinstance(declared, PatchGeometry), (
        f"family {arch.family}: Architecture.geometry must be a PatchGeometry (a layout, or no_positions(reason))")
    if declared.layout is None:
        assert declared.reason.strip(), f"family {arch.family} declares no positions without a reason"
    else:
        assert declared.layout in LAYOUTS or arch.client, f"family {arch.family}: layout {declared.layout!r} is unknown"
        assert callable(layout_for(arch))


def test_text_models_declare_none_and_the_store_reserves_the_labels() -> None:
    assert all(a.geometry is None for a in ARCHITECTURES if not a.is_multimodal)
    assert STORED_LABELS == GEOMETRY_LABELS


def _noise(seed: int, size: tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)


def _first_layer_input(hf: torch.nn.Module, arch: Architecture, encoding: dict) -> torch.Tensor:
    """The first decoder layer's input hidden states for `encoding` (1, seq, d)."""
    seen: list[torch.Tensor] = []

    def grab(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append((args[0] if args else kwargs["hidden_states"]).detach().clone())

    handle = hf.get_submodule(arch.decoder_layers)[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        if hasattr(hf.model, "rope_deltas"):
            hf.model.rope_deltas = None
        with torch.no_grad():
            hf(**encoding)
    finally:
        handle.remove()
    return seen[0][0]


def _identity(module: torch.nn.Module, args: tuple, kwargs: dict, output: object) -> object:
    given = args[0] if args else kwargs["hidden_states"]
    return (given, *output[1:]) if isinstance(output, tuple) else given


def _load(arch: Architecture) -> tuple[InputEncoder, torch.nn.Module]:
    encoder = InputEncoder(model_info(arch.tiny))
    hf = getattr(transformers, arch.model_class).from_pretrained(str(tiny_model_dir(arch.tiny)), dtype=torch.float32)
    return encoder, hf.eval()


def _encode_pair(encoder: InputEncoder, size: tuple[int, int], region: tuple[int, int, int, int]) -> tuple:
    """The prompt encoded with a noise image of `size`, and with `region` of it repainted."""
    base = _noise(1, size)
    repainted = base.copy()
    x0, y0, x1, y1 = region
    repainted[y0:y1, x0:x1] = _noise(2, (x1 - x0, y1 - y0))
    inputs = encoder.encode(Image.fromarray(base), "What is shown?")
    other = encoder.encode(Image.fromarray(repainted), "What is shown?")
    assert np.array_equal(inputs.input_ids, other.input_ids)
    return inputs, other


def _measure(arch: Architecture, size: tuple[int, int] = (96, 64),
             region: tuple[int, int, int, int] = REGION) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
    """(changed, geometry) over the prompt's vision tokens: which tokens' projector output moved
    when `region` of a `size` image was repainted, and the geometry the encoder stores for them."""
    encoder, hf = _load(arch)
    for layer in hf.get_submodule(arch.vision_layers):
        layer.register_forward_hook(_identity, with_kwargs=True)
    inputs, other = _encode_pair(encoder, size, region)
    a = _first_layer_input(hf, arch, inputs.encoding)
    b = _first_layer_input(hf, arch, other.encoding)
    vision = inputs.modality == "vision"
    delta = (a - b).abs().amax(dim=-1).numpy()[vision]
    changed = delta > 1e-5 * float(a.abs().max())
    geometry = None if inputs.geometry is None else {k: v[vision] for k, v in inputs.geometry.items()}
    if inputs.geometry is not None:
        assert all((v[~vision] == NONE).all() for v in inputs.geometry.values()), "a non-vision token holds a place"
    return changed, geometry


def _meets(boxes: np.ndarray, region: tuple[float, float, float, float]) -> np.ndarray:
    x0, y0, x1, y1 = region
    return (boxes[:, 0] < x1) & (boxes[:, 2] > x0) & (boxes[:, 1] < y1) & (boxes[:, 3] > y0)


@pytest.mark.parametrize("arch", TINY_VLMS, ids=lambda a: a.family)
def test_stored_boxes_are_the_tokens_a_region_reaches(arch: Architecture) -> None:
    if arch.cross_attention_layers:
        _check_cross_attention_places_no_token(arch)
        return
    changed, geometry = _measure(arch)
    if arch.geometry.layout is None:
        assert geometry is None
        assert changed.all(), f"{arch.family} declares no positions, yet a local change moved only some latents"
        return
    assert geometry is not None
    boxes = np.stack([geometry[k] for k in ("box_x0", "box_y0", "box_x1", "box_y1")], axis=1).astype(np.float64)
    placed = geometry["tile"] >= 0
    x0, y0, x1, y1 = REGION
    grown = placed & _meets(boxes, (x0 - MARGIN, y0 - MARGIN, x1 + MARGIN, y1 + MARGIN))
    shrunk = placed & _meets(boxes, (x0 + MARGIN, y0 + MARGIN, x1 - MARGIN, y1 - MARGIN))
    assert changed.any() and not changed.all(), f"{arch.family}: {changed.sum()} of {changed.size} tokens changed"
    outside = np.flatnonzero(changed & ~grown)
    assert not len(outside), f"{arch.family}: tokens {outside.tolist()} changed, their boxes {boxes[outside].tolist()} miss R"
    missed = np.flatnonzero(shrunk & ~changed)
    assert not len(missed), f"{arch.family}: tokens {missed.tolist()} cover R ({boxes[missed].tolist()}) but did not change"


def _check_cross_attention_places_no_token(arch: Architecture) -> None:
    """The image reaches a cross-attention family's decoder only as K/V: repainting a region moves
    the projector's output, while no token is vision, none holds a place, and the first decoder
    layer's input is the same for both images."""
    assert arch.geometry is not None and arch.geometry.layout is None
    encoder, hf = _load(arch)
    inputs, other = _encode_pair(encoder, (96, 64), REGION)
    assert not (inputs.modality == "vision").any(), f"{arch.family}: a token is labelled vision"
    marker = inputs.input_ids == encoder.image_token_id
    assert marker.sum() == 1 and (inputs.modality[marker] == "boundary").all()
    assert inputs.geometry is None
    projected: list[torch.Tensor] = []
    handle = hf.get_submodule(arch.projector_merger).register_forward_hook(
        lambda module, args, output: projected.append(output.detach().clone()))
    a = _first_layer_input(hf, arch, inputs.encoding)
    b = _first_layer_input(hf, arch, other.encoding)
    handle.remove()
    assert not torch.equal(projected[0], projected[1]), f"{arch.family}: the repainted region did not reach the K/V"
    assert torch.equal(a, b), f"{arch.family}: a token of the residual stream carries the image before the first layer"


PADDED = [a for a in TINY_VLMS if a.geometry is not None and a.geometry.layout == "padded_square_grid"]


@pytest.mark.parametrize("arch", PADDED, ids=lambda a: a.family)
def test_tokens_wholly_over_the_padding_have_no_place(arch: Architecture) -> None:
    """A 96 x 16 image is resized to 32 x 8 and centred on a 32 x 32 square: of the 4 x 4 token
    rows, the first and last lie wholly over the background colour. Repainting the whole image
    moves exactly the tokens that have a place; those over the padding hold -1 in every label."""
    changed, geometry = _measure(arch, (96, 16), (0, 0, 96, 16))
    assert geometry is not None
    placed = geometry["tile"] >= 0
    assert placed.any() and not placed.all(), f"{arch.family}: {placed.sum()} of {placed.size} tokens placed"
    assert np.array_equal(changed, placed), f"{arch.family}: moved {changed.tolist()}, placed {placed.tolist()}"
    assert all((v[~placed] == NONE).all() for v in geometry.values())
    boxes = np.stack([geometry[k] for k in ("box_x0", "box_y0", "box_x1", "box_y1")], axis=1)[placed]
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 96).all() and (boxes[:, 3] <= 16).all()
