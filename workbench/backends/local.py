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

from typing import TYPE_CHECKING, Any

import nnsight
import numpy as np
import torch

from ..capture import CapturePlan, SiteValues, saved_copy
from ..interventions.base import apply_rows, needs_source
from ..models.protocol import ModelLike
from ..plan import ConditionPlan, ModelPlan
from ..records import Record
from ..sites import BatchRow, is_projector_site, order, position_index, site, token_rows
from ..sites.attention import text_received

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..interventions.base import Intervention
    from ..models.model import ModelInputs


class RunResult(Record):
    """Captures of one run: `tokens` {name: array} (rows = prompt positions), `run` {name: array}
    and `patches` {name: array} (rows = vision-tower patches)."""

    tokens: dict[str, np.ndarray]
    run: dict[str, np.ndarray]
    patches: dict[str, np.ndarray]
    _fields = ("tokens", "run", "patches")
    _factories = {"tokens": dict, "run": dict, "patches": dict}
    _mutable = True


def _cache_kwargs(cache: Any) -> dict[str, Any]:
    # Passed as `past_key_values` (transformers 5.x maps it to `cache`): nnsight's input
    # preprocessing adds an all-ones attention mask of the new tokens' length unless it sees
    # that name, and such a mask would hide the cached tokens from a decode step.
    return {"past_key_values": cache, "use_cache": True}


def _operations(interventions: tuple, readers: list[Any], logits: bool,
                vision_first: bool = False) -> list[tuple[tuple, str, Any, int | None]]:
    """Every edit and read of a forward in execution order. vision_first: the image runs through
    the tower and the connector before the token embedding (a cross-attention family: transformers
    5.25 models/mllama/modeling_mllama.py `MllamaModel.forward`), so the embedding's stage sorts
    after the connector's."""
    ops = [(key, "intervene", item, layer) for item in interventions for key, layer in item.targets()]
    ops += [(key, "read", reader, layer) for reader in readers for key, layer in reader.targets()]
    if logits:
        ops.append((order("logits", None, 1), "logits", None, None))
    connector = order("projector")[0]

    if vision_first:
        ops = [((connector + 0.5, *k[1:]) if k[0] == 0 else k, *rest) for k, *rest in ops]
    return sorted(ops, key=lambda op: op[0])


class Job(Record):
    """One run of a forward: a sample's model inputs by image mode, and the condition run on them.
    A `Record`, not a NamedTuple: a NamedTuple class pickled by value unpickles through
    `_collections._tuplegetter`, a module outside NDIF's whitelist (`shipping.NDIF_MODULES`)."""

    inputs_by_image: dict[str, ModelInputs]
    condition: ConditionPlan
    _fields = ("inputs_by_image", "condition")


class Row(Record):
    """One condition's share of a (possibly batched) forward: its inputs, resolved interventions,
    readers, whether it wants the last position's log-probabilities, and its real tokens in this
    forward when rows are right-padded to the longest (`length`; None: every position)."""

    inputs: ModelInputs
    interventions: tuple[Intervention, ...]
    readers: list[Any]
    logits: bool
    length: int | None
    _fields = ("inputs", "interventions", "readers", "logits", "length")
    _defaults = {"interventions": (), "readers": (), "logits": False, "length": None}


def _image_units(rows: list[Row]) -> tuple[int, ...] | None:
    """Each row's `pixel_values` rows where they differ (Qwen's flat patches, InternVL's tiles: the
    image-side tensors split in that proportion, `workbench.sites.batch_rows`); None: equal blocks."""
    units = tuple(int(row.inputs.encoding["pixel_values"].shape[0]) if "pixel_values" in row.inputs.encoding else 0
                  for row in rows)
    return None if len(set(units)) <= 1 else units


