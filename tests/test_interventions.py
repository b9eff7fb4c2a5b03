"""Every intervention and capture against an independent reference: plain PyTorch forward hooks
and plain transformers calls on the same tiny model and inputs (no nnsight)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import DynamicCache

from workbench.backends.local import run_condition
from workbench.plan import compile_plan
from workbench.runner import LazyInputs
from workbench.spec import parse_spec
from workbench.data import Sample

from support.traces import SAMPLE, plan_for, run

VLMS = ["tiny-smolvlm", "tiny-qwen3vl"]
# the plain-transformers oracles below hold on trained weights too
from workbench.models.refs import TRAINED_MODEL_NAMES as TRAINED_NAMES  # noqa: E402
ATOL = 1e-5


def decoder(model):
    return model.hf.get_decoder()


def hooked_residuals(model, encoding, hooks=()):
    """Residual stream by the workbench convention, read with forward pre-hooks."""
    seen = []
    layers = list(decoder(model).layers) + [decoder(model).norm]
    # edits first, so the capture pre-hooks (registered after) see the edited residual
    handles = [module.register_forward_pre_hook(fn) for module, fn in getattr(hooks, "pre", ())]
    handles += [m.register_forward_pre_hook(lambda m, a: seen.append(a[0][0].detach().clone())) for m in layers]
    handles += [module.register_forward_hook(fn) for module, fn in hooks]
    try:
        model.prepare()
        with torch.inference_mode():
            out = model.hf(**encoding)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(seen, dim=1).numpy(), out


def pre_hook_edit(index, fn):
    """A forward pre-hook that edits positions `index` of a module's first input."""
    def hook(module, args):
        x = args[0].clone()
        x[:, index] = fn(x[:, index])
        return (x, *args[1:])
    return hook


class Hooks(list):
    pre: list


def with_pre(forward=(), pre=()):
    hooks = Hooks(forward)
    hooks.pre = list(pre)
    return hooks


def projector_modules(model):
    if model.arch.family == "qwen3vl":
        return [model.hf.model.visual.merger, *model.hf.model.visual.deepstack_merger_list]
    return [model.hf.model.connector]


# ------------------------------------------------------------------------------ interventions


