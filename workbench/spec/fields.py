"""The spec's vocabulary and field validators: the names a spec may use (sites, models, data
sources, position groups, ...) and one validator per kind of field, each failing with a single
"got ...; expected ..." message (located by sub-path) instead of pydantic's per-union-member
noise; the annotated types the schema's models are declared with."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Callable, Literal, Mapping, NoReturn, Sequence, Union, get_args

from pydantic import AfterValidator, Field, PlainValidator
from pydantic_core import PydanticCustomError

from .. import sites
from ..models.architectures import ARCHITECTURES
from ..models.refs import TINY_MODEL_NAMES, model_ref_problem  # one tiny model per registered family
from ..names import reserved_name_problem
from ..sites import part_sites
from .problems import SpecPath, _did_you_mean, _got, _quoted

# --------------------------------------------------------------------------- constants

# Sites come from the registry (workbench/sites/), read when a spec is validated: a site that a
# plugin registers (the spec's `plugins`, an entry point) is known from then on. A connector part
# `projector.<part>` is a site for the families that declare it (the plan refuses it on the others).
PART_SITES = part_sites(ARCHITECTURES)


def _registered() -> None:
    """The registry with the installed packages' entry points loaded (`workbench.extend`)."""
    from ..extend import load_entry_points  # extend imports this module

    load_entry_points()


def known_sites() -> tuple[str, ...]:
    """Every site a spec may name: the registered ones, in forward order, then the connector parts."""
    _registered()
    return sites.site_names() + tuple(p for p in PART_SITES if p not in sites.SITES)


def capture_sites() -> tuple[str, ...]:
    """The sites a capture can read, whatever the model (a model may lack some: workbench.plan
    refuses those)."""
    _registered()
    return sites.capture_sites()


def editable_sites() -> tuple[str, ...]:
    """The sites an intervention can edit, whatever the model."""
    _registered()
    return sites.editable_sites() + tuple(p for p in PART_SITES if p not in sites.SITES)


# KNOWN_SITES, CAPTURE_SITES and EDITABLE_SITES, read from the registry when asked (PEP 562)
_DERIVED: dict[str, Callable[[], tuple[str, ...]]] = {
    "KNOWN_SITES": known_sites, "CAPTURE_SITES": capture_sites, "EDITABLE_SITES": editable_sites}