def trace(model: ModelLike, encoding: dict[str, Any], inputs: Any, interventions: tuple = (),
          readers: Sequence[Any] = (), logits: bool = False, cache: Any = None, keep_cache: bool = False,
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
    units = _image_units(rows) if batched else None
    where_of = [BatchRow(r, len(rows), units, row.length) if batched else None for r, row in enumerate(rows)]
    ops = sorted(((key, r, role, item, layer) for r, row in enumerate(rows)
                  for key, role, item, layer in _operations(row.interventions, list(row.readers), row.logits,
                                                                bool(model.arch.cross_attention_layers))),
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
                where = where_of[r]
                if role == "intervene":
                    edits.append((item, rows[r].inputs, layer, where))
                    if i + 1 == len(ops) or ops[i + 1][0] != key or ops[i + 1][2] != role:
                        apply_rows(model, edits)
                        edits = []
                elif role == "read":
                    item.read(model, layer, saved[r], rows[r].inputs, where)
                else:
                    last = token_rows(model.module(model.arch.lm_head)[0].output, where)[0, -1]  # its last real position
                    last = model.info.head_logits(last)
                    saved[r][("logprobs", None)] = [torch.log_softmax(saved_copy(last), -1)]
            if cache is None and keep_cache:
                saved[0]["cache"] = model.lm.output.past_key_values
    built = saved[0].pop("cache", None)
    return [_on_host(row) for row in saved], built


def _on_host(saved: dict[Any, Any]) -> dict[Any, Any]:
    """A row's saved values moved to the host, now that the forward is done: the reads left them
    on the model's device (`capture.saved_copy`); on the CPU this moves nothing."""
    return {key: [_host(v) for v in value] if isinstance(value, list) else _host(value) for key, value in saved.items()}


def _host(value: Any) -> Any:
    return value.to("cpu") if isinstance(value, torch.Tensor) else value


def _stack_layers(saved: dict, name: str, layers: tuple[int, ...], dim: int = 1) -> torch.Tensor:
    return torch.stack([torch.cat(saved[(name, l)], dim=0) for l in layers], dim=dim)


def _truncate(inputs: Any, n: int, per_token: tuple) -> Any:
    """The inputs of the first n prompt tokens (image inputs kept whole), labels included, so
    positions named by modality select within those n. per_token: the family's per-token input
    keys (`Architecture.per_token_keys`)."""
    encoding = {k: (v[:, :n] if k in per_token else v) for k, v in inputs.encoding.items()}
    geometry = {k: v[:n] for k, v in inputs.geometry.items()} if inputs.geometry is not None else None
    return inputs.replace(encoding=encoding, input_ids=inputs.input_ids[:n], modality=inputs.modality[:n],
                          geometry=geometry)


def cross_attention_rows(inputs: list[Any]) -> torch.Tensor | None:
    """The cross-attention mask row of each batch row's last prompt token, (batch, 1, images,
    tiles), which a generated token repeats (transformers 5.25 models/mllama/modeling_mllama.py,
    `_update_model_kwargs_for_generation`); None for a family without one. Without it a decode
    step would attend to every tile, the padding tiles of an image of fewer tiles included."""
    masks = [x.encoding.get("cross_attention_mask") for x in inputs]
    if any(m is None for m in masks):
        return None
    return torch.cat([m[:, x.n_tokens - 1:x.n_tokens] for m, x in zip(masks, inputs)])


def _decode_encoding(model: ModelLike, token: torch.Tensor, prompt_mask: torch.Tensor | None = None,
                     step: int = 1, cross_rows: torch.Tensor | None = None) -> dict[str, Any]:
    """Inputs of decode step `step` (>= 1), one token per batch row. Rows of equal length: no
    attention mask and no position ids, the model counts positions from its cache (Qwen3-VL adds
    the M-RoPE offset it kept from the prompt).

    Right-padded rows (`prompt_mask`: the prompt forward's (batch, longest) mask): every row's
    new token sits after the pads in the cache, so the mask hides the pads and the positions are
    each row's own, n + step - 1 (PaliGemma's are 1-based: `Architecture.position_offset`). M-RoPE
    families after a prompt with an image add the rope delta the prompt forward kept per row
    (`rope_deltas`), as the model does when it counts from the cache (its own mask-based count
    returns every key's position, not the new token's). Plain (batch, 1) ids: a generated token's
    M-RoPE components are equal, the model expands them so, and nnsight splits a (3, batch, 1)
    tensor into 3 rows."""
    encoding = {"input_ids": token.view(-1, 1).to(model.device)}
    if cross_rows is not None:   # `cross_attention_rows`: Mllama's image tiles a new token may read
        encoding["cross_attention_mask"] = cross_rows.to(model.device)
    if prompt_mask is None:
        return encoding
    generated = prompt_mask.new_ones(prompt_mask.shape[0], step)
    encoding["attention_mask"] = torch.cat([prompt_mask, generated], dim=1)
    positions = prompt_mask.sum(dim=1, keepdim=True) + (step - 1 + model.arch.position_offset)
    # decode steps run where the weights are (WorkbenchModel, the server's ServerModel: both have `hf`)
    deltas = getattr(model.hf.model, "rope_deltas", None) if model.arch.mrope else None  # type: ignore[attr-defined]
    if deltas is not None:
        positions = positions + deltas.to(positions.device)
    encoding["position_ids"] = positions
    return encoding


def _swap_kv(cache: Any, donor: Any, positions: np.ndarray, layers: tuple[int, ...],
             parts: tuple[str, ...] = ("keys", "values"), cross: tuple[int, ...] = ()) -> None:
    """Copy the donor cache's `parts` ("keys" and/or "values", the attribute names of a cache
    layer) at `positions` of `layers` into `cache`; every other entry stays this condition's.
    A cross-attention layer's (`cross`: Mllama's) entries are the image's, every row copied."""
    index = torch.as_tensor(positions, dtype=torch.long)
    for l in layers:
        target, source = cache.layers[l], donor.layers[l]
        for part in parts:
            mine = getattr(target, part)
            theirs = getattr(source, part).to(mine.device)
            if l in cross:
                mine.copy_(theirs)
            else:
                mine[:, :, index] = theirs[:, :, index]


def _resolve(model: ModelLike, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
             on_trace: Any = None, memo: dict[Any, Any] | None = None) -> tuple[Any, ...]:
    """The condition's interventions ready to run: defaults resolved from the model, values from
    source conditions (patch, add direction_from) read by running those conditions first (the
    spec refuses source cycles, so this recursion ends at any depth).

    memo: values already read for this sample (`SourceReads`): a patching scan's runs all read one
    donor, whose forward then runs once per sample, not once per run."""
    resolved = []
    inputs = inputs_by_image[condition.image]
    memo = {} if memo is None else memo
    for item in condition.interventions:
        item = item.resolve(model)
        source = needs_source(item)
        if source:
            layers: tuple[int | None, ...] = (item.layers or ()) if site(item.site).index else (None,)
            index = position_index(item.positions, inputs.modality)
            source_plan = plan.condition(source)
            values = _site_values(model, inputs_by_image, source_plan, item.site, layers, plan, on_trace, memo)
            own = (_site_values(model, inputs_by_image, ConditionPlan(f"{condition.image} image", {}, condition.image),
                                item.site, layers, plan, on_trace, memo) if item.reads_own else {})
            item = item.bind({l: values[l][index] for l in layers}, {l: own[l][index] for l in own})
        resolved.append(item)
    return tuple(resolved)


def _site_values(model: ModelLike, inputs_by_image: dict[str, Any], condition: ConditionPlan, name: str,
                 layers: tuple, plan: ModelPlan, on_trace: Any, memo: dict[Any, Any]) -> dict[Any, torch.Tensor]:
    """{layer: (positions, width)} of site `name` at every position of `condition`'s forward on this
    sample, from `memo` where it holds them; else one forward reading every layer `memo` was told
    this sample will want of that site (`SourceReads.want`), or `layers`."""
    key = (id(inputs_by_image), condition.name, name)
    held = memo.setdefault(key, {})
    if not set(layers) <= set(held):
        wanted = tuple(sorted(set(layers) | set(memo.get(("want",) + key, ())) - set(held), key=_layer_key))
        reader = SiteValues(name, None if wanted == (None,) else wanted, "all")
        items = _resolve(model, inputs_by_image, condition, plan, on_trace, memo)
        source_inputs = inputs_by_image[condition.image]
        model.prepare()
        values = trace(model, source_inputs.encoding, source_inputs, items, [reader], on_trace=on_trace)
        held.update({l: values[("site", name, l)] for l in wanted})
    return held


def _layer_key(layer: int | None) -> int:
    return -1 if layer is None else layer


def want_sources(jobs: Sequence[Job], memo: dict[Any, Any]) -> dict[Any, Any]:
    """Tell `memo` every (sample, source, site) layer the jobs' sources will be read at, so each
    source's forward reads them all at once (a scan's runs patch one layer each)."""
    for job in jobs:
        inputs_by_image, condition = job.inputs_by_image, job.condition
        for item in condition.interventions:
            source = needs_source(item)
            if not source:
                continue
            layers = item.layers if site(item.site).index else (None,)
            keys = [(id(inputs_by_image), source, item.site)]
            if getattr(item, "reads_own", True):
                keys.append((id(inputs_by_image), f"{condition.image} image", item.site))
            for key in keys:
                wanted = memo.setdefault(("want",) + key, set())
                wanted.update(layers or ())
    return memo


PER_TOKEN = ("input_ids", "attention_mask")  # `Architecture.per_token_keys`' default


def stack_key(inputs: Any, per_token: tuple = PER_TOKEN, pad_requires: tuple = ()) -> tuple:
    """What the rows of one forward must share: the names and dtypes of their inputs and, for
    every input that is not per token, its shape past the first dim (concatenated on the first:
    SmolVLM/Idefics2 `(1, tiles, C, H, W)` need the same tiles and size, Qwen's flat patches and
    InternVL's tiles only the same patch shape). Per-token inputs may differ in length: they are
    right-padded (`stack_encodings`), unless the row lacks an input of `pad_requires` (see
    `pad_requirements`): then only rows of its length share its forward."""
    key = tuple((k, str(v.dtype), None if k in per_token else tuple(v.shape[1:]))
                for k, v in sorted(inputs.encoding.items()))
    return key if all(k in inputs.encoding for k in pad_requires) else key + (("length", inputs.n_tokens),)


def pad_requirements(model: ModelLike) -> tuple:
    """Inputs a row needs before it can be padded. PaliGemma (prefix LM) without an image has no
    `token_type_ids`: unpadded, sdpa then runs its prompt with no mask at all (bidirectional, as
    its attention is not causal), which a padding mask would turn causal (measured: 0.07 apart
    after one layer), so such rows are batched only with rows of their own length. A
    cross-attention family's (batch, token, image, tile) `cross_attention_mask` is not padded
    (`stack_encodings` pads (batch, token) inputs): its rows share forwards of their own length
    only (a requirement no row meets)."""
    if model.arch.cross_attention_layers:
        return ("cross_attention_mask (batch, token, image, tile): not padded",)
    return ("token_type_ids",) if model.arch.prefix_lm else ()


def _edit_kinds(condition: ConditionPlan) -> set[str]:
    """Which of two edits that cannot share a DeepStack forward the condition makes: of the
    DeepStack mergers' outputs (`projector`, `projector.deepstack`), run inside the vision tower,
    or of a vision-tower site (`vision`, `vision_layer`), requested before them by stage (the
    plan refuses both in one condition; rows of one forward are one trace too)."""
    kinds = set()
    for item in condition.interventions:
        if item.site in ("projector", "projector.deepstack"):
            kinds.add("deepstack")
        elif site(item.site).access == "patches":
            kinds.add("patches")
    return kinds


def group_rows(jobs: Sequence[Job], batch_size: int, per_token: tuple = PER_TOKEN,
               max_padded: int | None = None, pad_requires: tuple = (), deepstack: bool = False,
               packed: bool = False) -> list[list[int]]:
    """(inputs by image, condition) jobs, of one sample or of consecutive samples of one model,
    grouped into forwards of at most `batch_size` rows (job indices, each group in job order).

    Rows of a forward share a `stack_key`; different prompt lengths are padded. A kv_swap job runs
    alone (its cache is edited between a truncated prefill and a decode step of its own).
    max_padded: rows of different lengths only up to this many tokens (a sliding-window cache
    would drop a padded row's real keys in decode steps), else equal lengths only; pad_requires:
    see `stack_key`; deepstack: the family has DeepStack mergers (`_edit_kinds`: a row editing
    them and a row editing the tower never share a forward); packed: the connector runs every
    image of a forward as one row (`Architecture.packed_connector`), so a row editing it runs
    alone. Groups run in
    the order they were opened, and a job never joins a group opened before one that already
    holds its condition: each condition's samples reach the store in job order."""
    groups: list[dict[str, Any]] = []
    for i, job in enumerate(jobs):
        condition = job.condition
        inputs = job.inputs_by_image[condition.image]
        alone = condition.kv_swap is not None or batch_size <= 1 or (
            packed and any(is_projector_site(item.site) for item in condition.interventions))
        key = None if alone else stack_key(inputs, per_token, pad_requires)
        kinds = _edit_kinds(condition) if deepstack else set()
        target = None
        for group in (reversed(groups) if key is not None else ()):
            lengths = group["lengths"] | {inputs.n_tokens}
            fits = len(lengths) == 1 or max_padded is None or max(lengths) <= max_padded
            fits = fits and len(group["kinds"] | kinds) < 2
            if group["key"] == key and len(group["jobs"]) < batch_size and fits:
                target = group
                break
            if condition.name in group["names"]:
                break
        if target is None:
            target = {"key": key, "jobs": [], "names": set(), "lengths": set(), "kinds": set()}
            groups.append(target)
        target["jobs"].append(i)
        target["names"].add(condition.name)
        target["lengths"].add(inputs.n_tokens)
        target["kinds"] |= kinds
    return [group["jobs"] for group in groups]


def batches(inputs_by_image: dict[str, Any], conditions: list[ConditionPlan], batch_size: int,
            per_token: tuple = PER_TOKEN, deepstack: bool = False, packed: bool = False) -> list[list[ConditionPlan]]:
    """One sample's `conditions` grouped into forwards of at most `batch_size` rows (`group_rows`):
    its conditions with an image share one token sequence (real and blank alike), so one
    sample's rows are never padded."""
    groups = group_rows([Job(inputs_by_image, c) for c in conditions], batch_size, per_token, deepstack=deepstack,
                        packed=packed)
    return [[conditions[i] for i in group] for group in groups]


def padding_limit(model: ModelLike, captures: CapturePlan) -> int | None:
    """The longest padded prompt a forward may hold (`group_rows`' max_padded): decode steps after
    a right-padded prompt must find every real key in the cache, which a sliding-window layer
    keeps only for its last `sliding_window` positions. None: no limit. A hybrid with convolution
    layers (LFM2) pads nothing before decode steps: a right-padded row's convolution state would
    hold its pads, not its last tokens (0: equal lengths only)."""
    info = getattr(model, "info", None)
    if captures.decoding and info is not None and info.attention_layers is not None \
            and not info.cross_attention_layers:
        return 0
    config = getattr(getattr(model, "hf", None), "config", None)
    text = config.get_text_config() if config is not None else None
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        window = None  # declared but unused (Qwen2's use_sliding_window: false)
    if not window or not captures.decoding:
        return None
    return int(window) - captures.max_new_tokens - 1


def unbatched_notes(model: ModelLike, plan: ModelPlan) -> list[str]:
    """What `backend.batch_size` keeps out of a shared forward on this model, and why (the
    runner logs these once per model; kv_swap is logged for the whole spec)."""
    arch, name = model.arch, model.info.model_id
    notes = []
    if arch.is_multimodal:
        notes.append(f"note: {name}: samples share a forward only where their image inputs stack (the same shape past "
                     "the first dim: tile count and tile size); others run in forwards of their own")
    if pad_requirements(model):
        notes.append(f"note: {name}: runs without an image are batched only with runs of their own length (no "
                     "token_type_ids: unpadded, sdpa runs the prompt unmasked, which a padding mask would change)")
    if arch.deepstack:
        notes.append(f"note: {name}: a run editing `projector` (DeepStack mergers, inside the vision tower) and one "
                     "editing vision / vision_layer never share a forward (nnsight serves sites in execution order)")
    limit = padding_limit(model, plan.capture)
    if limit is not None:
        notes.append(f"note: {name}: prompts longer than {limit} tokens are batched only with prompts of their own "
                     "length (a sliding-window cache would drop a padded row's keys in decode steps)")
    return notes


def stack_encodings(encodings: list[dict[str, Any]], per_token: tuple = PER_TOKEN, pad_id: int = 0) -> dict[str, Any]:
    """One encoding whose batch rows are `encodings` (sharing a `stack_key`): tensors concatenated
    on their first dimension (the batch for token inputs, the image, tile or flat patch axis for
    image inputs: each row keeps its own block, in row order, as the model scatters image features
    in that order).

    Per-token inputs of different lengths are right-padded to the longest: `input_ids` with
    `pad_id`, the rest (attention_mask, token_type_ids, mm_token_type_ids) with 0, so pads are
    masked text. Right, not left: each row's real tokens keep positions 0..n-1, so the position
    ids the model derives (arange, PaliGemma's 1-based ones, M-RoPE's `get_rope_index` over the
    unmasked tokens) are the unbatched ones, and under causal attention no real query reaches a
    pad key (the mask hides them from bidirectional image or prefix blocks too)."""
    if len(encodings) == 1:
        return encodings[0]
    longest = max(int(e["input_ids"].shape[1]) for e in encodings)
    out = {}
    for k in encodings[0]:
        parts = [e[k] for e in encodings]
        if k in per_token and any(int(p.shape[1]) != longest for p in parts):
            fill = pad_id if k == "input_ids" else 0
            parts = [torch.cat([p, p.new_full((p.shape[0], longest - p.shape[1]), fill)], dim=1) for p in parts]
        out[k] = torch.cat(parts, dim=0)
    return out


def pad_token_id(model: ModelLike) -> int:
    """The id right padding fills `input_ids` with (masked, never read): the tokenizer's pad,
    else its end of sequence, else 0, never the image placeholder (the model would scatter image
    features into it)."""
    tokenizer = getattr(model, "tokenizer", None)
    for candidate in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None), 0, 1):
        if isinstance(candidate, int) and candidate != getattr(model, "image_token_id", None):
            return candidate
    return 0


