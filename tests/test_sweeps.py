"""Sweeps of any field: a layer, a position or a kv_swap field swept like a number; several
variables as a product or a zip; runs named after their condition; every run validated as a
hand-written condition would be, its messages naming the run; a store whose runs were named by
their values alone still opens and analyses, and a resume of it is refused, naming the change."""

from __future__ import annotations

import numpy as np
import pytest

import workbench
from workbench.cli import main
from workbench.runner import run_spec
from workbench.spec import SpecError, parse_spec
from workbench.store import StoreWriter, Variable


def spec_text(conditions: str, store: str = "unused.zarr", model: str = "tiny-qwen3vl",
              capture: str = "[{site: layer}]") -> str:
    return (f"name: sweeps\nmodels: [{model}]\ndata: {{source: builtin, n: 1}}\nconditions:\n{conditions}"
            f"capture: {capture}\nstore: {{path: {store}}}\nbackend: {{device: cpu, dtype: float32}}\n")


def problems_of(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, source="s.yaml")
    return [f"{p.field}: {p.message}" for p in caught.value.problems]


# ------------------------------------------------------------------ what a swept field expands to


def test_every_edit_field_takes_a_variable_and_each_run_holds_its_value():
    spec = parse_spec(spec_text("""\
  baseline: {}
  blank: {image: blank}
  patch: {sweep: {l: [0, 2]}, interventions: [{kind: patch, site: layer, layers: $l, positions: vision, from: blank}]}
  zero: {sweep: {p: [vision, all]}, interventions: [{kind: zero, site: embed, positions: $p}]}
  one: {sweep: {p: [3]}, interventions: [{kind: zero, site: embed, positions: $p}]}
  scale: {sweep: {l: [1], f: [0.5]}, interventions: [{kind: scale, site: layer, layers: [$l, 2], factor: $f}]}
  add: {sweep: {n: [2.0], s: [4]}, interventions: [{kind: add, site: layer, layers: [1], direction: random, seed: $s, norm: $n}]}
  norm: {sweep: {t: [3.0]}, interventions: [{kind: normalize, target: $t}]}
  swap: {sweep: {l: [1], p: [text], k: [keys+values]}, kv_swap: {donor: blank, layers: [$l], positions: $p, parts: $k}}
"""))
    runs = {run.name: run for run in spec.expand_conditions()}
    assert list(runs) == ["baseline", "blank", "patch[l=0]", "patch[l=2]", "zero[p=vision]", "zero[p=all]",
                          "one[p=3]", "scale[l=1,f=0.5]", "add[n=2.0,s=4]", "norm[t=3.0]", "swap[l=1,p=text,k=keys+values]"]
    assert [runs[f"patch[l={l}]"].interventions[0].layers for l in (0, 2)] == [[0], [2]]
    assert [runs[n].interventions[0].positions for n in ("zero[p=vision]", "one[p=3]")] == ["vision", [3]]
    scale = runs["scale[l=1,f=0.5]"].interventions[0]
    assert (scale.layers, scale.factor) == ([1, 2], 0.5)
    add = runs["add[n=2.0,s=4]"].interventions[0]
    assert (add.seed, add.norm) == (4, 2.0)
    assert runs["norm[t=3.0]"].interventions[0].target == 3.0
    swap = runs["swap[l=1,p=text,k=keys+values]"].kv_swap
    assert (swap.layers, swap.positions, swap.parts) == ([1], "text", ["keys", "values"])
    # the validated spec keeps the references; only runs hold values
    assert spec.conditions["patch"].interventions[0].layers == "$l"


