"""Patching scans on the tiny models: a scan's runs against patching done with plain PyTorch hooks,
the identities (every position at layer 0 patched gives the donor's output; an empty group the
base's), one head's output patched (site attn_heads) against a plain pre-hook on o_proj that
replaces that head's columns, the forwards a batched scan issues, and the spec's scan section."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workbench.backends.local import Job, group_rows, run_condition, run_rows, want_sources
from workbench.plan import compile_plan
from workbench.runner import LazyInputs
from workbench.spec import SpecError, parse_spec

from support.traces import SAMPLE, patched_logprobs

ATOL = 2e-5
SCAN = """\
name: t
models: [{model}]
conditions:
  baseline: {{}}
  blank: {{image: blank}}
  trace:
    scan: {scan}
capture: [{{site: logits}}]
store: {{path: unused.zarr}}
backend: {{batch_size: {batch}}}
"""


def scan_plan(model, scan, batch=1):
    return compile_plan(parse_spec(SCAN.format(model=model.model_id, scan=scan, batch=batch)), model.info)


def logprobs(model, plan, name, inputs):
    return run_condition(model, inputs, plan.condition(name), plan).run["logprobs"][0, 0]


@pytest.mark.parametrize("name,site", [("tiny-qwen3vl", "layer"), ("tiny-qwen3vl", "attn_out"),
                                       ("tiny-smolvlm", "mlp_out"), ("tiny-smolvlm", "attn_out")])
def test_scan_runs_match_plain_hook_patching(load_tiny, name, site):
    model = load_tiny(name)
    plan = scan_plan(model, f"{{clean: baseline, corrupt: blank, site: {site}, layers: [1], "
                            "positions: [vision, last, [2, 3]], direction: both}")
    inputs = LazyInputs(model, SAMPLE)
    real, blank = inputs["real"], inputs["blank"]
    for direction, base, donor in (("denoising", blank, real), ("noising", real, blank)):
        for pos, index in (("vision", np.flatnonzero(real.modality == "vision")), ("2+3", [2, 3])):
            got = logprobs(model, plan, f"trace[dir={direction},l=1,pos={pos}]", inputs)
            want = patched_logprobs(model, base.encoding, site, 1, index, donor.encoding)
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=f"{direction} {pos}")


@pytest.mark.parametrize("name", ["tiny-smolvlm", "tiny-qwen3vl"])
def test_every_position_at_layer_0_gives_the_donor_and_no_position_the_base(load_tiny, name):
    """The whole LLM input patched is the donor's forward, where the image enters the LLM only
    there. Qwen3-VL adds DeepStack features of its own image after early decoder layers too: there
    the whole residual stream after the last of them is what carries the donor's output."""
    model = load_tiny(name)
    deepstack = model.arch.deepstack
    top = model.info.n_layers
    plan = scan_plan(model, f"{{clean: baseline, corrupt: blank, layers: [0, {top}], positions: [all], direction: both}}")
    inputs = LazyInputs(model, SAMPLE)
    clean, corrupt = logprobs(model, plan, "baseline", inputs), logprobs(model, plan, "blank", inputs)
    assert np.abs(clean - corrupt).max() > 1e-3  # the two runs differ: the identities say something
    for layer in (0, top):
        denoised = logprobs(model, plan, f"trace[dir=denoising,l={layer},pos=all]", inputs)
        noised = logprobs(model, plan, f"trace[dir=noising,l={layer},pos=all]", inputs)
        if deepstack and layer == 0:
            assert np.abs(denoised - clean).max() > 1e-3  # the blank image's DeepStack features still enter
            continue
        np.testing.assert_allclose(denoised, clean, atol=ATOL, rtol=0)
        np.testing.assert_allclose(noised, corrupt, atol=ATOL, rtol=0)
    # the unpatched forward of plain transformers is the base run's
    np.testing.assert_allclose(clean, patched_logprobs(model, inputs["real"].encoding), atol=ATOL, rtol=0)


