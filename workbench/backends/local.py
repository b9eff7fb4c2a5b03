"""The local backend: nnsight traces on this machine, under inference mode.

One (model, sample, condition) run is:
- the prompt forward: one trace with the condition's interventions and the captures, sites
  requested in execution order (nnsight serves requests in the order the forward reaches them);
- for `kv_swap`, the prompt forward stops one token short, the donor condition's prompt forward
  likewise, the donor's K/V at the selected positions are copied into the condition's cache, and
  the last prompt token runs as a one-token decode step reading that hybrid cache;
- then greedy decode steps, one trace each, reading logits and attention (interventions act on
  the prompt forward only: the projector runs only there).

This module, with the plan, interventions and captures it uses, also runs on NDIF servers
(shipped by value, see `workbench.backends.remote`), inside NDIF's module whitelist: it imports
only torch, numpy, nnsight, typing and workbench modules that do the same. So no dataclasses
(`Record` instead), no transformers: the KV cache is the one the model builds in the prompt
forward; and no fault hook of its own: the local runner passes `on_trace`.
"""

from __future__ import annotations

from typing import Any

import nnsight
import numpy as np
import torch

from ..capture import CapturePlan, SiteValues
from ..interventions import Normalize, needs_source
from ..plan import ConditionPlan, ModelPlan
from ..records import Record
from ..sites import order, position_index


class RunResult(Record):
    """Captures of one run: `tokens` {name: array} (rows = prompt positions), `run` {name: array}
    and `patches` {name: array} (rows = vision-tower patches)."""

    _fields = ("tokens", "run", "patches")
    _factories = {"tokens": dict, "run": dict, "patches": dict}
    _mutable = True


def _cache_kwargs(cache: Any) -> dict[str, Any]:
    # Passed as `past_key_values` (transformers 5.x maps it to `cache`): nnsight's input
    # preprocessing adds an all-ones attention mask of the new tokens' length unless it sees
    # that name, and such a mask would hide the cached tokens from a decode step.
    return {"past_key_values": cache, "use_cache": True}


def _operations(interventions: tuple, readers: list[Any], logits: bool) -> list[tuple[tuple, str, Any, int | None]]:
    ops = [(key, "intervene", item, layer) for item in interventions for key, layer in item.targets()]
    ops += [(key, "read", reader, layer) for reader in readers for key, layer in reader.targets()]
    if logits:
        ops.append((order("logits", None, 1), "logits", None, None))
    return sorted(ops, key=lambda op: op[0])


def trace(model: Any, encoding: dict[str, Any], inputs: Any, interventions: tuple = (),
          readers: list[Any] = (), logits: bool = False, cache: Any = None, keep_cache: bool = False,
          on_trace: Any = None) -> dict[Any, Any]:
    """One forward pass through nnsight: apply `interventions`, let `readers` save what they read,
    and save the last position's next-token log-probabilities if `logits`.

    cache: continue from this KV cache (decode steps; it is extended in place). Without one,
    keep_cache: also return the cache the model builds, as saved["cache"] (prompt forwards).
    on_trace: called with "trace" inside the trace (the local runner's fault drills)."""
    ops = _operations(interventions, list(readers), logits)
    if cache is not None:
        kwargs = {**encoding, **_cache_kwargs(cache)}
    else:
        kwargs = {**encoding, "use_cache": keep_cache}
    # outside inference mode nnsight keeps the autograd graph: 1.2-2.3x slower, GBs more memory
    with torch.inference_mode():
        with model.lm.trace(**kwargs):
            saved = nnsight.save({})
            if on_trace is not None:
                on_trace("trace")
            for _, role, item, layer in ops:
                if role == "intervene":
                    item.apply(model, inputs, layer)
                elif role == "read":
                    item.read(model, layer, saved, inputs)
                else:
                    last = model.module(model.arch.lm_head)[0].output[0, -1]
                    saved[("logprobs", None)] = [torch.log_softmax(last.detach().to("cpu", torch.float32), -1)]
            if cache is None and keep_cache:
                saved["cache"] = model.lm.output.past_key_values
    return saved


def _stack_layers(saved: dict, name: str, layers: tuple[int, ...], dim: int = 1) -> torch.Tensor:
    return torch.stack([torch.cat(saved[(name, l)], dim=0) for l in layers], dim=dim)


def _truncate(inputs: Any, n: int, per_token: tuple) -> Any:
    """The inputs of the first n prompt tokens (image inputs kept whole), labels included, so
    positions named by modality select within those n. per_token: the family's per-token input
    keys (`Architecture.per_token_keys`)."""
    encoding = {k: (v[:, :n] if k in per_token else v) for k, v in inputs.encoding.items()}
    return inputs.replace(encoding=encoding, input_ids=inputs.input_ids[:n], modality=inputs.modality[:n])


def _decode_encoding(model: Any, token: torch.Tensor) -> dict[str, Any]:
    """Inputs of a one-token decode step. No attention mask and no position ids: the model
    counts positions from its cache (Qwen3-VL adds the M-RoPE offset it kept from the prompt)."""
    return {"input_ids": token.view(1, 1).to(model.device)}


def _swap_kv(cache: Any, donor: Any, positions: np.ndarray, layers: tuple[int, ...]) -> None:
    """Copy the donor cache's keys and values at `positions` of `layers` into `cache`."""
    index = torch.as_tensor(positions, dtype=torch.long)
    for l in layers:
        target, source = cache.layers[l], donor.layers[l]
        target.keys[:, :, index] = source.keys[:, :, index].to(target.keys.device)
        target.values[:, :, index] = source.values[:, :, index].to(target.values.device)