def test_product_and_zip_counts_and_names():
    spec = parse_spec(spec_text("""\
  product: {sweep: {l: [0, 1, 2], p: [vision, text]}, interventions: [{kind: zero, site: layer, layers: $l, positions: $p}]}
  zipped: {sweep: {zip: {l: [0, 1, 2], p: [vision, text, all]}}, interventions: [{kind: zero, site: layer, layers: $l, positions: $p}]}
  both: {sweep: {f: [0.5, 2.0], zip: {l: [0, 1], p: [1, 2]}}, interventions: [{kind: scale, site: layer, layers: [$l], positions: [$p], factor: $f}]}
"""))
    space = spec.expand_conditions()
    names = list(space.names())
    assert len(space) == 3 * 2 + 3 + 2 * 2 == len(names) == len(set(names))
    assert names[:6] == [f"product[l={l},p={p}]" for l in (0, 1, 2) for p in ("vision", "text")]
    assert names[6:9] == ["zipped[l=0,p=vision]", "zipped[l=1,p=text]", "zipped[l=2,p=all]"]
    assert names[9:] == ["both[f=0.5,l=0,p=1]", "both[f=0.5,l=1,p=2]", "both[f=2.0,l=0,p=1]", "both[f=2.0,l=1,p=2]"]
    assert [space[i].name for i in range(len(space))] == names  # indexing agrees with iteration
    assert [(r.interventions[0].layers, r.interventions[0].positions) for r in space[6:9]] == \
        [([0], "vision"), ([1], "text"), ([2], "all")]
    from workbench.spec.sizes import spec_condition_count, text_size_problems

    assert spec_condition_count(spec) == len(space)
    # sizes are counted before expanding: a zip group is one factor, its length
    big = spec_text("  z: {sweep: {a: [1, 2], zip: {l: [%s], p: [%s]}}}\n" % ((", ".join(map(str, range(60))),) * 2))
    assert [p.message.split(";")[0] for p in text_size_problems(big, {"conditions": 100})] == \
        ["the sweep expands to 120 conditions (a: 2 values x zip: 60 values)"]


@pytest.mark.parametrize("sweep, message", [
    ("{zip: {l: [0, 1], p: [vision]}}", "conditions.c.sweep.zip: zipped lists of different lengths ('l' has 2, 'p' has 1)"),
    ("{l: [0], zip: {l: [1], p: [text]}}", "conditions.c.sweep.zip.l: sweep variable 'l' is listed twice"),
    ("{zip: [0, 1]}", "conditions.c.sweep.zip: 'zip' holds variables swept together"),
    ("{l: [0, 0.0]}", "conditions.c.sweep.l[1]: duplicate sweep value 0.0"),
])
def test_bad_sweep_sections_are_located(sweep, message):
    found = problems_of(spec_text(f"  c: {{sweep: {sweep}, interventions: [{{kind: zero, site: layer, layers: [0]}}]}}\n"))
    assert len(found) == 1 and found[0].startswith(message), found


# ------------------------------------------------------------------ validate checks every run


def test_each_run_is_validated_as_a_hand_written_condition_and_named():
    hand = problems_of(spec_text("  steer: {interventions: [{kind: scale, site: layer, layers: [0.5], factor: 2.0}]}\n"))
    swept = problems_of(spec_text(
        "  steer: {sweep: {c: [1, 0.5, 2.0]}, interventions: [{kind: scale, site: layer, layers: [$c], factor: 2.0}]}\n"))
    # the same message as the hand-written condition's, at the run whose value does not fit
    assert hand == ["conditions.steer.interventions[0].layers[0]: got 0.5 (float); expected a layer index (an integer >= 0)"]
    assert swept == [hand[0].replace("steer", "steer[c=0.5]"), hand[0].replace("steer", "steer[c=2.0]").replace("0.5", "2.0")]
    # a sweep's values are all numbers or all words; a word where a number is expected
    assert problems_of(spec_text("  z: {sweep: {p: [vision, 3]}, interventions: [{kind: zero, site: embed, positions: $p}]}\n")) \
        == ["conditions.z.sweep.p[0]: got 'vision' (str); expected a number (a sweep's values are all numbers or all words)"]
    assert problems_of(spec_text("  z: {sweep: {p: [vision, bogus]}, interventions: [{kind: zero, site: embed, positions: $p}]}\n")) \
        == ["conditions.z.sweep.p[1]: got 'bogus' (str); expected a number or one of 'vision', 'text', 'boundary', 'all', "
            "'last', 'keys', 'values', 'keys+values'"]
    assert problems_of(spec_text("  s: {sweep: {p: [text]}, interventions: [{kind: scale, site: embed, factor: $p}]}\n")) \
        == ["conditions.s[p=text].interventions[0].factor: got 'text' (str); expected a number or a '$variable' from "
            "this condition's sweep"]
    assert problems_of(spec_text("  s: {interventions: [{kind: scale, site: embed, positions: [$q], factor: 1.0}]}\n")) \
        == ["conditions.s.interventions[0].positions[0]: '$q' is not defined; expected a value, or add "
            "'sweep: {q: [...]}' to this condition"]


