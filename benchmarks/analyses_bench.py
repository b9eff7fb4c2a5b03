"""Analyses against capture: the time of every analysis of a store against the time to capture it.

The store holds what the study's tables read: the residual stream at every layer, attention,
logits, keys and values, for baseline, blank, no image, KV-substitution hybrid and an α sweep.

The analysis entry point is whatever exists when the benchmark runs, in this order:
`workbench analyze STORE` (if the CLI has that command), `analyses.tables.analyze(STORE)`,
`analyses.norms.norm_table(STORE)`. It runs in a fresh subprocess (imports included) with the
store's analysis cache removed before every repeat, so every repeat computes everything.

Capture: at tiny scale a `workbench run` subprocess of the spec (interpreter start, imports and
model loading included, like the analysis); at real size the conditions are run in this process
on the already-built model, exactly as the runner's loop does (model loading excluded).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import REPO, cpu_time, median, spread

SPEC = """\
name: bench-analyses
models: [{models}]
data: {{source: builtin, n: {n}}}
conditions:
{conditions}capture:
  - {{site: layer, layers: all}}
  - {{site: attention}}
  - {{site: logits}}
  - {{site: keys}}
  - {{site: values}}
generate: {{max_new_tokens: {steps}}}
store: {{path: {store}}}
"""
CONDITIONS = {
    "baseline": "  baseline: {}\n",
    "blank": "  blank: {image: blank}\n",
    "none": "  none: {image: none}\n",
    "hybrid": "  hybrid:\n    kv_swap: {donor: blank, positions: vision, layers: all}\n",
}
ALL_CONDITIONS = ("baseline", "blank", "none", "hybrid", "alpha")


def spec_text(models: list[str], n: int, store: Path, conditions: tuple[str, ...] = ALL_CONDITIONS,
              alphas: tuple[float, ...] = (0.1, 3.0), steps: int = 2) -> str:
    body = "".join(CONDITIONS[c] for c in conditions if c in CONDITIONS)
    if "alpha" in conditions:
        body += ("  alpha:\n    sweep: {alpha: [%s]}\n    interventions:\n"
                 "      - {kind: scale, site: projector, factor: $alpha, positions: vision}\n") % ", ".join(map(str, alphas))
    return SPEC.format(models=", ".join(models), n=n, conditions=body, steps=steps, store=store)


def timed_child(argv: list[str], env: dict[str, str] | None = None, timeout: float = 1800) -> dict[str, Any]:
    """Run a subprocess; its own CPU seconds (user + sys, from `os.wait4` on its pid), wall
    seconds, peak RSS and output. `argv` of the form [python, -m, MODULE, ...] runs through
    `benchmarks._peak`, which reads the child's peak RSS from /proc/self/status (VmHWM) at exit:
    the `ru_maxrss` of `wait4` would include this (parent) process's RSS at fork time."""
    peak_file = None
    if len(argv) > 2 and argv[1] == "-m":
        fd, peak_file = tempfile.mkstemp(prefix="bench-peak-", suffix=".json")
        os.close(fd)
        argv = [argv[0], "-m", "benchmarks._peak", peak_file, *argv[2:]]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO,
                            env={**os.environ, **(env or {})})
    chunks = []
    assert proc.stdout is not None
    deadline = start + timeout
    for chunk in iter(lambda: proc.stdout.read(65536), b""):
        chunks.append(chunk)
        if time.perf_counter() > deadline:
            proc.kill()
            break
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak_mb = None
    if peak_file is not None:
        try:
            with open(peak_file) as f:
                peak = json.load(f)
            peak_mb = (peak.get("vmhwm_kb") or peak.get("ru_maxrss_kb")) / 1024
        except (OSError, ValueError, TypeError):
            pass
        finally:
            os.unlink(peak_file)
    return {
        "rc": proc.returncode,
        "wall_s": time.perf_counter() - start,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "max_rss_mb": peak_mb if peak_mb is not None else usage.ru_maxrss / 1024,
        "peak_source": "VmHWM" if peak_mb is not None else "ru_maxrss (includes the parent's RSS at fork)",
        "output": b"".join(chunks).decode(errors="replace"),
    }


