"""The study's figures as PNG files (matplotlib, no display needed: `Figure` objects render with
the Agg canvas).

Every curve is the mean over samples with its 95% bootstrap CI as a shaded band (or error bars).
Colours are fixed across figures: one per modality (`MODALITY_COLORS`), one per model
(`model_colors`, in the store's model order), one per compared condition (`condition_colors`).

| file                      | what                                                                    |
|---------------------------|-------------------------------------------------------------------------|
| norms_updates.png         | ‖h_l‖ and ‖h_l − h_{l−1}‖ per layer, by modality, one column per model  |
| cosine_to_first.png       | cos(h_l, h_0) per layer, by modality, one panel per model               |
| text_curves.png           | text-token ‖h_l‖ and cos(h_l, h_0) under real / blank / no image        |
| attention_mass.png        | prefill and decode text → vision attention mass per layer, per model    |
| kl_vs_alpha.png           | attention KL and logit KL against α (log x), per model                  |
| kv_cosine_vs_alpha.png    | cos(K′, K) and cos(V′, V) at vision tokens against α (log x), per model |
| depth.png                 | mean ‖h_l‖ and ‖h_l − h_{l−1}‖/‖h_{l−1}‖ per layer over all tokens, per model |
| norm_ladder.png           | the norm atlas: mean norm per stage (vision layers → LLM input), vision vs text, per model |
| accuracy_vs_alpha.png     | task accuracy against α (log x), overall and per category, per model; the reference dashed |

A figure is drawn only from what the store holds: a curve over layers needs two or more layers,
a modality is drawn only where it has tokens; a figure none of the models can fill is skipped
with the reason (`FigureFile.skipped`), never written empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from . import accuracy, attention, kv, logits, norms, rotation, updates
from .bootstrap import STATS
from .cache import MissingInputs
from .tables import Options, _missing, _sweep_conditions, _sweep_name

MODALITY_COLORS = {"vision": "#1f77b4", "text": "#d62728", "boundary": "#7f7f7f"}
_MODEL_PALETTE = ("#2ca02c", "#9467bd", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#8c6d31")
_CONDITION_PALETTE = ("#000000", "#ff7f0e", "#8c564b", "#637939", "#7b4173")
LAYER_LABEL = "layer l (0 = LLM input; l = after l decoder layers)"
DECODER_LAYER_LABEL = "decoder layer"
ALPHA_LABEL = "α, scale factor of the projector output (log scale)"
DPI = 100


def model_colors(models: list[str]) -> dict[str, str]:
    return {m: _MODEL_PALETTE[i % len(_MODEL_PALETTE)] for i, m in enumerate(models)}


def condition_colors(conditions: list[str]) -> dict[str, str]:
    return {c: _CONDITION_PALETTE[i % len(_CONDITION_PALETTE)] for i, c in enumerate(conditions)}


@dataclass
class FigureFile:
    name: str
    title: str
    path: Path | None = None
    skipped: str | None = None


def _band(ax, x, est: xr.DataArray, color: str, label: str, linestyle: str = "-", marker: str | None = None) -> None:
    value, low, high = (np.asarray(est.sel(stat=s).values, float) for s in ("value", "ci_low", "ci_high"))
    ok = np.isfinite(value)
    if not ok.any():
        return
    x = np.asarray(x)[ok]
    ax.plot(x, value[ok], color=color, label=label, linestyle=linestyle, marker=marker, markersize=4)
    ax.fill_between(x, low[ok], high[ok], color=color, alpha=0.18, linewidth=0)


def _grid(n_rows: int, n_cols: int, width: float = 4.8, height: float = 3.4) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(width * n_cols, height * n_rows), layout="constrained")
    axes = np.atleast_2d(fig.subplots(n_rows, n_cols, squeeze=False))
    return fig, axes


def _save(fig: Figure, out: Path, name: str) -> Path:
    for ax in fig.axes:
        if ax.get_xscale() == "linear":  # layer axes: whole layers only
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        low, high = ax.get_ylim()
        if ax.get_yscale() == "log" and 0 < low and high / low < 10:
            # less than a decade: plain numbers ("0.18") rather than "1.8×10⁻¹" at every minor tick
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    path = out / name
    fig.savefig(path, dpi=DPI)
    return path


def _two_layers(ds: xr.Dataset) -> list[str]:
    """A curve over layers needs two or more layers stored."""
    if "layer" in ds.dims and ds.sizes["layer"] < 2:
        held = ", ".join(str(int(l)) for l in ds["layer"].values)
        return [f"two or more layers for a curve over layers (the store holds layer {held})"]
    return []


def _usable(models: dict[str, xr.Dataset], need: Callable[[xr.Dataset], list[str]]) -> tuple[dict, list[str]]:
    ok, missing = {}, []
    for model, ds in models.items():
        lacking = need(ds)
        if lacking:
            missing.append(f"{model}: needs {', '.join(lacking)}")
        else:
            ok[model] = ds
    return ok, missing


# -- figures -----------------------------------------------------------------------------------


def norms_updates(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    title = f"Residual-stream norm and update magnitude per layer ({ref})"
    fig_file = FigureFile("norms_updates.png", title)
    usable, missing = _usable(models, lambda ds: _missing(ds, ("hidden",), (ref,)) or _two_layers(ds))
    if not usable:
        fig_file.skipped = "; ".join(missing)
        return fig_file
    fig, axes = _grid(2, len(usable))
    for col, (model, ds) in enumerate(usable.items()):
        norm = norms.norm_curves(ds, text_set=options.definitions_for(ds)["text_set"], **options.boot()).sel(condition=ref)
        update = updates.absolute_update(ds, **options.boot()).sel(condition=ref)
        for modality, color in MODALITY_COLORS.items():
            _band(axes[0, col], norm.layer, norm.sel(modality=modality), color, modality)
            _band(axes[1, col], update.layer, update.sel(modality=modality), color, modality)
        axes[0, col].set(title=f"{model}: ‖h_l‖₂", ylabel="mean token L2 norm (activation units)", yscale="log")
        axes[1, col].set(title=f"{model}: ‖h_l − h_(l−1)‖₂", ylabel="mean update L2 norm (activation units)",
                         yscale="log", xlabel=LAYER_LABEL)
        axes[0, col].set_xlabel(LAYER_LABEL)
        for ax in axes[:, col]:
            ax.legend(title="modality", fontsize=8)
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def cosine_to_first(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    title = f"Cosine similarity to the layer-0 hidden state ({ref})"
    fig_file = FigureFile("cosine_to_first.png", title)
    usable, missing = _usable(models, lambda ds: _missing(ds, ("hidden",), (ref,), (0,)) or _two_layers(ds))
    if not usable:
        fig_file.skipped = "; ".join(missing)
        return fig_file
    fig, axes = _grid(1, len(usable))
    for col, (model, ds) in enumerate(usable.items()):
        cos = rotation.cosine_to_first(ds, text_set=options.definitions_for(ds)["text_set"], **options.boot()).sel(condition=ref)
        ax = axes[0, col]
        for modality, color in MODALITY_COLORS.items():
            _band(ax, cos.layer, cos.sel(modality=modality), color, modality)
        ax.axhline(0, color="#999999", linewidth=0.8)
        ax.set(title=model, xlabel=LAYER_LABEL, ylabel="mean cos(h_l, h_0) (unitless)")
        ax.set_ylim(top=1.05)
        ax.legend(title="modality", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def text_curves(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    compared = [ref, options.blank, options.text_only]
    title = f"Text-token trajectories: {ref} vs {options.blank} image vs no image ({options.text_only})"
    fig_file = FigureFile("text_curves.png", title)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("hidden",), (ref,), (0,))
        conditions = set(np.asarray(ds["condition"].values).astype(object).astype(str)) if "token" in ds.dims else set()
        if not lacking and not conditions & {options.blank, options.text_only}:
            lacking = [f"condition {options.blank!r} or {options.text_only!r}"]
        return lacking or _two_layers(ds)

    usable, missing = _usable(models, need)
    if not usable:
        fig_file.skipped = "; ".join(missing)
        return fig_file
    colors = condition_colors(compared)
    styles = dict(zip(compared, ("-", "--", ":")))
    fig, axes = _grid(2, len(usable))
    for col, (model, ds) in enumerate(usable.items()):
        text_set = options.definitions_for(ds)["text_set"]
        norm = norms.norm_curves(ds, text_set=text_set, **options.boot()).sel(modality="text")
        cos = rotation.cosine_to_first(ds, text_set=text_set, **options.boot()).sel(modality="text")
        for condition in compared:
            if condition not in norm.condition.values:
                continue
            label = {ref: f"{ref} (real image)", options.blank: f"{options.blank} (blank image)",
                     options.text_only: f"{options.text_only} (no image)"}[condition]
            _band(axes[0, col], norm.layer, norm.sel(condition=condition), colors[condition], label, styles[condition])
            _band(axes[1, col], cos.layer, cos.sel(condition=condition), colors[condition], label, styles[condition])
        axes[0, col].set(title=f"{model}: text ‖h_l‖₂", xlabel=LAYER_LABEL,
                         ylabel="mean text-token L2 norm (activation units)", yscale="log")
        axes[1, col].set(title=f"{model}: text cos(h_l, h_0)", xlabel=LAYER_LABEL,
                         ylabel="mean cos(h_l, h_0) (unitless)")
        for ax in axes[:, col]:
            ax.legend(title="condition", fontsize=8)
            ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def attention_mass(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref = options.reference
    title = f"Text → vision attention mass per decoder layer ({ref})"
    fig_file = FigureFile("attention_mass.png", title)
    usable, missing = _usable(models, lambda ds: [] if {"prefill_vision_mass", "decode_attention"} & set(ds.data_vars)
                              and ref in np.asarray(ds["condition"].values).astype(object).astype(str)
                              else ["prefill_vision_mass or decode_attention", f"condition {ref!r}"])
    if not usable:
        fig_file.skipped = "; ".join(missing)
        return fig_file
    colors = model_colors(list(models))
    fig, axes = _grid(1, 2, width=5.5, height=3.8)
    for model, ds in usable.items():
        if "prefill_vision_mass" in ds.data_vars:
            mass = attention.prefill_vision_mass(ds, "text", **options.boot()).sel(condition=ref)
            _band(axes[0, 0], mass.decoder_layer, mass, colors[model], model, marker="o")
        if "decode_attention" in ds.data_vars:
            mass = attention.decode_vision_mass(ds, None, **options.boot()).sel(condition=ref)
            _band(axes[0, 1], mass.decoder_layer, mass, colors[model], model, marker="o")
    axes[0, 0].set(title="prefill: text-token queries\n(mean over heads and text tokens)", xlabel=DECODER_LAYER_LABEL,
                   ylabel="attention mass on vision keys (probability)")
    axes[0, 1].set(title="decode: generated-token queries\n(mean over heads and decode steps)",
                   xlabel=DECODER_LAYER_LABEL, ylabel="attention mass on vision keys (probability)")
    for ax in axes[0]:
        ax.set_ylim(bottom=0)
        ax.legend(title="model", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def _alpha_series(ds: xr.Dataset, est: xr.DataArray, sweep: str) -> tuple[np.ndarray, xr.DataArray]:
    conditions = _sweep_conditions(ds, sweep)
    names = [c for c, _, _ in conditions if c in est.condition.values]
    values = np.array([v for c, v, _ in conditions if c in names])
    return values, est.sel(condition=names)


def kl_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref, sweep = options.reference, options.sweep
    title = f"Divergence from {ref} against the projector scale {_sweep_name(sweep)}"
    fig_file = FigureFile("kl_vs_alpha.png", title)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, (), (ref,))
        if not {"decode_attention", "logprobs"} & set(ds.data_vars):
            lacking.append("decode_attention or logprobs")
        if not lacking and not _sweep_conditions(ds, sweep):
            lacking.append(f"conditions sweeping {sweep}")
        return lacking

    usable, missing = _usable(models, need)
    if not usable:
        fig_file.skipped = "; ".join(missing)
        return fig_file
    colors = model_colors(list(models))
    kinds = [k for k in ("decode_attention", "logprobs") if any(k in ds.data_vars for ds in usable.values())]
    fig, axes = _grid(1, len(kinds), width=5.5, height=3.8)  # a panel only for what the store holds
    panel = {kind: axes[0, i] for i, kind in enumerate(kinds)}
    for model, ds in usable.items():
        panels = []
        if "decode_attention" in ds.data_vars:
            average_layers = options.definitions_for(ds)["average_layers"]
            panels.append((panel["decode_attention"], attention.vision_attention_kl(
                ds, ref, options.step, average_layers=average_layers, **options.boot())))
        if "logprobs" in ds.data_vars:
            panels.append((panel["logprobs"], logits.logit_kl(ds, ref, options.step, **options.boot())))
        for ax, est in panels:
            x, est = _alpha_series(ds, est, sweep)
            _band(ax, x, est, colors[model], model, marker="o")
    if "decode_attention" in panel:
        panel["decode_attention"].set(title=f"attention over vision keys (decode step {options.step};\nmean over "
                                      "layers and heads)", ylabel=f"KL({ref} ‖ condition) (nats)")
    if "logprobs" in panel:
        panel["logprobs"].set(title=f"next-token distribution\n(decode step {options.step})",
                              ylabel=f"KL({ref} ‖ condition) (nats)")
    for ax in axes[0]:
        ax.set(xscale="log", xlabel=ALPHA_LABEL)
        ax.axvline(1.0, color="#999999", linestyle="--", linewidth=0.8)
        ax.set_ylim(bottom=0)
        ax.legend(title="model", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def kv_cosine_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    ref, sweep = options.reference, options.sweep
    title = f"Vision-token keys and values against {ref} as {_sweep_name(sweep)} varies (mean over layers)"
    fig_file = FigureFile("kv_cosine_vs_alpha.png", title)

    def need(ds: xr.Dataset) -> list[str]:
        lacking = _missing(ds, ("keys", "values"), (ref,))
        if not lacking and not _sweep_conditions(ds, sweep):
            lacking.append(f"conditions sweeping {sweep}")
        return lacking

    usable, missing = _usable(models, need)
    if not usable:
        fig_file.skipped = "; ".join(missing)
        return fig_file
    colors = model_colors(list(models))
    fig, axes = _grid(1, 2, width=5.5, height=3.8)
    for model, ds in usable.items():
        est = kv.kv_cosine(ds, ref, "vision", average_layers=options.definitions_for(ds)["average_layers"], **options.boot())
        x, k = _alpha_series(ds, est["cos_k"], sweep)
        _, v = _alpha_series(ds, est["cos_v"], sweep)
        _band(axes[0, 0], x, k, colors[model], model, marker="o")
        _band(axes[0, 1], x, v, colors[model], model, "--", marker="s")
    axes[0, 0].set(title="keys: cos(K′, K)", ylabel="mean cosine similarity (unitless)")
    axes[0, 1].set(title="values: cos(V′, V)", ylabel="mean cosine similarity (unitless)")
    for ax in axes[0]:
        ax.set(xscale="log", xlabel=ALPHA_LABEL, ylim=(min(-0.05, ax.get_ylim()[0]), 1.05))
        ax.axvline(1.0, color="#999999", linestyle="--", linewidth=0.8)
        ax.legend(title="model", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def _from_table(name: str, title: str, build: Callable, models: dict[str, xr.Dataset],
                options: Options) -> tuple[FigureFile, xr.Dataset | None]:
    """A figure drawn from a table's data: the data, or None with the table's reason to skip."""
    fig_file = FigureFile(name, title)
    table = build(models, options)
    if table.skipped or table.data is None:
        fig_file.skipped = table.skipped or "no model in the store"
        return fig_file, None
    return fig_file, table.data


def depth(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `depth` table as curves: norm growth and the update ratio per layer, one line per model."""
    from .tables import depth_table

    title = f"Residual-stream norm and update ratio by depth (all tokens, {options.reference})"
    fig_file, data = _from_table("depth.png", title, depth_table, models, options)
    if data is None:
        return fig_file
    colors = model_colors(list(models))
    fig, axes = _grid(1, 2)
    for model in data.model.values:
        row = data.sel(model=model)
        _band(axes[0, 0], row.layer, row["norm"], colors[str(model)], str(model), marker="o")
        _band(axes[0, 1], row.layer, row["relative_update"], colors[str(model)], str(model), marker="o")
    axes[0, 0].set(title="‖h_l‖₂ (mean over tokens)", xlabel=LAYER_LABEL, ylabel="L2 norm (activation units)",
                   yscale="log")
    axes[0, 1].set(title="‖h_l − h_(l−1)‖₂ / ‖h_(l−1)‖₂", xlabel=LAYER_LABEL, ylabel="update ratio (unitless)")
    for ax in axes[0]:
        ax.legend(title="model", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def heads(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `heads` table as heat maps, one row per model: each head's text→vision attention mass
    and its attention-sink mass (mean over samples) by decoder layer."""
    from .tables import heads_table

    title = f"Attention per head: text→vision mass and the sink ({options.reference}, step {options.step})"
    fig_file, data = _from_table("heads.png", title, heads_table, models, options)
    if data is None:
        return fig_file
    panels = [(k, label) for k, label in (("vision_mass_by_head", "text→vision mass"),
                                          ("sink_by_head", "sink mass (first position)")) if k in data]
    names = [str(m) for m in data.model.values]
    fig, axes = _grid(len(names), len(panels), width=4.6)
    for i, model in enumerate(names):
        for j, (key, label) in enumerate(panels):
            ax = axes[i, j]
            values = data[key].sel(model=model, stat="value").dropna("head", how="all").dropna("decoder_layer", how="all")
            image = ax.imshow(values.transpose("decoder_layer", "head").values, aspect="auto", origin="lower",
                              cmap="viridis", vmin=0.0)
            ax.set(title=f"{model}: {label}", xlabel="head", ylabel="decoder layer")
            fig.colorbar(image, ax=ax, label="attention probability")
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def kv_heads_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `kv-heads` table as curves: each KV head's cos(K′,K) and cos(V′,V) at vision tokens
    against the swept value, one line per head, one row of panels per model."""
    from .tables import kv_heads_table

    title = f"Vision-token keys and values per KV head against {_sweep_name(options.sweep)} ({options.reference})"
    fig_file, data = _from_table("kv_heads_vs_alpha.png", title, kv_heads_table, models, options)
    if data is None:
        return fig_file
    fig, axes = _grid(len(data.model), 2)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model).dropna("condition", how="all")
        x = values[options.sweep].values if options.sweep in values.coords else np.arange(values.sizes["condition"])
        order = np.argsort(x)
        for col, (name, label) in enumerate((("cos_k_by_head", "cos(K′,K)"), ("cos_v_by_head", "cos(V′,V)"))):
            ax = axes[row, col]
            heads_ = values[name].dropna("kv_head", how="all")
            colors = model_colors([f"head {int(h)}" for h in heads_.kv_head.values])
            for h in heads_.kv_head.values:
                _band(ax, x[order], heads_.sel(kv_head=h).isel(condition=order), colors[f"head {int(h)}"],
                      f"head {int(h)}", marker="o")
            ax.set(title=f"{model}: {label} per KV head", xscale="log", xlabel=ALPHA_LABEL, ylabel="cosine (unitless)")
    return _finish(fig, axes, "KV head", title, fig_file, out)


def ladder_stages(n_vision_layers: int) -> list[str]:
    """The x axis of a norm ladder: the tower's layers, its output, the embedding table, the LLM input."""
    return [f"vision L{l}" for l in range(n_vision_layers)] + ["tower output", "embedding table", "LLM input"]


def norm_ladder(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `atlas` table as a ladder per model: mean norm (log) at each stage of the interface.
    Vision: each tower layer, the tower's output, the connector's output at the LLM input (CI
    bands). Text: the embedding table's mean row norm (error bar: p5–p95 of the vocabulary) and the
    text tokens at the LLM input."""
    from .tables import atlas_table

    title = f"Norm ladder across the vision-language interface ({options.reference})"
    fig_file, data = _from_table("norm_ladder.png", title, atlas_table, models, options)
    if data is None:
        return fig_file
    names = [str(m) for m in data.model.values]
    n_cols = min(4, len(names))
    fig, axes = _grid(-(-len(names) // n_cols), n_cols, width=4.2)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax, model in zip(axes.flat, names):
        row = data.sel(model=model)
        layers = row["vision_layer_norm"].dropna("vision_layer", how="all")
        n = layers.sizes["vision_layer"]
        stages = ladder_stages(n)
        # vision: tower layers 0..n-1, the tower's output at n, the connector's output at n + 2
        vision = np.concatenate([layers.transpose("vision_layer", "stat").values,
                                 row["vision_norm"].values[None], row["connector_norm"].values[None]])
        x = [*range(n + 1), n + 2]
        _band(ax, x, xr.DataArray(vision, dims=("x", "stat"), coords={"stat": list(STATS)}),
              MODALITY_COLORS["vision"], "vision", marker="o")
        mean, low, high = (float(row[k]) for k in ("table_mean", "table_p05", "table_p95"))
        ax.errorbar([n + 1], [mean], yerr=[[mean - low], [high - mean]], color=MODALITY_COLORS["text"], marker="s",
                    capsize=3, linestyle="none", label="text: embedding table (p5–p95)")
        _band(ax, [n + 2], row["text_input_norm"].expand_dims(x=1), MODALITY_COLORS["text"], "text: LLM input",
              marker="o")
        ax.set_xticks(range(len(stages)), stages, rotation=45, ha="right", fontsize=7)
        ax.set(title=model, ylabel="mean L2 norm (log)", yscale="log")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def _modality_panels(data: xr.Dataset, x: str, panels: tuple[tuple[str, str], ...], xlabel: str, ylabel: str,
                     title: str, fig_file: FigureFile, out: Path) -> FigureFile:
    """One row of panels per model (one per (variable, label) of `panels`), one line per modality
    with its CI band, over the dim `x`."""
    fig, axes = _grid(len(data.model), len(panels))
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model)
        for col, (name, label) in enumerate(panels):
            ax = axes[row, col]
            for modality, color in MODALITY_COLORS.items():
                if modality in values.modality:
                    _band(ax, values[x], values[name].sel(modality=modality), color, modality, marker="o")
            ax.set(title=f"{model}: {label}", xlabel=xlabel, ylabel=ylabel)
    return _finish(fig, axes, "modality", title, fig_file, out)


def _finish(fig: Figure, axes: np.ndarray, legend: str, title: str, fig_file: FigureFile, out: Path) -> FigureFile:
    """Legends (titled `legend`) and grids on every panel, the title, and the file written."""
    for ax in axes.flat:
        ax.legend(title=legend, fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def accuracy_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `accuracy` table against the swept α: one panel overall, one per category; the reference
    condition's accuracy as a dashed line in the model's colour."""
    ref, sweep = options.reference, options.sweep
    title = f"Task accuracy against the projector scale {_sweep_name(sweep)}"
    fig_file = FigureFile("accuracy_vs_alpha.png", title)

    def need(ds: xr.Dataset) -> list[str]:
        missing = accuracy.lacking(ds)
        return missing or ([] if _sweep_conditions(ds, sweep, "run") else [f"conditions sweeping {sweep}"])

    usable, missing = _usable(models, need)
    if not usable:
        fig_file.skipped = "; ".join(missing)
        return fig_file
    data = {model: accuracy.accuracy(ds, **options.boot()) for model, ds in usable.items()}
    categories = sorted({str(c) for d in data.values() if "category" in d.dims for c in d.category.values})
    panels = ["all", *categories]
    colors = model_colors(list(models))
    fig, axes = _grid(1, len(panels), width=4.2, height=3.6)
    for model, ds in usable.items():
        conditions = _sweep_conditions(ds, sweep, "run")
        x = np.array([v for _, v, _ in conditions])
        names = [c for c, _, _ in conditions]
        for ax, panel in zip(axes[0], panels):
            if panel == "all":
                est = data[model]["accuracy"]
            elif "category" in data[model].dims and panel in data[model].category.values:
                est = data[model]["accuracy_by_category"].sel(category=panel)
            else:
                continue
            _band(ax, x, est.sel(condition=names), colors[model], model, marker="o")
            if ref in est.condition.values and np.isfinite(float(est.sel(condition=ref, stat="value"))):
                ax.axhline(float(est.sel(condition=ref, stat="value")), color=colors[model], linestyle="--",
                           linewidth=0.9)
    for ax, panel in zip(axes[0], panels):
        ax.set(title="all samples" if panel == "all" else panel, xscale="log", xlabel=ALPHA_LABEL,
               ylabel="accuracy (fraction correct)", ylim=(-0.05, 1.05))
        ax.axvline(1.0, color="#999999", linestyle="--", linewidth=0.8)
        ax.legend(title=f"model (dashed: {ref})", fontsize=8)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title)
    fig_file.path = _save(fig, out, fig_file.name)
    return fig_file


def lens_curves(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `logit-lens` table as curves per layer: agreement with the final prediction and the
    lens's top-1 probability, one line per modality."""
    from .tables import logit_lens_table

    title = f"Logit lens by layer ({options.reference})"
    fig_file, data = _from_table("lens_curves.png", title, logit_lens_table, models, options)
    if data is None:
        return fig_file
    panels = (("agreement", "lens top-1 = final top-1"), ("top1_prob", "lens top-1 probability"))
    return _modality_panels(data, "layer", panels, LAYER_LABEL, "share / probability", title, fig_file, out)


def trajectories_vs_alpha(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `trajectories` table as curves over layers, one line per swept value: the vision tokens'
    norm and their cosine to the reference."""
    from .tables import trajectories_table

    title = f"Vision-token trajectories against {_sweep_name(options.sweep)} ({options.reference})"
    fig_file, data = _from_table("trajectories_vs_alpha.png", title, trajectories_table, models, options)
    if data is None:
        return fig_file
    fig, axes = _grid(len(data.model), 2)
    for row, model in enumerate(data.model.values):
        values = data.sel(model=model).dropna("condition", how="all")
        colors = condition_colors([str(c) for c in values.condition.values])
        for condition in values.condition.values:
            curve = values.sel(condition=condition)
            _band(axes[row, 0], curve.layer, curve["norm"], colors[str(condition)], str(condition), marker="o")
            _band(axes[row, 1], curve.layer, curve["cos_reference"], colors[str(condition)], str(condition), marker="o")
        axes[row, 0].set(title=f"{model}: vision ‖h_l‖₂", xlabel=LAYER_LABEL, ylabel="L2 norm (activation units)",
                         yscale="log")
        axes[row, 1].set(title=f"{model}: cos(h_l, h_l of {options.reference})", xlabel=LAYER_LABEL,
                         ylabel="cosine (unitless)")
    return _finish(fig, axes, "condition", title, fig_file, out)


def branch_shares(models: dict[str, xr.Dataset], options: Options, out: Path) -> FigureFile:
    """The `update-decomposition` table as curves: ‖a_l‖/‖h_l‖ and ‖m_l‖/‖h_l‖ per decoder layer,
    one panel per model and branch, one line per modality."""
    from .tables import update_decomposition_table

    title = f"Attention and MLP updates relative to the stream ({options.reference})"
    fig_file, data = _from_table("branch_shares.png", title, update_decomposition_table, models, options)
    if data is None:
        return fig_file
    panels = (("attn_share", "‖a_l‖/‖h_l‖ (attention)"), ("mlp_share", "‖m_l‖/‖h_l‖ (MLP)"))
    return _modality_panels(data, "decoder_layer", panels, "decoder layer l", "ratio (unitless)", title, fig_file, out)


FIGURES: dict[str, Callable[[dict[str, xr.Dataset], Options, Path], FigureFile]] = {
    "norms_updates": norms_updates,
    "cosine_to_first": cosine_to_first,
    "text_curves": text_curves,
    "attention_mass": attention_mass,
    "kl_vs_alpha": kl_vs_alpha,
    "kv_cosine_vs_alpha": kv_cosine_vs_alpha,
    "kv_heads_vs_alpha": kv_heads_vs_alpha,
    "depth": depth,
    "heads": heads,
    "norm_ladder": norm_ladder,
    "branch_shares": branch_shares,
    "lens_curves": lens_curves,
    "trajectories_vs_alpha": trajectories_vs_alpha,
    "accuracy_vs_alpha": accuracy_vs_alpha,
}


def write_figures(models: dict[str, xr.Dataset], options: Options, out: str | Path) -> list[FigureFile]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for make in FIGURES.values():
        try:
            results.append(make(models, options, out))
        except MissingInputs as err:
            results.append(FigureFile(make.__name__ + ".png", make.__name__, skipped=str(err)))
    return results
