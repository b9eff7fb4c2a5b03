"""Definitions the study leaves open, as named choices: a spec's `analysis:` section picks them,
the run stores them in each model's attrs (`definitions`), and `workbench analyze` reads them from
the store (its flags override) and prints the ones in force under every table.

- `text_set`: which tokens the "text" side of a vision/text comparison averages over. `text`: the
  text tokens only, boundary tokens (`<fake_token_around_image>`, `<|vision_start|>`, ...) left
  out; `text+boundary`: every token that is not a vision token (each (sample) mean is then the
  token-weighted mean of the two groups' token means).
- `average_layers`: which decoder layers a "mean over layers" covers (cos(K′,K), cos(V′,V) and the
  attention KL of the α tables). `all`: every stored decoder layer; `from_1`: decoder layers ≥ 1,
  leaving out decoder layer 0, whose keys and values are unchanged by a projector scale up to the
  RMSNorm epsilon (RMSNorm(αh) = RMSNorm(h)), so it only pulls a mean towards 1.
- `rank_base`: what the reference's top token counts as when it stays on top. 0: rank = the
  number of tokens scored strictly higher; 1: that number + 1.

The defaults (`text`, `all`, 0) are the definitions of the study's own code, which the workbench
reproduces number for number; the alternatives are the other readings of its prose.

Torch-free: the spec, the runner and the analyses all read it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

# each choice's values as a type (the spec's fields) and as a tuple (listings, messages)
TextSet = Literal["text", "text+boundary"]
AverageLayers = Literal["all", "from_1"]
TEXT_SETS: tuple[str, ...] = get_args(TextSet)
AVERAGE_LAYERS: tuple[str, ...] = get_args(AverageLayers)
RANK_BASES = (0, 1)
DEFAULTS: dict[str, Any] = {"text_set": "text", "average_layers": "all", "rank_base": 0}
CHOICES: dict[str, tuple] = {"text_set": TEXT_SETS, "average_layers": AVERAGE_LAYERS, "rank_base": RANK_BASES}

_MEANING = {
    ("text_set", "text"): "text tokens only, boundary tokens excluded",
    ("text_set", "text+boundary"): "every non-vision token, boundary tokens included",
    ("average_layers", "all"): "means over layers cover every decoder layer",
    ("average_layers", "from_1"): "means over layers leave out decoder layer 0",
    ("rank_base", 0): "the reference's top token still on top has rank 0",
    ("rank_base", 1): "the reference's top token still on top has rank 1",
}


def resolve(stored: Any = None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The definitions in force: the defaults, then what a store holds (`stored`, its
    `definitions` attr; a JSON string or a dict), then `overrides` (command-line flags; None
    values ignored). An unknown name or value raises ValueError naming it and the choices."""
    import json

    if isinstance(stored, str):
        stored = json.loads(stored) if stored else {}
    merged = {**DEFAULTS, **(stored or {}), **{k: v for k, v in (overrides or {}).items() if v is not None}}
    for name, value in merged.items():
        if name not in CHOICES:
            raise ValueError(f"unknown definition {name!r}; expected one of {', '.join(CHOICES)}")
        if value not in CHOICES[name]:
            raise ValueError(f"definition {name}: got {value!r}; expected one of {', '.join(map(str, CHOICES[name]))}")
    return merged


def describe(definitions: dict[str, Any]) -> str:
    """One line naming every definition in force, with what it means."""
    parts = [f"{name} = {definitions[name]} ({_MEANING[(name, definitions[name])]})" for name in DEFAULTS]
    return "Definitions: " + "; ".join(parts) + "."


# -- scoring modes (task accuracy, analyses.accuracy) ------------------------------------------

# How a sample's answer is scored against the generated text: a sample's `eval_mode`, stored per
# run as `run_eval_mode`. DatBench's own column holds `direct` or `judge`.
EVAL_MODES = ("exact", "choice", "numeric", "direct", "judge")
EVAL_MODE_MEANING = {
    "exact": "the normalized response equals the normalized answer",
    "choice": "the response's option letter (B, (B), B., B) ...) equals the answer's",
    "numeric": "the response's first number is within the relative tolerance of the answer",
    "direct": "DatBench's deterministic mode: choice if the answer is an option letter, numeric if it is a "
              "number, else exact",
    "judge": "DatBench's LLM-as-judge mode: not scored (the workbench runs no judge)",
}


def check_eval_mode(value: Any, where: str) -> str | None:
    """`value` as a scoring mode (None or "" = none given), or ValueError naming `where`."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or value.strip().lower() not in EVAL_MODES:
        raise ValueError(f"{where}: got {value!r}; expected one of {', '.join(EVAL_MODES)}")
    return value.strip().lower()
