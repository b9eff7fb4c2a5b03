"""`workbench check MODEL`: does the workbench read this checkpoint right? Before trusting any
number, a user runs one built-in sample through their own model (a local directory or a hub id)
and compares what the workbench reads with independent computations:

- residual stream: the workbench's layer-l capture against the input of decoder layer l (and of
  the final norm for l = L) read with plain PyTorch forward pre-hooks, no nnsight;
- modality labels: the number of `vision` tokens against the positions holding the config's
  image token id;
- α = 1: scaling the projector output by 1 leaves every layer exactly as the baseline.

A cross-attention family (Mllama) keeps its image out of the token sequence: its labels are
checked to hold no vision position (the image marker is a boundary), and its cross-attention K/V
(site `cross_kv`) against the cache a plain transformers forward builds.

Each check reports PASS or FAIL with the measured difference (N/A where it does not apply, e.g.
the image checks on a text-only model).

A model of a type no family registers is read through the layout its modules follow
(`workbench.models.infer`): the first line (INFO) names the family whose module paths it was
matched to, and the checks then say whether that reading is right."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .records import Record

if TYPE_CHECKING:
    from .models.model import ImageMode, ModelInputs

RESIDUAL_TOLERANCE = 1e-4  # float32; bfloat16 models are compared in their own precision (see below)


class CheckResult(Record):
    """One check: its name, PASS / FAIL / N/A (INFO: what was inferred), and what was measured."""

    name: str
    status: str
    detail: str
    _fields = ("name", "status", "detail")


def _torch_module(root: Any, path: str) -> list[Any]:
    found = [root]
    for part in path.split("."):
        if part == "*":
            found = [child for module in found for child in module]
        elif part.isdigit():
            found = [module[int(part)] for module in found]
        else:
            found = [getattr(module, part) for module in found]
    return found


def _hooked_residuals(model: Any, encoding: dict[str, Any]) -> np.ndarray:
    """(token, layer, dim): the input of every decoder layer, then of the final norm."""
    import torch

    layers = _torch_module(model.hf, model.arch.decoder_layers)[0]
    final_norm = _torch_module(model.hf, model.arch.final_norm)[0]
    seen: list[torch.Tensor] = []

    def grab(module: Any, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append(hidden[0].detach().float().cpu().clone())

    hooks = [m.register_forward_pre_hook(grab, with_kwargs=True) for m in [*layers, final_norm]]
    try:
        with torch.inference_mode():
            model.hf(**encoding)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(seen, dim=1).numpy()


def check_model(model_id: str, device: str = "auto", dtype: str = "auto") -> list[CheckResult]:
    """Run the checks on `model_id` (a tiny model name, a local checkpoint or a hub id)."""
    from .backends.local import run_condition
    from .capture import CapturePlan, ResidualCapture
    from .data import builtin_samples
    from .interventions.scale import Scale
    from .models.infer import inferred_info
    from .models.model import WorkbenchModel
    from .plan import ConditionPlan, ModelPlan

    info, layout = inferred_info(model_id)
    model = WorkbenchModel(info, device=device, dtype=dtype)
    sample = builtin_samples(1)[0]
    multimodal = bool(model.arch.projector)
    mode: ImageMode = "real" if multimodal else "none"
    inputs = model.encode(sample.image if multimodal else None, sample.question, mode)
    plan = ModelPlan(model.info, [], CapturePlan(residual=ResidualCapture(tuple(range(model.n_layers + 1)))))
    baseline = ConditionPlan("baseline", {}, mode, ())
    by_image: dict[str, ModelInputs] = {mode: inputs}
    ours = run_condition(model, by_image, baseline, plan).tokens["hidden"]
    results = [CheckResult("module map inferred", "INFO", layout.describe())] if layout else []

    model.prepare()
    reference = _hooked_residuals(model, inputs.encoding)
    tolerance = RESIDUAL_TOLERANCE if str(model.dtype).endswith("float32") else 5e-2 * float(np.abs(reference).max())
    diff = float(np.abs(ours - reference).max()) if ours.shape == reference.shape else float("inf")
    results.append(CheckResult(
        "residual stream = plain forward pre-hooks", "PASS" if diff <= tolerance else "FAIL",
        f"max |difference| {diff:.2e} over {ours.shape[1]} layers x {ours.shape[0]} tokens (tolerance {tolerance:.0e})"
        if ours.shape == reference.shape else f"shapes differ: workbench {ours.shape}, hooks {reference.shape}"))

    config = model.hf.config
    image_token = getattr(config, "image_token_id", None)
    image_token = image_token if image_token is not None else getattr(config, "image_token_index", None)
    if not multimodal or image_token is None:
        results.append(CheckResult("vision tokens = image-token positions", "N/A", "a text-only model"))
        results.append(CheckResult("alpha = 1 equals the baseline", "N/A", "no projector"))
        return results
    ids = np.asarray(inputs.input_ids)
    if model.arch.cross_attention_layers:
        results += _cross_attention_checks(model, inputs, plan, int(image_token))
        results.append(_alpha_one(model, by_image, plan, ours))
        return results
    expected, labelled = int((ids == int(image_token)).sum()), int((inputs.modality == "vision").sum())
    results.append(CheckResult(
        "vision tokens = image-token positions", "PASS" if expected == labelled and expected > 0 else "FAIL",
        f"{labelled} labelled vision, {expected} positions hold the config's image token id {image_token}"))

    results.append(_alpha_one(model, by_image, plan, ours))
    return results


def _alpha_one(model: Any, by_image: dict[str, Any], plan: Any, baseline: np.ndarray) -> CheckResult:
    from .backends.local import run_condition
    from .interventions.scale import Scale
    from .plan import ConditionPlan

    one = ConditionPlan("scale[alpha=1.0]", {"alpha": 1.0}, "real", (Scale("projector", "vision", factor=1.0),))
    scaled = run_condition(model, by_image, one, plan).tokens["hidden"]
    diff = float(np.abs(scaled - baseline).max())
    return CheckResult("alpha = 1 equals the baseline", "PASS" if diff == 0 else "FAIL",
                       f"max |difference| {diff:.2e} over every layer")


def _cross_attention_checks(model: Any, inputs: Any, plan: Any, image_token: int) -> list[CheckResult]:
    """The labels hold no vision position (the marker is a boundary); `cross_kv` equals the K/V
    that a plain forward leaves in its cache at each cross-attention layer."""
    import torch

    from .backends.local import run_condition
    from .plan import ConditionPlan
    from .sites.cross_kv import CrossKVCapture

    markers = np.asarray(inputs.input_ids) == image_token
    vision = int((inputs.modality == "vision").sum())
    marked = bool(markers.any()) and bool((inputs.modality[markers] == "boundary").all())
    results = [CheckResult("image marker labelled boundary, no vision positions", "PASS" if marked and not vision
                           else "FAIL", f"{vision} positions labelled vision; {int(markers.sum())} image markers "
                           f"(id {image_token}) labelled {sorted(map(str, set(inputs.modality[markers])))}")]
    layers = tuple(model.info.cross_attention_layers)
    captured = plan.capture.replace(residual=None, outputs=(CrossKVCapture(layers),))
    ours = run_condition(model, {"real": inputs}, ConditionPlan("baseline", {}, "real", ()),
                         plan.replace(capture=captured)).patches
    model.prepare()
    with torch.inference_mode():
        cache = model.hf(**inputs.encoding, use_cache=True).past_key_values
    diffs = []
    for i, l in enumerate(layers):
        for name, part in (("cross_keys", "keys"), ("cross_values", "values")):
            reference = getattr(cache.layers[l], part)[0].transpose(0, 1).float().cpu().numpy()
            mine = ours[name][:, i] if name in ours else None
            diffs.append(float(np.abs(mine - reference).max()) if mine is not None and mine.shape == reference.shape
                         else float("inf"))
    diff = max(diffs)
    results.append(CheckResult("cross-attention K/V = a plain forward's cache", "PASS" if diff <= RESIDUAL_TOLERANCE
                               else "FAIL", f"max |difference| {diff:.2e} over cross-attention layers {list(layers)}"))
    return results


def print_results(model_id: str, results: list[CheckResult]) -> bool:
    """The table; returns whether nothing failed."""
    print(f"workbench check {model_id}")
    for r in results:
        print(f"  {r.status:<4}  {r.name}: {r.detail}")
    failed = [r for r in results if r.status == "FAIL"]
    print("all checks passed: the workbench reads this model as it runs" if not failed
          else f"{len(failed)} check(s) failed: do not trust stored values for this model yet")
    return not failed
