"""Before a run (workbench/estimate.py): `validate --estimate` counts the runs and forwards and the
bytes of every capture per condition, checked against the store the same spec then writes (each
variable's bytes in memory, per condition, as the store holds them); `--models-check` times one
forward; a run whose estimate exceeds the free disk says so before it starts."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import workbench
from workbench.cli import main
from workbench.estimate import estimate_run, free_disk_problem, human

MODEL = "tiny-qwen3vl"
SPEC = """name: estimate
models: [{model}]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  none: {{image: none}}
  alpha:
    sweep: {{alpha: [0.5, 2.0]}}
    interventions:
      - {{kind: scale, site: projector, factor: $alpha, positions: vision}}
capture:
  - {{site: layer, layers: [0, 2]}}
  - {{site: keys, layers: [0]}}  # attention and keys share the decoder_layer dim
  - {{site: embed}}
  - {{site: logit_lens, layers: [0, 2]}}  # as the residual: variables share the layer dim
  - {{site: logits}}
  - {{site: attention, layers: [0]}}
generate: {{max_new_tokens: 2}}
store: {{path: {store}}}
"""


@pytest.fixture(scope="module")
def estimated(tmp_path_factory, workbench_cache):
    root = tmp_path_factory.mktemp("estimate")
    spec_path = root / "estimate.yaml"
    spec_path.write_text(SPEC.format(model=MODEL, store=root / "s.zarr"))
    return spec_path, root / "s.zarr"


@pytest.mark.slow  # ~20 s on 2 cores: a run of 8 (sample, condition) with 2 decode steps and attention
def test_the_estimate_is_the_stored_bytes_per_condition_and_variable(estimated, capsys):
    spec_path, store = estimated
    assert main(["validate", str(spec_path), "--estimate"]) == 0
    out = capsys.readouterr().out
    estimate = estimate_run(workbench.load_spec(spec_path))
    (model,) = estimate.models
    assert model.not_estimated == {"prefill_vision_mass": "head", "prefill_text_attention": "head",
                                   "decode_attention": "head"}
    assert main(["run", str(spec_path), "--no-progress", "--no-table"]) == 0
    capsys.readouterr()
    ds = workbench.open_store(store, MODEL)
    conditions = sorted(set(ds.run_condition.values.tolist()))
    assert conditions == sorted(model.bytes_per_condition) == ["alpha[alpha=0.5]", "alpha[alpha=2.0]", "baseline", "none"]
    variables = list(model.variables)
    assert set(variables) == {"hidden", "keys", "embed", "lens_ids", "lens_logprobs", "logprobs", "generated"}
    for condition in conditions:
        rows = ds.wb.sel(condition=condition)
        stored = sum(rows[v].nbytes for v in variables)
        assert model.bytes_per_condition[condition] == stored, condition
        assert f"    {condition}: {human(stored)}" in out
    for v in variables:
        assert model.variables[v] == ds[v].nbytes, v
    on_disk = sum(f.stat().st_size for f in Path(store).rglob("*") if f.is_file())
    assert 0 < on_disk and estimate.bytes == sum(ds[v].nbytes for v in variables)
    # forwards: every (sample, condition) run, its prompt and one more decode step (max_new_tokens 2)
    assert estimate.runs == 2 * 4 and estimate.forwards == 2 * 4 * 2
    assert "estimate: 8 run(s) (model, sample, condition) over 2 sample(s), 16 forward pass(es)" in out
    assert f"  in all: {human(estimate.bytes)} of captures, uncompressed" in out
    assert "not estimated: prefill_vision_mass (its 'head' size is known only after a forward)" in out


def test_models_check_times_one_forward(estimated, capsys):
    spec_path, _ = estimated
    assert main(["validate", str(spec_path), "--estimate", "--models-check"]) == 0
    out = capsys.readouterr().out
    found = re.search(rf"  {MODEL}: one forward \(the prompt of builtin/counting/000\) took ([\d.e+-]+) s here; "
                      r"16 forward\(s\) take about ([\d.e+-]+) s", out)
    assert found, out
    assert float(found.group(1)) > 0


def test_a_run_beyond_the_free_disk_says_so_before_it_starts(estimated, tmp_path, capsys, monkeypatch):
    spec_path, _ = estimated
    store = tmp_path / "short.zarr"
    needed = estimate_run(workbench.load_spec(spec_path)).bytes
    assert free_disk_problem(str(store), needed, free=needed) is None
    message = free_disk_problem(str(store), needed, free=needed // 2)
    assert message.startswith(f"this run's captures are estimated at {human(needed)} uncompressed, more than the "
                              f"{human(needed // 2)} free on the disk of {store}")
    assert free_disk_problem("s3://bucket/s.zarr", needed, free=0) is None  # a bucket's room is not measured

    real = shutil.disk_usage

    def little_room(path):  # the disk as a nearly full one reports itself
        usage = real(path)
        return usage._replace(free=needed // 10)  # less than one sample's share

    monkeypatch.setattr(shutil, "disk_usage", little_room)
    assert main(["run", str(spec_path), "--store", str(store), "--limit", "1", "--no-progress", "--no-table"]) == 0
    err = capsys.readouterr().err
    assert "warning: this run's captures are estimated at" in err and "more than the" in err
    assert store.is_dir()  # a warning, not a refusal: the estimate is uncompressed


SCAN_SPEC = f"""name: estimate-scan
models: [{MODEL}]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  trace: {{scan: {{clean: baseline, corrupt: blank, layers: [0, 1, 2], positions: [vision, text, last], direction: both}}}}
  heads: {{scan: {{clean: baseline, corrupt: blank, site: attn_heads, heads: [0, 1], layers: [1], positions: [last]}}}}
  guess: {{scan: {{clean: baseline, corrupt: blank, layers: [0, 2], positions: [vision], method: attribution,
                  metric: logit_diff, tokens: [3, 4]}}}}
capture: [{{site: logits}}]
store: {{path: unused.zarr}}
backend: {{batch_size: 8}}
"""


def test_the_estimate_counts_a_scans_forwards_as_the_backend_issues_them(load_tiny):
    """Real patching's runs batched, plus one forward per donor and site a sample's runs read
    (the traces a local run of each sample's runs issues, counted as they run); an attribution
    scan's runs none of their own but a forward of its base and its donor per sample."""
    import math

    from workbench.backends.local import Job, group_rows, run_rows, want_sources
    from workbench.data import builtin_samples
    from workbench.runner import LazyInputs, compile_all
    from workbench.spec import parse_spec

    spec = parse_spec(SCAN_SPEC)
    (plan,) = compile_all(spec)
    model = load_tiny(MODEL, attn="sdpa")
    real = [c for c in plan.conditions if not c.name.startswith("guess[")]
    traced = []
    for sample in builtin_samples(2):
        inputs = LazyInputs(model, sample)
        jobs = [Job(inputs, c) for c in real]
        memo = want_sources(jobs, {})
        for group in group_rows(jobs, plan.batch_size, model.arch.per_token_keys):
            run_rows(model, [jobs[i] for i in group], plan, on_trace=traced.append, memo=memo)
    estimate = estimate_run(spec, [plan])
    # 2 + 18 + 2 runs in forwards of 8, per sample; the donors: baseline and blank at `layer`, baseline at attn_heads
    assert len(traced) == 2 * (math.ceil(22 / 8) + 3)
    assert estimate.forwards == len(traced) + 2 * 2   # the attribution scan: its base's and its donor's forward
    assert estimate.runs == 2 * (22 + 2)
