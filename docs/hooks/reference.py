"""mkdocs hook: the pages that are generated from the registries when the docs are built.

A hand-written page holds a marker `<!-- generated: NAME -->` where a generated part goes (NAME one
of `GENERATORS`); the hook replaces it with Markdown built from the registries of this checkout:
intervention kinds (`workbench.extend`), sites (`workbench.sites`), capture variables, data
sources and every spec option (the pydantic models of `workbench.spec`), the CLI's `--help`, the
model families (`workbench families`' entries, and `workbench.models.architectures`' paths) and the
analyses (`analyses.registry`), each analysis with its table and figures computed from a synthetic
store (`analyses.synthetic`) written at build time. `benchmarks.md` is `benchmarks/README.md` itself, so the report has one
source. Hooks API: mkdocs 1.6 mkdocs/plugins.py (`on_files`, `on_page_markdown`), `File.generated`
in mkdocs/structure/files.py.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # document this checkout, not whatever `workbench` is installed
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")
FIGURES = "catalogue"          # where the catalogue's figures go in the site
_CATALOGUE: dict[str, str] = {}  # analysis name -> its Markdown, filled by on_files
_TMP: tempfile.TemporaryDirectory | None = None


def _code(name: object) -> str:
    return f"`{name}`"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _first_line(obj: object) -> str:
    doc = (inspect.getdoc(obj) or "").replace("``", "`")  # reST literals as Markdown code
    return " ".join(doc.split("\n\n", 1)[0].split())


def type_text(annotation: Any) -> str:
    """A pydantic field's annotation as a reader writes the value: choices, lists, numbers."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin is typing.Literal:
        return " | ".join(_code(a) for a in args)  # a table cell escapes the bars (`_cell`)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if origin in (list, tuple):
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping {type_text(args[0])} → {type_text(args[1])}" if args else "mapping"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _comments(model: type) -> dict[str, str]:
    """{field: its comment in the model's source}: the comment on the field's line, or the
    comment lines right above it."""
    notes: dict[str, str] = {}
    above: list[str] = []
    for line in inspect.getsource(model).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        field = re.match(r"\s{4}([a-z_]+)\s*:", line)
        if field:
            inline = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            notes[field.group(1)] = " ".join(above + [inline]).strip()
        above = []
    return notes


def fields_table(model: type, skip: tuple[str, ...] = ()) -> str:
    """Every field of a pydantic model: the name a spec writes, its type, its default, its note."""
    from pydantic_core import PydanticUndefined

    from pydantic import BaseModel

    notes = _comments(model)
    rows = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        value = info.default if info.default is not PydanticUndefined else (
            info.default_factory() if info.default_factory is not None else PydanticUndefined)
        if value is PydanticUndefined:
            default = "required"
        elif isinstance(value, BaseModel):
            default = "its fields' defaults"
        else:  # as YAML writes it
            default = _code({None: "null", True: "true", False: "false"}.get(value, value)
                            if isinstance(value, (bool, type(None))) else value)
        rows.append([_code(info.alias or name), FIELD_TYPES.get(name) or type_text(info.annotation), default,
                     notes.get(name, "")])
    return _table(["field", "type", "default", "note"], rows)


# fields whose annotation says less than a sentence does
FIELD_TYPES = {"site": "a site name ([Sites](#sites))",
               "interventions": "list of entries, each of an [intervention kind](#intervention-kinds)",
               "kv_swap": "mapping (`conditions.NAME.kv_swap` below) or null",
               "data": "mapping (the [data sources](#data-sources))",
               "conditions": "mapping of condition names to conditions (`conditions.NAME` below)",
               "capture": "list of captures (`capture[]` below)", "generate": "mapping (`generate` below) or null",
               "store": "mapping (`store` below)", "backend": "mapping (`backend` below)",
               "analysis": "mapping (`analysis` below)", "limits": "mapping (`limits` below)"}


