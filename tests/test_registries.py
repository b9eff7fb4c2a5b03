"""One registry per extension point, and everything that lists its entries agrees with it:
interventions (kind -> spec model -> runtime class; the spec's kind list and error messages).
Analyses: tests/test_analysis_registry.py."""

from __future__ import annotations

import re
import typing

import pytest

from workbench import interventions, plan, spec
from workbench.models.model import model_info
from workbench.plan import compile_plan

# one entry of every kind, as a spec writes it
EVERY_KIND = """\
name: kinds
models: [tiny-qwen3vl]
conditions:
  blank: {image: blank}
  scale: {interventions: [{kind: scale, site: layer, layers: [1], factor: 0.5}]}
  zero: {interventions: [{kind: zero, site: embed, positions: boundary}]}
  add: {interventions: [{kind: add, site: layer, layers: [1], direction: random, seed: 1}]}
  patch: {interventions: [{kind: patch, site: layer, layers: [1], positions: vision, from: blank}]}
  normalize: {interventions: [{kind: normalize, target: 2.0}]}
capture: [{site: layer}]
store: {path: unused.zarr}
"""


def test_intervention_registry_joins_spec_models_and_runtime_classes():
    joined = plan.intervention_registry()
    assert tuple(joined) == spec.INTERVENTION_KINDS == tuple(spec.INTERVENTION_SPECS) == tuple(interventions.RUNTIME)
    for kind, (model, runtime) in joined.items():
        assert typing.get_args(model.model_fields["kind"].annotation) == (kind,)   # the model's own tag
        assert issubclass(runtime, interventions.Intervention)
    # every kind, built through the registry from a parsed spec, is the registered class
    compiled = compile_plan(spec.parse_spec(EVERY_KIND), model_info("tiny-qwen3vl"))
    built = {c.name: c.interventions[0] for c in compiled.conditions if c.interventions}
    assert set(built) == set(joined)
    for kind, item in built.items():
        assert type(item) is joined[kind][1]


def test_spec_errors_list_the_registered_kinds():
    with pytest.raises(spec.SpecError) as caught:
        spec.parse_spec(EVERY_KIND.replace("kind: zero", "kind: ablate"))
    listed = re.findall(r"'([a-z]+)'", str(caught.value).split("expected one of", 1)[1])
    assert tuple(listed) == spec.INTERVENTION_KINDS


def test_a_kind_missing_from_one_half_is_refused(monkeypatch):
    monkeypatch.setattr(plan, "RUNTIME", {k: v for k, v in interventions.RUNTIME.items() if k != "patch"})
    with pytest.raises(RuntimeError, match="intervention kinds disagree"):
        plan.intervention_registry()
