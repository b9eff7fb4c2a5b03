"""GPU benchmark: samples per second and capture overhead of the real-size random-weight models
(SmolVLM2-2.2B and Qwen3-VL-2B dims) in bfloat16 on CUDA. Fits in ~8 minutes on one H200.

    python -m benchmarks.gpu                         # on a GPU machine; writes benchmarks/results/gpu.json
    python -m benchmarks.gpu --cpu-dry-run           # the same code path on the tiny models, CPU fp32

Per model and variant (`layers`: residual stream at every layer, sdpa attention;
`layers+attention`: also the attention probabilities, eager attention):
- capture overhead: one built-in sample, the workbench's run of one (sample, condition)
  (`run_condition` + store write, as the runner does) against a plain transformers forward with
  `output_hidden_states` (+ `output_attentions`), hidden states copied to host float32; wall time
  with CUDA synchronized, alternating (ABBA) after warm-ups, medians;
- samples per second: `--samples` built-in samples (different images and prompts), each run once
  through the plain loop and once through the workbench loop (store writes included), in wall time.
Peak GPU memory is recorded per model. Models are built on the GPU from config (random init).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .common import RESULTS, machine, median, pin_threads


def _models(dry_run: bool) -> list[str]:
    from .realsize import REAL_SIZE

    return ["tiny-smolvlm", "tiny-qwen3vl"] if dry_run else list(REAL_SIZE)


def _build(name: str, device: str, dtype: str, attn: str) -> Any:
    """A `WorkbenchModel`: tiny from disk, or real-size built from config directly on `device`."""
    import torch

    from workbench.models.model import load_model

    if name.startswith("tiny-"):
        return load_model(name, device=device, dtype=dtype, attn=attn), None
    from .realsize import REAL_SIZE, build_module, scaled_checkpoint_dir, scaled_config, wrap_in_memory

    tiny_name, dims = REAL_SIZE[name]
    cfg = scaled_config(tiny_name, dims)
    tmp = tempfile.TemporaryDirectory(prefix=f"bench-gpu-{name}-")
    ckpt = scaled_checkpoint_dir(tiny_name, cfg, Path(tmp.name))
    torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[dtype]
    with torch.device(device):  # init on the GPU, directly in the run dtype
        module = build_module(cfg, attn=attn, dtype=torch_dtype)
    return wrap_in_memory(module, ckpt, name, device=device, dtype=dtype, attn=attn), tmp


def throughput(model: Any, n: int, attention: bool, workdir: Path | None = None) -> dict[str, Any]:
    """Samples per second of the plain loop and of the workbench loop over n built-in samples."""
    import numpy as np
    import torch

    from workbench.checks import nonfinite_report
    from workbench.data import builtin_samples
    from workbench.plan import compile_plan
    from workbench.runner import LazyInputs, _execute, sample_variables
    from workbench.store import StoreWriter, Variable

    from .capture import capture_spec

    cuda = str(model.device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    samples = builtin_samples(n)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-tp-", dir=workdir) as tmp:
        store_path = Path(tmp) / "tp.zarr"
        spec = capture_spec(store_path, attention)
        plan = compile_plan(spec, model.info)
        condition = plan.conditions[0]
        inputs = [LazyInputs(model, s) for s in samples]
        for lazy in inputs:  # encoding (CPU, the processor) is outside both timings
            lazy[condition.image]
        sync()
        start = time.perf_counter()
        tokens = 0
        for lazy in inputs:
            model.prepare()
            enc = lazy[condition.image]
            with torch.inference_mode():
                out = model.hf(**enc.encoding, output_hidden_states=True, output_attentions=attention)
                torch.stack(out.hidden_states, dim=2)[0].to("cpu", torch.float32).numpy()
            tokens += enc.n_tokens
        sync()
        plain = time.perf_counter() - start
        with StoreWriter(store_path) as store:
            store.ensure_model(model.model_id, model.describe())
            sync()
            start = time.perf_counter()
            for sample, lazy in zip(samples, inputs):
                result = _execute(model, lazy, condition, plan)
                enc = lazy[condition.image]
                variables = sample_variables(enc, result, plan.capture.coords())
                problems = nonfinite_report(variables)
                variables["nonfinite"] = Variable(("run",), np.array([len(problems)], dtype=np.int64))
                store.write_sample(model.model_id, condition.name, sample.id, variables,
                                   condition_attrs=condition.store_attrs())
            sync()
            workbench = time.perf_counter() - start
    return {"samples": n, "tokens": tokens, "plain_samples_per_s": round(n / plain, 3),
            "workbench_samples_per_s": round(n / workbench, 3), "plain_s": round(plain, 3),
            "workbench_s": round(workbench, 3), "ratio": round(workbench / plain, 4)}


def run(dry_run: bool, repeats: int, samples: int, out: Path | None, log: Any = print) -> dict[str, Any]:
    import torch

    from . import capture

    device = "cpu" if dry_run else "cuda"
    dtype = "float32" if dry_run else "bfloat16"
    if not dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu-dry-run to check the script on the CPU")
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "dry_run": dry_run, "device": device,
                               "dtype": dtype, "machine": machine(), "models": {}}
    t_all = time.perf_counter()
    for name in _models(dry_run):
        entry: dict[str, Any] = {}
        for variant in ("layers", "layers+attention"):
            attention = variant == "layers+attention"
            t0 = time.perf_counter()
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            model, tmp = _build(name, device, dtype, "eager" if attention else "sdpa")
            build_s = time.perf_counter() - t0
            log(f"[gpu] {name} | {variant}: built in {build_s:.1f} s")
            try:
                over = capture.measure(model, attention=attention, repeats=repeats, warmup=2, clock="wall")
                tp = throughput(model, samples, attention)
            finally:
                del model
                if tmp is not None:
                    tmp.cleanup()
                if device == "cuda":
                    torch.cuda.empty_cache()
            entry[variant] = {
                "build_s": round(build_s, 1),
                "capture_overhead": over,
                "throughput": tp,
                "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if device == "cuda" else None,
            }
            log(f"[gpu] {name} | {variant}: overhead ×{over['ratio']:.3f} (plain {median(over['baseline_wall_s']) * 1e3:.1f} ms, "
                f"workbench {median(over['candidate_wall_s']) * 1e3:.1f} ms); "
                f"{tp['plain_samples_per_s']:.2f} vs {tp['workbench_samples_per_s']:.2f} samples/s")
            results["models"][name] = entry
            results["duration_s"] = round(time.perf_counter() - t_all, 1)
            if out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    log("\n" + table(results))
    return results


def table(results: dict[str, Any]) -> str:
    lines = [f"{results['device']} {results['dtype']} ({results['machine'].get('gpu') or results['machine']['cpu']}), "
             f"{results.get('duration_s', 0):.0f} s",
             "",
             "| model | variant | tokens | plain fwd | workbench run | overhead (wall) | plain samples/s | workbench samples/s | peak GPU GB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in results["models"].items():
        for variant, r in entry.items():
            o, t = r["capture_overhead"], r["throughput"]
            lines.append(f"| {name} | {variant} | {o['n_tokens']} | {median(o['baseline_wall_s']) * 1e3:.1f} ms | "
                         f"{median(o['candidate_wall_s']) * 1e3:.1f} ms | {o['ratio']:.3f} | {t['plain_samples_per_s']:.2f} | "
                         f"{t['workbench_samples_per_s']:.2f} | {r['peak_gpu_mem_gb'] if r['peak_gpu_mem_gb'] is not None else '—'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the same code on the tiny models on the CPU")
    parser.add_argument("--repeats", type=int, default=None, help="timed pairs per variant (default 10; dry run 3)")
    parser.add_argument("--samples", type=int, default=None, help="samples for samples/s (default 16; dry run 4)")
    parser.add_argument("--out", type=Path, default=None, help="results JSON (default results/gpu.json, dry run gpu-dry-run.json)")
    args = parser.parse_args(argv)
    dry = args.cpu_dry_run
    pin_threads(1 if dry else 4)
    import warnings

    warnings.filterwarnings("ignore")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass
    out = args.out or RESULTS / ("gpu-dry-run.json" if dry else "gpu.json")
    run(dry, args.repeats or (3 if dry else 10), args.samples or (4 if dry else 16), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
