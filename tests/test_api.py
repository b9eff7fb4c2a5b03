"""The workbench from Python (workbench/api.py): `workbench.run` takes a path, a dict or a Spec,
runs with the CLI's semantics (resume, errors before any write, interrupts) and returns the store
opened; `workbench.Spec.from_dict` locates a dict's problems by field path as YAML's are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

import workbench
from workbench.errors import BadInputError
from workbench.spec import SpecError, parse_spec

REPO = Path(__file__).resolve().parents[1]


def tiny(store: Path, n: int = 2, **extra) -> dict:
    return {"name": "api", "models": ["tiny-llama"], "data": {"source": "builtin", "n": n},
            "conditions": {"baseline": {}, "alpha": {"sweep": {"alpha": [0.5, 2.0]},
                                                       "interventions": [{"kind": "scale", "site": "embed",
                                                                          "factor": "$alpha"}]}},
            "capture": [{"site": "layer", "layers": [0, 1]}], "store": {"path": str(store)}, **extra}


def test_run_from_a_dict_returns_the_store_opened_and_a_rerun_resumes(tmp_path):
    store = tmp_path / "s.zarr"
    ds = workbench.run(tiny(store), progress=False)
    assert isinstance(ds, xr.Dataset)
    direct = workbench.open_store(store, "tiny-llama")
    np.testing.assert_array_equal(ds.hidden.values, direct.hidden.values)
    assert ds.sizes["run"] == 2 * 3 and sorted(set(ds.run_condition.values)) == ["alpha[alpha=0.5]", "alpha[alpha=2.0]", "baseline"]
    provenance = yaml.safe_load(__import__("json").loads(ds.attrs["provenance"])[-1]["spec"])
    assert provenance["conditions"]["alpha"]["sweep"] == {"alpha": [0.5, 2.0]}  # the dict, recorded as YAML
    again = workbench.run(tiny(store), progress=False)  # everything stored: nothing is written twice
    assert again.sizes == ds.sizes
    np.testing.assert_array_equal(again.hidden.values, ds.hidden.values)


def test_run_takes_a_path_and_a_spec_and_the_cli_overrides(tmp_path):
    path = tmp_path / "api.yaml"
    path.write_text(yaml.safe_dump(tiny(tmp_path / "file.zarr", n=3)))
    ds = workbench.run(path, limit=1, store_path=tmp_path / "limited.zarr", progress=False)
    assert set(ds.run_sample.values) == {"builtin/counting/000"} and (tmp_path / "limited.zarr").exists()
    assert not (tmp_path / "file.zarr").exists()
    spec = workbench.Spec.from_dict(tiny(tmp_path / "spec.zarr", n=1))
    tree = workbench.run(spec, models="tiny-llama,tiny-smolvlm", progress=False)  # two models: a DataTree
    assert sorted(tree.children) == sorted(workbench.open_store(tmp_path / "spec.zarr").children)
    assert len(tree.children) == 2
    one = workbench.run(spec, models="tiny-llama,tiny-smolvlm", model="tiny-smolvlm", progress=False)
    assert one.attrs["model_id"] == "tiny-smolvlm"


def test_a_bad_dict_names_the_field_and_writes_nothing(tmp_path):
    data = tiny(tmp_path / "bad.zarr")
    data["conditions"]["alpha"]["interventions"][0]["site"] = "embedd"
    data["data"]["n"] = "two"
    with pytest.raises(SpecError) as raised:
        workbench.run(data)
    # the same problems, with the same messages, as the YAML text of the same data gives
    with pytest.raises(SpecError) as from_yaml:
        parse_spec(yaml.safe_dump(data), source="api.yaml")
    assert [(p.field, p.message) for p in raised.value.problems] == \
        [(p.field, p.message) for p in from_yaml.value.problems]
    assert {p.field for p in raised.value.problems} == {"conditions.alpha.interventions[0].site", "data.n"}
    text = str(raised.value)
    assert "<dict>: conditions.alpha.interventions[0].site: got 'embedd'" in text and "did you mean 'embed'" in text
    assert "<dict>: data.n: got 'two' (str); expected an integer" in text
    assert not (tmp_path / "bad.zarr").exists()
    assert data["data"]["n"] == "two" and "limits" not in data  # the caller's dict is left as given


def test_spec_from_dict_refuses_what_is_not_a_mapping_and_bad_overrides_name_the_option(tmp_path):
    with pytest.raises(SpecError, match=r"<dict>: \(document\): got a list; expected a mapping with fields name"):
        workbench.Spec.from_dict([1, 2])
    with pytest.raises(BadInputError, match="expected a path to a YAML spec, a dict or a workbench.Spec"):
        workbench.run(42)
    with pytest.raises(SpecError, match=r"--limit: got 0 \(int\); expected an integer >= 1"):
        workbench.run(tiny(tmp_path / "s.zarr"), limit=0)
    with pytest.raises(BadInputError, match="model: got 'tiny-qwen3vl'; expected one of the spec's models: tiny-llama"):
        workbench.run(tiny(tmp_path / "s.zarr"), model="tiny-qwen3vl")
    assert not (tmp_path / "s.zarr").exists()
    spec = workbench.Spec.from_dict(tiny(tmp_path / "s.zarr"))
    assert spec.source == "<dict>" and spec.models == ["tiny-llama"]  # tuples read as lists too:
    assert workbench.Spec.from_dict({**tiny(tmp_path / "s.zarr"), "models": ("tiny-llama",)}).models == ["tiny-llama"]


@pytest.mark.signals
def test_an_interrupt_raises_interrupted_with_what_is_stored_and_the_rerun_resumes(tmp_path):
    """A notebook's interrupt is SIGINT in the kernel: the run stops between samples and raises
    `Interrupted` ("interrupted: 2 of 4 stored"); the same call resumes."""
    spec = tmp_path / "four.yaml"
    data = tiny(tmp_path / "four.zarr", n=4)
    data["conditions"] = {"baseline": {}}
    spec.write_text(yaml.safe_dump(data))
    script = ("import workbench\nfrom workbench.errors import Interrupted\ntry:\n"
              f"    workbench.run({str(spec)!r}, progress=False)\n"
              "except Interrupted as err:\n    print('raised', type(err).__name__, err)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "WORKBENCH_SIGNAL_AT": "SIGINT:2"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "raised Interrupted interrupted: 2 of 4 stored; rerun to resume"
    assert workbench.open_store(tmp_path / "four.zarr", "tiny-llama").sizes["run"] == 2
    ds = workbench.run(spec, progress=False)
    assert ds.sizes["run"] == 4
