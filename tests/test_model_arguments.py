"""Every model argument goes through one resolution path (workbench/models/refs.py): a spec's
`models`, `run --models`, `validate --models` (with and without --models-check) and `check MODEL`
refuse the same bad argument with the same message after their own location, exit 2, no
traceback, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.spec import TINY_MODEL_NAMES

LOCATION = {"spec": "{spec}:2: models[0]", "option": "command line: --models[0]", "check": "command line: MODEL"}


def bad_model(tmp_path: Path, case: str) -> tuple[str, str, bool]:
    """(the argument, the message's phrase, whether it is refused before any config is read)."""
    if case == "a misspelt tiny name":
        return "tiny-qwen", ("unknown model 'tiny-qwen' (did you mean 'tiny-qwen3vl'?); expected one of tiny-smolvlm, "
                             "tiny-qwen3vl"), True
    if case == "another misspelling":
        return "tiny-lama", "unknown model 'tiny-lama' (did you mean 'tiny-llama'?)", True
    if case == "a missing relative directory":
        return "./no/such/dir", f"no directory './no/such/dir' (from {tmp_path}); expected one of", True
    if case == "a missing path that is no hub id":
        return "no/such/dir", f"no directory 'no/such/dir' (from {tmp_path})", True
    if case == "a file":
        (tmp_path / "weights.bin").write_bytes(b"")
        return str(tmp_path / "weights.bin"), f"'{tmp_path / 'weights.bin'}' is a file, not a directory", True
    if case == "a hub id not in the cache":  # offline (conftest): the cache is all there is
        return "org/not-cached", "model 'org/not-cached' is not in the local Hugging Face cache and the hub is off", False
    if case == "an empty directory":
        (tmp_path / "empty").mkdir()
        return str(tmp_path / "empty"), "holds no model (no config.json)", False
    from workbench.models.tiny import tiny_model_dir  # "a checkpoint without weights"

    target = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir("tiny-llama"), target)
    for weights in target.glob("*.safetensors"):
        weights.unlink()
    return str(target), "holds a config.json but no weights", False


CASES = ["a misspelt tiny name", "another misspelling", "a missing relative directory",
         "a missing path that is no hub id", "a file", "a hub id not in the cache", "an empty directory",
         "a checkpoint without weights"]
COMMANDS = {  # name -> (argv, where the message is located, reads configs)
    "run, the spec's models": (["run", "{spec}", "--no-progress"], "spec", True),
    "run --models": (["run", "{ok}", "--models", "{model}", "--no-progress"], "option", True),
    "validate --models": (["validate", "{ok}", "--models", "{model}"], "option", False),
    "validate --models-check --models": (["validate", "{ok}", "--models-check", "--models", "{model}"], "option", True),
    "validate --models-check, the spec's models": (["validate", "{spec}", "--models-check"], "spec", True),
    "check": (["check", "{model}", "--device", "cpu"], "check", True),
}


def write(tmp_path: Path, name: str, model: str) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\nmodels: [{json.dumps(model)}]\nconditions: {{baseline: {{}}}}\n"
                    f"capture: [{{site: layer}}]\nstore: {{path: {tmp_path / (name + '.zarr')}}}\n")
    return spec


@pytest.mark.parametrize("case", CASES)
def test_every_command_refuses_a_bad_model_argument_alike(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    model, phrase, syntactic = bad_model(tmp_path, case)
    spec, ok = write(tmp_path, "bad", model), write(tmp_path, "ok", "tiny-llama")
    before = sorted(p.name for p in tmp_path.iterdir())
    messages = {}
    for command, (argv, where, reads_configs) in COMMANDS.items():
        if not (syntactic or reads_configs):
            continue  # validate without --models-check reads no config: a well-formed argument passes it
        code = main([a.format(spec=spec, ok=ok, model=model) for a in argv])
        err = capsys.readouterr().err
        assert code == 2, (command, err)
        assert err.startswith("error: ") and "Traceback" not in err, (command, err)
        location = LOCATION[where].format(spec=spec)
        assert err.startswith(f"error: {location}: "), (command, err)
        messages[command] = err[len(f"error: {location}: "):]
        assert phrase in messages[command], (command, err)
    assert len(set(messages.values())) == 1, messages  # the same words, whichever command
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_a_well_formed_argument_passes_every_command_s_first_check(tmp_path, capsys):
    """The path does not refuse what it should resolve: a tiny name and a checkpoint directory."""
    from workbench.models.refs import model_ref_problem
    from workbench.models.tiny import tiny_model_dir

    assert model_ref_problem("tiny-llama") is None
    assert model_ref_problem(str(tiny_model_dir("tiny-llama"))) is None
    assert model_ref_problem("HuggingFaceTB/SmolVLM2-2.2B-Instruct") is None
    assert model_ref_problem(3) == (f"got 3 (int); expected one of {', '.join(TINY_MODEL_NAMES)}, "
                                    "tiny-smolvlm-trained, tiny-qwen3vl-trained (a checkpoint: NAME@step-N), "
                                    "a Hugging Face repo id 'org/name', or a local checkpoint directory")
