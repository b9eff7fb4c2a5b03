"""`accuracy`: per model and condition, the task accuracy of the greedy response, overall and per
category, and the unscored (judge) items (`accuracy.accuracy`). Figure `accuracy_vs_alpha.png`:
accuracy against α (log x), overall and per category, per model; the reference dashed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import xarray as xr

from .. import accuracy
from ..figures import FigureFile, Plot
from ..plotting import alpha_axis, band, model_colors
from ..registry import Analysis, register_analysis
from ..streaming import as_str, condition_sort_key
from ..tables import Builder, Options, Table, estimate, sweep_conditions, sweep_name


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
    b = Builder("accuracy", "Task accuracy of the greedy response (scored by each item's eval_mode)",
                ["model", "condition", sweep_name(sweep), "accuracy", *[f"accuracy: {c}" for c in categories],
                 "unscored (judge)"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        data = accuracy.accuracy(ds, **options.boot())
        swept = {c: v for c, v, _ in sweep_conditions(ds, sweep, "run")}
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


def accuracy_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `accuracy` table against the swept α: one panel overall, one per category; the reference
    condition's accuracy as a dashed line in the model's colour."""
    ref, sweep = options.reference, options.sweep
    plot = Plot("accuracy_vs_alpha", f"Task accuracy against the projector scale {sweep_name(sweep)}", options, out)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = accuracy.lacking(ds)
        return lacking or ([] if sweep_conditions(ds, sweep, "run") else [f"conditions sweeping {sweep}"])

    ready = plot.ready(models, need)
    if not ready:
        return plot.file
    data = {model: accuracy.accuracy(ds, **options.boot()) for model, ds in ready.items()}
    categories = sorted({str(c) for d in data.values() if "category" in d.dims for c in d.category.values})
    panels = ["all", *categories]
    colors = model_colors(list(models))
    _, axes = plot.grid(1, len(panels), width=4.2, height=3.6)
    for model, ds in ready.items():
        conditions = sweep_conditions(ds, sweep, "run")
        x = np.array([v for _, v, _ in conditions])
        names = [c for c, _, _ in conditions]
        for ax, panel in zip(axes[0], panels):
            if panel == "all":
                est = data[model]["accuracy"]
            elif "category" in data[model].dims and panel in data[model].category.values:
                est = data[model]["accuracy_by_category"].sel(category=panel)
            else:
                continue
            band(ax, x, est.sel(condition=names), colors[model], model, marker="o")
            if ref in est.condition.values and np.isfinite(float(est.sel(condition=ref, stat="value"))):
                ax.axhline(float(est.sel(condition=ref, stat="value")), color=colors[model], linestyle="--",
                           linewidth=0.9)
    for ax, panel in zip(axes[0], panels):
        ax.set(title="all samples" if panel == "all" else panel, ylabel="accuracy (fraction correct)",
               ylim=(-0.05, 1.05))
        alpha_axis(ax)
    return plot.finish(f"model (dashed: {ref})")


register_analysis(Analysis(
    name="accuracy", section="Task accuracy under each condition", inputs=("run_response", "run_answer"),
    metrics=(accuracy.accuracy,), table=accuracy_table, figures=(accuracy_vs_alpha,),
    claim="Fan et al. suggest that scaling vision tokens down at inference time degrades visual understanding "
          "(cited there, not measured)", order=140))
