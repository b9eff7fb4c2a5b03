"""Mllama (Llama 3.2 Vision), the cross-attention family: the image never enters the token
sequence. Its tiny model's image matters (the gates transformers zero-initialises are set); its
cross-attention K/V are a site equal to what plain hooks read; α, the blank image and `kv_swap`
(the donor image's cross-attention K/V) act through the cross-attention layers; the labels hold
no vision position; what does not apply is refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.traces import SAMPLE, hooked, plan_for, run
from workbench.plan import PlanError

NAME = "tiny-mllama"
ATOL = 1e-5


@pytest.fixture(scope="module")
def model(load_tiny):
    return load_tiny(NAME)


def test_the_image_matters_and_the_labels_hold_no_vision_position(model):
    real = model.encode(SAMPLE.image, SAMPLE.question)
    blank = model.encode(SAMPLE.image, SAMPLE.question, "blank")
    marker = real.input_ids == model.hf.config.image_token_id
    assert marker.sum() == 1 and (real.modality[marker] == "boundary").all()
    assert not (real.modality == "vision").any()
    np.testing.assert_array_equal(blank.input_ids, real.input_ids)
    with_image, _ = hooked(model, real.encoding)
    with_blank, _ = hooked(model, blank.encoding)
    after = np.flatnonzero(marker)[0] + 1   # the tokens after the marker cross-attend to the image
    assert np.abs(with_image[after:, -1] - with_blank[after:, -1]).max() > 1e-3
    # up to the first cross-attention layer the image is nowhere
    first = model.info.cross_attention_layers[0]
    np.testing.assert_array_equal(with_image[:, :first + 1], with_blank[:, :first + 1])
    gates = [l.cross_attn_attn_gate for l in model.hf.model.language_model.layers if hasattr(l, "cross_attn")]
    assert len(gates) == len(model.info.cross_attention_layers) and all(float(g.detach()) != 0 for g in gates)


def _hooked_cross_kv(model, encoding):
    """Each cross-attention layer's K (k_norm's output) and V (v_proj's output) by plain forward
    hooks: {name: (vision token, layer, head, head dim)}."""
    seen = {"cross_keys": [], "cross_values": []}
    hooks = []
    for l in model.info.cross_attention_layers:
        attention = model.hf.model.language_model.layers[l].cross_attn
        heads, head_dim = attention.num_key_value_heads, attention.head_dim
        hooks.append(attention.k_norm.register_forward_hook(
            lambda m, a, out: seen["cross_keys"].append(out[0].transpose(0, 1).detach().clone())))
        hooks.append(attention.v_proj.register_forward_hook(
            lambda m, a, out, h=heads, d=head_dim: seen["cross_values"].append(out[0].reshape(-1, h, d).detach().clone())))
    try:
        model.prepare()
        with torch.inference_mode():
            model.hf(**encoding)
    finally:
        for h in hooks:
            h.remove()
    return {k: torch.stack(v, dim=1).numpy() for k, v in seen.items()}


def test_cross_kv_matches_plain_hooks(model):
    plan = plan_for(model, "  baseline: {}", "[{site: cross_kv}]")
    result, inputs = run(model, plan, "baseline")
    reference = _hooked_cross_kv(model, inputs["real"].encoding)
    n_vision = model.hf.model.vision_model.num_patches           # one tile: its patches and CLS
    heads, head_dim = model.info.kv_heads, model.info.head_dim
    for name in ("cross_keys", "cross_values"):
        assert result.patches[name].shape == (n_vision, len(model.info.cross_attention_layers), heads, head_dim)
        np.testing.assert_allclose(result.patches[name], reference[name], atol=ATOL, rtol=0)
    assert list(plan.capture.coords()["cross_keys"]["cross_layer"]) == list(model.info.cross_attention_layers)


def test_alpha_scales_the_projector_output_and_blank_changes_the_stream(model):
    plan = plan_for(model, """\
  baseline: {}
  blank: {image: blank}
  one: {interventions: [{kind: scale, site: projector, factor: 1.0}]}
  three: {interventions: [{kind: scale, site: projector, factor: 3.0}]}""")
    base, inputs = run(model, plan, "baseline")
    one, _ = run(model, plan, "one")
    three, _ = run(model, plan, "three")
    blank, _ = run(model, plan, "blank")
    np.testing.assert_array_equal(one.tokens["hidden"], base.tokens["hidden"])
    reference, _ = hooked(model, inputs["real"].encoding, projector_factor=3.0)
    np.testing.assert_allclose(three.tokens["hidden"], reference, atol=ATOL, rtol=0)
    assert np.abs(three.tokens["hidden"] - base.tokens["hidden"]).max() > 1e-3
    blank_reference, _ = hooked(model, inputs["blank"].encoding)
    np.testing.assert_allclose(blank.tokens["hidden"], blank_reference, atol=ATOL, rtol=0)
    assert np.abs(blank.tokens["hidden"] - base.tokens["hidden"]).max() > 1e-3


def test_kv_swap_takes_the_donor_images_cross_attention_kv(model):
    """A KV swap from the blank image: the last prompt token reads the blank image's
    cross-attention K/V over the real prompt's cache. Reference, plain transformers calls: the
    real prompt but its last token prefilled, the blank prompt's cache copied in at the
    cross-attention layers, then the last token."""
    plan = plan_for(model, "  baseline: {}\n  blank: {image: blank}\n  swapped: {kv_swap: {donor: blank}}",
                    "[{site: logits}]")
    swapped, inputs = run(model, plan, "swapped")
    assert plan.condition("swapped").kv_swap.layers == tuple(model.info.cross_attention_layers)
    real, blank = inputs["real"].encoding, inputs["blank"].encoding
    head = {k: (v[:, :-1] if k in model.arch.per_token_keys else v) for k, v in real.items()}
    with torch.inference_mode():
        cache = model.hf(**head, use_cache=True).past_key_values
        donor = model.hf(**blank, use_cache=True).past_key_values
        for l in model.info.cross_attention_layers:
            cache.layers[l].keys.copy_(donor.layers[l].keys)
            cache.layers[l].values.copy_(donor.layers[l].values)
        out = model.hf(input_ids=real["input_ids"][:, -1:], past_key_values=cache, use_cache=True)
    reference = torch.log_softmax(out.logits[0, -1].float(), -1).numpy()
    np.testing.assert_allclose(swapped.run["logprobs"][0, 0], reference, atol=ATOL)
    base, _ = run(model, plan, "baseline")
    assert np.abs(swapped.run["logprobs"][0, 0] - base.run["logprobs"][0, 0]).max() > 1e-4


@pytest.mark.parametrize("conditions, capture, match", [
    ("  a: {kv_swap: {donor: b, layers: [0]}}\n  b: {image: blank}", "[{site: logits}]",
     r"layers \[0\] self-attend over the text"),
    ("  a: {kv_swap: {donor: b, positions: text}}\n  b: {image: blank}", "[{site: logits}]",
     "image is not in the token sequence"),
    ("  a: {image: none, kv_swap: {donor: b}}\n  b: {image: none}", "[{site: logits}]", "a run without an image"),
    ("  a: {}", "[{site: keys, layers: [1]}]", r"layers \[1\] cross-attend to the image"),
    ("  a: {}", "[{site: attention, layers: [0, 1]}]", r"layers \[1\] cross-attend"),
    ("  a: {}", "[{site: vision_layer}]", "declares no vision-tower layers"),
])
def test_what_does_not_apply_is_refused_with_the_reason(model, conditions, capture, match):
    with pytest.raises(PlanError, match=match):
        plan_for(model, conditions, capture)


def test_self_attention_sites_take_the_self_attention_layers(model):
    plan = plan_for(model, "  a: {}", "[{site: keys}, {site: values}, {site: attn_out}, {site: cross_kv}]")
    coords = plan.capture.coords()
    self_layers = [l for l in range(model.n_layers) if l not in model.info.cross_attention_layers]
    assert list(coords["keys"]["decoder_layer"]) == self_layers == list(model.info.attention_layers)
    assert list(coords["attn_out"]["decoder_layer"]) == self_layers
    assert list(coords["cross_keys"]["cross_layer"]) == list(model.info.cross_attention_layers)
    result, inputs = run(model, plan, "a")
    _, out = hooked(model, inputs["real"].encoding)
    model.prepare()
    with torch.inference_mode():
        cache = model.hf(**inputs["real"].encoding, use_cache=True).past_key_values
    n = inputs["real"].n_tokens
    for i, l in enumerate(self_layers):
        reference = cache.layers[l].keys[0].permute(1, 0, 2).reshape(n, -1).numpy()
        np.testing.assert_allclose(result.tokens["keys"][:, i], reference, atol=ATOL, rtol=0)


def test_the_processor_reads_pil_images(model):
    from transformers import MllamaImageProcessorPil

    assert type(model.processor.image_processor) is MllamaImageProcessorPil
    inputs = model.encode(SAMPLE.image.convert("L"), SAMPLE.question)
    assert inputs.encoding["pixel_values"].shape[-2:] == (32, 32)
    assert inputs.encoding["cross_attention_mask"].shape[1] == inputs.n_tokens



@pytest.fixture(scope="module")
def two_tiles(tmp_path_factory):
    """The tiny Mllama with images of up to two tiles: a square image fills one, the other is padding."""
    from workbench.models.architectures.tiny_mllama import build_tiny
    from workbench.models.model import load_model

    out = tmp_path_factory.mktemp("mllama-two-tiles")
    build_tiny(out, seed=0, tiles=2)
    return load_model(str(out), device="cpu", dtype="float32", attn="eager")


@pytest.mark.parametrize("which", ["tiny", "two tiles"])
def test_greedy_decode_is_transformers_generate(model, two_tiles, which):
    """Every decode step's log-probs equal `generate`'s, which repeats the last prompt token's
    cross-attention mask row at each new token. With a padding tile (the mask row [1, 0]) a
    decode step that passed no mask would read the padding tile too."""
    from PIL import Image

    from workbench.backends.local import run_condition
    from workbench.data import Sample
    from workbench.runner import LazyInputs

    model = two_tiles if which == "two tiles" else model
    plan = plan_for(model, "  baseline: {}", "[{site: logits}]", generate=3)
    square = Image.new("RGB", (48, 48), (20, 40, 160))
    square.paste((250, 200, 0), (8, 8, 30, 30))
    inputs = LazyInputs(model, Sample(id="square/0", image=square, question=SAMPLE.question, category="color"))
    ours = run_condition(model, inputs, plan.condition("baseline"), plan)
    encoding = inputs["real"].encoding
    if which == "two tiles":
        assert encoding["cross_attention_mask"][0, -1].flatten().tolist() == [1, 0]
    model.prepare()
    with torch.inference_mode():
        out = model.hf.generate(**encoding, max_new_tokens=3, do_sample=False,
                                output_logits=True, return_dict_in_generate=True)
    reference = np.stack([torch.log_softmax(step[0].float(), -1).numpy() for step in out.logits])
    np.testing.assert_allclose(ours.run["logprobs"][0], reference, atol=ATOL)
