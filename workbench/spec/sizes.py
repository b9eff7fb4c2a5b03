"""Sizes before expansion: how many conditions a spec's sweeps make and how many samples its data
source asks for, counted without expanding either, and refused past a limit.

A sweep of 150,000 values or a product of sweeps worth 10^8 conditions is refused before the spec
is built into Python data: :func:`text_size_problems` reads the YAML as a stream of parser events
(PyYAML's C parser where it is installed) and only counts list items, stopping early once a count
passes every limit, so the refusal costs no more than reading the text. :func:`data_size_problems`
applies the same limits to plain data (a spec built in Python, a spec after ``--data``), run by
:class:`~workbench.spec.schema.Spec` before any field is validated.

The limits are the spec's ``limits`` section (:class:`Limits`), which ``--max-conditions`` and
``--max-samples`` override on the command line, for those who mean a larger run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field

from .fields import DATBENCH_CONFIGS, _fail_many
from .problems import Problem, SpecPath
from .yaml_lines import _line_of

if TYPE_CHECKING:
    from .schema import Spec

DEFAULT_MAX_CONDITIONS = 100_000
DEFAULT_MAX_SAMPLES = 1_000_000
# a single sweep list is counted up to this many times the condition limit, then reported as "more
# than": reading a list costs ~5 µs an item, so a list of 10^7 values is refused in a fraction of a second
_COUNT_CAP_FACTOR = 2


class Limits(BaseModel):
    """The most conditions (after sweeps expand, summed over the spec's conditions) and samples
    (what the data source yields: for datbench, ``n`` times the configs kept) a spec may ask for."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    conditions: int = Field(default=DEFAULT_MAX_CONDITIONS, ge=1)
    samples: int = Field(default=DEFAULT_MAX_SAMPLES, ge=1)


LIMIT_OPTIONS = {"conditions": "--max-conditions", "samples": "--max-samples"}


@dataclass
class SweepCount:
    """One sweep variable's number of values (``capped``: at least that many; counting stopped)."""

    values: int
    capped: bool = False


@dataclass
class DeclaredSizes:
    """What decides a spec's sizes, read before anything is expanded."""

    conditions: list[str] = field(default_factory=list)
    sweeps: dict[str, dict[str, SweepCount]] = field(default_factory=dict)  # condition -> variable -> count
    scans: set[str] = field(default_factory=set)  # the conditions of `sweeps` that are scans (their grid's factors)
    n: int | None = None  # None: DataSpec's default, far below any limit
    source: str = "builtin"
    exclude: tuple[str, ...] = ()
    limits: dict[str, Any] = field(default_factory=dict)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def effective_limits(declared: Mapping[str, Any], cli: Mapping[str, int | None] | None = None) -> Limits:
    """The limits in force: the command line's, else the spec's, else the defaults. A spec value
    of the wrong type is left to the schema (it reports it); the default applies meanwhile."""
    values = {k: v for k, v in declared.items() if k in Limits.model_fields and _is_count(v)}
    values.update({k: v for k, v in (cli or {}).items() if v is not None})
    return Limits(**values)


def count_conditions(sweeps: Mapping[str, Mapping[str, int]]) -> int:
    """Conditions after expansion: per condition the product of its sweeps' sizes (1 without a sweep)."""
    return sum(math.prod(sizes.values()) for sizes in sweeps.values())


def count_samples(n: int, source: str, exclude: Iterable[str] = ()) -> int:
    """Samples a data section asks for: ``n``, or for datbench ``n`` per config kept."""
    if source == "datbench":
        return n * len(set(DATBENCH_CONFIGS) - set(exclude))
    return n


def spec_condition_count(spec: Spec) -> int:
    """Conditions a validated spec expands to, counted without expanding them."""
    from .sweeps import axis_length  # sweeps reads the schema's fields; sizes is read first

    return count_conditions({name: {"/".join(axis[0]): axis_length(axis) for axis in cond.axes}
                             for name, cond in spec.conditions.items()})


def _fmt(n: int) -> str:
    return f"{n:,}"


def _raise_hint(what: str, count: int) -> str:
    return f"or raise limits.{what} ({LIMIT_OPTIONS[what]}) to at least {_fmt(count)} if you mean it"


def size_problems(sizes: DeclaredSizes, limits: Limits) -> list[tuple[SpecPath, str]]:
    """(path, message) of every size past its limit: a condition's sweep, all conditions together,
    the data source's samples."""
    problems: list[tuple[SpecPath, str]] = []
    per_condition = {name: math.prod(c.values for c in sizes.sweeps.get(name, {}).values())
                     for name in sizes.conditions}
    total = sum(per_condition.values())
    for name, counts in sizes.sweeps.items():
        count = per_condition.get(name, 0)
        if count <= limits.conditions:
            continue
        capped = any(c.capped for c in counts.values())
        factors = " x ".join(f"{var}: {_fmt(c.values)}{'+' if c.capped else ''} values" for var, c in counts.items())
        what = f"more than {_fmt(count - 1)}" if capped else _fmt(count)
        # the hint names what the whole spec needs: raising the limit to this sweep's count alone would
        # still refuse a spec whose other conditions add to it
        overall = "" if capped or total == count else f", {_fmt(total)} with the other conditions"
        kind = "scan" if name in sizes.scans else "sweep"
        fewer = "layers, position groups or heads" if kind == "scan" else "sweep values"
        problems.append((("conditions", name, kind),
                         f"the {kind} expands to {what} conditions ({factors}){overall}; the limit is "
                         f"{_fmt(limits.conditions)} conditions; expected fewer {fewer}, "
                         f"{_raise_hint('conditions', count if capped else total)}"))
    if not problems and total > limits.conditions:
        parts = ", ".join(f"{name}: {_fmt(c)}" for name, c in per_condition.items() if c > 1)
        problems.append((("conditions",), f"the conditions expand to {_fmt(total)} in all ({parts}); the limit is "
                         f"{_fmt(limits.conditions)} conditions; expected fewer sweep values, "
                         f"{_raise_hint('conditions', total)}"))
    if sizes.n is not None:
        samples = count_samples(sizes.n, sizes.source, sizes.exclude)
        if samples > limits.samples:
            kept = len(set(DATBENCH_CONFIGS) - set(sizes.exclude))
            what = (f"{_fmt(sizes.n)} per config x {kept} configs = {_fmt(samples)} samples"
                    if sizes.source == "datbench" else f"{_fmt(samples)} samples")
            problems.append((("data", "n"), f"asks for {what}; the limit is {_fmt(limits.samples)} samples; expected "
                             f"fewer samples, {_raise_hint('samples', samples)}"))
    return problems


# --------------------------------------------------------------------------- plain data


def _declared_from_data(data: Mapping[str, Any]) -> DeclaredSizes:
    sizes = DeclaredSizes()
    conditions = data.get("conditions")
    if isinstance(conditions, Mapping):
        for name, condition in conditions.items():
            sizes.conditions.append(str(name))
            sweep = condition.get("sweep") if isinstance(condition, Mapping) else None
            if isinstance(sweep, Mapping):
                counts = {str(v): SweepCount(_listed(vals)) for v, vals in sweep.items() if _listed(vals)}
                if counts:
                    sizes.sweeps[str(name)] = counts
            scan = condition.get("scan") if isinstance(condition, Mapping) else None
            if isinstance(scan, Mapping):
                sizes.sweeps[str(name)] = _scan_counts(scan)
                sizes.scans.add(str(name))
    section = data.get("data")
    if isinstance(section, Mapping):
        n = section.get("n")
        sizes.n = n if _is_count(n) else None
        source = section.get("source")
        sizes.source = source if isinstance(source, str) else "builtin"
        exclude = section.get("exclude")
        sizes.exclude = tuple(e for e in exclude if isinstance(e, str)) if isinstance(exclude, list) else ()
    limits = data.get("limits")
    sizes.limits = dict(limits) if isinstance(limits, Mapping) else {}
    return sizes


def _scan_counts(scan: Mapping[str, Any]) -> dict[str, SweepCount]:
    """A scan's grid factors (`workbench.spec.scans.Scan.axes`): its layers, heads, position
    groups (4 by default) and, with `direction: both`, 2 directions."""
    from .scans import DEFAULT_POSITIONS

    counts = {"l": SweepCount(_listed(scan.get("layers")))}
    if isinstance(scan.get("heads"), list):
        counts["h"] = SweepCount(len(scan["heads"]))
    positions = scan.get("positions")
    counts["pos"] = SweepCount(len(positions) if isinstance(positions, list) else len(DEFAULT_POSITIONS))
    if scan.get("direction") == "both":
        counts["dir"] = SweepCount(2)
    return counts


def _listed(values: Any) -> int:
    """Values a sweep entry lists: a list's length; a zip group's longest list (its lists have one
    length, checked by the schema)."""
    if isinstance(values, list):
        return len(values)
    if isinstance(values, Mapping):
        return max((len(v) for v in values.values() if isinstance(v, list)), default=0)
    return 0


def check_data_sizes(data: Any) -> None:
    """Refuse plain spec data whose sizes pass the limits it declares (one pydantic error, located
    like every other spec problem); anything not a mapping is left to the schema."""
    if not isinstance(data, Mapping):
        return
    sizes = _declared_from_data(data)
    found = size_problems(sizes, effective_limits(sizes.limits))
    if found:
        _fail_many(found)


# --------------------------------------------------------------------------- YAML text

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C parser where PyYAML was built with libyaml
_SCALARS = yaml.constructor.SafeConstructor()
_RESOLVER = yaml.resolver.Resolver()


class _Frame:
    """An open mapping or list while the events stream by (path None: inside a mapping key)."""

    __slots__ = ("path", "mapping", "key", "expect_key", "items", "anchor", "counting")

    def __init__(self, path: SpecPath | None, mapping: bool, anchor: str | None):
        self.path, self.mapping, self.anchor = path, mapping, anchor
        self.key: Any = None
        self.expect_key = True
        self.items = 0
        self.counting = False  # a sweep's list: its scalar items are only counted


def _scalar_value(event: yaml.ScalarEvent) -> Any:
    tag = event.tag if event.tag is not None and event.tag != "!" else _RESOLVER.resolve(yaml.ScalarNode, event.value, event.implicit)
    try:
        return _SCALARS.construct_object(yaml.ScalarNode(tag, event.value), deep=True)
    except (ValueError, yaml.YAMLError):
        return None


def _is_sweep(path: SpecPath | None) -> bool:
    """A sweep's list: conditions.<name>.sweep.<variable>, or conditions.<name>.sweep.zip.<variable>."""
    return (path is not None and path[:1] == ("conditions",) and path[2:3] == ("sweep",)
            and (len(path) == 4 or (len(path) == 5 and path[3] == "zip")))


def _declared_from_text(text: str, cap: int) -> tuple[DeclaredSizes, dict[SpecPath, int]] | None:
    """The sizes a YAML text declares and the lines of the fields that declare them, from its
    parser events (no document is built; a list past `cap` items is not read further); None
    when the text is not YAML (the full reader reports that)."""
    sizes, lines = DeclaredSizes(), dict[SpecPath, int]()
    anchored: dict[str, int] = {}  # anchor -> items of the list it names: an aliased sweep counts the same
    stack: list[_Frame] = []
    exclude: list[str] = []
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            top = stack[-1] if stack else None
            if top is not None and top.counting and type(event) is yaml.ScalarEvent:  # a sweep value: the hot path
                top.items += 1
                if top.items > cap:  # enough read: this list alone passes every limit
                    _record_sweep(sizes, top.path, SweepCount(top.items, capped=True))
                    break
                continue
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frame = stack.pop()
                if frame.anchor is not None:
                    anchored[frame.anchor] = frame.items
                if _is_sweep(frame.path) and not frame.mapping:
                    _record_sweep(sizes, frame.path, SweepCount(frame.items))
                continue
            if not isinstance(event, yaml.NodeEvent):
                continue
            path = _node_path(stack, event, lines)
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                stack.append(_Frame(path, isinstance(event, yaml.MappingStartEvent), event.anchor))
                stack[-1].counting = isinstance(event, yaml.SequenceStartEvent) and _is_sweep(path)
            elif isinstance(event, yaml.AliasEvent):
                if _is_sweep(path) and event.anchor in anchored:
                    _record_sweep(sizes, path, SweepCount(anchored[event.anchor]))
            elif isinstance(event, yaml.ScalarEvent) and path and path[0] in ("data", "limits"):
                _record_scalar(sizes, path, _scalar_value(event), exclude)
            if path is not None and len(path) == 2 and path[0] == "conditions":
                sizes.conditions.append(str(path[1]))
    except yaml.YAMLError:
        return None
    sizes.exclude = tuple(exclude)
    return sizes, lines


def _line(event: yaml.NodeEvent) -> int:
    """The 1-based line an event starts at (the parser marks every event)."""
    return event.start_mark.line + 1 if event.start_mark is not None else 0


def _node_path(stack: list[_Frame], event: yaml.NodeEvent, lines: dict[SpecPath, int]) -> SpecPath | None:
    """The path of the node this event starts (None for a mapping key and all inside one),
    advancing its parent's state; the lines of short paths (a mapping entry at its key's line, a
    list item at its own, as `yaml_lines` locates them)."""
    if not stack:
        return ()
    parent = stack[-1]
    if parent.path is None:
        return None
    if not parent.mapping:
        parent.items += 1
        path = parent.path + (parent.items - 1,)
    elif parent.expect_key:
        parent.expect_key = False
        parent.key = _scalar_value(event) if isinstance(event, yaml.ScalarEvent) else None
        if parent.key is not None and len(parent.path) < 3:
            lines.setdefault(parent.path + (parent.key,), _line(event))
        return None
    else:
        parent.expect_key = True
        parent.items += 1
        if parent.key is None:
            return None
        path = parent.path + (parent.key,)
    if len(path) <= 3:
        lines.setdefault(path, _line(event))
    return path


def _record_sweep(sizes: DeclaredSizes, path: SpecPath | None, count: SweepCount) -> None:
    if path is None:  # (only sweep paths are passed: `_is_sweep` said so)
        return
    counts = sizes.sweeps.setdefault(str(path[1]), {})
    previous = counts.get(str(path[3]))  # a zip group counts as its longest list
    if previous is None or (previous.values, previous.capped) < (count.values, count.capped):
        counts[str(path[3])] = count


def _record_scalar(sizes: DeclaredSizes, path: SpecPath, value: Any, exclude: list[str]) -> None:
    if path == ("data", "n") and _is_count(value):
        sizes.n = value
    elif path == ("data", "source") and isinstance(value, str):
        sizes.source = value
    elif len(path) == 3 and path[:2] == ("data", "exclude") and isinstance(value, str):
        exclude.append(value)
    elif len(path) == 2 and path[0] == "limits" and isinstance(path[1], str):
        sizes.limits[path[1]] = value


def text_size_problems(text: str, cli_limits: Mapping[str, int | None] | None = None) -> list[Problem]:
    """Located problems of every size a spec's YAML text declares past its limits, found before
    the text is built into data, so a huge sweep is refused in the time it takes to read it."""
    cap = _COUNT_CAP_FACTOR * max([DEFAULT_MAX_CONDITIONS, *(v for v in (cli_limits or {}).values() if v)])
    read = _declared_from_text(text, cap)
    if read is None:
        return []
    declared, lines = read
    limits = effective_limits(declared.limits, cli_limits)
    return [Problem(path, _line_of(path, lines), message) for path, message in size_problems(declared, limits)]
