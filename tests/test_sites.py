"""The decoder-layer sites (`keys_pre`, `attn_out`, `mlp_out`, `layer.pre_deepstack`) equal an
independent computation with plain PyTorch forward hooks on the same modules, for every tiny
family; and the branch outputs are what the residual stream adds: h_l + attn_out_l + mlp_out_l =
h_{l+1} (Qwen3-VL: h_{l+1} before its DeepStack add)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from workbench.backends.local import run_condition
from workbench.capture import CapturePlan, LayerOutputCapture, ResidualCapture
from workbench.models.architectures import tiny_architectures
from workbench.plan import ConditionPlan, ModelPlan, PlanError, compile_plan
from workbench.spec import parse_spec

BASELINE = ConditionPlan("baseline", {}, "real", ())
TINY = [a.tiny for a in tiny_architectures()]
# written here, not read from the registry: the module whose output each branch adds to the
# residual stream. Gemma-3 and GLM-4V are peri-LN (a norm after each branch); every other family is pre-LN.
PERI_LN = {"gemma3": {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"},
           "glm4v": {"attn_out": "post_self_attn_layernorm", "mlp_out": "post_mlp_layernorm"},
           "lfm2_vl": {"mlp_out": "feed_forward"}}   # pre-LN, its MLP named feed_forward
PRE_LN = {"attn_out": "self_attn", "mlp_out": "mlp"}


def _image():
    img = Image.new("RGB", (96, 64), "navy")
    img.paste((250, 200, 0), (10, 10, 50, 40))
    return img


def _inputs(model):
    return model.encode(_image() if model.arch.is_multimodal else None, "What colour is the square?")


def _first(output):
    return output if isinstance(output, torch.Tensor) else output[0]


def hooked_outputs(model, path, encoding, only=None):
    """Each decoder layer's (or each of `only`'s) submodule `path` output (batch row 0) with plain
    forward hooks: (token, layer, width)."""
    seen = []
    layers = model.hf.get_submodule(model.arch.decoder_layers)
    layers = [layers[l] for l in only] if only is not None else layers
    hooks = [layer.get_submodule(path).register_forward_hook(
        lambda m, args, out: seen.append(_first(out)[0].detach().clone())) for layer in layers]
    try:
        model.prepare()
        with torch.inference_mode():
            model.hf(**encoding)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(seen, dim=1).float().numpy()


def _layers(model):
    """The decoder layers the attention sites exist at (Mllama: not its cross-attention layers;
    LFM2: not its convolutions)."""
    layers = model.info.attention_layers
    return tuple(range(model.n_layers)) if layers is None else layers


def _captured(model, inputs, sites, residual=True):
    n = model.n_layers
    outputs = tuple(LayerOutputCapture(s, tuple(range(n + 1)) if s == "layer.pre_deepstack" else _layers(model))
                    for s in sites)
    plan = ModelPlan(model.info, [], CapturePlan(residual=ResidualCapture(tuple(range(n + 1))) if residual else None,
                                                 outputs=outputs))
    return run_condition(model, {"real": inputs}, BASELINE, plan).tokens


@pytest.mark.parametrize("name", TINY)
def test_branch_outputs_and_keys_pre_match_plain_hooks(load_tiny, name):
    model = load_tiny(name)
    inputs = _inputs(model)
    stored = _captured(model, inputs, ("keys_pre", "attn_out", "mlp_out"), residual=False)
    modules = {**PRE_LN, **PERI_LN.get(model.arch.family, {}), "keys_pre": "self_attn.k_proj"}
    for site, path in modules.items():
        reference = hooked_outputs(model, path, inputs.encoding, _layers(model))
        assert stored[site].shape == reference.shape, site
        assert stored[site].shape[:2] == (inputs.n_tokens, len(_layers(model)))
        np.testing.assert_allclose(stored[site], reference, atol=1e-5, rtol=0, err_msg=site)


@pytest.mark.parametrize("name", TINY)
def test_branches_sum_to_the_next_residual(load_tiny, name):
    """The residual identity h_l + attn_out_l + mlp_out_l = h_{l+1} to 1e-5 in every family
    (pre-LN: the branch modules' outputs; Gemma-3's peri-LN: after their post norms). Qwen3-VL's
    h_{l+1} is read after its DeepStack add, so the identity holds with the h_{l+1} before it."""
    model = load_tiny(name)
    inputs = _inputs(model)
    deepstack = model.arch.deepstack
    sites = ("attn_out", "mlp_out") + (("layer.pre_deepstack",) if deepstack else ())
    stored = _captured(model, inputs, sites)
    h = stored["hidden"]
    following = stored["hidden_pre_deepstack"] if deepstack else h
    layers = np.asarray(_layers(model))
    total = h[:, layers] + stored["attn_out"] + stored["mlp_out"]
    np.testing.assert_allclose(total, following[:, layers + 1], atol=1e-5, rtol=0)
    # the branches are not negligible: the identity can fail
    assert np.abs(stored["attn_out"]).max() > 1e-3 and np.abs(stored["mlp_out"]).max() > 1e-3


def test_pre_deepstack_is_the_layer_output_before_the_add(load_tiny):
    """`layer.pre_deepstack` l >= 1 equals decoder layer l-1's output (plain hooks) and equals
    `layer` l at text rows; at vision rows of the DeepStack layers they differ by the injected
    feature; layer 0 is the LLM input itself."""
    model = load_tiny("tiny-qwen3vl")
    inputs = _inputs(model)
    stored = _captured(model, inputs, ("layer.pre_deepstack",))
    pre, h = stored["hidden_pre_deepstack"], stored["hidden"]
    seen = []
    layers = model.hf.get_submodule(model.arch.decoder_layers)
    hooks = [layer.register_forward_hook(lambda m, a, out: seen.append(_first(out)[0].detach().clone()))
             for layer in layers]
    try:
        model.prepare()
        with torch.inference_mode():
            model.hf(**inputs.encoding)
    finally:
        for hook in hooks:
            hook.remove()
    np.testing.assert_allclose(pre[:, 1:], torch.stack(seen, dim=1).numpy(), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(pre[:, 0], h[:, 0])
    vision = inputs.modality == "vision"
    n_deepstack = len(model.hf.config.vision_config.deepstack_visual_indexes)
    for layer in range(1, n_deepstack + 1):
        np.testing.assert_allclose(pre[~vision, layer], h[~vision, layer], atol=1e-6)
        assert np.abs(pre[vision, layer] - h[vision, layer]).max() > 1e-3


def _spec(model_name: str, capture: str):
    return parse_spec(f"""\
