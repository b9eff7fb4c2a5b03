"""GPU benchmark: samples per second and capture overhead of the real-size random-weight models
(SmolVLM2-2.2B and Qwen3-VL-2B dims) in bfloat16 on CUDA. Fits in ~8 minutes on one H200.

    python -m benchmarks.gpu                         # on a GPU machine; writes benchmarks/results/gpu.json
    python -m benchmarks.gpu --cpu-dry-run           # the same code path on the tiny models, CPU fp32

Per model (sdpa attention):
- capture overhead: one built-in sample, the workbench's run of one (sample, condition)
  (`run_condition` + store write, as the runner does) against a plain transformers forward with
  `output_hidden_states`, hidden states copied to host float32; wall time with CUDA synchronized,
  alternating (ABBA) after warm-ups, medians;
- the alpha sweep (8 conditions per sample, residual at 3 layers + logits), samples per second
  over `--samples` built-in samples (different images and prompts), wall time, store writes
  included: the plain batched loop (one 8-row transformers forward per sample, alphas applied
  per row by forward hooks, `np.save`) against the workbench's runner loop at
  `backend.batch_size` 1 and 8.
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

from .common import RESULTS, machine, median, new_dir, pin_threads, runner_loop


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


SWEEP = """\
name: bench-sweep
models: [tiny-smolvlm]
data: {{source: builtin, n: 1}}
conditions:
  alpha: {{sweep: {{a: [{alphas}]}}, interventions: [{{kind: scale, site: projector, positions: vision, factor: $a}}]}}
capture: [{{site: layer, layers: [{layers}]}}, {{site: logits}}]
backend: {{batch_size: {batch}}}
store: {{path: {store}}}
"""
ALPHAS = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 3.0)  # 8 conditions: one forward of 8 rows when batched


def _sweep_layers(model: Any) -> list[int]:
    return sorted({0, model.n_layers // 2, model.n_layers})


def plain_sweep(model: Any, samples: list[Any], out_dir: Path, sync: Any) -> float:
    """The plain batched loop, wall seconds: per sample ONE transformers forward of 8 rows (the
    sweep's alphas applied per row by plain forward hooks on the projector modules), the same
    residual layers and last-position log-probabilities copied to host float32 and `np.save`d."""
    import numpy as np
    import torch

    from workbench.backends.local import stack_encodings
    from workbench.runner import LazyInputs

    layers = _sweep_layers(model)
    alphas = torch.tensor(ALPHAS)

    def scale_rows(module: Any, args: Any, output: Any) -> Any:
        block = output.shape[0] // len(ALPHAS)
        factors = alphas.to(output.device, output.dtype).repeat_interleave(block)
        return output * factors.view(-1, *([1] * (output.dim() - 1)))

    modules = [envoy._module for path in model.arch.projector for envoy in model.module(path)]
    encodings = []
    for sample in samples:  # encoding (the processor, on the CPU) is outside the timing
        inputs = LazyInputs(model, sample)["real"]
        encodings.append(stack_encodings([inputs.encoding] * len(ALPHAS)))
    hooks = [m.register_forward_hook(scale_rows) for m in modules]
    try:
        sync()
        start = time.perf_counter()
        for i, encoding in enumerate(encodings):
            model.prepare()
            with torch.inference_mode():
                out = model.hf(**encoding, output_hidden_states=True, use_cache=False)  # as the workbench: no KV cache
                hidden = torch.stack([out.hidden_states[l] for l in layers], dim=2).to("cpu", torch.float32).numpy()
                logprobs = torch.log_softmax(out.logits[:, -1].float(), -1).cpu().numpy()
            np.save(out_dir / f"hidden-{i}.npy", hidden)
            np.save(out_dir / f"logprobs-{i}.npy", logprobs)
        sync()
        return time.perf_counter() - start
    finally:
        for hook in hooks:
            hook.remove()


def workbench_sweep(model: Any, samples: list[Any], batch: int, store_path: Path, sync: Any) -> float:
    """The workbench, wall seconds: the runner's own loop (`workbench.runner._Run`: batches of
    `backend.batch_size` conditions, one nnsight trace per batch, labels, the background store
    writer) over the samples' alpha sweep, until every result is committed."""
    text = SWEEP.format(alphas=", ".join(map(str, ALPHAS)), layers=", ".join(map(str, _sweep_layers(model))),
                        batch=batch, store=store_path)
    return runner_loop(model, text, samples, store_path, sync)[1]


