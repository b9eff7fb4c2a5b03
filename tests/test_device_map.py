"""`backend: {device_map: auto}`: the model is loaded through accelerate's dispatch (here every
module lands on the CPU, the one device there is; on a machine with several GPUs it spreads the
layers over them), inputs go where the input embedding is, captures come back to the host, and
the store equals a plain load's."""

from __future__ import annotations

import numpy as np
import pytest

import workbench
from workbench.runner import run_spec
from workbench.spec import parse_spec

pytest.importorskip("accelerate")


def spec(store, device_map: str) -> str:
    return f"""\
name: device-map
models: [tiny-qwen3vl]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
  half: {{interventions: [{{kind: scale, site: projector, positions: vision, factor: 0.5}}]}}
capture: [{{site: layer}}, {{site: keys}}, {{site: logits}}]
generate: {{max_new_tokens: 2}}
backend: {{device: cpu, dtype: float32{device_map}}}
store: {{path: {store}}}
"""


def test_device_map_auto_loads_through_accelerate_and_stores_the_same(tmp_path):
    plain, mapped = tmp_path / "plain.zarr", tmp_path / "mapped.zarr"
    run_spec(parse_spec(spec(plain, "")), progress=False, log=lambda _: None)
    run_spec(parse_spec(spec(mapped, ", device_map: auto")), progress=False, log=lambda _: None)
    a, b = workbench.open_store(plain, model="tiny-qwen3vl"), workbench.open_store(mapped, model="tiny-qwen3vl")
    assert b.attrs["device_map"] == ["cpu"] and "device_map" not in a.attrs  # accelerate placed every module
    for name in a.data_vars:
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


def test_device_map_is_checked_in_the_spec(tmp_path):
    from workbench.spec import SpecError

    with pytest.raises(SpecError, match="device_map"):
        parse_spec(spec(tmp_path / "s.zarr", ", device_map: everywhere"))
