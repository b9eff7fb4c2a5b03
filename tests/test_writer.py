"""The background writer: the same store as synchronous writes, bounded queue memory, errors
surfaced in the caller, and Ctrl-C committing what was already captured."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import store_drill
from test_store import assert_same_store
from workbench.store import StoreError, StoreWriter, Variable, open_store
from workbench.writer import BackgroundWriter, captured_bytes


def drill_results():
    for s, (sample, n) in enumerate(store_drill.SAMPLES):
        for c, (name, sweep) in enumerate(store_drill.CONDITIONS.items()):
            yield name, sample, store_drill.sample_variables(c, s, n), {"sweep": sweep, "identity": store_drill.identity(sweep)}, f"input-{s}"


def write_in_background(path, max_bytes=1 << 30, **kwargs):
    with StoreWriter(path) as store:
        store.ensure_model(store_drill.MODEL, {"family": "drill", "n_layers": 2, "hidden_size": 128,
                                               "dtype": "float32", "device": "cpu"})
        store.add_provenance({"spec_name": "drill"})
        with BackgroundWriter(store, max_bytes=max_bytes, **kwargs) as writer:
            for name, sample, variables, attrs, input_hash in drill_results():
                writer.put(store_drill.MODEL, name, sample, variables, attrs, input_hash)
        store.finish_run()
    return writer


def test_background_writes_give_the_synchronous_store(tmp_path):
    reference = tmp_path / "sync.zarr"
    assert store_drill.run(str(reference)) == 0
    written = []
    writer = write_in_background(tmp_path / "bg.zarr", on_written=lambda *key: written.append(key))
    assert len(written) == 4 and writer.queued_bytes == 0
    assert_same_store(tmp_path / "bg.zarr", reference, (store_drill.MODEL,))


def test_the_queue_is_bounded_in_bytes(tmp_path):
    one = max(captured_bytes(v) for _, _, v, _, _ in drill_results())
    writer = write_in_background(tmp_path / "bg.zarr", max_bytes=one + 1)
    assert one <= writer.peak_bytes <= one + 1  # never two results queued at once


def test_an_error_in_the_thread_reaches_the_caller_and_nothing_after_it_is_written(tmp_path):
    with StoreWriter(tmp_path / "bg.zarr") as store:
        store.ensure_model("m", {"family": "x"})
        bad = {"position": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((4, 2)))}
        good = {"position": Variable(("token",), np.arange(3)), "hidden": Variable(("token", "dim"), np.zeros((3, 2)))}
        with pytest.raises(StoreError, match="disagree on the number of tokens"):
            with BackgroundWriter(store) as writer:
                writer.put("m", "c", "s0", good)
                writer.put("m", "c", "s1", bad)
                writer.put("m", "c", "s2", good)
    assert [str(s) for s in open_store(tmp_path / "bg.zarr", model="m").run_sample.values] == ["s0"]


def test_an_interrupt_commits_what_was_captured(tmp_path):
    """Ctrl-C in the caller (here raised right after the last put): the context manager still
    writes every queued result before the interrupt propagates."""
    gate = threading.Event()
    with StoreWriter(tmp_path / "bg.zarr") as store:
        store.ensure_model(store_drill.MODEL, {"family": "drill"})
        with pytest.raises(KeyboardInterrupt):
            with BackgroundWriter(store, on_written=lambda *key: gate.wait(5)) as writer:
                for name, sample, variables, attrs, input_hash in drill_results():
                    writer.put(store_drill.MODEL, name, sample, variables, attrs, input_hash)
                gate.set()
                raise KeyboardInterrupt
    assert len(open_store(tmp_path / "bg.zarr", model=store_drill.MODEL).run_sample) == 4
