"""Intervention kinds from outside the package (`workbench.extend`): the docs' plugin example
(docs/specs.md), run verbatim (its module and spec written as the page shows them, its commands through the
CLI), its stored values against plain PyTorch hooks; a plugin that does not import, one from an
entry point, and a plugin kind whose imports NDIF does not allow in a remote run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench import extend, load_spec, open_store
from workbench.cli import main
from workbench.data import builtin_samples
from workbench.runner import LazyInputs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "specs.md"  # the page with the plugin example
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def readme_files() -> dict[str, str]:
    """{path: text} of the page's blocks that open with `# file: PATH`."""
    blocks = [m.group(2) for m in FENCE.finditer(PAGE.read_text(encoding="utf-8"))]
    return {b.split("\n", 1)[0][len("# file: "):].strip(): b for b in blocks if b.startswith("# file: ")}


def readme_commands(after: str) -> list[str]:
    """The bash lines of the first bash block after the block that writes `after`."""
    text = PAGE.read_text(encoding="utf-8")
    rest = text[text.index(f"# file: {after}"):]
    return [line.strip() for line in rest.split("```bash\n", 1)[1].split("```", 1)[0].splitlines() if line.strip()]


@pytest.fixture
def registry(monkeypatch, tmp_path):
    """The registry as it was, after the test (a plugin's kinds and module are forgotten). Only
    the plugin modules (files under `tmp_path`) are dropped from sys.modules: a library module
    imported during the test stays, or a second import of it would make a second copy of its
    classes (an enum's members would not compare with the first copy's)."""
    extend.intervention_kinds()
    monkeypatch.setattr(extend, "_KINDS", dict(extend._KINDS))
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        module = sys.modules[name]
        where = [getattr(module, "__file__", None) or "", *getattr(module, "__path__", [])]
        if any(str(w).startswith(str(tmp_path)) for w in where):
            del sys.modules[name]


def cli(line: str) -> int:
    assert line.startswith("workbench ")
    return main(line.split()[1:])


def clamped_residuals(model, encoding, layer: int, limit: float) -> np.ndarray:
    """The residual stream (pre-hooks on every decoder layer and the final norm) with decoder layer
    `layer`'s input clamped to [-limit, limit] by a plain forward pre-hook."""
    decoder = model.hf.get_decoder()
    modules = list(decoder.layers) + [decoder.norm]
    seen: list[torch.Tensor] = []

    def clamp(module, args):
        return (args[0].clamp(-limit, limit), *args[1:])

    handles = [modules[layer].register_forward_pre_hook(clamp)]
    handles += [m.register_forward_pre_hook(lambda m, a: seen.append(a[0][0].detach().clone())) for m in modules]
    try:
        model.prepare()
        with torch.inference_mode():
            model.hf(**encoding)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(seen, dim=1).numpy()


def test_readme_plugin_runs_locally_and_equals_plain_hooks(registry, tmp_path, monkeypatch, capsys, load_tiny):
    files = readme_files()
    assert set(files) == {"labplug.py", "specs/clamp.yaml"}
    monkeypatch.chdir(tmp_path)
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    validate, run = readme_commands("specs/clamp.yaml")
    assert cli(validate) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "plugins: labplug (clamp)" in out
    assert cli(run) == 0
    # its imports (typing, torch, the workbench) are on NDIF's whitelist: it can be shipped there
    assert extend.intervention_kinds()["clamp"].module == "labplug" and extend.intervention_kinds()["clamp"].remote

    ds = open_store("stores/clamp.zarr", model="tiny-llama")
    model = load_tiny("tiny-llama")
    sample = builtin_samples(1)[0]
    encoding = LazyInputs(model, sample)["real"].encoding
    limits = load_spec("specs/clamp.yaml").conditions["clamp"].sweep["limit"]
    for limit in limits:
        stored = ds.hidden.sel(condition=f"clamp[limit={limit}]").values   # (token, layer, dim)
        expected = clamped_residuals(model, encoding, 1, limit)
        assert stored.shape == expected.shape
        np.testing.assert_allclose(stored, expected, atol=1e-5)
        assert np.abs(stored[:, 1]).max() <= limit + 1e-6          # the edited layer itself
    baseline = ds.hidden.sel(condition="baseline").values
    assert not np.allclose(baseline[:, 2], ds.hidden.sel(condition=f"clamp[limit={limits[0]}]").values[:, 2])


SPEC = """\
name: plug
plugins: [{plugin}]
models: [tiny-llama]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
capture: [{{site: layer}}]
store: {{path: s.zarr}}
"""