def head_patched_logprobs(model, encoding, layer, head, index, donor_encoding):
    """Next-token log-probabilities of `encoding` with head `head`'s output at positions `index`
    (o_proj's input columns head·d .. (head+1)·d − 1) replaced by the donor prompt's, by a plain
    forward pre-hook on the layer's self_attn.o_proj; the donor runs first."""
    projection = model.hf.get_decoder().layers[layer].self_attn.o_proj
    d = model.info.head_dim
    columns, rows = slice(head * d, (head + 1) * d), torch.as_tensor(np.asarray(index, dtype=np.int64))
    held = {}

    def read(module, args):
        held["x"] = args[0][:, rows, columns].clone()

    def write(module, args):
        x = args[0].clone()
        x[:, rows, columns] = held["x"]
        return (x, *args[1:])

    out = None
    for hook, prompt in ((read, donor_encoding), (write, encoding)):
        handle = projection.register_forward_pre_hook(hook)
        try:
            model.prepare()
            with torch.inference_mode():
                out = model.hf(**prompt)
        finally:
            handle.remove()
    return torch.log_softmax(out.logits[0, -1].float(), -1).numpy()


@pytest.mark.parametrize("name", ["tiny-qwen3vl", "tiny-smolvlm"])
def test_a_head_scan_patches_one_heads_output_as_a_plain_hook_does(load_tiny, name):
    model = load_tiny(name)
    plan = scan_plan(model, "{clean: baseline, corrupt: blank, site: attn_heads, heads: [0, 1], layers: [1], "
                            "positions: [vision, last]}", batch=2)
    inputs = LazyInputs(model, SAMPLE)
    real, blank = inputs["real"], inputs["blank"]
    base = logprobs(model, plan, "blank", inputs)
    moved = 0.0
    for head in (0, 1):
        for pos, index in (("vision", np.flatnonzero(real.modality == "vision")), ("last", [real.n_tokens - 1])):
            got = logprobs(model, plan, f"trace[l=1,h={head},pos={pos}]", inputs)
            want = head_patched_logprobs(model, blank.encoding, 1, head, index, real.encoding)
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=f"head {head} {pos}")
            moved = max(moved, float(np.abs(got - base).max()))
    assert moved > 1e-4   # some head's patch changes the output: the comparison says something


def test_an_empty_group_patches_nothing(load_tiny):
    """A text-only model has no vision tokens: the scan's `vision` cells patch nothing."""
    model = load_tiny("tiny-llama")
    spec = SCAN.format(model=model.model_id, scan="{clean: baseline, corrupt: scaled, layers: [0, 1], "
                       "positions: [vision, all]}", batch=1).replace(
        "  blank: {image: blank}", "  scaled: {interventions: [{kind: scale, site: embed, factor: 0.5}]}")
    plan = compile_plan(parse_spec(spec), model.info)
    inputs = LazyInputs(model, SAMPLE)
    base = logprobs(model, plan, "scaled", inputs)
    assert np.abs(base - logprobs(model, plan, "baseline", inputs)).max() > 1e-3
    for layer in (0, 1):
        np.testing.assert_array_equal(logprobs(model, plan, f"trace[l={layer},pos=vision]", inputs), base)
    np.testing.assert_allclose(logprobs(model, plan, "trace[l=0,pos=all]", inputs),
                               logprobs(model, plan, "baseline", inputs), atol=ATOL, rtol=0)


