"""`correlation`: per model, the Pearson r over layers of the text-token curves (norm and cosine to
layer 0) between the reference and the blank-image / no-image conditions
(`correlation.text_curve_correlation`). Figure `text_curves.png`: text-token ‖h_l‖ and
cos(h_l, h_0) under a real, blank or no image.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from .. import correlation, norms, rotation
from ..figures import LAYER_LABEL, FigureFile, band, condition_colors, grid, save, two_layers, usable
from ..registry import Analysis, register_analysis
from ..streaming import layout
from ..tables import Builder, Cell, Options, Table, estimate, missing


def correlation_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    ref = options.reference
    wanted = [options.blank, options.text_only]
    present = [c for c in wanted if any(c in layout(ds).conditions for ds in models.values())]
    columns = ["model"] + [f"{ref}–{c} {m} r" for c in present for m in ("norms", "cosine")]
    b = Builder("correlation", f"Correlation of text-token curves across layers ({ref} vs "
                f"{', '.join(present) or ' / '.join(wanted)})", columns, options)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("hidden",), (ref,))
        if not lacking and not set(present) & set(layout(ds).conditions):
            lacking = [f"condition {' or '.join(repr(c) for c in wanted)}"]
        if not lacking and ds.sizes.get("layer", 0) < 3:  # a correlation over 2 points is always ±1
            held = ", ".join(str(int(l)) for l in ds["layer"].values)
            lacking = [f"three or more layers for a correlation over layers (the store holds layer {held})"]
        return lacking

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        r = correlation.text_curve_correlation(ds, ref, present, text_set=text_set, **options.boot())
        row: list[str | Cell] = [model]
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


def text_curves(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    compared = [ref, options.blank, options.text_only]
    title = f"Text-token trajectories: {ref} vs {options.blank} image vs no image ({options.text_only})"
    fig_file = FigureFile("text_curves.png", title)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("hidden",), (ref,), (0,))
        conditions = set(np.asarray(ds["condition"].values).astype(object).astype(str)) if "token" in ds.dims else set()
        if not lacking and not conditions & {options.blank, options.text_only}:
            lacking = [f"condition {options.blank!r} or {options.text_only!r}"]
        return lacking or two_layers(ds)

    ready, skipped = usable(models, need)
    if not ready:
        fig_file.skipped = "; ".join(skipped)
        return fig_file
    colors = condition_colors(compared)
    styles = dict(zip(compared, ("-", "--", ":")))
    fig, axes = grid(2, len(ready))
    for col, (model, ds) in enumerate(ready.items()):
        text_set = options.definitions_for(ds)["text_set"]
        norm = norms.norm_curves(ds, text_set=text_set, **options.boot()).sel(modality="text")
        cos = rotation.cosine_to_first(ds, text_set=text_set, **options.boot()).sel(modality="text")
        for condition in compared:
            if condition not in norm.condition.values:
                continue
            label = {ref: f"{ref} (real image)", options.blank: f"{options.blank} (blank image)",
                     options.text_only: f"{options.text_only} (no image)"}[condition]
            band(axes[0, col], norm.layer, norm.sel(condition=condition), colors[condition], label, styles[condition])
            band(axes[1, col], cos.layer, cos.sel(condition=condition), colors[condition], label, styles[condition])
        axes[0, col].set(title=f"{model}: text ‖h_l‖₂", xlabel=LAYER_LABEL,
                         ylabel="mean text-token L2 norm (activation units)", yscale="log")
        axes[1, col].set(title=f"{model}: text cos(h_l, h_0)", xlabel=LAYER_LABEL,
                         ylabel="mean cos(h_l, h_0) (unitless)")
        for ax in axes[:, col]:
            ax.legend(title="condition", fontsize=8)
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = save(fig, out, fig_file.name)
    return fig_file


register_analysis(Analysis(
    name="correlation", section="Text-token trajectories with a real, blank or no image", inputs=("hidden",),
    metrics=(correlation.text_curve_correlation, norms.norm_curves, rotation.cosine_to_first),
    table=correlation_table, figures=(text_curves,), order=30))
