"""The remote backend against the SANDBOXED loopback server: NDIF's rules, enforced.

The server (tests/ndif_server.py with `sandbox=`) runs each job in a separate process inside an
import and builtin whitelist like NDIF's Protector (tests/ndif_sandbox.py), builds its models
from NDIF-format keys (`nnsight.modeling.language.LanguageModel:{"repo_id", "revision"}`) with
the deployment's own attention implementation, ignores per-request env, checks the client's
Python and nnsight versions as NDIF does and enforces a job timeout. `workbench` is not
installed there: everything the workbench runs travels by value and must pass the whitelist.
The same server (`support.remote.sandboxed_server`) runs tests/test_remote.py: every intervention
and capture kind bitwise equal to a local run, and the fault drills.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import ndif_server  # noqa: E402,F401  (before nnsight: see its docstring)

import nnsight  # noqa: E402
import xarray as xr  # noqa: E402
from nnsight import CONFIG  # noqa: E402
from nnsight.intervention.backends.remote import RemoteError  # noqa: E402

import workbench  # noqa: E402
from workbench.backends import remote as remote_backend  # noqa: E402
from workbench.backends import remote_checks  # noqa: E402
from workbench.backends.remote import (  # noqa: E402
    RemoteAuthError,
    RemoteConfig,
    RemoteRunError,
    RemoteSetupError,
)
from workbench.cli import main  # noqa: E402
from workbench.models.model import model_info  # noqa: E402
from workbench.models.remote import RemoteModel  # noqa: E402
from workbench.runner import run_spec  # noqa: E402
from workbench.spec import parse_spec  # noqa: E402

from support.remote import BACKEND_ATTRS, KEY, ndif_key, sandboxed_server  # noqa: E402

SERVER_SIDE_MODULES = ("backends/ndif_job.py", "backends/local.py", "capture.py", "interventions/base.py",
                       # every site module; not the package's __init__, which runs on the client only (it imports
                       # the site modules and derives the spec's lists: none of it travels)
                       *sorted(f"sites/{p.name}" for p in (Path(workbench.__file__).parent / "sites").glob("*.py")
                               if p.name != "__init__.py"),
                       "plan.py", "records.py",
                       # the registry and every family file; their client-only tiny_<family>.py never travel
                       *sorted(f"models/architectures/{p.name}" for p in (Path(workbench.__file__).parent / "models"
                               / "architectures").glob("*.py") if not p.name.startswith("tiny_")))
WHITELIST_TOPS = {"torch", "numpy", "nnsight", "typing", "collections", "math", "time", "enum", "operator",
                  "__future__", "warnings"}


@pytest.fixture(scope="module")
def sandboxed(workbench_cache):
    previous = CONFIG.APP.REMOTE_LOGGING
    CONFIG.APP.REMOTE_LOGGING = False
    srv = sandboxed_server()
    yield srv
    srv.stop()
    CONFIG.APP.REMOTE_LOGGING = previous


@pytest.fixture(autouse=True)
def _fresh(request, monkeypatch):
    remote_checks._CHECKED.clear()
    monkeypatch.delenv("NDIF_API_KEY", raising=False)
    monkeypatch.setattr(CONFIG.API, "APIKEY", None)
    if "sandboxed" in request.fixturenames:
        srv = request.getfixturevalue("sandboxed")
        srv.python_version = sys.version.split()[0]
        srv.job_timeout_s = 3600.0
        srv.forbid_next_requests = 0
    yield
    remote_checks._CHECKED.clear()


def cfg(server, **overrides) -> RemoteConfig:
    return RemoteConfig(**{"target": server.url, "api_key": KEY, "backoff_s": 0.01, "max_tries": 2, **overrides})


def simple_spec(store: Path, captures: str = "[{site: layer}]") -> str:
    return (f"name: sandbox-simple\nmodels: [tiny-llama]\ndata: {{source: builtin, n: 1}}\n"
            f"conditions:\n  baseline: {{}}\ncapture: {captures}\nstore: {{path: {store}}}\n")


def run(text: str, remote, logs: list | None = None):
    logs = [] if logs is None else logs
    return run_spec(parse_spec(text), device="cpu", dtype="float32", progress=False, log=logs.append, remote=remote)


def load(store: Path, model: str) -> xr.Dataset:
    ds = workbench.open_store(store, model=model).load()
    ds.attrs = {k: v for k, v in ds.attrs.items() if k not in BACKEND_ATTRS}
    return ds.reset_index(["token", "run"])


# ------------------------------------------------------------------- same results, sandboxed
# (every intervention and capture kind: tests/test_remote.py::test_remote_store_is_identical_to_local,
# against the same sandboxed server)


def test_depth_norms_spec_on_tiny_llama_through_the_sandbox(sandboxed, tmp_path):
    text = (Path(workbench.__file__).parents[1] / "specs" / "depth_norms.yaml").read_text()
    text = text.replace("models: [meta-llama/Llama-3.1-8B]", "models: [tiny-llama]")
    text = text.replace("data: {source: builtin, n: 16}", "data: {source: builtin, n: 2}")
    text = text.replace("store: {path: stores/depth_norms.zarr}", f"store: {{path: {tmp_path / 'd.zarr'}}}")
    assert "models: [tiny-llama]" in text and "n: 2}" in text and "backend: {kind: remote}" in text
    local_text = text.replace(str(tmp_path / "d.zarr"), str(tmp_path / "l.zarr"))
    run(local_text, remote=False)
    summary = run(text, remote=cfg(sandboxed))
    assert summary.written == 2
    xr.testing.assert_identical(load(tmp_path / "l.zarr", "tiny-llama"), load(tmp_path / "d.zarr", "tiny-llama"))


# ------------------------------------------------------------------------------ contracts


def test_sandbox_refuses_imports_outside_the_whitelist(sandboxed, monkeypatch):
    """The fixture itself: an import in the request, a class pickled by reference from a module
    outside the whitelist (what a dataclass brings) and a deleted builtin (`open`) are refused;
    a whitelisted import runs."""
    import dataclasses

    monkeypatch.setattr(CONFIG.API, "APIKEY", KEY)
    client = RemoteModel(model_info("tiny-llama"))
    client.served_key = ndif_key("tiny-llama")
    with pytest.raises(RemoteError, match="Module re is not whitelisted"):
        with client.lm.session(backend=remote_backend._remote_backend(client, cfg(sandboxed))):
            import re  # noqa: F401

            out = nnsight.save(1)
    field = dataclasses.field(default=1)
    with pytest.raises(RemoteError, match="Module dataclasses is not whitelisted"):
        with client.lm.session(backend=remote_backend._remote_backend(client, cfg(sandboxed))):
            out = nnsight.save(repr(field))
    with pytest.raises(RemoteError, match="name 'open' is not defined"):  # builtins outside the whitelist
        with client.lm.session(backend=remote_backend._remote_backend(client, cfg(sandboxed))):
            out = nnsight.save(open("/etc/hostname").read())
    backend = remote_backend._remote_backend(client, cfg(sandboxed))
    with client.lm.session(backend=backend):
        import math

        out = nnsight.save(math.sqrt(16.0))
    assert backend.result["out"] == 4.0


def test_server_side_modules_import_only_whitelisted_modules():
    """Static half of the contract: every module whose code travels imports only modules NDIF
    allows (or workbench modules that obey the same rule)."""
    import ast

    root = Path(workbench.__file__).parent
    for rel in SERVER_SIDE_MODULES:
        tree = ast.parse((root / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in WHITELIST_TOPS, (rel, name)


def test_intervention_kinds_ship_only_whitelisted_code():
    """An intervention kind's module also declares its spec fields (pydantic, client side); what
    travels is its runtime class: every global its methods name must be a whitelisted module, or
    a function or class of one, or of workbench (whose modules obey the same rule)."""
    import inspect

    from workbench.extend import intervention_kinds

    def allowed(module: str) -> bool:
        return module.split(".")[0] in WHITELIST_TOPS | {"workbench", "builtins"}

    for name, kind in intervention_kinds().items():
        for cls in kind.runtime.__mro__:
            if cls.__module__ == "builtins":
                continue
            for attribute, member in vars(cls).items():
                function = getattr(member, "__func__", member)
                if not inspect.isfunction(function):
                    continue
                for used, value in inspect.getclosurevars(function).globals.items():
                    module = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
                    assert module is None or allowed(module), (name, cls.__name__, attribute, used, module)


def test_a_different_python_is_refused_with_the_workbench_message(sandboxed, tmp_path):
    """The server says 3.12 (as NDIF): the workbench refuses before submitting or creating the
    store, naming both versions; the server itself refuses such a client with HTTP 400."""
    import httpx

    sandboxed.python_version = "3.12.3" if not sys.version.startswith("3.12") else "3.11.9"
    store = tmp_path / "s.zarr"
    before = len(sandboxed.requests_seen)
    with pytest.raises(RemoteSetupError) as info:
        run(simple_spec(store), remote=cfg(sandboxed))
    message = str(info.value)
    assert f"Python {sandboxed.python_version}" in message and f"Python {sys.version.split()[0]}" in message
    assert info.value.exit_code == 2 and "Python 3.1" in info.value.hint
    assert not store.exists() and len(sandboxed.requests_seen) == before
    answer = httpx.post(f"{sandboxed.url}/request", headers={"ndif-api-key": KEY, "nnsight-version": "0.8.1",
                                                            "python-version": sys.version},
                        files={"blob": b"x"}, data={"data": json.dumps({"model_key": ndif_key("tiny-llama")})})
    assert answer.status_code == 400 and "does not match server version" in answer.json()["detail"]
    # a server without /env: the workbench learns it from the server's own refusal, and says so
    remote_checks._CHECKED[sandboxed.url] = {}
    with pytest.raises(RemoteSetupError, match=r"refused this client's versions \(Python 3\.11") as info:
        run(simple_spec(store), remote=cfg(sandboxed))
    assert "does not match server version" in str(info.value) and info.value.exit_code == 2
    assert not store.exists()


def test_version_check_rules():
    logs: list[str] = []
    check = remote_backend.check_versions
    check({"python_version": "3.11.2 (main)", "packages": {"nnsight": "0.9.0"}}, "srv", "3.11.7", "0.8.1", logs.append)
    assert logs == ["note: srv runs nnsight 0.9.0, this client nnsight 0.8.1"]  # reported, not refused
    check({"python_version": "", "packages": {}}, "srv", "3.11.7", "0.8.1", logs.append)  # says nothing: no check
    with pytest.raises(RemoteSetupError, match=r"srv runs Python 3\.12\.1, this client Python 3\.11\.7"):
        check({"python_version": "3.12.1"}, "srv", "3.11.7", "0.8.1", logs.append)


def test_model_served_under_ndif_key_is_found_by_repo_and_revision(sandboxed):
    client = RemoteModel(model_info("tiny-llama"))
    assert client.model_key.startswith("nnsight.modeling.transformers.TransformersModel:")  # nnsight 0.8.1's own
    deployments = remote_backend.served_models(cfg(sandboxed))
    assert client.model_key not in {d["model_key"] for d in deployments.values()}  # no exact string match
    assert remote_backend.served_key(client, cfg(sandboxed)) == ndif_key("tiny-llama")
    other = {"d": {**next(iter(deployments.values())), "revision": "abc123"}}
    assert remote_backend.find_deployment(client.model_key, {"d": {**other["d"], "repo_id": "x/y"}}) is None
    assert remote_backend.find_deployment(client.model_key, other) is None  # another revision
    entry = next(iter(deployments.values()))
    two = {"a": {**entry, "task": "text-classification", "model_key": entry["model_key"] + " "},
           "b": {**entry, "task": "text-generation"}}
    assert remote_backend.find_deployment(client.model_key, two)["task"] == "text-generation"


def test_attention_without_a_per_request_env(sandboxed, tmp_path):
    """Measured: the sandbox (like NDIF) applies no per-request attn_implementation, so its sdpa
    deployment returns no probabilities even when the client asks for eager. The workbench
    computes them from the attention call's q and k instead: through the sandbox they match an
    independent eager forward of plain transformers."""
    import transformers

    from workbench.data import load_samples

    client = RemoteModel(model_info("tiny-llama"), attn="eager")  # asks for eager in its env
    client.served_key = ndif_key("tiny-llama")
    backend, lm = remote_backend._remote_backend(client, cfg(sandboxed)), client.lm
    with lm.session(backend=backend):
        with lm.trace("The tower is"):
            probs = nnsight.save(lm.model.layers[0].self_attn.output[1])
    assert backend.result["probs"] is None

    store = tmp_path / "s.zarr"
    text = simple_spec(store, captures="[{site: attention}, {site: logits}]")
    run(text, remote=cfg(sandboxed))
    ds = workbench.open_store(store, model="tiny-llama").load()
    sample = load_samples(parse_spec(text).data)[0]
    encoding = client.encode(sample.image, sample.question).encoding
    eager = transformers.AutoModelForCausalLM.from_pretrained(model_info("tiny-llama").path, attn_implementation="eager")
    with torch.inference_mode():
        reference = eager(**encoding, output_attentions=True).attentions
    rows = ds.decode_attention.values  # (token, step, decoder_layer, head); step 0 = the last prompt row
    for l, attention in enumerate(reference):
        np.testing.assert_allclose(rows[:, 0, l], attention[0][:, -1, :].T.numpy(), atol=1e-6)
    assert np.allclose(rows[:, 0].sum(0), 1.0, atol=1e-5)


@pytest.mark.parametrize("form", ["none", "padding", "bool", "additive"])
def test_attention_probabilities_against_torch_sdpa(form):
    """probabilities @ values equals torch's own scaled_dot_product_attention for every mask form
    an attention call can get (GQA: 4 query heads on 2 key/value heads; queries = the last 5 keys)."""
    import torch.nn.functional as F

    from workbench.capture import attention_probabilities

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 8, generator=gen) for h, n in ((4, 5), (2, 9), (2, 9)))
    causal = torch.ones(5, 9, dtype=torch.bool).tril(4)
    keep = torch.ones(1, 9, dtype=torch.long)
    keep[0, 1] = 0  # a padded key
    allowed = causal & keep[:, None, None, :].bool() if form != "none" else causal[None, None]
    mask = {"none": None, "padding": keep, "bool": allowed,
            "additive": torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)}[form]
    module = torch.nn.Module()
    probs = attention_probabilities((module, q, k, v, mask), {"scaling": 8 ** -0.5})
    k_rep, v_rep = (t.repeat_interleave(2, dim=1) for t in (k, v))
    expected = F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=allowed)
    torch.testing.assert_close(probs @ v_rep, expected, atol=1e-6, rtol=1e-5)
    assert torch.all(probs[~allowed.expand_as(probs)] == 0)


# ------------------------------------------------------------------------------ fail fast


def test_missing_key_fails_before_any_connection(tmp_path, capsys):
    store = tmp_path / "s.zarr"
    spec = tmp_path / "spec.yaml"
    spec.write_text(simple_spec(store))
    # port 9 (discard) on loopback: nothing listens; a connection attempt would be a different error
    assert main(["run", str(spec), "--remote", "http://127.0.0.1:9", "--no-progress", "--no-table"]) == 2
    err = capsys.readouterr().err
    assert "no NDIF API key" in err and "NDIF_API_KEY" in err
    assert not store.exists()


def test_remote_settings_from_the_environment(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("WORKBENCH_REMOTE_TRIES", "3")
    monkeypatch.setenv("WORKBENCH_REMOTE_POLL", "1")
    monkeypatch.setenv("WORKBENCH_REMOTE_BACKOFF_S", "")  # empty = default
    config = RemoteConfig.from_env("http://127.0.0.1:9")
    assert (config.max_tries, config.blocking, config.backoff_s) == (3, False, RemoteConfig.backoff_s)
    monkeypatch.setenv("WORKBENCH_REMOTE_TRIES", "0")
    spec = tmp_path / "spec.yaml"
    spec.write_text(simple_spec(tmp_path / "s.zarr"))
    assert main(["run", str(spec), "--remote", "http://127.0.0.1:9", "--no-progress", "--no-table"]) == 2
    err = capsys.readouterr().err
    assert "WORKBENCH_REMOTE_TRIES='0'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s.zarr").exists()


def test_dns_failure_is_permanent_and_leaves_nothing(tmp_path):
    store = tmp_path / "s.zarr"
    logs: list[str] = []
    with pytest.raises(RemoteRunError, match="cannot resolve the server's host name"):
        run(simple_spec(store),
            remote=RemoteConfig(target="http://ndif.invalid", api_key=KEY, max_tries=5, backoff_s=5), logs=logs)
    assert not any("retry" in line for line in logs) and not store.exists()


@pytest.mark.parametrize("body, kind, text", [
    ("Missing or invalid API key. Please visit https://login.ndif.us/", RemoteAuthError, "refused the API key"),
    ("Forbidden: request quota exceeded for this network", RemoteRunError, "refused the request (HTTP 403)"),
])
def test_403_is_classified_by_its_body(sandboxed, tmp_path, body, kind, text):
    sandboxed.forbid_next_requests, sandboxed.forbid_body = 1, body
    with pytest.raises(kind, match=r"HTTP 403") as info:
        run(simple_spec(tmp_path / "s.zarr"), remote=cfg(sandboxed))
    assert text in str(info.value) and type(info.value) is kind
    assert not (tmp_path / "s.zarr").exists()  # refused at the first job: nothing on disk


def test_ndif_status_lists_what_is_served(sandboxed, capsys, monkeypatch):
    monkeypatch.setenv("NDIF_HOST", sandboxed.url)
    assert main(["ndif", "status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("2 deployed model(s)")
    assert out[1].split() == ["model", "revision", "task", "level", "state", "class"]
    rows = [line.split() for line in out[2:]]
    assert {r[0] for r in rows} == {model_info("tiny-llama").path, model_info("tiny-qwen3vl").path}
    assert {r[-1] for r in rows} == {"LanguageModel", "VisionLanguageModel"} and all(r[4] == "RUNNING" for r in rows)


def test_job_timeout_ends_the_job(sandboxed, monkeypatch):
    """Last: the timeout kills the executor process (a fresh one serves later jobs)."""
    monkeypatch.setattr(CONFIG.API, "APIKEY", KEY)
    sandboxed.job_timeout_s = 1.0
    client = RemoteModel(model_info("tiny-llama"))
    client.served_key = ndif_key("tiny-llama")
    with pytest.raises(RemoteError, match="Job took longer than timeout: 1 seconds"):
        with client.lm.session(backend=remote_backend._remote_backend(client, cfg(sandboxed))):
            import time

            time.sleep(30)
            out = nnsight.save(1)
