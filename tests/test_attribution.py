"""Attribution patching against real patching on the tiny models: exact where the metric is linear
in the patched activation (a logit difference with the final norm an identity map, patched at the
final norm's input or at the last decoder layer's MLP output), correlated elsewhere (the
correlation is printed), refused on a remote backend before any job."""

from __future__ import annotations

import copy
import types

import numpy as np
import pytest
import torch

from workbench.attribution import attribution_scan
from workbench.backends.local import run_condition
from workbench.errors import BadInputError
from workbench.plan import compile_plan
from workbench.runner import LazyInputs
from workbench.spec import parse_spec

from support.traces import SAMPLE, patched_logprobs

TOKENS = (5, 17)
SPEC = """\
name: t
models: [{model}]
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  trace: {{scan: {{clean: baseline, corrupt: blank, site: {site}, layers: {layers}, positions: {positions}}}}}
capture: [{{site: logits}}]
store: {{path: unused.zarr}}
"""


def plan_of(model, site, layers, positions="[vision, text, boundary, last]"):
    text = SPEC.format(model=model.model_id, site=site, layers=list(layers), positions=positions)
    return compile_plan(parse_spec(text), model.info)


def logit_diff(lp):
    return float(lp[TOKENS[0]] - lp[TOKENS[1]])


def scan_of(plan):
    return [c for c in plan.conditions if c.name.startswith("trace[")]


def linear_copy(model):
    """The model with its final norm an identity map: its logits are W_U h_L, so a logit difference
    is linear in h_L and in what the last decoder layer's branches add to it."""
    hf = copy.deepcopy(model.hf)
    parent, _, name = model.arch.final_norm.rpartition(".")
    setattr(hf.get_submodule(parent), name, torch.nn.Identity())
    return types.SimpleNamespace(hf=hf, arch=model.arch, info=model.info, prepare=lambda: None)


@pytest.mark.parametrize("site,layer", [("layer", "L"), ("mlp_out", "L-1")])
def test_attribution_is_exact_where_the_metric_is_linear(load_tiny, site, layer):
    model = load_tiny("tiny-smolvlm")
    linear = linear_copy(model)
    top = model.info.n_layers if layer == "L" else model.info.n_layers - 1
    plan = plan_of(model, site, [top])
    inputs = LazyInputs(model, SAMPLE)
    estimates = attribution_scan(linear, plan, inputs, scan_of(plan), "logit_diff", TOKENS)
    base = logit_diff(patched_logprobs(linear, inputs["blank"].encoding))
    for run in scan_of(plan):
        index = np.asarray(run.interventions[-1].positions if not isinstance(run.interventions[-1].positions, str)
                           else __import__("workbench.sites", fromlist=["position_index"]).position_index(
                               run.interventions[-1].positions, inputs["blank"].modality))
        real = logit_diff(patched_logprobs(linear, inputs["blank"].encoding, site, top, index,
                                           inputs["real"].encoding)) - base
        assert estimates[run.name] == pytest.approx(real, rel=1e-4, abs=1e-5), run.name


def test_attribution_correlates_with_real_patching(load_tiny, capsys):
    model = load_tiny("tiny-qwen3vl")
    plan = plan_of(model, "layer", range(model.info.n_layers + 1))
    inputs = LazyInputs(model, SAMPLE)
    runs = scan_of(plan)
    estimates = attribution_scan(model, plan, inputs, runs, "logit_diff", TOKENS)
    base = logit_diff(run_condition(model, inputs, plan.condition("blank"), plan).run["logprobs"][0, 0])
    real = np.array([logit_diff(run_condition(model, inputs, run, plan).run["logprobs"][0, 0]) - base for run in runs])
    approx = np.array([estimates[run.name] for run in runs])
    r = float(np.corrcoef(real, approx)[0, 1])
    with capsys.disabled():
        print(f"\nattribution vs real patching, tiny-qwen3vl, {len(runs)} cells (layers x vision/text/boundary/last): "
              f"Pearson r = {r:.3f}")
    assert r > 0  # a rough first-order estimate of a large change (a whole image swapped) on random weights


def test_attribution_is_refused_on_a_remote_backend_before_any_job():
    with pytest.raises(BadInputError, match="backend.kind: attribution patching needs gradients"):
        attribution_scan(None, None, None, [], "logit_diff", TOKENS, backend_kind="remote")
