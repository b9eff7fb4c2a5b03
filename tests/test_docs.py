"""The docs site builds with `mkdocs build --strict` (a broken link or a missing page fails it), and
its generated pages (docs/hooks/reference.py) list what the registries hold: every intervention
kind, site, capture variable, model family and analysis, each analysis with its figures rendered
from a synthetic store. The code blocks of the pages run in tests/test_readme.py."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cells(page: str) -> set[str]:
    """The `<code>` names of a page's headings and first table column."""
    heads = re.findall(r"<h[23][^>]*><code>([^<]+)</code>", page)
    firsts = re.findall(r"<tr>\s*<td><code>([^<]+)</code>", page)
    return {html.unescape(n) for n in heads + firsts}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.slow  # ~1-2 min: the synthetic store, every analysis's table and figure (CI: make test-slow)
def test_the_reference_lists_every_registered_kind_site_and_capture(site):
    from workbench import sites
    from workbench.extend import intervention_kinds
    from workbench.spec import DATA_SOURCES

    page = (site / "reference" / "index.html").read_text(encoding="utf-8")
    listed = cells(page)
    assert set(intervention_kinds()) <= listed
    assert set(sites.SITES) | {"projector.<part>"} <= listed
    assert set(sites.VARIABLE_DIMS) <= listed
    assert set(DATA_SOURCES) <= listed
    for field in ("batch_size", "commit_interval_s", "text_set", "max_new_tokens", "kv_swap", "plugins"):
        assert f"<code>{field}</code>" in page, field


@pytest.mark.slow
def test_the_families_and_the_catalogue_are_the_registries(site):
    from analyses import registry
    from workbench.models.architectures import ARCHITECTURES

    families = cells((site / "families" / "index.html").read_text(encoding="utf-8"))
    assert {a.family for a in ARCHITECTURES} <= families
    catalogue = (site / "catalogue" / "index.html").read_text(encoding="utf-8")
    headings = re.findall(r"<h2[^>]*><code>([^<]+)</code>", catalogue)
    assert headings == list(registry.names())                 # every analysis, once, in the registry's order
    figures = [make.__name__ for a in registry.analyses() for make in a.figures]
    shown = re.findall(r'<img alt="[^"]*" src="([^"]+)\.png"', catalogue)
    assert [Path(s).name for s in shown] == figures           # each figure drawn from the synthetic store
    for name in figures:
        assert (site / "catalogue" / f"{name}.png").stat().st_size > 5_000
    benchmarks = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "bench:results:start" in benchmarks                # the report is benchmarks/README.md itself