def __getattr__(name: str) -> Any:
    if name in _DERIVED:
        return _DERIVED[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

DatbenchConfig = Literal["chart", "counting", "document", "general", "grounding", "math", "scene", "spatial", "table"]
DATBENCH_CONFIGS: tuple[str, ...] = get_args(DatbenchConfig)
DATA_SOURCES = ("builtin", "datbench", "jsonl", "folder")
POSITION_GROUPS = ("vision", "text", "boundary", "all", "last")
IMAGE_MODES = ("real", "blank", "none")
NORMALIZE_TARGETS = ("text_embedding_mean",)
ADD_DIRECTIONS = ("random",)
RANDOM_NORMS = ("matched",)  # the norm of each token's own value at the site
# What a kv_swap copies from the donor's cache; a string sweep value names a set of them joined
# by '+' ("keys+values"), so `parts: $p` with `sweep: {p: [keys, values]}` sweeps them.
KV_PARTS = ("keys", "values")
KV_PART_SETS = ("keys", "values", "keys+values")
# the words a sweep may list: what a swept positions or kv_swap parts field takes
SWEEP_WORDS = POSITION_GROUPS + KV_PART_SETS

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR_REF_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


class Swept:
    """An `Annotated` marker: the field may hold a '$variable' of the condition's sweep, as its
    whole value or, for a list field, as items. `kind` says what the field holds ("number",
    "layers", ...: `workbench.extend.InterventionKind.swept`); `fit` turns a sweep value given as
    the whole field into what the field holds (a layer 3 into [3], "keys+values" into a list).
    Each expanded run's entry is validated again with its values in place, as if hand-written."""

    def __init__(self, kind: str, fit: Callable[[Any], Any] | None = None):
        self.kind = kind
        self.fit = fit or (lambda value: value)

    def place(self, value: Any, assignment: Mapping[str, Any]) -> Any:
        """`value` (as the spec holds it) with every '$variable' in `assignment` replaced."""
        if is_var(value):
            return self.fit(assignment[value[1:]]) if value[1:] in assignment else value
        if isinstance(value, list):
            return [assignment.get(v[1:], v) if is_var(v) else v for v in value]
        return value

    def refs(self, value: Any) -> list[tuple[SpecPath, str]]:
        """(sub-path in the field, variable name) of each '$variable' `value` holds."""
        if is_var(value):
            return [((), value[1:])]
        if isinstance(value, list):
            return [((i,), v[1:]) for i, v in enumerate(value) if is_var(v)]
        return []

    def __repr__(self) -> str:
        return f"Swept({self.kind!r})"


def is_var(value: Any) -> bool:
    """Whether `value` is a '$variable' reference."""
    return isinstance(value, str) and _VAR_REF_RE.fullmatch(value) is not None


# --------------------------------------------------------------------------- field validators
# Custom validators give one clear "got ...; expected ..." message per field instead of
# pydantic's per-union-member noise.  They report through a single custom error type whose
# context carries (sub-path, message) pairs, so model-level checks can point at exact fields.

_SPEC_ERROR = "workbench_spec"


def _fail(message: str, *subpath: Any) -> NoReturn:
    _fail_many([(tuple(subpath), message)])


def _fail_many(problems: list[tuple[SpecPath, str]]) -> NoReturn:
    summary = "; ".join(message for _, message in problems)
    raise PydanticCustomError(_SPEC_ERROR, "{summary}", {"summary": summary, "problems": problems})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_float(value: Any, expected: str) -> float:
    if not _is_number(value):
        _fail(f"{_got(value)}; expected {expected}")
    try:
        number = float(value)
    except OverflowError:
        _fail(f"{_got(value)}; expected a number that fits in a float")
    if not math.isfinite(number):
        _fail(f"{_got(value)}; expected a finite number")
    return number


def _number(value: Any) -> float:
    return _as_float(value, "a number")


_VAR_EXPECTED = "a number or a '$variable' from this condition's sweep"


def _number_or_var(value: Any) -> float | str:
    if is_var(value):
        return value
    return _as_float(value, _VAR_EXPECTED)


def _normalize_target(value: Any) -> float | str:
    if isinstance(value, str) and (value in NORMALIZE_TARGETS or is_var(value)):
        return value
    return _as_float(value, "a number, a '$variable', or 'text_embedding_mean'")


def _one_of(choices: Sequence[str]) -> PlainValidator:
    def check(value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        _fail(f"{_got(value)}{_did_you_mean(value, choices)}; expected one of {_quoted(choices)}")

    return PlainValidator(check)


def _name_of(kind: str) -> PlainValidator:
    def check(value: Any) -> str:
        if isinstance(value, str) and _NAME_RE.fullmatch(value):
            problem = reserved_name_problem(value)
            if problem:
                _fail(problem)
            return value
        _fail(f"{_got(value)}; expected a {kind} made of letters, digits, '_', '.' or '-'")

    return PlainValidator(check)


def _var_name(value: Any) -> str:
    if isinstance(value, str) and _VAR_NAME_RE.fullmatch(value):
        problem = reserved_name_problem(value)
        if problem:
            _fail(problem)
        return value
    _fail(f"{_got(value)}; expected a sweep variable name (a letter or '_', then letters, digits, '_')")


def _path_string(value: Any) -> str:
    if isinstance(value, str) and value.strip():
        return value
    _fail(f"{_got(value)}; expected a non-empty path")


def _index_list(value: list, noun: str) -> list[int]:
    """Validate a non-empty list of distinct non-negative ints, locating each bad item."""
    if not value:
        _fail(f"got an empty list; expected at least one {noun}")
    problems: list[tuple[SpecPath, str]] = []
    seen: set[int] = set()
    for i, item in enumerate(value):
        if not isinstance(item, int) or isinstance(item, bool) or item < 0:
            problems.append(((i,), f"{_got(item)}; expected a {noun} (an integer >= 0)"))
        elif item in seen:
            problems.append(((i,), f"duplicate {noun} {item}; expected each {noun} once"))
        else:
            seen.add(item)
    if problems:
        _fail_many(problems)
    return list(value)


# a position word beyond the groups: `last-k` (k tokens before the last), `i` or `i+j+...` (token
# positions as one group: a scan's cell, `workbench.spec.scans`)
_POSITION_WORD_RE = re.compile(r"last-[1-9][0-9]*|[0-9]+(\+[0-9]+)*")


def is_position_word(value: Any) -> bool:
    """A word naming positions: a group (`POSITION_GROUPS`), `last-k` or `i+j+...`."""
    return isinstance(value, str) and (value in POSITION_GROUPS or _POSITION_WORD_RE.fullmatch(value) is not None)


def _positions(value: Any) -> str | list[int]:
    if isinstance(value, list):
        return _index_list(value, "token position")
    if is_position_word(value):
        return value
    _fail(
        f"{_got(value)}{_did_you_mean(value, POSITION_GROUPS)}; expected one of "
        f"{_quoted(POSITION_GROUPS)}, 'last-k' (k tokens before the last), 'i+j' (several positions as one group) "
        "or a list of token positions (integers >= 0)"
    )


def _layers(value: Any) -> str | list[int]:
    if isinstance(value, list):
        return _index_list(value, "layer index")
    if value == "all" and isinstance(value, str):
        return value
    _fail(f"{_got(value)}; expected 'all' or a list of layer indices (integers >= 0)")


def _with_vars(check: Any, expected: str) -> Any:
    """A list-or-word validator that also takes a '$variable' as the whole value or as list items
    (each expanded run is validated again with the values in place: `Swept`)."""

    def validate(value: Any) -> Any:
        if is_var(value):
            return value
        if not isinstance(value, list) or not any(isinstance(v, str) for v in value):
            return check(value)
        problems = [((i,), f"{_got(v)}; expected {expected} or a '$variable'")
                    for i, v in enumerate(value) if isinstance(v, str) and not is_var(v)]
        if problems:
            _fail_many(problems)
        given = [v for v in value if not isinstance(v, str)]
        if given:
            check(given)
        return list(value)

    return validate


def _one_layer(value: Any) -> Any:
    return [value] if _is_number(value) else value  # `layers: $l`: one layer per run


def _one_position(value: Any) -> Any:
    return [value] if _is_number(value) else value  # `positions: $p`: a group, or one token position


def _kv_parts(value: Any) -> list[str] | str:
    """kv_swap parts: a non-empty list of 'keys'/'values', or a '$variable' sweeping part sets."""
    if is_var(value):
        return value
    expected = f"a list of {_quoted(KV_PARTS)} (e.g. [keys] or [keys, values]) or a '$variable'"
    if not isinstance(value, list) or not value:
        _fail(f"{_got(value)}; expected {expected}")
    problems = [((i,), f"{_got(v)}{_did_you_mean(v, KV_PARTS)}; expected one of {_quoted(KV_PARTS)}")
                for i, v in enumerate(value) if v not in KV_PARTS]
    problems += [((i,), f"duplicate part {v!r}; expected each part once") for i, v in enumerate(value)
                 if v in KV_PARTS and v in value[:i]]
    if problems:
        _fail_many(problems)
    return [p for p in KV_PARTS if p in value]  # canonical order: keys before values


def _model_ref(value: Any) -> str:
    # the same resolution as `workbench check` and `--models` (workbench/models/refs.py)
    problem = model_ref_problem(value)
    if problem is not None:
        _fail(problem)
    return value


def _unique_models(models: list[str]) -> list[str]:
    problems = [
        ((i,), f"duplicate model '{m}'; expected each model once")
        for i, m in enumerate(models)
        if m in models[:i]
    ]
    if problems:
        _fail_many(problems)
    return models


def _finite_number(value: Any) -> bool:
    try:
        return _is_number(value) and math.isfinite(float(value))
    except OverflowError:
        return False


def _sweep_values(value: Any) -> list[float] | list[int] | list[str]:
    """A sweep's values: numbers (an integer stays one: a layer or a token position), or words (a
    position group, a kv_swap part set)."""
    if not isinstance(value, list):
        _fail(f"{_got(value)}; expected a list of numbers (or of {_quoted(SWEEP_WORDS)})")
    if not value:
        _fail("got an empty list; expected at least 1 value")
    words = all(isinstance(v, str) for v in value)
    mixed = not words and any(isinstance(v, str) for v in value)  # one coordinate type per variable
    problems = [((i,), f"{_got(v)}{_did_you_mean(v, SWEEP_WORDS) if words else ''}; expected a number"
                 + (f" or one of {_quoted(SWEEP_WORDS)}" if words else "")
                 + (" (a sweep's values are all numbers or all words)" if mixed else ""))
                for i, v in enumerate(value)
                if (not (v in SWEEP_WORDS or is_position_word(v)) if words else not _finite_number(v))]
    if problems:
        _fail_many(problems)
    return list(value) if words else [v if isinstance(v, int) else float(v) for v in value]


def _distinct_values(values: list[float]) -> list[float]:
    seen: set[float] = set()  # a set, not a scan of the earlier values: a long sweep stays linear
    problems = []
    for i, v in enumerate(values):
        if v in seen:
            problems.append(((i,), f"duplicate sweep value {v!r}; expected distinct values"))
        seen.add(v)
    if problems:
        _fail_many(problems)
    return values


Number = Annotated[float, PlainValidator(_number)]
NumberOrVar = Annotated[Union[float, str], PlainValidator(_number_or_var), Swept("number")]
Positions = Annotated[Union[Literal["vision", "text", "boundary", "all", "last"], str, list[int]], PlainValidator(_positions)]
Layers = Annotated[Union[Literal["all"], list[int]], PlainValidator(_layers)]
# an edit's positions and layers: a '$variable' as the whole value or as list items
PositionsOrVar = Annotated[Union[Literal["vision", "text", "boundary", "all", "last"], list[Union[int, str]], str],
                           PlainValidator(_with_vars(_positions, "a token position (an integer >= 0)")),
                           Swept("positions", _one_position)]
LayersOrVar = Annotated[Union[Literal["all"], list[Union[int, str]], str],
                        PlainValidator(_with_vars(_layers, "a layer index (an integer >= 0)")),
                        Swept("layers", _one_layer)]
def _site(value: Any) -> str:
    """A site name, checked against the registry as it is now (a plugin's sites included)."""
    choices = known_sites()
    if isinstance(value, str) and value in choices:
        return value
    _fail(f"{_got(value)}{_did_you_mean(value, choices)}; expected one of {_quoted(choices)}")


Site = Annotated[str, PlainValidator(_site)]
SpecName = Annotated[str, _name_of("spec name")]
ConditionName = Annotated[str, _name_of("condition name")]
VarName = Annotated[str, PlainValidator(_var_name)]
PathString = Annotated[str, PlainValidator(_path_string)]
ModelRef = Annotated[str, PlainValidator(_model_ref)]
SweepValues = Annotated[list[Union[float, str]], PlainValidator(_sweep_values), AfterValidator(_distinct_values)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
