"""The loops section 8 of benchmarks/ compares save what they claim to: the hand-written nnsight
loop (what tracing alone costs) saves the residual stream the workbench stores, and the plain
loop hidden states of the same shape, as transformers returns them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

pytest.importorskip("torch")
pytest.importorskip("nnsight")


@pytest.mark.parametrize("name", ["tiny-smolvlm", "tiny-qwen3vl"])
def test_the_loops_save_what_the_workbench_stores(load_tiny, tmp_path, name):
    import workbench
    from benchmarks.overhead import nnsight_loop, plain_loop, workbench_loop
    from workbench.data import builtin_samples

    model = load_tiny(name, attn="sdpa")
    samples = builtin_samples(2)
    store = tmp_path / "run.zarr"
    workbench_loop(model, samples, store, lambda: None)
    for loop in ("nnsight", "plain"):
        (tmp_path / loop).mkdir()
    nnsight_loop(model, samples, tmp_path / "nnsight", lambda: None)
    plain_loop(model, samples, tmp_path / "plain", lambda: None)

    ds = workbench.open_store(store, model=model.model_id)
    n_layers = model.n_layers
    for i, sample in enumerate(samples):
        stored = ds.hidden.sel(sample=sample.id).values  # (token, layer, dim)
        by_hand = np.load(tmp_path / "nnsight" / f"hidden-{i}.npy")
        assert by_hand.shape == stored.shape == (stored.shape[0], n_layers + 1, model.info.hidden_size)
        np.testing.assert_allclose(by_hand, stored, rtol=1e-5, atol=1e-5)
        # transformers' hidden states, the plain loop's: the same shape and embeddings; later layers
        # differ by convention (its last is after the final norm, the workbench's the norm's input;
        # Qwen3-VL's are taken before the DeepStack add, the workbench's after it)
        plain = np.load(tmp_path / "plain" / f"hidden-{i}.npy")
        assert plain.shape == stored.shape
        np.testing.assert_allclose(plain[:, 0], stored[:, 0], rtol=1e-5, atol=1e-5)
