"""Error translation: each pydantic error becomes a located :class:`Problem` naming the field by
its dotted path in the user's data (union tags and key markers dropped), its line, what is wrong
and what was expected, with "did you mean" for a misspelt name and the allowed fields for an
unknown one."""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .fields import _SPEC_ERROR, _VAR_EXPECTED, TINY_MODEL_NAMES, known_sites
from .problems import Problem, SpecPath, _did_you_mean, _got, _quoted
from .schema import Spec
from .yaml_lines import _line_of

# What a missing field should have held, for the "expected ..." half of the message.
_FIELD_HINTS = {
    "name": "a spec name made of letters, digits, '_', '.' or '-'",
    "models": f"a non-empty list of models ({', '.join(TINY_MODEL_NAMES)}, 'org/name', or a directory)",
    "conditions": "a mapping of condition name -> condition, e.g. {baseline: {}}",
    "capture": "a non-empty list of capture sites, e.g. [{site: layer}]",
    "store": "a mapping like {path: stores/demo.zarr}",
    "path": "a path",
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


def nested_problems(exc: ValidationError, model: type[BaseModel]) -> list[tuple[SpecPath, str]]:
    """(sub-path, message) of each error of `exc`, raised validating one entry with `model` (an
    intervention kind's: see `workbench.spec.kinds`); the caller's field locates them."""
    problems: list[tuple[SpecPath, str]] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        problems += [(loc + tuple(subpath), message) for subpath, message in _messages(err, loc, model)]
    return list(dict.fromkeys(problems))


def _messages(err: ErrorDetails, loc: SpecPath, root: type[BaseModel] = Spec) -> list[tuple[SpecPath, str]]:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == _SPEC_ERROR:
        return list(ctx["problems"])
    if kind == "missing":
        name = loc[-1] if loc else "?"
        hint = f"one of {_quoted(known_sites())}" if name == "site" else _FIELD_HINTS.get(name, "a value")
        return [((), f"missing required field '{name}'; expected {hint}")]
    if kind == "extra_forbidden":
        allowed = _allowed_fields(loc[:-1], root)
        hint = _did_you_mean(loc[-1], allowed)
        return [((), f"unknown field '{loc[-1]}'{hint}; expected one of: {', '.join(allowed)}")]
    if kind == "too_short":
        return [((), f"{_got(value)}; expected at least {ctx.get('min_length', 1)} {_item_noun(loc)}")]
    if kind in ("greater_than_equal", "greater_than"):
        limit = ctx["ge"] if "ge" in ctx else ctx.get("gt")
        bound = f"{'>=' if 'ge' in ctx else '>'} {limit}"
        noun = "a number" if isinstance(limit, float) else "an integer"  # the field's type, from its bound
        return [((), f"{_got(value)}; expected {noun} {bound}")]
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
    """Map a pydantic loc onto the user's data: drop dict-key markers."""
    path: list[Any] = []
    current: Any = data
    for part in loc:
        if part == "[key]":
            break  # the error is about the key itself, already the last element of path
        if isinstance(current, dict):
            if part in current:
                current = current[part]
            else:
                current = _ABSENT
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        else:
            current = _ABSENT
        path.append(part)
    return tuple(path)


_ABSENT = object()


def _allowed_fields(loc: SpecPath, root: type[BaseModel] = Spec) -> list[str]:
    """Field names (aliases where set) of the model pydantic was validating at loc."""
    model = _model_at(loc, root)
    if model is None:
        return []
    return [info.alias or name for name, info in model.model_fields.items()]


def _model_at(loc: SpecPath, root: type[BaseModel] = Spec) -> type[BaseModel] | None:
    annotation: Any = root
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
