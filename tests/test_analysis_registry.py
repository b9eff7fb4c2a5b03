"""The analyses registry is the one list of analyses: every built-in is one module of
analyses/builtin/ that registers itself, `analyze`, `report` and the CLI's names and choices read
the registry, and an analysis in a module outside the package (the docs' example, verbatim)
appears in `workbench analyze` and `workbench report` through `--plugins`."""

from __future__ import annotations

import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analyses import builtin, registry, tables
from analyses.commands import main as analyses_main
from analyses.synthetic import write_synthetic_store
from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "mylab_analyses"


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    """Two synthetic models with the residual stream only: most built-ins are skipped, fast."""
    path = tmp_path_factory.mktemp("registry") / "small.zarr"
    write_synthetic_store(path, n_samples=3, variables=("hidden",), extra_conditions=("blank", "none"))
    return path


def readme_plugin() -> str:
    """The docs' plugin module (docs/analyses.md), verbatim: the python block that starts `# mylab_analyses.py`."""
    page = (ROOT / "docs" / "analyses.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.S | re.M)
    return next(b for b in blocks if b.startswith(f"# {PLUGIN}.py\n"))


def test_every_builtin_is_one_module_that_registers_one_analysis():
    modules = [m.name for m in pkgutil.iter_modules(builtin.__path__)]
    by_module = {a.table.__module__: a for a in registry.analyses()}
    assert sorted(by_module) == sorted(f"analyses.builtin.{m}" for m in modules)
    for analysis in registry.analyses():
        # the declaration holds its pieces, all from its own module (its metrics from the metric modules)
        assert all(f.__module__ == analysis.table.__module__ for f in analysis.figures)
        assert analysis.inputs and analysis.metrics and analysis.section
        assert all(m.__module__.startswith("analyses.") and not m.__module__.startswith("analyses.builtin")
                   for m in analysis.metrics)
    orders = [a.order for a in registry.analyses()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_analyze_report_and_the_cli_list_the_registry(small_store, tmp_path, capsys, monkeypatch):
    names = registry.names()
    assert names == tuple(a.name for a in registry.analyses())
    assert [t.name for t in tables.build_tables(small_store, options=tables.Options(n_resamples=20))] == list(names)
    # `analyze --help` lists the registry's names; a wrong name is refused with them (exit 2)
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps help at the terminal width, hyphens included
    for cli in (main, analyses_main):   # `workbench analyze`, `python -m analyses analyze`
        with pytest.raises(SystemExit):
            cli(["analyze", "--help"])
        assert f"tables to print (default: all): {', '.join(names)}" in capsys.readouterr().out
    assert main(["analyze", str(small_store), "kv-cosines"]) == 2
    err = capsys.readouterr().err
    assert "unknown table 'kv-cosines' (did you mean 'kv-cosine'?)" in err and ", ".join(names) in err
    # the report: one section per analysis, in the registry's order (shown, or listed as not in the store)
    out = tmp_path / "report"
    assert main(["report", str(small_store), "--out", str(out), "--resamples", "20"]) == 0
    report = (out / "report.md").read_text()
    shown = re.findall(r"^## (.+)$", report, re.M)
    sections = [a.section for a in registry.analyses()]
    absent = [s for s in sections if f"\n- {s}: " in report.split("## Not in this store", 1)[1]]
    assert shown[-1] == "Not in this store"
    assert shown[:-1] == [s for s in sections if s not in absent]
    assert "Vision and text token norms at the LLM input" in shown and "KV-cache substitution" in absent


def test_a_second_module_cannot_take_a_registered_name():
    held = registry.by_name("norm-ratio")

    def other_table(models, options):  # defined here: another module than the built-in's
        raise AssertionError("never called")

    with pytest.raises(registry.RegistryError, match="'norm-ratio' is registered twice: by analyses.builtin.norm_ratio"):
        registry.register_analysis(registry.Analysis(name="norm-ratio", section="elsewhere", inputs=("hidden",),
                                                    metrics=(), table=other_table))
    assert registry.by_name("norm-ratio") is held


def workbench(*args: str, plugins_dir: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugins_dir)]), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow  # seconds of CPU each: `make test-slow` (CI runs it)
def test_a_plugin_outside_the_package_appears_in_analyze_and_report(small_store, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / f"{PLUGIN}.py").write_text(readme_plugin())
    analyzed = workbench("analyze", str(small_store), "vision-norm", "--plugins", PLUGIN, "--resamples", "50",
                         plugins_dir=plugins)
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    assert "### Vision-token norm at the LLM input (baseline)" in analyzed.stdout
    # its number is the built-in metric's, computed here independently of the plugin's table
    from analyses.cache import open_model
    from analyses.norms import norm_curves

    for model in tables.open_models(small_store):
        expected = norm_curves(open_model(small_store, model), n_resamples=50).sel(
            modality="vision", condition="baseline", layer=0, stat="value")
        assert re.search(rf"^\| {re.escape(model)} \| {float(expected):.2f} \[", analyzed.stdout, re.M), model
    reported = workbench("report", str(small_store), "--out", str(tmp_path / "report"), "--plugins", PLUGIN,
                         "--resamples", "50", plugins_dir=plugins)
    assert reported.returncode == 0, reported.stderr[-3000:]
    report = (tmp_path / "report" / "report.md").read_text()
    shown = re.findall(r"^## (.+)$", report, re.M)
    assert shown[-2:] == ["Vision-token norm by layer", "Not in this store"]   # after every built-in
    assert "### Vision-token norm at the LLM input" in report and "](vision_norm_curves.png)" in report
    assert (tmp_path / "report" / "vision_norm_curves.png").stat().st_size > 10_000
    # without --plugins the name is unknown; a module that cannot be imported is named (exit 2)
    plain = workbench("analyze", str(small_store), "vision-norm", plugins_dir=plugins)
    assert plain.returncode == 2 and "unknown table 'vision-norm'" in plain.stderr
    broken = workbench("analyze", str(small_store), "--plugins", "mylab_nowhere", plugins_dir=plugins)
    assert broken.returncode == 2 and "cannot import plugin module 'mylab_nowhere'" in broken.stderr
    assert "Traceback" not in broken.stderr


def test_the_docs_name_every_registered_analysis():
    """The list of tables of docs/analyses.md (`Tables (...): ...`) names every registered
    analysis, in backquotes."""
    page = (ROOT / "docs" / "analyses.md").read_text(encoding="utf-8")
    listing = page.split("\nTables (", 1)[1].split("\n\n", 1)[0]
    assert [n for n in registry.names() if f"`{n}`" not in listing] == []
