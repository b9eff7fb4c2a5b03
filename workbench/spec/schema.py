"""The spec schema: the pydantic models (:class:`Spec` and its sections; each intervention entry
is validated by its kind's model, declared in `workbench.extend`), the checks across fields (condition references,
source cycles, site roles, sweep name clashes) and the expansion of sweeps into
:class:`ConditionInstance`s."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterable, Iterator, Literal, Sequence, Union, overload

from pydantic import (
    AfterValidator,
    Field,
    PlainValidator,
    PrivateAttr,
    model_validator,
)

from ..definitions import AVERAGE_LAYERS, DEFAULTS, RANK_BASES, TEXT_SETS
from .fields import (
    CAPTURE_SITES,
    DATA_SOURCES,
    DATBENCH_CONFIGS,
    EDITABLE_SITES,
    IMAGE_MODES,
    KV_PART_SETS,
    ConditionName,
    Layers,
    ModelRef,
    NonNegativeFloat,
    NonNegativeInt,
    PathString,
    Positions,
    PositiveInt,
    Site,
    SpecName,
    SweepValues,
    VarName,
    _fail,
    _fail_many,
    _is_number,
    _kv_parts,
    _one_of,
    _swap_layers,
    _unique_models,
)
from .kinds import InterventionEntry
from .kinds import SpecModel as _Model
from .problems import Problem, SpecPath, _did_you_mean, _dotted, _got, _quoted
from .sizes import Limits, check_data_sizes
from .yaml_lines import _line_of


def intervention_kinds() -> dict[str, Any]:
    from ..extend import intervention_kinds as kinds  # the registry imports this package

    return kinds()


def load_plugin(name: str) -> str | None:
    from ..extend import load_plugin as load

    return load(name)


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


def _swept(intervention: Any) -> dict[str, str]:
    """{field: what its sweep values must be} of an intervention entry's kind (`workbench.extend`)."""
    return intervention_kinds()[intervention.kind].swept()


def _plugin(value: Any) -> str:
    """A `plugins` entry: a module name, imported now (its kinds declare themselves before the
    conditions that use them are validated)."""
    if not isinstance(value, str) or not _MODULE_RE.fullmatch(value):
        _fail(f"{_got(value)}; expected a Python module name such as mylab.interventions")
    problem = load_plugin(value)
    if problem:
        _fail(f"cannot import plugin module {value!r} ({problem}); expected a module importable from "
              "this Python environment or the current directory")
    return value


_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
PluginName = Annotated[str, PlainValidator(_plugin)]


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
    interventions: list[InterventionEntry] = []
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
        for name, wants in _swept(intervention).items():
            if _is_var(value := getattr(intervention, name)):
                yield ("interventions", i, name), value, wants
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
    # the background writer commits what arrived within this many seconds as one commit (a
    # commit's fixed cost, tens of ms, is paid once per interval; a store's first commit, which
    # creates its arrays, costs the most); a kill loses at most that much uncommitted work, which
    # the rerun captures again. 0: one commit per forward
    commit_interval_s: NonNegativeFloat = 2.0
    # runs per forward, at most: one sample's conditions (an alpha sweep, real vs blank image) and
    # consecutive samples' runs, right-padded where prompts differ in length; samples whose image
    # inputs cannot be stacked (tiles, size), kv_swap conditions and remote jobs (one per sample)
    # run apart (README, "Backend: batches, devices, the writer")
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
        for name in _swept(intervention)
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


def _instance(base: str, condition: Condition, assignment: dict[str, Any]) -> ConditionInstance:
    return ConditionInstance(
        name=_instance_name(assignment) if assignment else base,
        base=base,
        sweep=assignment,
        image=condition.image,
        interventions=tuple(_substitute(iv, assignment) for iv in condition.interventions),
        kv_swap=_substitute_swap(condition.kv_swap, assignment),
    )


def _assignments(condition: Condition) -> Iterator[dict[str, Any]]:
    """A condition's sweep assignments, in `itertools.product` order (first variable slowest)."""
    if not condition.sweep:
        return iter([{}])
    variables = list(condition.sweep)
    return (dict(zip(variables, values)) for values in itertools.product(*condition.sweep.values()))


