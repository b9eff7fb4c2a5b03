"""A capture site from a plugin module (`workbench.extend.register_site`): the docs' example
(docs/specs.md), written to a temporary directory and imported for real from the spec's
`plugins`: validated like a built-in (located errors, `validate` lists it), captured and edited in
a run, its stored values against plain PyTorch hooks, and listed by the docs' reference, which
reads the registry."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench import extend, open_store, sites
from workbench.cli import main
from workbench.data import builtin_samples
from workbench.runner import LazyInputs

REPO = Path(__file__).resolve().parents[1]

PAGE = REPO / "docs" / "specs.md"   # the page with the example, run verbatim here
MARKER = "# site plugin: labsites.py\n"
PLUGIN = PAGE.read_text(encoding="utf-8").split("```python\n" + MARKER, 1)[1].split("```", 1)[0]

SPEC = """\
name: mlpin
plugins: [labsites]
models: [tiny-llama]
data: {source: builtin, n: 1}
conditions:
  baseline: {}
  scaled:
    interventions:
      - {kind: scale, site: mlp_in, layers: [1], factor: 3.0}
capture:
  - {site: mlp_in}
  - {site: layer}
store: {path: s.zarr}
backend: {device: cpu, dtype: float32}
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """The plugin module in the current directory; the registry as it was after the test."""
    saved_sites, saved_modules = dict(sites.SITES), dict(extend.SITE_MODULES)
    (tmp_path / "labsites.py").write_text(PLUGIN)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sites.SITES.clear()
    sites.SITES.update(saved_sites)
    extend.SITE_MODULES.clear()
    extend.SITE_MODULES.update(saved_modules)
    sys.modules.pop("labsites", None)


def hooked(model, encoding, scale_layer: int, factor: float) -> tuple[np.ndarray, np.ndarray]:
    """(mlp_in, hidden) with plain PyTorch hooks: each decoder layer's post-attention norm output
    (scaled by `factor` at `scale_layer` by a forward hook returning the new output), and the
    residual stream (pre-hooks on every decoder layer and the final norm)."""
    decoder = model.hf.get_decoder()
    norms: list[torch.Tensor] = []
    residual: list[torch.Tensor] = []

    def norm_hook(index):
        def hook(module, args, out):
            out = out * factor if index == scale_layer else out
            norms.append(out[0].detach().clone())
            return out
        return hook

    handles = [layer.post_attention_layernorm.register_forward_hook(norm_hook(i))
               for i, layer in enumerate(decoder.layers)]
    handles += [m.register_forward_pre_hook(lambda m, a: residual.append(a[0][0].detach().clone()))
                for m in list(decoder.layers) + [decoder.norm]]
    try:
        model.prepare()
        with torch.inference_mode():
            model.hf(**encoding)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(norms, dim=1).numpy(), torch.stack(residual, dim=1).numpy()


def test_a_site_is_unknown_until_its_plugin_is_named(plugin_dir, capsys):
    (plugin_dir / "spec.yaml").write_text(SPEC.replace("plugins: [labsites]\n", ""))
    assert main(["validate", "spec.yaml"]) == 2
    err = capsys.readouterr().err
    assert "spec.yaml:8: conditions.scaled.interventions[0].site: got 'mlp_in' (str)" in err, err
    assert "spec.yaml:10: capture[0].site: got 'mlp_in' (str)" in err, err
    assert "mlp_in" not in sites.SITES


def test_a_plugin_site_is_validated_like_a_builtin(plugin_dir, capsys):
    (plugin_dir / "spec.yaml").write_text(SPEC)
    assert main(["validate", "spec.yaml", "--models-check"]) == 0
    out = capsys.readouterr().out
    assert "plugins: labsites (site mlp_in)" in out, out
    assert extend.site_module("mlp_in") == "labsites"
    assert list(sites.SITES).index("attn_out") < list(sites.SITES).index("mlp_in") < list(sites.SITES).index("mlp_out")
    # a misspelt name: located, and the plugin's site offered
    (plugin_dir / "spec.yaml").write_text(SPEC.replace("{site: mlp_in}", "{site: mlp_inn}"))
    assert main(["validate", "spec.yaml"]) == 2
    err = capsys.readouterr().err
    assert "spec.yaml:11: capture[0].site: got 'mlp_inn' (str) (did you mean 'mlp_in'?); expected one of" in err, err
    # the model check: layers past the model's decoder layers (tiny-llama has 2)
    (plugin_dir / "spec.yaml").write_text(SPEC.replace("layers: [1]", "layers: [5]"))
    assert main(["validate", "spec.yaml", "--models-check"]) == 2
    assert "spec.yaml:9: conditions.scaled.interventions[0].layers" in capsys.readouterr().err


def test_a_plugin_site_is_captured_and_edited_as_plain_hooks_compute(plugin_dir, load_tiny):
    (plugin_dir / "spec.yaml").write_text(SPEC)
    assert main(["run", "spec.yaml", "--no-progress", "--no-table", "-q"]) == 0
    ds = open_store(plugin_dir / "s.zarr", model="tiny-llama")
    assert ds.mlp_in.dims == ("token", "decoder_layer", "dim")
    model = load_tiny("tiny-llama")
    encoding = LazyInputs(model, builtin_samples(1)[0])["real"].encoding
    for condition, factor in (("baseline", 1.0), ("scaled", 3.0)):
        expected_in, expected_hidden = hooked(model, encoding, 1, factor)
        stored_in = ds.mlp_in.sel(condition=condition).values
        assert stored_in.shape == expected_in.shape
        np.testing.assert_allclose(stored_in, expected_in, atol=1e-5, err_msg=condition)
        np.testing.assert_allclose(ds.hidden.sel(condition=condition).values, expected_hidden, atol=1e-5,
                                   err_msg=condition)
    # the edit reached the rest of the forward: the residual after layer 1 differs, not before
    base, scaled = (ds.hidden.sel(condition=c).values for c in ("baseline", "scaled"))
    np.testing.assert_array_equal(base[:, :2], scaled[:, :2])
    assert not np.allclose(base[:, 2], scaled[:, 2])


def test_the_reference_lists_a_registered_plugin_site(plugin_dir):
    assert extend.load_plugin("labsites") is None  # as the spec's `plugins` imports it

    spec = importlib.util.spec_from_file_location("reference_hook", REPO / "docs" / "hooks" / "reference.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    rows = reference.site_rows()
    assert "| `mlp_in` | `decoder_layer` |  | yes | `sequence` | `mlp_in` (token, decoder_layer, dim) | " \
           "`mlp_in`: what decoder layer l's MLP reads" in rows, rows
    assert "| `mlp_in` | (token, decoder_layer, dim) | `mlp_in` |" in reference.captures()


def test_a_site_that_collides_is_refused_at_registration(plugin_dir):
    with pytest.raises(ValueError, match="site 'layer' is declared twice: in workbench.sites and"):
        extend.register_site(sites.Site("layer", 4, stores={"other": ("token", "dim")}, access="sequence"))
    with pytest.raises(ValueError, match="variable 'hidden' is already stored by site 'layer'"):
        extend.register_site(sites.Site("mine", 4, stores={"hidden": ("token", "dim")}, access="sequence"))
    with pytest.raises(ValueError, match="expected the first to be a row dim"):
        extend.register_site(sites.Site("mine", 4, stores={"mine": ("dim",)}, access="sequence"))
    assert "mine" not in sites.SITES
