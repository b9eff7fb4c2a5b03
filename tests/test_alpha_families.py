"""On every VLM family's tiny model, the projector's α: α = 1 leaves every stored hidden state as the
baseline's, bit for bit, and α = 3 moves them (from the LLM input at the vision rows on). A random
tiny model on which α moves nothing would test nothing."""

from __future__ import annotations

import numpy as np
import pytest

from support.traces import plan_for, run
from workbench.models.architectures import tiny_architectures

FAST = ("tiny-qwen3vl",)
VLM = [a.tiny if a.tiny in FAST else pytest.param(a.tiny, marks=pytest.mark.slow)
       for a in tiny_architectures() if a.is_multimodal]


@pytest.mark.parametrize("name", VLM)
def test_alpha_one_is_the_baseline_and_alpha_three_moves_the_hidden_states(load_tiny, name):
    model = load_tiny(name)
    plan = plan_for(model, """\
  baseline: {}
  one: {interventions: [{kind: scale, site: projector, positions: vision, factor: 1.0}]}
  three: {interventions: [{kind: scale, site: projector, positions: vision, factor: 3.0}]}""")
    base, inputs = run(model, plan, "baseline")
    one, _ = run(model, plan, "one")
    three, _ = run(model, plan, "three")
    np.testing.assert_array_equal(one.tokens["hidden"], base.tokens["hidden"])
    modality = inputs["real"].modality
    if model.arch.cross_attention_layers:
        # the image never enters the token sequence (mllama): it reaches the text rows after the
        # image marker through the cross-attention layers, so those rows move from the first one on
        first = min(model.info.cross_attention_layers)
        after = np.arange(len(modality)) > np.flatnonzero(modality != "text")[0]
        moved = np.abs(three.tokens["hidden"][after] - base.tokens["hidden"][after]).max(axis=(0, 2))
        assert (moved[first + 1:] > 1e-4).all(), moved
        np.testing.assert_array_equal(three.tokens["hidden"][:, :first + 1], base.tokens["hidden"][:, :first + 1])
        return
    vision = modality == "vision"
    assert vision.any()
    moved = np.abs(three.tokens["hidden"] - base.tokens["hidden"]).max(axis=(0, 2))   # per layer
    assert (moved > 1e-3).all(), moved
    # text positions after the image move too, from the first decoder layer on
    text_after = (modality == "text") & (np.arange(len(vision)) > np.flatnonzero(vision)[-1])
    assert np.abs(three.tokens["hidden"][text_after, 1:] - base.tokens["hidden"][text_after, 1:]).max() > 1e-4
