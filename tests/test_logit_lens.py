"""The logit-lens capture (site `logit_lens`) equals the lens computed with plain PyTorch: the
residual stream read with forward pre-hooks, then the model's own final norm and LM head called
outside any trace; at the last layer it is the model's own next-token distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from workbench.backends.local import run_condition
from workbench.capture import LENS_TOP_K, CapturePlan, LogitLensCapture
from workbench.models.architectures import tiny_architectures
from workbench.plan import ConditionPlan, ModelPlan

BASELINE = ConditionPlan("baseline", {}, "real", ())


def _inputs(model):
    img = Image.new("RGB", (96, 64), "navy")
    img.paste((250, 200, 0), (10, 10, 50, 40))
    return model.encode(img if model.arch.is_multimodal else None, "What colour is the square?")


def hooked_lens(model, encoding, k):
    """(ids, logprobs) of shape (token, layer 0..L, k) from pre-hooks on every decoder layer and
    the final norm, and the norm and head applied afterwards by plain torch."""
    seen = []
    layers = list(model.hf.get_submodule(model.arch.decoder_layers))
    norm, head = model.hf.get_submodule(model.arch.final_norm), model.hf.get_submodule(model.arch.lm_head)
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.append(args[0][0].detach().clone()))
             for m in layers + [norm]]
    try:
        model.prepare()
        with torch.inference_mode():
            final = model.hf(**encoding).logits[0, -1]
    finally:
        for hook in hooks:
            hook.remove()
    with torch.inference_mode():
        top = [torch.topk(torch.log_softmax(head(norm(h)).float(), -1), k, dim=-1) for h in seen]
    ids = torch.stack([t.indices for t in top], dim=1).numpy()
    logprobs = torch.stack([t.values for t in top], dim=1).numpy()
    return ids, logprobs, torch.log_softmax(final.float(), -1).numpy()


@pytest.mark.parametrize("name", [a.tiny for a in tiny_architectures()])
def test_logit_lens_matches_plain_torch(load_tiny, name):
    model = load_tiny(name)
    inputs = _inputs(model)
    layers = tuple(range(model.n_layers + 1))
    plan = ModelPlan(model.info, [], CapturePlan(outputs=(LogitLensCapture(layers),)))
    stored = run_condition(model, {"real": inputs}, BASELINE, plan).tokens
    ids, logprobs, final = hooked_lens(model, inputs.encoding, LENS_TOP_K)
    assert stored["lens_ids"].shape == (inputs.n_tokens, len(layers), LENS_TOP_K)
    np.testing.assert_allclose(stored["lens_logprobs"], logprobs, atol=1e-5, rtol=0)
    # ids: equal wherever the k-th and (k+1)-th are not tied within float noise
    agree = (stored["lens_ids"] == ids).mean()
    assert agree > 0.99, agree
    # at the last layer the lens is the model's own next-token distribution (its logits)
    order = np.argsort(-final, kind="stable")[:LENS_TOP_K]
    np.testing.assert_allclose(stored["lens_logprobs"][-1, -1], final[order], atol=1e-5)
    assert stored["lens_ids"][-1, -1, 0] == order[0]
    # the lens changes with depth: layer 0 is not already the final prediction everywhere
    assert (stored["lens_ids"][:, 0, 0] != stored["lens_ids"][:, -1, 0]).any()
