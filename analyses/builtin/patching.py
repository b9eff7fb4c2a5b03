"""`patching`: every patching scan a store holds (`workbench.spec.scans`), per model: the effect
of each (layer, position group) patch on the chosen metric (`--metric kl | logit_diff |
answer_logprob`, `--tokens A,B` for the logit difference), normalized to 0 at the base run and 1
at the donor run, with its CI over samples (`analyses.patching`). One row per scan, direction,
layer and position group (and head, for a scan over `heads`). Figure `patching_heatmap.png`:
ROME's causal-tracing heat map, layer across, position group down, one row of panels per model;
`patching_heads.png`: for the scans over heads, layer across and head down, one panel per
position group.
"""

from __future__ import annotations

import math
from pathlib import Path

import xarray as xr

from .. import patching
from ..figures import FigureFile, Plot
from ..plotting import heatmap, not_stored
from ..cache import MissingInputs
from ..registry import Analysis, register_analysis
from ..tables import Builder, Cell, Options, Table, estimate, without_nonfinite

NA = Cell(math.nan, math.nan, math.nan)


def _need(ds: xr.Dataset) -> list[str]:
    lacking = [] if "logprobs" in ds.data_vars else ["logprobs (a `logits` capture)"]
    if not patching.scan_runs(ds):
        lacking.append("a patching scan's runs (a condition with `scan:`)")
    return lacking


def _effects(ds: xr.Dataset, options: Options, per_head: bool = False) -> xr.Dataset:
    return patching.patching_effects(ds, options.metric, options.tokens, **options.boot(), per_head=per_head)


def _metric_name(options: Options) -> str:
    label = patching.METRIC_LABELS[options.metric]
    if options.metric == "logit_diff" and options.tokens:
        label = f"ln p({options.tokens[0]}) − ln p({options.tokens[1]})"
    return label


def patching_table(models: dict[str, xr.Dataset], options: Options) -> Table:
    metric = _metric_name(options)
    b = Builder("patching", f"Patching scans: effect on {metric}, 0 = base run, 1 = donor run", [
        "model", "scan (site)", "direction: base ← donor", "layer", "positions", "normalized effect",
        f"{metric}", f"{metric}: base", f"{metric}: donor"], options)

    def rows(model: str, data: xr.Dataset) -> None:
        heads = [int(h) for h in data["head"].values] if "head" in data.dims else [None]
        for scan in data.scan.values:
            site = str(data.site.sel(scan=scan).values)
            if "method" in data.coords and str(data["method"].sel(scan=scan).values) == "attribution":
                site += ", attribution"
            for direction in data.direction.values:
                at = {"scan": scan, "direction": direction}
                if not str(data.base.sel(at).values):
                    continue
                base, donor = str(data.base.sel(at).values), str(data.donor.sel(at).values)
                ends = [estimate(data[name].sel(at), 3) for name in ("base_metric", "donor_metric")]
                for layer, head, position in ((l, h, p) for l in data.layer.values for h in heads
                                              for p in data.position.values):
                    cell = {**at, "layer": layer, "position": position, **({} if head is None else {"head": head})}
                    effect = data.effect.sel(cell)
                    if not (effect.sel(stat="value").notnull()):
                        continue
                    b.count(model, effect)
                    b.table.rows.append([model, f"{scan} ({site}{'' if head is None else f', head {head}'})",
                                         f"{direction}: {base} ← {donor}", str(int(layer)), str(position),
                                         estimate(effect, 2), estimate(data.metric.sel(cell), 3), *ends])

    def fill(model: str, ds: xr.Dataset) -> xr.Dataset | None:
        runs = patching.scan_runs(ds)
        asked = f"{options.metric}:{','.join(str(t) for t in options.tokens or ())}"
        for estimated in sorted({r.estimated for r in runs if r.method == "attribution"} - {asked}):
            metric, _, tokens = estimated.partition(":")
            ask = f"--metric {metric}" + (f" --tokens {tokens}" if tokens else "")
            b.table.notes.append(f"{model}: the attribution scans estimated {metric} {tokens} at run time: shown "
                                 f"with {ask}.")
        if any(r.head is not None for r in runs):
            rows(model, _effects(ds, options, per_head=True))
        if all(r.head is not None for r in runs):
            return None
        data = _effects(ds, options)
        rows(model, data)
        return data

    table = b.run(models, _need, fill, first_note=(
        f"Per cell, the run with the site's value at that layer and those positions copied from the donor run: "
        f"normalized effect = (mean {metric} of the run − the base's) / (the donor's − the base's), means over the "
        "samples holding all three (0: the patch changes nothing; 1: it gives the donor's value), its CI a bootstrap "
        "of that ratio; the metric at decode step 0 (the prompt's next token). Denoising patches the clean run into "
        "the corrupt one (how much one site restores), noising the corrupt into the clean (how much one site "
        "destroys). Heat map: figure patching_heatmap.png; every cell: the table's data (analyses.patching)."))
    return table