def _resolve(model: Any, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
             on_trace: Any = None) -> tuple[Any, ...]:
    """The condition's interventions ready to run: defaults resolved from the model, values from
    source conditions (patch, add direction_from) read by running those conditions first (the
    spec refuses source cycles, so this recursion ends at any depth)."""
    resolved = []
    inputs = inputs_by_image[condition.image]
    for item in condition.interventions:
        if isinstance(item, Normalize) and isinstance(item.target, str):
            item = item.replace(target=model.text_embedding_norm())
        source = needs_source(item)
        if source:
            reader = SiteValues(item.site, item.layers, item.positions)
            source_plan = plan.condition(source)
            source_items = _resolve(model, inputs_by_image, source_plan, plan, on_trace)
            model.prepare()
            values = trace(model, inputs_by_image[source_plan.image].encoding, inputs_by_image[source_plan.image],
                           source_items, [reader], on_trace=on_trace)
            model.prepare()
            own = trace(model, inputs.encoding, inputs, (), [reader], on_trace=on_trace)
            layers = item.layers if item.site == "layer" else (None,)
            item = item.bind({l: values[("site", item.site, l)] for l in layers},
                             {l: own[("site", item.site, l)] for l in layers})
        resolved.append(item)
    return tuple(resolved)


@torch.inference_mode()  # the caches it edits between traces are inference tensors
def run_condition(model: Any, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
                  on_trace: Any = None) -> RunResult:
    """Run one (sample, condition) and return its captures as numpy arrays. `on_trace`: see `trace`."""
    captures = plan.capture
    inputs = inputs_by_image[condition.image]
    n = inputs.n_tokens
    interventions = _resolve(model, inputs_by_image, condition, plan, on_trace)
    readers = captures.readers()
    model.prepare()
    if condition.kv_swap is None:
        head = trace(model, inputs.encoding, inputs, interventions, readers, captures.decoding,
                     keep_cache=True, on_trace=on_trace)
        cache = head.pop("cache")
        parts = [head]
    else:
        head_inputs = _truncate(inputs, n - 1, model.arch.per_token_keys)
        head = trace(model, head_inputs.encoding, head_inputs, interventions, readers, False,
                     keep_cache=True, on_trace=on_trace)
        cache = head.pop("cache")
        swap = condition.kv_swap
        donor = plan.condition(swap.donor)
        donor_inputs = inputs_by_image[donor.image]
        donor_items = _resolve(model, inputs_by_image, donor, plan, on_trace)
        model.prepare()
        donor_head = _truncate(donor_inputs, n - 1, model.arch.per_token_keys)
        donor_cache = trace(model, donor_head.encoding, donor_head, donor_items, keep_cache=True,
                            on_trace=on_trace).pop("cache")
        _swap_kv(cache, donor_cache, position_index(swap.positions, inputs.modality[: n - 1]), swap.layers)
        last = torch.as_tensor(inputs.input_ids[-1])
        # the vision tower ran in the head: the one-token tail has nothing of it to read
        tail_readers = [r for r in readers if not getattr(r, "prompt_only", False)]
        tail = trace(model, _decode_encoding(model, last), inputs, (), tail_readers, True, cache, on_trace=on_trace)
        parts = [head, tail]
    result = RunResult()
    _collect_prompt(result, parts, captures, cache, n)
    _decode(model, inputs, captures, cache, parts[-1], result, on_trace)
    return result


def _collect_prompt(result: RunResult, parts: list[dict], captures: CapturePlan, cache: Any, n: int) -> None:
    """Token rows of the prompt: residual, K/V and prefill attention mass (over 1 or 2 traces)."""
    merged: dict[Any, list[torch.Tensor]] = {}
    for part in parts:
        for key, tensors in part.items():
            merged.setdefault(key, []).extend(tensors)
    if captures.residual:
        result.tokens["hidden"] = _stack_layers(merged, "hidden", captures.residual.layers).numpy()
    if captures.attention:
        result.tokens["prefill_vision_mass"] = _stack_layers(merged, "vision_mass", captures.attention.layers).numpy()
    if captures.kv:
        result.tokens.update(captures.kv.read_cache(cache, n))
    for output in captures.outputs:
        getattr(result, output.rows).update(output.collect(merged))


def _decode(model: Any, inputs: Any, captures: CapturePlan, cache: Any, last: dict, result: RunResult,
            on_trace: Any = None) -> None:
    """Greedy decode: step 0 is the prompt's own prediction; steps 1.. run one token each."""
    if not captures.decoding:
        return
    n = inputs.n_tokens
    logprobs, rows, step_saved = [], [], last
    for step in range(captures.max_new_tokens):
        if step > 0:
            token = torch.as_tensor(int(logprobs[-1].argmax()))
            encoding = _decode_encoding(model, token)
            attention = [captures.attention] if captures.attention else []
            step_saved = trace(model, encoding, inputs, (), attention, True, cache, on_trace=on_trace)
        logprobs.append(step_saved[("logprobs", None)][-1])
        if captures.attention:
            # the step's query row over the prompt keys: (key, layer, head)
            rows.append(torch.stack([step_saved[("last_row", l)][-1][:n] for l in captures.attention.layers], dim=1))
    stacked = torch.stack(logprobs)                                   # (step, vocab)
    if captures.logits:
        result.run["logprobs"] = stacked[None].numpy()
        result.run["generated"] = stacked.argmax(-1)[None].numpy().astype(np.int64)
    if captures.attention:
        result.tokens["decode_attention"] = torch.stack(rows, dim=1).numpy()  # (token, step, layer, head)
