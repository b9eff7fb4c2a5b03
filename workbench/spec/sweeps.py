"""Sweeps: a condition's `sweep` section, the runs it expands to and their names.

A sweep lists values per variable; its runs are the product of the lists (first variable
slowest), and a `zip` group advances several variables together (its lists have one length)::

    sweep: {c: [0.5, 2.0]}                                 # steer[c=0.5], steer[c=2.0]
    sweep: {zip: {layer: [1, 3], pos: [vision, text]}}     # trace[layer=1,pos=vision], trace[layer=3,pos=text]
    sweep: {a: [1, 2], zip: {l: [0, 1], p: [0, 5]}}        # 2 x 2 runs

Any field whose type carries a `Swept` marker (`workbench.spec.fields`) may hold a '$variable';
each run's entries are validated again with its values in place (`place`), so a run is checked
as a hand-written condition would be. Runs are built when taken (`ConditionSpace`): holding a
100,000-run sweep costs its value lists, never the runs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence, overload

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from .fields import _SPEC_ERROR, _distinct_values, _fail_many, _sweep_values, _var_name
from .kinds import swept_fields
from .problems import Problem, SpecError, SpecPath, _did_you_mean

ZIP = "zip"  # the sweep key of a group of variables advancing together

# one factor of a sweep's product: its variables and their value lists (one length)
Axis = tuple[tuple[str, ...], tuple[list[Any], ...]]


# --------------------------------------------------------------------------- the `sweep` field


def _checked(problems: list[tuple[SpecPath, str]], prefix: SpecPath, check: Any, value: Any) -> Any:
    """check(value), its problems (if it fails) added to `problems` under `prefix`."""
    try:
        return check(value)
    except PydanticCustomError as exc:
        if exc.type != _SPEC_ERROR:
            raise
        problems.extend((prefix + tuple(path), message) for path, message in (exc.context or {})["problems"])
        return None


def _values(value: Any, problems: list[tuple[SpecPath, str]], prefix: SpecPath) -> list[Any] | None:
    values = _checked(problems, prefix, _sweep_values, value)
    return None if values is None else _checked(problems, prefix, _distinct_values, values)


def sweep_section(value: Any) -> dict[str, Any]:
    """A condition's `sweep`: {variable: values}, and at most one {zip: {variable: values}} whose
    lists have one length. Variable names are unique across the whole section."""
    if not isinstance(value, dict):
        _fail_many([((), f"got {type(value).__name__}; expected a mapping of sweep variable -> values, "
                     "e.g. {c: [0.5, 2.0]} or {zip: {l: [1, 2], p: [vision, text]}}")])
    problems: list[tuple[SpecPath, str]] = []
    out: dict[str, Any] = {}
    seen: set[str] = set()
    for key, values in value.items():
        if key == ZIP:
            if not isinstance(values, dict) or not values:
                problems.append(((ZIP,), "'zip' holds variables swept together; expected a mapping such as "
                                 "{zip: {l: [1, 2], p: [vision, text]}}"))
                continue
            zipped: dict[str, list[Any] | None] = {}
            for var, listed in values.items():
                if _checked(problems, (ZIP, var, "[key]"), _var_name, var) is None:
                    continue
                zipped[var] = _values(listed, problems, (ZIP, var))
            lengths = {var: len(v) for var, v in zipped.items() if v is not None}
            if len(set(lengths.values())) > 1:
                counts = ", ".join(f"'{var}' has {n}" for var, n in lengths.items())
                problems.append(((ZIP,), f"zipped lists of different lengths ({counts}); expected one length "
                                 "(zip pairs the i-th values of each)"))
            names = list(zipped)
            group: dict[str, list[Any] | None] | list[Any] | None = zipped
        else:
            if _checked(problems, (key, "[key]"), _var_name, key) is None:
                continue
            group = _values(values, problems, (key,))
            names = [key]
        for var in names:
            if var in seen:
                problems.append(((ZIP, var), f"sweep variable '{var}' is listed twice; expected each variable once"))
            seen.add(var)
        out[key] = group
    if problems:
        _fail_many(problems)
    return out


def sweep_axes(sweep: Mapping[str, Any]) -> tuple[Axis, ...]:
    """The factors of a validated sweep's product, in its order: one per variable, one per zip."""
    return tuple((tuple(values), tuple(values.values())) if key == ZIP else ((key,), (values,))
                 for key, values in sweep.items())


