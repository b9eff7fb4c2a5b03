"""The entry points: :func:`parse_spec` (YAML text to a validated :class:`Spec`, or a
:class:`SpecError` listing every located problem) and :func:`load_spec` (the same, from a file)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping

import yaml

from pydantic import ValidationError

from .problems import Problem, SpecError, _got, undecodable_at
from .schema import Spec
from .sizes import text_size_problems
from .translate import _allowed_fields, _translate
from .yaml_lines import _read_yaml


def parse_spec(text: str, source: str = "<spec>", limits: Mapping[str, int | None] | None = None) -> Spec:
    """Validate spec YAML text; raise :class:`SpecError` listing every located problem.

    ``limits`` ({"conditions": N, "samples": M}, None for the spec's own) overrides the spec's
    ``limits`` section (the command line's ``--max-conditions`` / ``--max-samples``)."""
    cli_limits = {k: v for k, v in (limits or {}).items() if v is not None}
    too_large = text_size_problems(text, cli_limits)  # counted from the text, before anything is built
    if too_large:
        raise SpecError(too_large, source)
    data, lines, problems = _read_yaml(text)
    if problems:
        raise SpecError(problems, source)
    if not isinstance(data, dict):
        expected = f"a mapping with fields {', '.join(_allowed_fields(()))}"
        what = "an empty document" if data is None else _got(data)[len("got ") :]
        raise SpecError([Problem((), lines.get(()), f"got {what}; expected {expected}")], source)
    if cli_limits:
        declared = data.get("limits")
        data["limits"] = {**(declared if isinstance(declared, dict) else {}), **cli_limits}
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_translate(exc, data, lines), source) from None
    spec._source, spec._source_text, spec._lines = source, text, lines
    if cli_limits:
        spec._overrides = {"limits": cli_limits}
    spec._spec_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return spec


def load_spec(path: str | Path, limits: Mapping[str, int | None] | None = None) -> Spec:
    """Read and validate a spec file (YAML, safe-loaded); ``limits`` as for :func:`parse_spec`."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError([Problem((), None, f"cannot read the file ({exc}); expected a readable UTF-8 YAML file")], source) from exc
    try:
        text = raw.decode("utf-8-sig")  # a leading BOM is dropped, as editors on Windows write one
    except UnicodeDecodeError as exc:
        line, _, what = undecodable_at(raw, exc)
        raise SpecError([Problem((), line, f"cannot be decoded as UTF-8 ({what}); expected a UTF-8 YAML file")],
                        source) from None
    return parse_spec(text, source=source, limits=limits)


def spec_from_data(data: Mapping[str, Any], source: str = "<dict>",
                   limits: Mapping[str, int | None] | None = None) -> Spec:
    """Validate a spec given as Python data (what a YAML spec reads as: dicts, lists, numbers,
    strings); raise :class:`SpecError` with every problem located by its field path, as
    :func:`parse_spec` does for YAML (there is no line to give). The data is recorded as YAML
    text, so the store's provenance holds it as it holds a spec file."""
    if not isinstance(data, Mapping):
        expected = f"a mapping with fields {', '.join(_allowed_fields(()))}"
        raise SpecError([Problem((), None, f"{_got(data)}; expected {expected}")], source)
    plain = _plain(data)  # a copy (validation may add `limits`; the caller's dict stays as given)
    try:
        text = yaml.safe_dump(plain, sort_keys=False)
    except yaml.YAMLError as exc:  # an object YAML cannot write (a function, a set) cannot be a spec value either
        raise SpecError([Problem((), None, f"holds a value that is not plain data ({exc}); expected dicts, lists, "
                                          "numbers and strings, as a YAML spec holds")], source) from None
    cli_limits = {k: v for k, v in (limits or {}).items() if v is not None}
    if cli_limits:
        declared = plain.get("limits")
        plain["limits"] = {**(declared if isinstance(declared, dict) else {}), **cli_limits}
    try:
        spec = Spec.model_validate(plain)
    except ValidationError as exc:
        raise SpecError(_translate(exc, plain, {}), source) from None
    spec._source, spec._source_text = source, text
    if cli_limits:
        spec._overrides = {"limits": cli_limits}
    spec._spec_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return spec


def _plain(value: Any) -> Any:
    """A copy of `value` with tuples as lists, as YAML would read them."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
