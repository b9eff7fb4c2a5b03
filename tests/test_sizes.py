"""Sizes are counted before anything is expanded: a sweep or a data source past its limit is
refused before any condition or sample is built (exit 2, the field, the count and the limit, no traceback, nothing
written); --max-conditions / --max-samples and the spec's `limits` raise the limits; a large legal
count is read lazily (the samples, the runs), so memory before the work does not grow with it."""

from __future__ import annotations

import itertools
import math
import tracemalloc
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.cli import main
from workbench.spec import DATBENCH_CONFIGS, DataSpec, Spec, SpecError, parse_spec

HEAD = "name: sizes\nmodels: [tiny-llama]\ncapture: [{site: layer}]\n"


def spec_text(store: Path, conditions: str, data: str = "", limits: str = "") -> str:
    return f"{HEAD}{data}{limits}conditions:\n{conditions}store: {{path: {store}}}\n"


def sweep(name: str, sizes: dict[str, int]) -> str:
    """A condition sweeping each variable over `size` distinct values (a scale by the first)."""
    values = ", ".join(f"{var}: [{', '.join(str(i) for i in range(size))}]" for var, size in sizes.items())
    first = next(iter(sizes))
    return f"  {name}:\n    sweep: {{{values}}}\n    interventions: [{{kind: scale, site: embed, factor: ${first}}}]\n"


def refuses(argv: list[str], capsys) -> tuple[str, int]:
    """The CLI's exit code 2, one `error:` line and no traceback; (stderr, peak bytes allocated)."""
    tracemalloc.start()
    try:
        code = main(argv)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err, peak