def axis_length(axis: Axis) -> int:
    return len(axis[1][0])


def run_count(axes: Sequence[Axis]) -> int:
    return math.prod(axis_length(a) for a in axes)


def variables(axes: Sequence[Axis]) -> list[str]:
    return [var for names, _ in axes for var in names]


def assignment_at(axes: Sequence[Axis], index: int) -> dict[str, Any]:
    """The `index`-th run's {variable: value}: mixed radix over the axes, the last fastest."""
    digits = []
    for axis in reversed(axes):
        index, digit = divmod(index, axis_length(axis))
        digits.append(digit)
    return {var: values[digit] for (names, lists), digit in zip(axes, reversed(digits))
            for var, values in zip(names, lists)}


def first_with(axes: Sequence[Axis], values: Mapping[str, Any]) -> dict[str, Any]:
    """The first run's assignment holding `values` (drawn from one run's assignment), for a
    problem's location."""
    index = 0
    for names, lists in axes:
        held = [k for k, var in enumerate(names) if var in values]
        digit = lists[held[0]].index(values[names[held[0]]]) if held else 0
        index = index * len(lists[0]) + digit
    return assignment_at(axes, index)


def _combinations(axes: Sequence[Axis], wanted: set[str]) -> Iterator[dict[str, Any]]:
    """Every distinct assignment of the variables `wanted` that some run holds: the product of
    the axes holding them (a zip's variables together), never of the others."""
    used = [axis for axis in axes if wanted & set(axis[0])]
    for digits in itertools.product(*(range(axis_length(axis)) for axis in used)):
        yield {var: values[digit] for (names, lists), digit in zip(used, digits)
               for var, values in zip(names, lists) if var in wanted}


# --------------------------------------------------------------------------- names


def format_value(value: Any) -> str:
    """A sweep value in a run name: a word as itself, an integer as one, a float in its shortest
    round-tripping form (0.1, 1.0, 3.0)."""
    if isinstance(value, (str, int)):
        return str(value)
    return repr(float(value))


def run_name(base: str, assignment: Mapping[str, Any]) -> str:
    """A run's name: its condition's, then its values: steer[c=0.5], trace[layer=3,pos=vision].
    Unique by construction: a condition's name holds no '[' (`ConditionName`) and a sweep's
    values are distinct."""
    if not assignment:
        return base
    return f"{base}[{','.join(f'{var}={format_value(v)}' for var, v in assignment.items())}]"


def unbracketed(name: str) -> str:
    """A run name without its condition ('steer[c=0.5]' -> 'c=0.5'): the name a store written
    before runs were named after their condition holds (`workbench.plan.renamed_runs`)."""
    return name[name.index("[") + 1:-1] if name.endswith("]") and "[" in name else name


# --------------------------------------------------------------------------- values in place


def place(entry: BaseModel, assignment: Mapping[str, Any]) -> BaseModel:
    """`entry` (an intervention or kv_swap entry) with its '$variable's replaced by `assignment`,
    validated again by its model (raises pydantic's ValidationError where a value does not fit)."""
    updates = {}
    for name, marker in swept_fields(type(entry)).items():
        value = getattr(entry, name)
        placed = marker.place(value, assignment)
        if placed != value:
            updates[type(entry).model_fields[name].alias or name] = placed
    if not updates:
        return entry
    return type(entry).model_validate({**entry.model_dump(by_alias=True), **updates})


