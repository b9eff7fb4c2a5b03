"""`report.html`: the markdown report as one self-contained HTML file.

The report's sections are markdown (tables, notes, figure references); each is rendered with
markdown-it-py (CommonMark with GFM tables) and placed in a `<section>` with an id, listed in a
contents list at the top. Figures are inline `data:` URIs: the PNG or SVG file as written, or,
for PDF figures (which a browser does not show inline), a PNG of the same figure. No script,
no external file, no network: the page opens anywhere, offline.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML

from .figures import DPI, FigureFile

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #222;
       line-height: 1.45; }
nav { background: #f5f5f7; border: 1px solid #ddd; border-radius: 6px; padding: 0.5rem 1.5rem; }
nav ol { columns: 2; }
section { border-top: 1px solid #ddd; margin-top: 2rem; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.85rem; display: block; overflow-x: auto; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
img { max-width: 100%; height: auto; display: block; margin: 0.8rem 0 0.2rem; }
pre { background: #f7f7f7; border: 1px solid #ddd; padding: 0.6rem; overflow-x: auto; font-size: 0.8rem; }
.back { font-size: 0.8rem; }
"""

MEDIA_TYPES = {".png": "image/png", ".svg": "image/svg+xml"}


@dataclass
class HtmlSection:
    heading: str
    markdown: str                                   # the body: tables, notes, figure references by file name
    anchor: str = field(default="")                 # its id (filled from the heading when empty)


def anchor(heading: str, taken: set[str]) -> str:
    """A unique id for a heading: lower-case words joined by hyphens."""
    base = re.sub(r"[^a-z0-9]+", "-", heading.lower()).strip("-") or "section"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    taken.add(name)
    return name


def data_uri(figure: FigureFile) -> str:
    """The figure as a data: URI: its file's bytes where a browser shows the format, else a PNG of it."""
    if figure.path is None:
        raise ValueError(f"figure {figure.name} was not drawn: {figure.skipped}")
    media = MEDIA_TYPES.get(figure.path.suffix)
    if media is not None:
        payload = figure.path.read_bytes()
    else:
        if figure.figure is None:
            raise ValueError(f"figure {figure.name}: a {figure.path.suffix} file and no figure to render as PNG")
        buffer = io.BytesIO()
        figure.figure.savefig(buffer, format="png", dpi=DPI)
        media, payload = "image/png", buffer.getvalue()
    return f"data:{media};base64,{base64.b64encode(payload).decode('ascii')}"


def _markdown(figures: dict[str, FigureFile]) -> MarkdownIt:
    """CommonMark with tables; an image naming a figure file gets that figure inline."""
    md = MarkdownIt("commonmark").enable("table")
    if not isinstance(md.renderer, RendererHTML):  # the default; its protocol type has no `rules`
        raise TypeError(f"expected markdown-it's HTML renderer, got {type(md.renderer).__name__}")
    default_image = md.renderer.rules["image"]

    def image(renderer, tokens, idx, options, env):   # a render rule (markdown-it-py 4 RendererHTML.image)
        token = tokens[idx]
        figure = figures.get(str(token.attrGet("src")))
        if figure is not None and figure.path is not None:
            token.attrSet("src", data_uri(figure))
        return default_image(tokens, idx, options, env)

    md.add_render_rule("image", image)   # after link validation: the markdown names the file
    return md


def render(title: str, intro: str, sections: Sequence[HtmlSection], figures: Sequence[FigureFile]) -> str:
    """The whole page: title, intro (markdown), a contents list, then every section."""
    md = _markdown({f.name: f for f in figures if f.path is not None})
    taken: set[str] = {"contents"}
    for section in sections:
        section.anchor = section.anchor or anchor(section.heading, taken)
    contents = "\n".join(f'<li><a href="#{s.anchor}">{html.escape(s.heading)}</a></li>' for s in sections)
    body = "\n".join(
        f'<section id="{s.anchor}">\n<h2>{html.escape(s.heading)}</h2>\n{md.render(s.markdown)}'
        f'<p class="back"><a href="#contents">↑ contents</a></p>\n</section>' for s in sections)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{md.render(intro)}"
            f'<nav id="contents">\n<h2>Contents</h2>\n<ol>\n{contents}\n</ol>\n</nav>\n{body}\n</body>\n</html>\n')


def write(path: Path, title: str, intro: str, sections: Sequence[HtmlSection], figures: Sequence[FigureFile]) -> Path:
    path.write_text(render(title, intro, sections, figures), encoding="utf-8")
    return path
