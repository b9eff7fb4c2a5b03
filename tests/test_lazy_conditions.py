"""A spec's conditions are expanded when taken: the sweep is held, never its product, from
validation through the plan, the resume check and the first run."""

from __future__ import annotations

import itertools
import tracemalloc
from pathlib import Path

import pytest
import xarray as xr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench
from workbench.spec import SpecError, parse_spec

HEAD = "name: lazy\nmodels: [tiny-llama]\ncapture: [{site: layer, layers: [1]}]\n"


def spec_text(store: Path, conditions: str, data: str = "data: {source: builtin, n: 2}\n") -> str:
    return f"{HEAD}{data}conditions:\n{conditions}store: {{path: {store}}}\n"


def swept(name: str, sweep: dict[str, list[float]], factor: str | None = None) -> str:
    values = ", ".join(f"{var}: [{', '.join(map(str, vals))}]" for var, vals in sweep.items())
    edit = f"    interventions: [{{kind: scale, site: embed, factor: ${factor}}}]\n" if factor else ""
    return f"  {name}:\n    sweep: {{{values}}}\n{edit}"


# ------------------------------------------------------------------ the same runs, in the same order

sweeps = st.dictionaries(
    st.sampled_from(["a", "b", "c", "d"]),
    st.lists(st.integers(-50, 50), min_size=1, max_size=4, unique=True),
    min_size=1, max_size=3,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sweep=sweeps, before=st.booleans(), zipped=st.integers(1, 3))
def test_expansion_is_the_product_of_the_sweep_values(tmp_path, sweep, before, zipped):
    # a zip group of `zipped` variables (one length) is one factor of the product
    group = {f"z{k}": [v * 10 + k for v in range(2)] for k in range(zipped)}
    body = swept("s", sweep, factor=next(iter(sweep))).replace(
        "}\n", ", zip: {" + ", ".join(f"{var}: {vals}" for var, vals in group.items()) + "}}\n", 1)
    body = ("  baseline: {}\n" + body) if before else (body + "  baseline: {}\n")
    space = parse_spec(spec_text(tmp_path / "s.zarr", body)).expand_conditions()

    variables = list(sweep)
    pairs = [dict(zip(group, values)) for values in zip(*group.values())]
    expected = [{**dict(zip(variables, values)), **pair}
                for values in itertools.product(*sweep.values()) for pair in pairs]
    expected_names = ["s[" + ",".join(f"{v}={x}" for v, x in a.items()) + "]" for a in expected]
    runs = [{}] + expected if before else expected + [{}]
    names = ["baseline"] + expected_names if before else expected_names + ["baseline"]

    assert len(space) == len(runs)
    assert [i.sweep for i in space] == runs
    assert [i.name for i in space] == list(space.names()) == names
    assert [space[k].name for k in range(len(space))] == names  # indexing agrees with iteration
    assert space[-1].name == names[-1] and [i.name for i in space[1:3]] == names[1:3]
    for instance in space:  # "$var" substituted by the run's own value
        if instance.sweep:
            assert instance.interventions[0].factor == instance.sweep[variables[0]]
    with pytest.raises(IndexError):
        space[len(space)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conditions=st.lists(st.dictionaries(st.sampled_from(["x", "y"]),
                                           st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
                                           max_size=2), min_size=1, max_size=4))
def test_run_names_are_unique_and_name_their_condition(tmp_path, conditions):
    """Sweeps over the same variables and values in several conditions never clash: each run is
    named after its condition, then its values."""
    named = {f"c{i}": sweep for i, sweep in enumerate(conditions)}
    body = "".join(swept(name, sweep) if sweep else f"  {name}: {{}}\n" for name, sweep in named.items())
    space = parse_spec(spec_text(tmp_path / "s.zarr", body)).expand_conditions()
    expected = [f"{base}[" + ",".join(f"{v}={x}" for v, x in zip(sweep, values)) + "]" if sweep else base
                for base, sweep in named.items() for values in itertools.product(*sweep.values())]
    assert list(space.names()) == expected and len(set(expected)) == len(expected)