def test_a_plugin_that_does_not_import_is_refused_with_its_line(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(SPEC.format(plugin="mylab.nowhere"))
    assert cli("workbench validate spec.yaml") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: spec.yaml:2: plugins[0]: cannot import plugin module 'mylab.nowhere' "
                          "(ModuleNotFoundError: No module named 'mylab')"), err
    assert "Traceback" not in err
    (tmp_path / "broken.py").write_text("raise RuntimeError('half-written')\n")
    (tmp_path / "spec.yaml").write_text(SPEC.format(plugin="broken"))
    assert cli("workbench validate spec.yaml") == 2
    assert "plugins[0]: cannot import plugin module 'broken' (RuntimeError: half-written)" in capsys.readouterr().err


def unshippable_plugin() -> str:
    """The page's plugin, importing a module NDIF's whitelist does not allow (line 6)."""
    return readme_files()["labplug.py"].replace("import torch\n", "import json\nimport torch\n")


def test_plugin_kind_entries_are_validated_and_refused_remotely(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labplug.py").write_text(unshippable_plugin())
    text = SPEC.format(plugin="labplug").replace(
        "  baseline: {}\n", "  baseline: {}\n  c: {interventions: [{kind: clamp, site: layer, limt: 1}]}\n")
    (tmp_path / "spec.yaml").write_text(text)
    assert cli("workbench validate spec.yaml") == 2
    err = capsys.readouterr().err
    assert "conditions.c.interventions[0].limt: unknown field 'limt' (did you mean 'limit'?)" in err, err
    assert "conditions.c.interventions[0].limit: missing required field 'limit'" in err, err
    (tmp_path / "spec.yaml").write_text(text.replace("limt", "limit") + "backend: {kind: remote}\n")
    assert cli("workbench validate spec.yaml") == 2
    err = capsys.readouterr().err
    assert ("spec.yaml:7: conditions.c.interventions[0].kind: kind 'clamp' comes from plugin module 'labplug': "
            "it imports 'json' (labplug.py:6), not on NDIF's whitelist") in err, err


def test_run_remote_refuses_an_unshippable_plugin_kind_before_any_job(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "labplug.py").write_text(unshippable_plugin())
    text = SPEC.format(plugin="labplug").replace(
        "  baseline: {}\n", "  baseline: {}\n  c: {interventions: [{kind: clamp, site: layer, limit: 1}]}\n")
    (tmp_path / "spec.yaml").write_text(text)
    monkeypatch.setenv("NDIF_API_KEY", "unused")
    assert cli("workbench run spec.yaml --remote http://127.0.0.1:9") == 2
    err = capsys.readouterr().err
    assert "condition 'c': intervention kind 'clamp' comes from plugin module 'labplug': it imports 'json'" in err, err
    assert not (tmp_path / "s.zarr").exists()


def test_entry_point_plugins_register_when_the_registry_loads(registry, tmp_path, monkeypatch):
    """A package's `workbench.plugins` entry point, found by importlib.metadata on sys.path."""
    (tmp_path / "labplug.py").write_text(readme_files()["labplug.py"])
    info = tmp_path / "labplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[workbench.plugins]\nclamp = labplug\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(extend, "_LOADED", False)
    assert "clamp" in extend.intervention_kinds()
    (info / "entry_points.txt").write_text("[workbench.plugins]\nbroken = labplug_missing\n")
    monkeypatch.setattr(extend, "_LOADED", False)
    with pytest.raises(extend.BadInputError, match="plugin 'broken' .*labplug_missing.* failed to load"):
        extend.intervention_kinds()


def test_a_plugin_shipped_to_ndif_needs_its_annotations_as_text(registry, tmp_path, monkeypatch):
    """cloudpickle would ship `int | None` as functools.reduce(operator.or_, ...), which NDIF's
    unpickler refuses: without `from __future__ import annotations` an annotated plugin is refused."""
    from workbench.backends.shipping import ndif_problem

    monkeypatch.chdir(tmp_path)
    text = readme_files()["labplug.py"]
    (tmp_path / "labplug.py").write_text(text.replace("from __future__ import annotations", "import typing"))
    assert extend.load_plugin("labplug") is None
    assert "its annotations (labplug.py:" in ndif_problem("labplug")
    assert "expected `from __future__ import annotations`" in ndif_problem("labplug")
    del sys.modules["labplug"]
    (tmp_path / "labplug.py").write_text(text)
    assert extend.load_plugin("labplug") is None and ndif_problem("labplug") is None