def interventions() -> str:
    from workbench import sites
    from workbench.extend import intervention_kinds

    parts = []
    for name, kind in intervention_kinds().items():
        allowed = kind.sites or tuple(n for n in sites.EDITABLE_SITES
                                      if sites.site(n).access in kind.accesses)
        swept = kind.swept()
        lines = [f"### `{name}`", "", _first_line(kind.runtime), "",
                 f"- declared in `{kind.module}` (`{kind.spec.__name__}`, `{kind.runtime.__name__}`)",
                 f"- sites: {', '.join(_code(s) for s in allowed)}"
                 + (", and every connector part `projector.<part>`" if "modules" in kind.accesses else ""),
                 f"- sweep variables (`$name`) allowed in: {', '.join(_code(f) for f in swept) or 'none'}"]
        if kind.source:
            lines.append(f"- reads condition `{kind.source_of(kind.spec.model_construct(**{kind.source: 'x'}))[0]}` first")
        lines += ["", fields_table(kind.spec)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def site_rows() -> str:
    from workbench import sites
    from workbench.extend import site_module

    rows = []
    for name, entry in sites.SITES.items():
        module = sys.modules[site_module(name)]
        stored = "; ".join(f"`{v}` ({', '.join(d)})" for v, d in entry.stores.items()) or "—"
        rows.append([_code(name), entry.index and _code(entry.index) or "—", "yes" if entry.vision else "",
                     "yes" if entry.editable else "", _code(entry.access), stored, _first_line(module)])
    part = sites.PROJECTOR_PART
    rows.append([_code(part.name), "—", "yes", "yes", _code(part.access), "—",
                 "one connector part of the family (the families' parts below)"])
    return _table(["site", "index", "vision only", "editable", "access", "capture stores", "what"], rows)


def captures() -> str:
    from workbench import sites

    rows = [[_code(var), f"({', '.join(dims)})", _code(name)]
            for name, entry in sites.SITES.items() for var, dims in entry.stores.items()]
    return _table(["variable", "dims", "written by a capture of"], rows)


def data_sources() -> str:
    from workbench import data
    from workbench.spec import DATA_SOURCES, DataSpec

    loaders = {"builtin": data.builtin_samples, "jsonl": data.jsonl_samples, "folder": data.folder_samples,
               "datbench": data.datbench_samples}
    rows = [[_code(s), _first_line(loaders[s]) if s in loaders else ""] for s in DATA_SOURCES]
    return _table(["`data.source`", "what it reads"], rows) + "\n\nFields of `data`:\n\n" + fields_table(DataSpec)


def options() -> str:
    from workbench.spec import schema, sizes

    sections = [("the spec's top level", schema.Spec), ("`conditions.NAME`", schema.Condition),
                ("`conditions.NAME.kv_swap`", schema.KVSwap), ("`capture[]`", schema.CaptureSpec),
                ("`generate`", schema.GenerateSpec), ("`store`", schema.StoreSpec),
                ("`backend`", schema.BackendSpec), ("`analysis`", schema.AnalysisSpec), ("`limits`", sizes.Limits)]
    return "\n\n".join(f"### {title}\n\n{fields_table(model)}" for title, model in sections)


def cli() -> str:
    """`workbench --help` and each command's `--help`, as argparse prints them (its public API:
    the commands are read from the top-level help's list)."""
    import contextlib
    import io

    from workbench.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width (shutil.get_terminal_size)
    top = build_parser().format_help()
    listing = top.split("positional arguments:", 1)[1].split("\n\n", 1)[0]
    commands = re.findall(r"^    ([a-z]+)\s", listing, re.M)
    parts = [f"### `workbench`\n\n```text\n{top}```"]
    for name in commands:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            build_parser().parse_args([name, "--help"])
        parts.append(f"### `workbench {name}`\n\n```text\n{out.getvalue()}```")
    return "\n\n".join(parts)


def family_listing() -> str:
    """`workbench families` as a table: one row per entry of `workbench.families.family_entries`."""
    from workbench.families import family_entries

    def but(refused: dict[str, str], what: str) -> str:
        if not refused:
            return f"every {what}"
        return f"every {what} but " + "; ".join(f"{_code(name)} ({why})" for name, why in refused.items())

    rows = [[_code(e.family), ", ".join(_code(t) for t in e.model_types), _code(e.tiny) if e.tiny else "—",
             _code(e.hub_id) if e.hub_id else "—", "yes" if e.text_only else "",
             but(e.sites_refused, "site"), but(e.interventions_refused, "kind and condition")]
            for e in family_entries()]
    return _table(["family", "model types", "tiny model", "example hub id", "text only", "sites",
                   "interventions"], rows)


def families() -> str:
    from workbench.models.architectures import ARCHITECTURES

    rows = []
    for arch in ARCHITECTURES:
        quirks = [q for q, on in (("M-RoPE", arch.mrope), ("DeepStack", arch.deepstack),
                                  ("prefix-LM (no `kv_swap`)", arch.prefix_lm),
                                  ("images nested per sample", arch.nest_images)) if on]
        kept = [k for k in ("token_type_ids", "mm_token_type_ids") if k in arch.per_token_keys
                or (k == "token_type_ids" and k not in arch.drop_keys)]
        quirks += [f"`{k}` kept" for k in kept]
        vision = (f"`{arch.vision_layers}` / `{arch.vision_output[0]}` ({arch.vision_output[1]})"
                  if arch.vision else "(text only)")
        boundary = ", ".join(_code(t) for t in arch.boundary_tokens)
        boundary += (", " if boundary and arch.boundary_patterns else "") + ", ".join(
            f"`{p}` (pattern)" for p in arch.boundary_patterns)
        rows.append([_code(arch.family), ", ".join(_code(c) for c in arch.config_architectures),
                     _code(arch.tiny) if arch.tiny else "—", vision,
                     ", ".join(_code(p) for p in arch.projector) or "—",
                     ", ".join(_code(p) for p in arch.projector_parts) or "—",
                     _code(arch.image_token) if arch.image_token else "—", boundary or "—", _geometry(arch),
                     "; ".join(quirks)])
    return _table(["family", "transformers classes", "tiny model", "`vision_layer` / `vision` read at",
                   "`projector` modules", "connector parts (`projector.<part>`)", "image token",
                   "boundary tokens", "patch geometry", "quirks"], rows)


def _geometry(arch) -> str:
    """The family's patch-geometry layout, or why it keeps no positions."""
    if arch.geometry is None:
        return "—"
    return _code(arch.geometry.layout) if arch.geometry.layout else f"none: {arch.geometry.reason}"


def _inputs_text(inputs: tuple[str, ...]) -> str:
    from workbench import sites

    def where(var: str) -> str:
        site = next((n for n, s in sites.SITES.items() if var in s.stores), None)
        return f"`{var}` (capture `{site}`)" if site else f"`{var}` (a run label)"

    return ", ".join(where(v) for v in inputs)


def _catalogue_saes(store: Path, out: Path) -> tuple[str, ...]:
    """SAEs the `sae` entry encodes with: one per layer of the first synthetic model's `hidden`,
    trained by `workbench sae train`'s function on its baseline tokens (none without SAELens)."""
    from workbench.sae import TrainSettings, train_sae

    try:
        import sae_lens  # noqa: F401
    except ImportError:
        return ()
    return tuple(str(train_sae(str(store), out / f"layer{layer}", TrainSettings(
        layer=layer, model="syn/a-small", k=4, epochs=60, batch_size=32, lr=1e-2)).out) for layer in range(4))


def _catalogue_entries(out: Path) -> tuple[dict[str, str], list[Path]]:
    """{analysis: its Markdown} and the figures' files, from a synthetic store written in `out`."""
    import matplotlib

    matplotlib.use("Agg")
    from analyses import registry
    from analyses.figures import draw
    from analyses.synthetic import write_synthetic_store
    from analyses.tables import Options, open_models

    store = write_synthetic_store(out / "synthetic.zarr", n_samples=3, scan_layers=(0, 1, 2), scan_tokens=(4, 5, 6),
                                  scan_heads=(0, 1)).path
    models = open_models(store)
    options = Options(n_resamples=200, sae=_catalogue_saes(store, out / "saes"))
    (out / "figures").mkdir(parents=True, exist_ok=True)
    entries, pngs = {}, []
    for analysis in registry.analyses():
        table = analysis.table(models, options).markdown()
        table = re.sub(r"^#+ ", "#### ", table, flags=re.M)  # the table's own title under the entry
        lines = [f"## `{analysis.name}`", "", f"**{analysis.section}.**", "",
                 f"- reads: {_inputs_text(analysis.inputs)}",
                 f"- from Python: {', '.join(f'`{m.__module__}.{m.__name__}`' for m in analysis.metrics)}",
                 f"- declared in `{analysis.table.__module__}`"]
        if analysis.claim:
            lines.append(f"- the study reports: {analysis.claim}")
        lines += ["", f"`workbench analyze STORE {analysis.name}` on the synthetic store:", "", table]
        for make in analysis.figures:
            figure = draw(make, models, options, out / "figures")
            if figure.path is None:
                lines += ["", f"*`{figure.name}`: skipped ({figure.skipped}).*"]
                continue
            pngs.append(Path(figure.path))
            lines += ["", f"![{figure.title}]({FIGURES}/{Path(figure.path).name})", "",
                      f"*`{figure.name}`: {figure.title}*"]
        if not analysis.figures:
            lines += ["", "*No figure: the table is the result.*"]
        entries[analysis.name] = "\n".join(lines)
    return entries, pngs


def catalogue() -> str:
    return "\n\n".join(_CATALOGUE.values())


GENERATORS: dict[str, Callable[[], str]] = {
    "interventions": interventions, "sites": site_rows, "captures": captures, "data": data_sources,
    "options": options, "cli": cli, "family-listing": family_listing, "families": families, "catalogue": catalogue,
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    global _TMP
    _TMP = tempfile.TemporaryDirectory(prefix="workbench-docs-")
    entries, pngs = _catalogue_entries(Path(_TMP.name))
    _CATALOGUE.clear()
    _CATALOGUE.update(entries)
    for png in pngs:
        files.append(File.generated(config, f"{FIGURES}/{png.name}", abs_src_path=str(png)))
    report = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "benchmarks.md", content=report))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown generated part {name!r}; expected one of "
                             f"{', '.join(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(fill, markdown)


def on_post_build(config: Any) -> None:
    global _TMP
    if _TMP is not None:
        _TMP.cleanup()
        _TMP = None