def test_a_huge_sweep_is_checked_per_value_not_per_run():
    """100 x 1,000 runs: each variable's values are checked once each (1,100 checks), and a
    variable that fails at many values is reported at a few, then counted."""
    values = ", ".join(str(-v) for v in range(1, 1001))
    found = problems_of(spec_text(
        f"  big: {{sweep: {{f: [{', '.join(str(0.1 * k) for k in range(100))}], l: [{values}]}}, "
        "interventions: [{kind: scale, site: layer, layers: [$l], factor: $f}]}\n"))
    assert len(found) == 6
    assert "conditions.big[f=0.0,l=-1].interventions[0].layers[0]: got -1 (int); expected a layer index (an integer >= 0)" in found
    assert "conditions.big[f=0.0,l=-5].interventions[0].layers[0]: got -5 (int); expected a layer index (an integer >= 0)" in found
    assert [f for f in found if f.startswith("conditions.big.sweep: 995 more values of '$l' fail the same way")]


def test_variables_sharing_a_field_are_checked_together():
    """Two variables in one `layers` list: only the runs where they are equal repeat a layer; a
    zip's pairs are the only combinations it makes."""
    found = problems_of(spec_text("  c: {sweep: {a: [0, 1], b: [1, 2]}, interventions: [{kind: zero, site: layer, "
                                  "layers: [$a, $b]}]}\n"))
    assert found == ["conditions.c[a=1,b=1].interventions[0].layers[1]: duplicate layer index 1; expected each layer index once"]
    parse_spec(spec_text("  c: {sweep: {zip: {a: [0, 1], b: [1, 0]}}, interventions: [{kind: zero, site: layer, "
                         "layers: [$a, $b]}]}\n"))  # (0, 0) and (1, 1) are no run


def test_validate_names_the_run_a_model_cannot_give(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("""\
  trace: {sweep: {l: [0, 1, 7, 9]}, interventions: [{kind: zero, site: layer, layers: $l}]}
  every: {sweep: {f: [0.5, 2.0]}, interventions: [{kind: scale, site: projector, factor: $f}]}
""", store=str(tmp_path / "s.zarr"), model="tiny-llama"))
    assert main(["validate", str(spec), "--models-check"]) == 2
    err = capsys.readouterr().err
    assert "conditions.trace[l=7].interventions[0].layers: tiny-llama: layers [7] out of range (2 decoder layers); expected 0..2" in err
    assert "conditions.trace[l=9].interventions[0].layers: tiny-llama: layers [9] out of range" in err
    # what every run of a condition shares is said once, at the condition
    assert err.count("a text-only model has no site 'projector'") == 1
    assert "conditions.every.interventions[0].site: tiny-llama: a text-only model has no site 'projector'" in err
    assert not (tmp_path / "s.zarr").exists()


# ------------------------------------------------------------------ a swept patch runs as hand-written ones