def _sweep_count(condition: Condition) -> int:
    return math.prod(len(values) for values in condition.sweep.values())


class ConditionSpace(Sequence[ConditionInstance]):
    """Every concrete run of a spec's conditions, built when asked for: its length and each run
    come from the sweeps' values, so holding it costs the spec, never the expanded count."""

    def __init__(self, conditions: dict[str, Condition]):
        self._parts = [(base, cond, _sweep_count(cond)) for base, cond in conditions.items()]
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
        for base, cond, count in self._parts:
            if index < count:
                return _instance(base, cond, _assignment_at(cond, index))
            index -= count
        raise AssertionError("unreachable: the index was checked against the length")

    def __iter__(self) -> Iterator[ConditionInstance]:
        for base, cond, _ in self._parts:
            for assignment in _assignments(cond):
                yield _instance(base, cond, assignment)

    def names(self) -> Iterator[str]:
        """The runs' names only, in order (nothing else of a run is built)."""
        for base, cond, _ in self._parts:
            yield from _names(cond, base)


def _assignment_at(condition: Condition, index: int) -> dict[str, Any]:
    """The `index`-th assignment of `_assignments(condition)`: mixed radix, last variable fastest."""
    picked = {}
    for variable, values in reversed(condition.sweep.items()):
        index, digit = divmod(index, len(values))
        picked[variable] = values[digit]
    return dict(reversed(picked.items()))


class Spec(_Model):
    name: SpecName
    description: str | None = None
    # modules declaring intervention kinds (workbench.extend), imported before `conditions`
    # (pydantic validates fields in this order)
    plugins: list[PluginName] = []
    models: Annotated[list[ModelRef], Field(min_length=1), AfterValidator(_unique_models)]
    data: DataSpec = Field(default_factory=DataSpec)
    conditions: Annotated[dict[ConditionName, Condition], Field(min_length=1)]
    capture: Annotated[list[CaptureSpec], Field(min_length=1)]
    generate: GenerateSpec | None = None  # None: prefill only
    store: StoreSpec
    backend: BackendSpec = Field(default_factory=BackendSpec)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    limits: Limits = Field(default_factory=Limits)  # spec/sizes.py: sizes are counted before expanding

    # Provenance, outside the validated fields.
    _source: str = PrivateAttr("<spec>")
    _source_text: str | None = PrivateAttr(None)
    _spec_hash: str | None = PrivateAttr(None)
    _overrides: dict[str, Any] = PrivateAttr(default_factory=dict)
    _lines: dict[SpecPath, int] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _sized_first(cls, data: Any) -> Any:
        check_data_sizes(data)  # too many conditions or samples: refused before anything expands
        return data

    @model_validator(mode="after")
    def _cross_references(self) -> "Spec":
        problems = _reference_problems(self.conditions) + _name_clash_problems(self.conditions)
        problems += _site_role_problems(self) + (_source_cycle_problems(self.conditions) if not problems else [])
        problems += _remote_kind_problems(self)
        if problems:
            _fail_many(problems)
        return self

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> "Spec":
        """A spec from Python data, its problems located by field path as a YAML spec's are
        (`workbench.spec.loading.spec_from_data`)."""
        from .loading import spec_from_data

        return spec_from_data(data, source)

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

    def expand_conditions(self) -> ConditionSpace:
        """Every concrete condition, sweeps expanded (cartesian product, first variable slowest),
        each built when taken."""
        return ConditionSpace(self.conditions)

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
        from .overrides import apply_overrides  # overrides re-validates through this module's Spec

        return apply_overrides(self, models=models, data_source=data_source, limit=limit,
                               store_path=store_path, device=device, dtype=dtype)

    def _carry_provenance(self, other: "Spec", overrides: dict[str, Any]) -> None:
        self._source, self._source_text, self._spec_hash = other._source, other._source_text, other._spec_hash
        self._lines = other._lines
        self._overrides = overrides


