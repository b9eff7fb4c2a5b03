"""`kv-heads`: per model and swept α, cos(K′, K) and cos(V′, V) per KV head at vision tokens: the
head mean and the lowest head (`kv.kv_cosine_heads_per_sample`). Figure `kv_heads_vs_alpha.png`:
each head against α, one row of panels per model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from .. import kv
from ..bootstrap import summarize
from ..figures import FigureFile, Plot
from ..plotting import alpha_axis, band, model_colors
from ..registry import Analysis, register_analysis
from ..streaming import layer_mean
from ..tables import Builder, Cell, Options, Table, estimate, extreme_head, missing, sweep_conditions, sweep_name


def kv_heads_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """Head-resolved cos(K′,K) and cos(V′,V) at vision tokens per swept condition: the mean over
    KV heads and the lowest head (each head's cosine averaged over the layers the definitions
    name, per sample, then over samples)."""
    ref, sweep = options.reference, options.sweep
    b = Builder("kv-heads", f"Vision-token keys and values per KV head against {ref} (mean over layers)",
                ["model", sweep if sweep != "alpha" else "α", "cos(K′,K), head mean", "lowest K head",
                 "cos(V′,V), head mean", "lowest V head"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("keys", "values"), (ref,))
        if not lacking and "kv_heads" not in ds.attrs:
            lacking = ["the model's kv_heads attr"]
        if not lacking and not sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = [c for c, _, _ in sweep_conditions(ds, sweep)]
        average_layers = options.definitions_for(ds)["average_layers"]
        values = kv.kv_cosine_heads_per_sample(ds, ref, force=options.force).sel(modality="vision", drop=True)
        values = layer_mean(values, average_layers).sel(condition=conditions)
        by_head = summarize(values, **options.boot())
        head_mean = summarize(values.mean("kv_head"), **options.boot())
        for condition, _, label in sweep_conditions(ds, sweep):
            cells: list[str | Cell] = []
            for name in ("cos_k", "cos_v"):
                cells += [estimate(head_mean[name].sel(condition=condition), 3),
                          extreme_head(by_head[name].sel(condition=condition), "kv_head", largest=False)]
            b.table.rows.append([model, label, *cells])
            b.count(model, head_mean["cos_k"].sel(condition=condition))
        return xr.Dataset({"cos_k_by_head": by_head["cos_k"], "cos_v_by_head": by_head["cos_v"]})

    return b.run(models, need, fill, first_note=(
        "Per KV head h: the cosine of the head's head_dim-wide key (value) vector with the same "
        "token of the reference, over a sample's vision tokens; the lowest head is the one with "
        "the smallest mean over samples. analyses.kv.kv_cosine_heads_per_sample has every layer."))


def kv_heads_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `kv-heads` table as curves: each KV head's cos(K′,K) and cos(V′,V) at vision tokens
    against the swept value, one line per head, one row of panels per model."""
    plot = Plot("kv_heads_vs_alpha", f"Vision-token keys and values per KV head against {sweep_name(options.sweep)} "
                f"({options.reference})", options, out)
    data = plot.table(kv_heads_table, models, options)
    if data is None:
        return plot.file
    _, axes = plot.grid(len(data.model), 2)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model).dropna("condition", how="all")
        x = values[options.sweep].values if options.sweep in values.coords else np.arange(values.sizes["condition"])
        order = np.argsort(x)
        for col, (name, label) in enumerate((("cos_k_by_head", "cos(K′,K)"), ("cos_v_by_head", "cos(V′,V)"))):
            ax = axes[row, col]
            heads_ = values[name].dropna("kv_head", how="all")
            colors = model_colors([f"head {int(h)}" for h in heads_.kv_head.values])
            for h in heads_.kv_head.values:
                band(ax, x[order], heads_.sel(kv_head=h).isel(condition=order), colors[f"head {int(h)}"],
                     f"head {int(h)}", marker="o")
            ax.set(title=f"{model}: {label} per KV head", ylabel="cosine (unitless)")
            alpha_axis(ax)
    return plot.finish("KV head")


register_analysis(Analysis(
    name="kv-heads", section="Vision-token keys and values per KV head under α", inputs=("keys", "values"),
    metrics=(kv.kv_cosine_heads_per_sample,), table=kv_heads_table, figures=(kv_heads_vs_alpha,), order=60))
