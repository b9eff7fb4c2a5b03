"""The run's end deletes superseded chunk versions (`workbench.store.readers.compact`): the store
then takes about its arrays' bytes on disk, and a reader that opened the store before stays
safe, a real one in another process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from benchmarks.disk_bench import array_bytes, disk_bytes
from workbench.store import StoreWriter, Variable, open_store
from workbench.store.readers import readers_dir

ROOT = Path(__file__).resolve().parents[1]


def result(i: int, n: int = 37) -> dict[str, Variable]:
    rng = np.random.default_rng(i)
    return {"token_id": Variable(("token",), rng.integers(0, 500, n)),
            "position": Variable(("token",), np.arange(n)),
            "modality": Variable(("token",), np.array(["text"] * n)),
            "hidden": Variable(("token", "layer", "dim"), rng.standard_normal((n, 3, 64)).astype(np.float32),
                               coords={"layer": np.arange(3)})}


def write(writer: StoreWriter, samples: range) -> None:
    for i in samples:
        writer.write_samples([("m", "c", f"s{i}", result(i), None, "")])


# a reader in its own process: opens the store, says so, waits for a line on stdin, then reads
# every value and saves them (the parent compares them with what it wrote)
READER = textwrap.dedent("""
    import sys
    import numpy as np
    from workbench.store import open_store
    ds = open_store(sys.argv[1], model="m", index=False)
    print("open", flush=True)
    sys.stdin.readline()
    np.save(sys.argv[2], ds.hidden.values)
    print(len(ds.run_sample), flush=True)
""")


def start_reader(store: Path, out: Path) -> subprocess.Popen:
    reader = subprocess.Popen([sys.executable, "-c", READER, str(store), str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert reader.stdout.readline().strip() == "open"
    return reader


def test_the_runs_end_leaves_about_the_arrays_bytes_on_disk(tmp_path):
    """A commit per sample over small samples: every commit rewrote each array's partial last
    chunk. After the run's end the folder holds at most 1.25x the arrays' bytes, where before it
    held several times that (the superseded versions, which are what is deleted)."""
    store = tmp_path / "s.zarr"
    with StoreWriter(store) as writer:
        writer.ensure_model("m", {"family": "x"})
        write(writer, range(40))
        before = disk_bytes(store)
        writer.finish_run()
        assert writer.compacted["chunks_deleted"] > 0
    arrays = array_bytes(store)
    assert disk_bytes(store) <= 1.25 * arrays < before
    assert len(open_store(store, model="m").run_sample) == 40


def test_a_reader_open_during_the_runs_end_reads_its_snapshot_whole(tmp_path):
    """A reader process opens the store after 10 commits; the writer commits 20 more and ends the
    run (compaction) while the reader holds the store; then the reader reads every value: the 10
    samples it opened, equal to what was written. Its snapshot's chunks were kept; once it has
    exited, the next run's end deletes them."""
    store, out = tmp_path / "s.zarr", tmp_path / "read.npy"
    with StoreWriter(store) as writer:
        writer.ensure_model("m", {"family": "x"})
        write(writer, range(10))
        reader = start_reader(store, out)
        write(writer, range(10, 30))
        writer.finish_run()
        kept = disk_bytes(store)
    stdout, _ = reader.communicate("go\n", timeout=120)
    assert reader.returncode == 0 and stdout.strip() == "10"
    assert np.array_equal(np.load(out), np.concatenate([result(i)["hidden"].data for i in range(10)]))
    assert not list(readers_dir(store).glob("*-*"))  # withdrawn at the reader's exit
    with StoreWriter(store) as writer:
        writer.add_provenance({"spec_name": "second"})  # its tag: run-1
        write(writer, range(30, 31))
        writer.finish_run()
    assert disk_bytes(store) < kept  # the reader's snapshot is no longer kept


def test_a_reader_that_does_not_announce_itself_loses_its_chunks(tmp_path):
    """The control: a session opened on an old snapshot with icechunk alone (no announcement)
    cannot read after the run's end, since its superseded chunks are gone; what protects the
    reader above is its announcement."""
    import icechunk
    import zarr

    store = tmp_path / "s.zarr"
    with StoreWriter(store) as writer:
        writer.ensure_model("m", {"family": "x"})
        write(writer, range(3))
        repo = icechunk.Repository.open(icechunk.local_filesystem_storage(str(store)))
        old = zarr.open_group(repo.readonly_session(branch="main").store, mode="r")["m/c/hidden"]
        write(writer, range(3, 6))
        writer.finish_run()
    with pytest.raises(Exception):
        old[:]


def test_a_dead_readers_announcement_pins_nothing(tmp_path):
    """A reader killed while holding the store leaves its file, but not its lock: the run's end
    removes the file and compacts as if no reader were there."""
    store, out = tmp_path / "s.zarr", tmp_path / "read.npy"
    with StoreWriter(store) as writer:
        writer.ensure_model("m", {"family": "x"})
        write(writer, range(5))
        reader = start_reader(store, out)
        assert len(list(readers_dir(store).glob("*-*"))) == 1
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=60)
        write(writer, range(5, 40))
        writer.finish_run()
    assert not list(readers_dir(store).glob("*-*"))
    assert disk_bytes(store) <= 1.25 * array_bytes(store)
