"""`workbench report` writes report.html: one self-contained file (figures inline, no link out), a
contents list naming every section, the definitions, the provenance and the spec of the run. It is
opened in headless Chromium (Debian's `chromium`; .ci/run installs it): it renders with no console
message, every figure decodes, and every section of report.md is there. From a real run of a tiny
model through the CLI, figures as SVG."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from workbench.cli import main

SPEC = """\
name: html_report
models: [tiny-smolvlm]
data: {source: builtin, n: 2}
conditions:
  baseline: {}
  blank: {image: blank}
  hybrid:
    kv_swap: {donor: blank, positions: vision, layers: all}
  alpha:
    sweep: {alpha: [0.5, 2.0]}
    interventions: [{kind: scale, site: projector, factor: $alpha, positions: vision}]
capture: [{site: layer}, {site: logits}]
"""

# after the page's load event: how many images it has and how many the browser decoded
PROBE = ('<script>window.addEventListener("load", () => { const images = [...document.images]; '
         'document.body.dataset.images = images.length; '
         'document.body.dataset.decoded = images.filter(i => i.complete && i.naturalWidth > 0).length; });</script>')


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "headless Chromium is needed: apt-get install -y chromium (.ci/run installs it)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    return found


def dump_dom(page: Path) -> subprocess.CompletedProcess:
    """The page's DOM after load, and Chromium's log on stderr (console messages: "CONSOLE")."""
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start; the page is our own file
    return subprocess.run([chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=180)


class Outline(HTMLParser):
    """The ids of the sections, their h2 headings, the contents list's links, every src and href."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.headings: list[str] = []
        self.links: list[str] = []
        self.sources: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section":
            self.sections.append(str(a.get("id")))
        if tag == "h2":
            self._in = ""
        if tag == "a" and str(a.get("href", "")).startswith("#") and a.get("href") != "#contents":
            self.links.append(str(a["href"])[1:])
        self.sources += [str(v) for k, v in attrs if k in ("src", "href")]

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self._in += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2" and self._in is not None:
            self.headings.append(self._in)
            self._in = None


@pytest.fixture(scope="module")
def report(tmp_path_factory, workbench_cache) -> Path:
    root = tmp_path_factory.mktemp("html")
    spec = root / "html_report.yaml"
    spec.write_text(SPEC + f"store: {{path: {root / 'html_report.zarr'}}}\n")
    assert main(["run", str(spec), "-q"]) == 0
    out = root / "report"
    assert main(["report", str(root / "html_report.zarr"), "--out", str(out), "--format", "svg", "--resamples", "20"]) == 0
    return out


@pytest.mark.slow   # a run and a report with every figure (~40 s), then Chromium
def test_report_html_renders_in_chromium_with_every_section(report):
    page = report / "report.html"
    text = page.read_text(encoding="utf-8")
    markdown = (report / "report.md").read_text()
    outline = Outline()
    outline.feed(text)
    # self-contained: every image inline, every link within the page
    assert outline.sources and all(s.startswith(("data:image/", "#")) for s in outline.sources), \
        [s[:40] for s in outline.sources if not s.startswith(("data:image/", "#"))]
    figures = sorted(p.name for p in report.glob("*.svg"))
    assert figures and text.count('src="data:image/svg+xml;base64,') == len(figures)
    # every section of report.md, then definitions, provenance and spec; the contents list links each one
    expected = [*re.findall(r"^## (.+)$", markdown, re.M), "Definitions", "Provenance", "Spec"]
    assert [h.strip() for h in outline.headings[1:]] == expected   # [0]: the contents list's own heading
    assert outline.links == outline.sections and len(set(outline.sections)) == len(expected)
    assert "KV-cache substitution" in expected and "kv_substitution.svg" in figures
    spec_text, provenance = text.split('id="spec"', 1)[1], text.split('id="provenance"', 1)[1].split("</section>")[0]
    assert "name: html_report" in spec_text and "spec <code>html_report</code>" in provenance
    # in Chromium: no console message at all (the page has no script; the probe logs nothing), every figure decoded
    probe = report / "probe.html"
    probe.write_text(text.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    result = dump_dom(probe)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "CONSOLE" not in result.stderr, [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    body = re.search(r"<body[^>]*>", result.stdout).group(0)
    assert f'data-images="{len(figures)}"' in body and f'data-decoded="{len(figures)}"' in body, body
    rendered = Outline()
    rendered.feed(result.stdout)
    assert rendered.headings == outline.headings and rendered.sections == outline.sections