def run_conditions(model: ModelLike, inputs_by_image: dict[str, Any], conditions: list[ConditionPlan], plan: ModelPlan,
                   batch_size: int = 1, on_trace: Any = None) -> dict[str, RunResult]:
    """Run one sample's `conditions`, up to `batch_size` of them per forward (`batches`); each
    result equals its unbatched `run_condition` (to float rounding)."""
    results = {}
    for group in batches(inputs_by_image, conditions, batch_size, model.arch.per_token_keys,
                         model.arch.deepstack, model.arch.packed_connector):
        for condition, result in zip(group, run_batch(model, inputs_by_image, group, plan, on_trace)):
            results[condition.name] = result
    return {c.name: results[c.name] for c in conditions}


def run_condition(model: ModelLike, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
                  on_trace: Any = None) -> RunResult:
    """Run one (sample, condition) and return its captures as numpy arrays. `on_trace`: see `trace`."""
    return run_batch(model, inputs_by_image, [condition], plan, on_trace)[0]


def run_batch(model: ModelLike, inputs_by_image: dict[str, Any], group: list[ConditionPlan], plan: ModelPlan,
              on_trace: Any = None) -> list[RunResult]:
    """The conditions of `group` (one sample's, one, or several that `batches` put together) in
    one forward."""
    return run_rows(model, [Job(inputs_by_image, c) for c in group], plan, on_trace)


