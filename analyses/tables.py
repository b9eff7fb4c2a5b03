"""The study's tables, over every model of a store, as markdown and as labeled xarray data.

Every number is an estimate with its 95% bootstrap CI over samples, written `value [low, high]`.
Each table is built from the per-model functions of the analysis modules, so a Python user gets
the same numbers from e.g. `analyses.norms.vision_text_ratio(ds)`:

| table             | rows                 | columns (function)                                                   |
|-------------------|----------------------|-----------------------------------------------------------------------|
| `norm-ratio`      | model                | vision/text norm ratio at layer 0 (`norms.vision_text_ratio`)         |
| `first-update`    | model × modality     | ‖u₁‖/‖h₀‖ (`updates.relative_update`), cos(h₁,h₀) (`rotation.cosine_to_first`) |
| `correlation`     | model                | per compared condition: norm and cosine text-curve r (`correlation.text_curve_correlation`) |
| `alpha`           | model × α            | norm ratio, attention KL (`attention.vision_attention_kl`), logit KL (`logits.logit_kl`), median rank (`logits.median_rank`) |
| `kv-cosine`       | model × α            | cos(K′,K), cos(V′,V) at vision tokens (`kv.kv_cosine`)                |
| `kv-substitution` | model × KV-swap condition | D_KL(real‖hybrid), D_KL(blank‖hybrid), D_KL(real‖blank), D_KL(real‖self-swap) (`kv.kv_substitution`) |
| `depth`           | model × layer        | mean ‖h_l‖₂ and ‖h_l − h_{l−1}‖₂/‖h_{l−1}‖₂ over all tokens (`residual.residual_geometry`; `depth` has the per-token versions) |
| `atlas`           | model (one per family) | norms across the interface: vision layers, tower output, connector output, text, embedding table, boundary tokens, ratio (`atlas.norm_atlas`) |
| `update-decomposition` | model × decoder layer | ‖a_l‖/‖h_l‖, ‖m_l‖/‖h_l‖ per modality (`branches.update_decomposition`) |
| `logit-lens`      | model × layer        | lens top-1 = final top-1, lens top-1 probability per modality (`lens.logit_lens`) |
| `trajectories`    | model × α × layer    | vision ‖h_l‖₂, cos(h_l, h_l^ref) (`trajectories.vision_trajectories`) |
| `accuracy`        | model × condition    | task accuracy of the greedy response, overall and per category, samples unscored (`accuracy.accuracy`) |

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
from typing import Any, Callable

import numpy as np
import xarray as xr

from workbench.definitions import describe as describe_definitions
from workbench.definitions import resolve as resolve_definitions
from workbench.store import StoreError, list_models

from . import accuracy, atlas, attention, branches, correlation, heads, kv, lens, logits, norms, rotation, trajectories, updates
from .bootstrap import N_RESAMPLES, SEED
from .cache import MissingInputs, forcing, open_model
from .registry import ANALYSES, NAMES
from .streaming import as_str, condition_sort_key, layer_mean, layout

TABLES = NAMES  # in the registry's (the study's) order


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
    n_resamples: int = N_RESAMPLES
    seed: int = SEED
    force: bool = False             # recompute cached analyses
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
                      if any(isinstance(row[j], Cell) and row[j].needs_scientific() for row in self.rows)}
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
    non-zero number as 0.00; `n/a` when there is no estimate."""

    value: float
    low: float
    high: float
    digits: int = 2

    def needs_scientific(self) -> bool:
        if not math.isfinite(self.value):
            return False
        return 0 < max(abs(self.value), abs(self.high), abs(self.low)) < 0.5 * 10.0**-self.digits

    def format(self, scientific: bool | None = None) -> str:
        if not math.isfinite(self.value):
            return "n/a"
        scientific = self.needs_scientific() if scientific is None else scientific

        def fmt(x: float) -> str:
            if scientific:
                return f"{x:.1e}"
            return f"{round(x, self.digits) + 0.0:.{self.digits}f}"  # + 0.0: no "-0.000"

        return f"{fmt(self.value)} [{fmt(self.low)}, {fmt(self.high)}]"

    def __str__(self) -> str:
        return self.format()


