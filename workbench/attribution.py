"""Attribution patching: a patching scan's grid estimated from one forward and one backward per
(sample, base run), by the first-order approximation of Nanda (2023, "Attribution Patching:
Activation Patching At Industrial Scale") and Syed et al. (2023, "Attribution Patching Outperforms
Automated Circuit Discovery"):

    m(patched) − m(base) ≈ Σ_{t ∈ group} (h_donor(t) − h_base(t)) · ∂m/∂h(t) at h_base

for the site h of one layer (residual `layer` l: the input of decoder layer l, or of the final
norm at l = L; `attn_out` / `mlp_out` l: the branch module's output) and the metric m of the next
token's log-probabilities: `logit_diff` ln p(a) − ln p(b), or `answer_logprob` ln p(a). (KL to the
base has zero gradient at the base: its first-order estimate is 0 everywhere, so it is refused.)

The estimate is exact where m is linear in h: a logit difference is linear in the final norm's
output, so with the final norm an identity map (a model whose logits are W_U h_L) every cell at
`layer` L, and at `mlp_out` of the last decoder layer, is exact (`tests/test_attribution.py`).

Gradients are taken with plain PyTorch on the transformers model (hooks that keep each site's
tensor, `torch.autograd.grad` once), locally only: NDIF runs traces under inference mode and
returns saved values, not gradients, so a remote backend is refused before any job
(`refuse_remote`). Base and donor must be conditions of images only (no interventions of their
own), as the hooks reproduce the forward of a condition without edits.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from .backends.local import RunResult
from .data import Sample
from .errors import BadInputError
from .interventions.patch import Patch
from .models.model import WorkbenchModel
from .plan import ConditionPlan, ModelPlan
from .sites import first_tensor, position_index
from .spec.scans import METHOD_VAR, METRIC_VAR, SCAN_SITES, TOKENS_VAR

ATTRIBUTION_METRICS = ("logit_diff", "answer_logprob")


def refuse_remote(backend_kind: str) -> None:
    """Attribution needs gradients: refused on a remote backend, before any job is sent."""
    if backend_kind == "remote":
        raise BadInputError("backend.kind: attribution patching needs gradients (a backward pass through the "
                            "model), which NDIF does not return (its traces run under inference mode and send back "
                            "saved values only); expected backend kind 'local', or real patching (a scan) remotely")


def metric_fn(metric: str, tokens: tuple[int, ...]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The metric of the next token's log-probabilities (vocab,) (module doc)."""
    if metric == "logit_diff" and len(tokens) == 2:
        return lambda lp: lp[tokens[0]] - lp[tokens[1]]
    if metric == "answer_logprob" and len(tokens) == 1:
        return lambda lp: lp[tokens[0]]
    raise BadInputError(f"metric: got {metric!r} with tokens {list(tokens)}; expected logit_diff with two token ids "
                        "or answer_logprob with one (KL to the base has zero gradient there: no first-order estimate)")


def _site_module(model: WorkbenchModel, site: str, layer: int) -> tuple[torch.nn.Module, bool]:
    """(torch module, whether the site is its input) of a scan site at `layer`."""
    hf, arch = model.hf, model.arch
    layers = hf.get_submodule(arch.decoder_layers)
    if site == "layer":
        return (layers[layer] if layer < len(layers) else hf.get_submodule(arch.final_norm)), True
    if site == "attn_heads":  # the output projection's input (`.source` name self_<module>_0)
        name = arch.output_projection_call.removeprefix("self_").rpartition("_")[0]
        return getattr(layers[layer].self_attn, name), True
    module = layers[layer]
    for part in arch.branch_outputs[site].split("."):
        module = getattr(module, part)
    return module, False


def site_values(model: WorkbenchModel, encoding: dict[str, Any], site: str, layers: list[int],
                metric: Callable[[torch.Tensor], torch.Tensor] | None = None
                ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], float]:
    """One forward of `encoding`: {layer: (seq, dim)} of the site, and with `metric` its gradient
    {layer: (seq, dim)} (one backward) and the metric's value."""
    held: dict[int, torch.Tensor] = {}
    handles = []
    for layer in layers:
        module, is_input = _site_module(model, site, layer)
        if is_input:
            def pre(mod: Any, args: tuple, kwargs: dict, layer: int = layer) -> None:
                held[layer] = args[0] if args else kwargs["hidden_states"]
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        else:
            def post(mod: Any, args: tuple, out: Any, layer: int = layer) -> None:
                held[layer] = first_tensor(out)
            handles.append(module.register_forward_hook(post))
    # the graph starts at the token embeddings (the weights need no gradient)
    embed = model.hf.get_input_embeddings()
    handles.append(embed.register_forward_hook(lambda mod, args, out: out.detach().requires_grad_(metric is not None)))
    try:
        model.prepare()
        with torch.enable_grad() if metric is not None else torch.no_grad():
            logits = model.hf(**encoding).logits[0, -1].float()
            if metric is None:
                return {l: v[0].detach().float() for l, v in held.items()}, {}, float("nan")
            value = metric(torch.log_softmax(logits, -1))
            grads = torch.autograd.grad(value, [held[l] for l in layers])
    finally:
        for handle in handles:
            handle.remove()
    return ({l: held[l][0].detach().float() for l in layers}, {l: g[0].float() for l, g in zip(layers, grads)},
            float(value.detach()))


