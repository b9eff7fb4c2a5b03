"""`sae`: the stored activations encoded by sparse autoencoders in SAELens's format (`--sae DIR`,
repeatable; `analyses.sae`). One row per (model, SAE, condition, token group): tokens, L0, variance
explained, MSE, the next-token KL of a run that spliced the reconstruction into those tokens
(`sae_splice`), the features active there, those specific to it, and its top features. Figure
`sae_reconstruction_gap.png`: the fraction of variance unexplained of vision and of text tokens
against the SAEs' layers, and their gap (vision − text) per condition.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import xarray as xr

from .. import sae as sae_analysis
from ..cache import MissingInputs
from ..compare import kl_direction
from ..figures import FigureFile, Plot
from ..plotting import MODALITY_COLORS, band, condition_colors, layer_axis
from ..registry import Analysis, register_analysis
from ..tables import Builder, Cell, Options, Table, estimate

NA = Cell(math.nan, math.nan, math.nan)
SHOWN = ("l0", "explained", "mse")


def _need(ds: xr.Dataset) -> list[str]:
    return []   # what an SAE reads is known from its directory: `fill` says what a model lacks


def _top(features: list[tuple[int, float, float]]) -> str:
    return ", ".join(f"{i} ({frequency:.2f})" for i, frequency, _ in features) or "none"


def sae_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    b = Builder("sae", "Sparse autoencoders on the stored activations", [
        "model", "SAE", "reads", "condition", "tokens of", "tokens", "L0", "variance explained", "MSE",
        f"KL spliced ({kl_direction(options.reference)})", "features active", "features specific to it",
        "dead features", "top features (firing rate)"], options)
    sources = [sae_analysis.sae_source(path) for path in options.sae]

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset:
        if not sources:
            raise MissingInputs("an SAE: `--sae DIR` (SAELens's format, e.g. from `workbench sae train`)")
        parts, lacking = [], []
        for source in sources:
            if source.model not in (None, model):
                lacking.append(f"{source.name}: trained on {source.model}")
                continue
            try:
                data = sae_analysis.sae_metrics(ds, source.path, options.n_resamples, options.seed, force=options.force)
            except MissingInputs as err:
                lacking.append(f"{source.name}: {err}")
                continue
            results = sae_analysis.sae_results(ds, source.path)
            kl = sae_analysis.splice_kl(ds, source, options.reference, options.step, options.n_resamples,
                                        options.seed, options.force)
            _rows(b, model, source, data, results, kl, set(sae_analysis.splice_conditions(ds, source)))
            parts.append(data[list(SHOWN) + ["fvu"]].expand_dims(sae=[source.name]).assign_coords(
                layer=("sae", [source.layer])))
        if not parts:
            raise MissingInputs("; ".join(lacking))
        return xr.concat(parts, dim="sae", join="outer")

    return b.run(models, _need, fill, first_note=(
        "Each SAE (SAELens's format, loaded by sae_lens.SAE.load_from_disk) encodes its stored variable at its layer, "
        "block by block. L0: active features per token; variance explained: 1 − the sample's mean ‖x − x̂‖² over the "
        "group's total variance (SAELens's explained variance, samples weighted equally); MSE: mean ‖x − x̂‖². KL "
        "spliced: compare's KL at step "
        f"{options.step} of a run whose `sae_splice` replaced those tokens by the reconstruction (n/a: no such run "
        f"in the store). Features specific to a group: active there and ≥ {sae_analysis.SPECIFIC:.0%} of their "
        "firing rate (vision + text) is on it; dead: active on no token of any condition. Top features: by mean "
        "activation over the group's tokens (analyses.sae)."))


def _rows(b: Builder, model: str, source: sae_analysis.SaeSource, data: xr.Dataset, results: xr.Dataset,
          kl: dict[str, xr.DataArray], spliced: set[str]) -> None:
    for condition in data.condition.values:
        if condition in spliced:   # its stored values are the reconstruction itself: reported by the KL
            continue
        features = sae_analysis.feature_summary(results, str(condition))
        for group in sae_analysis.GROUPS:
            at = data.sel(condition=condition, group=group)
            n = int(at["n_tokens"])
            if n == 0:
                continue
            cells = [estimate(at[name], 3 if name == "explained" else 2) for name in SHOWN]
            b.count(model, at["l0"])
            kl_cell = estimate(kl[group], 3) if condition == b.options.reference and group in kl else NA
            specific = str(features.specific[group]) if group in features.specific else ""
            b.table.rows.append([model, source.name, f"{source.variable} {source.layer}", str(condition), group, str(n),
                                 *cells, kl_cell, f"{features.alive[group]} of {source.d_sae}", specific,
                                 str(features.dead), _top(features.top[group])])


def sae_reconstruction_gap(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """FVU of vision and text tokens against the SAEs' layers, and the gap vision − text."""
    plot = Plot("sae_reconstruction_gap", "SAE reconstruction: vision against text tokens", options, out)
    data = plot.table(sae_table, models, options)
    if data is None:
        return plot.file
    fig, axes = plot.grid(len(data.model), 2)
    conditions = [str(c) for c in data.condition.values]
    colors = condition_colors(conditions)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model)
        values = values.isel(sae=np.argsort(values["layer"].values, kind="stable"))
        x = values["layer"].values
        fvu, gap = axes[row, 0], axes[row, 1]
        reference = options.reference if options.reference in conditions else conditions[0]
        for group in ("vision", "text"):
            band(fvu, x, values["fvu"].sel(condition=reference, group=group), MODALITY_COLORS[group],
                 f"{group} tokens", marker="o")
        for condition in conditions:
            at = values["fvu"].sel(condition=condition, stat="value")
            diff = at.sel(group="vision").values - at.sel(group="text").values
            if np.isfinite(diff).any():
                gap.plot(x, diff, color=colors[condition], marker="o", label=condition)
        gap.axhline(0.0, color="#777777", linewidth=0.8)
        fvu.set(title=f"{model}: {reference}", ylabel="fraction of variance unexplained")
        gap.set(title=f"{model}: gap per condition", ylabel="FVU vision − FVU text")
        for ax in (fvu, gap):
            layer_axis(ax.xaxis)
    return plot.finish(legend="tokens (left) and condition (right)")


register_analysis(Analysis(
    name="sae", section="Sparse features: does the language model's dictionary cover vision tokens?",
    inputs=("hidden",), metrics=(sae_analysis.sae_metrics, sae_analysis.sae_results, sae_analysis.feature_summary),
    table=sae_table, figures=(sae_reconstruction_gap,), order=185))
