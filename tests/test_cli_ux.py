"""The CLI as a colleague: what `validate` refuses matches what `run` refuses, every expected
failure is one line with its exit code (nothing stored is lost), interrupts stop cleanly, and the
conventions (--version, -q/-v, help when bare, python -m workbench) hold. Real tiny models, real
stores, through `workbench.cli.main` or a subprocess."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    spec, store = write_spec(tmp_path, "models: [tiny-qwen3vl]\nconditions: {baseline: {}}\ncapture: [{site: projector}]\n")
    assert main(["validate", str(spec)]) == 2
    assert "spec.yaml:4: capture[0].site: site 'projector' cannot be captured; expected one of embed, embed_table, vision_layer, vision," in capsys.readouterr().err
    assert not store.exists()


def test_source_cycle_is_refused_before_any_model_loads(tmp_path, capsys, store_copy):
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
    assert main(["run", str(spec), "--store", str(store_copy)]) == 2  # an existing store is left as it was


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


def test_two_projector_edits_on_qwen3vl_are_refused_by_validate_and_run(tmp_path, capsys, store_copy):
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
    assert main(["run", str(spec), "--store", str(store_copy)]) == 2  # an existing store is left as it was


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


# ------------------------------------------------------------------ one line per failure, nothing lost


@pytest.fixture(scope="module")
def kept_store(tmp_path_factory, workbench_cache):
    """A real store (tiny-llama, one sample) that every failing command below points at."""
    root = tmp_path_factory.mktemp("kept")
    spec, store = write_spec(root, "models: [tiny-llama]\ndata: {source: builtin, n: 1}\nconditions: {baseline: {}}\n"
                             "capture: [{site: layer, layers: [1]}]\n", name="kept")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    return store


def snapshot(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.fixture
def store_copy(kept_store, tmp_path):
    """A copy of the kept store; the test asserts it is byte for byte unchanged afterwards."""
    import shutil

    copy = tmp_path / "copy.zarr"
    shutil.copytree(kept_store, copy)
    before = snapshot(copy)
    yield copy
    assert snapshot(copy) == before, "a failing command changed the store"


def fails(argv: list[str], capsys, code: int = 2) -> str:
    """Run the CLI, assert the exit code, one `error:` message and no traceback; return stderr."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def jsonl_spec(tmp_path: Path, lines: list[str]) -> Path:
    data = tmp_path / "samples.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    spec, _ = write_spec(tmp_path, f"models: [tiny-llama]\ndata: {{source: jsonl, path: {data}, n: 4}}\n"
                         "conditions: {baseline: {}}\ncapture: [{site: layer, layers: [1]}]\n", name="own")
    return spec


def image(tmp_path: Path, name: str = "a.png", size: int = 32) -> str:
    from PIL import Image

    Image.new("RGB", (size, size), "red").save(tmp_path / name)
    return name


@pytest.mark.parametrize("case, lines, phrase", [
    ("bad JSON", ['{"id": "a", "question": "q?"}', '{"id": "b", question: "q?"}'],
     "samples.jsonl:2: invalid JSON (Expecting property name enclosed in double quotes at column 13)"),
    ("empty question", ['{"id": "a", "question": "  "}'], "samples.jsonl:1: question: got '  '; expected a non-empty string"),
    ("missing image", ['{"id": "a", "image": "nope.png", "question": "q?"}'],
     "samples.jsonl:1: image '{dir}/nope.png' does not exist; expected an image file"),
    ("corrupt image", ['{"id": "a", "image": "bad.png", "question": "q?"}'],
     "samples.jsonl:1: image '{dir}/bad.png' cannot be decoded (UnidentifiedImageError"),
])
def test_bad_sample_files(tmp_path, capsys, store_copy, case, lines, phrase):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    spec = jsonl_spec(tmp_path, lines)
    err = fails(["run", str(spec), "--store", str(store_copy), "--no-progress"], capsys)
    assert phrase.format(dir=tmp_path) in err


def test_missing_jsonl_file(tmp_path, capsys, store_copy):
    spec = jsonl_spec(tmp_path, [])
    (tmp_path / "samples.jsonl").unlink()
    err = fails(["run", str(spec), "--store", str(store_copy), "--no-progress"], capsys)
    assert f"data.path: '{tmp_path}/samples.jsonl' is missing; expected a JSONL file" in err


def test_decompression_bomb_is_refused(tmp_path, capsys, store_copy, monkeypatch):
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # PIL's own guard, at a size a test can afford
    spec = jsonl_spec(tmp_path, [f'{{"id": "a", "image": "{image(tmp_path)}", "question": "q?"}}'])
    err = fails(["run", str(spec), "--store", str(store_copy), "--no-progress"], capsys)
    assert "samples.jsonl:1: image" in err and "is too large to open safely" in err and "hint: downscale" in err


