"""LFM2-VL, the hybrid family (short convolutions and attention): the residual stream at every
layer; K/V, attention and keys only at the attention layers, whose indices the stored coordinate
holds; `kv_swap` over the attention layers (a convolution layer's rolling state is refused with
the reason); α = 1 equals the baseline and α = 3 moves the stream. Each against plain
transformers calls on the same model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.traces import SAMPLE, hooked, plan_for, run
from workbench.plan import PlanError

NAME = "tiny-lfm2_vl"
ATOL = 1e-5


@pytest.fixture(scope="module")
def model(load_tiny):
    return load_tiny(NAME)


def test_attention_layers_come_from_the_layer_types(model):
    types = model.hf.config.text_config.layer_types
    assert model.info.attention_layers == tuple(l for l, t in enumerate(types) if t == "full_attention")
    assert 0 < len(model.info.attention_layers) < model.n_layers
    plan = plan_for(model, "  a: {}", "[{site: layer}, {site: keys}, {site: values}, {site: attention}, {site: mlp_out}]")
    coords = plan.capture.coords()
    assert list(coords["hidden"]["layer"]) == list(range(model.n_layers + 1))       # every layer
    for name in ("keys", "values", "prefill_vision_mass"):
        assert list(coords[name]["decoder_layer"]) == list(model.info.attention_layers), name
    # every decoder_layer variable of a store shares one coordinate: mlp_out too takes those layers
    assert list(coords["mlp_out"]["decoder_layer"]) == list(model.info.attention_layers)


def test_keys_and_values_equal_the_attention_layers_cache(model):
    plan = plan_for(model, "  a: {}", "[{site: layer}, {site: keys}, {site: values}]")
    result, inputs = run(model, plan, "a")
    encoding, n = inputs["real"].encoding, inputs["real"].n_tokens
    reference, _ = hooked(model, encoding)
    np.testing.assert_allclose(result.tokens["hidden"], reference, atol=ATOL, rtol=0)
    model.prepare()
    with torch.inference_mode():
        cache = model.hf(**encoding, use_cache=True).past_key_values
    for i, l in enumerate(model.info.attention_layers):
        for part in ("keys", "values"):
            expected = getattr(cache.layers[l], part)[0].permute(1, 0, 2).reshape(n, -1).numpy()
            np.testing.assert_allclose(result.tokens[part][:, i], expected, atol=ATOL, rtol=0, err_msg=f"{part} {l}")


def test_alpha_one_is_the_baseline_and_three_moves_the_stream(model):
    plan = plan_for(model, """\
  baseline: {}
  one: {interventions: [{kind: scale, site: projector, positions: vision, factor: 1.0}]}
  three: {interventions: [{kind: scale, site: projector, positions: vision, factor: 3.0}]}""")
    base, inputs = run(model, plan, "baseline")
    one, _ = run(model, plan, "one")
    three, _ = run(model, plan, "three")
    np.testing.assert_array_equal(one.tokens["hidden"], base.tokens["hidden"])
    reference, _ = hooked(model, inputs["real"].encoding, projector_factor=3.0)
    np.testing.assert_allclose(three.tokens["hidden"], reference, atol=ATOL, rtol=0)
    assert np.abs(three.tokens["hidden"] - base.tokens["hidden"]).max() > 1e-2


def test_kv_swap_swaps_the_attention_layers(model):
    """The blank image's K/V at the vision positions of every attention layer, over the real
    prompt's cache (its convolution states its own). Reference, plain transformers calls: the real
    prompt but its last token prefilled, the blank's K/V copied in, then the last token."""
    plan = plan_for(model, "  baseline: {}\n  blank: {image: blank}\n  swapped: {kv_swap: {donor: blank}}",
                    "[{site: logits}]")
    assert plan.condition("swapped").kv_swap.layers == model.info.attention_layers
    swapped, inputs = run(model, plan, "swapped")
    real, blank = inputs["real"], inputs["blank"]
    vision = torch.as_tensor(np.flatnonzero(real.modality[:-1] == "vision"))
    cut = lambda enc: {k: (v[:, :-1] if k in model.arch.per_token_keys else v) for k, v in enc.items()}
    with torch.inference_mode():
        cache = model.hf(**cut(real.encoding), use_cache=True).past_key_values
        donor = model.hf(**cut(blank.encoding), use_cache=True).past_key_values
        for l in model.info.attention_layers:
            for part in ("keys", "values"):
                getattr(cache.layers[l], part)[:, :, vision] = getattr(donor.layers[l], part)[:, :, vision]
        out = model.hf(input_ids=real.encoding["input_ids"][:, -1:], past_key_values=cache, use_cache=True)
    reference = torch.log_softmax(out.logits[0, -1].float(), -1).numpy()
    np.testing.assert_allclose(swapped.run["logprobs"][0, 0], reference, atol=ATOL)
    base, _ = run(model, plan, "baseline")
    assert np.abs(swapped.run["logprobs"][0, 0] - base.run["logprobs"][0, 0]).max() > 1e-5


@pytest.mark.parametrize("conditions, capture, match", [
    ("  a: {kv_swap: {donor: b, layers: [0, 1]}}\n  b: {image: blank}", "[{site: logits}]",
     r"layers \[0\] are not attention layers"),
    ("  a: {}", "[{site: keys, layers: [0]}]", r"layers \[0\] are not attention layers .*no KV cache"),
    ("  a: {}", "[{site: attention, layers: [2]}]", r"layers \[2\] are not attention layers"),
])
def test_convolution_layers_are_refused_with_the_reason(model, conditions, capture, match):
    with pytest.raises(PlanError, match=match):
        plan_for(model, conditions, capture)


def test_the_processor_reads_pil_images_and_refuses_tiling_it_cannot_do(model):
    from PIL import Image

    inputs = model.encode(SAMPLE.image, SAMPLE.question)
    assert (inputs.modality == "vision").sum() == inputs.encoding["spatial_shapes"].prod() // 4
    assert (inputs.modality == "boundary").sum() == 2
    image_processor = model.processor.image_processor
    image_processor.do_image_splitting = True
    try:
        with pytest.raises(ValueError, match="split into tiles, which LFM2-VL's image processor does with torchvision"):
            image_processor(Image.new("RGB", (512, 512)))
    finally:
        image_processor.do_image_splitting = False
