"""`compare`: every condition a store holds against the reference (`--reference`, default
`baseline`), per model (`analyses.compare`): the output KL with its direction named, the rank of
the reference's top token and greedy-token agreement (at `--step` and over every decode step),
Δ log-prob of the stored answer's first token, accuracy and its difference, and the residual
stream's norm ratio ‖h‖/‖h_ref‖ and cos(h, h_ref) per modality at the last stored layer. Each part
reads only its own variables; a part a model lacks is `n/a`, with a note saying what it needs.
One row per condition, the reference's own first (its accuracy; its comparisons are 0 and 1).
Figure `compare_curves.png`: per model, KL and agreement against the decode step, the norm ratio and
cosine against the layer (vision solid, text dashed), one colour per condition.
"""

from __future__ import annotations

import math
from pathlib import Path

import xarray as xr

from .. import accuracy, compare
from ..bootstrap import summarize
from ..figures import FigureFile, Plot, two_layers
from ..plotting import band, condition_colors, layer_axis
from ..registry import Analysis, register_analysis
from ..tables import Builder, Cell, Options, Table, estimate, missing

NA = Cell(math.nan, math.nan, math.nan)
MODALITY_STYLES = {"vision": "-", "text": "--"}


def _parts(ds: xr.Dataset) -> dict[str, list[str]]:
    """Each part of the comparison and what the model lacks for it (empty: it can run)."""
    logprobs = [] if "logprobs" in ds.data_vars else ["logprobs (a `logits` capture)"]
    answer = logprobs + ([] if compare.ANSWER_LABEL in ds.variables else [compare.ANSWER_LACKING])
    return {"output": logprobs, "answer": answer,
            "hidden": [] if "hidden" in ds.data_vars else ["hidden (a `layer` capture)"],
            "accuracy": accuracy.lacking(ds)}


PART_NAMES = {"output": "output KL, rank and agreement", "answer": "Δ log-prob of the answer",
              "hidden": "residual-stream norm ratio and cosine", "accuracy": "accuracy"}


def _plain(values: xr.Dataset | xr.DataArray) -> xr.Dataset:
    """Values without their sweep coordinates, each variable's sample count named after it."""
    if isinstance(values, xr.DataArray):
        values = values.to_dataset()
    out = {}
    for name, var in values.data_vars.items():
        var = var.drop_vars([c for c in var.coords if c not in var.dims and c != "n_samples"])
        out[name] = var.rename(n_samples=f"n_samples_{name}") if "n_samples" in var.coords else var
    return xr.Dataset(out)


def _cell(data: xr.Dataset, name: str, digits: int, **at) -> Cell:
    if name not in data or any(k not in data[name].dims or v not in data[name][k].values for k, v in at.items()):
        return NA
    return estimate(data[name].sel(at), digits)


def _summaries(ds: xr.Dataset, part: str, options: Options) -> xr.Dataset:
    """One part's estimates with CIs (`analyses.compare`), for the table and its data."""
    ref, boot = options.reference, options.boot()
    if part == "output":
        summary = _plain(compare.output_metrics(ds, ref, force=options.force, **boot))
        per_sample = compare.output_metrics(ds, ref, per_sample=True, force=options.force)[["kl", "agree"]]
        over_steps = summarize(per_sample.mean("step").rename(kl="kl_all_steps", agree="agree_all_steps"), **boot)
        return xr.merge([summary, _plain(over_steps)])
    if part == "answer":
        return _plain(compare.answer_logprob_delta(ds, ref, **boot))
    if part == "hidden":
        return _plain(compare.hidden_metrics(ds, ref, force=options.force, **boot))
    return _plain(compare.accuracy_metrics(ds, ref, **boot))