def analysis_entry_point() -> tuple[str, list[str]]:
    """(name, argv prefix to which the store path is appended) of the best analysis entry point."""
    from workbench.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    if "analyze" in sub.choices:
        return "workbench analyze", [sys.executable, "-m", "workbench.cli", "analyze"]
    try:
        from analyses import tables

        if hasattr(tables, "analyze"):
            code = "import sys; from analyses.tables import analyze; print(analyze(sys.argv[1]))"
            return "analyses.tables.analyze", [sys.executable, "-c", code]
    except ImportError:
        pass
    code = "import sys; from analyses.norms import norm_table; print(norm_table(sys.argv[1]))"
    return "analyses.norms.norm_table", [sys.executable, "-c", code]


def _clear_analysis_cache(store: Path) -> None:
    try:
        from analyses.cache import CACHE_GROUP
    except ImportError:
        CACHE_GROUP = "_analyses"
    shutil.rmtree(store / CACHE_GROUP, ignore_errors=True)


def time_analyses(store: Path, repeats: int = 3) -> dict[str, Any]:
    name, argv = analysis_entry_point()
    runs = []
    for _ in range(repeats):
        _clear_analysis_cache(store)
        result = timed_child(argv + [str(store)])
        if result["rc"] != 0:
            raise RuntimeError(f"{name} failed (exit {result['rc']}):\n{result['output'][-3000:]}")
        runs.append(result)
    out = runs[-1]["output"]
    # the fixed start-up part: interpreter + the imports the entry point needs
    modules = ["workbench.cli", "analyses.tables"]
    try:
        import importlib.util

        if importlib.util.find_spec("analyses.commands") is not None:
            modules.append("analyses.commands")
    except ImportError:
        pass
    startup = timed_child([sys.executable, "-c", "import " + ", ".join(modules)])
    return {
        "entry_point": name,
        "startup_cpu_s": round(startup["cpu_s"], 3),
        "cpu_s": [round(r["cpu_s"], 3) for r in runs],
        "wall_s": [round(r["wall_s"], 3) for r in runs],
        "cpu_median_s": round(median([r["cpu_s"] for r in runs]), 3),
        "wall_median_s": round(median([r["wall_s"] for r in runs]), 3),
        "tables": sum(1 for line in out.splitlines() if line.startswith("|---")),
        "skipped_lines": [l.strip() for l in out.splitlines() if "skipped" in l.lower() or "missing" in l.lower()][:10],
    }


def tiny(models: tuple[str, ...] = ("tiny-smolvlm", "tiny-qwen3vl"), n: int = 4, repeats: int = 3,
         workdir: Path | None = None, conditions: tuple[str, ...] = ALL_CONDITIONS) -> dict[str, Any]:
    """Capture by a `workbench run` subprocess, then analyses of its store."""
    with tempfile.TemporaryDirectory(prefix="bench-analyses-", dir=workdir) as tmp:
        tmp = Path(tmp)
        store = tmp / "store.zarr"
        spec = tmp / "spec.yaml"
        spec.write_text(spec_text(list(models), n, store, conditions))
        capture = timed_child([sys.executable, "-m", "workbench.cli", "run", str(spec), "--no-progress", "--no-table"])
        if capture["rc"] != 0:
            raise RuntimeError(f"workbench run failed (exit {capture['rc']}):\n{capture['output'][-3000:]}")
        analyses = time_analyses(store, repeats)
        store_mb = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 1e6
    return _summary(capture["cpu_s"], capture["wall_s"], analyses, {
        "models": list(models), "samples": n,
        "conditions": ", ".join(c if c != "alpha" else "alpha=0.1, alpha=3.0" for c in conditions),
        "capture": "workbench run subprocess (start-up, imports, model loading included)",
        "store_mb": round(store_mb, 2),
    })


