"""A small run written straight through `StoreWriter` the way the runner writes it (groups,
identity, provenance, labels, per-token and per-run variables), without a model, so that kill
drills and damage tests can run it many times. Deterministic: the same store every time.

    python tests/store_drill.py STORE      # write it, or resume it where it stopped
    python tests/store_drill.py --kill-every FOLDER

`WORKBENCH_KILL_AT=store.write:N` kills it with SIGKILL right after its N-th store write;
`store.commit:N` after its N-th commit. `--kill-every` runs the kill drill: for N = 1, 2, ...
a fresh run into FOLDER/kill-N.zarr is killed after write N, the killed store is copied to
FOLDER/kill-N.killed.zarr (what a reader finds), and a second run resumes it; until a run
finishes without reaching write N. Each run is a fork of this process, which imports but never
touches a store itself (so the forks start clean and fast). Prints one JSON line per N."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from workbench.store import StoreWriter, Variable

MODEL = "drill/model"
CONDITIONS = {"baseline": {}, "alpha=0.5": {"alpha": 0.5}}
SAMPLES = [("drill/000", 70), ("drill/001", 50)]  # (id, tokens): 120 rows span two 64-row chunks
LAYERS = np.arange(3)


def sample_variables(condition: int, sample: int, n: int) -> dict[str, Variable]:
    rng = np.random.default_rng([condition, sample])
    return {
        "position": Variable(("token",), np.arange(n, dtype=np.int64)),
        "modality": Variable(("token",), np.array(["vision"] * (n - 3) + ["boundary", "text", "text"])),
        "token_id": Variable(("token",), rng.integers(0, 100, n)),
        "hidden": Variable(("token", "layer", "dim"), rng.standard_normal((n, 3, 128)).astype(np.float32),
                           {"layer": LAYERS}),
        "logprobs": Variable(("run", "step", "vocab"), rng.standard_normal((1, 1, 32)).astype(np.float32)),
        "nonfinite": Variable(("run",), np.array([0], dtype=np.int64)),
    }


def identity(sweep: dict[str, float]) -> dict:
    return {"sweep": sweep, "data": {"source": "drill"}, "capture": "hidden, logprobs"}


def run(path: str) -> int:
    ids = {sample for sample, _ in SAMPLES}
    with StoreWriter(path) as store:
        for line in store.repairs + store.repair(ids):
            print(f"repaired: {line}")
        store.ensure_model(MODEL, {"family": "drill", "n_layers": 2, "hidden_size": 128, "dtype": "float32",
                                   "device": "cpu"})
        for name, sweep in CONDITIONS.items():
            store.check_condition(MODEL, name, identity(sweep))
        store.add_provenance({"spec_name": "drill"})
        written = 0
        for s, (sample, n) in enumerate(SAMPLES):
            for c, (name, sweep) in enumerate(CONDITIONS.items()):
                if sample in store.committed_inputs(MODEL, name):
                    continue
                store.write_sample(MODEL, name, sample, sample_variables(c, s, n),
                                   {"sweep": sweep, "identity": identity(sweep)}, input_hash=f"input-{s}")
                written += 1
        store.finish_run()
    print(f"wrote {written}")
    return 0


def _forked(path: Path, kill_at: str | None) -> int:
    pid = os.fork()
    if pid == 0:  # the child: one run, killed or not
        if kill_at:
            os.environ["WORKBENCH_KILL_AT"] = kill_at
        else:
            os.environ.pop("WORKBENCH_KILL_AT", None)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                run(str(path))
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def kill_every_write(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        n += 1
        store = folder / f"kill-{n}.zarr"
        killed = _forked(store, f"store.write:{n}")
        if killed == 0:  # the run finished before write n: every write point was drilled
            print(json.dumps({"n": n, "killed": 0}), flush=True)
            return 0
        if store.exists():
            shutil.copytree(store, folder / f"kill-{n}.killed.zarr")
        resumed = _forked(store, None)
        print(json.dumps({"n": n, "killed": killed, "resumed": resumed}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--kill-every":
        sys.exit(kill_every_write(Path(sys.argv[2])))
    sys.exit(run(sys.argv[1]))