def compare_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref, step = options.reference, options.step
    kl = compare.kl_direction(ref)
    b = Builder("compare", f"Every condition against {ref}", [
        "model", "condition", f"{kl}, step {step}", f"{kl}, mean over steps", f"rank of {ref}'s top token, step {step}",
        f"greedy agreement, step {step}", "greedy agreement, all steps", f"Δ ln p(answer) vs {ref}", "accuracy",
        f"Δ accuracy vs {ref}", "vision ‖h‖/‖h_ref‖, last layer", "vision cos(h, h_ref), last layer",
        "text ‖h‖/‖h_ref‖, last layer", "text cos(h, h_ref), last layer"], options, medians=True)
    skipped: list[str] = []
    last_layers: dict[str, int] = {}

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, (), (ref,))
        if not lacking and all(_parts(ds).values()):
            lacking = ["logprobs, hidden or scored responses"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        parts: list[xr.Dataset] = []
        for part, lacking in _parts(ds).items():
            if lacking:
                skipped.append(f"{model}: {PART_NAMES[part]} not computed: needs {', '.join(lacking)}")
                continue
            parts.append(_summaries(ds, part, options))
            if part == "hidden":
                last_layers[model] = int(parts[-1].layer.values[-1])
            if part == "output" and step not in parts[-1].step.values:
                skipped.append(f"{model}: no decode step {step} (the store holds steps 0–{parts[-1].sizes['step'] - 1})")
        data = xr.merge(parts, join="outer", compat="override")
        for condition in [ref, *[c for c in compare.conditions_of(ds) if c != ref]]:  # the reference: its accuracy
            at = {"condition": condition}
            last = {"layer": last_layers[model]} if model in last_layers else {}
            cells = [_cell(data, "kl", 3, **at, step=step), _cell(data, "kl_all_steps", 3, **at),
                     _cell(data, "rank", 1, **at, step=step), _cell(data, "agree", 2, **at, step=step),
                     _cell(data, "agree_all_steps", 2, **at), _cell(data, "answer_delta", 2, **at),
                     _cell(data, "accuracy", 2, **at), _cell(data, "accuracy_delta", 2, **at)]
            for modality in ("vision", "text"):
                cells += [_cell(data, name, 3, **at, modality=modality, **last) if last else NA
                          for name in ("norm_ratio", "cos")]
            b.table.rows.append([model, f"{condition} (reference)" if condition == ref else condition, *cells])
            b.count(model, *[data[name].sel(at) for name in data.data_vars if condition in data[name].condition])
        return data

    table = b.run(models, need, fill, first_note=(
        f"Per sample, condition against {ref}: {kl} of the next-token distribution in nats; the rank of {ref}'s top "
        "token under the condition (0: still on top; median); greedy agreement: the two argmax tokens are equal "
        "(from the first step where they differ, the two runs continue from different texts); Δ ln p(answer): the "
        "log-prob of the answer's first token at step 0 minus the reference's; accuracy and its paired difference; "
        "‖h‖/‖h_ref‖ and cos(h, h_ref): the same token (sample, position, same token sequence) of the reference at "
        "the last stored layer, mean over the sample's tokens of that modality. n/a: a part the model lacks "
        "(notes below) or a condition with nothing to pair. Every step and layer: figure compare_curves.png and the "
        "table's data (analyses.compare)."))
    if not table.skipped:
        table.notes += [f"{s}." for s in skipped]
        table.notes += [f"{m}: last stored layer {l}." for m, l in last_layers.items()]
    return table


def compare_curves(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `compare` table's data over decode steps (KL, greedy agreement) and layers (norm ratio,
    cosine), one colour per condition."""
    ref = options.reference
    title = f"Every condition against {ref}: output by decode step, residual stream by layer"
    plot = Plot("compare_curves", title, options, out)
    data = plot.table(compare_table, models, options)
    if data is None:
        return plot.file
    panels = [p for p in (("kl", compare.kl_direction(ref) + " (nats)"), ("agree", "greedy agreement (fraction)"),
                          ("norm_ratio", "‖h‖ / ‖h_ref‖"), ("cos", "cos(h, h_ref)")) if p[0] in data]
    one_layer = two_layers(data)   # a curve over layers needs two of them
    panels = [p for p in panels if not (one_layer and "layer" in data[p[0]].dims)]
    if not panels:
        return plot.skip("; ".join(["no model holds logprobs (curves over decode steps)"] + one_layer))
    if {"norm_ratio", "cos"} & {p[0] for p in panels}:
        plot.file.title += " (per layer: vision solid, text dashed)"
    fig, axes = plot.grid(len(data.model), len(panels))
    conditions = [str(c) for c in data.condition.values if str(c) != ref]
    colors = condition_colors(conditions)   # distinct for any number of conditions (plotting.distinct_colors)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model)
        for col, (name, label) in enumerate(panels):
            ax = axes[row, col]
            var = values[name]
            for condition in conditions:
                series = var.sel(condition=condition)
                if "step" in var.dims:
                    band(ax, var.step, series, colors[condition], condition, marker="o")
                    continue
                for modality, style in MODALITY_STYLES.items():   # one legend entry per condition
                    band(ax, var.layer, series.sel(modality=modality), colors[condition],
                         condition if modality == "vision" else "_", linestyle=style, marker="o")
            ax.set(title=f"{model}: {label}", ylabel=label)
            if "step" in var.dims:
                ax.set_xlabel("decode step (0: the token after the prompt)")
            else:
                layer_axis(ax.xaxis)
            if name == "agree":
                ax.set_ylim(-0.05, 1.05)
    return plot.finish(legend="condition")


register_analysis(Analysis(
    name="compare", section="Every condition against the reference", inputs=(
        "logprobs", "hidden", compare.ANSWER_LABEL, "run_response", "run_answer"),
    metrics=(compare.output_metrics, compare.answer_logprob_delta, compare.hidden_metrics, compare.accuracy_metrics),
    table=compare_table, figures=(compare_curves,), order=150))