def tiny_llama_copy(tmp_path: Path, config_edit=None, weights: bool = True) -> Path:
    import json
    import shutil

    from workbench.models.tiny import tiny_model_dir

    target = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir("tiny-llama"), target)
    if not weights:
        for f in target.glob("*.safetensors"):
            f.unlink()
    if config_edit:
        config = json.loads((target / "config.json").read_text())
        config_edit(config)
        (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("case", ["empty dir", "no weights", "unknown model_type", "unsupported architecture"])
def test_model_directories_that_hold_no_usable_model(tmp_path, capsys, store_copy, kept_store, case):
    if case == "empty dir":
        model, phrase = tmp_path / "empty", "holds no model (no config.json)"
        model.mkdir()
    elif case == "no weights":
        model, phrase = tiny_llama_copy(tmp_path, weights=False), "holds a config.json but no weights"
    elif case == "unknown model_type":
        model = tiny_llama_copy(tmp_path, lambda c: c.update(model_type="foo"))
        phrase = "cannot read its config (ValueError"
    else:
        model = tiny_llama_copy(tmp_path, lambda c: c.update(architectures=["MambaForCausalLM"]))
        phrase = "(model_type 'llama'): unsupported architecture ['MambaForCausalLM']; supported:"
    err = fails(["run", str(kept_store.with_suffix(".yaml")), "--models", str(model), "--store", str(store_copy),
                 "--no-progress"], capsys)
    assert f"error: command line: --models[0]: model '{model}'" in err and phrase in err


REPO = Path(__file__).resolve().parents[1]


def test_a_shipped_study_spec_without_the_hub_fails_fast_with_the_offline_hint(capsys, store_copy, monkeypatch):
    import time

    from huggingface_hub import constants

    spec = str(REPO / "specs" / "norm_gap.yaml")
    start = time.monotonic()
    err = fails(["run", spec, "--store", str(store_copy), "--no-progress"], capsys)  # HF_HUB_OFFLINE=1 (conftest)
    assert "norm_gap.yaml:6: models[0]: model 'HuggingFaceTB/SmolVLM2-2.2B-Instruct' is not in the local" in err
    assert "hint: offline, the tiny models run any spec: --models tiny-smolvlm,tiny-qwen3vl (and --data builtin" in err
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # online, but the hub does not answer
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    err = fails(["run", spec, "--store", str(store_copy), "--no-progress"], capsys)
    assert "the Hugging Face hub (http://127.0.0.1:9) is unreachable and the model is not in the local cache" in err
    assert time.monotonic() - start < 30


def test_datbench_missing_names_the_fix(capsys, store_copy, monkeypatch):
    import time

    from huggingface_hub import constants

    spec = str(REPO / "specs" / "norm_gap.yaml")
    err = fails(["run", spec, "--models", "tiny-llama", "--store", str(store_copy), "--no-progress"], capsys)
    assert "data.source datbench: cannot load config 'chart' from 'DatologyAI/DatBench'" in err
    assert "hint: offline, --data builtin runs the spec on the built-in samples" in err
    # online, but the hub does not answer: seconds, not half a minute of retries
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    start = time.monotonic()
    err = fails(["run", spec, "--models", "tiny-llama", "--store", str(store_copy), "--no-progress"], capsys)
    assert "the Hugging Face hub (http://127.0.0.1:9) is unreachable; set data.path to a local copy" in err
    assert "set HF_DATASETS_OFFLINE=1 to read it from there" in err and time.monotonic() - start < 20


def test_cuda_without_a_gpu(capsys, store_copy, kept_store):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    err = fails(["run", str(kept_store.with_suffix(".yaml")), "--device", "cuda", "--store", str(store_copy),
                 "--no-progress"], capsys)
    assert "device 'cuda' asked for, but torch sees no CUDA GPU here" in err and "hint: use --device cpu" in err


# ------------------------------------------------------------------ interrupts and conventions


def workbench(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
              dispositions: dict[signal.Signals, Any] | None = None):
    """`python -m workbench ARGS` in a subprocess (this checkout first on the path). `dispositions`
    sets those signals' handlers in the child before it starts: a child otherwise inherits the
    test runner's, and a runner started as a background job ignores SIGINT."""
    import os

    def set_dispositions() -> None:
        for signum, handler in (dispositions or {}).items():
            signal.signal(signum, handler)

    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True, env=full,
                          cwd=cwd, timeout=300, preexec_fn=set_dispositions if dispositions else None)


def four_sample_spec(tmp_path: Path) -> tuple[Path, Path]:
    return write_spec(tmp_path, "models: [tiny-llama]\ndata: {source: builtin, n: 4}\nconditions: {baseline: {}}\n"
                      "capture: [{site: layer, layers: [1]}]\n")


def stored_samples(store: Path) -> int:
    import workbench as wb

    return wb.store_info(store)["models"]["tiny-llama"]["conditions"]["baseline"]["samples"]


DEFAULT_DISPOSITIONS = {signal.SIGINT: signal.SIG_DFL, signal.SIGTERM: signal.SIG_DFL}


