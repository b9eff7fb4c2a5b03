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
from ..interventions import Normalize, apply_rows, needs_source
from ..models.protocol import ModelLike
from ..plan import ConditionPlan, ModelPlan
from ..records import Record
from ..sites import batch_rows, order, position_index


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


class Row(Record):
    """One condition's share of a (possibly batched) forward: its inputs, resolved interventions,
    readers, and whether it wants the last position's log-probabilities."""

    _fields = ("inputs", "interventions", "readers", "logits")
    _defaults = {"interventions": (), "readers": (), "logits": False}


def trace(model: ModelLike, encoding: dict[str, Any], inputs: Any, interventions: tuple = (),
          readers: list[Any] = (), logits: bool = False, cache: Any = None, keep_cache: bool = False,
          on_trace: Any = None) -> dict[Any, Any]:
    """One forward pass through nnsight: apply `interventions`, let `readers` save what they read,
    and save the last position's next-token log-probabilities if `logits`.

    cache: continue from this KV cache (decode steps; it is extended in place). Without one,
    keep_cache: also return the cache the model builds, as saved["cache"] (prompt forwards).
    on_trace: called with "trace" inside the trace (the local runner's fault drills)."""
    saved, built = trace_rows(model, encoding, [Row(inputs, interventions, list(readers), logits)], cache,
                              keep_cache, on_trace)
    if built is not None:
        saved[0]["cache"] = built
    return saved[0]


def trace_rows(model: ModelLike, encoding: dict[str, Any], rows: list[Row], cache: Any = None, keep_cache: bool = False,
               on_trace: Any = None) -> tuple[list[dict[Any, Any]], Any]:
    """One forward of `encoding`, whose batch row r is `rows[r]`: each row's interventions edit
    and its readers read only that row (`workbench.sites.batch_rows`). Returns each row's saved
    values and, with keep_cache (no `cache` given), the cache the forward built."""
    batched = len(rows) > 1
    ops = sorted(((key, r, role, item, layer) for r, row in enumerate(rows)
                  for key, role, item, layer in _operations(row.interventions, list(row.readers), row.logits)),
                 key=lambda op: (op[0], op[1]))
    if cache is not None:
        kwargs = {**encoding, **_cache_kwargs(cache)}
    else:
        kwargs = {**encoding, "use_cache": keep_cache}
    # outside inference mode nnsight keeps the autograd graph: 1.2-2.3x slower, GBs more memory
    with torch.inference_mode():
        with model.lm.trace(**kwargs):
            saved = nnsight.save([{} for _ in rows])
            if on_trace is not None:
                on_trace("trace")
            edits = []  # interventions at one key, all rows: applied together (see apply_rows)
            for i, (key, r, role, item, layer) in enumerate(ops):
                where = (r, len(rows)) if batched else None
                if role == "intervene":
                    edits.append((item, rows[r].inputs, layer, where))
                    if i + 1 == len(ops) or ops[i + 1][0] != key or ops[i + 1][2] != role:
                        apply_rows(model, edits)
                        edits = []
                elif role == "read":
                    item.read(model, layer, saved[r], rows[r].inputs, where)
                else:
                    last = batch_rows(model.module(model.arch.lm_head)[0].output, where)[0, -1]
                    saved[r][("logprobs", None)] = [torch.log_softmax(last.detach().to("cpu", torch.float32), -1)]
            if cache is None and keep_cache:
                saved[0]["cache"] = model.lm.output.past_key_values
    return saved, saved[0].pop("cache", None)


def _stack_layers(saved: dict, name: str, layers: tuple[int, ...], dim: int = 1) -> torch.Tensor:
    return torch.stack([torch.cat(saved[(name, l)], dim=0) for l in layers], dim=dim)


def _truncate(inputs: Any, n: int, per_token: tuple) -> Any:
    """The inputs of the first n prompt tokens (image inputs kept whole), labels included, so
    positions named by modality select within those n. per_token: the family's per-token input
    keys (`Architecture.per_token_keys`)."""
    encoding = {k: (v[:, :n] if k in per_token else v) for k, v in inputs.encoding.items()}
    return inputs.replace(encoding=encoding, input_ids=inputs.input_ids[:n], modality=inputs.modality[:n])


