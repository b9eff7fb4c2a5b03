"""The remote backend (workbench.backends.remote) against the loopback NDIF server.

The server (tests/ndif_server.py, sandboxed mode) runs each job in a separate process inside an
import and builtin whitelist like NDIF's, and does not have `workbench` or `analyses`: everything
the workbench runs there must travel by value in the payload and pass the whitelist, as on NDIF. Client models are
meta `TransformersModel`s (no weights); the server's are built from the model key, as NDIF does.

- the same spec run locally and remotely gives identical stores (every intervention kind (a seeded random `add` too), KV swaps
  of keys only / values only / a layer window included, every capture, generate 2) on tiny-llama and tiny-qwen3vl, through the SANDBOXED server (NDIF's module
  and builtin whitelist, keys, version rule: tests/ndif_sandbox.py); nnsight's own
  `remote="local"` path too;
- one job per sample; what the backend relies on in nnsight/cloudpickle (contract tests);
- faults: 5xx retried / persistent, dropped connection (websocket cut, close frame, job lost
  while polling), wrong key, model not served, error inside the trace; each keeps what is stored,
  a rerun resumes, and the API key appears nowhere.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from ndif_server import BAD_KEY_MESSAGE, LoopbackNDIF  # noqa: E402  (before nnsight: see its docstring)

import nnsight  # noqa: E402
import xarray as xr  # noqa: E402
from nnsight import CONFIG  # noqa: E402
from nnsight.intervention.backends.remote import RemoteError  # noqa: E402
from nnsight.modeling.mixins.remotable import Remotable  # noqa: E402

import workbench  # noqa: E402
from workbench.backends import remote as remote_backend  # noqa: E402
from workbench.backends.remote import (  # noqa: E402
    ModelNotServedError,
    RemoteAuthError,
    RemoteConfig,
    RemoteJobError,
    RemoteUnavailableError,
    shipped_by_value,
)
from workbench.cli import main  # noqa: E402
from workbench.models.model import model_info  # noqa: E402
from workbench.models.remote import RemoteModel  # noqa: E402
from workbench.runner import run_spec  # noqa: E402
from workbench.sites import order  # noqa: E402
from workbench.spec import parse_spec  # noqa: E402

from support.remote import KEY, MODELS, assert_same_results, load, ndif_key, sandboxed_server  # noqa: E402

ALL_CAPTURES = ("[{site: layer}, {site: attention}, {site: keys}, {site: values}, {site: logits}, "
                "{site: embed}, {site: final_norm}, {site: keys_pre}, {site: attn_out}, {site: mlp_out}, "
                "{site: logit_lens}]")


def _vector(width: int) -> str:
    return "[" + ", ".join(f"{0.01 * ((i % 7) - 3):.2f}" for i in range(width)) + "]"


def conditions_for(name: str) -> str:
    """Every intervention kind the model supports, sources and a KV swap included."""
    vec = _vector(model_info(name).hidden_size)
    if name == "tiny-llama":
        return f"""
  baseline: {{}}
  scaled: {{interventions: [{{kind: scale, site: embed, positions: [0, 1, 2], factor: 2.0}}]}}
  zero: {{interventions: [{{kind: zero, site: layer, layers: [1], positions: [3]}}]}}
  addvec: {{interventions: [{{kind: add, site: layer, layers: [1, 2], positions: all, vector: {vec}, factor: 0.5}}]}}
  adddir: {{interventions: [{{kind: add, site: layer, layers: [1], positions: all, direction_from: scaled}}]}}
  patch: {{interventions: [{{kind: patch, site: layer, layers: [1], positions: [0, 1, 2], from: scaled}}]}}
  hybrid: {{kv_swap: {{donor: scaled, positions: [0, 1, 2], layers: all}}}}
  keyswin: {{kv_swap: {{donor: scaled, positions: [0, 1, 2], layers: [1], parts: [keys]}}}}
  addrand: {{interventions: [{{kind: add, site: layer, layers: [1], positions: all, direction: random, seed: 3}}]}}"""
    return f"""
  baseline: {{}}
  blank: {{image: blank}}
  none: {{image: none}}
  scale: {{interventions: [{{kind: scale, site: projector, factor: 0.5, positions: vision}}]}}
  zero: {{interventions: [{{kind: zero, site: embed, positions: boundary}}]}}
  normalize: {{interventions: [{{kind: normalize, site: projector}}]}}
  addvec: {{interventions: [{{kind: add, site: layer, layers: [1], positions: text, vector: {vec}, factor: 0.5}}]}}
  adddir: {{interventions: [{{kind: add, site: layer, layers: [1], positions: vision, direction_from: blank}}]}}
  patch: {{interventions: [{{kind: patch, site: layer, layers: [1], positions: vision, from: blank}}]}}
  hybrid: {{kv_swap: {{donor: blank, positions: vision, layers: all}}}}
  valswap: {{kv_swap: {{donor: blank, parts: [values]}}}}
  keyswin: {{kv_swap: {{donor: blank, layers: [1], parts: [keys]}}}}
  addrand: {{interventions: [{{kind: add, site: layer, layers: [1], positions: text, direction: random, seed: 3, norm: 2.0}}]}}"""


def full_spec(name: str, store: Path, n: int) -> str:
    return f"""\
