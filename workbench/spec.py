"""Experiment specs: YAML in, a validated :class:`Spec` out, every error located by line.

A spec is read with PyYAML's *safe* composer so that each value keeps the line it came
from, turned into plain Python data, and validated with pydantic.  Every pydantic error is
translated into a :class:`Problem` that names the field by its dotted path, the line it is
on and what was expected, so a researcher can fix a spec without reading a traceback::

    specs/demo.yaml:9: conditions.alpha.interventions[0].site: got 'projektor' (str) \
(did you mean 'projector'?); expected one of 'embed', 'vision', ...
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, NoReturn, Sequence, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .definitions import AVERAGE_LAYERS, DEFAULTS, RANK_BASES, TEXT_SETS
from .errors import BadInputError
from . import sites
from .models.architectures import ARCHITECTURES, tiny_architectures
from .sites import SITE_NAMES, part_sites
from .names import reserved_name_problem

__all__ = [
    "KNOWN_SITES",
    "TINY_MODEL_NAMES",
    "DATBENCH_CONFIGS",
    "Problem",
    "SpecError",
    "Spec",
    "DataSpec",
    "Condition",
    "ConditionInstance",
    "ScaleIntervention",
    "ZeroIntervention",
    "AddIntervention",
    "PatchIntervention",
    "NormalizeIntervention",
    "KVSwap",
    "CaptureSpec",
    "GenerateSpec",
    "StoreSpec",
    "BackendSpec",
    "AnalysisSpec",
    "load_spec",
    "parse_spec",
]

# --------------------------------------------------------------------------- constants

# Sites come from the registry (workbench/sites.py); a connector part `projector.<part>` is a site
# for the families that declare it (the plan refuses it on the others).
PART_SITES = part_sites(ARCHITECTURES)
KNOWN_SITES: tuple[str, ...] = SITE_NAMES + PART_SITES
# one tiny offline model per registered family (workbench/models/architectures/)
TINY_MODEL_NAMES = tuple(a.tiny for a in tiny_architectures())
DATBENCH_CONFIGS = (
    "chart",
    "counting",
    "document",
    "general",
    "grounding",
    "math",
    "scene",
    "spatial",
    "table",
)
DATA_SOURCES = ("builtin", "datbench", "jsonl", "folder")
POSITION_GROUPS = ("vision", "text", "boundary", "all")
IMAGE_MODES = ("real", "blank", "none")
# Sites a capture can read / an intervention can edit, whatever the model (a model may lack some:
# workbench.plan refuses those), from the registry.
CAPTURE_SITES = sites.CAPTURE_SITES
EDITABLE_SITES = sites.EDITABLE_SITES + PART_SITES
NORMALIZE_TARGETS = ("text_embedding_mean",)
ADD_DIRECTIONS = ("random",)
RANDOM_NORMS = ("matched",)  # the norm of each token's own value at the site
# What a kv_swap copies from the donor's cache; a string sweep value names a set of them joined
# by '+' ("keys+values"), so `parts: $p` with `sweep: {p: [keys, values]}` sweeps them.
KV_PARTS = ("keys", "values")
KV_PART_SETS = ("keys", "values", "keys+values")

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
_VAR_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR_REF_RE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
_HF_REPO_RE = re.compile(r"[\w.-]+/[\w.-]+")

# Guards against alias bombs ("billion laughs") and runaway documents.
_MAX_YAML_VALUES = 200_000

# Path into the spec data: mapping keys and list indices.
SpecPath = tuple[Any, ...]


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a spec, located by field path and (when known) line."""

    path: SpecPath
    line: int | None
    message: str  # "<what is wrong>; expected <what was expected>"

    @property
    def field(self) -> str:
        """The dotted field path, e.g. ``conditions.alpha.interventions[0].site``."""
        return _dotted(self.path)

    def format(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line is not None else source
        return f"{where}: {self.field}: {self.message}"


class SpecError(BadInputError, ValueError):
    """Raised for any invalid spec.

    ``str(err)`` lists every problem on its own line as
    ``<file>:<line>: <dotted.field.path>: <what is wrong>; expected <what was expected>``
    (one problem: just that line; several: a count header, then one indented line each).
    """

    def __init__(self, problems: Sequence[Problem], source: str = "<spec>"):
        self.problems: list[Problem] = list(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [p.format(self.source) for p in self.problems]
        if len(lines) == 1:
            return lines[0]
        return "\n".join([f"{len(lines)} problems in spec {self.source}:", *("  " + line for line in lines)])


def _dotted(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text or "(document)"


def _got(value: Any) -> str:
    """Describe an offending value briefly, with its YAML-ish type."""
    if value is None:
        return "got null"
    if isinstance(value, bool):
        return f"got {str(value).lower()} (boolean)"
    if isinstance(value, dict):
        return "got a mapping" if value else "got an empty mapping"
    if isinstance(value, list):
        return "got a list" if value else "got an empty list"
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"got {text} ({type(value).__name__})"


def _did_you_mean(value: Any, choices: Iterable[str]) -> str:
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _quoted(choices: Iterable[str]) -> str:
    return ", ".join(f"'{c}'" for c in choices)


# --------------------------------------------------------------------------- YAML with lines


class _SpecLoader(yaml.SafeLoader):
    """Safe composer only: we never let PyYAML construct tagged objects."""


# Scalars we accept; everything else (!!python/..., !custom, !!set, ...) is refused.
_SCALAR_TAGS = {
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:timestamp",  # kept as its text: a spec has no date fields
}
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _short_tag(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


class _YamlBuilder:
    """Builds plain data from a composed node tree, recording each path's line (1-based).

    Mapping entries are located at their key's line; list items at the item's line.
    """

    def __init__(self) -> None:
        self.lines: dict[SpecPath, int] = {}
        self.problems: list[Problem] = []
        self._scalars = yaml.constructor.SafeConstructor()
        self._active: set[int] = set()  # node ids on the current path, to stop alias cycles
        self._count = 0

    def build(self, node: yaml.Node, path: SpecPath) -> Any:
        self._count += 1
        if self._count > _MAX_YAML_VALUES:
            raise _TooLarge()
        if id(node) in self._active:
            self._problem(path, node, "recursive alias; expected a finite document")
            return None
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode) and node.tag == _MAP_TAG:
                return self._mapping(node, path)
            if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ_TAG:
                return [self._item(item, path + (i,)) for i, item in enumerate(node.value)]
            if isinstance(node, yaml.ScalarNode) and node.tag in _SCALAR_TAGS:
                return self._scalar(node, path)
            self._problem(
                path,
                node,
                f"unsupported YAML tag '{_short_tag(node.tag)}'; expected plain YAML values "
                "(mappings, lists, strings, numbers, booleans, null)",
            )
            return None
        finally:
            self._active.discard(id(node))

    def _item(self, node: yaml.Node, path: SpecPath) -> Any:
        self.lines.setdefault(path, _line(node))
        return self.build(node, path)

    def _mapping(self, node: yaml.MappingNode, path: SpecPath) -> dict:
        result: dict = {}
        explicit: dict[Any, int] = {}
        merged: list[yaml.Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merged.append(value_node)
                continue
            key = self._key(key_node, path)
            if key is _INVALID:
                continue
            if key in explicit:
                self._problem(
                    path + (key,),
                    key_node,
                    f"duplicate key '{key}' (first on line {explicit[key]}); expected each key once",
                )
                continue
            explicit[key] = _line(key_node)
            self.lines[path + (key,)] = _line(key_node)
            result[key] = self.build(value_node, path + (key,))
        # YAML merge keys ("<<: *defaults") fill in only keys the mapping did not set.
        for source in merged:
            for key_node, value_node in self._merge_pairs(source, path):
                key = self._key(key_node, path)
                if key is _INVALID or key in result:
                    continue
                self.lines[path + (key,)] = _line(key_node)
                result[key] = self.build(value_node, path + (key,))
        return result

    def _merge_pairs(self, node: yaml.Node, path: SpecPath) -> list[tuple[yaml.Node, yaml.Node]]:
        sources = node.value if isinstance(node, yaml.SequenceNode) else [node]
        pairs = []
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                self._problem(path, source, "bad merge key '<<'; expected a mapping or list of mappings")
                continue
            pairs.extend(source.value)
        return pairs

    def _key(self, node: yaml.Node, path: SpecPath) -> Any:
        if not (isinstance(node, yaml.ScalarNode) and node.tag in _SCALAR_TAGS):
            self._problem(path, node, "complex mapping key; expected a plain name")
            return _INVALID
        return self._scalar(node, path)

    def _scalar(self, node: yaml.ScalarNode, path: SpecPath) -> Any:
        if node.tag == "tag:yaml.org,2002:timestamp":
            return node.value
        try:
            return self._scalars.construct_object(node, deep=True)
        except (ValueError, yaml.YAMLError) as exc:
            self._problem(path, node, f"unreadable value {node.value!r} ({exc}); expected a plain value")
            return None

    def _problem(self, path: SpecPath, node: yaml.Node, message: str) -> None:
        self.problems.append(Problem(path, _line(node), message))


class _TooLarge(Exception):
    pass


_INVALID = object()


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _read_yaml(text: str) -> tuple[Any, dict[SpecPath, int], list[Problem]]:
    """Parse YAML safely; return (data, line of each path, structural problems)."""
    try:
        root = yaml.compose(text, Loader=_SpecLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        what = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        return None, {}, [Problem((), line, f"invalid YAML: {what}; expected valid YAML syntax")]
    except yaml.YAMLError as exc:
        return None, {}, [Problem((), None, f"invalid YAML: {exc}; expected valid YAML syntax")]
    if root is None:
        return None, {}, []
    builder = _YamlBuilder()
    builder.lines[()] = _line(root)
    try:
        data = builder.build(root, ())
    except _TooLarge:
        message = f"document expands to more than {_MAX_YAML_VALUES} values; expected a small spec"
        return None, {}, [Problem((), _line(root), message)]
    return data, builder.lines, builder.problems


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
    if isinstance(value, str) and _VAR_REF_RE.fullmatch(value):
        return value
    return _as_float(value, _VAR_EXPECTED)


def _normalize_target(value: Any) -> float | str:
    if isinstance(value, str) and (value in NORMALIZE_TARGETS or _VAR_REF_RE.fullmatch(value)):
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


def _positions(value: Any) -> str | list[int]:
    if isinstance(value, list):
        return _index_list(value, "token position")
    if isinstance(value, str) and value in POSITION_GROUPS:
        return value
    _fail(
        f"{_got(value)}{_did_you_mean(value, POSITION_GROUPS)}; expected one of "
        f"{_quoted(POSITION_GROUPS)} or a list of token positions (integers >= 0)"
    )


def _layers(value: Any) -> str | list[int]:
    if isinstance(value, list):
        return _index_list(value, "layer index")
    if value == "all" and isinstance(value, str):
        return value
    _fail(f"{_got(value)}; expected 'all' or a list of layer indices (integers >= 0)")


def _swap_layers(value: Any) -> str | list[int | str]:
    """kv_swap layers: like `layers`, and any item may be a '$variable' (one layer per value)."""
    if not isinstance(value, list) or not any(isinstance(v, str) for v in value):
        return _layers(value)
    problems = [((i,), f"{_got(v)}; expected a layer index (an integer >= 0) or a '$variable'")
                for i, v in enumerate(value) if isinstance(v, str) and not _VAR_REF_RE.fullmatch(v)]
    if problems:
        _fail_many(problems)
    indices = [v for v in value if not isinstance(v, str)]
    if indices:
        _index_list(indices, "layer index")
    return list(value)


def _kv_parts(value: Any) -> list[str] | str:
    """kv_swap parts: a non-empty list of 'keys'/'values', or a '$variable' sweeping part sets."""
    if isinstance(value, str) and _VAR_REF_RE.fullmatch(value):
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


_MODEL_EXPECTED = (
    f"one of {', '.join(TINY_MODEL_NAMES)}, a Hugging Face repo id 'org/name', "
    "or a local checkpoint directory"
)


def _model_ref(value: Any) -> str:
    if not isinstance(value, str):
        _fail(f"{_got(value)}; expected {_MODEL_EXPECTED}")
    if value in TINY_MODEL_NAMES or _HF_REPO_RE.fullmatch(value) or _is_local_dir(value):
        return value
    _fail(f"unknown model '{value}'; expected {_MODEL_EXPECTED}")


def _is_local_dir(value: str) -> bool:
    return os.path.isdir(os.path.expanduser(value))  # isdir swallows odd paths (NUL bytes)


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


def _sweep_values(value: Any) -> list[float] | list[str]:
    """A sweep's values: numbers, or names of kv_swap part sets ('keys', 'values', 'keys+values')."""
    if not isinstance(value, list):
        _fail(f"{_got(value)}; expected a list of numbers (or of {_quoted(KV_PART_SETS)} for kv_swap parts)")
    if not value:
        _fail("got an empty list; expected at least 1 value")
    words = all(isinstance(v, str) for v in value)
    problems = [((i,), f"{_got(v)}{_did_you_mean(v, KV_PART_SETS) if words else ''}; expected a number"
                 + (f" or one of {_quoted(KV_PART_SETS)}" if words else ""))
                for i, v in enumerate(value)
                if (v not in KV_PART_SETS if words else not _finite_number(v))]
    if problems:
        _fail_many(problems)
    return list(value) if words else [float(v) for v in value]


def _distinct_values(values: list[float]) -> list[float]:
    problems = [
        ((i,), f"duplicate sweep value {v!r}; expected distinct values")
        for i, v in enumerate(values)
        if v in values[:i]
    ]
    if problems:
        _fail_many(problems)
    return values


Number = Annotated[float, PlainValidator(_number)]
NumberOrVar = Annotated[Union[float, str], PlainValidator(_number_or_var)]
Positions = Annotated[Union[Literal["vision", "text", "boundary", "all"], list[int]], PlainValidator(_positions)]
Layers = Annotated[Union[Literal["all"], list[int]], PlainValidator(_layers)]
Site = Annotated[Literal[KNOWN_SITES], _one_of(KNOWN_SITES)]
SpecName = Annotated[str, _name_of("spec name")]
ConditionName = Annotated[str, _name_of("condition name")]
VarName = Annotated[str, PlainValidator(_var_name)]
PathString = Annotated[str, PlainValidator(_path_string)]
ModelRef = Annotated[str, PlainValidator(_model_ref)]
SweepValues = Annotated[list[Union[float, str]], PlainValidator(_sweep_values), AfterValidator(_distinct_values)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]


# --------------------------------------------------------------------------- models


class _Model(BaseModel):
    # strict: "3" is not an int and true is not a number; forbid: typos are errors.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class DataSpec(_Model):
    source: Annotated[Literal["builtin", "datbench", "jsonl", "folder"], _one_of(DATA_SOURCES)] = "builtin"
    n: PositiveInt = 8  # samples; for datbench, per config
    seed: NonNegativeInt = 0
    exclude: list[Annotated[Literal[DATBENCH_CONFIGS], _one_of(DATBENCH_CONFIGS)]] = []
    path: PathString | None = None
    # datbench: "shuffled" (a seeded choice of rows) or "first" (the first n rows, as the study)
    order: Annotated[Literal["shuffled", "first"], _one_of(("shuffled", "first"))] = "shuffled"

    @model_validator(mode="after")
    def _options_fit_source(self) -> "DataSpec":
        problems: list[tuple[SpecPath, str]] = []
        if self.source in ("jsonl", "folder") and self.path is None:
            what = "a .jsonl file" if self.source == "jsonl" else "an image folder"
            problems.append((("path",), f"missing required field 'path' for source '{self.source}'; expected {what}"))
        if self.source == "builtin" and self.path is not None:
            problems.append((("path",), "'path' is not used by source 'builtin'; expected no path"))
        if self.exclude and self.source != "datbench":
            problems.append(
                (("exclude",), f"'exclude' is not used by source '{self.source}'; expected it only with source 'datbench'")
            )
        if self.order != "shuffled" and self.source != "datbench":
            problems.append((("order",), f"'order' is not used by source '{self.source}'; expected it only with source 'datbench'"))
        if set(DATBENCH_CONFIGS) <= set(self.exclude):
            problems.append((("exclude",), "every datbench config is excluded; expected at least one to remain"))
        if problems:
            _fail_many(problems)
        return self


class _Intervention(_Model):
    kind: str  # narrowed to a Literal by each kind; declared here so it is listed first


class _SiteIntervention(_Intervention):
    site: Site
    positions: Positions = "all"
    layers: Layers = "all"  # only meaningful for per-layer sites


class ScaleIntervention(_SiteIntervention):
    kind: Literal["scale"]
    factor: NumberOrVar


class ZeroIntervention(_SiteIntervention):
    kind: Literal["zero"]


def _seed_or_var(value: Any) -> int | str:
    if isinstance(value, str) and _VAR_REF_RE.fullmatch(value):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    _fail(f"{_got(value)}; expected a seed (an integer >= 0) or a '$variable'")


def _random_norm(value: Any) -> float | str:
    if isinstance(value, str) and (value in RANDOM_NORMS or _VAR_REF_RE.fullmatch(value)):
        return value
    number = _as_float(value, f"a number > 0, {_quoted(RANDOM_NORMS)} or a '$variable'")
    if number <= 0:
        _fail(f"{_got(value)}; expected a number > 0, {_quoted(RANDOM_NORMS)} or a '$variable'")
    return number


class AddIntervention(_SiteIntervention):
    kind: Literal["add"]
    vector: list[Number] | None = None
    direction_from: ConditionName | None = None
    # the control for both: a seeded random unit direction u, scaled to `norm` per token
    direction: Annotated[Literal["random"], _one_of(ADD_DIRECTIONS)] | None = None
    seed: Annotated[Union[int, str], PlainValidator(_seed_or_var)] = 0
    norm: Annotated[Union[float, str], PlainValidator(_random_norm)] = "matched"
    factor: NumberOrVar = 1.0

    @model_validator(mode="after")
    def _one_direction(self) -> "AddIntervention":
        given = [name for name in ("vector", "direction_from", "direction") if getattr(self, name) is not None]
        if len(given) != 1:
            what = "none" if not given else " and ".join(repr(g) for g in given)
            _fail(f"{what} of 'vector', 'direction_from', 'direction' given; expected exactly one of them "
                  "(a vector, a condition's mean difference, or direction: random)")
        if self.vector is not None and not self.vector:
            _fail("got an empty list; expected a non-empty vector", "vector")
        if self.direction is None:  # (a dumped spec carries the defaults: only other values are refused)
            for name in ("seed", "norm"):
                if getattr(self, name) != type(self).model_fields[name].default:
                    _fail(f"'{name}' is only used with 'direction: random'; expected no '{name}' here", name)
        return self


class PatchIntervention(_SiteIntervention):
    kind: Literal["patch"]
    from_: ConditionName = Field(alias="from")


class NormalizeIntervention(_Intervention):
    kind: Literal["normalize"]
    site: Site = "projector"
    target: Annotated[Union[float, str], PlainValidator(_normalize_target)] = "text_embedding_mean"


# The spec half of the intervention registry: kind -> spec model. `workbench.interventions.RUNTIME`
# maps the same kinds to the classes that run them (a test keeps the two equal); the list of
# kinds, the union pydantic validates against and the error messages all derive from this.
INTERVENTION_SPECS: dict[str, type[_Intervention]] = {
    "scale": ScaleIntervention,
    "zero": ZeroIntervention,
    "add": AddIntervention,
    "patch": PatchIntervention,
    "normalize": NormalizeIntervention,
}
INTERVENTION_KINDS = tuple(INTERVENTION_SPECS)

Intervention = Annotated[Union[tuple(INTERVENTION_SPECS.values())], Field(discriminator="kind")]

# Fields that may hold a "$var" reference, per intervention kind.
_NUMERIC_FIELDS = {"scale": ("factor",), "add": ("factor", "seed", "norm"), "normalize": ("target",)}
# Numeric fields whose sweep values must be more than numbers (what _SWEEP_KINDS calls them).
_SWEPT_FIELD_KINDS = {("add", "seed"): "seed", ("add", "norm"): "positive"}


class KVSwap(_Model):
    donor: ConditionName
    positions: Positions = "vision"
    layers: Annotated[Union[Literal["all"], list[Union[int, str]]], PlainValidator(_swap_layers)] = "all"
    # which caches are copied from the donor: keys (where the decode step looks), values (what
    # it reads), or both (the study's Experiment 3)
    parts: Annotated[Union[list[str], str], PlainValidator(_kv_parts)] = ["keys", "values"]


class Condition(_Model):
    sweep: dict[VarName, SweepValues] = {}
    image: Annotated[Literal["real", "blank", "none"], _one_of(IMAGE_MODES)] = "real"
    interventions: list[Intervention] = []
    kv_swap: KVSwap | None = None

    @model_validator(mode="before")
    @classmethod
    def _empty_is_default(cls, data: Any) -> Any:
        return {} if data is None else data  # "baseline:" with nothing after it

    @model_validator(mode="after")
    def _vars_are_swept(self) -> "Condition":
        problems = []
        for path, ref, wants in _var_refs(self):
            if ref[1:] not in self.sweep:
                problems.append((path, _undefined_var_message(ref, self.sweep)))
            elif not all(_SWEEP_KINDS[wants][0](v) for v in self.sweep[ref[1:]]):
                problems.append((("sweep", ref[1:]), f"'{ref}' is used as {_SWEEP_KINDS[wants][1]} at "
                                 f"{_dotted(path)}; expected every value of '{ref[1:]}' to be {_SWEEP_KINDS[wants][1]}"))
        if problems:
            _fail_many(problems)
        return self


# What a '$variable' must hold where it is used: (test of one value, what it is called).
_SWEEP_KINDS = {
    "number": (_is_number, "a number"),
    "layer": (lambda v: _is_number(v) and float(v).is_integer() and v >= 0, "a layer index (an integer >= 0)"),
    "seed": (lambda v: _is_number(v) and float(v).is_integer() and v >= 0, "a seed (an integer >= 0)"),
    "positive": (lambda v: _is_number(v) and v > 0, "a number > 0"),
    "parts": (lambda v: v in KV_PART_SETS, f"a kv_swap part set ({_quoted(KV_PART_SETS)})"),
}


def _is_var(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("$")


def _var_refs(condition: Any) -> Iterable[tuple[SpecPath, str, str]]:
    """(path in the condition, '$variable', what it must hold) of every sweep reference."""
    for i, intervention in enumerate(condition.interventions):
        for name in _NUMERIC_FIELDS.get(intervention.kind, ()):
            if _is_var(value := getattr(intervention, name)):
                yield ("interventions", i, name), value, _SWEPT_FIELD_KINDS.get((intervention.kind, name), "number")
    swap = condition.kv_swap
    if swap is not None:
        if _is_var(swap.parts):
            yield ("kv_swap", "parts"), swap.parts, "parts"
        for j, layer in enumerate(swap.layers if isinstance(swap.layers, list) else ()):
            if _is_var(layer):
                yield ("kv_swap", "layers", j), layer, "layer"


def _undefined_var_message(ref: str, sweep: dict[str, Any]) -> str:
    if not sweep:
        return f"'{ref}' is not defined; expected a number, or add 'sweep: {{{ref[1:]}: [...]}}' to this condition"
    defined = ["$" + v for v in sweep]
    hint = _did_you_mean(ref, defined)
    return f"'{ref}' is not defined{hint}; expected one of this condition's sweep variables: {', '.join(defined)}"


class CaptureSpec(_Model):
    site: Site
    layers: Layers = "all"
    positions: Positions = "all"


def _rank_base(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value in RANK_BASES:
        return value
    _fail(f"{_got(value)}; expected one of {', '.join(map(str, RANK_BASES))}")


class AnalysisSpec(_Model):
    """Definitions the study leaves open (workbench.definitions): stored with the run, read by
    `workbench analyze`, printed under every table."""

    text_set: Annotated[Literal[TEXT_SETS], _one_of(TEXT_SETS)] = DEFAULTS["text_set"]
    average_layers: Annotated[Literal[AVERAGE_LAYERS], _one_of(AVERAGE_LAYERS)] = DEFAULTS["average_layers"]
    rank_base: Annotated[int, PlainValidator(_rank_base)] = DEFAULTS["rank_base"]


class GenerateSpec(_Model):
    max_new_tokens: PositiveInt = 1


class StoreSpec(_Model):
    path: PathString


class BackendSpec(_Model):
    kind: Annotated[Literal["local", "remote"], _one_of(("local", "remote"))] = "local"
    device: Annotated[Literal["auto", "cpu", "cuda"], _one_of(("auto", "cpu", "cuda"))] = "auto"
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"], _one_of(("auto", "float32", "bfloat16", "float16"))
    ] = "auto"
    # results wait for the background store writer in a queue of at most this many MB (the next
    # forward runs meanwhile); 0 writes each result before the next forward
    write_queue_mb: NonNegativeInt = 1024
    # conditions of one sample with the same token sequence (an alpha sweep, real vs blank image)
    # run as the rows of one forward, at most this many; kv_swap conditions run alone
    batch_size: PositiveInt = 1
    # a model larger than one GPU: spread over every visible device by accelerate (captures are
    # gathered to the host as always)
    device_map: Annotated[Literal["auto", "balanced", "sequential"], _one_of(("auto", "balanced", "sequential"))] | None = None


@dataclass(frozen=True)
class ConditionInstance:
    """One concrete run of a condition: sweep values chosen and "$var"s substituted."""

    name: str  # "baseline", or "alpha=0.1" / "x=1.0,y=2.0" for swept conditions
    base: str  # the condition's key in the spec
    sweep: dict[str, float | str] = field(default_factory=dict)  # a word for a kv_swap parts sweep
    image: str = "real"
    interventions: tuple[Any, ...] = ()
    kv_swap: KVSwap | None = None


def _format_value(value: float | str) -> str:
    if isinstance(value, str):
        return value  # a kv_swap part set: parts=keys
    return repr(float(value))  # shortest round-tripping form: 0.1, 1.0, 3.0, 0.01


def _instance_name(assignment: dict[str, float]) -> str:
    return ",".join(f"{var}={_format_value(value)}" for var, value in assignment.items())


def _substitute(intervention: Any, assignment: dict[str, float]) -> Any:
    updates = {
        name: assignment[value[1:]]
        for name in _NUMERIC_FIELDS.get(intervention.kind, ())
        if isinstance(value := getattr(intervention, name), str) and value.startswith("$")
    }
    return intervention.model_copy(update=updates) if updates else intervention


def _substitute_swap(swap: KVSwap | None, assignment: dict[str, Any]) -> KVSwap | None:
    """The kv_swap with its '$variable's replaced: a layer per value, a part set split at '+'."""
    if swap is None or not assignment:
        return swap
    updates: dict[str, Any] = {}
    if _is_var(swap.parts):
        updates["parts"] = assignment[swap.parts[1:]].split("+")
    if isinstance(swap.layers, list) and any(_is_var(l) for l in swap.layers):
        layers = [int(assignment[l[1:]]) if _is_var(l) else l for l in swap.layers]
        updates["layers"] = sorted(set(layers))
    return swap.model_copy(update=updates) if updates else swap


def _expand(base: str, condition: Condition) -> list[ConditionInstance]:
    if not condition.sweep:
        assignments = [{}]
    else:
        variables = list(condition.sweep)
        assignments = [dict(zip(variables, values)) for values in itertools.product(*condition.sweep.values())]
    return [
        ConditionInstance(
            name=_instance_name(assignment) if assignment else base,
            base=base,
            sweep=assignment,
            image=condition.image,
            interventions=tuple(_substitute(iv, assignment) for iv in condition.interventions),
            kv_swap=_substitute_swap(condition.kv_swap, assignment),
        )
        for assignment in assignments
    ]


class Spec(_Model):
    name: SpecName
    description: str | None = None
    models: Annotated[list[ModelRef], Field(min_length=1), AfterValidator(_unique_models)]
    data: DataSpec = Field(default_factory=DataSpec)
    conditions: Annotated[dict[ConditionName, Condition], Field(min_length=1)]
    capture: Annotated[list[CaptureSpec], Field(min_length=1)]
    generate: GenerateSpec | None = None  # None: prefill only
    store: StoreSpec
    backend: BackendSpec = Field(default_factory=BackendSpec)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)

    # Provenance, outside the validated fields.
    _source: str = PrivateAttr("<spec>")
    _source_text: str | None = PrivateAttr(None)
    _spec_hash: str | None = PrivateAttr(None)
    _overrides: dict[str, Any] = PrivateAttr(default_factory=dict)
    _lines: dict[SpecPath, int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _cross_references(self) -> "Spec":
        problems = _reference_problems(self.conditions) + _name_clash_problems(self.conditions)
        problems += _site_role_problems(self) + (_source_cycle_problems(self.conditions) if not problems else [])
        if problems:
            _fail_many(problems)
        return self

    # -- provenance

    @property
    def source(self) -> str:
        """Where the spec came from (file path or ``<spec>``)."""
        return self._source

    @property
    def source_text(self) -> str | None:
        """The raw YAML text, or None for a spec built from Python data."""
        return self._source_text

    @property
    def spec_hash(self) -> str:
        """sha256 hex of the raw YAML text (of canonical JSON when there is no text)."""
        if self._spec_hash is not None:
            return self._spec_hash
        canonical = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def overrides(self) -> dict[str, Any]:
        """Command-line overrides applied on top of the source text (empty if none)."""
        return dict(self._overrides)

    # -- derived views

    def problem(self, path: SpecPath, message: str) -> Problem:
        """A located problem at `path` of this spec (used by later stages, e.g. the plan)."""
        return Problem(tuple(path), _line_of(tuple(path), self._lines), message)

    def expand_conditions(self) -> list[ConditionInstance]:
        """Every concrete condition, sweeps expanded (cartesian product, first variable slowest)."""
        return [instance for base, cond in self.conditions.items() for instance in _expand(base, cond)]

    def sweep_variables(self) -> list[str]:
        """All sweep variable names, in order of first appearance."""
        return list(dict.fromkeys(var for cond in self.conditions.values() for var in cond.sweep))

    def with_overrides(
        self,
        models: str | Sequence[str] | None = None,
        data_source: str | None = None,
        limit: int | None = None,
        store_path: str | None = None,
        device: str | None = None,
        dtype: str | None = None,
    ) -> "Spec":
        """A copy with CLI overrides applied and re-validated; errors name the CLI option.

        ``models`` may be a comma-separated string (``--models a,b``).  ``limit`` caps
        ``data.n`` (samples are prefix-stable, so a limited run is a prefix of the full one).
        """
        data = self.model_dump(by_alias=True, exclude_none=True)
        applied: dict[str, Any] = {}
        problems: list[Problem] = []
        if models is not None:
            data["models"] = _split_models(models)
            applied["models"] = data["models"]
        if data_source is not None:
            _switch_source(data["data"], data_source)
            applied["data_source"] = data_source
        if limit is not None:
            if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
                data["data"]["n"] = min(data["data"]["n"], limit)
                applied["limit"] = limit
            else:
                problems.append(Problem(("--limit",), None, f"{_got(limit)}; expected an integer >= 1"))
        for value, section, key, name in (
            (store_path, "store", "path", "store_path"),
            (device, "backend", "device", "device"),
            (dtype, "backend", "dtype", "dtype"),
        ):
            if value is not None:
                data.setdefault(section, {})[key] = value
                applied[name] = value
        if problems:
            raise SpecError(problems, "command line")
        try:
            spec = Spec.model_validate(data)
        except ValidationError as exc:
            found = [_as_cli_problem(p) for p in _translate(exc, data, {})]
            raise SpecError(found, "command line") from None
        spec._carry_provenance(self, {**self._overrides, **applied})
        return spec

    def _carry_provenance(self, other: "Spec", overrides: dict[str, Any]) -> None:
        self._source, self._source_text, self._spec_hash = other._source, other._source_text, other._spec_hash
        self._lines = other._lines
        self._overrides = overrides


def _split_models(models: str | Sequence[str]) -> Any:
    if isinstance(models, str):
        return [m.strip() for m in models.split(",") if m.strip()]
    return list(models)


def _switch_source(data: dict, source: str) -> None:
    """Switch data source, dropping options the new source does not take."""
    if data.get("source") != source:
        if source == "builtin":
            data.pop("path", None)
        if source != "datbench":
            data.pop("exclude", None)
            data.pop("order", None)
    data["source"] = source


# Which CLI option is responsible for which part of the spec.
_CLI_OPTIONS: tuple[tuple[SpecPath, str], ...] = (
    (("models",), "--models"),
    (("data", "n"), "--limit"),
    (("data",), "--data"),
    (("store",), "--store"),
    (("backend", "device"), "--device"),
    (("backend", "dtype"), "--dtype"),
)


def _as_cli_problem(problem: Problem) -> Problem:
    for prefix, option in _CLI_OPTIONS:
        if problem.path[: len(prefix)] == prefix:
            rest = problem.path[len(prefix) :] if option == "--models" else ()  # keep the list index
            return Problem((option, *rest), None, problem.message)
    return problem


def _reference_problems(conditions: dict[str, Condition]) -> list[tuple[SpecPath, str]]:
    """Condition references (patch 'from', add 'direction_from', kv_swap 'donor') must name
    an existing condition without a sweep; 'from'/'direction_from' may not name their own."""
    problems = []
    for name, cond in conditions.items():
        refs: list[tuple[SpecPath, str, bool]] = []  # (sub-path, target, may be self)
        for i, iv in enumerate(cond.interventions):
            if iv.kind == "patch":
                refs.append((("interventions", i, "from"), iv.from_, False))
            elif iv.kind == "add" and iv.direction_from is not None:
                refs.append((("interventions", i, "direction_from"), iv.direction_from, False))
        if cond.kv_swap is not None:
            refs.append((("kv_swap", "donor"), cond.kv_swap.donor, True))
        for subpath, target, self_ok in refs:
            message = _reference_message(target, name, self_ok, conditions)
            if message:
                problems.append((("conditions", name) + subpath, message))
    return problems


def _reference_message(target: str, owner: str, self_ok: bool, conditions: dict[str, Condition]) -> str | None:
    candidates = [c for c, cond in conditions.items() if not cond.sweep and (self_ok or c != owner)]
    expected = f"one of {', '.join(candidates)}" if candidates else "the name of another condition without a sweep"
    if target == owner and not self_ok:
        return f"condition '{owner}' refers to itself; expected {expected}"
    if target not in conditions:
        return f"unknown condition '{target}'{_did_you_mean(target, conditions)}; expected {expected}"
    if conditions[target].sweep:
        return f"condition '{target}' has a sweep, so it names several runs; expected {expected}"
    return None


def _site_role_problems(spec: "Spec") -> list[tuple[SpecPath, str]]:
    """Sites that exist but cannot play the role asked (e.g. `capture: {site: vision}`): refused
    here, so `validate` refuses what `run` would, without loading any model."""
    problems = []
    for i, item in enumerate(spec.capture):
        if item.site not in CAPTURE_SITES:
            problems.append((("capture", i, "site"), f"site {item.site!r} cannot be captured; expected one of "
                             f"{', '.join(CAPTURE_SITES)} (the projector output is 'hidden' at layer 0 on vision rows)"))
    for name, cond in spec.conditions.items():
        for j, iv in enumerate(cond.interventions):
            if iv.site not in EDITABLE_SITES:
                problems.append((("conditions", name, "interventions", j, "site"),
                                 f"site {iv.site!r} cannot be edited by '{iv.kind}'; expected one of {', '.join(EDITABLE_SITES)}"))
    return problems


def _condition_sources(cond: Condition) -> list[tuple[SpecPath, str]]:
    """(sub-path, condition) of every source a condition's interventions read (patch, add)."""
    found = []
    for i, iv in enumerate(cond.interventions):
        if iv.kind == "patch":
            found.append((("interventions", i, "from"), iv.from_))
        elif iv.kind == "add" and iv.direction_from is not None:
            found.append((("interventions", i, "direction_from"), iv.direction_from))
    return found


def _source_cycle_problems(conditions: dict[str, Condition]) -> list[tuple[SpecPath, str]]:
    """Source conditions run before the condition that reads them, so their graph must be acyclic
    (a topological order exists); a chain of any depth is fine."""
    import graphlib

    graph = {name: {target for _, target in _condition_sources(cond)} for name, cond in conditions.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        cycle = list(reversed(exc.args[1]))  # graphlib lists each before its reader; reversed, each reads the next
        owner, target = cycle[0], cycle[1]
        subpath = next(p for p, t in _condition_sources(conditions[owner]) if t == target)
        return [(("conditions", owner) + subpath,
                 f"source cycle {' -> '.join(cycle)} (each condition reads the next, so none can run first); "
                 "expected sources that do not lead back to this condition")]
    return []


def _name_clash_problems(conditions: dict[str, Condition]) -> list[tuple[SpecPath, str]]:
    problems = []
    owner_of: dict[str, str] = {}
    for base, cond in conditions.items():
        for instance in _expand(base, cond):
            if instance.name in owner_of:
                problems.append(
                    (
                        ("conditions", base, "sweep"),
                        f"expands to '{instance.name}', which condition '{owner_of[instance.name]}' "
                        "also produces; expected unique run names (rename the sweep variable)",
                    )
                )
                break
            owner_of[instance.name] = base
    return problems


# --------------------------------------------------------------------------- error translation

# What a missing field should have held, for the "expected ..." half of the message.
_FIELD_HINTS = {
    "name": "a spec name made of letters, digits, '_', '.' or '-'",
    "models": f"a non-empty list of models ({', '.join(TINY_MODEL_NAMES)}, 'org/name', or a directory)",
    "conditions": "a mapping of condition name -> condition, e.g. {baseline: {}}",
    "capture": "a non-empty list of capture sites, e.g. [{site: layer}]",
    "store": "a mapping like {path: stores/demo.zarr}",
    "path": "a path",
    "site": f"one of {_quoted(KNOWN_SITES)}",
    "factor": _VAR_EXPECTED,
    "from": "the name of another condition",
    "donor": "the name of a condition",
}


def _translate(exc: ValidationError, data: Any, lines: dict[SpecPath, int]) -> list[Problem]:
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        for subpath, message in _messages(err, loc):
            path = _data_path(loc + tuple(subpath), data)
            problem = Problem(path, _line_of(path, lines), message)
            if problem not in problems:
                problems.append(problem)
    return sorted(problems, key=lambda p: (p.line or 0, p.field))


def _messages(err: dict, loc: SpecPath) -> list[tuple[SpecPath, str]]:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == _SPEC_ERROR:
        return list(ctx["problems"])
    if kind == "missing":
        name = loc[-1] if loc else "?"
        return [((), f"missing required field '{name}'; expected {_FIELD_HINTS.get(name, 'a value')}")]
    if kind == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1])
        hint = _did_you_mean(loc[-1], allowed)
        return [((), f"unknown field '{loc[-1]}'{hint}; expected one of: {', '.join(allowed)}")]
    if kind == "union_tag_invalid":
        tag = value.get("kind") if isinstance(value, dict) else ctx.get("tag")
        hint = _did_you_mean(tag, INTERVENTION_KINDS)
        return [(("kind",), f"{_got(tag)}{hint}; expected one of {_quoted(INTERVENTION_KINDS)}")]
    if kind == "union_tag_not_found":
        return [(("kind",), f"missing required field 'kind'; expected one of {_quoted(INTERVENTION_KINDS)}")]
    if kind == "too_short":
        return [((), f"{_got(value)}; expected at least {ctx.get('min_length', 1)} {_item_noun(loc)}")]
    if kind in ("greater_than_equal", "greater_than"):
        bound = f">= {ctx['ge']}" if "ge" in ctx else f"> {ctx.get('gt')}"
        return [((), f"{_got(value)}; expected an integer {bound}")]
    return [((), f"{_got(value)}; expected {_expected_for(kind, err['msg'])}")]


def _item_noun(loc: SpecPath) -> str:
    if loc[-2:-1] == ("sweep",):
        return "value"
    nouns = {"conditions": "condition", "models": "model", "capture": "capture site"}
    return nouns.get(loc[-1], "item") if loc else "item"


_EXPECTED_BY_TYPE = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _expected_for(kind: str, pydantic_message: str) -> str:
    if kind in _EXPECTED_BY_TYPE:
        return _EXPECTED_BY_TYPE[kind]
    # pydantic phrases most errors as "Input should be <what was expected>".
    prefix = "Input should be "
    return pydantic_message[len(prefix) :] if pydantic_message.startswith(prefix) else pydantic_message


def _data_path(loc: SpecPath, data: Any) -> SpecPath:
    """Map a pydantic loc onto the user's data: drop union tags and dict-key markers."""
    path: list[Any] = []
    current: Any = data
    for part in loc:
        if part == "[key]":
            break  # the error is about the key itself, already the last element of path
        if isinstance(current, dict):
            if part in current:
                current = current[part]
            elif current.get("kind") == part:
                continue  # discriminated-union tag pydantic inserts, e.g. (..., 0, 'scale', 'site')
            else:
                current = _ABSENT
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        else:
            current = _ABSENT
        path.append(part)
    return tuple(path)


_ABSENT = object()


def _line_of(path: SpecPath, lines: dict[SpecPath, int]) -> int | None:
    """Line of the deepest node along path that exists (a missing key: its parent's)."""
    for end in range(len(path), -1, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None


def _allowed_fields(loc: SpecPath) -> list[str]:
    """Field names (aliases where set) of the model pydantic was validating at loc."""
    model = _model_at(loc)
    if model is None:
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_at(loc: SpecPath) -> type[BaseModel] | None:
    annotation: Any = Spec
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            fields = {info.alias or name: info for name, info in annotation.model_fields.items()}
            if part not in fields:
                return None
            annotation = fields[part].annotation
        elif getattr(annotation, "__origin__", None) is list:
            annotation = annotation.__args__[0]
        elif getattr(annotation, "__origin__", None) is dict:
            annotation = annotation.__args__[1]
        elif getattr(annotation, "__origin__", None) is Union:
            annotation = next((m for m in annotation.__args__ if _kind_of(m) == part), None)
        else:
            return None
    annotation = _unwrap(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Annotated[...] and Optional[...] wrappers."""
    while True:
        if hasattr(annotation, "__metadata__"):
            annotation = annotation.__origin__
            continue
        args = getattr(annotation, "__args__", ())
        if getattr(annotation, "__origin__", None) is Union and type(None) in args:
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                annotation = rest[0]
                continue
        if type(annotation).__name__ == "UnionType" and type(None) in args:  # X | None
            rest = [a for a in args if a is not type(None)]
            if len(rest) == 1:
                annotation = rest[0]
                continue
        return annotation


def _kind_of(model: Any) -> Any:
    info = getattr(model, "model_fields", {}).get("kind")
    return info.annotation.__args__[0] if info is not None else None


# --------------------------------------------------------------------------- public entry points


def parse_spec(text: str, source: str = "<spec>") -> Spec:
    """Validate spec YAML text; raise :class:`SpecError` listing every located problem."""
    data, lines, problems = _read_yaml(text)
    if problems:
        raise SpecError(problems, source)
    if not isinstance(data, dict):
        expected = f"a mapping with fields {', '.join(_allowed_fields(()))}"
        what = "an empty document" if data is None else _got(data)[len("got ") :]
        raise SpecError([Problem((), lines.get(()), f"got {what}; expected {expected}")], source)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_translate(exc, data, lines), source) from None
    spec._source, spec._source_text, spec._lines = source, text, lines
    spec._spec_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return spec


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file (YAML, safe-loaded)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Problem((), None, f"cannot read the file ({exc}); expected a readable UTF-8 YAML file")], source) from exc
    return parse_spec(text, source=source)
