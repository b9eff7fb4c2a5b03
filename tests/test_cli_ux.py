"""The CLI as a colleague: what `validate` refuses matches what `run` refuses, every expected
failure is one line with its exit code (nothing stored is lost), interrupts stop cleanly, and the
conventions (--version, -q/-v, help when bare, python -m workbench) hold. Real tiny models, real
stores, through `workbench.cli.main` or a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.cli import main


def write_spec(tmp_path: Path, body: str, name: str = "spec") -> tuple[Path, Path]:
    """A spec file whose store lies in tmp_path; returns (spec, store)."""
    store = tmp_path / f"{name}.zarr"
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\n{body}store: {{path: {store}}}\n")
    return spec, store


# ------------------------------------------------------------------ validation knows what run refuses


def test_validate_refuses_a_capture_run_would_refuse(tmp_path, capsys):
    spec, store = write_spec(tmp_path, "models: [tiny-qwen3vl]\nconditions: {baseline: {}}\ncapture: [{site: vision}]\n")
    assert main(["validate", str(spec)]) == 2
    assert "spec.yaml:4: capture[0].site: site 'vision' cannot be captured; expected one of layer" in capsys.readouterr().err
    assert not store.exists()


def test_source_cycle_is_refused_before_any_model_loads(tmp_path, capsys):
    spec, store = write_spec(tmp_path, """\
models: [tiny-llama]
conditions:
  a: {interventions: [{kind: patch, site: layer, layers: [1], from: b}]}
  b: {interventions: [{kind: patch, site: layer, layers: [1], from: a}]}
capture: [{site: layer}]
""")
    for command in (["validate", str(spec)], ["run", str(spec), "--no-progress"]):
        assert main(command) == 2
        assert "spec.yaml:4: conditions.a.interventions[0].from: source cycle a -> b -> a" in capsys.readouterr().err
    assert not store.exists()


def test_a_source_chain_six_deep_runs(tmp_path, capsys):
    chain = "".join(f"  c{i}: {{interventions: [{{kind: patch, site: layer, layers: [1], positions: text, from: c{i + 1}}}]}}\n"
                    for i in range(6))
    spec, store = write_spec(tmp_path, f"""\
models: [tiny-llama]
data: {{source: builtin, n: 1}}
conditions:
{chain}  c6: {{interventions: [{{kind: scale, site: layer, layers: [1], factor: 3.0}}]}}
capture: [{{site: layer, layers: [2]}}]
""")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    import workbench

    ds = workbench.open_store(store, model="tiny-llama")
    hidden = {c: ds.hidden.sel(condition=c).values for c in ("c0", "c6")}
    assert (hidden["c0"] == hidden["c6"]).all()  # c0 copies c1 ... copies c6's scaled stream


def test_two_projector_edits_on_qwen3vl_are_refused_by_validate_and_run(tmp_path, capsys):
    spec, store = write_spec(tmp_path, """\
models: [tiny-qwen3vl]
data: {source: builtin, n: 1}
conditions:
  both:
    interventions:
      - {kind: scale, site: projector, factor: 0.5}
      - {kind: scale, site: projector, factor: 2.0}
capture: [{site: layer, layers: [1]}]
""")
    expected = ("spec.yaml:8: conditions.both.interventions[1].site: tiny-qwen3vl: a second projector edit in one "
                "condition")
    assert main(["validate", str(spec), "--models-check"]) == 2
    assert expected in capsys.readouterr().err
    assert main(["run", str(spec), "--no-progress"]) == 2
    assert expected in capsys.readouterr().err
    assert not store.exists()


def test_summary_table_without_layer_0_and_with_a_text_only_condition(tmp_path, capsys):
    spec, store = write_spec(tmp_path, """\
models: [tiny-smolvlm]
data: {source: builtin, n: 1}
conditions:
  baseline: {}
  text_only: {image: none}
capture: [{site: layer, layers: [1]}]
""")
    assert main(["run", str(spec), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "| tiny-smolvlm | baseline | 1 | " in out
    assert "| tiny-smolvlm | text_only | 1 | n/a (no vision or text tokens) |" in out
    assert "nan" not in out