def test_a_patch_swept_over_layers_stores_what_hand_written_conditions_do(tmp_path):
    common = "  baseline: {}\n  blank: {image: blank}\n"
    edit = "{kind: patch, site: layer, layers: %s, positions: vision, from: blank}"
    swept = common + f"  patch: {{sweep: {{l: [0, 1, 2]}}, interventions: [{edit % '$l'}]}}\n"
    hand = common + "".join(f"  patch_l{l}: {{interventions: [{edit % [l]}]}}\n" for l in (0, 1, 2))
    stores = {}
    for name, conditions in (("swept", swept), ("hand", hand)):
        stores[name] = tmp_path / f"{name}.zarr"
        run_spec(parse_spec(spec_text(conditions, str(stores[name]))), progress=False, log=lambda _: None)
    ds = {name: workbench.open_store(path, model="tiny-qwen3vl", index=False).load() for name, path in stores.items()}

    def labels(name: str, label: str) -> np.ndarray:
        return np.asarray(ds[name][label].values).astype(object).astype(str)

    def hidden(name: str, condition: str) -> np.ndarray:
        return ds[name].hidden.values[labels(name, "condition") == condition]

    vision = labels("swept", "modality")[labels("swept", "condition") == "blank"] == "vision"
    for l in (0, 1, 2):
        np.testing.assert_array_equal(hidden("swept", f"patch[l={l}]"), hidden("hand", f"patch_l{l}"))
        # the patched layer's vision rows are the blank image's; the text rows below it the baseline's
        np.testing.assert_array_equal(hidden("swept", f"patch[l={l}]")[vision, l], hidden("swept", "blank")[vision, l])
        np.testing.assert_array_equal(hidden("swept", f"patch[l={l}]")[~vision, :l + 1],
                                      hidden("swept", "baseline")[~vision, :l + 1])
    assert not np.array_equal(hidden("swept", "patch[l=0]"), hidden("swept", "patch[l=2]"))
    runs = labels("swept", "run_condition")
    assert [float(ds["swept"].run_l.values[runs == f"patch[l={l}]"][0]) for l in (0, 1, 2)] == [0.0, 1.0, 2.0]


# ------------------------------------------------------------------ a store with runs named by their values


def write_old_named_store(path) -> None:
    """A store as the runner wrote swept runs when their names held the values alone ('alpha=0.5'),
    written through the store API: a baseline and one swept run of tiny-llama."""
    rng = np.random.default_rng(0)
    with StoreWriter(path) as store:
        for name, sweep in (("baseline", {}), ("alpha=0.5", {"alpha": 0.5})):
            identity = {"sweep": sweep, "data": {"source": "builtin"}, "capture": "logits"}
            store.check_condition("tiny-llama", name, identity)
            variables = {
                "position": Variable(("token",), np.arange(4, dtype=np.int64)),
                "modality": Variable(("token",), np.array(["text"] * 4)),
                "token_id": Variable(("token",), np.arange(4, dtype=np.int64)),
                "logprobs": Variable(("run", "step", "vocab"),
                                     np.log(rng.dirichlet(np.ones(16), size=(1, 1))).astype(np.float32)),
                "nonfinite": Variable(("run",), np.array([0], dtype=np.int64)),
            }
            store.write_sample("tiny-llama", name, "builtin/counting/000", variables,
                               {"sweep": sweep, "identity": identity}, input_hash="h")
        store.finish_run()


def test_a_store_with_runs_named_by_their_values_opens_analyses_and_is_not_resumed(tmp_path, capsys):
    from analyses import logits

    store = tmp_path / "old.zarr"
    write_old_named_store(store)
    ds = workbench.open_store(store, model="tiny-llama")
    kl = logits.logit_kl(ds, "baseline", step=0).sel(stat="value")
    p, q = (np.exp(ds.logprobs.sel(run_condition=c).values[0, 0].astype(np.float64)) for c in ("baseline", "alpha=0.5"))
    assert float(kl.sel(condition="alpha=0.5")) == pytest.approx(float(np.sum(p * np.log(p / q))), rel=1e-4)
    assert float(kl.alpha.sel(condition="alpha=0.5")) == 0.5  # the swept value, read from the run's attrs

    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text("  baseline: {}\n  alpha: {sweep: {alpha: [0.5, 2.0]}, interventions: "
                              "[{kind: scale, site: embed, factor: $alpha}]}\n", str(store), model="tiny-llama",
                              capture="[{site: logits}]"))
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 2
    err = capsys.readouterr().err
    assert ("tiny-llama: the store holds 1 swept run(s) named without their condition ('alpha=0.5' is now "
            "'alpha[alpha=0.5]')") in err
    assert "write to a new store (--store)" in err
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before  # nothing written
