"""`workbench report STORE --out DIR`: the study's tables and figures in one markdown report, and the
same report as one self-contained HTML file.

Writes DIR/report.md and the figures beside it (PNG, or SVG/PDF with `Options.figure_format`), one
section per registered analysis (`analyses.registry`), in its order: the study's (observations,
ablation, experiments), then depth, then any plugin's. Headings name what is measured; where the
study made a claim about it, the claim is quoted beside it as "the study reports ...", never as
this store's conclusion: the numbers below it may agree or not. Sections are chosen by what the
store holds: a section with nothing to show is listed at the end with the reason; within a shown
section, a table or figure that cannot be drawn is one line saying why.

DIR/report.html (`analyses.html`) has the same sections, figures inline, a contents list, and three
more: the definitions in force per model, the provenance of every run that wrote the store, and
each spec as it was written.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import xarray as xr

from workbench.definitions import describe as describe_definitions
from workbench.progress import progress_bar
from workbench.store import store_info

from . import html
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


def _section_markdown(analysis: Analysis, table: Table, figures: list[FigureFile]) -> list[str]:
    lines = []
    if analysis.claim:
        lines += [f"*The study reports that {analysis.claim}. Compare with the numbers below.*", ""]
    lines += [table.markdown(), ""]
    for figure in figures:
        lines += [_figure_markdown(figure), ""]
    return lines


def _runs(opened: dict[str, xr.Dataset]) -> list[dict]:
    """The provenance records of the store (every `workbench run` that wrote it), oldest first."""
    for ds in opened.values():
        return list(json.loads(ds.attrs.get("provenance") or "[]"))
    return []


def _appendix(opened: dict[str, xr.Dataset], options: Options) -> list[html.HtmlSection]:
    """The HTML report's last sections: definitions, provenance, specs."""
    definitions = [f"- **{model}**: {describe_definitions(options.definitions_for(ds)).removeprefix('Definitions: ')}"
                   for model, ds in opened.items()]
    runs = _runs(opened)
    provenance: list[str] = []
    specs: list[tuple[str, str]] = []
    for i, run in enumerate(runs, 1):
        versions = ", ".join(f"{k} {v}" for k, v in (run.get("versions") or {}).items() if v)
        provenance += [f"{i}. {run.get('time', '?')}: spec `{run.get('spec_name', '?')}` (hash "
                       f"`{str(run.get('spec_hash', '?'))[:12]}`), models {', '.join(run.get('models', []))}; "
                       f"`{' '.join(run.get('command', []))}`; Python {run.get('python', '?')} on "
                       f"{run.get('platform', '?')}; {versions}"]
        if run.get("spec") and run["spec"] not in [s for _, s in specs]:
            specs.append((run.get("spec_name", f"run {i}"), run["spec"]))
    return [
        html.HtmlSection("Definitions", "\n".join(definitions) + "\n\nOverrides given to the report: "
                         f"{', '.join(f'{k} = {v}' for k, v in options.definitions.items() if v is not None) or 'none'}."),
        html.HtmlSection("Provenance", "\n".join(provenance) if provenance
                         else "The store records no run (it was not written by `workbench run`)."),
        html.HtmlSection("Spec", "\n\n".join(f"`{name}`, as written:\n\n```yaml\n{text.rstrip()}\n```" for name, text in specs)
                         if specs else "The store records no spec."),
    ]


def write_report(store: str | Path, out: str | Path, options: Options | None = None,
                 models: list[str] | None = None, progress: bool = False) -> Path:
    """Write DIR/report.md and DIR/report.html with every table and figure; returns report.md's path.
    progress: a bar over the analyses (on a terminal, `workbench.progress`)."""
    store, out = Path(store), Path(out)
    options = options or Options()
    opened = open_models(store, models)
    out.mkdir(parents=True, exist_ok=True)
    sections: list[tuple[Analysis, Table, list[FigureFile]]] = []
    with forcing() if options.force else contextlib.nullcontext(), \
            progress_bar(len(analyses()), desc="report", unit="analysis", enabled=progress) as bar:
        for analysis in analyses():   # each analysis recomputed once (under --force)
            bar.set_postfix_str(analysis.name, refresh=False)
            sections.append((analysis, analysis.table(opened, options),
                             [draw(make, opened, options, out) for make in analysis.figures]))
            bar.update(1)
    title = f"Analyses of {store.name}"
    intro = [f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} by `workbench report`.", ""]
    intro += _store_summary(store)
    intro += ["", "Every number is a mean over samples (median rank: a median) with its 95% bootstrap CI over "
              f"samples in brackets ({options.n_resamples} resamples, seed {options.seed}); bands in the "
              "figures are the same intervals. Reference condition: "
              f"`{options.reference}`; blank image: `{options.blank}`; no image: `{options.text_only}`; "
              f"KV hybrid: `{options.hybrid}`.", ""]
    shown: list[html.HtmlSection] = []
    absent = []
    for analysis, table, figures in sections:
        parts: list[Table | FigureFile] = [table, *figures]
        if all(p.skipped for p in parts):
            absent.append(f"- {analysis.section}: {'; '.join(dict.fromkeys(str(p.skipped) for p in parts))}")
            continue
        shown.append(html.HtmlSection(analysis.section, "\n".join(_section_markdown(analysis, table, figures))))
    if absent:
        shown.append(html.HtmlSection("Not in this store", "\n".join(absent) + "\n"))
    lines = [f"# {title}", "", *intro]
    for section in shown:
        lines += [f"## {section.heading}", "", section.markdown]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    figures_drawn = [f for _, _, figures in sections for f in figures]
    html.write(out / "report.html", title, "\n".join(intro), [*shown, *_appendix(opened, options)], figures_drawn)
    return path
