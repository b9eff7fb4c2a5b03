"""`update-decomposition`: per model and decoder layer, what the attention and MLP branches add
relative to the stream they read, ‖a_l‖/‖h_l‖ and ‖m_l‖/‖h_l‖ per modality
(`branches.update_decomposition`). Figure `branch_shares.png`: both per decoder layer, one line per
modality.
"""

from __future__ import annotations

from pathlib import Path

import xarray as xr

from .. import branches
from ..cache import MissingInputs
from ..figures import FigureFile, Plot, modality_panels
from ..registry import Analysis, register_analysis
from ..tables import Builder, Options, Table, missing, modality_rows


def update_decomposition_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    """The update decomposition (`branches.update_decomposition`): per decoder layer, what the
    attention and MLP branches add relative to the stream they read, per modality."""
    ref = options.reference
    b = Builder("update-decomposition", f"Attention and MLP updates relative to the residual stream (condition {ref})",
                ["model", "decoder layer", "vision ‖a_l‖/‖h_l‖", "vision ‖m_l‖/‖h_l‖",
                 "text ‖a_l‖/‖h_l‖", "text ‖m_l‖/‖h_l‖"], options)

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        if not branches.branch_layers(ds):
            raise MissingInputs("a decoder layer with attn_out, mlp_out and its residual layer stored")
        text_set = options.definitions_for(ds)["text_set"]
        data = branches.update_decomposition(ds, text_set=text_set, **options.boot()).sel(condition=ref)
        modality_rows(b, model, data, "decoder_layer", tuple(branches.BRANCHES))
        return data

    return b.run(models, lambda ds: missing(ds, branches.VARIABLES, (ref,)), fill, first_note=(
        "Decoder layer l reads h_l and adds a_l (attention branch) and m_l (MLP branch) to it: "
        "h_(l+1) = h_l + a_l + m_l. Each share is the mean over a sample's tokens of that "
        "modality, then over samples. Per-token values: analyses.branches.token_shares."))


def branch_shares(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `update-decomposition` table as curves: ‖a_l‖/‖h_l‖ and ‖m_l‖/‖h_l‖ per decoder layer,
    one panel per model and branch, one line per modality."""
    title = f"Attention and MLP updates relative to the stream ({options.reference})"
    plot = Plot("branch_shares", title, options, out)
    data = plot.table(update_decomposition_table, models, options)
    if data is None:
        return plot.file
    panels = (("attn_share", "‖a_l‖/‖h_l‖ (attention)"), ("mlp_share", "‖m_l‖/‖h_l‖ (MLP)"))
    return modality_panels(plot, data, "decoder_layer", panels, "decoder layer l", "ratio (unitless)")


register_analysis(Analysis(
    name="update-decomposition", section="Attention and MLP updates by modality and layer", inputs=branches.VARIABLES,
    metrics=(branches.update_decomposition,), table=update_decomposition_table, figures=(branch_shares,),
    claim="due to higher norms, the same update vector has a smaller impact on vision tokens (Observation 2)",
    order=110))
