"""Bad input through the CLI: a located error on stderr, exit code 2, nothing written."""

from __future__ import annotations

import pytest

from workbench.cli import main

from support.specs import BAD_SPECS


@pytest.mark.parametrize("case", list(BAD_SPECS), ids=list(BAD_SPECS))
def test_bad_spec_exits_2_and_writes_nothing(tmp_path, capsys, case, monkeypatch):
    text, field, line, phrase = BAD_SPECS[case]
    monkeypatch.chdir(tmp_path)  # the spec's relative store path would land here
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    assert main(["run", str(spec), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:{line}: {field}: " in err if field != "(document)" else f"{spec}:{line}:" in err
    assert phrase in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_spec_a_model_cannot_run_exits_2_before_writing(tmp_path, capsys):
    spec = tmp_path / "llama.yaml"
    store = tmp_path / "store.zarr"
    spec.write_text(f"""\
name: text-only
models: [tiny-llama]
conditions:
  alpha:
    interventions: [{{kind: scale, site: projector, factor: 0.5, positions: vision}}]
capture: [{{site: layer, layers: [0, 99]}}]
store: {{path: {store}}}
""")
    assert main(["run", str(spec), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "llama.yaml:5: conditions.alpha.interventions[0].site: tiny-llama: a text-only model has no site 'projector'" in err
    assert "llama.yaml:6: capture[0].layers: tiny-llama: layers [99] out of range (2 decoder layers); expected 0..2" in err
    assert not store.exists()


def test_captures_along_one_layer_dim_with_other_layers_are_refused_before_writing(tmp_path, capsys):
    """`layer` and `logit_lens` both store along `layer`: the store holds one coordinate per dim,
    so different layer lists would fail at the first write; `validate` and `run` refuse them."""
    spec = tmp_path / "dims.yaml"
    store = tmp_path / "store.zarr"
    spec.write_text(f"""\
name: dims
models: [tiny-llama]
conditions: {{baseline: {{}}}}
capture: [{{site: layer, layers: [0, 2]}}, {{site: logit_lens, layers: [1]}}, {{site: attn_out, layers: [0]}}]
store: {{path: {store}}}
""")
    for command in ("validate", "run"):
        assert main([command, str(spec), "--no-progress"] if command == "run" else [command, str(spec)]) == 2
        err = capsys.readouterr().err
        assert ("dims.yaml:4: capture[1].layers: layers [1] differ from capture[0]'s [0, 2], "
                "stored along the same dim 'layer'; expected the same layers") in err
        assert "capture[2]" not in err  # attn_out is stored along decoder_layer
    assert not store.exists()


def test_all_layers_beside_explicit_ones_along_one_dim_are_refused_per_model(tmp_path, capsys):
    spec = tmp_path / "all.yaml"
    spec.write_text(f"name: all\nmodels: [tiny-llama]\nconditions: {{baseline: {{}}}}\n"
                    f"capture: [{{site: layer}}, {{site: logit_lens, layers: [2]}}]\nstore: {{path: {tmp_path / 's.zarr'}}}\n")
    assert main(["run", str(spec), "--no-progress"]) == 2
    assert ("capture[1].layers: tiny-llama: layers [2] differ from capture[0]'s [0, 1, 2], stored along the "
            "same dim 'layer'; expected the same layers") in capsys.readouterr().err
    assert not (tmp_path / "s.zarr").exists()


def test_bad_cli_override_exits_2(tmp_path, capsys):
    spec = tmp_path / "ok.yaml"
    spec.write_text(f"name: ok\nmodels: [tiny-llama]\nconditions: {{baseline: {{}}}}\n"
                    f"capture: [{{site: layer}}]\nstore: {{path: {tmp_path / 's.zarr'}}}\n")
    assert main(["run", str(spec), "--models", "tiny-llama,nope", "--no-progress"]) == 2
    assert "--models[1]: unknown model 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "s.zarr").exists()


def test_positions_beyond_a_sequence_are_refused_before_running(tmp_path, capsys):
    spec = tmp_path / "pos.yaml"
    store = tmp_path / "pos.zarr"
    spec.write_text(f"""\
name: pos
models: [tiny-llama]
data: {{source: builtin, n: 2}}
conditions:
  far:
    interventions: [{{kind: zero, site: layer, layers: [1], positions: [0, 5000]}}]
capture: [{{site: layer}}]
store: {{path: {store}}}
""")
    assert main(["run", str(spec), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "pos.yaml:6: conditions.far.interventions[0].positions: tiny-llama: position 5000 is out of range" in err
    assert not store.exists()
