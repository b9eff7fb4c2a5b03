"""The entry points: :func:`parse_spec` (YAML text to a validated :class:`Spec`, or a
:class:`SpecError` listing every located problem) and :func:`load_spec` (the same, from a file)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Mapping

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
