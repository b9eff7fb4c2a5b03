"""A valid spec and its bad mutations: each one located (field, line) with the phrase its
message must hold. The spec layer's tests, the CLI's and the fuzzed fault drills share them."""

from __future__ import annotations

from workbench.extend import intervention_kinds
from workbench.spec import TINY_MODEL_NAMES
from workbench.models.refs import TRAINED_MODEL_NAMES

# Line numbers matter: the bad-spec cases below assert them.
VALID = """\
name: probe
description: Projector scaling with patching and a KV swap.
models: [tiny-smolvlm, HuggingFaceTB/SmolVLM-256M-Instruct]
data:
  source: builtin
  n: 8
  seed: 3
conditions:
  baseline: {}
  blank:
    image: blank
  alpha:
    sweep: {alpha: [0.1, 1.0, 3.0]}
    interventions:
      - {kind: scale, site: projector, factor: $alpha, positions: vision}
  grid:
    sweep: {x: [1, 2], y: [0.01]}
    interventions:
      - {kind: add, site: layer, layers: [0, 2], direction_from: blank, factor: $x}
      - {kind: normalize, target: $y}
  patched:
    interventions:
      - {kind: patch, site: embed, from: blank, positions: [0, 1, 2]}
      - {kind: zero, site: layer, layers: [1]}
    kv_swap: {donor: baseline, positions: vision, layers: all}
capture:
  - {site: layer, layers: all}
  - {site: logits, positions: text}
generate: {max_new_tokens: 2}
store: {path: stores/probe.zarr}
backend: {kind: local, device: cpu, dtype: float32}
"""


def mutate(old: str, new: str) -> str:
    assert VALID.count(old) == 1, f"ambiguous or missing mutation anchor {old!r}"
    return VALID.replace(old, new)


# --------------------------------------------------------------------------- bad specs
# Each case: (mutated text, dotted field path, line, a phrase the message must contain).

