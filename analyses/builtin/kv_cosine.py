"""`kv-cosine`: per model and swept α, cos(K′, K) and cos(V′, V) at vision tokens against the
reference, averaged over layers (`kv.kv_cosine`). Figure `kv_cosine_vs_alpha.png`: both against α
(log x), per model.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import kv
from ..figures import ALPHA_LABEL, FigureFile, alpha_series, band, grid, model_colors, save, usable
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
    ref, sweep = options.reference, options.sweep
    title = f"Vision-token keys and values against {ref} as {sweep_name(sweep)} varies (mean over layers)"
    fig_file = FigureFile("kv_cosine_vs_alpha.png", title)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("keys", "values"), (ref,))
        if not lacking and not sweep_conditions(ds, sweep):
            lacking.append(f"conditions sweeping {sweep}")
        return lacking

    ready, skipped = usable(models, need)
    if not ready:
        fig_file.skipped = "; ".join(skipped)
        return fig_file
    colors = model_colors(list(models))
    fig, axes = grid(1, 2, width=5.5, height=3.8)
    for model, ds in ready.items():
        est = kv.kv_cosine(ds, ref, "vision", average_layers=options.definitions_for(ds)["average_layers"], **options.boot())
        x, k = alpha_series(ds, est["cos_k"], sweep)
        _, v = alpha_series(ds, est["cos_v"], sweep)
        band(axes[0, 0], x, k, colors[model], model, marker="o")
        band(axes[0, 1], x, v, colors[model], model, "--", marker="s")
    axes[0, 0].set(title="keys: cos(K′, K)", ylabel="mean cosine similarity (unitless)")
    axes[0, 1].set(title="values: cos(V′, V)", ylabel="mean cosine similarity (unitless)")
    for ax in axes[0]:
        ax.set(xscale="log", xlabel=ALPHA_LABEL, ylim=(min(-0.05, ax.get_ylim()[0]), 1.05))
        ax.axvline(1.0, color="#999999", linestyle="--", linewidth=0.8)
        ax.legend(title="model", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    fig_file.path = save(fig, out, fig_file.name)
    return fig_file


register_analysis(Analysis(
    name="kv-cosine", section="Vision-token keys and values under α", inputs=("keys", "values"),
    metrics=(kv.kv_cosine,), table=kv_cosine_table, figures=(kv_cosine_vs_alpha,), order=50))