def real_size_capture(model: Any, store: Path, conditions: tuple[str, ...] = ("baseline", "alpha"),
                      alphas: tuple[float, ...] = (3.0,), steps: int = 1) -> dict[str, Any]:
    """Run the analysis spec's conditions for one sample on a loaded model into `store`, as the
    runner's loop does; return its CPU and wall seconds."""
    import numpy as np

    from workbench.checks import nonfinite_report
    from workbench.data import builtin_samples
    from workbench.plan import compile_plan
    from workbench.backends.local import run_condition
    from workbench.runner import LazyInputs, provenance, sample_variables
    from workbench.spec import parse_spec
    from workbench.store import StoreWriter, Variable

    spec = parse_spec(spec_text(["tiny-smolvlm"], 1, store, conditions, alphas, steps))
    plan = compile_plan(spec, model.info)
    sample = builtin_samples(1)[0]
    written: dict[str, tuple[Any, dict[str, Any]]] = {}
    cpu0, wall0 = cpu_time(), time.perf_counter()
    with StoreWriter(store) as writer:
        writer.add_provenance(provenance(spec))
        writer.ensure_model(model.model_id, model.describe())
        inputs_by_image = LazyInputs(model, sample)
        for condition in plan.conditions:
            result = run_condition(model, inputs_by_image, condition, plan)
            inputs = inputs_by_image[condition.image]
            variables = sample_variables(inputs, result, plan.capture.coords())
            problems = nonfinite_report(variables)
            variables["nonfinite"] = Variable(("run",), np.array([len(problems)], dtype=np.int64))
            writer.write_sample(model.model_id, condition.name, sample.id, variables,
                                condition_attrs=condition.store_attrs())
            written[condition.name] = (condition.store_attrs(), variables)
    return {"cpu_s": cpu_time() - cpu0, "wall_s": time.perf_counter() - wall0,
            "conditions": [c.name for c in plan.conditions], "written": written, "sample": sample.id}


def replicate(store: Path, model_id: str, written: dict[str, tuple[Any, dict[str, Any]]], sample_id: str, copies: int) -> None:
    """Append `copies` more samples holding the same captures (new ids): a store of real-size
    data with more samples without running the model again, to time the analyses' cost per
    sample (their values are degenerate, their work is not)."""
    from workbench.store import StoreWriter

    with StoreWriter(store) as writer:
        for k in range(1, copies + 1):
            for condition, (attrs, variables) in written.items():
                writer.write_sample(model_id, condition, f"{sample_id}#copy{k}", variables, condition_attrs=attrs)


def real_size_one(name: str, model: Any, repeats: int = 2, workdir: Path | None = None,
                  conditions: tuple[str, ...] = ("baseline", "alpha"), alphas: tuple[float, ...] = (3.0,),
                  copies: int = 7, study_samples: int = 80) -> dict[str, Any]:
    """Capture one sample on the built model and time the analyses of that store; then add
    `copies` copies of the sample and time them again: the difference gives the analyses' cost
    per sample, and with the fixed part the ratio at `study_samples` samples."""
    with tempfile.TemporaryDirectory(prefix="bench-analyses-real-", dir=workdir) as tmp:
        store = Path(tmp) / "store.zarr"
        capture = real_size_capture(model, store, conditions, alphas)
        analyses = time_analyses(store, repeats)
        store_mb = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 1e6
        bigger = None
        if copies:
            replicate(store, model.model_id, capture["written"], capture["sample"], copies)
            bigger = time_analyses(store, repeats)
    out = _summary(capture["cpu_s"], capture["wall_s"], analyses, {
        "models": [name], "samples": 1, "conditions": ", ".join(capture["conditions"]),
        "capture": "in-process run of the conditions on the built model (model loading excluded)",
        "store_mb": round(store_mb, 2),
    })
    if bigger is not None:
        n = copies + 1
        per_sample = (bigger["cpu_median_s"] - analyses["cpu_median_s"]) / copies
        fixed = analyses["cpu_median_s"] - per_sample
        out["scaling"] = {
            "samples": n,
            "analyses": bigger,
            "analyses_cpu_per_sample_s": round(per_sample, 3),
            "analyses_fixed_cpu_s": round(fixed, 3),
            "capture_cpu_per_sample_s": round(capture["cpu_s"], 3),
            "marginal_ratio": round(per_sample / capture["cpu_s"], 4),
            "study_samples": study_samples,
            "projected_ratio": round((fixed + study_samples * per_sample) / (study_samples * capture["cpu_s"]), 4),
        }
    return out


def _summary(capture_cpu: float, capture_wall: float, analyses: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    return {
        **extra,
        "capture_cpu_s": round(capture_cpu, 3),
        "capture_wall_s": round(capture_wall, 3),
        "analyses": analyses,
        "ratio": round(analyses["cpu_median_s"] / capture_cpu, 4),
        "wall_ratio": round(analyses["wall_median_s"] / capture_wall, 4),
        "noise": round(spread(analyses["cpu_s"]), 4),
    }