def estimate(summary: xr.DataArray, digits: int = 2) -> Cell:
    """A table cell: the estimate and CI of a summarized scalar (dim `stat`)."""
    v, lo, hi = (float(summary.sel(stat=s)) for s in ("value", "ci_low", "ci_high"))
    return Cell(v, lo, hi, digits)


def cell(summary: xr.DataArray, digits: int = 2) -> str:
    """`value [low, high]` of a summarized scalar on its own (in a table, its column decides)."""
    return str(estimate(summary, digits))


def _ci_note(options: Options, counts: dict[str, set[int]], medians: bool = False) -> str:
    per_model = "; ".join(f"{m}: n = {', '.join(str(n) for n in sorted(ns))}" for m, ns in counts.items() if ns)
    what = "means over samples (median rank: the median)" if medians else "means over samples"
    return (f"Estimates are {what} with a 95% bootstrap CI over samples in brackets "
            f"({options.n_resamples} resamples, seed {options.seed}); samples per model: {per_model}.")


def _n(estimate: xr.DataArray) -> int:
    for name in estimate.coords:
        if str(name).startswith("n_samples"):
            return int(estimate[name].max())
    return 0


def _missing(ds: xr.Dataset, variables: tuple[str, ...] = (), conditions: tuple[str, ...] = (),
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


def _sweep_conditions(ds: xr.Dataset, sweep: str, dim: str = "token") -> list[tuple[str, float, str]]:
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


def _sweep_name(sweep: str) -> str:
    return "α" if sweep == "alpha" else sweep


def _with_model(data: xr.Dataset, model: str) -> xr.Dataset:
    """`data` with a leading `model` dim on every variable and non-index coordinate."""
    data = data.expand_dims(model=[model])
    extra = {c: data[c].variable.expand_dims("model") for c in data.coords if c not in data.indexes}
    return data.assign_coords(extra)


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
    rows = {"token": keep_tokens, "run": keep_runs}
    if "patch_sample" in ds.coords:  # vision-tower rows (the norm atlas)
        rows[ds["patch_sample"].dims[0]] = ~np.isin(as_str(ds["patch_sample"].values), list(bad))
    return ds.isel(rows), len(bad)


class _Builder:
    """Runs one table over every model: rows from `fill(model, ds)`, a line for every model that
    lacks inputs, the whole table skipped if none has them."""

    def __init__(self, name: str, title: str, columns: list[str], options: Options):
        self.table = Table(name, title, [*columns, EXCLUDED_COLUMN])
        self.options = options
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
        table.notes.append(_ci_note(self.options, self.counts, medians=table.name == "alpha"))
        table.notes += [f"Not shown: {m}." for m in self.missing]
        if len(set(in_force.values())) == 1:
            table.notes.append(next(iter(in_force.values())))
        else:
            table.notes += [f"{model}: {line}" for model, line in in_force.items()]
        if self.data:
            table.data = xr.concat(self.data, dim="model", join="outer", coords="minimal", compat="override",
                                   combine_attrs="drop_conflicts")
        return table

    def count(self, model: str, *estimates: xr.DataArray) -> None:
        self.counts.setdefault(model, set()).update(_n(e) for e in estimates)


# -- the tables --------------------------------------------------------------------------------


def norm_ratio_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref = options.reference
    b = _Builder("norm-ratio", f"Vision/text norm ratio at the LLM input (layer 0, condition {ref})",
                 ["model", "vision/text norm ratio"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        ratio = norms.vision_text_ratio(ds, layer=0, text_set=text_set, **options.boot()).sel(condition=ref)
        b.table.rows.append([model, estimate(ratio, 2)])
        b.count(model, ratio)
        return ratio.to_dataset(name="norm_ratio")

    return b.run(models, lambda ds: _missing(ds, ("hidden",), (ref,), (0,)) + _lacks_modalities(ds, ref), fill)


def _modalities(ds: xr.Dataset, condition: str) -> set[str]:
    """The modalities with tokens under `condition` (a text-only model or `image: none` has no vision)."""
    if "modality" not in ds.coords or "condition" not in ds.coords:
        return set()
    where = as_str(ds["condition"].values) == condition
    return set(as_str(ds["modality"].values)[where].tolist())


def _lacks_modalities(ds: xr.Dataset, condition: str, wanted: tuple[str, ...] = ("vision", "text")) -> list[str]:
    present = _modalities(ds, condition)
    return [f"{m} tokens under {condition!r}" for m in wanted if m not in present]


def first_update_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref = options.reference
    b = _Builder("first-update", f"Relative first update and rotation (layer 1, condition {ref})",
                 ["model", "modality", "‖u₁‖/‖h₀‖", "cos(h₁,h₀)"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        rel = updates.relative_update(ds, text_set=text_set, **options.boot()).sel(condition=ref, layer=1)
        cos = rotation.cosine_to_first(ds, text_set=text_set, **options.boot()).sel(condition=ref, layer=1)
        for modality in [m for m in ("vision", "text") if m in _modalities(ds, ref)]:
            b.table.rows.append([model, modality.capitalize(), estimate(rel.sel(modality=modality), 2),
                                 estimate(cos.sel(modality=modality), 2)])
            b.count(model, rel.sel(modality=modality), cos.sel(modality=modality))
        return xr.Dataset({"relative_update": rel.drop_vars("n_samples"), "cos_first": cos.drop_vars("n_samples")})

    return b.run(models, lambda ds: _missing(ds, ("hidden",), (ref,), (0, 1)), fill)


def correlation_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref = options.reference
    wanted = [options.blank, options.text_only]
    present = [c for c in wanted if any(c in layout(ds).conditions for ds in models.values())]
    columns = ["model"] + [f"{ref}–{c} {m} r" for c in present for m in ("norms", "cosine")]
    b = _Builder("correlation", f"Correlation of text-token curves across layers ({ref} vs "
                 f"{', '.join(present) or ' / '.join(wanted)})", columns, options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("hidden",), (ref,))
        if not lacking and not set(present) & set(layout(ds).conditions):
            lacking = [f"condition {' or '.join(repr(c) for c in wanted)}"]
        if not lacking and ds.sizes.get("layer", 0) < 3:  # a correlation over 2 points is always ±1
            held = ", ".join(str(int(l)) for l in ds["layer"].values)
            lacking = [f"three or more layers for a correlation over layers (the store holds layer {held})"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        r = correlation.text_curve_correlation(ds, ref, present, text_set=text_set, **options.boot())
        row = [model]
        for c in present:
            for metric in ("norm", "cosine"):
                row.append(estimate(r[metric].sel(condition=c), 4) if c in r.condition.values else "n/a")
            if c in r.condition.values:
                b.count(model, r["norm"].sel(condition=c))
        b.table.rows.append(row)
        return r

    return b.run(models, need, fill, first_note=(
        "Pearson r over layers between a sample's mean text-token curve under the two "
        "conditions (norm ‖h_l‖ and cos(h_l, h_0)), averaged over samples."))


def alpha_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref, sweep = options.reference, options.sweep
    b = _Builder("alpha", f"Scaling the projector output by {sweep} (against {ref}; step {options.step})",
                 ["model", sweep if sweep != "alpha" else "α", "vision/text norm ratio", "attention KL", "logit KL",
                  "median rank"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("hidden", "decode_attention", "logprobs"), (ref,), (0,))
        if not lacking and not _sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = _sweep_conditions(ds, sweep)
        names = [c for c, _, _ in conditions]
        defs = options.definitions_for(ds)
        parts = {
            "norm_ratio": norms.vision_text_ratio(ds, layer=0, text_set=defs["text_set"], **options.boot()),
            "attention_kl": attention.vision_attention_kl(ds, ref, options.step, average_layers=defs["average_layers"],
                                                          **options.boot()),
            "logit_kl": logits.logit_kl(ds, ref, options.step, **options.boot()),
            "median_rank": logits.median_rank(ds, ref, options.step, rank_base=defs["rank_base"], **options.boot()),
        }
        parts = {k: v.reindex(condition=names) for k, v in parts.items()}
        for condition, _, label in conditions:
            row = {k: v.sel(condition=condition) for k, v in parts.items()}
            b.table.rows.append([model, label, estimate(row["norm_ratio"], 2), estimate(row["attention_kl"], 2),
                                 estimate(row["logit_kl"], 2), estimate(row["median_rank"], 1)])
            b.count(model, *row.values())
        return xr.Dataset({k: v.rename(n_samples=f"n_samples_{k}") for k, v in parts.items()})

    return b.run(models, need, fill)


def kv_cosine_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref, sweep = options.reference, options.sweep
    b = _Builder("kv-cosine", f"Vision-token keys and values against {ref} (mean over layers)",
                 ["model", sweep if sweep != "alpha" else "α", "cos(K′,K)", "cos(V′,V)"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("keys", "values"), (ref,))
        if not lacking and not _sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = _sweep_conditions(ds, sweep)
        average_layers = options.definitions_for(ds)["average_layers"]
        data = kv.kv_cosine(ds, ref, "vision", average_layers=average_layers, **options.boot())
        data = data.reindex(condition=[c for c, _, _ in conditions])
        for condition, _, label in conditions:
            row = data.sel(condition=condition)
            b.table.rows.append([model, label, estimate(row["cos_k"], 3), estimate(row["cos_v"], 3)])
            b.count(model, row["cos_k"], row["cos_v"])
        return data

    return b.run(models, need, fill)


def _extreme_head(summary: xr.DataArray, dim: str, largest: bool = True) -> str:
    """`head h: value [CI]` of the head along `dim` with the largest (or smallest) mean over
    samples; n/a where no head has a value."""
    values = summary.sel(stat="value")
    if not np.isfinite(values).any():
        return "n/a"
    h = int(values.fillna(-np.inf).argmax(dim) if largest else values.fillna(np.inf).argmin(dim))
    return f"head {h}: {estimate(summary.sel({dim: h}), 3)}"


def kv_heads_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Head-resolved cos(K′,K) and cos(V′,V) at vision tokens per swept condition: the mean over
    KV heads and the lowest head (each head's cosine averaged over the layers the definitions
    name, per sample, then over samples)."""
    from .bootstrap import summarize

    ref, sweep = options.reference, options.sweep
    b = _Builder("kv-heads", f"Vision-token keys and values per KV head against {ref} (mean over layers)",
                 ["model", sweep if sweep != "alpha" else "α", "cos(K′,K), head mean", "lowest K head",
                  "cos(V′,V), head mean", "lowest V head"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("keys", "values"), (ref,))
        if not lacking and "kv_heads" not in ds.attrs:
            lacking = ["the model's kv_heads attr"]
        if not lacking and not _sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = [c for c, _, _ in _sweep_conditions(ds, sweep)]
        average_layers = options.definitions_for(ds)["average_layers"]
        values = kv.kv_cosine_heads_per_sample(ds, ref, force=options.force).sel(modality="vision", drop=True)
        values = layer_mean(values, average_layers).sel(condition=conditions)
        by_head = summarize(values, **options.boot())
        head_mean = summarize(values.mean("kv_head"), **options.boot())
        for condition, _, label in _sweep_conditions(ds, sweep):
            cells = []
            for name in ("cos_k", "cos_v"):
                cells += [estimate(head_mean[name].sel(condition=condition), 3),
                          _extreme_head(by_head[name].sel(condition=condition), "kv_head", largest=False)]
            b.table.rows.append([model, label, *cells])
            b.count(model, head_mean["cos_k"].sel(condition=condition))
        return xr.Dataset({"cos_k_by_head": by_head["cos_k"], "cos_v_by_head": by_head["cos_v"]})

    return b.run(models, need, fill, first_note=(
        "Per KV head h: the cosine of the head's head_dim-wide key (value) vector with the same "
        "token of the reference, over a sample's vision tokens; the lowest head is the one with "
        "the smallest mean over samples. analyses.kv.kv_cosine_heads_per_sample has every layer."))


def kv_substitution_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    real, blank, own = options.reference, options.blank, options.self_swap
    swaps = list(dict.fromkeys((options.hybrid, *options.swaps)))
    b = _Builder("kv-substitution", f"KV-cache substitution ({', '.join(swaps)}: {real} image decoding from the "
                 f"{blank} image's KV cache; step {options.step})",
                 ["model", "condition", "D_KL(z_real ‖ z_hybrid)", "D_KL(z_blank ‖ z_hybrid)", "D_KL(z_real ‖ z_blank)",
                  "D_KL(z_real ‖ z_self)"], options)

    def present(ds: xr.Dataset) -> list[str]:
        return [c for c in swaps if c in layout(ds, "run").conditions]

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("logprobs",), (real, blank))
        if not present(ds):
            lacking.append(f"condition {' or '.join(repr(c) for c in swaps)}")
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        rows = []
        for hybrid in present(ds):
            data = kv.kv_substitution(ds, real, blank, hybrid, options.step, self_swap=own, **options.boot())
            control = estimate(data["kl_real_self"], 3) if "kl_real_self" in data else "n/a"
            b.table.rows.append([model, hybrid, estimate(data["kl_real_hybrid"], 3), estimate(data["kl_blank_hybrid"], 3),
                                 estimate(data["kl_real_blank"], 3), control])
            b.count(model, data["kl_real_hybrid"])
            rows.append(data.expand_dims(condition=[hybrid]))
        return xr.concat(rows, dim="condition", join="outer")

    return b.run(models, need, fill, first_note=(
        f"z_hybrid: the row's condition. D_KL(z_real ‖ z_blank) is the scale the hybrid KLs read "
        f"against (the whole image replaced); D_KL(z_real ‖ z_self) is the control {own!r} (the "
        "sample as its own donor), which must be 0 up to float round-off (n/a: no such condition "
        "stored)."))


def depth_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Norm growth and per-layer update size with depth over all tokens of the reference condition
    (each sample's token mean, then the mean over samples with its CI)."""
    from .bootstrap import summarize
    from .residual import residual_geometry

    ref = options.reference
    b = _Builder("depth", f"Residual-stream norm and update size by depth (all tokens, condition {ref})",
                 ["model", "layer", "mean ‖h_l‖₂", "‖h_l − h_(l−1)‖₂ / ‖h_(l−1)‖₂"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("hidden",), (ref,))
        if not lacking and ds.sizes.get("layer", 0) < 2:
            lacking = [f"two or more layers (the store holds layer {', '.join(str(int(l)) for l in ds['layer'].values)})"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        geometry = residual_geometry(ds, force=options.force).sel(condition=ref)
        tokens = geometry["tokens"]
        weights = tokens / tokens.sum("modality")  # each modality by its share of a sample's tokens
        per_sample = xr.Dataset({name: (geometry[name] * weights).sum("modality", min_count=1)
                                 .where(np.isfinite(geometry[name]).any("modality"))
                                 for name in ("norm", "relative_update")})
        data = summarize(per_sample, **options.boot())
        for layer in data.layer.values:
            row = data.sel(layer=layer)
            b.table.rows.append([model, str(int(layer)), estimate(row["norm"], 2), estimate(row["relative_update"], 3)])
            b.count(model, row["norm"])
        return data

    return b.run(models, need, fill, first_note=(
        "h_l: the residual stream after l decoder layers (0 = the LLM input). The ratio at "
        "layer l is what the l-th decoder layer wrote relative to the stream it read (n/a at "
        "layer 0, or where layer l−1 is not stored). Per-token values and massive "
        "activations: analyses.depth."))


def heads_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Per decoder layer: the text→vision attention mass averaged over heads and its largest head,
    and the attention-sink mass of the decode step (`analyses.heads`), in the reference condition."""
    from .bootstrap import summarize

    ref = options.reference
    b = _Builder("heads", f"Attention per head: text→vision mass and the sink (condition {ref}, decode step "
                 f"{options.step})", ["model", "layer", "text→vision mass, head mean", "most vision-attending head",
                                      "sink mass (first position), head mean", "largest sink head"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, (), (ref,))
        if "prefill_vision_mass" not in ds.data_vars and "decode_attention" not in ds.data_vars:
            lacking.append("prefill_vision_mass or decode_attention (capture `attention`)")
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        per_head = {}
        if "prefill_vision_mass" in ds.data_vars:
            per_head["vision_mass"] = heads.head_vision_mass(ds, force=options.force)["mass"].sel(
                condition=ref, modality="text")
        if "decode_attention" in ds.data_vars:
            per_head["sink"] = heads.attention_sink(ds, force=options.force)["sink"].sel(condition=ref, step=options.step)
        per_head = {k: v.drop_vars(["condition", "modality", "step"], errors="ignore") for k, v in per_head.items()}
        by_head = {k: summarize(v, **options.boot()) for k, v in per_head.items()}
        head_mean = {k: summarize(v.mean("head"), **options.boot()) for k, v in per_head.items()}
        layers = next(iter(per_head.values()))["decoder_layer"].values
        for layer in layers:
            cells = []
            for name in ("vision_mass", "sink"):
                mean = head_mean.get(name)
                cells += [estimate(mean.sel(decoder_layer=layer), 3) if mean is not None else "n/a",
                          _extreme_head(by_head[name].sel(decoder_layer=layer), "head") if name in by_head else "n/a"]
            b.table.rows.append([model, str(int(layer)), *cells])
            b.count(model, *(m.sel(decoder_layer=layer) for m in head_mean.values()))
        return xr.Dataset({f"{k}_by_head": v for k, v in by_head.items()} | {f"{k}_head_mean": v for k, v in head_mean.items()})

    return b.run(models, need, fill, first_note=(
        "Text→vision mass: per text query token, the head's prefill attention on vision keys, "
        "averaged over the sample's text tokens. Sink: the decode query's attention on the first "
        "prompt position. The most vision-attending / largest sink head is the one with the "
        "largest mean over samples (its CI beside it)."))


ATLAS_COLUMNS = ["model", "family", "vision layers ‖v_l‖ (l = 0, 1, …)", "tower output ‖v‖",
                 "connector output ‖p‖ (LLM input)", "text ‖t‖ (LLM input)", "embedding table ‖e‖ mean (p5, p50, p95)",
                 "boundary tokens ‖e‖ (rank of V)", "vision/text ratio (LLM input)"]


def _boundary_cell(data: xr.Dataset, vocab: int) -> str:
    if not data.sizes.get("boundary_id"):
        return "none"
    return ", ".join(f"{text} {norm:.2f} ({int(rank)}/{vocab})" for text, norm, rank in
                     zip(as_str(data["boundary_text"].values), data["boundary_norm"].values, data["boundary_rank"].values))


def atlas_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """The norm atlas (specs/norm_atlas.yaml), one row per model: where each family's vision tokens
    and text tokens sit in norm, from the tower to the LLM input."""
    ref = options.reference
    b = _Builder("atlas", f"Norm atlas across the vision-language interface (condition {ref})", ATLAS_COLUMNS, options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        data = atlas.norm_atlas(ds, ref, **options.boot())
        vocab = ds.sizes["embed_row"]
        layers = ", ".join(f"{v:.2f}" for v in data["vision_layer_norm"].sel(stat="value").values)
        table = f"{float(data['table_mean']):.3f} ({float(data['table_p05']):.3f}, {float(data['table_p50']):.3f}, " \
                f"{float(data['table_p95']):.3f})"
        cells = [estimate(data[name], 2) if name in data else "n/a"
                 for name in ("vision_norm", "connector_norm", "text_input_norm")]
        ratio = estimate(data["input_ratio"], 2) if "input_ratio" in data else "n/a"
        b.table.rows.append([model, str(ds.attrs.get("family", "?")), layers, *cells, table,
                             _boundary_cell(data, vocab), ratio])
        b.count(model, *(data[n] for n in ("vision_norm", "connector_norm") if n in data))
        return data.drop_vars(["boundary_text", "boundary_id"], errors="ignore").drop_dims("boundary_id", errors="ignore")

    return b.run(models, lambda ds: _missing(ds, atlas.VARIABLES, (ref,), (0,)), fill, first_note=(
        "Mean L2 norms: per sample over its patches (vision tower) or tokens (LLM input), then "
        "over samples. ‖p‖ is the residual stream at layer 0 on vision tokens; ‖e‖ the rows of the "
        "input embedding table as the embedding module outputs them (the whole vocabulary, no "
        "CI: one matrix); rank 1 = the largest row norm of V rows."))


def _modality_rows(b: _Builder, model: str, data: xr.Dataset, dim: str, measures: tuple[str, ...]) -> None:
    """One row per label of `dim`: each measure on vision tokens, then each on text tokens."""
    for layer in data[dim].values:
        row = data.sel({dim: layer})
        cells = [estimate(row[name].sel(modality=modality), 3) if modality in row.modality else "n/a"
                 for modality in ("vision", "text") for name in measures]
        b.table.rows.append([model, str(int(layer)), *cells])
        b.count(model, row[measures[0]])


def update_decomposition_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """The update decomposition (`branches.update_decomposition`): per decoder layer, what the
    attention and MLP branches add relative to the stream they read, per modality."""
    ref = options.reference
    b = _Builder("update-decomposition", f"Attention and MLP updates relative to the residual stream (condition {ref})",
                 ["model", "decoder layer", "vision ‖a_l‖/‖h_l‖", "vision ‖m_l‖/‖h_l‖",
                  "text ‖a_l‖/‖h_l‖", "text ‖m_l‖/‖h_l‖"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        if not branches.branch_layers(ds):
            raise MissingInputs("a decoder layer with attn_out, mlp_out and its residual layer stored")
        text_set = options.definitions_for(ds)["text_set"]
        data = branches.update_decomposition(ds, text_set=text_set, **options.boot()).sel(condition=ref)
        _modality_rows(b, model, data, "decoder_layer", tuple(branches.BRANCHES))
        return data

    return b.run(models, lambda ds: _missing(ds, branches.VARIABLES, (ref,)), fill, first_note=(
        "Decoder layer l reads h_l and adds a_l (attention branch) and m_l (MLP branch) to it: "
        "h_(l+1) = h_l + a_l + m_l. Each share is the mean over a sample's tokens of that "
        "modality, then over samples. Per-token values: analyses.branches.token_shares."))


def logit_lens_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """The logit lens (`lens.logit_lens`): per layer and modality, how often the lens's top-1 token
    is already the last layer's, and the lens's top-1 probability."""
    ref = options.reference
    b = _Builder("logit-lens", f"Logit lens on vision and text tokens by layer (condition {ref})",
                 ["model", "layer", "vision top-1 = final", "vision top-1 p", "text top-1 = final", "text top-1 p"],
                 options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        data = lens.logit_lens(ds, text_set=text_set, **options.boot()).sel(condition=ref)
        _modality_rows(b, model, data, "layer", lens.MEASURES)
        return data

    return b.run(models, lambda ds: _missing(ds, lens.VARIABLES, (ref,)), fill, first_note=(
        "Lens at layer l: log_softmax(lm_head(final_norm(h_l))), computed at run time. "
        "'top-1 = final': the share of a sample's tokens whose lens top-1 token equals the "
        "top-1 at the last stored layer (the model's own prediction when that is layer L); "
        "'top-1 p': the lens's top-1 probability. Per-token values: analyses.lens.token_lens."))


def trajectories_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Vision trajectories against α (`trajectories.vision_trajectories`): per swept value and
    layer, the vision tokens' mean norm and their cosine to the reference's same token."""
    ref, sweep = options.reference, options.sweep
    symbol = sweep if sweep != "alpha" else "α"
    b = _Builder("trajectories", f"Vision-token trajectories against {symbol} (cosine to {ref})",
                 ["model", symbol, "layer", "vision ‖h_l‖₂", "cos(h_l, h_l^ref)"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("hidden",), (ref,))
        if not lacking and not _sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = _sweep_conditions(ds, sweep)
        data = trajectories.vision_trajectories(ds, ref, force=options.force, **options.boot())
        data = data.reindex(condition=[c for c, _, _ in conditions])
        for condition, _, label in conditions:
            for layer in data.layer.values:
                row = data.sel(condition=condition, layer=layer)
                b.table.rows.append([model, label, str(int(layer)), estimate(row["norm"], 2),
                                     estimate(row["cos_reference"], 3)])
                b.count(model, row["norm"])
        return data

    return b.run(models, need, fill, first_note=(
        f"Means over a sample's vision tokens, then over samples. cos(h_l, h_l^ref): the same token "
        f"(sample, position) of {ref}. Every stored layer; capture all layers in the sweep."))


def _categories(models: dict[str, xr.Dataset]) -> list[str]:
    """Every sample category of the models' runs, sorted."""
    found: set[str] = set()
    for ds in models.values():
        if "run_category" in ds.variables:
            found |= set(as_str(ds["run_category"].values).tolist())
    return sorted(found)


def accuracy_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Task accuracy per condition (analyses.accuracy: the response scored by each item's eval_mode),
    overall and per category, conditions in the α order of the sweep."""
    sweep = options.sweep
    categories = _categories(models)
    b = _Builder("accuracy", "Task accuracy of the greedy response (scored by each item's eval_mode)",
                 ["model", "condition", _sweep_name(sweep), "accuracy", *[f"accuracy: {c}" for c in categories],
                  "unscored (judge)"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        data = accuracy.accuracy(ds, **options.boot())
        swept = {c: v for c, v, _ in _sweep_conditions(ds, sweep, "run")}
        order = sorted(data.condition.values.tolist(), key=lambda c: (c != options.reference, swept.get(c, math.inf),
                                                                      condition_sort_key(c)))
        for condition in order:
            overall = data["accuracy"].sel(condition=condition)
            per_category = [estimate(data["accuracy_by_category"].sel(condition=condition, category=c), 2)
                            if c in data.category.values else "n/a" for c in categories]
            value = f"{swept[condition]:g}" if condition in swept else ""
            b.table.rows.append([model, condition, value, estimate(overall, 2), *per_category, str(int(data["unscored"]))])
            b.count(model, overall)
        return data

    return b.run(models, accuracy.lacking, fill, first_note=(
        "Accuracy: the mean over samples of 1 (the response answers the item) or 0, by the item's eval_mode (exact, "
        "choice, numeric; DatBench's direct resolves by the answer's form; judge items are not scored); the response "
        "is the greedy text cut before the first special token. Rules: analyses.accuracy."))


# name -> builder, from the analyses registry (each entry names its builder in this module)
BUILDERS: dict[str, Callable[[dict[str, xr.Dataset], Options], Table]] = {a.name: globals()[a.table] for a in ANALYSES}


def open_models(store: str | Path, models: list[str] | None = None) -> dict[str, xr.Dataset]:
    """Every model of the store (or `models`), opened for cached analyses."""
    return {m: open_model(store, m) for m in (models or list_models(store))}


def build_tables(store: str | Path, names: list[str] | tuple[str, ...] | None = None, options: Options | None = None,
                 models: list[str] | None = None, opened: dict[str, xr.Dataset] | None = None) -> list[Table]:
    """The named tables (default: all, in the study's order) of a store (`opened`: its models,
    already opened with `open_models`)."""
    options = options or Options()
    names = list(names or TABLES)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise ValueError(f"unknown table(s) {', '.join(unknown)}; choose from {', '.join(TABLES)}")
    opened = open_models(store, models) if opened is None else opened
    with forcing() if options.force else contextlib.nullcontext():
        return [BUILDERS[name](opened, options) for name in names]


def analyze(store: str | Path, names: list[str] | tuple[str, ...] | None = None, options: Options | None = None,
            models: list[str] | None = None) -> str:
    """The tables as one markdown document (what `workbench analyze` prints)."""
    tables = build_tables(store, names, options, models)
    return "\n\n".join(t.markdown() for t in tables) + "\n"