def _decode_encoding(model: ModelLike, token: torch.Tensor) -> dict[str, Any]:
    """Inputs of a one-token decode step, one token per batch row. No attention mask and no
    position ids: the model counts positions from its cache (Qwen3-VL adds the M-RoPE offset it
    kept from the prompt); the rows of a batch have equal lengths, so no padding either."""
    return {"input_ids": token.view(-1, 1).to(model.device)}


def _swap_kv(cache: Any, donor: Any, positions: np.ndarray, layers: tuple[int, ...],
             parts: tuple[str, ...] = ("keys", "values")) -> None:
    """Copy the donor cache's `parts` ("keys" and/or "values", the attribute names of a cache
    layer) at `positions` of `layers` into `cache`; every other entry stays this condition's."""
    index = torch.as_tensor(positions, dtype=torch.long)
    for l in layers:
        target, source = cache.layers[l], donor.layers[l]
        for part in parts:
            mine = getattr(target, part)
            mine[:, :, index] = getattr(source, part)[:, :, index].to(mine.device)


def _resolve(model: ModelLike, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
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


def batches(inputs_by_image: dict[str, Any], conditions: list[ConditionPlan], batch_size: int) -> list[list[ConditionPlan]]:
    """`conditions` (one sample's) grouped into forwards of at most `batch_size` rows, in order of
    their first condition. Rows of one forward share the token sequence and the shape of every
    input (real and blank image alike), so no padding is needed and each row's tensors are an
    equal block of the batch. A kv_swap condition runs alone (its cache is edited between a
    truncated prefill and a decode step of its own)."""
    groups: dict[Any, list[list[ConditionPlan]]] = {}
    out: list[list[ConditionPlan]] = []
    for condition in conditions:
        if condition.kv_swap is not None or batch_size <= 1:
            out.append([condition])
            continue
        inputs = inputs_by_image[condition.image]
        key = (tuple(int(t) for t in inputs.input_ids),
               tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(inputs.encoding.items())))
        open_groups = groups.setdefault(key, [])
        if not open_groups or len(open_groups[-1]) == batch_size:
            open_groups.append([])
            out.append(open_groups[-1])
        open_groups[-1].append(condition)
    return out


def stack_encodings(encodings: list[dict[str, Any]]) -> dict[str, Any]:
    """One encoding whose batch rows are `encodings` (equal shapes): every tensor concatenated on
    its first dimension, which is the batch for token inputs and the image (or flat patch) axis
    for image inputs, so each row keeps an equal block."""
    if len(encodings) == 1:
        return encodings[0]
    return {k: torch.cat([e[k] for e in encodings], dim=0) for k in encodings[0]}


def run_conditions(model: ModelLike, inputs_by_image: dict[str, Any], conditions: list[ConditionPlan], plan: ModelPlan,
                   batch_size: int = 1, on_trace: Any = None) -> dict[str, RunResult]:
    """Run one sample's `conditions`, up to `batch_size` of them per forward (`batches`); each
    result equals its unbatched `run_condition` (to float rounding)."""
    results = {}
    for group in batches(inputs_by_image, conditions, batch_size):
        for condition, result in zip(group, run_batch(model, inputs_by_image, group, plan, on_trace)):
            results[condition.name] = result
    return {c.name: results[c.name] for c in conditions}


def run_condition(model: ModelLike, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
                  on_trace: Any = None) -> RunResult:
    """Run one (sample, condition) and return its captures as numpy arrays. `on_trace`: see `trace`."""
    return run_batch(model, inputs_by_image, [condition], plan, on_trace)[0]


def run_batch(model: ModelLike, inputs_by_image: dict[str, Any], group: list[ConditionPlan], plan: ModelPlan,
              on_trace: Any = None) -> list[RunResult]:
    """The conditions of `group` (one, or several that `batches` put together) in one forward.
    Inference mode inside, not as a decorator: the function travels to NDIF by its source."""
    with torch.inference_mode():  # the caches edited between traces are inference tensors
        if group[0].kv_swap is not None:
            return [_run_kv_swap(model, inputs_by_image, group[0], plan, on_trace)]
        captures = plan.capture
        readers = captures.readers()
        rows = [Row(inputs_by_image[c.image], _resolve(model, inputs_by_image, c, plan, on_trace), readers,
                    captures.decoding) for c in group]
        model.prepare()
        saved, cache = trace_rows(model, stack_encodings([row.inputs.encoding for row in rows]), rows,
                                  keep_cache=True, on_trace=on_trace)
        results = [RunResult() for _ in rows]
        for r, result in enumerate(results):
            _collect_prompt(result, [saved[r]], captures, cache, rows[r].inputs.n_tokens, r)
        _decode(model, [row.inputs for row in rows], captures, cache, saved, results, on_trace)
        return results


