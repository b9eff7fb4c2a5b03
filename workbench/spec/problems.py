"""Located spec problems: :class:`Problem` (a field path, its line, what is wrong and what was
expected), :class:`SpecError` (every problem of one spec) and the phrases each message is built
from (``got ...``, ``did you mean ...``)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..errors import BadInputError

# Path into the spec data: mapping keys and list indices.
SpecPath = tuple[Any, ...]


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


def undecodable_at(raw: bytes, exc: UnicodeDecodeError) -> tuple[int, int, str]:
    """(line, column, what) of the first byte of `raw` that `exc` found not to be UTF-8, for a
    message that names where a file stops being text (a UTF-16 byte-order mark is named as such)."""
    line = raw.count(b"\n", 0, exc.start) + 1
    column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return line, column, "it starts with a UTF-16 byte-order mark"
    return line, column, f"byte 0x{raw[exc.start]:02x} at column {column}: {exc.reason}"