name: remote-{name}
models: [{name}]
data: {{source: builtin, n: {n}}}
conditions:{conditions_for(name)}
capture: {ALL_CAPTURES}
generate: {{max_new_tokens: 2}}
store: {{path: {store}}}
"""


def small_spec(store: Path, n: int = 3, extra: str = "") -> str:
    return f"""\
name: remote-small
models: [tiny-llama]
data: {{source: builtin, n: {n}}}
conditions:
  baseline: {{}}
  scaled: {{interventions: [{{kind: scale, site: layer, layers: [1], positions: all, factor: 0.5}}]}}
capture: [{{site: layer}}]
store: {{path: {store}}}
{extra}"""


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def served(workbench_cache):
    """model name -> the key the sandboxed server deploys it under."""
    return {name: ndif_key(name) for name in MODELS}


@pytest.fixture(scope="module")
def server(served):
    previous = CONFIG.APP.REMOTE_LOGGING
    CONFIG.APP.REMOTE_LOGGING = False
    srv = sandboxed_server()
    yield srv
    srv.stop()
    CONFIG.APP.REMOTE_LOGGING = previous


@pytest.fixture(autouse=True)
def _reset_faults(request):
    if "server" not in request.fixturenames:
        yield
        return
    srv = request.getfixturevalue("server")
    srv.fail_next_requests = srv.drop_next_jobs = srv.fail_next_polls = 0
    srv.reject_key = False
    srv.served = set(srv.models)
    srv.drop_mode = "abort"
    srv.api_key = KEY
    yield


def config(server, **overrides) -> RemoteConfig:
    return RemoteConfig(**{"target": server.url, "api_key": KEY, "backoff_s": 0.01, "max_tries": 4, **overrides})


def run(text: str, remote, logs: list | None = None):
    logs = [] if logs is None else logs
    return run_spec(parse_spec(text), device="cpu", dtype="float32", progress=False, log=logs.append, remote=remote)


def stored_samples(store: Path, model: str = "tiny-llama") -> dict[str, set[str]]:
    ds = workbench.open_store(store, model=model)
    return {c: set(np.unique(ds.run_sample.values[ds.run_condition.values == c])) for c in np.unique(ds.run_condition.values)}


@pytest.fixture
def after_first_job(monkeypatch):
    """after_first_job(action): run `action` once the first remote job of the run has returned,
    so the fault hits a LATER sample while an earlier one is already stored."""

    def arm(action):
        original = remote_backend._submit
        calls = {"n": 0}

        def submit(*args, **kwargs):
            result = original(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] == 1:
                action()
            return result

        monkeypatch.setattr(remote_backend, "_submit", submit)

    return arm


def _files_contain(root: Path, needle: str) -> list[str]:
    data = needle.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and data in p.read_bytes()]


# ---------------------------------------------------------------------------- same results


@pytest.fixture(scope="module")
def local_store(tmp_path_factory, workbench_cache):
    """local_store(name) -> the full spec of `name` (1 sample) run locally, once per module."""
    stores: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in stores:
            stores[name] = tmp_path_factory.mktemp("local") / f"{name}.zarr"
            run(full_spec(name, stores[name], 1), remote=False)
        return stores[name]

    return get


@pytest.mark.parametrize("name", MODELS)
def test_remote_store_is_identical_to_local(server, tmp_path, local_store, name):
    n, local, remote = 1, local_store(name), tmp_path / "remote.zarr"
    before = len(server.requests_seen)
    summary = run(full_spec(name, remote, n), remote=config(server))
    assert summary.written == summary.total and summary.total == n * len(conditions_for(name).strip().splitlines())
    seen = server.requests_seen[before:]
    assert len(seen) == n  # one job per sample, all its conditions
    assert seen[0]["model_key"] == ndif_key(name)  # found under NDIF's key format (repo id + revision)
    assert_same_results(load(local, name), load(remote, name))
    attrs = workbench.open_store(remote, model=name).attrs
    assert attrs["backend"] == "remote" and attrs["remote_target"] == server.url
    assert '"kind": "remote"' in attrs["provenance"]


def test_batched_remote_jobs_equal_batched_local_runs(server, tmp_path):
    """backend.batch_size travels in the plan: the server runs the same batched forwards (inside
    NDIF's sandbox) as a local run, so the stores are the same (`assert_same_results`)."""
    name = "tiny-qwen3vl"
    batched = "\nbackend: {batch_size: 4}\n"
    local, remote = tmp_path / "local.zarr", tmp_path / "remote.zarr"
    run(full_spec(name, local, 1) + batched, remote=False)
    run(full_spec(name, remote, 1) + batched, remote=config(server))
    assert_same_results(load(local, name), load(remote, name))


def test_a_patching_scan_runs_remotely_into_the_same_store_in_one_job_per_sample(server, tmp_path):
    """A scan's runs (residual stream and attn_out, both directions) travel like any condition: one
    NDIF job per sample, batched within it, each donor read once there; the store equals a local run's."""
    name = "tiny-qwen3vl"
    spec = f"""\
name: remote-scan
models: [{name}]
data: {{source: builtin, n: 2}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  trace: {{scan: {{clean: baseline, corrupt: blank, layers: [0, 2], positions: [vision, last], direction: both}}}}
  attn: {{scan: {{clean: baseline, corrupt: blank, site: attn_out, layers: [1], positions: [text]}}}}
capture: [{{site: logits}}]
store: {{path: STORE}}
backend: {{batch_size: 8}}
"""
    local, remote = tmp_path / "local.zarr", tmp_path / "remote.zarr"
    run(spec.replace("STORE", str(local)), remote=False)
    before = len(server.requests_seen)
    summary = run(spec.replace("STORE", str(remote)), remote=config(server))
    assert summary.written == summary.total == 2 * (2 + 8 + 1)
    assert len(server.requests_seen) - before == 2
    assert_same_results(load(local, name), load(remote, name))


def test_samples_per_job_runs_several_samples_in_one_session(server, tmp_path):
    """backend.samples_per_job: 3 runs a sweep's and a scan's conditions of three samples in one
    NDIF job (one session: its body runs each sample as a job of its own would); the first sample
    goes alone, before the store exists (`RemoteExecutor.prepare`). The store equals a local run's."""
    name = "tiny-qwen3vl"
    spec = f"""\
name: remote-session
models: [{name}]
data: {{source: builtin, n: 4}}
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  steer: {{interventions: [{{kind: scale, site: layer, layers: [1], factor: $c}}], sweep: {{c: [0.5, 2.0]}}}}
  trace: {{scan: {{clean: baseline, corrupt: blank, layers: [0, 2], positions: [vision, last]}}}}
capture: [{{site: logits}}]
store: {{path: STORE}}
backend: {{batch_size: 4, samples_per_job: 3}}
"""
    local, remote = tmp_path / "local.zarr", tmp_path / "remote.zarr"
    run(spec.replace("STORE", str(local)), remote=False)
    before = len(server.requests_seen)
    summary = run(spec.replace("STORE", str(remote)), remote=config(server))
    assert summary.written == summary.total == 4 * (2 + 2 + 4)
    # sample 0 alone (before the store exists), samples 1-2 (the rest of the first window), sample 3
    assert len(server.requests_seen) - before == 3
    assert_same_results(load(local, name), load(remote, name))


def test_nnsight_local_simulation_runs_every_intervention_kind(tmp_path, local_store):
    """remote="local": nnsight's own serialize -> deserialize (user modules hidden) path."""
    name = "tiny-qwen3vl"
    local, simulated = local_store(name), tmp_path / "sim.zarr"
    run(full_spec(name, simulated, 1), remote="local")
    xr.testing.assert_identical(load(local, name), load(simulated, name))


def vision_spec(store: Path) -> str:
    return f"""\
name: remote-vision
models: [tiny-qwen3vl]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
  tower: {{interventions: [{{kind: scale, site: vision_layer, layers: [0], factor: 2.0}}]}}
  merger: {{interventions: [{{kind: scale, site: projector.merger, factor: 0.5}}]}}
capture: [{{site: layer}}, {{site: vision}}, {{site: vision_layer}}, {{site: embed_table}}]
store: {{path: {store}}}
"""


def test_vision_sites_and_the_embedding_table_run_remotely_as_locally(server, tmp_path, workbench_cache):
    """The vision-tower rows (their own `vision_patch` dim) and the embedding table's row norms
    (read from the weights where they live) come back from the sandboxed server as a local run
    stores them."""
    local, remote = tmp_path / "local.zarr", tmp_path / "remote.zarr"
    run(vision_spec(local), remote=False)
    run(vision_spec(remote), remote=config(server))
    ours, theirs = load(local, "tiny-qwen3vl"), load(remote, "tiny-qwen3vl")
    assert {"vision", "vision_hidden", "embed_table_norms"} <= set(theirs.data_vars)
    xr.testing.assert_identical(ours.reset_index("vision_patch"), theirs.reset_index("vision_patch"))


def test_a_probe_steered_add_and_the_embedding_lens_run_remotely_as_locally(server, tmp_path, workbench_cache):
    """An `add` along a stored probe travels as its vector (the server has no store, no workbench,
    no analyses), and the `embed_lens` readout is computed where the weights live: the remote
    store equals the local one."""
    from analyses import probe
    from analyses.synthetic import write_probe_store
    from analyses.tables import open_models

    info = model_info("tiny-qwen3vl")
    probed = write_probe_store(tmp_path / "probed.zarr", n_samples=12, n_layers=info.n_layers, dim=info.hidden_size,
                               model_id="tiny-qwen3vl").path
    probe.probe_results(open_models(probed)["tiny-qwen3vl"], "colour")

    def spec(store: Path) -> str:
        return f"""\
name: remote-steer
models: [tiny-qwen3vl]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
  steer: {{interventions: [{{kind: add, site: layer, layers: [1], positions: vision, factor: 4,
            direction: {{probe: {probed}, label: colour, layer: 2, class: red}}}}]}}
capture: [{{site: layer}}, {{site: embed_lens}}]
store: {{path: {store}}}
"""
    local, remote = tmp_path / "local.zarr", tmp_path / "remote.zarr"
    run(spec(local), remote=False)
    run(spec(remote), remote=config(server))
    ours, theirs = load(local, "tiny-qwen3vl"), load(remote, "tiny-qwen3vl")
    assert {"embed_nn_ids", "embed_nn_cos"} <= set(theirs.data_vars)
    xr.testing.assert_identical(ours, theirs)
    condition = np.asarray(theirs["condition"].values).astype(object).astype(str)
    hidden = theirs["hidden"].sel(layer=1).values
    assert not np.allclose(hidden[condition == "steer"], hidden[condition == "baseline"])


SIMULATION_KEEPS_MODULES = """
import sys
from workbench.cli import main
before = dict(sys.modules)
code = main(["run", sys.argv[1], "--models", "tiny-llama", "--remote", "local", "--limit", "2",
             "--store", sys.argv[2], "--no-progress", "--no-table"])
swapped = sorted(name for name, module in before.items() if sys.modules.get(name) is not module)
assert code == 0 and not swapped, (code, swapped[:20])
"""


def test_nnsight_local_simulation_leaves_every_module_in_place(tmp_path):
    """nnsight's remote="local" pops non-installed modules from sys.modules while it deserializes;
    a writer thread importing in that window (icechunk, zarr, ...) got half-built modules, and
    later imports (pytest's own, in CI) got fresh copies. In a fresh interpreter, where the store's
    modules are first imported during the run, the run succeeds and no module object changes."""
    import subprocess
    import sys

    spec = Path(__file__).resolve().parents[1] / "specs" / "depth_norms.yaml"
    done = subprocess.run([sys.executable, "-c", SIMULATION_KEEPS_MODULES, str(spec), str(tmp_path / "s.zarr")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


# ------------------------------------------------------------- what the backend relies on


def test_loopback_hides_workbench_and_by_value_shipping_reaches_it(served, server, monkeypatch):
    """Without by-value registration the server cannot import workbench (so it is really
    hidden); with it the same block runs there."""
    monkeypatch.setattr(CONFIG.API, "APIKEY", KEY)
    client = RemoteModel(model_info("tiny-llama"))
    client.served_key = served["tiny-llama"]
    with pytest.raises(RemoteError, match="No module named 'workbench"):
        with client.lm.session(backend=remote_backend._remote_backend(client, config(server))):
            key = nnsight.save(order("layer", 1, 0))
    backend = remote_backend._remote_backend(client, config(server))
    with shipped_by_value():
        with client.lm.session(backend=backend):
            key = nnsight.save(order("layer", 1, 0))
    assert backend.result["key"] == order("layer", 1, 0)  # computed there by the shipped registry
    import cloudpickle

    assert "workbench" not in cloudpickle.list_registry_pickle_by_value()  # registered per job only


def test_contract_nnsight_pieces_the_backend_uses():
    from nnsight.intervention.backends.remote import RemoteBackend
    from nnsight.schema.request import RequestModel
    from nnsight.tracing.tracer import Tracer

    from workbench.backends.local import run_condition

    assert {"model_key", "host", "api_key", "env", "blocking"} <= set(inspect.signature(RemoteBackend).parameters)
    assert "unpickler" in inspect.signature(RequestModel.deserialize).parameters  # the loopback's hiding
    assert "backend" in inspect.signature(Remotable.session).parameters
    # the tracer drops its backend when pickled: the API key never enters a payload
    assert 'state.pop("backend"' in inspect.getsource(Tracer.__getstate__)
    # nnsight ships functions by source and inspect.getsource follows __wrapped__: run_condition is
    # shipped undecorated (see workbench.backends.remote)
    assert remote_backend._run_condition is getattr(run_condition, "__wrapped__", run_condition)
    assert not hasattr(remote_backend._run_condition, "__wrapped__")


SERVER_SIDE_MODULES = ("backends/ndif_job.py", "backends/local.py", "capture.py", "plan.py", "records.py",
                       # every site module; not the package's __init__, which runs on the client only (it imports
                       # the site modules and derives the spec's lists: none of it travels)
                       *sorted(f"sites/{p.name}" for p in (Path(workbench.__file__).parent / "sites").glob("*.py")
                               if p.name != "__init__.py"),
                       # every intervention kind's module (its runtime class travels)
                       *sorted(f"interventions/{p.name}" for p in (Path(workbench.__file__).parent / "interventions")
                               .glob("*.py")))
# function-level relative imports cannot travel: none is allowed in server-side code
KNOWN_LOCAL_IMPORTS: set[tuple[str, str]] = set()
KNOWN_DECORATED: set[tuple[str, str]] = set()
# model_validator: on a kind's spec model (pydantic), which stays on the client
# typing.overload's stubs are replaced by the undecorated definition that follows them: only that one runs
HARMLESS_DECORATORS = {"property", "staticmethod", "classmethod", "dataclass", "model_validator", "overload"}


def _functions(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def test_contract_code_that_runs_on_the_server_can_travel_by_value():
    """Code the server runs is shipped by source: a function-level relative import has no package
    there, and a functools.wraps decorator ships the wrong globals. New ones must be handled in
    workbench.backends.remote (or avoided)."""
    root = Path(workbench.__file__).parent
    found_imports, found_decorated = set(), set()
    for rel in SERVER_SIDE_MODULES:
        tree = ast.parse((root / rel).read_text())
        for qualname, fn in _functions(tree):
            if any(isinstance(n, ast.ImportFrom) and n.level > 0 for n in ast.walk(fn)):
                found_imports.add((rel, qualname))
            names = {ast.unparse(d).split("(")[0].split(".")[-1] for d in fn.decorator_list}
            if names - HARMLESS_DECORATORS:
                found_decorated.add((rel, qualname))
    assert found_imports <= KNOWN_LOCAL_IMPORTS, found_imports - KNOWN_LOCAL_IMPORTS
    assert found_decorated == KNOWN_DECORATED  # the known one is still there, and handled
    assert found_decorated <= KNOWN_DECORATED, found_decorated - KNOWN_DECORATED


# ---------------------------------------------------------------------------------- faults


@pytest.fixture(scope="module")
def small_reference(tmp_path_factory, workbench_cache):
    """The small spec (3 samples) run locally."""
    store = tmp_path_factory.mktemp("reference") / "s.zarr"
    run(small_spec(store), remote=False)
    return load(store, "tiny-llama")


def test_server_errors_are_retried_then_succeed(server, tmp_path, small_reference):
    logs: list[str] = []
    server.fail_next_requests = 2
    before = len(server.requests_seen)
    summary = run(small_spec(tmp_path / "s.zarr"), remote=config(server), logs=logs)
    assert summary.written == 6
    assert len(server.requests_seen) - before == 3 + 2  # one job per sample, plus the two refused
    xr.testing.assert_identical(small_reference, load(tmp_path / "s.zarr", "tiny-llama"))
    assert sum("retry" in line and "HTTP 503" in line for line in logs) == 2
    assert stored_samples(tmp_path / "s.zarr")["scaled"] == {f"builtin/{c}/00{i}" for i, c in
                                                            enumerate(("counting", "color", "shape"))}


def test_persistent_server_errors_stop_keeping_earlier_samples(server, tmp_path, after_first_job):
    store, logs = tmp_path / "s.zarr", []

    def outage():
        server.fail_next_requests = 100

    after_first_job(outage)
    with pytest.raises(RemoteUnavailableError, match=r"gave up after 3 tries") as info:
        run(small_spec(store), remote=config(server, max_tries=3), logs=logs)
    assert "Service temporarily unavailable" in str(info.value)
    kept = stored_samples(store)
    assert kept["baseline"] == kept["scaled"] == {"builtin/counting/000"}
    server.fail_next_requests = 0
    summary = run(small_spec(store), remote=config(server))
    assert (summary.skipped, summary.written) == (2, 4)


@pytest.mark.parametrize("mode", ["abort", "close", "poll"])
def test_dropped_connection_mid_job_is_retried(server, tmp_path, after_first_job, small_reference, mode):
    store, logs = tmp_path / "s.zarr", []
    blocking = mode != "poll"
    if blocking:
        server.drop_mode = mode
    dropped = len(server.dropped_jobs)

    def drop():
        server.drop_next_jobs = 1
        server.fail_next_polls = 0 if blocking else 2  # failed polls are retried within the job

    after_first_job(drop)
    cfg = config(server, blocking=blocking, poll_interval_s=0.02, lost_after_s=0.5)
    summary = run(small_spec(store), remote=cfg, logs=logs)
    assert summary.written == 6
    assert len(server.dropped_jobs) == dropped + 1
    assert any("retry 2 of 4" in line for line in logs), logs
    xr.testing.assert_identical(small_reference, load(store, "tiny-llama"))


def test_wrong_key_stops_at_once_keeps_samples_and_never_shows_the_key(server, tmp_path, after_first_job, monkeypatch):
    from nnsight.schema.request import RequestModel

    blobs = []
    original = RequestModel.serialize.__func__

    def spy(cls, tracer, compress=False):
        blobs.append(original(cls, tracer, False))
        return original(cls, tracer, compress)

    monkeypatch.setattr(RequestModel, "serialize", classmethod(spy))
    store, logs = tmp_path / "s.zarr", []
    after_first_job(lambda: setattr(server, "reject_key", True))
    before = len(server.requests_seen)
    with pytest.raises(RemoteAuthError) as info:
        run(small_spec(store), remote=config(server), logs=logs)
    message = str(info.value)
    assert "refused the API key" in message and BAD_KEY_MESSAGE in message
    assert len(server.requests_seen) - before == 2  # the refused sample was not retried
    assert stored_samples(store)["scaled"] == {"builtin/counting/000"}
    assert KEY not in message and not any(KEY in line for line in logs)
    assert not any(KEY.encode() in blob for blob in blobs) and blobs
    assert not _files_contain(store, KEY)
    server.reject_key = False
    assert run(small_spec(store), remote=config(server)).written == 4


def test_wrong_key_through_the_cli(server, tmp_path, monkeypatch, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(small_spec(tmp_path / "s.zarr", n=1))
    secret = "wb-not-the-key-5d1e0b"
    monkeypatch.setenv("NDIF_API_KEY", secret)
    monkeypatch.setenv("WORKBENCH_REMOTE_BACKOFF_S", "0.01")
    assert main(["run", str(spec), "--remote", server.url, "--no-progress", "--no-table"]) == 1
    out = capsys.readouterr()
    assert "refused the API key" in out.err and "run the same command again to resume" in out.err
    assert secret not in out.err + out.out
    assert not _files_contain(tmp_path / "s.zarr", secret)


def test_model_not_served_lists_what_is_served(server, served, tmp_path):
    store = tmp_path / "s.zarr"
    run(small_spec(store, n=1), remote=config(server))
    qwen_key = served["tiny-qwen3vl"]
    server.served = {qwen_key}
    before = len(server.requests_seen)
    with pytest.raises(ModelNotServedError) as info:
        run(small_spec(store, n=2), remote=config(server))
    message = str(info.value)
    assert "does not serve this model" in message and "Served models:" in message
    assert model_info("tiny-qwen3vl").path in message and model_info("tiny-llama").path in message
    assert len(server.requests_seen) == before  # refused before anything was submitted
    # the server says so too, when the check is skipped: not retried either
    with pytest.raises(ModelNotServedError, match="is not a scheduled model"):
        run(small_spec(store, n=2), remote=config(server, check_served=False))
    assert len(server.requests_seen) == before + 1
    assert stored_samples(store)["baseline"] == {"builtin/counting/000"}
    server.served = set(server.models)
    summary = run(small_spec(store, n=2), remote=config(server))
    assert (summary.skipped, summary.written) == (2, 2)


def test_error_inside_the_trace_is_not_retried(server, tmp_path, after_first_job, monkeypatch):
    from workbench.interventions.scale import Scale

    def boom(self, x, layer):
        raise ValueError("boom inside the trace")

    store = tmp_path / "s.zarr"
    after_first_job(lambda: monkeypatch.setattr(Scale, "edit", boom))
    before = len(server.requests_seen)
    with pytest.raises(RemoteJobError, match="ValueError: boom inside the trace"):
        run(small_spec(store), remote=config(server))
    assert len(server.requests_seen) - before == 2
    assert stored_samples(store)["scaled"] == {"builtin/counting/000"}


def test_server_down_is_transient_and_bounded(tmp_path):
    down = LoopbackNDIF({}).start()
    url = down.url
    down.stop()
    logs: list[str] = []
    with pytest.raises(RemoteUnavailableError, match="gave up after 2 tries"):
        run(small_spec(tmp_path / "s.zarr", n=1), remote=RemoteConfig(target=url, api_key=KEY, max_tries=2,
                                                                       backoff_s=0.01), logs=logs)
    assert any("retry 2 of 2" in line for line in logs)


# -------------------------------------------------------------------------- selecting remote


def test_spec_backend_kind_remote_and_the_cli_flag(server, tmp_path, monkeypatch):
    monkeypatch.setenv("NDIF_HOST", server.url)
    monkeypatch.setenv("NDIF_API_KEY", KEY)
    store = tmp_path / "s.zarr"
    spec = tmp_path / "spec.yaml"
    spec.write_text(small_spec(store, n=1, extra="backend: {kind: remote}\n"))
    before = len(server.requests_seen)
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    assert len(server.requests_seen) == before + 1
    assert workbench.open_store(store, model="tiny-llama").attrs["backend"] == "remote"
    flagged = tmp_path / "flag.yaml"
    flagged.write_text(small_spec(tmp_path / "f.zarr", n=1))
    assert main(["run", str(flagged), "--remote", "--no-progress", "--no-table"]) == 0
    assert len(server.requests_seen) == before + 2
    with pytest.raises(SystemExit):
        main(["run", "--remote", str(flagged)])  # the spec path is not a URL