def _run_kv_swap(model: ModelLike, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
                 on_trace: Any = None) -> RunResult:
    """A kv_swap condition: prefill all but the last token, swap the donor's K/V in, decode it."""
    captures = plan.capture
    inputs = inputs_by_image[condition.image]
    n = inputs.n_tokens
    interventions = _resolve(model, inputs_by_image, condition, plan, on_trace)
    readers = captures.readers()
    model.prepare()
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
    _swap_kv(cache, donor_cache, position_index(swap.positions, inputs.modality[: n - 1]), swap.layers, swap.parts)
    last = torch.as_tensor(inputs.input_ids[-1])
    # the vision tower ran in the head: the one-token tail has nothing of it to read
    tail_readers = [r for r in readers if not getattr(r, "prompt_only", False)]
    tail = trace(model, _decode_encoding(model, last), inputs, (), tail_readers, True, cache, on_trace=on_trace)
    result = RunResult()
    _collect_prompt(result, [head, tail], captures, cache, n)
    _decode(model, [inputs], captures, cache, [tail], [result], on_trace)
    return result


def _collect_prompt(result: RunResult, parts: list[dict], captures: CapturePlan, cache: Any, n: int, row: int = 0) -> None:
    """Token rows of the prompt: residual, K/V (batch row `row` of the cache) and prefill
    attention mass (over 1 or 2 traces)."""
    merged: dict[Any, list[torch.Tensor]] = {}
    for part in parts:
        for key, tensors in part.items():
            merged.setdefault(key, []).extend(tensors)
    if captures.residual:
        result.tokens["hidden"] = _stack_layers(merged, "hidden", captures.residual.layers).numpy()
    if captures.attention:
        result.tokens["prefill_vision_mass"] = _stack_layers(merged, "vision_mass", captures.attention.layers).numpy()
    if captures.kv:
        result.tokens.update(captures.kv.read_cache(cache, n, row))
    for output in captures.outputs:
        getattr(result, output.rows).update(output.collect(merged))


def _decode(model: ModelLike, inputs: list[Any], captures: CapturePlan, cache: Any, last: list[dict],
            results: list[RunResult], on_trace: Any = None) -> None:
    """Greedy decode of every batch row (`inputs[r]`, `results[r]`): step 0 is the prompt's own
    prediction (`last[r]`); steps 1.. feed each row's token back, one token per row per step."""
    if not captures.decoding:
        return
    attention = [captures.attention] if captures.attention else []
    logprobs: list[list[torch.Tensor]] = [[] for _ in inputs]
    rows: list[list[torch.Tensor]] = [[] for _ in inputs]
    step_saved = last
    for step in range(captures.max_new_tokens):
        if step > 0:
            tokens = torch.stack([torch.as_tensor(int(lp[-1].argmax())) for lp in logprobs])
            step_rows = [Row(x, (), attention, True) for x in inputs]
            step_saved, _ = trace_rows(model, _decode_encoding(model, tokens), step_rows, cache, on_trace=on_trace)
        for r, x in enumerate(inputs):
            logprobs[r].append(step_saved[r][("logprobs", None)][-1])
            if captures.attention:
                # the step's query row over the prompt keys: (key, layer, head)
                n = x.n_tokens
                rows[r].append(torch.stack([step_saved[r][("last_row", l)][-1][:n] for l in captures.attention.layers], dim=1))
    for r, result in enumerate(results):
        stacked = torch.stack(logprobs[r])                                # (step, vocab)
        if captures.logits:
            result.run["logprobs"] = stacked[None].numpy()
            result.run["generated"] = stacked.argmax(-1)[None].numpy().astype(np.int64)
        if captures.attention:
            result.tokens["decode_attention"] = torch.stack(rows[r], dim=1).numpy()  # (token, step, layer, head)