name: sites
models: [{model_name}]
data: {{source: builtin, n: 1}}
conditions: {{baseline: {{}}}}
capture: {capture}
store: {{path: unused.zarr}}
""")


def test_pre_deepstack_refused_without_deepstack(load_tiny):
    model = load_tiny("tiny-smolvlm")
    with pytest.raises(PlanError, match=r"capture\[0\]\.site.*no DeepStack"):
        compile_plan(_spec("tiny-smolvlm", "[{site: layer.pre_deepstack}]"), model.info)


def test_plan_builds_layer_output_captures_with_their_layer_dims(load_tiny):
    model = load_tiny("tiny-qwen3vl")
    plan = compile_plan(_spec("tiny-qwen3vl", "[{site: attn_out, layers: [1]}, {site: layer.pre_deepstack}]"), model.info)
    coords = plan.capture.coords()
    assert coords["attn_out"] == {"decoder_layer": [1]}
    keys = compile_plan(_spec("tiny-qwen3vl", "[{site: keys_pre}]"), model.info).capture.coords()
    np.testing.assert_array_equal(keys["keys_pre"]["decoder_layer"], np.arange(model.n_layers))
    np.testing.assert_array_equal(coords["hidden_pre_deepstack"]["layer"], np.arange(model.n_layers + 1))
    with pytest.raises(PlanError, match=r"capture\[0\]\.layers.*out of range"):
        compile_plan(_spec("tiny-qwen3vl", f"[{{site: mlp_out, layers: [{model.n_layers}]}}]"), model.info)


@pytest.mark.parametrize("name", ["tiny-smolvlm", "tiny-qwen3vl", "tiny-gemma3"])
def test_per_head_keys_and_values_equal_the_cache_heads(load_tiny, name, tmp_path):
    """`analyses.kv.per_head` restores (kv_head, head_dim) of the stored K/V and `keys_pre`: equal
    to the KV cache's heads and to k_proj's output viewed per head, read with plain torch; the
    store's `kv_heads` attr is the config's."""
    import xarray as xr

    import workbench
    from analyses.kv import per_head
    from workbench.capture import CachedKVCapture
    from workbench.runner import run_spec

    model = load_tiny(name)
    text = model.hf.config.get_text_config()
    kv_heads = text.num_key_value_heads
    assert (model.info.kv_heads, model.info.head_dim) == (kv_heads, getattr(text, "head_dim", None)
                                                          or text.hidden_size // text.num_attention_heads)
    inputs = _inputs(model)
    layers = tuple(range(model.n_layers))
    plan = ModelPlan(model.info, [], CapturePlan(kv=CachedKVCapture(layers), outputs=(LayerOutputCapture("keys_pre", layers),)))
    stored = run_condition(model, {"real": inputs}, BASELINE, plan).tokens
    model.prepare()
    with torch.inference_mode():
        cache = model.hf(**inputs.encoding, use_cache=True).past_key_values
    pre = hooked_outputs(model, "self_attn.k_proj", inputs.encoding)
    for variable in ("keys", "values", "keys_pre"):
        heads = per_head(xr.DataArray(stored[variable], dims=("token", "decoder_layer", "kv")), kv_heads).values
        assert heads.shape == (inputs.n_tokens, model.n_layers, kv_heads, model.info.head_dim)
        for layer in layers:
            if variable == "keys_pre":
                expected = pre[:, layer].reshape(inputs.n_tokens, kv_heads, -1)
            else:
                expected = getattr(cache.layers[layer], variable)[0].transpose(0, 1).numpy()  # (seq, heads, hd)
            np.testing.assert_allclose(heads[:, layer], expected, atol=1e-5, rtol=0, err_msg=f"{variable} {layer}")
    with pytest.raises(ValueError, match="does not divide"):
        per_head(xr.DataArray(stored["keys"], dims=("token", "decoder_layer", "kv")), kv_heads * 1000)
    store = tmp_path / "kv.zarr"
    run_spec(parse_spec(f"""\
name: heads
models: [{name}]
data: {{source: builtin, n: 1}}
conditions: {{baseline: {{}}}}
capture: [{{site: keys}}]
store: {{path: {store}}}
"""), progress=False, log=lambda _: None)
    assert workbench.open_store(store, model=name).attrs["kv_heads"] == kv_heads
