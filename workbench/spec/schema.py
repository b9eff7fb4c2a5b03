"""The spec schema: the pydantic models (:class:`Spec` and its sections; each intervention entry
is validated by its kind's model, declared in `workbench.extend`), the checks across fields (condition references,
source cycles, site roles, each swept run's values) and the runs a spec expands to
(`workbench.spec.sweeps`)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal, Sequence, Union

from pydantic import (
    AfterValidator,
    Field,
    PlainValidator,
    PrivateAttr,
    model_validator,
)

from ..definitions import AVERAGE_LAYERS, DEFAULTS, RANK_BASES, TEXT_SETS, AverageLayers, TextSet
from ..sites import site as site_entry
from .fields import (
    DATA_SOURCES,
    DATBENCH_CONFIGS,
    DatbenchConfig,
    IMAGE_MODES,
    ConditionName,
    Layers,
    LayersOrVar,
    ModelRef,
    NonNegativeFloat,
    NonNegativeInt,
    PathString,
    Positions,
    PositionsOrVar,
    PositiveInt,
    Swept,
    Site,
    SpecName,
    _fail,
    _fail_many,
    _kv_parts,
    _one_of,
    _unique_models,
    capture_sites,
    editable_sites,
)
from .kinds import InterventionEntry
from .kinds import SpecModel as _Model
from .problems import Problem, SpecPath, _did_you_mean, _got
from .sweeps import (ConditionInstance, ConditionSpace, run_count, scan_value_problems, sweep_axes, sweep_section,
                     undefined_var_message, value_problems, var_refs, variables)
from .scans import Scan, own_fields_problems, scan_problems
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
    exclude: list[Annotated[DatbenchConfig, _one_of(DATBENCH_CONFIGS)]] = []
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


def _part_set(value: Any) -> Any:
    return value.split("+") if isinstance(value, str) else value  # `parts: $p`: "keys+values" is both


class KVSwap(_Model):
    donor: ConditionName
    positions: PositionsOrVar = "vision"
    layers: LayersOrVar = "all"
    # which caches are copied from the donor: keys (where the decode step looks), values (what
    # it reads), or both (the study's Experiment 3)
    parts: Annotated[Union[list[str], str], PlainValidator(_kv_parts), Swept("parts", _part_set)] = ["keys", "values"]


class Condition(_Model):
    # {variable: values}, and {zip: {variable: values}} for variables advancing together (spec/sweeps.py)
    sweep: Annotated[dict[str, Any], PlainValidator(sweep_section)] = {}
    image: Annotated[Literal["real", "blank", "none"], _one_of(IMAGE_MODES)] = "real"
    interventions: list[InterventionEntry] = []
    kv_swap: KVSwap | None = None
    # a patching scan: layers x position groups of one patch between two conditions (spec/scans.py)
    scan: Scan | None = None

    _axes: tuple = PrivateAttr(())

    @model_validator(mode="before")
    @classmethod
    def _empty_is_default(cls, data: Any) -> Any:
        return {} if data is None else data  # "baseline:" with nothing after it

    @model_validator(mode="after")
    def _vars_are_swept(self) -> "Condition":
        if self.scan is not None:
            problems = own_fields_problems(self)
            if problems:
                _fail_many(problems)
            self._axes = self.scan.axes()
            return self
        self._axes = sweep_axes(self.sweep)
        defined = variables(self._axes)
        problems = [(subpath + path, undefined_var_message(var, defined))
                    for subpath, entry in self.entries() for path, var in var_refs(entry) if var not in defined]
        if problems:
            _fail_many(problems)
        return self

    @property
    def runs_many(self) -> bool:
        """Whether it names several runs (a sweep or a scan): no condition may read it by name."""
        return bool(self.sweep) or self.scan is not None

    @property
    def axes(self) -> tuple:
        """The factors of its sweep's product (`workbench.spec.sweeps.Axis`); () without a sweep."""
        return self._axes

    def entries(self) -> list[tuple[SpecPath, Any]]:
        """(sub-path, entry) of every entry that may hold a '$variable': interventions, kv_swap."""
        found: list[tuple[SpecPath, Any]] = [(("interventions", i), iv) for i, iv in enumerate(self.interventions)]
        return found + ([(("kv_swap",), self.kv_swap)] if self.kv_swap is not None else [])


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

    text_set: Annotated[TextSet, _one_of(TEXT_SETS)] = DEFAULTS["text_set"]
    average_layers: Annotated[AverageLayers, _one_of(AVERAGE_LAYERS)] = DEFAULTS["average_layers"]
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
    # remote: the consecutive samples one NDIF job runs, in one nnsight session (one queue wait for
    # all their conditions, a scan's or a sweep's runs included); 1: a job per sample
    samples_per_job: PositiveInt = 1


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
        problems = _reference_problems(self.conditions) + _sweep_value_problems(self.conditions)
        problems += _site_role_problems(self) + _capture_dim_problems(self) + (_source_cycle_problems(self.conditions) if not problems else [])
        problems += _remote_kind_problems(self) + remote_attribution_problems(self)
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
        """Every concrete condition, sweeps expanded (a product, first variable slowest; a zip
        group advances together), each built when taken."""
        return ConditionSpace(self.conditions)

    def sweep_variables(self) -> list[str]:
        """All sweep variable names, in order of first appearance."""
        return list(dict.fromkeys(var for cond in self.conditions.values() for var in variables(cond.axes)))

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
        if cond.scan is not None:
            problems += scan_problems(name, cond.scan, conditions)
    return problems