@pytest.mark.parametrize("name", VLMS)
def test_scale_layer_text_positions(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, "  c: {interventions: [{kind: scale, site: layer, layers: [1, 2], positions: text, factor: 0.3}]}")
    result, inputs = run(model, plan, "c")
    enc = inputs["real"].encoding
    text = torch.as_tensor(np.flatnonzero(inputs["real"].modality == "text"))
    layers = decoder(model).layers
    ref, _ = hooked_residuals(model, enc, with_pre(pre=[(layers[l], pre_hook_edit(text, lambda x: x * 0.3)) for l in (1, 2)]))
    np.testing.assert_allclose(result.tokens["hidden"], ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", VLMS)
def test_zero_embed_boundary(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, "  c: {interventions: [{kind: zero, site: embed, positions: boundary}]}")
    result, inputs = run(model, plan, "c")
    idx = torch.as_tensor(np.flatnonzero(inputs["real"].modality == "boundary"))
    assert len(idx) > 0

    def zero_rows(module, args, out):
        out = out.clone()
        out[:, idx] = 0
        return out
    ref, _ = hooked_residuals(model, inputs["real"].encoding, with_pre([(model.hf.get_input_embeddings(), zero_rows)]))
    np.testing.assert_allclose(result.tokens["hidden"], ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", VLMS)
def test_normalize_projector_to_text_embedding_norm(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, "  c: {interventions: [{kind: normalize}]}")
    result, inputs = run(model, plan, "c")
    target = model.hf.get_input_embeddings().weight.detach().norm(dim=-1).mean()
    hooks = [(m, lambda m, i, o: o * (target / o.norm(dim=-1, keepdim=True))) for m in projector_modules(model)]
    ref, _ = hooked_residuals(model, inputs["real"].encoding, with_pre(hooks))
    np.testing.assert_allclose(result.tokens["hidden"], ref, atol=ATOL, rtol=0)
    vision = inputs["real"].modality == "vision"
    if model.arch.family == "smolvlm":  # layer 0 vision rows are exactly the projector output
        np.testing.assert_allclose(np.linalg.norm(result.tokens["hidden"][vision, 0], axis=-1), float(target), rtol=1e-5)


@pytest.mark.parametrize("name", VLMS)
def test_add_vector_at_layer(load_tiny, name):
    model = load_tiny(name)
    vec = np.linspace(-1, 1, model.info.hidden_size).round(3).tolist()
    plan = plan_for(model, f"  c: {{interventions: [{{kind: add, site: layer, layers: [2], positions: vision, vector: {vec}, factor: 2.0}}]}}")
    result, inputs = run(model, plan, "c")
    idx = torch.as_tensor(np.flatnonzero(inputs["real"].modality == "vision"))
    v = torch.tensor(vec)
    ref, _ = hooked_residuals(model, inputs["real"].encoding, with_pre(pre=[(decoder(model).layers[2], pre_hook_edit(idx, lambda x: x + 2.0 * v))]))
    np.testing.assert_allclose(result.tokens["hidden"], ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", VLMS)
def test_add_random_direction_of_matched_or_given_norm(load_tiny, name):
    """direction: random adds n_t·u: u a unit Gaussian direction drawn from the seed (here drawn
    again with numpy's Generator, normalized by hand), n_t the token's own ‖x_t‖ (matched) or a
    given norm; the same seed reproduces it, another seed does not."""
    model = load_tiny(name)
    plan = plan_for(model, """\
  matched: {interventions: [{kind: add, site: layer, layers: [1], positions: text, direction: random, seed: 7}]}
  again: {interventions: [{kind: add, site: layer, layers: [1], positions: text, direction: random, seed: 7}]}
  other: {interventions: [{kind: add, site: layer, layers: [1], positions: text, direction: random, seed: 8}]}
  given: {interventions: [{kind: add, site: layer, layers: [1], positions: text, direction: random, seed: 7, norm: 2.5, factor: 0.5}]}
  swept:
    sweep: {s: [7, 8]}
    interventions: [{kind: add, site: layer, layers: [1], positions: text, direction: random, seed: $s}]""")
    runs = {c: run(model, plan, c)[0].tokens["hidden"] for c in ("matched", "again", "other", "given", "swept[s=7]")}
    inputs = LazyInputs(model, SAMPLE)
    text = np.flatnonzero(inputs["real"].modality == "text")
    clean, _ = hooked_residuals(model, inputs["real"].encoding)
    g = np.random.Generator(np.random.PCG64(7)).normal(size=model.info.hidden_size)
    u = g / np.sqrt((g * g).sum())
    added = runs["matched"][text, 1] - clean[text, 1]           # layer 1 = the stream entering decoder layer 1
    target = np.linalg.norm(clean[text, 1], axis=-1)
    np.testing.assert_allclose(np.linalg.norm(added, axis=-1), target, rtol=1e-4)
    np.testing.assert_allclose(added / target[:, None], np.broadcast_to(u, added.shape), atol=1e-4)
    given = runs["given"][text, 1] - clean[text, 1]
    np.testing.assert_allclose(np.linalg.norm(given, axis=-1), 0.5 * 2.5, rtol=1e-4)
    # the whole stream against plain pre-hooks adding the same vector
    layer1 = decoder(model).layers[1]
    step = lambda x: x + x.norm(dim=-1, keepdim=True) * torch.as_tensor(u, dtype=x.dtype)
    ref, _ = hooked_residuals(model, inputs["real"].encoding, with_pre(pre=[(layer1, pre_hook_edit(torch.as_tensor(text), step))]))
    np.testing.assert_allclose(runs["matched"], ref, atol=1e-4, rtol=0)
    np.testing.assert_array_equal(runs["matched"], runs["again"])
    np.testing.assert_array_equal(runs["matched"], runs["swept[s=7]"])   # a swept seed is the same seed
    assert np.abs(runs["other"] - runs["matched"]).max() > 1e-3
    others = np.setdiff1d(np.arange(len(inputs["real"].modality)), text)
    np.testing.assert_allclose(runs["matched"][others, 1], clean[others, 1], atol=ATOL)


@pytest.mark.parametrize("name", VLMS)
def test_patch_and_add_direction_from_blank(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, """\
  blank: {image: blank}
  patched: {interventions: [{kind: patch, site: layer, layers: [1], positions: vision, from: blank}]}
  pushed: {interventions: [{kind: add, site: layer, layers: [1], positions: text, direction_from: blank, factor: 0.5}]}""")
    patched, inputs = run(model, plan, "patched")
    pushed, _ = run(model, plan, "pushed")
    real, blank = inputs["real"], inputs["blank"]
    np.testing.assert_array_equal(real.input_ids, blank.input_ids)
    clean, _ = hooked_residuals(model, real.encoding)
    donor, _ = hooked_residuals(model, blank.encoding)
    vision = torch.as_tensor(np.flatnonzero(real.modality == "vision"))
    text = torch.as_tensor(np.flatnonzero(real.modality == "text"))
    layer1 = decoder(model).layers[1]
    ref, _ = hooked_residuals(model, real.encoding, with_pre(pre=[(layer1, pre_hook_edit(vision, lambda x: torch.from_numpy(donor[vision.numpy(), 1])[None]))]))
    np.testing.assert_allclose(patched.tokens["hidden"], ref, atol=ATOL, rtol=0)
    direction = torch.from_numpy((donor[text.numpy(), 1] - clean[text.numpy(), 1]).mean(0))
    ref, _ = hooked_residuals(model, real.encoding, with_pre(pre=[(layer1, pre_hook_edit(text, lambda x: x + 0.5 * direction))]))
    np.testing.assert_allclose(pushed.tokens["hidden"], ref, atol=ATOL, rtol=0)


def test_qwen_projector_alpha_zero_equals_zero_image_and_deepstack_features(load_tiny):
    model = load_tiny("tiny-qwen3vl")
    plan = plan_for(model, "  a0: {interventions: [{kind: scale, site: projector, positions: vision, factor: 0.0}]}\n"
                           "  m0: {interventions: [{kind: scale, site: projector.merger, positions: vision, factor: 0.0}]}")
    full, inputs = run(model, plan, "a0")
    merger_only, _ = run(model, plan, "m0")
    hooks = [(m, lambda m, i, o: torch.zeros_like(o)) for m in projector_modules(model)]
    ref, _ = hooked_residuals(model, inputs["real"].encoding, with_pre(hooks))
    np.testing.assert_allclose(full.tokens["hidden"], ref, atol=ATOL, rtol=0)
    assert np.abs(full.tokens["hidden"] - merger_only.tokens["hidden"]).max() > 1e-4


# ------------------------------------------------------------------------------ image modes


@pytest.mark.parametrize("name", VLMS)
def test_image_none_and_blank(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, "  blank: {image: blank}\n  none: {image: none}")
    _, inputs = run(model, plan, "none")
    none, real, blank = inputs["none"], inputs["real"], inputs["blank"]
    assert set(none.modality) == {"text"} and none.n_tokens < real.n_tokens
    np.testing.assert_array_equal(blank.input_ids, real.input_ids)
    assert not torch.equal(blank.encoding["pixel_values"], real.encoding["pixel_values"])


# ------------------------------------------------------------------------------ captures


@pytest.mark.parametrize("name", VLMS + ["tiny-llama", *TRAINED_NAMES])
def test_logprobs_generation_attention_and_kv_match_transformers(load_tiny, name):
    model = load_tiny(name, attn="eager")
    plan = plan_for(model, "  baseline: {}", "[{site: layer}, {site: attention}, {site: keys}, {site: values}, {site: logits}]", generate=3)
    result, inputs = run(model, plan, "baseline")
    enc = inputs["real"].encoding
    n = inputs["real"].n_tokens
    model.prepare()
    cache = DynamicCache()
    with torch.inference_mode():
        out = model.hf(**enc, output_attentions=True, cache=cache, use_cache=True)
    np.testing.assert_allclose(result.run["logprobs"][0, 0], torch.log_softmax(out.logits[0, -1], -1).numpy(), atol=ATOL)
    vision = torch.as_tensor(inputs["real"].modality == "vision")
    text = torch.as_tensor(inputs["real"].modality == "text")
    for l, attn in enumerate(out.attentions):
        np.testing.assert_allclose(result.tokens["prefill_vision_mass"][:, l], attn[0][:, :, vision].sum(-1).T.numpy(), atol=ATOL)
        np.testing.assert_allclose(result.tokens["decode_attention"][:, 0, l], attn[0][:, -1, :].T.numpy(), atol=ATOL)
        np.testing.assert_allclose(result.tokens["prefill_text_attention"][:, l], attn[0][:, text, :].sum(1).T.numpy(),
                                   atol=ATOL)
        keys = cache.layers[l].keys[0].permute(1, 0, 2).reshape(n, -1).numpy()
        values = cache.layers[l].values[0].permute(1, 0, 2).reshape(n, -1).numpy()
        np.testing.assert_allclose(result.tokens["keys"][:, l], keys, atol=ATOL)
        np.testing.assert_allclose(result.tokens["values"][:, l], values, atol=ATOL)
    model.prepare()
    with torch.inference_mode():
        generated = model.hf.generate(**enc, max_new_tokens=3, do_sample=False, output_scores=True,
                                      return_dict_in_generate=True, output_attentions=True)
    # generate stops at the end of turn (a trained model says it after its one answer token); the
    # workbench decodes all its max_new_tokens steps: the steps both took are compared
    hf_steps = generated.sequences[0, n:].numpy()
    np.testing.assert_array_equal(result.run["generated"][0][:len(hf_steps)], hf_steps)
    for step, scores in enumerate(generated.scores):
        np.testing.assert_allclose(result.run["logprobs"][0, step], torch.log_softmax(scores[0].float(), -1).numpy(), atol=1e-4)
    # decode-step attention of step 2 (query = generated token 1) over the prompt keys
    if len(generated.attentions) < 3:
        return
    last = generated.attentions[2]
    for l, attn in enumerate(last):
        np.testing.assert_allclose(result.tokens["decode_attention"][:, 2, l], attn[0][:, -1, :n].T.numpy(), atol=ATOL)


# ------------------------------------------------------------------------------ KV swap


def _reference_hybrid(model, real, blank, positions, layers, parts=("keys", "values")):
    """Plain transformers: prefill all but the last token for real and blank, copy blank's K/V
    (only `parts` of them) at `positions` into real's cache, run the last token as a decode step."""
    def prefill(inputs):
        cache = DynamicCache()
        enc = {k: (v[:, :-1] if k in ("input_ids", "attention_mask", "mm_token_type_ids") else v) for k, v in inputs.encoding.items()}
        model.prepare()
        with torch.inference_mode():
            model.hf(**enc, cache=cache, use_cache=True)
        return cache
    cache, donor = prefill(real), prefill(blank)
    with torch.inference_mode():
        for l in layers:
            if "keys" in parts:
                cache.layers[l].keys[:, :, positions] = donor.layers[l].keys[:, :, positions]
            if "values" in parts:
                cache.layers[l].values[:, :, positions] = donor.layers[l].values[:, :, positions]
        out = model.hf(input_ids=torch.as_tensor(real.input_ids[-1:]).view(1, 1), cache=cache, use_cache=True)
    return torch.log_softmax(out.logits[0, -1], -1).numpy()


@pytest.mark.parametrize("name", VLMS + list(TRAINED_NAMES))
def test_kv_swap(load_tiny, name):
    model = load_tiny(name, attn="sdpa")
    plan = plan_for(model, """\
  baseline: {}
  blank: {image: blank}
  self: {kv_swap: {donor: self}}
  hybrid: {kv_swap: {donor: blank}}
  halved: {interventions: [{kind: scale, site: layer, layers: [1], positions: all, factor: 0.5}]}
  from_halved: {kv_swap: {donor: halved, positions: all}}""", "[{site: logits}, {site: layer}, {site: attention}]")
    base, inputs = run(model, plan, "baseline")
    self_swap, _ = run(model, plan, "self")
    hybrid, _ = run(model, plan, "hybrid")
    blank, _ = run(model, plan, "blank")
    lp = lambda r: r.run["logprobs"][0, 0]
    # a self-donor (an untouched cache) continues to the full-prefill distribution
    np.testing.assert_allclose(lp(self_swap), lp(base), atol=ATOL)
    # to float32 rounding at the residual stream's scale: the split prompt sums in another order, and
    # a trained model's stream reaches |h| ~ 36, where that rounding is ~1e-5 in any component
    scale = float(np.abs(base.tokens["hidden"]).max())
    np.testing.assert_allclose(self_swap.tokens["hidden"], base.tokens["hidden"], rtol=0, atol=ATOL + 1e-6 * scale)
    # the prompt's attention read over its two traces (n-1 tokens, then the last) adds up to the one forward's
    for name in ("prefill_vision_mass", "prefill_text_attention"):
        np.testing.assert_allclose(self_swap.tokens[name], base.tokens[name], atol=ATOL)
    # a blank donor changes it, exactly as the plain-transformers reference does
    assert np.abs(lp(hybrid) - lp(base)).max() > 1e-3
    vision = np.flatnonzero(inputs["real"].modality == "vision")
    ref = _reference_hybrid(model, inputs["real"], inputs["blank"], torch.as_tensor(vision), range(model.n_layers))
    np.testing.assert_allclose(lp(hybrid), ref, atol=ATOL)
    # rows before the last token are the real prefill's; the hybrid is neither real nor blank
    np.testing.assert_allclose(hybrid.tokens["hidden"][:-1], base.tokens["hidden"][:-1], atol=ATOL)
    assert np.abs(lp(hybrid) - lp(blank)).max() > 1e-3
    # a donor whose intervention names positions by modality runs on its n-1 token prefix; with
    # every position swapped, the decode step reads the donor's whole cache
    from_halved, _ = run(model, plan, "from_halved")
    halved, _ = run(model, plan, "halved")
    assert np.isfinite(lp(from_halved)).all()
    assert np.abs(lp(from_halved) - lp(base)).max() > 1e-4
    np.testing.assert_allclose(from_halved.tokens["hidden"][:-1], base.tokens["hidden"][:-1], atol=ATOL)


@pytest.mark.parametrize("name", VLMS)
def test_kv_swap_parts_and_layer_window_match_plain_cache_edits(load_tiny, name):
    """Swapping only keys / only values / a layer window equals the same edit of a plain
    transformers DynamicCache; the self-swap control equals the baseline; the stored cache of a
    window swap holds the donor's K/V only in the window's layers."""
    model = load_tiny(name, attn="sdpa")
    plan = plan_for(model, """\
  baseline: {}
  blank: {image: blank}
  self_swap: {kv_swap: {donor: baseline}}
  keys_only: {kv_swap: {donor: blank, parts: [keys]}}
  values_only: {kv_swap: {donor: blank, parts: [values]}}
  window: {kv_swap: {donor: blank, layers: [1]}}""", "[{site: logits}, {site: keys}, {site: values}]")
    runs = {c: run(model, plan, c)[0] for c in ("baseline", "blank", "self_swap", "keys_only", "values_only", "window")}
    inputs = LazyInputs(model, SAMPLE)
    lp = {c: r.run["logprobs"][0, 0] for c, r in runs.items()}
    np.testing.assert_allclose(lp["self_swap"], lp["baseline"], atol=ATOL)
    vision = np.flatnonzero(inputs["real"].modality == "vision")
    every = range(model.n_layers)
    for condition, layers, parts in (("keys_only", every, ("keys",)), ("values_only", every, ("values",)),
                                     ("window", [1], ("keys", "values"))):
        ref = _reference_hybrid(model, inputs["real"], inputs["blank"], torch.as_tensor(vision), layers, parts)
        np.testing.assert_allclose(lp[condition], ref, atol=ATOL)
        assert np.abs(lp[condition] - lp["baseline"]).max() > 1e-4  # each swap changes the distribution
    assert np.abs(lp["keys_only"] - lp["values_only"]).max() > 1e-4
    # the stored cache (rows before the last token): blank's K/V at vision rows of layer 1 only
    n = inputs["real"].n_tokens
    window, base, blank = (runs[c].tokens for c in ("window", "baseline", "blank"))
    for part in ("keys", "values"):
        np.testing.assert_allclose(window[part][vision, 1], blank[part][vision, 1], atol=ATOL)
        np.testing.assert_allclose(window[part][vision, 0], base[part][vision, 0], atol=ATOL)
        others = np.setdiff1d(np.arange(n - 1), vision)
        np.testing.assert_allclose(window[part][others], base[part][others], atol=ATOL)
        assert np.abs(blank[part][vision, 1] - base[part][vision, 1]).max() > 1e-4  # the check can fail
    # a keys-only swap leaves every stored value the real run's, and vice versa
    np.testing.assert_allclose(runs["keys_only"].tokens["values"][: n - 1], base["values"][: n - 1], atol=ATOL)
    np.testing.assert_allclose(runs["values_only"].tokens["keys"][: n - 1], base["keys"][: n - 1], atol=ATOL)
    assert plan.condition("keys_only").kv_swap.parts == ("keys",)
    assert "parts=('values',)" in plan.condition("values_only").store_attrs()["kv_swap"]


def test_kv_swap_parts_and_layers_sweep_into_conditions_and_store_labels(tmp_path, workbench_cache):
    """`parts: $p` over part sets and `layers: [$l]` expand like numeric sweeps: one condition per
    combination, each with its own swap; the store labels them (`p` a word, `l` a number) and
    its condition attrs say what was swapped."""
    from workbench.runner import run_spec

    text = f"""\
name: sweep
models: [tiny-qwen3vl]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  swap:
    sweep: {{p: [keys, keys+values], l: [0, 1]}}
    kv_swap: {{donor: blank, parts: $p, layers: [$l]}}
capture: [{{site: logits}}]
store: {{path: {tmp_path / 'sweep.zarr'}}}
"""
    spec = parse_spec(text)
    swaps = {i.name: i.kv_swap for i in spec.expand_conditions() if i.kv_swap}
    assert sorted(swaps) == ["swap[p=keys+values,l=0]", "swap[p=keys+values,l=1]", "swap[p=keys,l=0]", "swap[p=keys,l=1]"]
    assert swaps["swap[p=keys,l=1]"].parts == ["keys"] and swaps["swap[p=keys,l=1]"].layers == [1]
    assert swaps["swap[p=keys+values,l=0]"].parts == ["keys", "values"]
    run_spec(spec, device="cpu", dtype="float32", progress=False, log=lambda *_: None)
    import workbench

    ds = workbench.open_store(tmp_path / "sweep.zarr", model="tiny-qwen3vl", index=False)
    by_condition = dict(zip(ds.run_condition.values.astype(str), zip(ds.run_p.values.astype(str), ds.run_l.values)))
    assert by_condition["swap[p=keys,l=1]"] == ("keys", 1.0)
    assert by_condition["baseline"][0] == "" and np.isnan(by_condition["baseline"][1])
    stored = workbench.store_info(tmp_path / "sweep.zarr")["models"]["tiny-qwen3vl"]["conditions"]["swap[p=keys,l=1]"]
    assert stored["sweep"] == {"p": "keys", "l": 1}
    assert "layers=(1,)" in stored["identity"]["kv_swap"] and "parts=('keys',)" in stored["identity"]["kv_swap"]


# ------------------------------------------------------------------------------ non-finite captures


def test_nan_and_inf_are_reported_per_layer_and_counted_in_the_store(tmp_path, capsys, workbench_cache):
    """Scales that overflow float32 at residual layer 2: the run reports the Inf per
    (model, sample, condition, variable, layer) and stores the count in `nonfinite`."""
    from workbench.cli import main

    store = tmp_path / "nan.zarr"
    spec = tmp_path / "nan.yaml"
    spec.write_text(f"""\
name: nan
models: [tiny-llama]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
  broken:
    interventions:   # two float32-finite scales whose product overflows at layer 2
      - {{kind: scale, site: layer, layers: [1], positions: [0], factor: 1.0e+30}}
      - {{kind: scale, site: layer, layers: [2], positions: [0], factor: 1.0e+30}}
capture: [{{site: layer}}]
store: {{path: {store}}}
""")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    out = capsys.readouterr().err  # warnings go to stderr (the workbench logger)
    assert "warning: non-finite capture: tiny-llama | builtin/counting/000 | broken | hidden layer 2: 0 NaN, " in out
    assert "layer 0" not in out and "| baseline |" not in out
    import workbench
    ds = workbench.open_store(store, model="tiny-llama")
    assert int(ds.nonfinite.sel(run_condition="broken").values[0]) == 1
    assert int(ds.nonfinite.sel(run_condition="baseline").values[0]) == 0
    hidden = ds.hidden.sel(condition="broken", position=0, layer=2).values
    assert np.isinf(hidden).any()  # stored as is, not clipped


@pytest.mark.parametrize("name", VLMS)
def test_embed_and_final_norm_captures(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, "  baseline: {}", "[{site: embed}, {site: layer}, {site: final_norm}]")
    result, inputs = run(model, plan, "baseline")
    ids = torch.as_tensor(inputs["real"].input_ids)[None]
    with torch.inference_mode():
        embedded = model.hf.get_input_embeddings()(ids)[0].numpy()
        normed = decoder(model).norm(torch.from_numpy(result.tokens["hidden"][:, -1]))
    np.testing.assert_allclose(result.tokens["embed"], embedded, atol=ATOL)
    np.testing.assert_allclose(result.tokens["final_norm"], normed.numpy(), atol=ATOL)
