"""One registry per extension point, and everything that lists its entries agrees with it:
interventions (kind -> spec model -> runtime class; the spec's kind list and error messages).
Analyses: tests/test_analysis_registry.py."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from workbench import interventions, spec
from workbench.extend import intervention_kinds
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
  sae_splice: {interventions: [{kind: sae_splice, site: layer, layers: [1], positions: vision, sae: SAE_DIR}]}
capture: [{site: layer}]
store: {path: unused.zarr}
"""


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory) -> str:
    """EVERY_KIND with an SAE in SAELens's format of tiny-qwen3vl's width, for `sae_splice` to name."""
    from sae_lens import StandardSAE, StandardSAEConfig

    path = tmp_path_factory.mktemp("kinds") / "sae"
    StandardSAE(StandardSAEConfig(d_in=model_info("tiny-qwen3vl").hidden_size, d_sae=16)).save_model(path)
    return EVERY_KIND.replace("SAE_DIR", str(path))


def test_every_builtin_kind_is_one_module_registered_like_a_plugin(every_kind):
    kinds = intervention_kinds()
    folder = Path(interventions.__file__).parent
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "base"))
    assert list(kinds) == modules                              # one file per kind, and the file's name is the kind
    for name, kind in kinds.items():
        assert kind.module == f"workbench.interventions.{name}" and kind.builtin and (kind.remote or kind.local_only is not None)
        assert typing.get_args(kind.spec.model_fields["kind"].annotation) == (name,)   # the model's own tag
        assert issubclass(kind.runtime, interventions.Intervention)
    # every kind, built through the registry from a parsed spec, is the registered class
    compiled = compile_plan(spec.parse_spec(every_kind), model_info("tiny-qwen3vl"))
    built = {c.name: c.interventions[0] for c in compiled.conditions if c.interventions}
    assert set(built) == set(kinds)
    for name, item in built.items():
        assert type(item) is kinds[name].runtime


def test_sweepable_fields_come_from_the_kinds_models():
    swept = {name: kind.swept() for name, kind in intervention_kinds().items()}
    edit = {"positions": "positions", "layers": "layers"}  # every `InterventionSpec` selects them
    assert swept == {"add": {**edit, "seed": "seed", "norm": "positive", "factor": "number"},
                     "normalize": {"target": "number"}, "patch": edit, "scale": {**edit, "factor": "number"}, "zero": edit,
                     "sae_splice": edit}


def test_spec_errors_list_the_registered_kinds():
    with pytest.raises(spec.SpecError) as caught:
        spec.parse_spec(EVERY_KIND.replace("kind: zero", "kind: ablate"))
    listed = re.findall(r"'([a-z_]+)'", str(caught.value).split("expected one of", 1)[1])
    assert tuple(listed) == spec.kind_names() == tuple(intervention_kinds())


SPECS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "specs.md"


def test_docs_tables_list_the_registered_kinds():
    page = SPECS_PAGE.read_text(encoding="utf-8")
    section = page.split("\n## Interventions", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z_]+)` \|", section, re.M)
    assert sorted(listed) == sorted(intervention_kinds())   # each kind once, in the order the page explains them


def test_every_site_is_one_module_and_the_docs_list_them():
    from workbench import sites

    folder = Path(sites.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "base", "readers"}
    assert modules == {name.replace(".", "_") for name in sites.SITES}       # one file per site
    page = SPECS_PAGE.read_text(encoding="utf-8")
    prose = page.split("\n## Sites", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"`([a-z_.]+)`", prose)) >= set(sites.SITES)       # every site is named there
    table = page.split("\n## Captures", 1)[1].split("\n\n", 2)[1]
    listed = {name for cell in re.findall(r"^\| ((?:`[a-z_.]+`(?:, )?)+) \|", table, re.M)
              for name in re.findall(r"`([a-z_.]+)`", cell)}
    assert listed == set(sites.CAPTURE_SITES)                                # and the captures table, each once
    for name, entry in sites.SITES.items():
        assert (entry.capture is not None) == bool(entry.stores), name       # a stored site has its reader
