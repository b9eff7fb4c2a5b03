"""The conformance suite: every registered family with a tiny model passes the same checks,
each against an independent computation (plain PyTorch hooks and plain transformers calls on the
same model and inputs, no nnsight). Adding a family to the registry adds it here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.traces import SAMPLE, hooked, modules, plan_for, run, vision_hooks
from workbench.plan import PlanError
from workbench.models.architectures import ARCHITECTURES, tiny_architectures

ATOL = 1e-5
FAMILIES = [a.tiny for a in tiny_architectures()]
VLM_FAMILIES = [a.tiny for a in tiny_architectures() if a.is_multimodal]


def test_registry_is_consistent():
    families = [a.family for a in ARCHITECTURES]
    assert len({a.tiny for a in tiny_architectures()}) == len(tiny_architectures())
    for arch in ARCHITECTURES:
        assert arch.client is not None and arch.client == f"tiny_{arch.family}", arch.family
        assert set(arch.per_token_keys) >= {"input_ids", "attention_mask"}
        if arch.is_multimodal:
            assert arch.image_token and arch.projector and arch.projector_merger
    assert len(set(families)) >= 3


@pytest.mark.parametrize("name", FAMILIES)
def test_module_paths_resolve(load_tiny, name):
    model = load_tiny(name)
    hf, arch, text = model.hf, model.arch, model.hf.config.get_text_config()
    assert len(modules(hf, arch.decoder_layers)[0]) == text.num_hidden_layers == model.n_layers
    assert modules(hf, arch.embed)[0] is hf.get_input_embeddings()
    assert modules(hf, arch.lm_head)[0] is hf.get_output_embeddings()
    if arch.is_multimodal:
        for path in (arch.vision, arch.projector_merger, *arch.projector, *arch.projector_parts.values()):
            assert modules(hf, path), path


@pytest.mark.parametrize("name", FAMILIES)
def test_residual_stream_matches_plain_hooks(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, "  baseline: {}")
    result, inputs = run(model, plan, "baseline")
    reference, _ = hooked(model, inputs["real"].encoding)
    stored = result.tokens["hidden"]
    assert stored.shape == (inputs["real"].n_tokens, model.n_layers + 1, model.info.hidden_size)
    np.testing.assert_allclose(stored, reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", VLM_FAMILIES)
def test_alpha_one_is_baseline_and_alpha_half_matches_hooks(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, """\
  baseline: {}
  one: {interventions: [{kind: scale, site: projector, positions: vision, factor: 1.0}]}
  half: {interventions: [{kind: scale, site: projector, positions: vision, factor: 0.5}]}""")
    base, inputs = run(model, plan, "baseline")
    one, _ = run(model, plan, "one")
    half, _ = run(model, plan, "half")
    np.testing.assert_allclose(one.tokens["hidden"], base.tokens["hidden"], atol=ATOL, rtol=0)
    reference, _ = hooked(model, inputs["real"].encoding, projector_factor=0.5)
    np.testing.assert_allclose(half.tokens["hidden"], reference, atol=ATOL, rtol=0)
    # the projector output really enters the LLM: halving it changes the residual stream
    assert np.abs(half.tokens["hidden"] - base.tokens["hidden"]).max() > 1e-4


@pytest.mark.parametrize("name", VLM_FAMILIES)
def test_modality_labels_match_the_image_token_mask(load_tiny, name):
    model = load_tiny(name)
    inputs = model.encode(SAMPLE.image, SAMPLE.question)
    config = model.hf.config
    image_token_id = getattr(config, "image_token_id", None)
    if image_token_id is None:
        image_token_id = config.image_token_index
    mask = inputs.encoding["input_ids"][0].numpy() == image_token_id
    assert mask.sum() > 0
    if model.info.cross_attention_layers:   # the image is not in the sequence: its marker is a boundary
        assert not (inputs.modality == "vision").any() and (inputs.modality[mask] == "boundary").all()
        return
    np.testing.assert_array_equal(inputs.modality == "vision", mask)
    # the number of image tokens is the number of image features the model scatters in
    with torch.inference_mode():
        # DeepSeek-VL's and Janus's top classes leave get_image_features to their base model
        owner = model.hf if hasattr(model.hf, "get_image_features") else model.hf.model
        feats = owner.get_image_features(**{k: v for k, v in inputs.encoding.items()
                                               if k in ("pixel_values", "image_grid_thw", "image_sizes",
                                                        "pixel_attention_mask", "spatial_shapes")})
    feats = getattr(feats, "pooler_output", feats)
    feats = torch.cat([f.reshape(-1, f.shape[-1]) for f in feats]) if isinstance(feats, (list, tuple)) else feats
    assert feats.reshape(-1, feats.shape[-1]).shape[0] == mask.sum()
    if model.arch.boundary_tokens or model.arch.boundary_patterns:
        assert (inputs.modality == "boundary").sum() > 0
    blank = model.encode(SAMPLE.image, SAMPLE.question, "blank")
    np.testing.assert_array_equal(blank.input_ids, inputs.input_ids)


@pytest.mark.parametrize("name", FAMILIES)
def test_kv_swap_with_itself_matches_full_prefill(load_tiny, name):
    model = load_tiny(name)
    conditions = "  baseline: {}\n  self: {kv_swap: {donor: self}}"
    if model.arch.prefix_lm:
        # a bidirectional prompt cannot be split into prefill + decode: refused before running
        with pytest.raises(PlanError, match="bidirectional"):
            plan_for(model, conditions, "[{site: logits}, {site: layer}]")
        return
    plan = plan_for(model, conditions, "[{site: logits}, {site: layer}]")
    base, inputs = run(model, plan, "baseline")
    swapped, _ = run(model, plan, "self")
    _, out = hooked(model, inputs["real"].encoding)
    full = torch.log_softmax(out.logits[0, -1].float(), -1).numpy()
    np.testing.assert_allclose(base.run["logprobs"][0, 0], full, atol=ATOL)
    np.testing.assert_allclose(swapped.run["logprobs"][0, 0], full, atol=ATOL)
    np.testing.assert_allclose(swapped.tokens["hidden"], base.tokens["hidden"], atol=ATOL)

@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-paligemma"])
def test_token_type_ids_are_kept_and_they_matter(load_tiny, name):
    """Gemma-3's image tokens attend to each other bidirectionally (PaliGemma's whole prompt) only
    when the model sees the processor's token_type_ids: the encoder keeps them, and without them
    the model computes something else (so dropping them, as other families do, would silently
    change the model)."""
    model = load_tiny(name)
    inputs = model.encode(SAMPLE.image, SAMPLE.question)
    assert "token_type_ids" in model.arch.per_token_keys and "token_type_ids" not in model.arch.drop_keys
    types = inputs.encoding["token_type_ids"][0].numpy()
    if name == "tiny-gemma3":  # 1 at image tokens
        np.testing.assert_array_equal(types == 1, inputs.modality == "vision")
    else:  # the whole prompt is the prefix
        assert (types == 0).all()
    with_types, _ = hooked(model, inputs.encoding)
    without, _ = hooked(model, {k: v for k, v in inputs.encoding.items() if k != "token_type_ids"})
    vision = inputs.modality == "vision"
    assert np.abs(with_types[vision, 1:] - without[vision, 1:]).max() > 1e-4


@pytest.mark.parametrize("name", FAMILIES)
def test_tiny_checkpoint_is_a_real_checkpoint(load_tiny, name):
    """The tiny model is a saved checkpoint (config + safetensors + tokenizer + image processor),
    reloaded through from_pretrained into the family's transformers class, small as promised."""
    import transformers

    from workbench.models.tiny import tiny_model_dir

    model = load_tiny(name)
    d = tiny_model_dir(name)
    files = {p.name for p in d.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert ("preprocessor_config.json" in files) == model.arch.is_multimodal
    config = transformers.AutoConfig.from_pretrained(d)
    assert config.architectures == [model.arch.model_class]
    assert type(model.hf).__name__ == model.arch.model_class
    text = config.get_text_config()
    assert text.hidden_size == 64 and text.num_hidden_layers <= 3
    assert sum(p.numel() for p in model.hf.parameters()) < 1_000_000
    if model.arch.is_multimodal:
        tok = model.tokenizer
        for token in (model.arch.image_token, *model.arch.boundary_tokens):
            assert len(tok(token, add_special_tokens=False)["input_ids"]) == 1, token
            assert tok.convert_tokens_to_ids(token) < text.vocab_size, token


def test_every_family_is_one_file_plus_its_client():
    """Adding a family is adding `<family>.py` (its ARCHITECTURES) and `tiny_<family>.py` (its
    `build_tiny` and `load_processor`), registered in FAMILIES: nothing else names a family."""
    import importlib
    from pathlib import Path

    from workbench.models import architectures

    package = Path(architectures.__file__).parent
    family_files = {p.stem for p in package.glob("*.py")} - {"__init__", "base"}
    families = {module.__name__.rsplit(".", 1)[1] for module in architectures.FAMILIES}
    assert {f for f in family_files if not f.startswith("tiny_")} == families
    assert {f for f in family_files if f.startswith("tiny_")} == {f"tiny_{f}" for f in families}
    for name in families:
        client = importlib.import_module(f"workbench.models.architectures.tiny_{name}")
        assert callable(client.build_tiny) and callable(client.load_processor), name
    assert architectures.architecture_for(["Idefics3ForConditionalGeneration"]).family == "idefics3"
    assert architectures.architecture_for(["SmolVLMForConditionalGeneration"]).family == "smolvlm"


# -- the vision-side sites: vision (the tower's output as the connector receives it), vision_layer
# (each tower layer's output) and the connector parts, against plain hooks on the same modules


@pytest.mark.parametrize("name", VLM_FAMILIES)
def test_vision_sites_match_plain_hooks(load_tiny, name):
    model = load_tiny(name)
    if not model.arch.vision_layers:   # Mllama: refused (tests/test_mllama.py)
        plan = plan_for(model, "  baseline: {}", "[{site: layer}, {site: vision}]")
        result, inputs = run(model, plan, "baseline")
        np.testing.assert_allclose(result.patches["vision"], vision_hooks(model, inputs["real"].encoding)[1],
                                   atol=ATOL, rtol=0)
        return
    plan = plan_for(model, "  baseline: {}", "[{site: layer}, {site: vision}, {site: vision_layer}]")
    result, inputs = run(model, plan, "baseline")
    layers, vision, _ = vision_hooks(model, inputs["real"].encoding)
    assert layers.shape[1] == model.info.n_vision_layers
    assert result.patches["vision_hidden"].shape == layers.shape
    np.testing.assert_allclose(result.patches["vision_hidden"], layers, atol=ATOL, rtol=0)
    np.testing.assert_allclose(result.patches["vision"], vision, atol=ATOL, rtol=0)
    if model.arch.tower_prefix_rows:   # one row per patch in both, as the store's vision_patch dim needs
        assert result.patches["vision_hidden"].shape[0] == vision.shape[0]
    # patches are not LLM tokens: the tower has its own row count (before merging / pooling)
    assert "vision" not in result.tokens and vision.shape[0] > 0


# connectors whose first operation is a norm (RMSNorm ln_q, mm_soft_emb_norm after pooling,
# LayerNorm after the pixel shuffle) are blind to a uniform scale of the tower's output; so, but for
# the conv's bias, is GLM-4V's (a conv and a linear map, then a LayerNorm); LFM2-VL's unshuffles, then a LayerNorm
NORM_FIRST = {"tiny-qwen3vl", "tiny-qwen2_5_vl", "tiny-qwen2_vl", "tiny-gemma3", "tiny-internvl", "tiny-aya_vision",
              "tiny-glm4v", "tiny-mistral3", "tiny-qwen3_vl_moe", "tiny-lfm2_vl"}


@pytest.mark.parametrize("name", VLM_FAMILIES)
def test_vision_edit_matches_plain_hooks(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, """\
  baseline: {}
  one: {interventions: [{kind: scale, site: vision, factor: 1.0}]}
  double: {interventions: [{kind: scale, site: vision, factor: 2.0}]}
  layer0: {interventions: [{kind: scale, site: %s, layers: [0], factor: 0.5}]}""" % (
        "vision_layer" if model.arch.vision_layers else "layer"),
                    "[{site: layer}, {site: vision}]")
    base, inputs = run(model, plan, "baseline")
    one, _ = run(model, plan, "one")
    double, _ = run(model, plan, "double")
    np.testing.assert_allclose(one.tokens["hidden"], base.tokens["hidden"], atol=ATOL, rtol=0)
    _, vision, reference = vision_hooks(model, inputs["real"].encoding, scale_vision=2.0)
    np.testing.assert_allclose(double.patches["vision"], vision, atol=ATOL, rtol=0)
    np.testing.assert_allclose(double.patches["vision"], 2 * base.patches["vision"], atol=ATOL, rtol=1e-6)
    np.testing.assert_allclose(double.tokens["hidden"], reference, atol=ATOL, rtol=0)
    # the projector output (layer 0 at vision rows) moves, unless the connector normalizes first
    rows = inputs["real"].modality == "vision"
    if model.info.cross_attention_layers:   # no vision rows: the image moves the stream after the marker
        rows, at = inputs["real"].modality == "text", -1
    else:
        at = 0
    moved = np.abs(double.tokens["hidden"][rows, at] - base.tokens["hidden"][rows, at]).max()
    assert (moved < 1e-4) if name in NORM_FIRST else (moved > 1e-4), moved
    if not model.arch.vision_layers:
        return
    # an edit inside the tower changes what comes out of it
    layer0, _ = run(model, plan, "layer0")
    assert np.abs(layer0.patches["vision"] - base.patches["vision"]).max() > 1e-4


@pytest.mark.parametrize("name", VLM_FAMILIES)
def test_connector_parts_are_sites(load_tiny, name):
    """Each declared connector part is the site `projector.<part>`: scaling it equals scaling that
    module's output with a plain hook."""
    model = load_tiny(name)
    base, _ = run(model, plan_for(model, "  baseline: {}"), "baseline")
    moved = {}
    for part in model.arch.projector_parts:
        if f"projector.{part}" == "projector.merger":
            continue  # the merger site itself (checked with `projector` above)
        plan = plan_for(model, f"  half: {{interventions: [{{kind: scale, site: projector.{part}, factor: 0.5}}]}}")
        half, inputs = run(model, plan, "half")
        _, _, reference = vision_hooks(model, inputs["real"].encoding, scale_part=(part, 0.5))
        np.testing.assert_allclose(half.tokens["hidden"], reference, atol=ATOL, rtol=0, err_msg=part)
        moved[part] = np.abs(half.tokens["hidden"] - base.tokens["hidden"]).max()
    # some part's edit reaches the LLM (a part followed by a norm, e.g. Gemma-3's avg_pool, may not)
    assert max(moved.values(), default=1.0) > 1e-4, moved


def test_vision_sites_are_refused_where_they_cannot_run(load_tiny):
    text = load_tiny("tiny-llama")
    with pytest.raises(PlanError, match=r"capture\[1\]\.site: tiny-llama: a text-only model has no site 'vision_layer'"):
        plan_for(text, "  baseline: {}", "[{site: layer}, {site: vision_layer}]")
    model = load_tiny("tiny-gemma3")
    with pytest.raises(PlanError, match=r"capture\[0\]\.layers: tiny-gemma3: layers \[7\] out of range \(2 vision layers\)"):
        plan_for(model, "  baseline: {}", "[{site: vision_layer, layers: [7]}]")
    with pytest.raises(PlanError, match=r"gemma3's connector has no part 'projector.linear_1'"):
        plan_for(model, "  a: {interventions: [{kind: scale, site: projector.linear_1, factor: 2}]}")
    with pytest.raises(PlanError, match=r"does not run without an image"):
        plan_for(model, "  a: {image: none, interventions: [{kind: scale, site: vision, factor: 2}]}")
    with pytest.raises(PlanError, match=r"'projector.avg_pool' runs before 'projector', listed above it"):
        plan_for(model, "  a: {interventions: [{kind: scale, site: projector, factor: 2},\n"
                        "                      {kind: scale, site: projector.avg_pool, factor: 2}]}")
    qwen = load_tiny("tiny-qwen3vl")
    with pytest.raises(PlanError, match="DeepStack mergers run inside the vision tower"):
        plan_for(qwen, "  a: {interventions: [{kind: scale, site: projector, factor: 2}]}", "[{site: vision}]")
    plan_for(qwen, "  a: {interventions: [{kind: scale, site: projector.merger, factor: 2}]}", "[{site: vision}]")


def test_two_connector_edits_in_execution_order_equal_hooks(load_tiny):
    """A part edit, then the whole projector's, in one condition: both applied, as two hooks."""
    model = load_tiny("tiny-llava_onevision")
    plan = plan_for(model, "  both: {interventions: [{kind: scale, site: projector.linear_1, factor: 0.5},\n"
                           "                         {kind: scale, site: projector, factor: 3.0}]}")
    both, inputs = run(model, plan, "both")
    hf = model.hf
    handles = [m.register_forward_hook(lambda m, a, o: o * 0.5) for m in modules(hf, model.arch.projector_parts["linear_1"])]
    try:
        reference, _ = hooked(model, inputs["real"].encoding, projector_factor=3.0)
    finally:
        for h in handles:
            h.remove()
    np.testing.assert_allclose(both.tokens["hidden"], reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["tiny-llava_onevision", "tiny-llava_next"])
def test_image_newline_rows_are_vision_positions_that_projector_edits_leave(load_tiny, name):
    """AnyRes packing appends the learned `image_newline` after each row of tile features: those
    rows hold `<image>` positions (labelled vision) but are not projector output, so scaling the
    projector scales every other vision row and leaves them as they are."""
    model = load_tiny(name)
    plan = plan_for(model, """\
  baseline: {}
  half: {interventions: [{kind: scale, site: projector, factor: 0.5}]}""")
    base, inputs = run(model, plan, "baseline")
    half, _ = run(model, plan, "half")
    newline = model.hf.model.image_newline.detach().numpy()
    embedded = base.tokens["hidden"][:, 0]  # the decoder's input: image features at vision rows
    is_newline = np.isclose(embedded, newline, atol=1e-6, rtol=0).all(-1)
    vision = inputs["real"].modality == "vision"
    assert is_newline.sum() >= 2 and (vision[is_newline]).all()
    np.testing.assert_array_equal(half.tokens["hidden"][is_newline, 0], embedded[is_newline])
    features = vision & ~is_newline
    assert features.sum() > is_newline.sum()
    np.testing.assert_allclose(half.tokens["hidden"][features, 0], 0.5 * embedded[features], atol=ATOL, rtol=1e-6)
