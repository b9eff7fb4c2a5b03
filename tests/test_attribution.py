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
from workbench.spec import SpecError, parse_spec

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


RUN_SPEC = """\
name: attributed
models: [tiny-smolvlm]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  trace:
    scan: {{clean: baseline, corrupt: blank, site: {site}, layers: [1, 2], positions: [vision, last],{heads}
            method: attribution, metric: logit_diff, tokens: [5, 17]}}
capture: [{{site: logits}}]
store: {{path: {store}}}
"""


@pytest.mark.parametrize("site,heads", [("layer", ""), ("attn_heads", " heads: [0, 1],")])
def test_a_spec_scan_with_method_attribution_stores_the_python_apis_estimates(load_tiny, tmp_path, site, heads):
    """`workbench run` of a scan with method: attribution stores, per run, the estimate the Python
    API gives for that sample (attribution_scan); the patching analysis normalizes it by the base's
    and the donor's real metric, as numpy does from the stored arrays."""
    from analyses.patching import patching_effects
    from analyses.streaming import as_str
    from analyses.tables import open_models
    from workbench.cli import main
    from workbench.data import builtin_samples

    spec_path = tmp_path / "attributed.yaml"
    spec_path.write_text(RUN_SPEC.format(site=site, heads=heads, store=tmp_path / "a.zarr"))
    assert main(["run", str(spec_path), "-q"]) == 0
    ds = open_models(tmp_path / "a.zarr")["tiny-smolvlm"]
    conditions, samples = (as_str(ds[c].values) for c in ("run_condition", "run_sample"))
    model = load_tiny("tiny-smolvlm", attn="sdpa")
    plan = compile_plan(parse_spec(spec_path.read_text()), model.info)
    runs = scan_of(plan)
    assert len(runs) == 2 * 2 * (2 if heads else 1)
    diffs = {}
    for sample in builtin_samples(2):
        inputs = LazyInputs(model, sample)
        want = attribution_scan(model, plan, inputs, runs, "logit_diff", TOKENS)
        for run in runs:
            row = np.flatnonzero((conditions == run.name) & (samples == sample.id))
            assert len(row) == 1 and np.isnan(ds["logprobs"].values[row[0]]).all()   # estimated, not run
            assert float(ds["attribution"].values[row[0]]) == pytest.approx(want[run.name], rel=1e-4, abs=1e-5)
        for name in ("baseline", "blank"):
            row = np.flatnonzero((conditions == name) & (samples == sample.id))[0]
            diffs[(name, sample.id)] = logit_diff(ds["logprobs"].values[row, 0].astype(np.float64))
    effects = patching_effects(ds, "logit_diff", TOKENS, n_resamples=20, per_head=bool(heads))
    ids = [s.id for s in builtin_samples(2)]
    span = np.mean([diffs[("baseline", s)] for s in ids]) - np.mean([diffs[("blank", s)] for s in ids])
    for run in runs:
        stored = [float(ds["attribution"].values[np.flatnonzero((conditions == run.name) & (samples == s))[0]])
                  for s in ids]
        cell = {"scan": "trace", "direction": "denoising", "layer": run.sweep["l"], "position": run.sweep["pos"],
                "stat": "value", **({"head": run.sweep["h"]} if heads else {})}
        assert float(effects.effect.sel(cell)) == pytest.approx(np.mean(stored) / span, rel=1e-4, abs=1e-6)
    # the analysis's other metrics are not what the runs estimated: those scans are left out, saying so
    with pytest.raises(Exception, match="attribution"):
        patching_effects(ds, "kl", n_resamples=20, per_head=bool(heads))


def test_attribution_scans_are_refused_on_a_remote_backend_by_validate_and_run(tmp_path, capsys):
    from workbench.cli import main

    remote = tmp_path / "remote.yaml"
    remote.write_text(RUN_SPEC.format(site="layer", heads="", store=tmp_path / "r.zarr")
                      + "backend: {kind: remote}\n")
    assert main(["validate", str(remote)]) == 2
    err = capsys.readouterr().err
    assert "conditions.trace.scan.method: attribution patching needs gradients" in err
    local = tmp_path / "local.yaml"
    local.write_text(RUN_SPEC.format(site="layer", heads="", store=tmp_path / "l.zarr"))
    assert main(["run", str(local), "--remote", "local"]) == 2
    assert "conditions.trace.scan.method: attribution patching needs gradients" in capsys.readouterr().err
    assert not (tmp_path / "l.zarr").exists()   # refused before any job: no store begun
    bad = {"metric: logit_diff, tokens: [5, 17]": None,
           "metric: logit_diff": "conditions.trace.scan.tokens",
           "tokens: [5, 17]": "conditions.trace.scan.metric"}
    for fields, message in bad.items():
        text = RUN_SPEC.format(site="layer", heads="", store=tmp_path / "x.zarr").replace(
            "method: attribution, metric: logit_diff, tokens: [5, 17]", f"method: attribution, {fields}")
        if message is None:
            parse_spec(text)
            continue
        with pytest.raises(SpecError, match=message.replace(".", r"\.")):
            parse_spec(text)
    with pytest.raises(SpecError, match=r"conditions\.trace\.scan\.metric: real patching takes its metric at analysis"):
        parse_spec(RUN_SPEC.format(site="layer", heads="", store=tmp_path / "x.zarr").replace("method: attribution, ", ""))
