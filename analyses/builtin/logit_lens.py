"""`logit-lens`: per model, layer and modality, how often the lens's top-1 token is already the last
layer's, and the lens's top-1 probability (`lens.logit_lens`). Figure `lens_curves.png`: both per
layer, one line per modality.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import lens
from ..figures import FigureFile, Plot, modality_panels
from ..plotting import LAYER_LABEL
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, missing, modality_rows


def logit_lens_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """The logit lens (`lens.logit_lens`): per layer and modality, how often the lens's top-1 token
    is already the last layer's, and the lens's top-1 probability."""
    ref = options.reference
    b = Builder("logit-lens", f"Logit lens on vision and text tokens by layer (condition {ref})",
                ["model", "layer", "vision top-1 = final", "vision top-1 p", "text top-1 = final", "text top-1 p"],
                options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        text_set = options.definitions_for(ds)["text_set"]
        data = lens.logit_lens(ds, text_set=text_set, **options.boot()).sel(condition=ref)
        modality_rows(b, model, data, "layer", lens.MEASURES)
        return data

    return b.run(models, lambda ds: missing(ds, lens.VARIABLES, (ref,)), fill, first_note=(
        "Lens at layer l: log_softmax(lm_head(final_norm(h_l))), computed at run time. "
        "'top-1 = final': the share of a sample's tokens whose lens top-1 token equals the "
        "top-1 at the last stored layer (the model's own prediction when that is layer L); "
        "'top-1 p': the lens's top-1 probability. Per-token values: analyses.lens.token_lens."))


def lens_curves(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `logit-lens` table as curves per layer: agreement with the final prediction and the
    lens's top-1 probability, one line per modality."""
    title = f"Logit lens by layer ({options.reference})"
    plot = Plot("lens_curves", title, options, out)
    data = plot.table(logit_lens_table, models, options)
    if data is None:
        return plot.file
    panels = (("agreement", "lens top-1 = final top-1"), ("top1_prob", "lens top-1 probability"))
    return modality_panels(plot, data, "layer", panels, LAYER_LABEL, "share / probability")


register_analysis(Analysis(
    name="logit-lens", section="Logit lens on vision and text tokens by layer", inputs=lens.VARIABLES,
    metrics=(lens.logit_lens,), table=logit_lens_table, figures=(lens_curves,), order=130))
