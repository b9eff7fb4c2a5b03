"""Spec layer: valid specs round-trip; invalid specs fail with located, explained problems."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.spec import (
    KNOWN_SITES,
    TINY_MODEL_NAMES,
    Problem,
    Spec,
    SpecError,
    load_spec,
    parse_spec,
)

from support.specs import BAD_SPECS, VALID, mutate

REPO = Path(__file__).resolve().parents[1]


def single_problem(text: str) -> Problem:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="bad.yaml")
    problems = caught.value.problems
    assert len(problems) == 1, str(caught.value)
    return problems[0]


# --------------------------------------------------------------------------- valid specs


def test_valid_spec_round_trip():
    spec = parse_spec(VALID, source="probe.yaml")
    assert spec.name == "probe"
    assert spec.models == ["tiny-smolvlm", "HuggingFaceTB/SmolVLM-256M-Instruct"]
    assert (spec.data.source, spec.data.n, spec.data.seed) == ("builtin", 8, 3)
    assert list(spec.conditions) == ["baseline", "blank", "alpha", "grid", "patched"]
    assert spec.conditions["blank"].image == "blank"
    assert spec.conditions["patched"].interventions[0].from_ == "blank"
    assert spec.capture[1].positions == "text"
    assert spec.generate.max_new_tokens == 2
    assert spec.backend.device == "cpu"
    assert spec.source == "probe.yaml"
    assert spec.source_text == VALID
    assert len(spec.spec_hash) == 64 and spec.spec_hash == parse_spec(VALID).spec_hash
    assert parse_spec(VALID + "\n").spec_hash != spec.spec_hash  # hash of the raw text


def test_sweep_expansion_names_and_substitution():
    spec = parse_spec(VALID)
    instances = spec.expand_conditions()
    assert [c.name for c in instances] == [
        "baseline",
        "blank",
        "alpha[alpha=0.1]",
        "alpha[alpha=1.0]",
        "alpha[alpha=3.0]",
        "grid[x=1,y=0.01]",
        "grid[x=2,y=0.01]",
        "patched",
    ]
    by_name = {c.name: c for c in instances}
    assert by_name["alpha[alpha=3.0]"].base == "alpha"
    assert by_name["alpha[alpha=3.0]"].sweep == {"alpha": 3.0}
    assert by_name["alpha[alpha=0.1]"].interventions[0].factor == 0.1
    grid = by_name["grid[x=2,y=0.01]"]
    assert grid.sweep == {"x": 2, "y": 0.01}  # an integer stays one (it may be a layer or a position)
    assert grid.interventions[0].factor == 2.0
    assert grid.interventions[1].target == 0.01
    assert by_name["baseline"].sweep == {} and by_name["baseline"].interventions == ()
    assert by_name["patched"].kv_swap.donor == "baseline"
    # The validated spec keeps the references; only instances substitute them.
    assert spec.conditions["alpha"].interventions[0].factor == "$alpha"
    assert spec.sweep_variables() == ["alpha", "x", "y"]


def test_defaults():
    spec = parse_spec(
        "name: d\nmodels: [tiny-llama]\nconditions: {baseline: }\n"
        "capture: [{site: layer}]\nstore: {path: s.zarr}\n"
    )
    assert spec.data.source == "builtin" and spec.data.seed == 0
    assert spec.conditions["baseline"].interventions == []
    assert spec.capture[0].layers == "all" and spec.capture[0].positions == "all"
    assert spec.generate is None
    assert (spec.backend.kind, spec.backend.device, spec.backend.dtype) == ("local", "auto", "auto")


def test_demo_spec_loads():
    spec = load_spec(REPO / "specs" / "demo.yaml")
    assert spec.models == ["tiny-smolvlm", "tiny-qwen3vl"]
    assert [c.name for c in spec.expand_conditions()] == ["baseline", "scale[alpha=0.1]", "scale[alpha=1.0]",
                                                          "scale[alpha=3.0]"]
    assert spec.data.n == 4


def test_local_checkpoint_directory_is_a_model(tmp_path):
    checkpoint = tmp_path / "my_ckpt"
    checkpoint.mkdir()
    spec = parse_spec(mutate("[tiny-smolvlm, HuggingFaceTB/SmolVLM-256M-Instruct]", f"[{checkpoint}]"))
    assert spec.models == [str(checkpoint)]


def test_constants():
    from workbench.sites import SITES

    # the registry's sites, then each registered family's connector parts
    assert KNOWN_SITES[: len(SITES)] == tuple(SITES)
    assert {"vision", "vision_layer", "projector.merger", "projector.mm_soft_emb_norm", "projector.deepstack"} <= set(KNOWN_SITES)
    assert TINY_MODEL_NAMES[:3] == ("tiny-smolvlm", "tiny-qwen3vl", "tiny-llama")


# --------------------------------------------------------------------------- bad specs
# The cases (support/specs.py): (mutated text, dotted field path, line, a phrase the message must contain).


@pytest.mark.parametrize("case", list(BAD_SPECS), ids=list(BAD_SPECS))
def test_bad_spec_is_located(case):
    text, field, line, phrase = BAD_SPECS[case]
    problem = single_problem(text)
    assert problem.field == field
    assert problem.line == line
    assert phrase in problem.message
    assert "expected" in problem.message


def test_error_message_format():
    with pytest.raises(SpecError) as caught:
        parse_spec(mutate("n: 8", "n: eight"), source="specs/bad.yaml")
    err = caught.value
    assert isinstance(err, ValueError)
    assert str(err) == "specs/bad.yaml:6: data.n: got 'eight' (str); expected an integer"
    assert err.problems[0].path == ("data", "n")


def test_every_problem_is_listed():
    text = mutate("n: 8", "n: -1").replace("site: logits", "site: nope").replace("outputs", "x") + "junk: 1\n"
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="bad.yaml")
    located = {(p.field, p.line) for p in caught.value.problems}
    assert located == {("data.n", 6), ("capture[1].site", 28), ("junk", 32)}
    lines = str(caught.value).splitlines()
    assert lines[0] == "3 problems in spec bad.yaml:"
    assert lines[1:] == [
        "  bad.yaml:6: data.n: got -1 (int); expected an integer >= 1",
        "  bad.yaml:28: capture[1].site: got 'nope' (str); expected one of " + ", ".join(f"'{s}'" for s in KNOWN_SITES),
        "  bad.yaml:32: junk: unknown field 'junk'; expected one of: name, description, plugins, models, data, conditions, "
        "capture, generate, store, backend, analysis, limits",
    ]


def test_python_tag_is_rejected_not_executed(tmp_path, capfd):
    marker = tmp_path / "pwned"
    for payload in ('!!python/object/apply:os.system ["echo hi"]', f'!!python/object/apply:os.system ["touch {marker}"]'):
        problem = single_problem(mutate("description: Projector scaling with patching and a KV swap.", f"description: {payload}"))
        assert problem.field == "description"
        assert problem.line == 2
        assert "unsupported YAML tag '!!python/object/apply:os.system'; expected plain YAML values" in problem.message
    assert not marker.exists()
    assert "hi" not in capfd.readouterr().out


def test_custom_tag_is_rejected():
    problem = single_problem(mutate("n: 8", "n: !env SAMPLES"))
    assert (problem.field, problem.line) == ("data.n", 6)
    assert "unsupported YAML tag '!env'" in problem.message


@pytest.mark.parametrize(
    "text, phrase",
    [("", "got an empty document"), ("- a\n- b\n", "got a list"), ("just words\n", "got 'just words' (str)")],
)
def test_top_level_must_be_a_mapping(text, phrase):
    problem = single_problem(text)
    assert problem.field == "(document)"
    assert phrase in problem.message and "expected a mapping with fields name," in problem.message


def test_recursive_alias_is_an_error_not_a_hang():
    problem = single_problem(VALID + "loop: &a [*a]\n")
    assert problem.line == 32 and "recursive alias" in problem.message


def test_merge_keys_are_supported():
    text = mutate("  - {site: layer, layers: all}\n", "  - &cap {site: layer, layers: [1, 2]}\n  - {<<: *cap, site: keys}\n")
    spec = parse_spec(text)
    assert [(c.site, c.layers) for c in spec.capture[:2]] == [("layer", [1, 2]), ("keys", [1, 2])]


def test_load_spec_missing_file(tmp_path):
    with pytest.raises(SpecError) as caught:
        load_spec(tmp_path / "nope.yaml")
    assert "cannot read the file" in str(caught.value)


def test_load_spec_reports_file_name(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(mutate("n: 8", "n: 0"))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert f"{path}:6: data.n: got 0 (int); expected an integer >= 1" in str(caught.value)


# --------------------------------------------------------------------------- CLI overrides


def test_overrides_apply_and_keep_provenance():
    spec = parse_spec(VALID, source="probe.yaml")
    changed = spec.with_overrides(models="tiny-llama, tiny-qwen3vl", limit=2, store_path="stores/x.zarr", device="cuda", dtype="bfloat16")
    assert changed.models == ["tiny-llama", "tiny-qwen3vl"]
    assert changed.data.n == 2
    assert changed.store.path == "stores/x.zarr"
    assert (changed.backend.device, changed.backend.dtype) == ("cuda", "bfloat16")
    assert changed.spec_hash == spec.spec_hash and changed.source_text == VALID
    assert changed.overrides["limit"] == 2
    assert spec.data.n == 8  # the original is untouched
    assert spec.with_overrides(limit=100).data.n == 8  # a limit caps, never grows


def test_overrides_switch_source_drops_inapplicable_options():
    spec = parse_spec(mutate("source: builtin", "source: jsonl\n  path: samples.jsonl"))
    assert spec.with_overrides(data_source="builtin").data.path is None


@pytest.mark.parametrize(
    "kwargs, field, phrase",
    [
        ({"models": "tiny-llama,qwen"}, "--models[1]", "unknown model 'qwen'"),
        ({"models": ""}, "--models", "expected at least 1 model"),
        ({"limit": 0}, "--limit", "got 0 (int); expected an integer >= 1"),
        ({"limit": "3"}, "--limit", "got '3' (str); expected an integer >= 1"),
        ({"data_source": "web"}, "--data", "got 'web' (str); expected one of 'builtin', 'datbench', 'jsonl', 'folder'"),
        ({"data_source": "folder"}, "--data", "missing required field 'path' for source 'folder'"),
        ({"device": "gpu"}, "--device", "expected one of 'auto', 'cpu', 'cuda'"),
        ({"dtype": "fp8"}, "--dtype", "expected one of 'auto', 'float32'"),
        ({"store_path": ""}, "--store", "expected a non-empty path"),
    ],
)
def test_bad_overrides_name_the_cli_option(kwargs, field, phrase):
    with pytest.raises(SpecError) as caught:
        parse_spec(VALID).with_overrides(**kwargs)
    (problem,) = caught.value.problems
    assert problem.field == field and problem.line is None
    assert phrase in problem.message


# --------------------------------------------------------------------------- property test

VALID_DATA = yaml.safe_load(VALID)

junk_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["$alpha", "$nope", "all", "vision", "layer", "blank", "tiny-llama", "a/b", "", "from"]),
    st.lists(st.integers(min_value=-2, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=2),
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, prefix + (index,))


def _get(node, path):
    for part in path:
        node = node[part]
    return node


@st.composite
def mutated_specs(draw):
    data = copy.deepcopy(VALID_DATA)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(list(_paths(data))))
        operation = draw(st.sampled_from(["drop", "retype", "junk_key"]))
        target = _get(data, path)
        if operation == "junk_key" and isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=8))] = draw(junk_values)
        elif operation == "drop" and path:
            del _get(data, path[:-1])[path[-1]]
        elif path:
            _get(data, path[:-1])[path[-1]] = draw(junk_values)
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_mutated_specs_validate_or_raise_spec_error(data):
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    try:
        spec = parse_spec(text, source="mutated.yaml")
    except SpecError as err:
        assert err.problems
        for problem in err.problems:
            assert problem.line is not None, str(err)
            assert "expected" in problem.message, str(err)
    else:
        assert isinstance(spec, Spec)
        spec.expand_conditions()


def test_a_deep_acyclic_source_chain_is_valid():
    """Sources may chain to any depth: only cycles are refused (a topological check)."""
    chain = "".join(f"  c{i}:\n    interventions: [{{kind: patch, site: layer, layers: [1], from: c{i + 1}}}]\n"
                    for i in range(7))
    spec = parse_spec(f"name: chain\nmodels: [tiny-llama]\nconditions:\n{chain}  c7: {{}}\n"
                      "capture: [{site: layer}]\nstore: {path: s.zarr}\n")
    assert len(spec.expand_conditions()) == 8


def test_capturable_and_editable_sites_agree_with_the_plan():
    from workbench import plan, sites, spec

    # both derived from the registry (workbench.sites); the spec adds the families' connector parts
    assert spec.EDITABLE_SITES == sites.EDITABLE_SITES + spec.PART_SITES
    assert plan.capture_sites is spec.capture_sites and plan.editable_sites is spec.editable_sites
    assert spec.CAPTURE_SITES == spec.capture_sites() == sites.CAPTURE_SITES   # read from the registry when asked
    assert "vision" in spec.CAPTURE_SITES and "vision_layer" in spec.EDITABLE_SITES


# --------------------------------------------------------------------------- kv_swap parts/layers, random add

_SWAP_BASE = """\
name: t
models: [tiny-qwen3vl]
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  c:
{body}
capture: [{{site: logits}}]
store: {{path: x.zarr}}
"""

NEW_FIELD_ERRORS = {
    "unknown part": ("    kv_swap: {donor: blank, parts: [key]}", "conditions.c.kv_swap.parts[0]",
                     "got 'key' (str) (did you mean 'keys'?); expected one of 'keys', 'values'"),
    "empty parts": ("    kv_swap: {donor: blank, parts: []}", "conditions.c.kv_swap.parts",
                    "got an empty list; expected a list of 'keys', 'values'"),
    "numbers for a parts sweep": ("    sweep: {p: [1.0]}\n    kv_swap: {donor: blank, parts: $p}",
                                  "conditions.c[p=1.0].kv_swap.parts", "got 1.0 (float); expected a list of 'keys', 'values'"),
    "unknown part set": ("    sweep: {p: [keys, value]}\n    kv_swap: {donor: blank, parts: $p}", "conditions.c.sweep.p[1]",
                         "got 'value' (str) (did you mean 'values'?); expected a number or one of 'vision', 'text', "
                         "'boundary', 'all', 'last', 'keys', 'values', 'keys+values'"),
    "fractional layer sweep": ("    sweep: {l: [0.5]}\n    kv_swap: {donor: blank, layers: [$l]}", "conditions.c[l=0.5].kv_swap.layers[0]",
                               "got 0.5 (float); expected a layer index (an integer >= 0)"),
    "undefined layer var": ("    kv_swap: {donor: blank, layers: [$l]}", "conditions.c.kv_swap.layers[0]", "'$l' is not defined"),
    "random and a vector": ("    interventions: [{kind: add, site: layer, direction: random, vector: [1.0]}]",
                            "conditions.c.interventions[0]",
                            "'vector' and 'direction' of 'vector', 'direction_from', 'direction' given; expected exactly one"),
    "unknown direction": ("    interventions: [{kind: add, site: layer, direction: randn}]",
                          "conditions.c.interventions[0].direction", "(did you mean 'random'?); expected one of 'random'"),
    "negative seed": ("    interventions: [{kind: add, site: layer, direction: random, seed: -1}]",
                      "conditions.c.interventions[0].seed", "got -1 (int); expected a seed (an integer >= 0)"),
    "seed without random": ("    interventions: [{kind: add, site: layer, vector: [1.0], seed: 3}]",
                            "conditions.c.interventions[0].seed", "'seed' is only used with 'direction: random'"),
    "zero norm": ("    interventions: [{kind: add, site: layer, direction: random, norm: 0}]",
                  "conditions.c.interventions[0].norm", "got 0 (int); expected a number > 0, 'matched'"),
    "fractional seed sweep": ("    sweep: {s: [1.5]}\n    interventions: [{kind: add, site: layer, direction: random, seed: $s}]",
                              "conditions.c[s=1.5].interventions[0].seed", "got 1.5 (float); expected a seed (an integer >= 0)"),
    "negative norm sweep": ("    sweep: {n: [1.0, -2.0]}\n    interventions: [{kind: add, site: layer, direction: random, norm: $n}]",
                            "conditions.c[n=-2.0].interventions[0].norm", "got -2.0 (float); expected a number > 0"),
}


@pytest.mark.parametrize("case", list(NEW_FIELD_ERRORS), ids=list(NEW_FIELD_ERRORS))
def test_kv_swap_parts_layers_and_random_add_errors_name_the_field(case):
    body, field, phrase = NEW_FIELD_ERRORS[case]
    problem = single_problem(_SWAP_BASE.format(body=body))
    assert problem.field == field
    assert phrase in problem.message