def var_refs(entry: BaseModel) -> Iterator[tuple[SpecPath, str]]:
    """(sub-path in the entry, variable) of every '$variable' `entry` holds."""
    for name, marker in swept_fields(type(entry)).items():
        for subpath, var in marker.refs(getattr(entry, name)):
            yield (type(entry).model_fields[name].alias or name,) + subpath, var


def undefined_var_message(var: str, defined: Sequence[str]) -> str:
    ref = "$" + var
    if not defined:
        return f"'{ref}' is not defined; expected a value, or add 'sweep: {{{var}: [...]}}' to this condition"
    named = ["$" + v for v in defined]
    return (f"'{ref}' is not defined{_did_you_mean(ref, named)}; expected one of this condition's sweep "
            f"variables: {', '.join(named)}")


class RunKey(str):
    """A swept run's name in a problem's path: printed as the run (conditions.steer[c=0.5]...),
    located at its condition's line (`yaml_lines._line_of` reads `base`)."""

    base: str

    def __new__(cls, name: str, base: str) -> "RunKey":
        key = super().__new__(cls, name)
        key.base = base
        return key

    def __reduce__(self) -> tuple[Any, ...]:
        return RunKey, (str(self), self.base)


# a failing variable is reported at this many of its values, then counted
_SHOWN_VALUES = 5


def value_problems(base: str, entries: Sequence[tuple[SpecPath, BaseModel]], axes: Sequence[Axis]
                   ) -> list[tuple[SpecPath, str]]:
    """Each entry's swept fields checked at every value their variables take, the entry
    validated as if hand-written with those values in place; a problem names the first run
    holding them. Cost: per field, the values of its variable (or, for a field holding several,
    their combinations), never the product of the whole sweep."""
    from .translate import nested_problems  # translate reads the schema, which reads this module

    problems: list[tuple[SpecPath, str]] = []
    for subpath, entry in entries:
        for name, marker in swept_fields(type(entry)).items():
            wanted = {var for _, var in marker.refs(getattr(entry, name))}
            failed = 0
            for values in _combinations(axes, wanted) if wanted else ():
                try:
                    place(entry, values)
                except ValidationError as exc:
                    failed += 1
                    if failed <= _SHOWN_VALUES:
                        where = ("conditions", RunKey(run_name(base, first_with(axes, values)), base)) + subpath
                        problems += [(where + tuple(p), m) for p, m in nested_problems(exc, type(entry))]
            if failed > _SHOWN_VALUES:
                used = ", ".join(f"'${var}'" for var in sorted(wanted))
                problems.append((("conditions", base, "sweep"), f"{failed - _SHOWN_VALUES} more values of "
                                 f"{used} fail the same way; expected values that fit where they are used"))
    return problems


# --------------------------------------------------------------------------- the runs


@dataclass(frozen=True)
class ConditionInstance:
    """One concrete run of a condition: sweep values chosen and "$var"s substituted."""

    name: str  # "baseline", or "steer[c=0.5]" / "trace[layer=3,pos=vision]" for swept runs
    base: str  # the condition's key in the spec
    sweep: dict[str, Any] = field(default_factory=dict)  # {variable: value}: numbers, or words
    image: str = "real"
    interventions: tuple[Any, ...] = ()
    kv_swap: Any = None

    @property
    def key(self) -> str:
        """Its key in a problem's path: the condition, or the run of a sweep (`RunKey`)."""
        return RunKey(self.name, self.base) if self.sweep else self.base


def instance(base: str, condition: Any, assignment: dict[str, Any],
             conditions: Mapping[str, Any] | None = None) -> ConditionInstance:
    """Run `assignment` of `condition` (`conditions`: the spec's, which a scan's runs are built from)."""
    name = run_name(base, assignment)
    if condition.scan is not None:
        return scan_instance(name, base, condition.scan, assignment, conditions or {})
    swap = condition.kv_swap
    return ConditionInstance(
        name=name,
        base=base,
        sweep=assignment,
        image=condition.image,
        interventions=tuple(_placed(name, base, ("interventions", j), iv, assignment)
                            for j, iv in enumerate(condition.interventions)),
        kv_swap=_placed(name, base, ("kv_swap",), swap, assignment) if swap is not None and assignment else swap,
    )