def test_a_batched_scan_reads_its_donor_once_per_sample(load_tiny):
    """All layers x 4 groups x both directions: ceil(runs / batch) forwards, plus one read of each
    donor (the clean and the corrupt run), each result equal to its unbatched run."""
    model = load_tiny("tiny-qwen3vl")
    layers = list(range(model.info.n_layers + 1))
    scan = f"{{clean: baseline, corrupt: blank, layers: {layers}, positions: [vision, text, boundary, last], direction: both}}"
    batch = 16
    plan = scan_plan(model, scan, batch)
    runs = [c for c in plan.conditions if c.name.startswith("trace[")]
    assert len(runs) == 2 * len(layers) * 4
    inputs = LazyInputs(model, SAMPLE)
    jobs = [Job(inputs, c) for c in runs]
    traces = []
    memo = want_sources(jobs, {})
    results = {}
    for group in group_rows(jobs, batch, model.arch.per_token_keys):
        out = run_rows(model, [jobs[i] for i in group], plan, on_trace=traces.append, memo=memo)
        results.update({jobs[i].condition.name: r.run["logprobs"][0, 0] for i, r in zip(group, out)})
    assert len(traces) == math.ceil(len(runs) / batch) + 2
    for name in ("trace[dir=denoising,l=2,pos=vision]", "trace[dir=noising,l=3,pos=last]"):
        np.testing.assert_allclose(results[name], logprobs(model, plan, name, inputs), atol=ATOL, rtol=0)


def test_scan_spec_names_its_runs_and_refuses_what_cannot_run():
    spec = parse_spec(SCAN.format(model="tiny-qwen3vl", batch=1, scan="{clean: baseline, corrupt: blank, "
                                  "site: mlp_out, layers: [0, 2], positions: [vision, 5, last-2], direction: both}"))
    runs = list(spec.expand_conditions())
    assert [r.name for r in runs][2:5] == ["trace[dir=denoising,l=0,pos=vision]", "trace[dir=denoising,l=0,pos=5]",
                                            "trace[dir=denoising,l=0,pos=last-2]"]
    noising = next(r for r in runs if r.name == "trace[dir=noising,l=2,pos=vision]")
    assert noising.image == "real" and noising.interventions[-1].from_ == "blank"
    assert noising.sweep == {"dir": "noising", "l": 2, "pos": "vision", "scan_base": "baseline",
                             "scan_donor": "blank", "scan_site": "mlp_out"}
    denoising = runs[2]
    assert denoising.image == "blank" and denoising.interventions[-1].from_ == "baseline"
    bad = {
        "{clean: baselin, corrupt: blank, layers: [0]}": "conditions.trace.scan.clean: unknown condition 'baselin'",
        "{clean: blank, corrupt: blank, layers: [0]}": "clean and corrupt are both 'blank'",
        "{clean: baseline, corrupt: blank, layers: [0], positions: [visoin]}": "conditions.trace.scan.positions[0]",
        "{clean: baseline, corrupt: blank, layers: [0], site: keys}": "conditions.trace.scan.site",
        "{clean: baseline, corrupt: blank, layers: all}": "conditions.trace.scan.layers",
        "{clean: baseline, corrupt: blank, layers: [0], heads: [0]}": "conditions.trace.scan.heads: a scan over heads",
        "{clean: baseline, corrupt: blank, layers: [0], site: attn_heads, heads: [-1]}": "conditions.trace.scan.heads[0]",
    }
    for scan, message in bad.items():
        with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
            parse_spec(SCAN.format(model="tiny-qwen3vl", batch=1, scan=scan))
    with pytest.raises(SpecError, match=r"conditions\.trace\.image: .*expected no 'image' beside 'scan'"):
        parse_spec(SCAN.format(model="tiny-qwen3vl", batch=1, scan="{clean: baseline, corrupt: blank, layers: [0]}")
                   .replace("    scan:", "    image: blank\n    scan:"))


def test_heads_are_refused_at_a_site_without_heads(workbench_cache):
    from workbench.models.model import model_info

    spec = SCAN.format(model="tiny-qwen3vl", batch=1, scan="{clean: baseline, corrupt: blank, layers: [0]}").replace(
        "  trace:\n    scan: {clean: baseline, corrupt: blank, layers: [0]}\n",
        "  heads: {interventions: [{kind: patch, site: attn_out, layers: [1], heads: [0], from: baseline}]}\n")
    with pytest.raises(SpecError, match=r"conditions\.heads\.interventions\[0\]\.heads: tiny-qwen3vl: 'attn_out' has no heads; "
                                        r"expected 'heads' only at a site of per-head values \(attn_heads\)"):
        compile_plan(parse_spec(spec), model_info("tiny-qwen3vl"))
