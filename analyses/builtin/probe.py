"""`probe`: linear probes of a per-sample field (`--label FIELD`, default `category`; `--where
FIELD=VALUE` keeps only some samples) from the stored residual stream, per condition, token group
and layer (`analyses.probe`): cross-validated accuracy, chance, the control task's accuracy and
selectivity, each the mean over folds with a 95% t interval over folds. One row per (model,
condition, token group): the layer with the highest accuracy, its scores, and the first layer
whose accuracy interval lies above chance. Figure `probe_accuracy.png`: accuracy against layer,
one panel per token group, one line per condition, chance dashed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import xarray as xr

from .. import probe
from ..figures import FigureFile, Plot, two_layers
from ..plotting import band, condition_colors, layer_axis
from ..registry import Analysis, register_analysis
from ..tables import Builder, Cell, Options, Table, estimate, missing

NA = Cell(math.nan, math.nan, math.nan)


def _need(ds: xr.Dataset) -> list[str]:
    return missing(ds, ("hidden",))


def _first_decodable(data: xr.Dataset) -> str:
    """The first layer whose accuracy interval lies wholly above the chance level's mean."""
    low = data["accuracy"].sel(stat="ci_low").values
    chance = data["chance"].sel(stat="value").values
    above = np.flatnonzero(np.isfinite(low) & (low > chance))
    return str(int(data.layer.values[above[0]])) if len(above) else "none"


def probe_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    where = f", samples with {options.where}" if options.where else ""
    b = Builder("probe", f"Linear probes of {options.label!r}{where}", [
        "model", "condition", "token group", "samples", "best layer", "accuracy", "chance", "control (shuffled labels)",
        "selectivity", "first layer above chance"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        data = probe.probe_metrics(ds, options.label, options.where, seed=options.seed, force=options.force)
        for condition in data.condition.values:
            for group in probe.GROUPS:
                at = data.sel(condition=condition, group=group)
                n = int(data["n_probed"].sel(condition=condition, group=group))
                accuracy = at["accuracy"].sel(stat="value").values
                if not np.isfinite(accuracy).any():
                    continue
                best = int(np.nanargmax(accuracy))
                cells = [estimate(at[name].isel(layer=best), 2) for name in probe.SCORES]
                b.table.rows.append([model, str(condition), group, str(n), str(int(at.layer.values[best])), *cells,
                                     _first_decodable(at)])
        if not b.table.rows:
            raise probe.MissingInputs("no condition and token group with two or more classes among its samples")
        return data

    table = b.run(models, _need, fill, first_note=(
        f"One example per sample: a token group's mean `hidden` (vision, text, boundary tokens; pooled: all tokens) or "
        f"the last prompt token; label: the sample's `{options.label}`. Logistic regression on standardized features, "
        f"{probe.N_SPLITS}-fold cross-validation split by sample (stratified); chance: always the training folds' most "
        "frequent class; control: the same probe trained on the labels shuffled across samples (Hewitt & Liang 2019); "
        "selectivity = accuracy − control. Every layer: figure probe_accuracy.png and the table's data "
        "(analyses.probe)."))
    # the folds, not a bootstrap over samples, give these intervals: say so instead of the common note
    table.notes = [note if not note.startswith("Estimates are") else
                   f"Estimates are means over the {probe.N_SPLITS} folds with a 95% Student-t interval over folds; "
                   "a fold whose training samples hold one class has no probe and is left out." for note in table.notes]
    return table


def probe_accuracy(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """Probe accuracy against layer per token group, one line per condition, chance dashed."""
    plot = Plot("probe_accuracy", f"Linear-probe accuracy of {options.label!r} by layer", options, out)
    data = plot.table(probe_table, models, options)
    if data is None:
        return plot.file
    lacking = two_layers(data)
    if lacking:
        return plot.skip("; ".join(lacking))
    groups = [g for g in probe.GROUPS if np.isfinite(data["accuracy"].sel(group=g, stat="value").values).any()]
    fig, axes = plot.grid(len(data.model), len(groups), sharey=True)
    conditions = [str(c) for c in data.condition.values]
    colors = condition_colors(conditions)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model)
        for col, group in enumerate(groups):
            ax = axes[row, col]
            at = values.sel(group=group)
            for condition in conditions:
                band(ax, at.layer, at["accuracy"].sel(condition=condition), colors[condition], condition, marker="o")
            chance = at["chance"].sel(stat="value").mean("condition", skipna=True).values
            if np.isfinite(chance).any():
                ax.plot(at.layer.values, chance, color="#777777", linestyle="--", linewidth=1.0, label="_chance")
            ax.set(title=f"{model}: {group} tokens" if group in ("vision", "text", "boundary") else f"{model}: {group}",
                   ylabel="accuracy (dashed: chance)")
            layer_axis(ax.xaxis)
    return plot.finish(legend="condition")


register_analysis(Analysis(
    name="probe", section="What the residual stream linearly encodes: probes of a sample's field",
    inputs=("hidden", "run_category", "run_answer"), metrics=(probe.probe_metrics, probe.probe_results),
    table=probe_table, figures=(probe_accuracy,), order=180))