def _placed(name: str, base: str, subpath: SpecPath, entry: BaseModel, assignment: Mapping[str, Any]) -> BaseModel:
    """`place`, a failure located at the run: values that fit one by one (`value_problems`) but
    not together, such as two variables of one `layers` list equal in one run."""
    try:
        return place(entry, assignment)
    except ValidationError as exc:
        from .translate import nested_problems

        where = ("conditions", RunKey(name, base)) + subpath
        raise SpecError([Problem(where + tuple(p), None, m) for p, m in nested_problems(exc, type(entry))]) from None


def _patch_entry(scan: Any, assignment: Mapping[str, Any]) -> BaseModel:
    from ..extend import intervention_kinds  # the registry imports the spec package

    return intervention_kinds()["patch"].spec.model_validate(scan.patch_entry(assignment))


def scan_instance(name: str, base: str, scan: Any, assignment: Mapping[str, Any],
                  conditions: Mapping[str, Any]) -> ConditionInstance:
    """A scan's run (`workbench.spec.scans`): its base condition's image and interventions, then
    the patch of layer `l` at group `pos` from the donor."""
    _, runs_as, _ = scan.roles(assignment)
    into = conditions[runs_as]
    patch = _patch_entry(scan, assignment)  # `scan_value_problems` checked every value when validated
    return ConditionInstance(name=name, base=base, sweep={**assignment, **scan.stored(assignment)}, image=into.image,
                             interventions=(*into.interventions, patch))


def scan_value_problems(base: str, scan: Any) -> list[tuple[SpecPath, str]]:
    """The scan's patch validated at each layer and each position group (as `value_problems` does
    a sweep's fields), located at the first run holding the value."""
    from .translate import nested_problems

    axes = scan.axes()
    problems: list[tuple[SpecPath, str]] = []
    for var in ("l", "pos"):
        for values in _combinations(axes, {var}):
            assignment = first_with(axes, values)
            try:
                _patch_entry(scan, assignment)
            except ValidationError as exc:
                from ..extend import intervention_kinds

                where = ("conditions", RunKey(run_name(base, assignment), base), "scan")
                model = intervention_kinds()["patch"].spec
                problems += [(where + tuple(p), m) for p, m in nested_problems(exc, model)]
    return problems


class ConditionSpace(Sequence[ConditionInstance]):
    """Every concrete run of a spec's conditions, built when asked for: its length and each run
    come from the sweeps' values, so holding it costs the spec, never the expanded count."""

    def __init__(self, conditions: Mapping[str, Any]):
        self._conditions = conditions
        self._parts = [(base, cond, cond.axes, run_count(cond.axes)) for base, cond in conditions.items()]
        self._length = sum(count for *_, count in self._parts)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> ConditionInstance: ...

    @overload
    def __getitem__(self, index: slice) -> list[ConditionInstance]: ...

    def __getitem__(self, index: int | slice) -> ConditionInstance | list[ConditionInstance]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if not -self._length <= index < self._length:
            raise IndexError(f"condition index {index} out of range ({self._length} conditions)")
        index %= self._length
        for base, cond, axes, count in self._parts:
            if index < count:
                return instance(base, cond, assignment_at(axes, index), self._conditions)
            index -= count
        raise AssertionError("unreachable: the index was checked against the length")

    def __iter__(self) -> Iterator[ConditionInstance]:
        for base, cond, axes, count in self._parts:
            for i in range(count):
                yield instance(base, cond, assignment_at(axes, i), self._conditions)

    def names(self) -> Iterator[str]:
        """The runs' names only, in order (nothing else of a run is built)."""
        for base, _, axes, count in self._parts:
            for i in range(count):
                yield run_name(base, assignment_at(axes, i))

    def runs_of(self, base: str) -> int:
        """How many runs condition `base` expands to."""
        return next(count for b, _, _, count in self._parts if b == base)
