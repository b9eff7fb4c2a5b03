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
from ..figures import FigureFile, Plot, two_layers
from ..plotting import band, condition_colors, layer_axis
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
    plot = Plot("text_curves", f"Text-token trajectories: {ref} vs {options.blank} image vs no image "
                f"({options.text_only})", options, out)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = missing(ds, ("hidden",), (ref,), (0,))
        conditions = set(np.asarray(ds["condition"].values).astype(object).astype(str)) if "token" in ds.dims else set()
        if not lacking and not conditions & {options.blank, options.text_only}:
            lacking = [f"condition {options.blank!r} or {options.text_only!r}"]
        return lacking or two_layers(ds)

    ready = plot.ready(models, need)
    if not ready:
        return plot.file
    colors = condition_colors(compared)
    styles = dict(zip(compared, ("-", "--", ":")))
    labels = {ref: f"{ref} (real image)", options.blank: f"{options.blank} (blank image)",
              options.text_only: f"{options.text_only} (no image)"}
    _, axes = plot.grid(2, len(ready))
    for col, (model, ds) in enumerate(ready.items()):
        text_set = options.definitions_for(ds)["text_set"]
        norm = norms.norm_curves(ds, text_set=text_set, **options.boot()).sel(modality="text")
        cos = rotation.cosine_to_first(ds, text_set=text_set, **options.boot()).sel(modality="text")
        for condition in [c for c in compared if c in norm.condition.values]:
            band(axes[0, col], norm.layer, norm.sel(condition=condition), colors[condition], labels[condition],
                 styles[condition])
            band(axes[1, col], cos.layer, cos.sel(condition=condition), colors[condition], labels[condition],
                 styles[condition])
        axes[0, col].set(title=f"{model}: text ‖h_l‖₂", ylabel="mean text-token L2 norm (activation units)",
                         yscale="log")
        axes[1, col].set(title=f"{model}: text cos(h_l, h_0)", ylabel="mean cos(h_l, h_0) (unitless)")
        for ax in axes[:, col]:
            layer_axis(ax.xaxis)
    return plot.finish("condition")


register_analysis(Analysis(
    name="correlation", section="Text-token trajectories with a real, blank or no image", inputs=("hidden",),
    metrics=(correlation.text_curve_correlation, norms.norm_curves, rotation.cosine_to_first),
    table=correlation_table, figures=(text_curves,), order=30))
