"""`workbench analyze|report --scheduler`: the study's tables computed on a dask.distributed
cluster (a scheduler and two workers on loopback) equal the local scheduler's, and the client
leaves no global dask state behind, whether it connected or not."""

from __future__ import annotations

import contextlib
import io
import shutil

import dask
import pytest

from analyses.synthetic import synthetic_store_once
from workbench.cli import main

distributed = pytest.importorskip("distributed")  # the `cluster` extra (the `test` extra has it)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The synthetic store of the analyses tests (every table has its inputs), written once."""
    shared = synthetic_store_once(tmp_path_factory.getbasetemp() / "analyses-synthetic.zarr", n_samples=3).path
    copy = tmp_path_factory.mktemp("cluster") / "store.zarr"
    shutil.copytree(shared, copy, ignore=shutil.ignore_patterns("_analyses"))
    return copy


@pytest.fixture(scope="module")
def cluster():
    """A scheduler and two single-threaded workers, in this process, talking TCP on 127.0.0.1."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                                  host="127.0.0.1", dashboard_address=None) as running:
        yield running


def executed_on_workers(address: str) -> dict[str, int]:
    with distributed.Client(address, set_as_default=False) as client:
        return client.run(lambda dask_worker: dask_worker.state.executed_count)


def printed(argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


def assert_no_global_client() -> None:
    assert dask.config.get("scheduler", None) is None
    with pytest.raises(ValueError):
        distributed.default_client()


TABLES = ["norm-ratio", "first-update", "alpha", "kv-cosine"]  # norms, residual geometry, attention, logits, K/V


def test_tables_on_the_cluster_equal_the_local_schedulers(store, cluster):
    local = printed(["analyze", str(store), *TABLES, "--force"])
    before = executed_on_workers(cluster.scheduler_address)
    remote = printed(["analyze", str(store), *TABLES, "--force", "--scheduler", cluster.scheduler_address])
    after = executed_on_workers(cluster.scheduler_address)
    assert remote == local and local.count("| model |") >= 2
    assert len(after) == 2 and all(after[w] > before.get(w, 0) for w in after), (before, after)  # both workers ran tasks
    assert_no_global_client()


def test_the_address_from_the_environment(store, cluster, monkeypatch):
    local = printed(["analyze", str(store), "norm-ratio", "--force"])
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", cluster.scheduler_address)
    before = sum(executed_on_workers(cluster.scheduler_address).values())
    assert printed(["analyze", str(store), "norm-ratio", "--force"]) == local
    assert sum(executed_on_workers(cluster.scheduler_address).values()) > before
    assert_no_global_client()


@pytest.mark.slow  # minutes: every figure, twice
def test_report_on_the_cluster_equals_the_local_one(store, cluster, tmp_path):
    def report(out: str, *scheduler: str) -> list[str]:
        printed(["report", str(store), "--force", "--out", str(tmp_path / out), *scheduler])
        lines = (tmp_path / out / "report.md").read_text().splitlines()
        return [line for line in lines if not line.startswith("Generated ")]  # its time

    assert report("remote", "--scheduler", cluster.scheduler_address) == report("local")
    assert sorted(p.name for p in (tmp_path / "remote").glob("*.png")) == sorted(p.name for p in (tmp_path / "local").glob("*.png"))
    assert_no_global_client()


@pytest.mark.slow  # seconds of CPU each: `make test-slow` (CI runs it)
def test_an_unreachable_scheduler_exits_1_and_leaves_nothing_behind(store, capsys):
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        assert main(["analyze", str(store), "norm-ratio", "--scheduler", "tcp://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the dask scheduler at tcp://127.0.0.1:9") and "Traceback" not in err
    assert "hint: start one" in err
    assert_no_global_client()
    assert printed(["analyze", str(store), "norm-ratio"])  # and the local scheduler still computes


@pytest.mark.slow  # ~1.5 min: two worker processes start and import the analyses
def test_tables_on_worker_processes_equal_the_local_schedulers(store):
    """Workers in their own processes: every task, with the store's arrays it reads, is pickled
    to them and opens the store's chunks there, as on a cluster of machines sharing a file system."""
    local = printed(["analyze", str(store), *TABLES, "--force"])
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as running:
        remote = printed(["analyze", str(store), *TABLES, "--force", "--scheduler", running.scheduler_address])
        executed = executed_on_workers(running.scheduler_address)
    assert remote == local and len(executed) == 2 and all(executed.values()), executed
    assert_no_global_client()


READOUT_SPEC = """\
name: readouts
models: [tiny-qwen3vl]
data: {{source: builtin, n: 10}}
conditions: {{baseline: {{}}, blank: {{image: blank}}}}
capture: [{{site: layer, layers: all}}, {{site: embed_lens}}, {{site: logit_lens}}]
store: {{path: {store}}}
"""


@pytest.mark.slow   # ~1 min: one tiny run into a local and an s3 store, three readouts each
def test_probe_and_text_neighbours_read_the_same_from_s3_and_on_the_cluster(s3, cluster, tmp_path):
    """The activation readouts read the store only: a store in object storage, and a dask cluster,
    give the tables a local store gives."""
    import yaml

    import workbench

    tables: dict[str, str] = {}
    for kind, where in (("local", str(tmp_path / "local.zarr")), ("s3", s3(name="readouts"))):
        workbench.run(workbench.Spec.from_dict(yaml.safe_load(READOUT_SPEC.format(store=where))), device="cpu",
                      progress=False)
        argv = ["analyze", where, "probe", "text-neighbours", "--label", "category", "--force"]
        tables[kind] = printed(argv)
        if kind == "local":
            tables["cluster"] = printed([*argv, "--scheduler", cluster.scheduler_address])
    assert "### Linear probes of 'category'" in tables["local"] and "nearest" in tables["local"].lower()
    assert tables["s3"] == tables["local"] == tables["cluster"]
    assert_no_global_client()
