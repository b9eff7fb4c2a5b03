"""A patching scan on a tiny model: every residual layer x 4 position groups (vision, text,
boundary, last), denoising a blank image with the real one's values, one sample.

Measured, each mode run alternately `--repeats` times (CPU time: user + system of this process,
the wall time beside it; see `benchmarks.common.Paired` for why CPU time):

- `workbench, batch B`: the scan's runs through `backends.local.run_rows` in forwards of up to B
  rows (`group_rows`), the donor read once per sample (`want_sources`): forwards issued are counted
  by the backend's `on_trace` hook, once per nnsight trace; `donor read per run`: batch 1 with the
  donor read again for every run (no values kept across forwards);
- `plain loop`: the same patches with plain PyTorch hooks on the transformers model: one forward
  of the donor keeping every layer's residual stream, then one hooked forward per cell.

Every mode's log-probabilities agree with the plain loop's (checked, 1e-4). Writes
benchmarks/results/scan.json and prints a markdown table (benchmarks/README.md, "Patching scans").

    python -m benchmarks.scan_bench [--model tiny-qwen3vl] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np
import torch

from benchmarks.common import RESULTS, median, pin_threads

GROUPS = ("vision", "text", "boundary", "last")


def _scan_plan(model: Any, batch: int) -> Any:
    from workbench.plan import compile_plan
    from workbench.spec import parse_spec

    layers = list(range(model.info.n_layers + 1))
    text = f"""\
name: scan-bench
models: [{model.model_id}]
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  trace: {{scan: {{clean: baseline, corrupt: blank, layers: {layers}, positions: [{', '.join(GROUPS)}]}}}}
capture: [{{site: logits}}]
store: {{path: unused.zarr}}
backend: {{batch_size: {batch}}}
"""
    return compile_plan(parse_spec(text), model.info)


def workbench_scan(model: Any, inputs: Any, batch: int, shared: bool = True) -> tuple[dict[str, np.ndarray], int, int]:
    """{run: next-token log-probs}, forwards issued, runs. shared=False: each forward reads its
    donor again (a memo per `run_rows` call, as on a path that keeps none across forwards)."""
    from workbench.backends.local import group_rows, run_rows, want_sources

    plan = _scan_plan(model, batch)
    jobs = [(inputs, c) for c in plan.conditions if c.name.startswith("trace[")]
    traces: list[str] = []
    memo = want_sources(jobs, {})
    out = {}
    for group in group_rows(jobs, batch, model.arch.per_token_keys):
        results = run_rows(model, [jobs[i] for i in group], plan, on_trace=traces.append, memo=memo if shared else None)
        out.update({jobs[i][1].name: r.run["logprobs"][0, 0] for i, r in zip(group, results)})
    return out, len(traces), len(jobs)


def plain_loop(model: Any, inputs: Any) -> dict[str, np.ndarray]:
    """The same patches with plain hooks: the donor's residual stream once, a forward per cell."""
    hf, arch = model.hf, model.arch
    layers = list(hf.get_submodule(arch.decoder_layers)) + [hf.get_submodule(arch.final_norm)]
    real, blank = inputs["real"], inputs["blank"]
    donor: dict[int, torch.Tensor] = {}

    def keep(l: int) -> Any:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            donor[l] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        return hook

    handles = [m.register_forward_pre_hook(keep(l), with_kwargs=True) for l, m in enumerate(layers)]
    model.prepare()
    with torch.inference_mode():
        hf(**real.encoding)
    for h in handles:
        h.remove()
    out = {}
    for l, module in enumerate(layers):
        for group in GROUPS:
            index = torch.as_tensor(_positions(group, blank.modality))

            def patch(module: Any, args: tuple, kwargs: dict, l: int = l, index: torch.Tensor = index) -> Any:
                x = (args[0] if args else kwargs["hidden_states"]).clone()
                x[:, index] = donor[l][:, index]
                return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

            handle = module.register_forward_pre_hook(patch, with_kwargs=True)
            model.prepare()
            with torch.inference_mode():
                logits = hf(**blank.encoding).logits[0, -1].float()
            handle.remove()
            out[f"trace[l={l},pos={group}]"] = torch.log_softmax(logits, -1).numpy()
    return out


def _positions(group: str, modality: np.ndarray) -> np.ndarray:
    from workbench.sites import position_index

    return position_index(group, modality)


def _timed(fn: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.process_time() - cpu, time.perf_counter() - wall


def run(model_id: str = "tiny-qwen3vl", repeats: int = 3, batches: tuple[int, ...] = (1, 16)) -> dict[str, Any]:
    from PIL import Image

    from workbench.data import Sample
    from workbench.models.model import load_model
    from workbench.runner import LazyInputs

    image = Image.new("RGB", (96, 64), (20, 40, 160))
    image.paste((250, 200, 0), (10, 10, 50, 40))
    model = load_model(model_id, device="cpu", dtype="float32", attn="sdpa")
    inputs = LazyInputs(model, Sample(id="bench/0", image=image, question="What colour is the square?",
                                      category="color"))
    reference = plain_loop(model, inputs)
    rows: dict[str, dict[str, Any]] = {}
    modes = [(f"workbench, batch {b}", lambda b=b: workbench_scan(model, inputs, b)) for b in batches]
    modes.insert(0, ("workbench, batch 1, donor read per run", lambda: workbench_scan(model, inputs, 1, shared=False)))
    modes.append(("plain loop", lambda: (plain_loop(model, inputs), None, None)))
    for _ in range(repeats):
        for name, fn in modes:
            (values, forwards, runs), cpu, wall = _timed(fn)
            worst = max(float(np.abs(values[k] - reference[k]).max()) for k in reference)
            assert worst < 1e-4, (name, worst)
            row = rows.setdefault(name, {"cpu_s": [], "wall_s": [], "forwards": forwards, "runs": runs or len(values)})
            row["cpu_s"].append(cpu)
            row["wall_s"].append(wall)
    plain = median(rows["plain loop"]["cpu_s"])
    for name, row in rows.items():
        row["forwards"] = row["forwards"] if row["forwards"] is not None else row["runs"] + 1
        row["cpu_vs_plain"] = median(row["cpu_s"]) / plain
        row["wall_vs_plain"] = median(row["wall_s"]) / median(rows["plain loop"]["wall_s"])
    return {"model": model_id, "layers": model.info.n_layers + 1, "groups": list(GROUPS), "repeats": repeats,
            "threads": torch.get_num_threads(), "modes": rows}


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: {result['layers']} residual layers x {len(result['groups'])} groups, one sample, "
             f"medians of {result['repeats']} alternating repeats, {result['threads']} thread(s)", "",
             "| mode | runs | forwards | CPU s | wall s | CPU vs plain loop | wall vs plain loop |",
             "|---|---|---|---|---|---|---|"]
    for name, row in result["modes"].items():
        lines.append(f"| {name} | {row['runs']} | {row['forwards']} | {median(row['cpu_s']):.2f} | "
                     f"{median(row['wall_s']):.2f} | {row['cpu_vs_plain']:.2f} | {row['wall_vs_plain']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-qwen3vl")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    result = run(args.model, args.repeats)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scan.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
    assert all(math.isfinite(r["cpu_vs_plain"]) for r in result["modes"].values())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
