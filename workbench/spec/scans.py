"""Patching scans: one condition's `scan` section, a grid of `patch` runs over layers x position
groups from a donor condition into a base condition (ROME's causal tracing, TransformerLens'
and pyvene's activation-patching sweeps)::

    trace:
      scan: {clean: baseline, corrupt: blank, site: layer, layers: [0, 1, 2],
             positions: [vision, text, boundary, last], direction: both}

A scan is a sweep of one patch (`workbench.spec.sweeps`): its variables are `l` (the patched
layer; `layer` names a dim of the store), `pos` (the position group), with `direction: both`
`dir`, and with `heads` (site `attn_heads` only: the heads' outputs before the output
projection) `h`, one head patched at a time. Runs are named as a sweep's are:
`trace[l=1,pos=vision]`, `trace[dir=noising,l=1,pos=vision]` or `trace[l=1,h=2,pos=vision]`.

- denoising (the default): the corrupt condition's inputs and interventions, the site's value at
  `pos` of layer `l` copied from the clean condition (how much of the clean output one site restores);
- noising: the clean condition's, patched from the corrupt one (how much one site destroys).

Each run also stores, as words beside its sweep values, `dir`, the base (`scan_base`: the
condition it runs as), the donor (`scan_donor`) and the site (`scan_site`): the `patching`
analysis reads them (`analyses.patching`). Position groups: `vision`, `text`, `boundary`, `all`,
`last` (the prompt's final token), `last-k` (k tokens before it: each text token at the end of
the prompt, counted back), a token index, or a list of indices patched together (stored as
`3+4+5`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Mapping

from pydantic import Field, PlainValidator, model_validator
from pydantic_core import PydanticCustomError

from .fields import ConditionName, _fail, _fail_many, _index_list, _one_of, _positions
from .kinds import SpecModel
from .problems import SpecPath, _got

SCAN_SITES = ("layer", "attn_out", "mlp_out", "attn_heads")
DIRECTIONS = ("denoising", "noising", "both")
DEFAULT_POSITIONS = ("vision", "text", "boundary", "last")
# the variables of a scan's runs (sweep variables: coordinates of the store, words where they are)
LAYER_VAR, POSITION_VAR, DIRECTION_VAR, HEAD_VAR = "l", "pos", "dir", "h"
BASE_VAR, DONOR_VAR, SITE_VAR = "scan_base", "scan_donor", "scan_site"
# an attribution scan's runs also store its method, metric and tokens (`workbench.attribution`)
METHOD_VAR, METRIC_VAR, TOKENS_VAR = "scan_method", "scan_metric", "scan_tokens"
METHODS = ("patching", "attribution")
ATTRIBUTION_METRICS = ("logit_diff", "answer_logprob")


def _token_ids(value: Any) -> list[int]:
    if not isinstance(value, list):
        _fail(f"{_got(value)}; expected a list of token ids")
    return _index_list(value, "token id")


def _position_group(value: Any) -> str:
    """One cell's positions as a word: a group, `last-k`, an index (`5`) or indices (`3+4+5`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    checked = _positions(value)
    return checked if isinstance(checked, str) else "+".join(str(p) for p in checked)