def patching_heatmap(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """ROME's causal-tracing figure: the normalized effect per layer (across) and position group
    (down), one panel per scan and direction, one row per model."""
    metric = _metric_name(options)
    plot = Plot("patching_heatmap", f"Patching: normalized effect on {metric} (0 = base run, 1 = donor run)",
                options, out)
    data = plot.table(patching_table, models, options)
    if data is None:
        return plot.file if plot.file.skipped else plot.skip("every scan patches single heads (figure patching_heads)")
    panels = [(str(s), str(d)) for s in data.scan.values for d in data.direction.values
              if (data.base.sel(scan=s, direction=d) != "").any()]   # the (scan, direction) pairs some model ran
    fig, axes = plot.grid(len(data.model), len(panels), width=5.2, height=3.6)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model)
        for col, (scan, direction) in enumerate(panels):
            ax = axes[row, col]
            grid = values.effect.sel(scan=scan, direction=direction, stat="value")
            base = str(values.base.sel(scan=scan, direction=direction).values)
            if not base or not grid.notnull().any():
                not_stored(ax, f"{model}: no {direction} runs of scan {scan!r}")
                continue
            grid = grid.dropna("layer", how="all").dropna("position", how="all")
            donor = str(values.donor.sel(scan=scan, direction=direction).values)
            site = str(values.site.sel(scan=scan).values)
            heatmap(fig, ax, grid, x="layer", y="position", label=f"normalized effect on {metric}")
            ax.set(title=f"{model}: {scan} ({site}), {direction}: {base} ← {donor}",
                   xlabel="layer (the patched site's index)", ylabel="patched positions")
            ax.invert_yaxis()  # the prompt's order, top to bottom, as ROME draws it
    return plot.finish(legend=None)


def patching_heads(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The scans over heads: the normalized effect per layer (across) and head (down), one panel
    per scan, direction and position group, one row per model."""
    metric = _metric_name(options)
    plot = Plot("patching_heads", f"Patching per head: normalized effect on {metric} (0 = base run, 1 = donor run)",
                options, out)
    found: dict[str, xr.Dataset] = {}
    lacking: list[str] = []
    for model, ds in models.items():
        need = _need(ds)
        if not need and not any(r.head is not None for r in patching.scan_runs(ds)):
            need = ["a patching scan over heads (`scan:` with `heads`, site attn_heads)"]
        if need:
            lacking.append(f"{model}: needs {', '.join(need)}")
            continue
        try:
            found[model] = _effects(without_nonfinite(ds)[0], options, per_head=True)
        except MissingInputs as err:
            lacking.append(f"{model}: {err}")
    if not found:
        return plot.skip("; ".join(lacking) or "no model in the store")
    panels = sorted({(str(s), str(d), str(p)) for data in found.values() for s in data.scan.values
                     for d in data.direction.values for p in data.position.values})
    fig, axes = plot.grid(len(found), len(panels), width=5.2, height=3.6)
    for row, (model, data) in enumerate(found.items()):
        for col, (scan, direction, position) in enumerate(panels):
            ax = axes[row, col]
            held = scan in data.scan.values and direction in data.direction.values and position in data.position.values
            grid = data.effect.sel(scan=scan, direction=direction, position=position, stat="value") if held else None
            if grid is None or not grid.notnull().any():
                not_stored(ax, f"{model}: no {direction} runs of scan {scan!r} at {position}")
                continue
            grid = grid.dropna("layer", how="all").dropna("head", how="all")
            at = {"scan": scan, "direction": direction}
            heatmap(fig, ax, grid, x="layer", y="head", label=f"normalized effect on {metric}")
            ax.set(title=f"{model}: {scan}, {direction}: {str(data.base.sel(at).values)} ← "
                         f"{str(data.donor.sel(at).values)}, positions {position}",
                   xlabel="layer (the patched site's index)", ylabel="head")
    return plot.finish(legend=None)


register_analysis(Analysis(
    name="patching", section="Patching scans: where the donor's output is carried",
    inputs=("logprobs", "run_answer_ids"), metrics=(patching.patching_effects, patching.normalized_effect),
    table=patching_table, figures=(patching_heatmap, patching_heads), order=170))
