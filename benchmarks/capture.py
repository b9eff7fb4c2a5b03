"""Capture overhead: a workbench run of one (sample, condition) against a plain transformers forward.

Both arms use the same loaded module and the same encoded inputs (encoding is outside the timing):

- baseline: `model(**inputs, output_hidden_states=True[, output_attentions=True])` under
  `torch.inference_mode()`, hidden states stacked and copied to host float32 numpy (what any
  capture has to do to keep them);
- workbench: exactly the runner's inner loop (`workbench.runner.run_spec`): `run_condition`
  (one nnsight trace: residual stream at every layer, attention probabilities reduced to the
  stored variables, logits), `sample_variables`, `nonfinite_report`, `StoreWriter.write_sample`.
  The workbench time is also split into trace / post-processing / store write.

Runs alternate (ABBA) after a warm-up of each; ratios are of medians.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from .common import cpu_time, interleave, median

SPEC = """\
name: bench-capture
models: [tiny-smolvlm]
data: {{source: builtin, n: 1}}
conditions:
  baseline: {{}}
capture:
  - {{site: layer, layers: all}}
{attention}store: {{path: {store}}}
"""


def capture_spec(store: Path, attention: bool) -> Any:
    from workbench.spec import parse_spec

    attn = "  - {site: attention}\n" if attention else ""
    return parse_spec(SPEC.format(attention=attn, store=store), source="<benchmark capture spec>")


def measure(model: Any, *, attention: bool, repeats: int, warmup: int = 1, workdir: Path | None = None,
            clock: str = "cpu", sample_index: int = 0) -> dict[str, Any]:
    """Time baseline and workbench arms on `model` (a `WorkbenchModel`) for one built-in sample.

    clock: "cpu" (this process's CPU seconds: the primary measure on a shared CPU machine) or
    "wall" (on a GPU, where the CPU time of the host says little; CUDA is synchronized at the end
    of every arm). Both are recorded either way; `ratio` is the chosen one."""
    import numpy as np
    import torch

    from workbench.checks import nonfinite_report
    from workbench.data import builtin_samples
    from workbench.plan import compile_plan
    from workbench.backends.local import run_condition
    from workbench.runner import LazyInputs, sample_variables
    from workbench.store import StoreWriter, Variable

    if attention and model.hf.config._attn_implementation != "eager":
        raise ValueError("attention capture needs a model loaded with attn='eager'")
    with tempfile.TemporaryDirectory(prefix="bench-capture-", dir=workdir) as tmp:
        store_path = Path(tmp) / "capture.zarr"
        spec = capture_spec(store_path, attention)
        plan = compile_plan(spec, model.info)
        condition = plan.conditions[0]
        sample = builtin_samples(sample_index + 1)[sample_index]
        cuda = str(model.device).startswith("cuda")
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        now = cpu_time if clock == "cpu" else time.perf_counter
        inputs_by_image = LazyInputs(model, sample)
        inputs = inputs_by_image[condition.image]
        parts: dict[str, list[float]] = {"trace": [], "post": [], "write": []}

        def baseline(i: int) -> None:
            model.prepare()
            with torch.inference_mode():
                out = model.hf(**inputs.encoding, output_hidden_states=True, output_attentions=attention,
                               use_cache=False)  # no KV cache: the workbench builds none without decode steps
                # the residual stream to host float32, as any capture must; the attention
                # probabilities are materialized by the forward and left where they are
                hidden = torch.stack(out.hidden_states, dim=2)[0].to("cpu", torch.float32).numpy()
                assert not attention or len(out.attentions) == model.n_layers
            sync()
            assert hidden.shape[1] == model.n_layers + 1

        with StoreWriter(store_path) as store:
            store.ensure_model(model.model_id, model.describe())

            def workbench(i: int) -> None:
                t0 = now()
                result = run_condition(model, inputs_by_image, condition, plan)
                sync()
                t1 = now()
                variables = sample_variables(inputs, result, plan.capture.coords())
                problems = nonfinite_report(variables)
                variables["nonfinite"] = Variable(("run",), np.array([len(problems)], dtype=np.int64))
                t2 = now()
                store.write_sample(model.model_id, condition.name, f"{sample.id}#{i}", variables,
                                   condition_attrs=condition.store_attrs())
                t3 = now()
                if i >= 0:
                    parts["trace"].append(t1 - t0)
                    parts["post"].append(t2 - t1)
                    parts["write"].append(t3 - t2)

            paired = interleave(baseline, workbench, repeats, warmup)
    out = paired.summary()
    if clock == "wall":
        out["cpu_ratio"], out["ratio"] = out["ratio"], out["wall_ratio"]
    base = median(paired.baseline if clock == "cpu" else paired.baseline_wall)
    out.update({
        "n_tokens": inputs.n_tokens,
        "n_vision_tokens": int((inputs.modality == "vision").sum()),
        "n_layers": model.n_layers,
        "hidden_size": model.info.hidden_size,
        "attention": attention,
        "clock": clock,
        "device": str(model.device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "attn_implementation": model.hf.config._attn_implementation,
        "repeats": repeats,
        "trace_median_s": round(median(parts["trace"]), 6),
        "post_median_s": round(median(parts["post"]), 6),
        "write_median_s": round(median(parts["write"]), 6),
        "trace_ratio": round(median(parts["trace"]) / base, 4),
        "captured_mb_per_run": round(captured_bytes(model, inputs.n_tokens, attention) / 1e6, 2),
    })
    return out


def captured_bytes(model: Any, n_tokens: int, attention: bool) -> int:
    """float32 bytes stored per run: hidden (token, layer, dim) [+ vision mass and decode row]."""
    n = n_tokens * (model.n_layers + 1) * model.info.hidden_size * 4
    if attention:
        heads = model.hf.config.get_text_config().num_attention_heads
        n += 2 * n_tokens * model.n_layers * heads * 4
    return n


def tiny(models: tuple[str, ...] = ("tiny-smolvlm", "tiny-qwen3vl"), repeats: int = 20, warmup: int = 2,
         variants: tuple[str, ...] = ("layers", "layers+attention")) -> dict[str, Any]:
    """Capture overhead on the tiny models (nnsight's fixed cost per trace dominates here)."""
    from workbench.models.model import load_model

    results: dict[str, Any] = {}
    for model_id in models:
        for variant in variants:
            attention = variant == "layers+attention"
            model = load_model(model_id, device="cpu", dtype="float32", attn="eager" if attention else "sdpa")
            results[f"{model_id} | {variant}"] = {"model": model_id, "variant": variant,
                                                  **measure(model, attention=attention, repeats=repeats, warmup=warmup)}
            del model
    return results


def real_size_one(name: str, model: Any, *, repeats: int = 3, warmup: int = 1,
                  variants: tuple[str, ...] = ("layers+attention",)) -> dict[str, Any]:
    """Capture overhead on a real-size random-weight model (loaded with eager attention, so
    both arms of every variant run the same attention kernel)."""
    results: dict[str, Any] = {}
    for variant in variants:
        attention = variant == "layers+attention"
        results[f"{name} | {variant}"] = {"model": name, "variant": variant,
                                          **measure(model, attention=attention, repeats=repeats, warmup=warmup)}
    return results