BAD_SPECS = {
    "unknown top-level key": (VALID + "outputs: here\n", "outputs", 32, "unknown field 'outputs'; expected one of: name,"),
    "unknown nested key": (mutate("  seed: 3\n", "  seed: 3\n  shuffle: true\n"), "data.shuffle", 8, "unknown field 'shuffle'; expected one of: source, n, seed"),
    "unknown intervention key": (
        mutate("$alpha, positions: vision", "$alpha, positons: vision"),
        "conditions.alpha.interventions[0].positons",
        15,
        "unknown field 'positons' (did you mean 'positions'?); expected one of: kind, site, positions, layers, factor",
    ),
    "string for n": (mutate("n: 8", "n: eight"), "data.n", 6, "got 'eight' (str); expected an integer"),
    "quoted number for n": (mutate("n: 8", "n: '8'"), "data.n", 6, "got '8' (str); expected an integer"),
    "negative n": (mutate("n: 8", "n: -2"), "data.n", 6, "got -2 (int); expected an integer >= 1"),
    "negative commit interval": (mutate("dtype: float32}", "dtype: float32, commit_interval_s: -0.5}"),
                                 "backend.commit_interval_s", 31, "got -0.5 (float); expected a number >= 0.0"),
    "unknown site": (
        mutate("site: projector", "site: projektor"),
        "conditions.alpha.interventions[0].site",
        15,
        "got 'projektor' (str) (did you mean 'projector'?); expected one of 'embed', 'embed_table', 'vision_layer', 'vision'",
    ),
    "unknown capture site": (mutate("site: logits", "site: lm_head"), "capture[1].site", 28, "expected one of 'embed'"),
    "unknown intervention kind": (
        mutate("kind: zero", "kind: ablate"),
        "conditions.patched.interventions[1].kind",
        24,
        "got 'ablate' (str); expected one of " + ", ".join(repr(k) for k in sorted(intervention_kinds())),
    ),
    "missing intervention kind": (
        mutate("{kind: zero, site", "{site"),
        "conditions.patched.interventions[1].kind",
        24,
        "missing required field 'kind'; expected one of 'add'",
    ),
    "unknown model": (
        mutate("HuggingFaceTB/SmolVLM-256M-Instruct]", "smolvlm]"),
        "models[1]",
        3,
        f"unknown model 'smolvlm' (did you mean 'tiny-smolvlm'?); expected one of {', '.join(TINY_MODEL_NAMES)}, "
        f"{', '.join(TRAINED_MODEL_NAMES)} (a checkpoint: NAME@step-N), a Hugging Face repo id 'org/name', "
        "or a local checkpoint directory",
    ),
    "duplicate model": (
        mutate("HuggingFaceTB/SmolVLM-256M-Instruct]", "tiny-smolvlm]"),
        "models[1]",
        3,
        "duplicate model 'tiny-smolvlm'",
    ),
    "missing name": (mutate("name: probe\n", ""), "name", 1, "missing required field 'name'; expected a spec name"),
    "missing store": (
        mutate("store: {path: stores/probe.zarr}\n", ""),
        "store",
        1,
        "missing required field 'store'; expected a mapping like {path: stores/demo.zarr}",
    ),
    "missing nested field": (
        mutate("- {kind: scale, site: projector, factor: $alpha,", "- {kind: scale, site: projector,"),
        "conditions.alpha.interventions[0].factor",
        15,
        "missing required field 'factor'",
    ),
    "undefined $var": (
        mutate("factor: $alpha", "factor: $beta"),
        "conditions.alpha.interventions[0].factor",
        15,
        "'$beta' is not defined; expected one of this condition's sweep variables: $alpha",
    ),
    "$var without sweep": (
        mutate("{kind: zero, site: layer, layers: [1]}", "{kind: scale, site: layer, factor: $alpha}"),
        "conditions.patched.interventions[1].factor",
        24,
        "'$alpha' is not defined; expected a value, or add 'sweep: {alpha: [...]}'",
    ),
    "patch from a missing condition": (
        mutate("embed, from: blank", "embed, from: blnk"),
        "conditions.patched.interventions[0].from",
        23,
        "unknown condition 'blnk' (did you mean 'blank'?); expected one of",
    ),
    "donor missing": (
        mutate("donor: baseline", "donor: nobody"),
        "conditions.patched.kv_swap.donor",
        25,
        "unknown condition 'nobody'",
    ),
    "donor is swept": (
        mutate("donor: baseline", "donor: alpha"),
        "conditions.patched.kv_swap.donor",
        25,
        "condition 'alpha' has a sweep, so it names several runs; expected one of baseline, blank, patched",
    ),
    "direction_from itself": (
        mutate("direction_from: blank", "direction_from: grid"),
        "conditions.grid.interventions[0].direction_from",
        19,
        "refers to itself",
    ),
    "capture of a site that cannot be captured": (
        mutate("{site: layer, layers: all}", "{site: projector}"),
        "capture[0].site",
        27,
        "site 'projector' cannot be captured; expected one of embed, embed_table, vision_layer, vision, embed_lens, keys, layer,",
    ),
    "edit of a site that cannot be edited": (
        mutate("{kind: zero, site: layer, layers: [1]}", "{kind: zero, site: attention, layers: [1]}"),
        "conditions.patched.interventions[1].site",
        24,
        "site 'attention' cannot be edited by 'zero'; expected one of embed, vision_layer, vision, projector,",
    ),
    "source cycle": (
        mutate("  blank:\n    image: blank\n", "  blank:\n    image: blank\n    interventions: [{kind: patch, site: embed, from: patched}]\n"),
        "conditions.blank.interventions[0].from",
        12,
        "source cycle blank -> patched -> blank (each condition reads the next",
    ),
    "bad positions word": (
        mutate("positions: vision}", "positions: image}"),
        "conditions.alpha.interventions[0].positions",
        15,
        "got 'image' (str); expected one of 'vision', 'text', 'boundary', 'all', 'last', 'last-k'",
    ),
    "negative position": (
        mutate("positions: [0, 1, 2]", "positions: [0, -1, 2]"),
        "conditions.patched.interventions[0].positions[1]",
        23,
        "got -1 (int); expected a token position (an integer >= 0)",
    ),
    "bad layers": (mutate("layers: [0, 2]", "layers: some"), "conditions.grid.interventions[0].layers", 19, "expected 'all' or a list of layer indices"),
    "duplicate yaml key": (mutate("  seed: 3\n", "  seed: 3\n  n: 9\n"), "data.n", 8, "duplicate key 'n' (first on line 6); expected each key once"),
    "yaml syntax error": (mutate("  n: 8\n", "\tn: 8\n"), "(document)", 6, "invalid YAML"),
    "yaml bad indentation": (mutate("  n: 8\n", "   n: 8\n"), "(document)", 6, "expected valid YAML syntax"),
    "empty conditions": (
        mutate(VALID[VALID.index("conditions:") : VALID.index("capture:")], "conditions: {}\n"),
        "conditions",
        8,
        "got an empty mapping; expected at least 1 condition",
    ),
    "empty sweep list": (mutate("[0.1, 1.0, 3.0]", "[]"), "conditions.alpha.sweep.alpha", 13, "got an empty list; expected at least 1 value"),
    "duplicate sweep value": (mutate("[0.1, 1.0, 3.0]", "[0.1, 1, 1.0]"), "conditions.alpha.sweep.alpha[2]", 13, "duplicate sweep value 1.0"),
    "boolean in sweep": (mutate("[0.1, 1.0, 3.0]", "[0.1, true]"), "conditions.alpha.sweep.alpha[1]", 13, "got true (boolean); expected a number"),
    "boolean factor": (
        mutate("factor: $alpha", "factor: yes"),
        "conditions.alpha.interventions[0].factor",
        15,
        "got true (boolean); expected a number or a '$variable'",
    ),
    "boolean for n": (mutate("n: 8", "n: true"), "data.n", 6, "got true (boolean); expected an integer"),
    "bad image mode": (mutate("image: blank", "image: black"), "conditions.blank.image", 11, "expected one of 'real', 'blank', 'none'"),
    "bad condition name": (mutate("  blank:\n", "  blank image:\n"), "conditions.blank image", 10, "expected a condition name made of letters"),
    "path for builtin": (mutate("  seed: 3\n", "  seed: 3\n  path: x.jsonl\n"), "data.path", 8, "'path' is not used by source 'builtin'"),
    "jsonl without path": (mutate("source: builtin", "source: jsonl"), "data.path", 4, "missing required field 'path' for source 'jsonl'"),
    "unknown datbench config": (
        mutate("source: builtin", "source: datbench\n  exclude: [maths]"),
        "data.exclude[0]",
        6,
        "got 'maths' (str) (did you mean 'math'?); expected one of 'chart', 'counting'",
    ),
    "add with neither vector nor direction": (
        mutate("direction_from: blank, ", ""),
        "conditions.grid.interventions[0]",
        19,
        "none of 'vector', 'direction_from', 'direction' given; expected exactly one of them",
    ),
    "list where mapping expected": (mutate("store: {path: stores/probe.zarr}", "store: [stores/probe.zarr]"), "store", 30, "got a list; expected a mapping"),
    "models not a list": (
        mutate("models: [tiny-smolvlm, HuggingFaceTB/SmolVLM-256M-Instruct]", "models: tiny-smolvlm"),
        "models",
        3,
        "got 'tiny-smolvlm' (str); expected a list",
    ),
    "bad dtype": (mutate("dtype: float32", "dtype: fp32"), "backend.dtype", 31, "expected one of 'auto', 'float32', 'bfloat16', 'float16'"),
    "zero max_new_tokens": (mutate("max_new_tokens: 2", "max_new_tokens: 0"), "generate.max_new_tokens", 29, "expected an integer >= 1"),
}