def batched_differences(unbatched: Path, batched: Path, model_id: str) -> dict[str, dict[str, float]]:
    """How far the batch-8 store is from the batch-1 one, per float variable: the largest
    absolute difference, and the largest relative to the variable's largest magnitude (in
    bfloat16 batched and unbatched kernels round differently; in float32 tests ask 1e-5)."""
    import numpy as np

    import workbench

    a, b = workbench.open_store(unbatched, model=model_id), workbench.open_store(batched, model=model_id)
    out = {}
    for name in a.data_vars:
        x, y = a[name].values, b[name].values
        if not np.issubdtype(x.dtype, np.floating):
            out[name] = {"equal": bool(np.array_equal(x, y))}
            continue
        finite = np.isfinite(x) & np.isfinite(y)
        diff = np.abs(x - y)[finite]
        scale = float(np.abs(x[finite]).max()) if finite.any() else 0.0
        out[name] = {"max_abs": float(diff.max()) if diff.size else 0.0,
                     "max_rel_to_max": float(diff.max() / scale) if diff.size and scale else 0.0}
    return out


def sweep_throughput(model: Any, n: int, workdir: Path | None = None) -> dict[str, Any]:
    """Samples/s of the alpha sweep (8 conditions per sample): the plain batched loop, the
    workbench at batch 1 and at batch 8. Each arm runs once on one sample untimed (warm-up:
    kernels, allocator), then timed on n samples (different images and prompts)."""
    import torch

    from workbench.data import builtin_samples

    cuda = str(model.device).startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    samples = builtin_samples(n + 1)
    warm, timed_samples = samples[:1], samples[1:]
    seconds = {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-sweep-", dir=workdir) as tmp:
        arms = {
            # new files in a new folder for each call, as each workbench arm writes a new store
            "plain_batch8": lambda s, tag: plain_sweep(model, s, new_dir(Path(tmp) / f"plain-{tag}"), sync),
            "workbench_batch1": lambda s, tag: workbench_sweep(model, s, 1, Path(tmp) / f"b1-{tag}.zarr", sync),
            "workbench_batch8": lambda s, tag: workbench_sweep(model, s, len(ALPHAS), Path(tmp) / f"b8-{tag}.zarr", sync),
        }
        for name, arm in arms.items():
            arm(warm, "warm")
            seconds[name] = arm(timed_samples, "timed")
        differences = batched_differences(Path(tmp) / "b1-timed.zarr", Path(tmp) / "b8-timed.zarr", model.model_id)
    out = {"samples": n, "conditions_per_sample": len(ALPHAS), "layers": _sweep_layers(model),
           "batched_vs_unbatched": differences}
    for name, s in seconds.items():
        out[f"{name}_s"] = round(s, 3)
        out[f"{name}_samples_per_s"] = round(n / s, 3)
    out["ratio_batch1"] = round(seconds["workbench_batch1"] / seconds["plain_batch8"], 4)
    out["ratio_batch8"] = round(seconds["workbench_batch8"] / seconds["plain_batch8"], 4)
    out["batching_speedup"] = round(seconds["workbench_batch1"] / seconds["workbench_batch8"], 4)
    return out


def run(dry_run: bool, repeats: int, samples: int, out: Path | None, log: Any = print,
        workdir: Path | None = None) -> dict[str, Any]:
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
        t0 = time.perf_counter()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        model, tmp = _build(name, device, dtype, "sdpa")
        build_s = time.perf_counter() - t0
        log(f"[gpu] {name}: built in {build_s:.1f} s")
        try:
            over = capture.measure(model, attention=False, repeats=repeats, warmup=2, clock="wall", workdir=workdir)
            log(f"[gpu] {name}: overhead x{over['ratio']:.3f} (plain {median(over['baseline_wall_s']) * 1e3:.1f} ms, "
                f"workbench {median(over['candidate_wall_s']) * 1e3:.1f} ms)")
            sweep = sweep_throughput(model, samples, workdir)
            log(f"[gpu] {name}: sweep samples/s plain batch 8 {sweep['plain_batch8_samples_per_s']:.2f}, workbench "
                f"batch 1 {sweep['workbench_batch1_samples_per_s']:.2f}, batch 8 {sweep['workbench_batch8_samples_per_s']:.2f}")
        finally:
            del model
            if tmp is not None:
                tmp.cleanup()
            if device == "cuda":
                torch.cuda.empty_cache()
        results["models"][name] = {
            "build_s": round(build_s, 1),
            "capture_overhead": over,
            "sweep": sweep,
            "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if device == "cuda" else None,
        }
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
             "| model | tokens | plain fwd | workbench run | overhead (wall) | sweep samples/s: plain batch 8 | "
             "workbench batch 1 | workbench batch 8 | batch 8 / plain | peak GPU GB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results["models"].items():
        o, t = r["capture_overhead"], r["sweep"]
        lines.append(f"| {name} | {o['n_tokens']} | {median(o['baseline_wall_s']) * 1e3:.1f} ms | "
                     f"{median(o['candidate_wall_s']) * 1e3:.1f} ms | {o['ratio']:.3f} | "
                     f"{t['plain_batch8_samples_per_s']:.2f} | {t['workbench_batch1_samples_per_s']:.2f} | "
                     f"{t['workbench_batch8_samples_per_s']:.2f} | {t['ratio_batch8']:.2f}x time | "
                     f"{r['peak_gpu_mem_gb'] if r['peak_gpu_mem_gb'] is not None else '—'} |")
    return "\n".join(lines)


CHECK_SPEC = """\
name: gpu-check
models: [{model}]
data: {{source: builtin, n: 2}}
conditions:
  alpha: {{sweep: {{a: [0.1, 1.0, 3.0]}}, interventions: [{{kind: scale, site: projector, positions: vision, factor: $a}}]}}
  blank: {{image: blank}}
  none: {{image: none}}
capture: [{{site: layer}}, {{site: attention}}, {{site: keys}}, {{site: values}}, {{site: keys_pre}},
          {{site: attn_out}}, {{site: mlp_out}}, {{site: logit_lens}}, {{site: logits}}]
generate: {{max_new_tokens: 3}}
backend: {{device: {device}, dtype: {dtype}, batch_size: {batch}{extra}}}
store: {{path: {store}}}
"""


def checks(device: str, workdir: Path | None = None) -> dict[str, Any]:
    """On the GPU, the tiny families' runs in float32 and bfloat16: batch 4 against batch 1, and
    `device_map: auto` against a plain load, as `batched_differences` of the two stores."""
    from workbench.runner import run_spec
    from workbench.spec import parse_spec

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-checks-", dir=workdir) as tmp:
        for model in ("tiny-smolvlm", "tiny-qwen3vl"):
            for dtype in ("float32", "bfloat16"):
                stores = {}
                for arm, batch, extra in (("batch1", 1, ""), ("batch4", 4, ""), ("device_map", 1, ", device_map: auto")):
                    stores[arm] = Path(tmp) / f"{model}-{dtype}-{arm}.zarr"
                    text = CHECK_SPEC.format(model=model, device=device, dtype=dtype, batch=batch, extra=extra,
                                             store=stores[arm])
                    run_spec(parse_spec(text), progress=False, log=lambda _: None)
                out[f"{model} {dtype} batch4 vs batch1"] = batched_differences(stores["batch1"], stores["batch4"], model)
                out[f"{model} {dtype} device_map vs plain"] = batched_differences(stores["batch1"], stores["device_map"], model)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the same code on the tiny models on the CPU")
    parser.add_argument("--repeats", type=int, default=None, help="timed pairs of the overhead measure (default 10; dry run 3)")
    parser.add_argument("--samples", type=int, default=None, help="samples for samples/s (default 8; dry run 2)")
    parser.add_argument("--checks-only", action="store_true",
                        help="only the correctness checks (batched vs unbatched, device_map) on the tiny models")
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
    if args.checks_only:
        found = checks("cpu" if dry else "cuda")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(found, indent=1) + "\n")
        for name, variables in found.items():
            worst = max((v.get("max_rel_to_max", 0.0) for v in variables.values()), default=0.0)
            unequal = [k for k, v in variables.items() if v.get("equal") is False]
            print(f"{name}: max relative difference {worst:.2e}; integer variables differing: {unequal or 'none'}")
        return 0
    run(dry, args.repeats or (3 if dry else 10), args.samples or (2 if dry else 8), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
