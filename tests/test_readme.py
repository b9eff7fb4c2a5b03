"""Every code block of README.md and of the docs pages (docs/*.md, in the order of mkdocs.yml's
nav, after the README) runs, verbatim, in a sandbox: a copy of the files their commands read (specs/, Makefile, pyproject.toml), a `.venv` whose `python` and
`workbench` run this checkout with the test environment's interpreter, the tiny models of the
session cache, and no network. `bash` blocks run line by line (each line as written), `python`
blocks as scripts, `yaml` blocks are validated as specs; a block whose first line is `# file: PATH` is
written to PATH instead (a plugin module, a spec the next commands read). The few lines that need what a test cannot
have (the hub, NDIF, the test suite itself) are listed in EXPECTED with what they must do instead:
fail with a one-line error, never a traceback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
KNOWN_LANGUAGES = {"bash", "python", "yaml", "text"}  # text: not code (the layout tree)

# line -> (expected outcome, why). Every other line must exit 0.
EXPECTED = {
    "make test": ("skip", "runs this test suite itself"),
    "make test-slow": ("skip", "runs this test suite itself"),
    "workbench run specs/depth_norms.yaml": ("error", "meta-llama/Llama-3.1-8B needs the hub and NDIF"),
    "workbench run specs/norm_gap.yaml --remote": ("error", "the study's models need the hub"),
    "workbench run specs/demo.yaml --store s3://my-bucket/stores/demo.zarr --shard 0/2": (
        "skip", "needs an S3 server: tests/test_objectstore.py runs these against moto on loopback"),
    "workbench run specs/demo.yaml --store s3://my-bucket/stores/demo.zarr --shard 1/2": (
        "skip", "needs an S3 server: tests/test_objectstore.py runs these against moto on loopback"),
    "workbench info s3://my-bucket/stores/demo.zarr": ("skip", "needs an S3 server, as above"),
    "workbench ndif status": ("unreachable", "NDIF's host cannot be reached from here"),
    "workbench run specs/demo.yaml --remote http://127.0.0.1:8000": ("no key", "no server there and no NDIF_API_KEY here"),
}


def blocks_of(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text(encoding="utf-8"))]


def readme_blocks() -> list[tuple[str, str]]:
    return blocks_of(REPO / "README.md")


def nav_pages() -> list[str]:
    """The docs pages in mkdocs.yml's nav order (a nav entry is {title: page.md})."""
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [page for entry in nav for page in entry.values()]


def doc_pages() -> list[Path]:
    """README.md, then every docs page written by hand (a generated page, e.g. benchmarks.md, has
    no file under docs/), in nav order."""
    return [REPO / "README.md"] + [REPO / "docs" / p for p in nav_pages() if (REPO / "docs" / p).is_file()]


def all_blocks() -> list[tuple[str, int, str, str]]:
    """(page, number within the page, language, text) of every block, in the order they run."""
    return [(page.relative_to(REPO).as_posix(), number, lang, text) for page in doc_pages()
            for number, (lang, text) in enumerate(blocks_of(page), start=1)]


def file_of(text: str) -> str | None:
    """PATH of a block that opens with `# file: PATH`."""
    first = text.split("\n", 1)[0]
    return first[len("# file: "):].strip() if first.startswith("# file: ") else None


def command_of(line: str) -> str:
    return line.split("#", 1)[0].strip()


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, workbench_cache, trained):  # trained: the trained models linked in
    root = tmp_path_factory.mktemp("readme")
    for name in ("specs", "stores"):
        shutil.copytree(REPO / name, root / name)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, root / name)
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shims = {"python": f'exec {sys.executable} "$@"', "workbench": f'exec {sys.executable} -m workbench "$@"'}
    for name, line in shims.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    time.sleep(0.01)
    (root / ".venv" / ".installed").touch()  # newer than pyproject.toml: `make` installs nothing
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "MPLBACKEND": "Agg",
        "WORKBENCH_REMOTE_TRIES": "1",
        "WORKBENCH_REMOTE_BACKOFF_S": "0.01",
    }
    env.pop("VIRTUAL_ENV", None)
    return root, env


def test_every_block_has_a_known_language():
    blocks = all_blocks()
    assert readme_blocks() and all(lang in KNOWN_LANGUAGES for _, _, lang, _ in blocks), \
        [(page, number, lang) for page, number, lang, _ in blocks if lang not in KNOWN_LANGUAGES]
    lines = {command_of(line) for _, _, lang, text in blocks if lang == "bash" for line in text.splitlines()}
    assert set(EXPECTED) <= lines, f"stale EXPECTED entries: {set(EXPECTED) - lines}"


def test_every_docs_page_is_in_the_nav():
    """A page left out of mkdocs.yml's nav would be neither in the site's menu nor run here."""
    written = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert sorted(p.name for p in doc_pages()[1:]) == written


@pytest.mark.slow  # ~5 min: every README and docs command, make demo included (CI runs it: make test-slow)
def test_readme_code_blocks_run_verbatim(sandbox):
    from workbench.spec import parse_spec

    root, env = sandbox
    ran = 0
    for page, number, lang, text in all_blocks():
        where = f"{page} block {number} ({lang})"
        target = file_of(text)
        if target is not None:
            (root / target).write_text(text)
        elif lang == "yaml":
            parse_spec(text, source=where)
        elif lang == "python":
            script = root / f"block_{page.replace('/', '_')[:-3]}_{number}.py"
            script.write_text(text)
            done = subprocess.run([str(root / ".venv" / "bin" / "python"), str(script)], cwd=root, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{where}:\n{text}\n{done.stderr[-3000:]}"
        elif lang == "bash":
            for line in text.splitlines():
                command = command_of(line)
                if not command:
                    continue
                outcome, why = EXPECTED.get(command, ("ok", ""))
                if outcome == "skip":
                    continue
                done = subprocess.run(["bash", "-c", line], cwd=root, env=env, capture_output=True, text=True,
                                      timeout=600)
                if outcome == "ok":
                    assert done.returncode == 0, f"{where}: {line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
                elif outcome == "no key":  # refused before any connection: exit 2, the fix named
                    assert done.returncode == 2 and "hint: set NDIF_API_KEY" in done.stderr, done.stderr
                    assert "Traceback" not in done.stderr
                elif outcome == "unreachable":  # a runtime fault: one line naming the host, exit 1
                    assert done.returncode == 1 and done.stderr.startswith("error: ") and "resolve" in done.stderr, done.stderr
                    assert "Traceback" not in done.stderr
                else:  # what a user without the hub / NDIF sees: one located message, no traceback
                    assert done.returncode == 2, f"{where}: {line} ({why})\n{done.stderr[-3000:]}"
                    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr, done.stderr
                    assert "hint: offline, the tiny models run any spec" in done.stderr
        else:
            continue
        ran += 1
    assert ran == sum(1 for _, _, lang, _ in all_blocks() if lang != "text")   # every block but the layout's text
    assert (root / "stores" / "demo.zarr").is_dir() and (root / "reports" / "demo" / "report.md").is_file()