@pytest.mark.signals
@pytest.mark.parametrize("signal_name, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupt_stops_cleanly_and_the_rerun_resumes(tmp_path, signal_name, code):
    spec, store = four_sample_spec(tmp_path)
    # the signal arrives while the 2nd sample is being written: that write completes, then the run stops
    stopped = workbench("run", str(spec), "--no-table", env={"WORKBENCH_SIGNAL_AT": f"{signal_name}:2"},
                        dispositions=DEFAULT_DISPOSITIONS)
    assert stopped.returncode == code, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == "interrupted: 2 of 4 stored; rerun to resume"
    assert "Traceback" not in stopped.stderr
    assert stored_samples(store) == 2
    resumed = workbench("run", str(spec), "--no-table")
    assert resumed.returncode == 0, resumed.stderr
    assert "wrote 2 and skipped 2 of 4" in resumed.stdout
    assert "repaired" not in resumed.stderr  # nothing was torn


@pytest.mark.signals
def test_a_run_started_with_sigint_ignored_keeps_ignoring_it_and_sigterm_still_stops_it(tmp_path):
    """The POSIX convention for background jobs (`workbench run spec.yaml &`): SIGINT ignored at
    start stays ignored, even while a sample's write defers signals; SIGTERM still stops cleanly."""
    ignored = {signal.SIGINT: signal.SIG_IGN, signal.SIGTERM: signal.SIG_DFL}
    spec, store = four_sample_spec(tmp_path)
    completed = workbench("run", str(spec), "--no-table", env={"WORKBENCH_SIGNAL_AT": "SIGINT:2"}, dispositions=ignored)
    assert completed.returncode == 0, completed.stderr
    assert stored_samples(store) == 4
    (tmp_path / "term").mkdir()
    spec, store = four_sample_spec(tmp_path / "term")
    stopped = workbench("run", str(spec), "--no-table", env={"WORKBENCH_SIGNAL_AT": "SIGTERM:2"}, dispositions=ignored)
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == "interrupted: 2 of 4 stored; rerun to resume"
    assert stored_samples(store) == 2


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
def test_the_signal_tests_pass_when_the_suite_starts_with_sigint_ignored():
    """`make test` started as a background job, under nohup or from a script inherits SIGINT
    ignored; the signal tests above set their children's dispositions, so they pass there too."""
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "signals",
                             str(Path(__file__))], capture_output=True, text=True, timeout=600, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert result.returncode == 0, result.stdout[-3000:]
    assert "3 passed" in result.stdout


@pytest.mark.slow  # seconds of CPU each: `make test-slow` (CI runs it)
def test_conventions(tmp_path):
    bare = workbench()
    assert bare.returncode == 0 and "usage: workbench" in bare.stdout and "run " in bare.stdout
    from workbench import __version__

    version = workbench("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"workbench {__version__}"
    spec, store = write_spec(tmp_path, "models: [tiny-llama]\ndata: {source: builtin, n: 1}\nconditions: {baseline: {}}\n"
                             "capture: [{site: layer, layers: [1]}]\n")
    quiet = workbench("run", str(spec), "-q")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    again = workbench("run", str(spec))  # a non-TTY: notes, no progress bar; the next command on stdout
    assert "resuming: 1 of 1" in again.stderr and "\r" not in again.stderr
    assert f"next: workbench analyze {store}" in again.stdout
    verbose = workbench("-v", "run", str(spec), "--device", "cuda")
    if "no CUDA GPU" in verbose.stderr:
        assert verbose.returncode == 2 and "Traceback" in verbose.stderr and "DeviceError" in verbose.stderr


def _import_changes(check: str) -> subprocess.CompletedProcess:
    """Import torch, nnsight, zarr, ... first (their own settings are theirs), then workbench; run
    `check` comparing before and after."""
    code = ("import warnings, zarr, xarray, torch, transformers, nnsight; filters = list(warnings.filters);"
            "before = dict(zarr.config.get('array'));"
            "import workbench, workbench.store, workbench.backends.local, workbench.runner, workbench.cli;" + check)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}, timeout=300)


def test_import_installs_no_warnings_filter():
    done = _import_changes("assert list(warnings.filters) == filters, warnings.filters[:3]")
    assert done.returncode == 0, done.stderr


def test_import_leaves_zarr_config_alone():
    done = _import_changes("assert dict(zarr.config.get('array')) == before, 'zarr config changed'")
    assert done.returncode == 0, done.stderr


def test_validate_points_to_the_next_command_and_is_silent_with_q(capsys):
    spec = str(REPO / "specs" / "demo.yaml")
    assert main(["validate", spec]) == 0
    out = capsys.readouterr().out
    assert "valid — 2 model(s), 4 condition(s)" in out and f"or workbench run {spec}" in out
    assert main(["-q", "validate", spec]) == 0 and capsys.readouterr() == ("", "")