def attribution_scan(model: WorkbenchModel, plan: ModelPlan, inputs_by_image: Any, runs: list[ConditionPlan],
                     metric: str, tokens: tuple[int, ...], backend_kind: str = "local") -> dict[str, float]:
    """{run name: estimated m(run) − m(base)} for a scan's runs on one sample (module doc): one
    forward and backward per base, one forward per donor, whatever the grid's size."""
    refuse_remote(backend_kind)
    fn = metric_fn(metric, tokens)
    out: dict[str, float] = {}
    by_pair: dict[tuple[str, str, str], list[tuple[ConditionPlan, Any]]] = {}
    for run in runs:
        patch = run.interventions[-1]
        assert isinstance(patch, Patch)  # a scan's run ends with its patch (`spec.scans`)
        base = _base_of(plan, run)
        if patch.site not in SCAN_SITES:
            raise BadInputError(f"{run.name}: attribution takes the scan sites {', '.join(SCAN_SITES)}; got {patch.site!r}")
        by_pair.setdefault((base.name, patch.source, patch.site), []).append((run, patch))
    for (base_name, donor_name, site), cells in by_pair.items():
        base, donor = plan.condition(base_name), plan.condition(donor_name)
        for condition in (base, donor):
            if condition.interventions or condition.kv_swap is not None:
                raise BadInputError(f"{condition.name}: attribution patching reproduces runs of an image only; "
                                    "expected clean and corrupt conditions without interventions or kv_swap")
        layers = sorted({l for _, patch in cells for l in patch.layers})
        inputs = inputs_by_image[base.image]
        h_base, grads, _ = site_values(model, inputs.encoding, site, layers, fn)
        h_donor, _, _ = site_values(model, inputs_by_image[donor.image].encoding, site, layers)
        for run, patch in cells:
            index = torch.as_tensor(np.asarray(position_index(patch.positions, inputs.modality), dtype=np.int64))
            (layer,) = patch.layers
            delta = (h_donor[layer][index] - h_base[layer][index]).to(grads[layer].device)
            if patch.heads is not None:  # only those heads' columns are patched
                d = int(model.info.head_dim or 0)
                keep = torch.zeros(delta.shape[-1], dtype=delta.dtype, device=delta.device)
                for head in patch.heads:
                    keep[head * d:(head + 1) * d] = 1
                delta = delta * keep
            out[run.name] = float((delta * grads[layer][index]).sum())
    return out


def is_attribution(condition: ConditionPlan) -> bool:
    """A run of a scan with method: attribution (estimated here, not run as a patch)."""
    return condition.sweep.get(METHOD_VAR) == "attribution"


def attribution_results(model: WorkbenchModel, plan: ModelPlan, inputs_by_image: Any, runs: list[ConditionPlan],
                        sample: Sample) -> list[RunResult]:
    """One sample's attribution runs as results: each holds `attribution` (run,), the estimate of
    m(run) − m(base) on its scan's metric (`scan_metric`, `scan_tokens`; answer_logprob: the
    first token of the sample's answer), in place of a forward of its own."""
    from .labels import answer_ids

    estimates: dict[str, float] = {}
    by_metric: dict[tuple[str, str], list[ConditionPlan]] = {}
    for run in runs:
        by_metric.setdefault((str(run.sweep[METRIC_VAR]), str(run.sweep.get(TOKENS_VAR) or "")), []).append(run)
    for (metric, words), cells in by_metric.items():
        tokens = tuple(int(t) for t in words.split(",") if t)
        if metric == "answer_logprob":
            ids = answer_ids(model.tokenizer, sample.answer)
            if not ids:
                raise BadInputError(f"sample {sample.id}: answer_logprob reads the sample's answer, and it has none; "
                                    "expected samples with answers, or metric: logit_diff")
            tokens = (ids[0],)
        estimates.update(attribution_scan(model, plan, inputs_by_image, cells, metric, tokens))
    return [RunResult(run={"attribution": np.array([estimates[run.name]], dtype=np.float32)}) for run in runs]


def _base_of(plan: ModelPlan, run: ConditionPlan) -> ConditionPlan:
    """The condition a scan's run runs as (`scan_base`, stored with its sweep values)."""
    name = run.sweep.get("scan_base")
    if not name:
        raise BadInputError(f"{run.name}: not a scan's run; expected a run of a condition with `scan:`")
    return plan.condition(name)