def _reference_problems(conditions: dict[str, Condition]) -> list[tuple[SpecPath, str]]:
    """Condition references (patch 'from', add 'direction_from', kv_swap 'donor') must name
    an existing condition without a sweep; 'from'/'direction_from' may not name their own."""
    problems = []
    for name, cond in conditions.items():
        refs: list[tuple[SpecPath, str, bool]] = []  # (sub-path, target, may be self)
        refs += [(subpath, target, False) for subpath, target in _condition_sources(cond)]
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


def _remote_kind_problems(spec: "Spec") -> list[tuple[SpecPath, str]]:
    """A remote backend runs only kinds whose code travels to NDIF (the workbench's own);
    `workbench.backends.remote` refuses the same for `--remote`."""
    if spec.backend.kind != "remote":
        return []
    kinds = intervention_kinds()
    return [(("conditions", name, "interventions", j, "kind"),
             f"kind {iv.kind!r} comes from plugin module {kinds[iv.kind].module!r}, whose code is not shipped to "
             "NDIF; expected built-in kinds only with backend kind 'remote' (or run locally)")
            for name, cond in spec.conditions.items() for j, iv in enumerate(cond.interventions)
            if not kinds[iv.kind].remote]


def _condition_sources(cond: Condition) -> list[tuple[SpecPath, str]]:
    """(sub-path, condition) of every source a condition's interventions read (a kind's
    declared `source` field: patch's `from`, add's `direction_from`)."""
    kinds = intervention_kinds()
    found = []
    for i, iv in enumerate(cond.interventions):
        source = kinds[iv.kind].source_of(iv)
        if source is not None:
            found.append((("interventions", i, source[0]), source[1]))
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
    """Run names produced twice, found without listing them. Only two sweeps over the same
    variables can clash (a condition's own name holds no '=', `ConditionName`; a swept one is
    "x=1.0,y=2.0", and numbers and part-set words hold no ',' or '='), so each sweep is compared
    with the earlier ones sharing its first variable's values, then its names are asked of them."""
    problems = []
    by_first: dict[tuple[tuple[str, ...], str], list[_NameOwner]] = {}  # (variables, first value) -> sweeps
    for order, (base, cond) in enumerate(conditions.items()):
        if not cond.sweep:
            continue
        owner = _NameOwner(order, base, cond)
        variables = tuple(cond.sweep)
        firsts = [(variables, value) for value in owner.digits[variables[0]]]
        rivals = sorted({o.order: o for key in firsts for o in by_first.get(key, ()) if o.may_share(owner)}.items())
        for index, name in enumerate(_names(cond, base) if rivals else ()):
            first = next((o for _, o in rivals if o.produces(name)), None)
            if first is not None:
                problems.append(
                    (
                        ("conditions", base, "sweep"),
                        f"expands to '{name}', which condition '{first.base}' "
                        "also produces; expected unique run names (rename the sweep variable)",
                    )
                )
                owner.limit = index  # it produced the names before this one
                break
        for key in firsts:
            by_first.setdefault(key, []).append(owner)
    return problems


def _names(condition: Condition, base: str) -> Iterator[str]:
    return (_instance_name(a) for a in _assignments(condition)) if condition.sweep else iter([base])


class _NameOwner:
    """The run names a sweep produces (its first `limit`, in order), asked without listing them."""

    def __init__(self, order: int, base: str, condition: Condition):
        self.order, self.base, self.limit = order, base, _sweep_count(condition)
        # per variable: formatted value -> its position (a digit of the name's index)
        self.digits = {var: {_format_value(v): i for i, v in enumerate(values)}
                       for var, values in condition.sweep.items()}

    def may_share(self, other: "_NameOwner") -> bool:
        return list(self.digits) == list(other.digits) and all(
            self.digits[v].keys() & other.digits[v].keys() for v in self.digits)

    def produces(self, name: str) -> bool:
        pairs = [pair.partition("=") for pair in name.split(",")]
        if [var for var, _, _ in pairs] != list(self.digits) or any(
                value not in self.digits[var] for var, _, value in pairs):
            return False
        index = 0
        for var, _, value in pairs:
            index = index * len(self.digits[var]) + self.digits[var][value]
        return index < self.limit
