"""The `router` site of the mixture-of-experts families: router logits and selected experts per
prompt position and MoE layer, against plain PyTorch hooks on the routers of the same model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from support.traces import hooked, modules, plan_for, run
from workbench.models.architectures import tiny_architectures
from workbench.plan import PlanError

MOE = [a.tiny for a in tiny_architectures() if a.router]
DENSE = [a.tiny for a in tiny_architectures() if not a.router]


def router_hooks(model, encoding):
    """{decoder layer: (logits, the router's own outputs)} of every layer with a router, read by
    forward hooks on the router modules (dense layers have none)."""
    hf, arch = model.hf, model.arch
    seen, handles = {}, []
    for index, layer in enumerate(modules(hf, arch.decoder_layers)[0]):
        router = layer
        for attribute in arch.router.split("."):
            router = getattr(router, attribute, None)
        if router is not None:
            handles.append(router.register_forward_hook(
                lambda m, a, o, index=index: seen.setdefault(index, tuple(t.detach().clone() for t in o))))
    try:
        hooked(model, encoding)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("name", MOE)
def test_router_matches_plain_hooks(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, "  baseline: {}", "[{site: router}]")
    result, inputs = run(model, plan, "baseline")
    seen = router_hooks(model, inputs["real"].encoding)
    logits, experts = result.tokens["router_logits"], result.tokens["router_experts"]
    n_tokens = inputs["real"].n_tokens
    assert logits.shape[:2] == experts.shape[:2] == (n_tokens, model.n_layers)
    assert seen, "no router ran"
    for layer in range(model.n_layers):
        if layer not in seen:  # a dense layer
            assert np.isnan(logits[:, layer]).all() and (experts[:, layer] == -1).all()
            continue
        reference = seen[layer][model.arch.router_logits].reshape(n_tokens, -1).numpy()
        np.testing.assert_allclose(logits[:, layer], reference, atol=1e-6, rtol=0)
        k = experts.shape[-1]
        # numpy's ranking of the hooked logits, best first
        np.testing.assert_array_equal(experts[:, layer], np.argsort(-reference, axis=-1, kind="stable")[:, :k])
        if len(seen[layer]) == 3:  # Qwen3-VL-MoE's router also returns the indices it routes by
            np.testing.assert_array_equal(experts[:, layer], seen[layer][2].numpy())
    # the router spreads tokens: more than k experts are used in every MoE layer
    for layer in seen:
        assert len(np.unique(experts[:, layer])) > experts.shape[-1]


@pytest.mark.parametrize("name", MOE)
def test_router_is_unchanged_at_alpha_one_and_moves_at_alpha_three(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, """\
  baseline: {}
  one: {interventions: [{kind: scale, site: projector, positions: vision, factor: 1.0}]}
  three: {interventions: [{kind: scale, site: projector, positions: vision, factor: 3.0}]}""",
                    "[{site: layer}, {site: router}]")
    base, _ = run(model, plan, "baseline")
    one, _ = run(model, plan, "one")
    three, inputs = run(model, plan, "three")
    np.testing.assert_array_equal(one.tokens["hidden"], base.tokens["hidden"])
    np.testing.assert_array_equal(one.tokens["router_logits"], base.tokens["router_logits"])
    vision = inputs["real"].modality == "vision"
    assert np.abs(three.tokens["hidden"][vision, 1:] - base.tokens["hidden"][vision, 1:]).max() > 1e-3
    routed = ~np.isnan(base.tokens["router_logits"][0, :, 0])
    assert np.abs(three.tokens["router_logits"][vision][:, routed] - base.tokens["router_logits"][vision][:, routed]).max() > 1e-4


@pytest.mark.parametrize("name", DENSE[:1])
def test_router_is_refused_on_a_dense_family(load_tiny, name):
    model = load_tiny(name)
    with pytest.raises(PlanError, match="no mixture-of-experts layers"):
        plan_for(model, "  baseline: {}", "[{site: router}]")
