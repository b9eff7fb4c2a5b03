"""`workbench report STORE --out DIR`: the study's tables and figures in one markdown report.

Writes DIR/report.md and the PNG figures beside it, one section per registered analysis
(`analyses.registry`), in its order: the study's (observations, ablation, experiments), then
depth, then any plugin's. Headings name what is measured; where the study made a claim about it,
the claim is quoted beside it as "the study reports ...", never as this store's conclusion: the
numbers below it may agree or not. Sections
are chosen by what the store holds: a section with nothing to show is listed at the end with the
reason; within a shown section, a table or figure that cannot be drawn is one line saying why.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from workbench.store import store_info

from .cache import forcing
from .figures import FigureFile, draw
from .registry import Analysis, analyses
from .tables import Options, Table, open_models


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
    sections: list[tuple[Analysis, Table, list[FigureFile]]] = []
    with forcing() if options.force else contextlib.nullcontext():   # each analysis recomputed once
        for analysis in analyses():
            sections.append((analysis, analysis.table(opened, options),
                             [draw(make, opened, options, out) for make in analysis.figures]))
    lines = [f"# Analyses of {store.name}", "", f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `workbench report`.", ""]
    lines += _store_summary(store)
    lines += ["", "Every number is a mean over samples (median rank: a median) with its 95% bootstrap CI over "
              f"samples in brackets ({options.n_resamples} resamples, seed {options.seed}); bands in the "
              "figures are the same intervals. Reference condition: "
              f"`{options.reference}`; blank image: `{options.blank}`; no image: `{options.text_only}`; "
              f"KV hybrid: `{options.hybrid}`.", ""]
    absent = []
    for analysis, table, figures in sections:
        parts: list[Table | FigureFile] = [table, *figures]
        if all(p.skipped for p in parts):
            absent.append(f"- {analysis.section}: {'; '.join(dict.fromkeys(str(p.skipped) for p in parts))}")
            continue
        lines += [f"## {analysis.section}", ""]
        if analysis.claim:
            lines += [f"*The study reports that {analysis.claim}. Compare with the numbers below.*", ""]
        lines += [table.markdown(), ""]
        for figure in figures:
            lines += [_figure_markdown(figure), ""]
    if absent:
        lines += ["## Not in this store", "", *absent, ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