# ------------------------------------------------------------------ memory does not grow with the count


def first_run_peak(tmp_path: Path, count: int) -> int:
    """tracemalloc peak from the spec's text to its first run: validation, every model's plan,
    the resume check against a store, the first (plan, sample, condition) taken."""
    from workbench.resume import resume_state
    from workbench.runner import compile_all
    from workbench.store import StoreWriter
    from workbench.worklist import SampleStream, survey

    text = spec_text(tmp_path / f"s{count}.zarr", "  baseline: {}\n" + swept("grid", {
        "alpha": list(range(count // 100)), "beta": list(range(100))}, factor="alpha"))
    compile_all(parse_spec(text))  # the model's config read once, outside the measurement
    with StoreWriter(tmp_path / f"s{count}.zarr") as store:
        tracemalloc.start()
        try:
            spec = parse_spec(text)
            plans = compile_all(spec)
            samples = SampleStream(spec.data)
            state = resume_state(store, spec, plans, survey(samples))
            plan, sample, condition = next(state.pending(plans, samples))
            assert (sample.id, condition.name) == ("builtin/counting/000", "baseline")
            assert len(plan.conditions) == count + 1
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
def test_a_sweep_of_50000_conditions_starts_without_holding_them(tmp_path, workbench_cache):
    small, large = first_run_peak(tmp_path, 500), first_run_peak(tmp_path, 50_000)
    # 100x the conditions: the spec's values and their line numbers grow (600 values against
    # 105), the expanded runs are never held
    assert large < 10 * small, (small, large)
    spec = parse_spec(spec_text(tmp_path / "x.zarr", swept("grid", {"alpha": list(range(50)), "beta": list(range(100))},
                                                               factor="alpha")))
    tracemalloc.start()
    try:
        held = list(spec.expand_conditions())  # what holding 5,000 of them costs
        expanded_5000 = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(held) == 5000 and large < expanded_5000, (large, expanded_5000)


# ------------------------------------------------------------------ an interrupted sweep resumes


@pytest.mark.slow  # minutes of CPU: `make test-slow` (CI runs it)
def test_an_interrupted_sweep_resumes_to_the_same_store(tmp_path, workbench_cache):
    """A run stopped by SIGKILL after its 3rd commit resumes, generating the sweep's names again
    for the resume check, to a store equal to the uninterrupted run's."""
    import os
    import subprocess
    import sys

    from workbench.cli import main
    from workbench.store import store_info

    root = Path(__file__).resolve().parents[1]
    body = "  baseline: {}\n" + swept("grid", {"alpha": [0.5, 2.0, 3.0], "beta": [1, 2]}, factor="alpha")
    stores = {}
    for name in ("whole", "killed"):
        stores[name] = tmp_path / f"{name}.zarr"
        (tmp_path / f"{name}.yaml").write_text(spec_text(stores[name], body) + "backend: {commit_interval_s: 0}\n")
    assert main(["run", str(tmp_path / "whole.yaml"), "--no-progress", "--no-table"]) == 0
    killed = subprocess.run([sys.executable, "-m", "workbench.cli", "run", str(tmp_path / "killed.yaml"),
                             "--no-progress", "--no-table"], cwd=root, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "WORKBENCH_KILL_AT": "store.commit:3"})
    assert killed.returncode == -9, killed.stderr
    stored = sum(c["samples"] for c in store_info(stores["killed"])["models"]["tiny-llama"]["conditions"].values())
    assert 0 < stored < 14
    assert main(["run", str(tmp_path / "killed.yaml"), "--no-progress", "--no-table"]) == 0
    whole = workbench.open_store(stores["whole"], model="tiny-llama").load()
    resumed = workbench.open_store(stores["killed"], model="tiny-llama").load()
    whole.attrs, resumed.attrs = {}, {}
    xr.testing.assert_identical(whole.reset_index(["token", "run"]), resumed.reset_index(["token", "run"]))
    assert set(resumed["condition"].values.tolist()) == {
        "baseline", *(f"grid[alpha={a},beta={b}]" for a in (0.5, 2.0, 3.0) for b in (1, 2))}
