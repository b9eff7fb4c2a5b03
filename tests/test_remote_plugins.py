"""Plugin code on NDIF, through the loopback server in its sandboxed mode (NDIF's import and
builtin whitelist, no workbench and no plugin installed: tests/ndif_sandbox.py): a plugin module
whose imports the whitelist allows is shipped by value with each job, and the stored results
equal a local run's; one importing anything else is refused before any job, naming the import."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from ndif_server import LoopbackNDIF  # noqa: E402,F401  (before nnsight: see its docstring)

from nnsight import CONFIG  # noqa: E402

from workbench import extend, sites  # noqa: E402
from workbench.backends.remote import RemoteConfig, RemoteSetupError  # noqa: E402
from workbench.runner import run_spec  # noqa: E402
from workbench.spec import parse_spec  # noqa: E402

from support.remote import KEY, assert_same_results, load, sandboxed_server  # noqa: E402

PAGE = Path(__file__).resolve().parents[1] / "docs" / "specs.md"
FENCE = re.compile(r"^```python\n(# (?:file|site plugin): (\w+)\.py\n.*?)^```", re.S | re.M)
# the page's plugins: an intervention kind (labplug.clamp) and a site (labsites.mlp_in)
PLUGINS = {m.group(2): m.group(1) for m in FENCE.finditer(PAGE.read_text(encoding="utf-8"))}

SPEC = """\
name: remote-plugins
plugins: [labplug, labsites]
models: [tiny-llama]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
  clamp: {{interventions: [{{kind: clamp, site: layer, layers: [1], limit: 0.02}}]}}
  scaled: {{interventions: [{{kind: scale, site: mlp_in, layers: [1], factor: 3.0}}]}}
capture: [{{site: layer}}, {{site: mlp_in}}, {{site: logits}}]
store: {{path: {store}}}
"""


@pytest.fixture(scope="module")
def server(workbench_cache):
    previous = CONFIG.APP.REMOTE_LOGGING
    CONFIG.APP.REMOTE_LOGGING = False
    srv = sandboxed_server(names=("tiny-llama",))
    yield srv
    srv.stop()
    CONFIG.APP.REMOTE_LOGGING = previous


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """The page's two plugin modules, importable from `tmp_path`; the registries as they were after."""
    assert set(PLUGINS) == {"labplug", "labsites"}
    for name, text in PLUGINS.items():
        (tmp_path / f"{name}.py").write_text(text)
    extend.intervention_kinds()
    monkeypatch.setattr(extend, "_KINDS", dict(extend._KINDS))
    saved_sites, saved_modules = dict(sites.SITES), dict(extend.SITE_MODULES)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sites.SITES.clear()
    sites.SITES.update(saved_sites)
    extend.SITE_MODULES.clear()
    extend.SITE_MODULES.update(saved_modules)
    for name in PLUGINS:
        sys.modules.pop(name, None)


def run(store: Path, remote) -> None:
    run_spec(parse_spec(SPEC.format(store=store)), device="cpu", dtype="float32", progress=False,
             log=lambda _: None, remote=remote)


def config(server) -> RemoteConfig:
    return RemoteConfig(target=server.url, api_key=KEY, backoff_s=0.01, max_tries=2)


def test_whitelisted_plugins_are_shipped_by_value_and_store_what_a_local_run_does(server, plugins):
    local, remote = plugins / "local.zarr", plugins / "remote.zarr"
    run(local, remote=False)
    before = len(server.requests_seen)
    run(remote, remote=config(server))
    assert len(server.requests_seen) == before + 1          # one job: the sample's three conditions
    ours, theirs = load(local, "tiny-llama"), load(remote, "tiny-llama")
    assert {"hidden", "mlp_in", "logprobs"} <= set(theirs.data_vars)
    assert_same_results(ours, theirs)
    import cloudpickle

    assert not {"labplug", "labsites"} & set(cloudpickle.list_registry_pickle_by_value())  # per job only


@pytest.mark.parametrize("plugin", ["labplug", "labsites"])
def test_a_plugin_importing_beyond_the_whitelist_is_refused_before_any_job(server, plugins, plugin):
    text = PLUGINS[plugin]
    (plugins / f"{plugin}.py").write_text(text.replace("\nfrom workbench", "\nimport json\nfrom workbench", 1))
    line = text.split("\nfrom workbench", 1)[0].count("\n") + 2
    before = len(server.requests_seen)
    with pytest.raises(RemoteSetupError) as refused:
        run(plugins / "remote.zarr", remote=config(server))
    message = str(refused.value)
    what = "intervention kind 'clamp'" if plugin == "labplug" else "site 'mlp_in'"
    assert f"{what} comes from plugin module '{plugin}': it imports 'json' ({plugin}.py:{line})" in message, message
    assert len(server.requests_seen) == before and not (plugins / "remote.zarr").exists()
