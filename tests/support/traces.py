"""Running one condition of a plan on a tiny model, and what plain PyTorch hooks read from the
same model: the independent computation the intervention, family and atlas tests compare to."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from workbench.backends.local import run_condition
from workbench.data import Sample
from workbench.plan import compile_plan
from workbench.runner import LazyInputs
from workbench.spec import parse_spec


def _image() -> Image.Image:
    img = Image.new("RGB", (96, 64), (20, 40, 160))
    img.paste((250, 200, 0), (10, 10, 50, 40))
    return img


SAMPLE = Sample(id="test/0", image=_image(), question="What colour is the square?", category="color")


def plan_for(model, conditions: str, capture: str = "[{site: layer}]", generate: int | None = None):
    text = f"""\
name: t
models: [{model.model_id}]
conditions:
{conditions}
capture: {capture}
{f'generate: {{max_new_tokens: {generate}}}' if generate else ''}
store: {{path: unused.zarr}}
"""
    return compile_plan(parse_spec(text), model.info)


def run(model, plan, name):
    inputs = LazyInputs(model, SAMPLE)
    return run_condition(model, inputs, plan.condition(name), plan), inputs


# -- plain PyTorch hooks -------------------------------------------------------------------------


def modules(hf, path):
    """The torch modules at a dotted path of the arch (a `*` expands a ModuleList), read with
    plain attribute access on the transformers model."""
    found = [hf]
    for part in path.split("."):
        if part == "*":
            found = [child for m in found for child in m]
        elif part.isdigit():
            found = [m[int(part)] for m in found]
        else:
            found = [getattr(m, part) for m in found]
    return found


def hooked(model, encoding, projector_factor=None):
    """Residual stream by the workbench convention (the input of each decoder layer, then the input
    of the final norm) with forward pre-hooks; optionally every projector module's output scaled."""
    hf, arch = model.hf, model.arch
    seen = []
    layers = list(modules(hf, arch.decoder_layers)[0]) + modules(hf, arch.final_norm)
    handles = [m.register_forward_pre_hook(lambda m, a, kw=None: seen.append(a[0][0].detach().clone())
                                           if a else None) for m in layers]
    # decoder layers may take hidden_states by keyword: read it there too
    handles += [m.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["hidden_states"][0].detach().clone())
                                            if not a else None, with_kwargs=True) for m in layers]
    if projector_factor is not None:
        handles += [m.register_forward_hook(lambda m, i, o: o * projector_factor)
                    for path in arch.projector for m in modules(hf, path)]
    try:
        model.prepare()
        with torch.inference_mode():
            out = hf(**encoding)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(seen, dim=1).numpy(), out


def _main(value):
    return value if isinstance(value, torch.Tensor) else value[0]


def vision_hooks(model, encoding, scale_vision=None, scale_part=None):
    """With plain PyTorch hooks: each vision layer's output and the tower's output as the
    connector receives it (rows flattened), optionally the `vision` tensor scaled (before the
    connector reads it) or one connector part's output scaled; plus the residual stream."""
    hf, arch = model.hf, model.arch
    layers, vision, handles = [], [], []
    tower_layers = modules(hf, arch.vision_layers)[0] if arch.vision_layers else []  # none declared: Mllama
    for layer in tower_layers:
        handles.append(layer.register_forward_hook(lambda m, a, o: layers.append(_main(o).detach().clone())))
    path, end = arch.vision_output
    target = modules(hf, path)[0]
    if end == "input":
        def pre(m, args, kwargs):
            x = args[0] if scale_vision is None else args[0] * scale_vision
            vision.append(x.detach().clone())
            return (x, *args[1:]), kwargs
        handles.append(target.register_forward_pre_hook(pre, with_kwargs=True))
    else:
        def post(m, args, out):
            x = _main(out)
            if scale_vision is not None:
                x.mul_(scale_vision)  # the tower returns a ModelOutput: edit its tensor in place
            vision.append(x.detach().clone())
        handles.append(target.register_forward_hook(post))
    if scale_part is not None:
        part, factor = scale_part
        handles += [m.register_forward_hook(lambda m, a, o: o * factor)
                    for m in modules(hf, arch.projector_parts[part])]
    try:
        residual, _ = hooked(model, encoding)
    finally:
        for h in handles:
            h.remove()
    flat = lambda t: t.reshape(-1, t.shape[-1]).numpy()
    # the rows the connector drops (LLaVA's CLS) are not patches: the capture leaves them out too
    patches = lambda t: t[:, arch.tower_prefix_rows:] if arch.tower_prefix_rows else t
    stacked = (np.stack([flat(patches(t)) for t in layers[-len(tower_layers):]], axis=1) if tower_layers
               else np.zeros((0, 0, 0)))
    return stacked, flat(vision[-1]), residual


# -- activation patching with plain hooks (the `patch` kind's and the scans' oracle) ----------------


def site_module(model, site, layer):
    """The torch module whose output is `attn_out` / `mlp_out` of decoder layer `layer`, or whose
    input is the residual stream `layer` (the decoder layer, or the final norm at l = L)."""
    hf, arch = model.hf, model.arch
    decoder = list(modules(hf, arch.decoder_layers)[0])
    if site == "layer":
        return decoder[layer] if layer < len(decoder) else modules(hf, arch.final_norm)[0]
    found = decoder[layer]
    for part in arch.branch_outputs[site].split("."):
        found = getattr(found, part)
    return found


def patched_logprobs(model, encoding, site=None, layer=0, index=None, donor_encoding=None):
    """Next-token log-probabilities of the prompt `encoding`, with the value of `site` at `layer`
    and token positions `index` replaced by the prompt `donor_encoding`'s (site None: unpatched).
    Plain forward (pre-)hooks on the transformers modules; the donor runs first."""
    hf = model.hf

    def run(hook=None, pre=None):
        handle = None
        if site is not None:
            target = site_module(model, site, layer)
            handle = (target.register_forward_pre_hook(pre, with_kwargs=True) if site == "layer"
                      else target.register_forward_hook(hook))
        try:
            model.prepare()
            with torch.inference_mode():
                return hf(**(encoding if hook is not None or pre is not None or site is None else donor_encoding))
        finally:
            if handle is not None:
                handle.remove()

    if site is None:
        return torch.log_softmax(run().logits[0, -1].float(), -1).numpy()
    held = {}
    index = torch.as_tensor(np.asarray(index, dtype=np.int64))

    def read(module, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        held["x"] = x[:, index].clone()

    def read_out(module, args, out):
        held["x"] = _main(out)[:, index].clone()

    def write(module, args, kwargs):
        x = (args[0] if args else kwargs["hidden_states"]).clone()
        x[:, index] = held["x"]
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    def write_out(module, args, out):
        main = _main(out)
        main[:, index] = held["x"]
        return out

    # the donor's value: a hook that only reads
    target = site_module(model, site, layer)
    handle = (target.register_forward_pre_hook(read, with_kwargs=True) if site == "layer"
              else target.register_forward_hook(read_out))
    try:
        model.prepare()
        with torch.inference_mode():
            hf(**donor_encoding)
    finally:
        handle.remove()
    out = run(hook=write_out if site != "layer" else None, pre=write if site == "layer" else None)
    return torch.log_softmax(out.logits[0, -1].float(), -1).numpy()
