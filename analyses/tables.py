"""Tables of a store: the pieces every analysis's table is built from, and the store-wide
commands that run them (`analyze`: markdown; `build_tables`: with xarray data over a `model` dim).

Every number is an estimate with its 95% bootstrap CI over samples, written `value [low, high]`
(`Cell`). An analysis's table builder (`analyses.builtin.*`, or a plugin's) makes a `Builder`,
whose `run(models, need, fill)` calls `fill(model, ds)` for every model whose inputs `need(ds)`
finds (`missing`, `sweep_conditions`, `lacks_modalities` say what a model lacks) and adds the
notes every table has: what was left out and why, the samples per model, the definitions in force.

A table whose inputs (variables or conditions) a model lacks leaves that model out with one line
saying what is missing; a table no model can fill is skipped with that line. Within a column every
number has the same format: fixed decimals, or scientific notation for the whole column when one
of its numbers would print as zero.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable

import numpy as np
import xarray as xr

from workbench.definitions import describe as describe_definitions
from workbench.definitions import resolve as resolve_definitions
from workbench.progress import progress_bar
from workbench.store import list_models

from .bootstrap import MIN_SAMPLES, N_RESAMPLES, SEED, SMALL_SAMPLES
from .cache import MissingInputs, forcing, open_model
from .registry import analyses, names as analysis_names
from .streaming import as_str, condition_sort_key, layout


@dataclass
class Options:
    """Condition names and bootstrap settings shared by every table."""

    reference: str = "baseline"     # the real image, unmodified
    blank: str = "blank"            # blank image of the same size
    text_only: str = "none"         # image removed
    hybrid: str = "hybrid"          # real image, decoding from the blank image's visual KV cache
    self_swap: str = "self_swap"    # control: the real image decoding from its own KV cache
    swaps: tuple[str, ...] = ()     # more KV-swap conditions reported beside `hybrid` (e.g. a parts sweep's)
    sweep: str = "alpha"            # the swept variable of the α tables
    step: int = 0                   # decode step of the KLs and ranks
    metric: str = "kl"              # the patching scans' metric: kl, logit_diff or answer_logprob (analyses.patching)
    tokens: tuple[int, int] | None = None  # the two token ids of the logit difference
    n_resamples: int = N_RESAMPLES
    seed: int = SEED
    force: bool = False             # recompute cached analyses
    samples: tuple[str, ...] = ()   # samples drawn over their images (`image-overlays`; none named: the first few)
    figure_format: str = "png"      # the figures' files: png, svg or pdf (analyses.commands.FIGURE_FORMATS)
    label: str = "category"         # the per-sample field the probes decode (`run_<label>`)
    where: str | None = None        # FIELD=VALUE: probe only the samples with that value
    sae: tuple[str, ...] = ()       # SAE directories (SAELens's format) the `sae` analysis encodes with
    # overrides of the definitions a store holds (workbench.definitions): text_set, average_layers, rank_base
    definitions: dict[str, Any] = field(default_factory=dict)

    def boot(self) -> dict[str, Any]:
        return {"n_resamples": self.n_resamples, "seed": self.seed}

    def definitions_for(self, ds: xr.Dataset) -> dict[str, Any]:
        """The definitions in force for one model: the store's (from its run's spec), then these overrides."""
        return resolve_definitions(ds.attrs.get("definitions"), self.definitions)


@dataclass
class Table:
    name: str
    title: str
    columns: list[str]
    rows: list[list["str | Cell"]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: xr.Dataset | None = None
    skipped: str | None = None

    def formatted_rows(self) -> list[list[str]]:
        """The rows as text, each column of estimates in one format (`Cell.format`)."""
        scientific = {j for j in range(len(self.columns))
                      if any(isinstance(c := row[j], Cell) and c.needs_scientific() for row in self.rows)}
        return [[c.format(j in scientific) if isinstance(c, Cell) else str(c) for j, c in enumerate(row)]
                for row in self.rows]

    def markdown(self) -> str:
        if self.skipped:
            return f"*{self.title}: skipped — {self.skipped}*"
        lines = [f"### {self.title}", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join("---" for _ in self.columns) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.formatted_rows()]
        if self.notes:
            lines += [""] + [f"{note}  " for note in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class Cell:
    """An estimate with its CI, formatted with its column (`Table.formatted_rows`): `value [low,
    high]` with `digits` decimals, or in scientific notation where fixed decimals would print a
    non-zero number as 0.00; `n/a` when there is no estimate; `value (n = 1, no CI)` when too few
    samples give no interval (`analyses.bootstrap.MIN_SAMPLES`)."""

    value: float
    low: float
    high: float
    digits: int = 2
    n: int | None = None  # samples behind the estimate, where known

    def needs_scientific(self) -> bool:
        if not math.isfinite(self.value):
            return False
        numbers = [abs(x) for x in (self.value, self.low, self.high) if math.isfinite(x)]
        return 0 < max(numbers) < 0.5 * 10.0**-self.digits

    def format(self, scientific: bool | None = None) -> str:
        if not math.isfinite(self.value):
            return "n/a"
        scientific = self.needs_scientific() if scientific is None else scientific

        def fmt(x: float) -> str:
            if scientific:
                return f"{x:.1e}"
            return f"{round(x, self.digits) + 0.0:.{self.digits}f}"  # + 0.0: no "-0.000"

        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{fmt(self.value)} ({'' if self.n is None else f'n = {self.n}, '}no CI)"
        return f"{fmt(self.value)} [{fmt(self.low)}, {fmt(self.high)}]"

    def __str__(self) -> str:
        return self.format()


def estimate(summary: xr.DataArray, digits: int = 2) -> Cell:
    """A table cell: the estimate and CI of a summarized scalar (dim `stat`)."""
    v, lo, hi = (float(summary.sel(stat=s)) for s in ("value", "ci_low", "ci_high"))
    return Cell(v, lo, hi, digits, _n(summary) if any(str(c).startswith("n_samples") for c in summary.coords) else None)


def cell(summary: xr.DataArray, digits: int = 2) -> str:
    """`value [low, high]` of a summarized scalar on its own (in a table, its column decides)."""
    return str(estimate(summary, digits))


def _ci_note(options: Options, counts: dict[str, set[int]], medians: bool = False) -> str:
    per_model = "; ".join(f"{m}: n = {', '.join(str(n) for n in sorted(ns))}" for m, ns in counts.items() if ns)
    what = "means over samples (median rank: the median)" if medians else "means over samples"
    note = (f"Estimates are {what} with a 95% bootstrap CI over samples in brackets "
            f"({options.n_resamples} resamples, seed {options.seed}); samples per model: {per_model}.")
    fewest = min((n for ns in counts.values() for n in ns if n > 0), default=None)
    if fewest is not None and fewest < MIN_SAMPLES:
        note += (f" An estimate from fewer than {MIN_SAMPLES} samples has no interval (one sample resamples only "
                 "to itself): it is marked 'no CI'; run more samples for one.")
    if fewest is not None and fewest < SMALL_SAMPLES:
        note += (f" With fewer than {SMALL_SAMPLES} samples the intervals are rough: a bootstrap interval is too "
                 "narrow at that size (it covers the true value less often than 95%).")
    return note


def _n(estimate: xr.DataArray) -> int:
    for name in estimate.coords:
        if str(name).startswith("n_samples"):
            return int(estimate[name].max())
    return 0


def missing(ds: xr.Dataset, variables: tuple[str, ...] = (), conditions: tuple[str, ...] = (),
             layers: tuple[int, ...] = ()) -> list[str]:
    missing = [v for v in variables if v not in ds.data_vars]
    present = set()
    for dim in ("token", "run"):
        present |= set(layout(ds, dim).conditions)
    missing += [f"condition {c!r}" for c in conditions if c not in present]
    if layers and "hidden" in ds.data_vars:
        stored = set(np.asarray(ds["layer"].values).tolist()) if "layer" in ds.coords else set()
        missing += [f"layer {l}" for l in layers if l not in stored]
    return missing


def sweep_conditions(ds: xr.Dataset, sweep: str, dim: str = "token") -> list[tuple[str, float, str]]:
    """(condition, swept value, label) of every condition with a value of `sweep`, by value."""
    lay = layout(ds, dim)
    values = lay.sweep.get(sweep, {})
    out = []
    for condition in lay.conditions:
        value = values.get(condition, math.nan)
        if math.isfinite(value):
            others = [f"{k}={v[condition]:g}" for k, v in lay.sweep.items()
                      if k != sweep and math.isfinite(v.get(condition, math.nan))]
            out.append((condition, value, f"{value:g}" + (f" ({', '.join(others)})" if others else "")))
    return sorted(out, key=lambda t: (t[1], condition_sort_key(t[0])))


def sweep_name(sweep: str) -> str:
    return "α" if sweep == "alpha" else sweep


def _with_model(data: xr.Dataset, model: str) -> xr.Dataset:
    """`data` with a leading `model` dim on every variable and non-index coordinate."""
    data = data.expand_dims(model=[model])
    extra = {c: data[c].variable.expand_dims("model") for c in data.coords if c not in data.indexes}
    return data.assign_coords(extra)


def _shared_coords(datasets: list[xr.Dataset]) -> list[xr.Dataset]:
    """Each model's data with every non-index coordinate another model's has (a sweep variable
    one model ran and another did not: NaN, or "" for words), so they concatenate."""
    held: dict[str, xr.DataArray] = {}
    for data in datasets:
        held.update({str(c): data[c] for c in data.coords if c not in data.indexes and c not in held})
    out = []
    for data in datasets:
        extra = {}
        for name, coord in held.items():
            if name in data.coords or any(d not in data.dims for d in coord.dims):
                continue
            fill = "" if coord.dtype.kind in "UOT" else np.nan
            shape = tuple(data.sizes[d] for d in coord.dims)
            extra[name] = (coord.dims, np.full(shape, fill, dtype=object if fill == "" else float))
        out.append(data.assign_coords(extra) if extra else data)
    return out


EXCLUDED_COLUMN = "samples excluded (non-finite)"


def without_nonfinite(ds: xr.Dataset) -> tuple[xr.Dataset, int]:
    """`ds` without every sample that has a NaN or Inf capture in any condition (the store's
    `nonfinite` count per run), and how many samples that drops. A sample goes from every
    condition at once, so comparisons between conditions stay paired."""
    if "nonfinite" not in ds.data_vars or "run" not in ds.dims:
        return ds, 0
    flagged = np.asarray(ds["nonfinite"].values) > 0
    if not flagged.any():
        return ds, 0
    bad = set(as_str(ds["run_sample"].values)[flagged].tolist())
    keep_tokens = ~np.isin(as_str(ds["sample"].values), list(bad))
    keep_runs = ~np.isin(as_str(ds["run_sample"].values), list(bad))
    rows: dict[Hashable, np.ndarray] = {"token": keep_tokens, "run": keep_runs}
    if "patch_sample" in ds.coords:  # vision-tower rows (the norm atlas)
        rows[ds["patch_sample"].dims[0]] = ~np.isin(as_str(ds["patch_sample"].values), list(bad))
    return ds.isel(rows), len(bad)


class Builder:
    """Runs one table over every model: rows from `fill(model, ds)`, a line for every model that
    lacks inputs, the whole table skipped if none has them."""

    def __init__(self, name: str, title: str, columns: list[str], options: Options, medians: bool = False):
        self.table = Table(name, title, [*columns, EXCLUDED_COLUMN])
        self.options = options
        self.medians = medians  # the CI note says a median rank is a median
        self.missing: list[str] = []
        self.counts: dict[str, set[int]] = {}
        self.data: list[xr.Dataset] = []

    def run(self, models: dict[str, xr.Dataset], need: Callable[[xr.Dataset], list[str]],
            fill: Callable[[str, xr.Dataset], xr.Dataset | None], first_note: str | None = None) -> Table:
        in_force: dict[str, str] = {}
        for model, ds in models.items():
            lacking = need(ds)
            if lacking:
                self.missing.append(f"{model}: needs {', '.join(lacking)}")
                continue
            in_force[model] = describe_definitions(self.options.definitions_for(ds))
            ds, excluded = without_nonfinite(ds)
            first_row = len(self.table.rows)
            try:
                data = fill(model, ds)
            except MissingInputs as err:
                self.missing.append(f"{model}: {err}")
                continue
            for row in self.table.rows[first_row:]:
                row.append(str(excluded))
            if data is not None:
                self.data.append(_with_model(data, model))
        table = self.table
        if not table.rows:
            table.skipped = "; ".join(self.missing) or "no model in the store"
            return table
        table.notes += [first_note] if first_note else []  # what the table measures, before the CI note
        table.notes.append(_ci_note(self.options, self.counts, medians=self.medians))
        table.notes += [f"Not shown: {m}." for m in self.missing]
        if len(set(in_force.values())) == 1:
            table.notes.append(next(iter(in_force.values())))
        else:
            table.notes += [f"{model}: {line}" for model, line in in_force.items()]
        if self.data:
            table.data = xr.concat(_shared_coords(self.data), dim="model", join="outer", coords="minimal",
                                   compat="override", combine_attrs="drop_conflicts")
        return table

    def count(self, model: str, *estimates: xr.DataArray) -> None:
        self.counts.setdefault(model, set()).update(_n(e) for e in estimates)


def modalities(ds: xr.Dataset, condition: str) -> set[str]:
    """The modalities with tokens under `condition` (a text-only model or `image: none` has no vision)."""
    if "modality" not in ds.coords or "condition" not in ds.coords:
        return set()
    where = as_str(ds["condition"].values) == condition
    return set(as_str(ds["modality"].values)[where].tolist())


def lacks_modalities(ds: xr.Dataset, condition: str, wanted: tuple[str, ...] = ("vision", "text")) -> list[str]:
    present = modalities(ds, condition)
    return [f"{m} tokens under {condition!r}" for m in wanted if m not in present]


def extreme_head(summary: xr.DataArray, dim: str, largest: bool = True) -> str:
    """`head h: value [CI]` of the head along `dim` with the largest (or smallest) mean over
    samples; n/a where no head has a value."""
    values = summary.sel(stat="value")
    if not np.isfinite(values).any():
        return "n/a"
    h = int(values.fillna(-np.inf).argmax(dim) if largest else values.fillna(np.inf).argmin(dim))
    return f"head {h}: {estimate(summary.sel({dim: h}), 3)}"


def modality_rows(b: Builder, model: str, data: xr.Dataset, dim: str, measures: tuple[str, ...]) -> None:
    """One row per label of `dim`: each measure on vision tokens, then each on text tokens."""
    for layer in data[dim].values:
        row = data.sel({dim: layer})
        cells = [estimate(row[name].sel(modality=modality), 3) if modality in row.modality else "n/a"
                 for modality in ("vision", "text") for name in measures]
        b.table.rows.append([model, str(int(layer)), *cells])
        b.count(model, row[measures[0]])


def open_models(store: str | Path, models: list[str] | None = None) -> dict[str, xr.Dataset]:
    """Every model of the store (or `models`), opened for cached analyses."""
    return {m: open_model(store, m) for m in (models or list_models(store))}


def build_tables(store: str | Path, names: list[str] | tuple[str, ...] | None = None, options: Options | None = None,
                 models: list[str] | None = None, opened: dict[str, xr.Dataset] | None = None,
                 progress: bool = False) -> list[Table]:
    """The named tables (default: every registered analysis's, in order) of a store (`opened`: its models,
    already opened with `open_models`); progress: a bar over them (on a terminal, `workbench.progress`)."""
    options = options or Options()
    builders = {a.name: a.table for a in analyses()}
    names = list(names or builders)
    unknown = [n for n in names if n not in builders]
    if unknown:
        raise ValueError(f"unknown table(s) {', '.join(unknown)}; choose from {', '.join(analysis_names())}")
    opened = open_models(store, models) if opened is None else opened
    tables = []
    with forcing() if options.force else contextlib.nullcontext(), \
            progress_bar(len(names), desc="analyze", unit="table", enabled=progress) as bar:
        for name in names:
            bar.set_postfix_str(name, refresh=False)
            tables.append(builders[name](opened, options))
            bar.update(1)
    return tables


def analyze(store: str | Path, names: list[str] | tuple[str, ...] | None = None, options: Options | None = None,
            models: list[str] | None = None, progress: bool = False) -> str:
    """The tables as one markdown document (what `workbench analyze` prints)."""
    tables = build_tables(store, names, options, models, progress=progress)
    return "\n\n".join(t.markdown() for t in tables) + "\n"
