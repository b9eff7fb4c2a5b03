"""`workbench check MODEL`: PASS on models the workbench reads right, FAIL when it misreads one."""

from __future__ import annotations

import numpy as np
import pytest

from workbench.check import check_model
from workbench.cli import main
from workbench.models.architectures import tiny_architectures

# every registered tiny model; beyond these two, slow (each builds and loads its model)
FAST = ("tiny-qwen3vl", "tiny-llama")
TINY = [a.tiny if a.tiny in FAST else pytest.param(a.tiny, marks=pytest.mark.slow) for a in tiny_architectures()]


@pytest.mark.parametrize("name", TINY)
def test_check_passes_and_prints_the_measured_differences(workbench_cache, name, capsys):
    assert main(["check", name, "--device", "cpu", "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "PASS  residual stream = plain forward pre-hooks: max |difference| 0.00e+00" in out
    if name == "tiny-llama":
        assert "N/A   alpha = 1 equals the baseline" in out
    elif name == "tiny-mllama":   # cross-attention: no vision positions, the image's K/V checked instead
        assert "PASS  image marker labelled boundary, no vision positions" in out
        assert "PASS  cross-attention K/V = a plain forward's cache: max |difference| 0.00e+00" in out
        assert "PASS  alpha = 1 equals the baseline" in out
    else:
        assert "PASS  vision tokens = image-token positions" in out and "PASS  alpha = 1 equals the baseline" in out


def test_check_fails_when_the_labels_are_wrong(workbench_cache, monkeypatch, capsys):
    """A negative control: an encoder that labels one text token as vision is caught."""
    from workbench.models import model as model_module

    original = model_module.InputEncoder.token_modality

    def mislabel(self, input_ids):
        modality = np.array(original(self, input_ids), dtype=object)
        modality[np.flatnonzero(modality == "text")[0]] = "vision"
        return modality.astype(str)

    monkeypatch.setattr(model_module.InputEncoder, "token_modality", mislabel)
    results = {r.name: r for r in check_model("tiny-qwen3vl", device="cpu", dtype="float32")}
    assert results["vision tokens = image-token positions"].status == "FAIL"
    assert main(["check", "tiny-qwen3vl", "--device", "cpu", "--dtype", "float32"]) == 1
    assert "do not trust stored values" in capsys.readouterr().out