def _reference_message(target: str, owner: str, self_ok: bool, conditions: dict[str, Condition]) -> str | None:
    candidates = [c for c, cond in conditions.items() if not cond.runs_many and (self_ok or c != owner)]
    expected = f"one of {', '.join(candidates)}" if candidates else "the name of another condition without a sweep"
    if target == owner and not self_ok:
        return f"condition '{owner}' refers to itself; expected {expected}"
    if target not in conditions:
        return f"unknown condition '{target}'{_did_you_mean(target, conditions)}; expected {expected}"
    if conditions[target].runs_many:
        what = "a sweep" if conditions[target].sweep else "a scan"
        return f"condition '{target}' has {what}, so it names several runs; expected {expected}"
    return None


def _site_role_problems(spec: "Spec") -> list[tuple[SpecPath, str]]:
    """Sites that exist but cannot play the role asked (e.g. `capture: {site: vision}`): refused
    here, so `validate` refuses what `run` would, without loading any model."""
    problems: list[tuple[SpecPath, str]] = []
    captured, editable = capture_sites(), editable_sites()
    for i, item in enumerate(spec.capture):
        if item.site not in captured:
            problems.append((("capture", i, "site"), f"site {item.site!r} cannot be captured; expected one of "
                             f"{', '.join(captured)} (the projector output is 'hidden' at layer 0 on vision rows)"))
    for name, cond in spec.conditions.items():
        for j, iv in enumerate(cond.interventions):
            if iv.site not in editable:
                problems.append((("conditions", name, "interventions", j, "site"),
                                 f"site {iv.site!r} cannot be edited by '{iv.kind}'; expected one of {', '.join(editable)}"))
    return problems


def _capture_dim_problems(spec: "Spec") -> list[tuple[SpecPath, str]]:
    """Captures stored along one layer dim (`layer` and `logit_lens` along `layer`) with other
    explicit layers: the store holds one coordinate per dim. `all` is resolved per model by the
    plan (`workbench.plan`), which refuses the same."""
    problems: list[tuple[SpecPath, str]] = []
    along: dict[str, tuple[int, list[int]]] = {}
    for i, item in enumerate(spec.capture):
        entry = site_entry(item.site) if item.site in capture_sites() else None
        if (entry is None or entry.index is None or item.layers == "all"
                or not any(entry.index in d for d in entry.stores.values())):
            continue
        first, layers = along.setdefault(entry.index, (i, list(item.layers)))
        if list(item.layers) != layers:
            problems.append((("capture", i, "layers"), f"layers {list(item.layers)} differ from capture[{first}]'s "
                             f"{layers}, stored along the same dim {entry.index!r}; expected the same layers"))
    return problems


def _remote_kind_problems(spec: "Spec") -> list[tuple[SpecPath, str]]:
    """A remote backend runs only kinds whose code travels to NDIF (the workbench's own, and a
    plugin's that imports only what NDIF allows); `workbench.backends.remote_checks` refuses the
    same for `--remote`."""
    if spec.backend.kind != "remote":
        return []
    kinds = intervention_kinds()
    problems: list[tuple[SpecPath, str]] = []
    for name, cond in spec.conditions.items():
        for j, iv in enumerate(cond.interventions):
            problem = kinds[iv.kind].remote_problem()
            if problem is not None:
                where = (" runs locally only:" if kinds[iv.kind].builtin
                         else f" comes from plugin module {kinds[iv.kind].module!r}:")
                expected = ("a kind that runs on NDIF with backend kind 'remote' (or run locally)" if kinds[iv.kind].builtin
                            else "a plugin importing only those with backend kind 'remote' (or run locally)")
                problems.append((("conditions", name, "interventions", j, "kind"),
                                 f"kind {iv.kind!r}{where} {problem}; expected {expected}"))
    return problems


def remote_attribution_problems(spec: "Spec", remote: bool = False) -> list[tuple[SpecPath, str]]:
    """Attribution needs gradients, which NDIF does not return (`workbench.attribution`): a scan
    with method: attribution is refused with a remote backend (here for `validate` and a spec's
    backend kind; `workbench.runner.run_spec` asks the same with `remote` for `run --remote`)."""
    if spec.backend.kind != "remote" and not remote:
        return []
    return [(("conditions", name, "scan", "method"), ATTRIBUTION_REMOTE) for name, cond in spec.conditions.items()
            if cond.scan is not None and cond.scan.method == "attribution"]


ATTRIBUTION_REMOTE = ("attribution patching needs gradients (a backward pass through the model), which NDIF does not "
                      "return (its traces run under inference mode and send back saved values only); expected backend "
                      "kind 'local' for it, or method: patching (real patching) remotely")


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


def _sweep_value_problems(conditions: dict[str, Condition]) -> list[tuple[SpecPath, str]]:
    """Every swept run's entries, validated as hand-written ones (each distinct value of a
    variable once, located at the first run holding it: `workbench.spec.sweeps.value_problems`)."""
    problems = [problem for base, cond in conditions.items() if cond.sweep
                for problem in value_problems(base, cond.entries(), cond.axes)]
    for base, cond in conditions.items():  # a scan's patch, checked at each layer and group once
        if cond.scan is not None:
            problems += scan_value_problems(base, cond.scan)
    return problems


def condition_runs(condition: Condition) -> int:
    """How many runs a condition expands to (1 without a sweep)."""
    return run_count(condition.axes)
