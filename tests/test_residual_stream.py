"""The stored residual stream equals an independent computation with plain PyTorch hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from workbench.backends.local import run_condition
from workbench.capture import CapturePlan, ResidualCapture
from workbench.interventions.scale import Scale
from workbench.plan import ConditionPlan, ModelPlan

from workbench.models.refs import TRAINED_MODEL_NAMES as TRAINED_NAMES  # fidelity holds on trained weights too

BASELINE = ConditionPlan("baseline", {}, "real", ())


def hooked_residuals(hf, layers, final_norm, encoding, edit_projector=None):
    """Residual stream by the workbench convention, read with forward pre-hooks (no nnsight):
    the input of each decoder layer, then the input of the final norm."""
    seen = []
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.append(args[0][0].detach().clone()))
             for m in list(layers) + [final_norm]]
    hooks += edit_projector or []
    try:
        with torch.inference_mode():
            hf(**encoding)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(seen, dim=1).numpy()


def _plan(model):
    return ModelPlan(model.info, [], CapturePlan(residual=ResidualCapture(tuple(range(model.n_layers + 1)))))


def run_forward(model, inputs, condition, plan):
    return run_condition(model, {condition.image: inputs}, condition, plan).tokens


def _image():
    img = Image.new("RGB", (96, 64), "navy")
    img.paste((250, 200, 0), (10, 10, 50, 40))
    return img


@pytest.mark.parametrize("name", ["tiny-smolvlm", "tiny-qwen3vl", "tiny-llama", *TRAINED_NAMES])
def test_residual_stream_matches_plain_hooks(load_tiny, name):
    model = load_tiny(name)
    inputs = model.encode(_image(), "What colour is the square?")
    stored = run_forward(model, inputs, BASELINE, _plan(model))["hidden"]
    model.prepare()
    reference = hooked_residuals(model.hf, model.hf.get_decoder().layers, model.hf.get_decoder().norm, inputs.encoding)
    assert stored.shape == (inputs.n_tokens, model.n_layers + 1, model.info.hidden_size)
    np.testing.assert_allclose(stored, reference, atol=1e-5, rtol=0)


def test_qwen_layers_include_deepstack_add(load_tiny):
    """output_hidden_states reports layer k before the DeepStack add; our layer k+1 is after it."""
    model = load_tiny("tiny-qwen3vl")
    inputs = model.encode(_image(), "What colour is the square?")
    stored = run_forward(model, inputs, BASELINE, _plan(model))["hidden"]
    model.prepare()
    with torch.inference_mode():
        hs = model.hf(**inputs.encoding, output_hidden_states=True).hidden_states
    vision = inputs.modality == "vision"
    n_deepstack = len(model.hf.config.vision_config.deepstack_visual_indexes)
    assert 0 < n_deepstack < model.n_layers
    for layer in range(1, n_deepstack + 1):
        # text rows agree; vision rows differ by exactly the DeepStack feature that was added
        np.testing.assert_allclose(stored[~vision, layer], hs[layer][0][torch.from_numpy(~vision)].numpy(), atol=1e-5)
        assert np.abs(stored[vision, layer] - hs[layer][0][torch.from_numpy(vision)].numpy()).max() > 1e-3


@pytest.mark.parametrize("name", ["tiny-smolvlm", "tiny-qwen3vl", *TRAINED_NAMES])
def test_projector_scale_matches_hooked_scaling(load_tiny, name):
    """scale(projector, a) equals scaling every projector module's output with plain forward hooks
    (for Qwen3-VL: the merger and every DeepStack merger)."""
    model = load_tiny(name)
    inputs = model.encode(_image(), "Describe the image.")
    alpha = 0.25
    condition = ConditionPlan("alpha=0.25", {"alpha": alpha}, "real", (Scale("projector", "vision", factor=alpha),))
    stored = run_forward(model, inputs, condition, _plan(model))["hidden"]
    if model.arch.family == "qwen3vl":
        modules = [model.hf.model.visual.merger, *model.hf.model.visual.deepstack_merger_list]
    else:
        modules = [model.hf.model.connector]
    hooks = [m.register_forward_hook(lambda m, i, o: o * alpha) for m in modules]
    model.prepare()
    reference = hooked_residuals(model.hf, model.hf.get_decoder().layers, model.hf.get_decoder().norm,
                                 inputs.encoding, edit_projector=hooks)
    np.testing.assert_allclose(stored, reference, atol=1e-5, rtol=0)


def test_qwen_projector_zero_equals_zero_image_features(load_tiny):
    """alpha = 0 on `projector` leaves no image signal at all: vision rows of layer 0 are zero and
    no DeepStack feature is added, unlike `projector.merger` alone."""
    model = load_tiny("tiny-qwen3vl")
    inputs = model.encode(_image(), "Describe the image.")
    vision = inputs.modality == "vision"
    full = run_forward(model, inputs, ConditionPlan("a0", {}, "real", (Scale("projector", "vision", factor=0.0),)), _plan(model))["hidden"]
    merger = run_forward(model, inputs, ConditionPlan("m0", {}, "real", (Scale("projector.merger", "vision", factor=0.0),)), _plan(model))["hidden"]
    assert np.abs(full[vision, 0]).max() == 0
    assert np.abs(merger[vision, 0]).max() == 0
    # with every projector output zero, layer 1's vision rows are the decoder's update alone;
    # merger-only leaves the DeepStack add in place, so they differ
    assert np.abs(full[vision, 1] - merger[vision, 1]).max() > 1e-4


def test_reads_inside_a_forward_leave_their_copies_on_the_device():
    """A copy to the host inside a forward waits for every kernel launched before it, so one per
    read would make the host wait for the GPU layer after layer. Every reader that runs inside
    a trace keeps a float32 copy on the model's device (`saved_copy`) and the trace moves what
    it saved to the host once the forward is done (`_on_host`)."""
    import inspect

    import workbench.capture as capture
    from workbench.backends.local import _on_host

    readers = [cls for cls in vars(capture).values() if isinstance(cls, type) and "read" in vars(cls)]
    assert len(readers) >= 8, [cls.__name__ for cls in readers]
    for cls in readers:
        source = inspect.getsource(cls.read)
        assert "to_host(" not in source and '"cpu"' not in source, f"{cls.__name__}.read copies to the host"

    value = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    copy = capture.saved_copy(value)
    assert copy.dtype == torch.float32 and copy.device == value.device
    value += 1  # a later in-place edit in the forward does not reach the saved copy
    assert torch.equal(copy, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    moved = _on_host({("hidden", 0): [copy], ("site", "layer", 1): copy, "other": 3})
    assert moved[("hidden", 0)][0].device.type == "cpu" and moved[("site", "layer", 1)] is copy and moved["other"] == 3
