"""`alpha`: per model and swept α, the vision/text norm ratio (`norms.vision_text_ratio`), the
attention KL (`attention.vision_attention_kl`), the logit KL (`logits.logit_kl`) and the median
rank (`logits.median_rank`) against the reference. Figures `kl_vs_alpha.png` (attention KL and
logit KL against α, log x, per model) and `attention_mass.png` (prefill and decode text → vision
attention mass per layer, per model).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import xarray as xr

from .. import attention, logits, norms
from ..figures import FigureFile, Plot, alpha_series
from ..plotting import DECODER_LAYER_LABEL, alpha_axis, band, layer_axis, model_colors
from ..registry import Analysis, register_analysis
from ..tables import Builder, Cell, Options, Table, estimate, missing, sweep_conditions, sweep_name


def alpha_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref, sweep = options.reference, options.sweep
    b = Builder("alpha", f"Scaling the projector output by {sweep} (against {ref}; step {options.step})",
                ["model", sweep if sweep != "alpha" else "α", "vision/text norm ratio", "attention KL", "logit KL",
                 "median rank"], options, medians=True)

    # each column reads only its own variable: a store with `logprobs` alone gets the logit KL and rank
    lacks = {"norm_ratio": lambda ds: missing(ds, ("hidden",), (), (0,)),
             "attention_kl": lambda ds: missing(ds, ("decode_attention",)),
             "logit_kl": lambda ds: missing(ds, ("logprobs",)), "median_rank": lambda ds: missing(ds, ("logprobs",))}
    not_computed: list[str] = []

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, (), (ref,))
        if not lacking and all(lack(ds) for lack in lacks.values()):
            lacking = ["hidden (layer 0), decode_attention or logprobs"]
        if not lacking and not sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = sweep_conditions(ds, sweep)
        names = [c for c, _, _ in conditions]
        defs = options.definitions_for(ds)
        compute = {
            "norm_ratio": lambda: norms.vision_text_ratio(ds, layer=0, text_set=defs["text_set"], **options.boot()),
            "attention_kl": lambda: attention.vision_attention_kl(ds, ref, options.step,
                                                                  average_layers=defs["average_layers"], **options.boot()),
            "logit_kl": lambda: logits.logit_kl(ds, ref, options.step, **options.boot()),
            "median_rank": lambda: logits.median_rank(ds, ref, options.step, rank_base=defs["rank_base"], **options.boot()),
        }
        parts = {}
        for k, make in compute.items():
            if lacks[k](ds):
                not_computed.append(f"{model}: {k.replace('_', ' ')} needs {', '.join(lacks[k](ds))}")
            else:
                parts[k] = make().reindex(condition=names)
        for condition, _, label in conditions:
            row = {k: v.sel(condition=condition) for k, v in parts.items()}
            b.table.rows.append([model, label, *[estimate(row[k], 1 if k == "median_rank" else 2) if k in row
                                                 else Cell(math.nan, math.nan, math.nan) for k in compute]])
            b.count(model, *row.values())
        return xr.Dataset({k: v.rename(n_samples=f"n_samples_{k}") for k, v in parts.items()})

    table = b.run(models, need, fill)
    if not table.skipped:
        table.notes += [f"Not computed (n/a): {line}." for line in not_computed]
    return table


def kl_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref, sweep = options.reference, options.sweep
    plot = Plot("kl_vs_alpha", f"Divergence from {ref} against the projector scale {sweep_name(sweep)}", options, out)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, (), (ref,))
        if not {"decode_attention", "logprobs"} & set(ds.data_vars):
            lacking.append("decode_attention or logprobs")
        if not lacking and not sweep_conditions(ds, sweep):
            lacking.append(f"conditions sweeping {sweep}")
        return lacking

    ready = plot.ready(models, need)
    if not ready:
        return plot.file
    colors = model_colors(list(models))
    kinds = [k for k in ("decode_attention", "logprobs") if any(k in ds.data_vars for ds in ready.values())]
    _, axes = plot.grid(1, len(kinds), width=5.5, height=3.8)  # a panel only for what the store holds
    panel = {kind: axes[0, i] for i, kind in enumerate(kinds)}
    for model, ds in ready.items():
        if "decode_attention" in ds.data_vars:
            average_layers = options.definitions_for(ds)["average_layers"]
            est = attention.vision_attention_kl(ds, ref, options.step, average_layers=average_layers, **options.boot())
            band(panel["decode_attention"], *alpha_series(ds, est, sweep), colors[model], model, marker="o")
        if "logprobs" in ds.data_vars:
            est = logits.logit_kl(ds, ref, options.step, **options.boot())
            band(panel["logprobs"], *alpha_series(ds, est, sweep), colors[model], model, marker="o")
    titles = {"decode_attention": f"attention over vision keys (decode step {options.step}; mean over layers and heads)",
              "logprobs": f"next-token distribution (decode step {options.step})"}
    for kind, ax in panel.items():
        ax.set(title=titles[kind], ylabel=f"KL({ref} ‖ condition) (nats)")
        alpha_axis(ax)
        ax.set_ylim(bottom=0)
    return plot.finish("model")


def attention_mass(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    plot = Plot("attention_mass", f"Text → vision attention mass per decoder layer ({ref})", options, out)
    ready = plot.ready(models, lambda ds: [] if {"prefill_vision_mass", "decode_attention"} & set(ds.data_vars)
                       and ref in np.asarray(ds["condition"].values).astype(object).astype(str)
                       else ["prefill_vision_mass or decode_attention", f"condition {ref!r}"])
    if not ready:
        return plot.file
    colors = model_colors(list(models))
    _, axes = plot.grid(1, 2, width=5.5, height=3.8)
    for model, ds in ready.items():
        if "prefill_vision_mass" in ds.data_vars:
            mass = attention.prefill_vision_mass(ds, "text", **options.boot()).sel(condition=ref)
            band(axes[0, 0], mass.decoder_layer, mass, colors[model], model, marker="o")
        if "decode_attention" in ds.data_vars:
            mass = attention.decode_vision_mass(ds, None, **options.boot()).sel(condition=ref)
            band(axes[0, 1], mass.decoder_layer, mass, colors[model], model, marker="o")
    axes[0, 0].set(title="prefill: text-token queries (mean over heads and text tokens)")
    axes[0, 1].set(title="decode: generated-token queries (mean over heads and decode steps)")
    for ax in axes[0]:
        ax.set(ylabel="attention mass on vision keys (probability)")
        ax.set_ylim(bottom=0)
        layer_axis(ax.xaxis, DECODER_LAYER_LABEL)
    return plot.finish("model")


register_analysis(Analysis(
    name="alpha", section="Scaling the projector output (α sweep)",
    inputs=("hidden", "decode_attention", "logprobs", "prefill_vision_mass"),
    metrics=(norms.vision_text_ratio, attention.vision_attention_kl, logits.logit_kl, logits.median_rank,
             attention.prefill_vision_mass, attention.decode_vision_mass),
    table=alpha_table, figures=(kl_vs_alpha, attention_mass), order=40))