def _position_groups(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        _fail(f"{_got(value)}; expected a non-empty list of position groups (vision, text, boundary, all, last, "
              "last-k, a token index, or a list of indices patched together)")
    problems: list[tuple[SpecPath, str]] = []
    groups: list[str] = []
    for i, item in enumerate(value):
        try:
            group = _position_group(item)
        except PydanticCustomError as exc:  # the field validator's located messages, under this item
            problems += [((i, *path), message) for path, message in (exc.context or {})["problems"]]
            continue
        if group in groups:
            problems.append(((i,), f"duplicate position group {group!r}; expected each group once"))
        groups.append(group)
    if problems:
        _fail_many(problems)
    return groups


class Scan(SpecModel):
    clean: ConditionName             # the run whose output the patches restore (denoising's donor)
    corrupt: ConditionName           # the run they restore it into (denoising's base)
    site: Annotated[Literal["layer", "attn_out", "mlp_out", "attn_heads"], _one_of(SCAN_SITES)] = "layer"
    layers: Annotated[list[int], PlainValidator(lambda v: _index_list(v, "layer index") if isinstance(v, list)
                                                 else _fail(f"{_got(v)}; expected a list of layer indices"))]
    positions: Annotated[list[str], PlainValidator(_position_groups)] = Field(
        default_factory=lambda: list(DEFAULT_POSITIONS))
    direction: Annotated[Literal["denoising", "noising", "both"], _one_of(DIRECTIONS)] = "denoising"
    heads: Annotated[list[int] | None, PlainValidator(lambda v: None if v is None else _index_list(v, "head index")
                                                      if isinstance(v, list) else
                                                      _fail(f"{_got(v)}; expected a list of head indices"))] = None

    method: Annotated[Literal["patching", "attribution"], _one_of(METHODS)] = "patching"
    metric: Annotated[Literal["logit_diff", "answer_logprob"] | None,
                      PlainValidator(lambda v: None if v is None else _one_of(ATTRIBUTION_METRICS).func(v))] = None
    tokens: Annotated[list[int] | None, PlainValidator(lambda v: None if v is None else _token_ids(v))] = None

    @model_validator(mode="after")
    def _fields_agree(self) -> "Scan":
        problems: list[tuple[SpecPath, str]] = []
        if self.heads is not None and self.site != "attn_heads":
            problems.append((("heads",), "a scan over heads patches the heads' outputs; expected site: attn_heads "
                             f"beside 'heads' (got site: {self.site})"))
        if self.method == "patching":
            problems += [((f,), f"real patching takes its metric at analysis (`workbench analyze STORE patching "
                          f"--metric ...`); expected '{f}' only with method: attribution")
                         for f in ("metric", "tokens") if getattr(self, f) is not None]
        elif self.metric is None:
            problems.append((("metric",), "attribution patching estimates one metric's gradient at run time; "
                             f"expected metric: {' or '.join(ATTRIBUTION_METRICS)}"))
        elif self.metric == "logit_diff" and (self.tokens is None or len(self.tokens) != 2):
            problems.append((("tokens",), f"{_got(self.tokens)}; expected two token ids [a, b] for the logit "
                             "difference ln p(a) − ln p(b)"))
        elif self.metric == "answer_logprob" and self.tokens is not None:
            problems.append((("tokens",), "answer_logprob reads each sample's answer; expected no 'tokens'"))
        if problems:
            _fail_many(problems)
        return self

    def axes(self) -> tuple[tuple[tuple[str, ...], tuple[list[Any], ...]], ...]:
        """The factors of its runs' product (`workbench.spec.sweeps.Axis`): direction (with
        `both`), layer, position group."""
        axes: list[tuple[tuple[str, ...], tuple[list[Any], ...]]] = []
        if self.direction == "both":
            axes.append(((DIRECTION_VAR,), (["denoising", "noising"],)))
        axes.append(((LAYER_VAR,), (list(self.layers),)))
        if self.heads is not None:
            axes.append(((HEAD_VAR,), (list(self.heads),)))
        axes.append(((POSITION_VAR,), (list(self.positions),)))
        return tuple(axes)

    def roles(self, assignment: Mapping[str, Any]) -> tuple[str, str, str]:
        """(direction, base, donor) of the run with these values."""
        direction = assignment.get(DIRECTION_VAR, self.direction)
        if direction == "noising":
            return direction, self.clean, self.corrupt
        return direction, self.corrupt, self.clean

    def patch_entry(self, assignment: Mapping[str, Any]) -> dict[str, Any]:
        """The run's patch, as a spec entry (validated by the patch kind's model)."""
        _, _, donor = self.roles(assignment)
        entry = {"kind": "patch", "site": self.site, "layers": [assignment[LAYER_VAR]],
                 "positions": assignment[POSITION_VAR], "from": donor}
        return {**entry, "heads": [assignment[HEAD_VAR]]} if HEAD_VAR in assignment else entry

    def stored(self, assignment: Mapping[str, Any]) -> dict[str, Any]:
        """What a run stores beside its sweep values (module doc)."""
        direction, base, donor = self.roles(assignment)
        words = {DIRECTION_VAR: direction, BASE_VAR: base, DONOR_VAR: donor, SITE_VAR: self.site}
        if self.method == "attribution":
            words.update({METHOD_VAR: self.method, METRIC_VAR: str(self.metric),
                          TOKENS_VAR: ",".join(str(t) for t in self.tokens or ())})
        return words


def scan_problems(name: str, scan: Scan, conditions: Mapping[str, Any]) -> list[tuple[SpecPath, str]]:
    """clean and corrupt name two different conditions of one run each, with no kv_swap."""
    problems: list[tuple[SpecPath, str]] = []
    plain = [c for c, cond in conditions.items() if not cond.runs_many and c != name]
    expected = f"one of {', '.join(plain)}" if plain else "the name of a condition without a sweep or scan"
    for field in ("clean", "corrupt"):
        target = getattr(scan, field)
        path = ("conditions", name, "scan", field)
        if target not in conditions or target == name:
            problems.append((path, f"unknown condition '{target}'; expected {expected}"))
        elif conditions[target].runs_many:
            problems.append((path, f"condition '{target}' has a sweep or scan, so it names several runs; expected "
                             f"{expected}"))
        elif conditions[target].kv_swap is not None:
            problems.append((path, f"condition '{target}' has a kv_swap (its cache is edited between two traces); "
                             "expected a condition whose prompt forward a patch can edit"))
    if scan.method == "attribution":  # its hooks reproduce a forward of an image alone (`workbench.attribution`)
        for field in ("clean", "corrupt"):
            target = conditions.get(getattr(scan, field))
            if target is not None and not target.runs_many and target.interventions:
                problems.append((("conditions", name, "scan", field), f"condition '{getattr(scan, field)}' has "
                                 "interventions; expected, for method: attribution, a condition of an image only"))
    if scan.clean == scan.corrupt:
        problems.append((("conditions", name, "scan", "corrupt"), f"clean and corrupt are both '{scan.clean}'; "
                         "expected two different conditions"))
    return problems


def own_fields_problems(condition: Any) -> list[tuple[SpecPath, str]]:
    """A scan runs as its base condition: it sets no image, interventions, kv_swap or sweep of its own."""
    given = [f for f in ("sweep", "image", "interventions", "kv_swap") if f in condition.model_fields_set]
    return [((f,), f"a scan runs as its clean or corrupt condition (their image and interventions, plus one patch); "
             f"expected no '{f}' beside 'scan'") for f in given]
