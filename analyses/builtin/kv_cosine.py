"""`kv-cosine`: per model and swept α, cos(K′, K) and cos(V′, V) at vision tokens against the
reference, averaged over layers (`kv.kv_cosine`). Figure `kv_cosine_vs_alpha.png`: both against α
(log x), per model.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import kv
from ..figures import FigureFile, Plot, alpha_series
from ..plotting import alpha_axis, band, model_colors
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, estimate, missing, sweep_conditions, sweep_name


def kv_cosine_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref, sweep = options.reference, options.sweep
    b = Builder("kv-cosine", f"Vision-token keys and values against {ref} (mean over layers)",
                ["model", sweep if sweep != "alpha" else "α", "cos(K′,K)", "cos(V′,V)"], options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("keys", "values"), (ref,))
        if not lacking and not sweep_conditions(ds, sweep):
            lacking = [f"conditions sweeping {sweep}"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        conditions = sweep_conditions(ds, sweep)
        average_layers = options.definitions_for(ds)["average_layers"]
        data = kv.kv_cosine(ds, ref, "vision", average_layers=average_layers, **options.boot())
        data = data.reindex(condition=[c for c, _, _ in conditions])
        for condition, _, label in conditions:
            row = data.sel(condition=condition)
            b.table.rows.append([model, label, estimate(row["cos_k"], 3), estimate(row["cos_v"], 3)])
            b.count(model, row["cos_k"], row["cos_v"])
        return data

    return b.run(models, need, fill)


def kv_cosine_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `kv-cosine` table against the swept value: cos(K′,K) and cos(V′,V), one line per model."""
    ref, sweep = options.reference, options.sweep
    plot = Plot("kv_cosine_vs_alpha", f"Vision-token keys and values against {ref} as {sweep_name(sweep)} varies "
                "(mean over layers)", options, out)
    data = plot.table(kv_cosine_table, models, options)
    if data is None:
        return plot.file
    colors = model_colors(list(models))
    _, axes = plot.grid(1, 2, width=5.5, height=3.8)
    for model in [str(m) for m in data.model.values]:
        est = data.sel(model=model)
        band(axes[0, 0], *alpha_series(models[model], est["cos_k"], sweep), colors[model], model, marker="o")
        band(axes[0, 1], *alpha_series(models[model], est["cos_v"], sweep), colors[model], model, "--", marker="s")
    axes[0, 0].set(title="keys: cos(K′, K)")
    axes[0, 1].set(title="values: cos(V′, V)")
    for ax in axes[0]:
        alpha_axis(ax)
        ax.set(ylabel="mean cosine similarity (unitless)", ylim=(min(-0.05, ax.get_ylim()[0]), 1.05))
    return plot.finish("model")


register_analysis(Analysis(
    name="kv-cosine", section="Vision-token keys and values under α", inputs=("keys", "values"),
    metrics=(kv.kv_cosine,), table=kv_cosine_table, figures=(kv_cosine_vs_alpha,), order=50))
