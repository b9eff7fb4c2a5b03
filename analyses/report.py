"""`workbench report STORE --out DIR`: the study's tables and figures in one markdown report.

Writes DIR/report.md and the PNG figures of `analyses.figures` beside it, section by section in
the study's order (observations, ablation, experiments). Tables and figures whose inputs the
store lacks are replaced by one line saying what is missing.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from workbench.store import store_info

from .cache import forcing
from .figures import FigureFile, write_figures
from .tables import Options, Table, build_tables, open_models

SECTIONS = (
    ("Observation 1: vision tokens enter with higher norms", ["norm-ratio"], ["norms_updates"]),
    ("Observation 2: high norms dilute vision-token updates", ["first-update"], ["cosine_to_first"]),
    ("Ablation 1: image content and text-token trajectories", ["correlation"], ["text_curves"]),
    ("Experiment 1: scaling vision tokens at inference time", ["alpha"], ["kl_vs_alpha", "attention_mass"]),
    ("Experiment 2: KV cache disruption", ["kv-cosine"], ["kv_cosine_vs_alpha"]),
    ("Experiment 3: KV cache substitution", ["kv-substitution"], []),
)


def _store_summary(store: Path) -> list[str]:
    info = store_info(store)
    lines = [f"Store `{store}`: {len(info['models'])} model(s).", ""]
    for model, m in info["models"].items():
        conditions = m["conditions"]
        samples = max((c["samples"] for c in conditions.values()), default=0)
        variables = sorted({v for c in conditions.values() for v in c["variables"]} - {"n_tokens"})
        lines.append(f"- **{model}** ({m.get('family', '?')}, {m.get('n_layers', '?')} layers): "
                     f"{samples} samples; conditions {', '.join(conditions)}; variables {', '.join(variables)}")
    return lines


def _figure_markdown(figure: FigureFile) -> str:
    if figure.path is None:
        return f"*Figure {figure.name}: skipped — {figure.skipped}*"
    return f"![{figure.title}]({figure.path.name})\n\n*{figure.title}.*"


def write_report(store: str | Path, out: str | Path, options: Options | None = None,
                 models: list[str] | None = None) -> Path:
    """Write DIR/report.md with every table and figure; returns its path."""
    store, out = Path(store), Path(out)
    options = options or Options()
    opened = open_models(store, models)
    out.mkdir(parents=True, exist_ok=True)
    with forcing() if options.force else contextlib.nullcontext():   # each analysis recomputed once
        tables: dict[str, Table] = {t.name: t for t in build_tables(store, None, options, models, opened)}
        figures = {f.name.removesuffix(".png"): f for f in write_figures(opened, options, out)}
    lines = ["# Norm-gap analyses", "", f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `workbench report`.", ""]
    lines += _store_summary(store)
    lines += ["", "Every number is a mean over samples (median rank: a median) with its 95% bootstrap CI over "
              f"samples in brackets ({options.n_resamples} resamples, seed {options.seed}); bands in the "
              "figures are the same intervals. Reference condition: "
              f"`{options.reference}`; blank image: `{options.blank}`; no image: `{options.text_only}`; "
              f"KV hybrid: `{options.hybrid}`.", ""]
    for title, table_names, figure_names in SECTIONS:
        lines += [f"## {title}", ""]
        for name in table_names:
            lines += [tables[name].markdown(), ""]
        for name in figure_names:
            lines += [_figure_markdown(figures[name]), ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