# the cases: (conditions, data, field and its line, phrases of the message)
TOO_LARGE = {
    "a sweep of 150,000 values": (
        "  baseline: {}\n" + sweep("alpha", {"alpha": 150_000}), "", ("conditions.alpha.sweep", 7),
        ["the sweep expands to 150,000 conditions (alpha: 150,000 values), 150,001 with the other conditions",
         "the limit is 100,000 conditions",
         "raise limits.conditions (--max-conditions) to at least 150,001"]),
    "a product sweep of 10^8 conditions": (
        sweep("grid", {v: 100 for v in "abcd"}), "", ("conditions.grid.sweep", 6),
        ["the sweep expands to 100,000,000 conditions (a: 100 values x b: 100 values x c: 100 values x d: 100 values)",
         "the limit is 100,000 conditions"]),
    "two sweeps past the limit together": (
        sweep("one", {"x": 300, "y": 200}) + sweep("two", {"x": 300, "y": 200}), "", ("conditions", 4),
        ["the conditions expand to 120,000 in all (one: 60,000, two: 60,000)", "the limit is 100,000 conditions"]),
    "10^7 built-in samples": (
        "  baseline: {}\n", "data: {source: builtin, n: 10000000}\n", ("data.n", 4),
        ["asks for 10,000,000 samples; the limit is 1,000,000 samples",
         "raise limits.samples (--max-samples) to at least 10,000,000"]),
    "datbench: n per config x configs": (
        "  baseline: {}\n", "data: {source: datbench, n: 200000, exclude: [math]}\n", ("data.n", 4),
        ["asks for 200,000 per config x 8 configs = 1,600,000 samples; the limit is 1,000,000 samples"]),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> None:
    """The CLI's imports done once (the package, transformers' logging), so a test times the check."""
    spec = tmp_path_factory.mktemp("warm") / "small.yaml"
    spec.write_text(spec_text(spec.with_suffix(".zarr"), "  baseline: {}\n"))
    assert main(["validate", "-q", str(spec)]) == 0


@pytest.mark.parametrize("case", list(TOO_LARGE))
@pytest.mark.parametrize("command", ["validate", "run"])
def test_too_large_is_refused_at_once_naming_field_count_and_limit(tmp_path, capsys, monkeypatch, imported, case,
                                                                   command):
    conditions, data, (field, line), phrases = TOO_LARGE[case]
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "big.yaml"
    text = spec_text(tmp_path / "big.zarr", conditions, data)
    spec.write_text(text)
    err, peak = refuses([command, str(spec)] + (["--no-progress"] if command == "run" else []), capsys)
    assert f"{spec}:{line}: {field}: " in err
    for phrase in phrases:
        assert phrase in err
    # refused before any condition is built: a small multiple of the text (5.7 MB for the 150,000
    # values' 1.1 MB), where 150,000 expanded conditions take over 100 MB; a bound in bytes, not
    # seconds, so a busy machine cannot fail it
    assert peak < 4 * len(text) + (8 << 20), (peak, len(text))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.yaml"]  # nothing written


def test_a_list_far_past_every_limit_is_read_only_that_far(tmp_path, capsys):
    spec = tmp_path / "huge.yaml"
    spec.write_text(spec_text(tmp_path / "s.zarr", sweep("alpha", {"alpha": 1_000_000})))
    err, _ = refuses(["validate", str(spec)], capsys)
    assert "the sweep expands to more than 200,000 conditions (alpha: 200,001+ values)" in err


def test_the_limits_are_raised_by_option_or_by_the_spec(tmp_path, capsys):
    grid = sweep("grid", {"x": 50, "y": 50, "z": 50})  # 125,000 conditions
    spec = tmp_path / "grid.yaml"
    spec.write_text(spec_text(tmp_path / "s.zarr", grid))
    refuses(["validate", str(spec)], capsys)
    assert main(["validate", str(spec), "--max-conditions", "125000"]) == 0
    assert "1 model(s), 125000 condition(s)" in capsys.readouterr().out
    spec.write_text(spec_text(tmp_path / "s.zarr", grid, limits="limits: {conditions: 200000}\n"))
    assert main(["validate", str(spec)]) == 0
    assert "125000 condition(s)" in capsys.readouterr().out
    many = tmp_path / "many.yaml"
    many.write_text(spec_text(tmp_path / "s.zarr", "  baseline: {}\n", "data: {source: builtin, n: 2000000}\n"))
    refuses(["validate", str(many)], capsys)
    assert main(["validate", str(many), "--max-samples", "2000000"]) == 0
    assert "2000000 sample(s) from builtin" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:  # argparse refuses it, as every other bad option
        main(["validate", str(many), "--max-samples", "0"])
    assert exit_.value.code == 2
    assert "argument --max-samples: got '0'; expected an integer >= 1" in capsys.readouterr().err


def test_a_bad_limits_section_is_a_located_spec_error(tmp_path):
    with pytest.raises(SpecError) as err:
        parse_spec(spec_text(tmp_path / "s.zarr", "  baseline: {}\n", limits="limits: {conditions: lots, rows: 3}\n"))
    assert "limits.conditions: got 'lots' (str); expected an integer" in str(err.value)
    assert "limits.rows: unknown field 'rows'" in str(err.value)


def test_a_datbench_switch_on_the_command_line_is_sized_too(tmp_path):
    spec = parse_spec(spec_text(tmp_path / "s.zarr", "  baseline: {}\n", "data: {source: builtin, n: 200000}\n"))
    with pytest.raises(SpecError) as err:
        spec.with_overrides(data_source="datbench")
    assert str(err.value).startswith("command line: --data: asks for 200,000 per config x 9 configs = 1,800,000")


# ------------------------------------------------------------------ around the limits (property)

SIZES = st.lists(st.integers(1, 12), min_size=1, max_size=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conditions=st.lists(SIZES, min_size=1, max_size=3), slack=st.integers(-3, 3),
       n=st.integers(1, 60), source=st.sampled_from(["builtin", "datbench"]),
       excluded=st.integers(0, len(DATBENCH_CONFIGS) - 1), samples_slack=st.integers(-3, 3))
def test_refused_exactly_past_the_limits(tmp_path, conditions, slack, n, source, excluded, samples_slack):
    count = sum(math.prod(sizes) for sizes in conditions)  # conditions after expansion, counted here by hand
    samples = n * (len(DATBENCH_CONFIGS) - excluded) if source == "datbench" else n
    max_conditions, max_samples = max(1, count + slack), max(1, samples + samples_slack)
    body = "".join(sweep(f"c{i}", {f"c{i}v{j}": size for j, size in enumerate(sizes)}) for i, sizes in enumerate(conditions))
    exclude = f", exclude: [{', '.join(DATBENCH_CONFIGS[:excluded])}]" if source == "datbench" and excluded else ""
    text = spec_text(tmp_path / "s.zarr", body, f"data: {{source: {source}, n: {n}{exclude}}}\n",
                     f"limits: {{conditions: {max_conditions}, samples: {max_samples}}}\n")
    data = yaml.safe_load(text)
    too_many = count > max_conditions or samples > max_samples
    if too_many:
        with pytest.raises(SpecError) as err:
            parse_spec(text)  # from the YAML's events
        message = str(err.value)
        if count > max_conditions:
            assert f"the limit is {max_conditions:,} conditions" in message and f"{count:,}" in message
        if samples > max_samples:
            assert f"the limit is {max_samples:,} samples" in message and f"{samples:,} samples" in message
        with pytest.raises(ValueError):
            Spec.model_validate(data)  # from plain data: the same limits
        return
    spec = parse_spec(text)
    instances = spec.expand_conditions()
    assert len(instances) == count == len({i.name for i in instances})
    assert Spec.model_validate(data).limits.conditions == max_conditions


# ------------------------------------------------------------------ a large legal count is read lazily


def traced_peak(work) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_survey_keeps_an_id_and_a_hash_per_sample_never_its_image():
    from workbench.worklist import SampleStream, survey

    small = traced_peak(lambda: survey(SampleStream(DataSpec(n=50))))
    large = traced_peak(lambda: survey(SampleStream(DataSpec(n=550))))
    per_sample = (large - small) / 500
    # a built-in image is at least 64 x 64 RGB (12 KB); an id and a 32-character hash are ~0.3 KB
    assert per_sample < 1024, per_sample


def test_a_million_samples_start_running_without_being_held(tmp_path):
    from workbench.runner import compile_all
    from workbench.worklist import SampleStream, pending_runs

    spec = parse_spec(spec_text(tmp_path / "s.zarr", "  baseline: {}\n" + sweep("alpha", {"alpha": 3}),
                                "data: {source: builtin, n: 1000000}\n"))
    plans = compile_all(spec)  # the model's config only
    done = {(plans[0].info.model_id, c.name): set() for c in plans[0].conditions}

    def first_runs() -> None:
        runs = list(itertools.islice(pending_runs(plans, SampleStream(spec.data), done), 8))
        assert [(s.id, c.name) for _, s, c in runs[:5]] == [
            ("builtin/counting/000", "baseline"), ("builtin/counting/000", "alpha[alpha=0]"),
            ("builtin/counting/000", "alpha[alpha=1]"), ("builtin/counting/000", "alpha[alpha=2]"),
            ("builtin/color/001", "baseline")]

    assert traced_peak(first_runs) < 5 << 20  # two samples' images, not a million


def test_a_scans_grid_counts_toward_the_condition_limit(tmp_path):
    """A scan's runs (layers x heads x position groups x directions) are conditions too: past
    `limits.conditions` the spec is refused before its grid expands, at the scan's field."""
    scan = ("  baseline: {}\n  blank: {image: blank}\n  trace:\n    scan: {clean: baseline, corrupt: blank, "
            "layers: [0, 1, 2], positions: [vision, text, last, 3, 4], direction: both}\n")
    parse_spec(spec_text(tmp_path / "s.zarr", scan, limits="limits: {conditions: 32}\n"))   # 2 + 3 x 5 x 2
    with pytest.raises(SpecError, match=r"conditions: the conditions expand to 32 in all \(trace: 30\)"):
        parse_spec(spec_text(tmp_path / "s.zarr", scan, limits="limits: {conditions: 31}\n"))
    with pytest.raises(SpecError) as err:
        parse_spec(spec_text(tmp_path / "s.zarr", scan, limits="limits: {conditions: 29}\n"))
    assert ("conditions.trace.scan: the scan expands to 30 conditions (l: 3 values x pos: 5 values x dir: 2 values), "
            "32 with the other conditions; the limit is 29 conditions; expected fewer layers, position groups or "
            "heads") in str(err.value)