def run_rows(model: ModelLike, jobs: Sequence[Job], plan: ModelPlan,
             on_trace: Any = None, memo: dict[Any, Any] | None = None) -> list[RunResult]:
    """(inputs by image, condition) jobs, of one sample or several (`group_rows` put them
    together), as the rows of one forward, right-padded where their prompts differ in length
    (`stack_encodings`); each result equals its unbatched run (to float rounding).
    memo: source values already read (`_site_values`; kept by the caller across the forwards of
    one sample), else read here once per (sample, source, site).
    Inference mode inside, not as a decorator: the function travels to NDIF by its source."""
    with torch.inference_mode():  # the caches edited between traces are inference tensors
        memo = want_sources(jobs, {} if memo is None else memo)
        if jobs[0].condition.kv_swap is not None:
            return [_run_kv_swap(model, jobs[0].inputs_by_image, jobs[0].condition, plan, on_trace, memo)]
        captures = plan.capture
        readers = captures.readers()
        lengths = [job.inputs_by_image[job.condition.image].n_tokens for job in jobs]
        padded = len(set(lengths)) > 1
        rows = [Row(job.inputs_by_image[job.condition.image],
                    _resolve(model, job.inputs_by_image, job.condition, plan, on_trace, memo), readers,
                    captures.decoding, n if padded else None) for job, n in zip(jobs, lengths)]
        per_token = model.arch.per_token_keys
        encoding = stack_encodings([row.inputs.encoding for row in rows], per_token,
                                   pad_token_id(model) if padded else 0)
        model.prepare()
        # the KV cache only where something reads it: K/V captures, decode steps past the first
        # (without it the forward builds none: a tiny forward's ~5 %, and one read less)
        keep_cache = captures.kv is not None or (captures.decoding and captures.max_new_tokens > 1)
        saved, cache = trace_rows(model, encoding, rows, keep_cache=keep_cache, on_trace=on_trace)
        results = [RunResult() for _ in rows]
        for r, result in enumerate(results):
            _collect_prompt(result, [saved[r]], captures, cache, rows[r].inputs.n_tokens, r)
        _decode(model, [row.inputs for row in rows], captures, cache, saved, results, on_trace,
                encoding["attention_mask"] if padded else None)
        return results


