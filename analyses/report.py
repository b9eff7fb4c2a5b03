"""`workbench report STORE --out DIR`: the study's tables and figures in one markdown report.

Writes DIR/report.md and the PNG figures of `analyses.figures` beside it, section by section in
the study's order (observations, ablation, experiments), then depth. Headings name what is
measured; where the study made a claim about it, the claim is quoted beside it as "the study
reports ...", never as this store's conclusion: the numbers below it may agree or not. Sections
are chosen by what the store holds: a section with nothing to show is listed at the end with the
reason; within a shown section, a table or figure that cannot be drawn is one line saying why.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from workbench.store import store_info

from .cache import forcing
from .figures import FigureFile, write_figures
from .tables import Options, Table, build_tables, open_models

# (heading: what is measured, the study's claim or None, tables, figures)
SECTIONS = (
    ("Vision and text token norms at the LLM input",
     "vision tokens enter the LLM with higher norms than text tokens (Observation 1)",
     ["norm-ratio"], ["norms_updates"]),
    ("First-layer update and rotation by modality",
     "high norms dilute vision-token updates: the first layer changes vision tokens less, relative to their "
     "norm, than text tokens (Observation 2)",
     ["first-update"], ["cosine_to_first"]),
    ("Text-token trajectories with a real, blank or no image", None, ["correlation"], ["text_curves"]),
    ("Scaling the projector output (α sweep)", None, ["alpha"], ["kl_vs_alpha", "attention_mass"]),
    ("Vision-token keys and values under α", None, ["kv-cosine"], ["kv_cosine_vs_alpha"]),
    ("KV-cache substitution", None, ["kv-substitution"], []),
    ("Norm growth and update size with depth", None, ["depth"], ["depth"]),
    # no claim quoted: the study measured two models; the cross-family question is the guide's
    ("Norms across the vision-language interface (norm atlas)", None, ["atlas"], ["norm_ladder"]),
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
    lines = [f"# Analyses of {store.name}", "", f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `workbench report`.", ""]
    lines += _store_summary(store)
    lines += ["", "Every number is a mean over samples (median rank: a median) with its 95% bootstrap CI over "
              f"samples in brackets ({options.n_resamples} resamples, seed {options.seed}); bands in the "
              "figures are the same intervals. Reference condition: "
              f"`{options.reference}`; blank image: `{options.blank}`; no image: `{options.text_only}`; "
              f"KV hybrid: `{options.hybrid}`.", ""]
    absent = []
    for heading, claim, table_names, figure_names in SECTIONS:
        parts = [tables[n] for n in table_names] + [figures[n] for n in figure_names]
        if all(p.skipped for p in parts):
            absent.append(f"- {heading}: {'; '.join(dict.fromkeys(p.skipped for p in parts))}")
            continue
        lines += [f"## {heading}", ""]
        if claim:
            lines += [f"*The study reports that {claim}. Compare with the numbers below.*", ""]
        for name in table_names:
            lines += [tables[name].markdown(), ""]
        for name in figure_names:
            lines += [_figure_markdown(figures[name]), ""]
    if absent:
        lines += ["## Not in this store", "", *absent, ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
