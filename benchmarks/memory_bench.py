"""Peak memory against the number of samples of a run: a fresh `workbench run` subprocess per
sample count (1, 4, 16), its peak RSS read with `os.wait4` (the child's own `ru_maxrss`). The
samples are identical but for their ids (same image, same question): with the built-in set the
peak also follows the largest image among the first n samples, which is not accumulation.

A run streams: each (sample, condition) is written to the store before the next runs, so the peak
must not grow with the number of samples. Two model sets:

- `tiny`: the tiny offline models (captures are a few hundred KB per sample: the peak is the
  interpreter, torch and the libraries, so this only catches gross leaks);
- `wide`: a tiny-SmolVLM whose LLM has the real width and depth of SmolVLM2-2.2B (hidden 2048,
  24 layers) but narrow attention/MLP and a small vocabulary (~90M parameters, fast on a CPU),
  so every sample's residual capture is tens of MB: holding them would show at once
  (`accumulated_if_kept_mb` gives the growth that keeping every capture would cause).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from .analyses_bench import timed_child

WIDE_TEXT = dict(hidden_size=2048, intermediate_size=256, num_hidden_layers=24, num_attention_heads=4,
                 num_key_value_heads=4, head_dim=64)

SPEC = """\
name: bench-memory
models: [{models}]
data: {{source: jsonl, path: {data}, n: {n}}}
conditions:
  baseline: {{}}
  alpha:
    sweep: {{alpha: [3.0]}}
    interventions:
      - {{kind: scale, site: projector, factor: $alpha, positions: vision}}
capture:
  - {{site: layer, layers: all}}
store: {{path: {store}}}
"""


def build_wide(out_dir: Path) -> Path:
    """Save the `wide` model (tiny-SmolVLM, LLM at SmolVLM2-2.2B's width and depth) as a checkpoint."""
    import shutil

    import torch
    import transformers

    from workbench.models.tiny import tiny_model_dir

    src = tiny_model_dir("tiny-smolvlm")
    cfg = transformers.AutoConfig.from_pretrained(src)
    for key, value in WIDE_TEXT.items():
        setattr(cfg.text_config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.SmolVLMForConditionalGeneration._from_config(cfg, attn_implementation="eager")
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "tiny_model.json"):
            shutil.copy2(f, out_dir / f.name)
    return out_dir


def identical_samples(out_dir: Path, n: int) -> Path:
    """A JSONL data file of n samples with the same image and question (distinct ids): every
    sample costs the same, so a peak that grows with n is accumulation, not a bigger sample. The
    image is the largest of the first 16 built-in ones."""
    import json

    from workbench.data import builtin_samples

    sample = max(builtin_samples(16), key=lambda s: s.image.size[0] * s.image.size[1])
    sample.image.save(out_dir / "image.png")
    path = out_dir / "samples.jsonl"
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"same/{i:03d}", "image": "image.png", "question": sample.question}) + "\n")
    return path


def measure(models: list[str], counts: tuple[int, ...] = (1, 4, 16), workdir: Path | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    runs = {}
    with tempfile.TemporaryDirectory(prefix="bench-memory-", dir=workdir) as tmp:
        tmp = Path(tmp)
        data = identical_samples(tmp, max(counts))
        for n in counts:
            store = tmp / f"n{n}.zarr"
            spec = tmp / f"n{n}.yaml"
            spec.write_text(SPEC.format(models=", ".join(models), n=n, store=store, data=data))
            result = timed_child([sys.executable, "-m", "workbench.cli", "run", str(spec), "--no-progress", "--no-table"], env=env)
            if result["rc"] != 0:
                raise RuntimeError(f"workbench run failed (exit {result['rc']}):\n{result['output'][-3000:]}")
            runs[str(n)] = {"peak_rss_mb": round(result["max_rss_mb"], 1), "wall_s": round(result["wall_s"], 2),
                            "cpu_s": round(result["cpu_s"], 2), "captured_mb": round(captured_mb(store), 1)}
    peaks = [r["peak_rss_mb"] for r in runs.values()]
    first, last = runs[str(counts[0])], runs[str(counts[-1])]
    return {
        "models": models,
        "counts": list(counts),
        "runs": runs,
        "growth": round(max(peaks) / peaks[0] - 1, 4),   # max peak / peak of the smallest run - 1
        # growth after the first few samples (allocator and cache warm-up excluded)
        "growth_after_warmup": round(peaks[-1] / peaks[1] - 1, 4) if len(peaks) > 2 else None,
        "env": env or {},
        # what the peak would grow by if the run kept every capture in memory
        "accumulated_if_kept_mb": round(last["captured_mb"] - first["captured_mb"], 1),
    }


def captured_mb(store: Path) -> float:
    """float32 MB of the residual captures a run wrote (from `store_info`: tokens x layers x width)."""
    from workbench.store import store_info

    total = 0
    for model in store_info(store)["models"].values():
        for condition in model["conditions"].values():
            total += condition["tokens"] * len(condition["layers"]) * int(model["hidden_size"]) * 4
    return total / 1e6


def tiny(counts: tuple[int, ...] = (1, 4, 16), workdir: Path | None = None) -> dict[str, Any]:
    return measure(["tiny-smolvlm", "tiny-qwen3vl"], counts, workdir)


def wide(counts: tuple[int, ...] = (1, 4, 16), workdir: Path | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-wide-", dir=workdir) as tmp:
        model_dir = build_wide(Path(tmp) / "wide-smolvlm")
        out = measure([str(model_dir)], counts, workdir, env)
    out["models"] = ["wide-smolvlm (tiny-SmolVLM with an LLM of hidden 2048 x 24 layers, ~90M params)"]
    return out