def _run_kv_swap(model: ModelLike, inputs_by_image: dict[str, Any], condition: ConditionPlan, plan: ModelPlan,
                 on_trace: Any = None, memo: dict[Any, Any] | None = None) -> RunResult:
    """A kv_swap condition: prefill all but the last token, swap the donor's K/V in, decode it."""
    captures = plan.capture
    inputs = inputs_by_image[condition.image]
    n = inputs.n_tokens
    interventions = _resolve(model, inputs_by_image, condition, plan, on_trace, memo)
    readers = captures.readers()
    model.prepare()
    head_inputs = _truncate(inputs, n - 1, model.arch.per_token_keys)
    head = trace(model, head_inputs.encoding, head_inputs, interventions, readers, False,
                 keep_cache=True, on_trace=on_trace)
    cache = head.pop("cache")
    swap = condition.kv_swap
    assert swap is not None  # run_rows sends only kv_swap conditions here
    donor = plan.condition(swap.donor)
    donor_inputs = inputs_by_image[donor.image]
    donor_items = _resolve(model, inputs_by_image, donor, plan, on_trace, memo)
    model.prepare()
    donor_head = _truncate(donor_inputs, n - 1, model.arch.per_token_keys)
    donor_cache = trace(model, donor_head.encoding, donor_head, donor_items, keep_cache=True,
                        on_trace=on_trace).pop("cache")
    _swap_kv(cache, donor_cache, position_index(swap.positions, inputs.modality[: n - 1]), swap.layers, swap.parts,
             tuple(model.info.cross_attention_layers))
    last = torch.as_tensor(inputs.input_ids[-1])
    # the vision tower ran in the head: the one-token tail has nothing of it to read
    tail_readers = [r for r in readers if not getattr(r, "prompt_only", False)]
    tail = trace(model, _decode_encoding(model, last, cross_rows=cross_attention_rows([inputs])), inputs, (),
                 tail_readers, True, cache, on_trace=on_trace)
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
        result.tokens["prefill_text_attention"] = text_received(merged, captures.attention.layers, n).numpy()
    if captures.kv:
        result.tokens.update(captures.kv.read_cache(cache, n, row))
    for output in captures.outputs:
        getattr(result, output.rows).update(output.collect(merged))


def _decode(model: ModelLike, inputs: list[Any], captures: CapturePlan, cache: Any, last: list[dict],
            results: list[RunResult], on_trace: Any = None, prompt_mask: torch.Tensor | None = None) -> None:
    """Greedy decode of every batch row (`inputs[r]`, `results[r]`): step 0 is the prompt's own
    prediction (`last[r]`); steps 1.. feed each row's token back, one token per row per step
    (prompt_mask: the rows were right-padded, see `_decode_encoding`)."""
    if not captures.decoding:
        return
    attention = [captures.attention] if captures.attention else []
    logprobs: list[list[torch.Tensor]] = [[] for _ in inputs]
    rows: list[list[torch.Tensor]] = [[] for _ in inputs]
    step_saved = last
    cross_rows = cross_attention_rows(inputs)
    for step in range(captures.max_new_tokens):
        if step > 0:
            tokens = torch.stack([torch.as_tensor(int(lp[-1].argmax())) for lp in logprobs])
            step_rows = [Row(x, (), attention, True) for x in inputs]
            step_saved, _ = trace_rows(model, _decode_encoding(model, tokens, prompt_mask, step, cross_rows), step_rows, cache,
                                       on_trace=on_trace)
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
