"""`kv-substitution`: per model and KV-swap condition, D_KL(z_real ‖ z_hybrid),
D_KL(z_blank ‖ z_hybrid), D_KL(z_real ‖ z_blank) and the self-swap control D_KL(z_real ‖ z_self)
(`kv.kv_substitution`). Figure `kv_substitution.png`: the four KLs per swap condition, per model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from .. import kv
from ..figures import FigureFile, Plot
from ..plotting import condition_colors, marker_line
from ..registry import Analysis, register_analysis
from ..streaming import layout
from ..tables import Builder, Options, Table, estimate, missing


def kv_substitution_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    real, blank, own = options.reference, options.blank, options.self_swap
    swaps = list(dict.fromkeys((options.hybrid, *options.swaps)))
    b = Builder("kv-substitution", f"KV-cache substitution ({', '.join(swaps)}: {real} image decoding from the "
                f"{blank} image's KV cache; step {options.step})",
                ["model", "condition", "D_KL(z_real ‖ z_hybrid)", "D_KL(z_blank ‖ z_hybrid)", "D_KL(z_real ‖ z_blank)",
                 "D_KL(z_real ‖ z_self)"], options)

    def present(ds: xr.Dataset) -> list[str]:
        return [c for c in swaps if c in layout(ds, "run").conditions]

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("logprobs",), (real, blank))
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


KL_MEASURES = (("kl_real_hybrid", "real ‖ hybrid"), ("kl_blank_hybrid", "blank ‖ hybrid"),
               ("kl_real_blank", "real ‖ blank\n(scale)"), ("kl_real_self", "real ‖ self\n(control)"))


def kv_substitution(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `kv-substitution` table as points with CI bars: each KL of the next-token distribution
    (x), one colour per swap condition, one panel per model; D_KL(real ‖ blank) is the scale a
    hybrid's KLs read against, the self-swap the control that must be 0."""
    plot = Plot("kv_substitution", f"KV-cache substitution: next-token KLs (decode step {options.step})", options, out)
    data = plot.table(kv_substitution_table, models, options)
    if data is None:
        return plot.file
    names = [str(m) for m in data.model.values]
    measures = [(k, label) for k, label in KL_MEASURES if k in data]
    swaps = [str(c) for c in data.condition.values]
    colors = condition_colors(swaps)
    _, axes = plot.grid(1, len(names), width=max(4.2, 1.1 * len(measures) + 0.4 * len(swaps)), height=3.6)
    for ax, model in zip(axes[0], names):
        row = data.sel(model=model).dropna("condition", how="all")
        offsets = np.linspace(-0.15, 0.15, len(swaps)) if len(swaps) > 1 else np.zeros(1)
        for offset, swap in zip(offsets, swaps):
            if swap in row.condition.values:
                est = xr.concat([row[k].sel(condition=swap) for k, _ in measures], dim="measure")
                marker_line(ax, np.arange(len(measures)) + offset, est, colors[swap], swap)
        ax.set_xticks(range(len(measures)), [label for _, label in measures], fontsize=8)
        ax.set(title=model, ylabel="D_KL (nats)")
        ax.set_ylim(bottom=0)
    return plot.finish("swap condition")


register_analysis(Analysis(
    name="kv-substitution", section="KV-cache substitution", inputs=("logprobs",), metrics=(kv.kv_substitution,),
    table=kv_substitution_table, figures=(kv_substitution,), order=70))
