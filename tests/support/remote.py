"""The loopback NDIF server (tests/ndif_server.py) in its sandboxed mode, serving tiny models under
the keys NDIF deploys them under: the remote backend's tests and the sandbox's share it."""

from __future__ import annotations

import json
from pathlib import Path

from ndif_server import LoopbackNDIF  # before nnsight: see its docstring

import xarray as xr

import workbench
from workbench.models.model import model_info

KEY = "wb-test-key-7f3a91c2"
MODELS = ("tiny-llama", "tiny-qwen3vl")
# attrs of a model group that say where it ran (they differ by design between backends)
BACKEND_ATTRS = {"provenance", "dtype", "device", "device_kind", "backend", "remote_target", "revision"}


def ndif_key(name: str) -> str:
    """The key NDIF deploys a model under (its CLI's key builder: class path, repo id, revision)."""
    info = model_info(name)
    cls = "nnsight.modeling.vlm.VisionLanguageModel" if info.arch.is_multimodal else "nnsight.modeling.language.LanguageModel"
    return f"{cls}:{json.dumps({'repo_id': info.path, 'revision': None})}"


def sandboxed_server(names=MODELS, **kwargs) -> LoopbackNDIF:
    """The loopback server in its sandboxed mode (NDIF's whitelist, keys, version rule; see
    tests/ndif_sandbox.py) serving `names` under NDIF-format keys, started."""
    loaders = {}
    for name in names:
        info = model_info(name)
        processor = ("workbench.models.tiny:load_processor", info.path, info.arch.family) if info.arch.is_multimodal else None
        loaders[ndif_key(name)] = {"path": info.path, "multimodal": info.arch.is_multimodal, "processor": processor}
    return LoopbackNDIF({}, api_key=KEY, hide_modules=("workbench", "analyses"), sandbox=loaders, **kwargs).start()


def load(store: Path, model: str) -> xr.Dataset:
    ds = workbench.open_store(store, model=model).load()
    ds.attrs = {k: v for k, v in ds.attrs.items() if k not in BACKEND_ATTRS}
    return ds.reset_index(["token", "run"])


def assert_same_results(local: xr.Dataset, remote: xr.Dataset) -> None:
    """The same labels, coordinates and attrs exactly, and the same captures within fp32 rounding
    (rtol 1e-5, atol 1e-6): on some CPUs (seen on an AMD EPYC VM) the same forward run in the
    server's thread and in the test's differs in the last bits (~1e-9 in attention weights,
    ~1e-6 in log-probs), as kernels dispatched on another buffer's alignment may."""
    xr.testing.assert_identical(local.drop_vars(list(local.data_vars)), remote.drop_vars(list(remote.data_vars)))
    assert sorted(local.data_vars) == sorted(remote.data_vars)
    xr.testing.assert_allclose(local, remote, rtol=1e-5, atol=1e-6)
