"""A synthetic store whose analysis results are known by construction (tests, demos, a first look
at the tables and figures without a model or a GPU).

It is written with `workbench.store.StoreWriter` exactly as the runner writes (same variables,
dims and token labels), but every tensor is built from closed-form parameters:

- layout of sample i: text (2 + i % 2), boundary, vision (5 + i % 3), boundary, text (3);
  condition `none` keeps only the text tokens (positions renumbered);
- `hidden`: every token of (sample i, modality m) has the same norm at a layer, a random
  direction at layer 0, and rotates in a fixed plane, so that
  ‖h_l‖ = c_i · NORM[m](l) (c_i = 1 + 0.25 i; vision carries the factor `ratio`) and
  cos(h_l, h_0) = COS[m](l) exactly; α scales every vision row at every layer by α (directions
  unchanged), so the layer-0 vision/text ratio under α is α · ratio; `blank` has the baseline's
  text curves times (1 + 0.01 i) (correlation exactly 1); `none` has text norms bent by a
  layer-dependent factor (a correlation below 1, computed in the tests);
- `keys`/`values`: random at baseline; under α, every vision row is rotated away from the
  baseline row by the angle arccos(KCOS(α, l)) (keys) and arccos(VCOS(α, l)) (values), norms
  kept; text rows unchanged; `blank`/`hybrid` vision rows rotated by fixed angles;
- `prefill_vision_mass`, `prefill_text_attention`: uniform random;
- `decode_attention`: a random distribution over prompt keys per (step, layer, head); under
  α = 3 vision rows are multiplied by 2 and text rows rescaled to keep the sum 1 (renormalized
  over vision keys the distribution is unchanged: attention KL exactly 0, vision mass changed);
  other conditions draw fresh distributions;
- `logprobs`: log-softmax of random logits per (sample, step); α = 1 equals the baseline (KL 0,
  rank 0); α = 0.1 moves the baseline's top token to rank exactly `TOP_RANK_AT_0_1` at step 0;
- `attn_out` = 0.4 (h_{l+1} − h_l), `mlp_out` = 0.6 (h_{l+1} − h_l) (`ATTN_PART`); `lens_ids`,
  `lens_logprobs`: the top `LENS_K` of a random log-softmax per (token, layer);
- `router_logits`, `router_experts`: random logits over `experts` experts per (token, decoder
  layer), vision tokens' raised by `VISION_BIAS` on the first half of the experts (vision and
  text loads differ), and their top `top_k` experts, best first;
- the vision tower (norm atlas): `PATCHES_PER_TOKEN` patches per vision token, each of norm
  c_i · vision_layer_norm(l) in `vision_hidden` and c_i · `TOWER_NORM` in `vision` (none without
  an image); `embed_table_norms`: the same `SyntheticModel.table()` in every run;
- patch geometry: the vision tokens of a sample fill rows of `GRID_COLS` cells of `CELL` pixels
  (tile 0 of image 0, row-major), every other token -1 (no image to regenerate: no data source);
- with `generated`, the run labels the accuracy analysis scores (`answer_is_right`): even samples
  are `counting` items (answer `str(i % 5)`, mode `numeric`, a right response `"There are N."`),
  odd ones `color` items (answer `red`, mode `exact`, a right response `"Red."`); the response
  is right under the baseline and α = 1 always, under α = 3 for even samples, under α = 0.1
  never, under any other condition for samples with i % 3 == 0; a wrong one is `"no idea"`; the
  answer's tokens (`run_answer_ids`) are the one token `answer_token(i, vocab)`;
- with `scan_layers`, a denoising patching scan `trace[l=..,pos=..]` (blank <- baseline): each run
  the blank run with logprobs moved w = `scan_weight(l, pos)` of the way to the baseline's, so
  its normalized effect on a logit difference is exactly w (`scan_runs`); `scan_tokens` adds
  single token indices to its position groups, and `scan_heads` a scan `heads` (site
  attn_heads) whose run at (head h, layer, position) has weight `scan_weight` · `head_share(h)`.

Pass `jitter > 0` to give each token its own norm (the closed forms above then hold only
approximately; independent computations in the tests still apply).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from pathlib import Path

import numpy as np

from workbench.names import GEOMETRY_LABELS
from workbench.store import StoreWriter, Variable

TOP_RANK_AT_0_1 = 3
PATCHES_PER_TOKEN = 2
TOWER_NORM = 40.0


def vision_layer_norm(layer: int | np.ndarray) -> np.ndarray:
    """Norm of every patch of sample factor 1 at vision-tower layer l."""
    return 10.0 * (1.0 + np.asarray(layer, dtype=float))


@dataclass
class SyntheticModel:
    model_id: str
    n_layers: int = 3          # decoder layers; hidden has layers 0..n_layers
    dim: int = 16
    heads: int = 2
    kv: int = 8
    vocab: int = 40
    steps: int = 2
    ratio: float = 15.0        # vision/text norm ratio at layer 0 (baseline)
    vision_layers: int = 2
    vision_dim: int = 8
    experts: int = 4           # router_logits / router_experts (a mixture-of-experts decoder)
    top_k: int = 2
    captures: tuple[str, ...] | None = None   # variables this model stores (None: all asked for)
    extra_conditions: tuple[str, ...] | None = None   # of blank/none/hybrid (None: all asked for)
    step: int | None = None    # a checkpoint of SYNTHETIC_TRAINING at this step (attrs `training`), or none

    def norm(self, modality: str, layer: int | np.ndarray) -> np.ndarray:
        """Norm schedule per layer for sample factor 1 (vision carries `ratio`)."""
        layer = np.asarray(layer, dtype=float)
        if modality == "vision":
            return self.ratio * (1.0 + 0.1 * layer)
        if modality == "boundary":
            return 2.0 * (1.0 + 0.5 * layer)
        return 1.0 + 5.0 * layer

    def table(self) -> np.ndarray:
        """Row norms of the embedding table (vocab,): a fixed spread around 1."""
        return 0.5 + (np.arange(self.vocab) * 0.37) % 1.0

    def cos(self, modality: str, layer: int | np.ndarray) -> np.ndarray:
        """cos(h_l, h_0): the rotation angle grows linearly with the layer, at a per-modality rate."""
        rate = {"vision": 0.25, "boundary": 0.8, "text": 1.4}[modality]
        return np.cos(np.minimum(rate * np.asarray(layer, dtype=float), np.pi))

    def kcos(self, alpha: float, layer: int | np.ndarray) -> np.ndarray:
        """cos(K', K) at vision rows under α (1 at α = 1)."""
        return np.cos(np.minimum(0.2 * abs(np.log(alpha)) * (1 + 0.1 * np.asarray(layer)), np.pi / 2))

    def vcos(self, alpha: float, layer: int | np.ndarray) -> np.ndarray:
        """cos(V', V) at vision rows under α (1 at α = 1): values turn faster than keys."""
        return np.cos(np.minimum(0.5 * abs(np.log(alpha)) * (1 + 0.1 * np.asarray(layer)), np.pi / 2))


# the default models as two checkpoints of one training run (the training-norms analysis)
SYNTHETIC_TRAINING: dict[str, Any] = {"name": "syn/trained", "stages": [{"stage": "vocab", "start": 0, "end": 50},
                                                       {"stage": "align", "start": 50, "end": 150}]}
DEFAULT_MODELS = (
    SyntheticModel("syn/a-small", n_layers=3, dim=16, heads=2, kv=8, vocab=40, ratio=15.0, step=0),
    # a second model run with less: no K/V or prefill attention, only the α sweep (tables leave it
    # out where it lacks inputs, saying so)
    SyntheticModel("syn/b-deeper", n_layers=4, dim=12, heads=4, kv=6, vocab=30, ratio=20.0,
                   captures=("hidden", "decode_attention", "logprobs", "generated"), extra_conditions=(), step=150),
)


@dataclass
class SyntheticStore:
    path: Path
    models: tuple[SyntheticModel, ...]
    samples: list[str]
    alphas: tuple[float, ...]
    conditions: list[str] = field(default_factory=list)


GRID_COLS, CELL = 3, 16  # the synthetic patch geometry: vision tokens in rows of 3 cells of 16 px


def _geometry(modality: np.ndarray) -> dict[str, Variable]:
    """The geometry labels of one prompt (`workbench.names.GEOMETRY_LABELS`): vision tokens in rows
    of GRID_COLS cells of CELL pixels, -1 elsewhere."""
    n = len(modality)
    table = np.full((n, len(GEOMETRY_LABELS)), -1.0)
    vision = np.flatnonzero(modality == "vision")
    row, col = np.divmod(np.arange(len(vision)), GRID_COLS)
    table[vision] = np.stack([0 * row, 0 * row, row, col, col * CELL, row * CELL, (col + 1) * CELL, (row + 1) * CELL], 1)
    return {name: Variable(("token",), table[:, j].astype(np.int32 if j < 4 else np.float32))
            for j, name in enumerate(GEOMETRY_LABELS)}


def sample_factor(i: int) -> float:
    return 1.0 + 0.25 * i


def layout(i: int, with_image: bool = True) -> np.ndarray:
    pre, vision, post = 2 + i % 2, 5 + i % 3, 3
    if not with_image:
        return np.array(["text"] * (pre + post))
    return np.array(["text"] * pre + ["boundary"] + ["vision"] * vision + ["boundary"] + ["text"] * post)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _orthogonal_unit(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
    """A unit vector per row orthogonal to the (unit) row of `base`."""
    other = rng.standard_normal(base.shape)
    other -= (other * base).sum(-1, keepdims=True) * base
    return _unit(other)


def _rotate(rng: np.random.Generator, rows: np.ndarray, cos: np.ndarray | float) -> np.ndarray:
    """Rows turned by angle arccos(cos) (per row or broadcast), norms kept."""
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    base = rows / norms
    perp = _orthogonal_unit(rng, base)
    cos = np.asarray(cos)[..., None]
    return norms * (cos * base + np.sqrt(np.clip(1 - cos**2, 0, None)) * perp)


def _hidden(m: SyntheticModel, rng: np.random.Generator, modality: np.ndarray, i: int, condition: str,
            alpha: float | None, jitter: float) -> np.ndarray:
    n, layers = len(modality), np.arange(m.n_layers + 1)
    h0 = _unit(rng.standard_normal((n, m.dim)))
    perp = _orthogonal_unit(rng, h0)
    out = np.empty((n, m.n_layers + 1, m.dim))
    c = sample_factor(i)
    for t, mod in enumerate(modality):
        norm = c * m.norm(mod, layers) * (1 + jitter * rng.uniform(-1, 1))
        cos = m.cos(mod, layers)
        if mod == "text" and condition == "blank":
            norm = norm * (1 + 0.01 * i)
        if mod == "text" and condition == "none":
            norm = norm * (1 + 0.3 * np.sin(layers + i))
        if mod == "vision" and alpha is not None:
            norm = norm * alpha
        if mod == "vision" and condition in ("blank", "hybrid"):
            cos = m.cos(mod, layers * 1.5)
        sin = np.sqrt(np.clip(1 - cos**2, 0, None))
        out[t] = norm[:, None] * (cos[:, None] * h0[t] + sin[:, None] * perp[t])
    return out


def write_synthetic_store(
    path: str | Path,
    models: tuple[SyntheticModel, ...] = DEFAULT_MODELS,
    n_samples: int = 4,
    alphas: tuple[float, ...] = (0.1, 1.0, 3.0),
    extra_conditions: tuple[str, ...] = ("blank", "none", "hybrid"),
    variables: tuple[str, ...] = ("hidden", "keys", "values", "prefill_vision_mass", "prefill_text_attention",
                                  "decode_attention",
                                  "logprobs", "generated", "vision", "vision_hidden", "embed_table_norms",
                                  "attn_out", "mlp_out", "lens_ids", "lens_logprobs", "router_logits",
                                  "router_experts"),
    jitter: float = 0.0,
    seed: int = 0,
    first_sample: int = 0,
    geometry: bool = True,
    scan_layers: tuple[int, ...] = (),
    scan_tokens: tuple[int, ...] = (),
    scan_heads: tuple[int, ...] = (),
) -> SyntheticStore:
    """Write (or extend, with `first_sample`) a synthetic store; see the module docstring.
    geometry=False: no patch geometry, as a store written before it was stored.
    scan_layers: also a patching scan `trace` at these layers (`scan_runs`); scan_tokens: the
    token indices it also patches one at a time; scan_heads: also a scan `heads` over these heads
    (site attn_heads)."""
    path = Path(path)
    samples = [f"synthetic/{i:03d}" for i in range(first_sample, first_sample + n_samples)]
    conditions = ["baseline", *[f"alpha={a}" for a in alphas], *extra_conditions]
    with StoreWriter(path) as writer:
        for k, m in enumerate(models):
            training = {} if m.step is None else {"training": {**SYNTHETIC_TRAINING, "step": m.step, "stage": next(
                s["stage"] for s in SYNTHETIC_TRAINING["stages"] if s["start"] <= m.step <= s["end"])}}
            writer.ensure_model(m.model_id, {"family": "synthetic", "n_layers": m.n_layers, "hidden_size": m.dim,
                                             "kv_heads": 2, **training})  # keys/values: kv = 2 heads x kv/2
            written: dict[str, dict[str, Variable]] = {}
            for i_sample, sample in zip(range(first_sample, first_sample + n_samples), samples):
                rng = np.random.default_rng([seed, k, i_sample])
                base = _sample_tensors(m, rng, i_sample)
                for condition in conditions:
                    if condition in extra_conditions and m.extra_conditions is not None \
                            and condition not in m.extra_conditions:
                        continue
                    alpha = float(condition.split("=")[1]) if condition.startswith("alpha=") else None
                    crng = np.random.default_rng([seed, k, i_sample, sum(map(ord, condition))])
                    tensors = _condition_tensors(m, crng, base, i_sample, condition, alpha, jitter)
                    keep = set(variables) & set(m.captures or variables)
                    tensors = {name: v for name, v in tensors.items() if name in keep or name in
                               ("position", "modality", "token_id", *(GEOMETRY_LABELS if geometry else ()))
                               or (name == "patch_position" and {"vision", "vision_hidden"} & keep)}
                    if "generated" in keep:
                        tensors.update(_answer_labels(i_sample, condition, m.vocab))
                    attrs: dict[str, Any] = {"sweep": {"alpha": alpha}} if alpha is not None else {}
                    attrs["image"] = {"blank": "blank", "none": "none"}.get(condition, "real")
                    writer.write_sample(m.model_id, condition, sample, tensors, condition_attrs=attrs)
                    written[condition] = tensors
                for condition, tensors, attrs in scan_runs(m, written, scan_layers, scan_tokens, scan_heads):
                    writer.write_sample(m.model_id, condition, sample, tensors, condition_attrs=attrs)
                written.clear()
    return SyntheticStore(path, tuple(models), samples, tuple(alphas), conditions)


def answer_is_right(i: int, condition: str) -> bool:
    """Whether sample i's synthetic response is right under `condition` (module doc)."""
    if condition in ("baseline", "alpha=1.0"):
        return True
    if condition == "alpha=3.0":
        return i % 2 == 0
    return condition != "alpha=0.1" and i % 3 == 0


def answer_token(i: int, vocab: int) -> int:
    """The token id sample i's answer is stored as (`run_answer_ids`: one token)."""
    return (7 * i + 3) % vocab


SCAN_POSITIONS = ("vision", "text", "last")


def scan_weight(layer: int, position: str, n_layers: int) -> float:
    """How far the scan's run at (layer, position) moves the blank run's logits toward the
    baseline's: vision carries the image early, text late, the last token in between; token
    index p a share (1 + p % 4) / 8 of vision's."""
    x = layer / n_layers
    if position.isdigit():
        return (1 - x) * (1 + int(position) % 4) / 8
    return {"vision": 1 - x, "text": x, "last": 0.5 * x * x}[position]


def scan_runs(m: SyntheticModel, written: dict[str, dict[str, Variable]], layers: tuple[int, ...],
              tokens: tuple[int, ...] = (), heads: tuple[int, ...] = ()
              ) -> list[tuple[str, dict[str, Variable], dict[str, Any]]]:
    """A denoising scan `trace` (blank <- baseline at `layer`): each run is the blank run with its
    logprobs the log-softmax of (1 - w) ln p_blank + w ln p_baseline, w = `scan_weight`. So the
    logit difference of any two tokens moves from the blank's by exactly w of the way to the
    baseline's: its normalized effect is w."""
    if not layers or "blank" not in written or "baseline" not in written or "logprobs" not in written["blank"]:
        return []
    blank = written["blank"]["logprobs"].data.astype(np.float64)
    clean = written["baseline"]["logprobs"].data.astype(np.float64)
    runs = []
    cells: list[tuple[str, int, int | None, str]] = [("trace", layer, None, position) for layer in layers for position in (*SCAN_POSITIONS, *map(str, tokens))]
    cells += [("heads", layer, head, position) for layer in layers for head in heads for position in ("vision", "last")]
    for scan, layer, head, position in cells:
        w = scan_weight(layer, position, m.n_layers) * (1 if head is None else head_share(head, m.heads))
        logprobs = _log_softmax((1 - w) * blank + w * clean)
        tensors = {**written["blank"], "logprobs": Variable(("run", "step", "vocab"), logprobs.astype(np.float32))}
        if "generated" in tensors:
            tensors["generated"] = Variable(("run", "step"), logprobs.argmax(-1).astype(np.int64))
        sweep = {"l": layer, "pos": position, "dir": "denoising", "scan_base": "blank", "scan_donor": "baseline",
                 "scan_site": "layer" if head is None else "attn_heads"}
        name = f"{scan}[l={layer},pos={position}]" if head is None else f"{scan}[l={layer},h={head},pos={position}]"
        runs.append((name, tensors, {"sweep": sweep if head is None else {"h": head, **sweep}, "image": "blank"}))
    return runs


def head_share(head: int, heads: int) -> float:
    """The share of its (layer, position) cell's weight that patching one head carries."""
    return (1 + head) / (heads + 1)


def _answer_labels(i: int, condition: str, vocab: int) -> dict[str, Variable]:
    """run_category, run_answer, run_all_answers, run_eval_mode, run_response and run_answer_ids of sample i."""
    category, answer, mode, right = (("counting", str(i % 5), "numeric", f"There are {i % 5}.") if i % 2 == 0
                                     else ("color", "red", "exact", "Red."))
    response = right if answer_is_right(i, condition) else "no idea"
    return {name: Variable(("run",), np.array([text], dtype=object)) for name, text in
            (("run_category", category), ("run_answer", answer), ("run_all_answers", "[]"), ("run_eval_mode", mode),
             ("run_response", response), ("run_answer_ids", f"[{answer_token(i, vocab)}]"))}


def _sample_tensors(m: SyntheticModel, rng: np.random.Generator, i: int) -> dict[str, np.ndarray]:
    modality = layout(i)
    n = len(modality)
    logits = rng.standard_normal((m.steps, m.vocab)) * 2.0
    return {
        "modality": modality,
        "token_id": rng.integers(0, m.vocab, n),
        "keys": rng.standard_normal((n, m.n_layers, m.kv)),
        "values": rng.standard_normal((n, m.n_layers, m.kv)),
        "attention": rng.dirichlet(np.ones(n), size=(m.steps, m.n_layers, m.heads)).transpose(3, 0, 1, 2),
        "prefill": rng.uniform(size=(n, m.n_layers, m.heads)),
        "logits": logits,
        "received": rng.uniform(size=(n, m.n_layers, m.heads)),  # drawn last: the draws above keep their values
    }


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _condition_tensors(m: SyntheticModel, rng: np.random.Generator, base: dict, i: int, condition: str,
                       alpha: float | None, jitter: float) -> dict[str, Variable]:
    with_image = condition != "none"
    modality = layout(i, with_image)
    n = len(modality)
    token_id = base["token_id"] if with_image else base["token_id"][base["modality"] == "text"]
    hidden = _hidden(m, rng, modality, i, condition, alpha, jitter)
    keys, values = base["keys"].copy(), base["values"].copy()
    vision = modality == "vision"
    if alpha is not None and alpha != 1.0:
        for li in range(m.n_layers):
            keys[vision, li] = _rotate(rng, keys[vision, li], m.kcos(alpha, li))
            values[vision, li] = _rotate(rng, values[vision, li], m.vcos(alpha, li))
    elif condition in ("blank", "hybrid"):
        keys[vision] = _rotate(rng, keys[vision], 0.5)
        values[vision] = _rotate(rng, values[vision], 0.2)
    if not with_image:
        keys, values = keys[base["modality"] == "text"], values[base["modality"] == "text"]
    attention = base["attention"].copy() if with_image else None
    if alpha == 3.0:
        if attention is None:
            raise ValueError("the alpha=3.0 condition moves attention mass onto the image; it needs one")
        # move half of the text mass onto the vision keys, proportionally: the distribution
        # renormalized over vision keys is unchanged, the vision mass is not
        mass_v = attention[vision].sum(0)
        attention[vision] *= (mass_v + (1 - mass_v) / 2) / mass_v
        attention[~vision] *= 0.5
    elif condition != "baseline" and alpha != 1.0:
        attention = rng.dirichlet(np.ones(n), size=(m.steps, m.n_layers, m.heads)).transpose(3, 0, 1, 2)
    prefill = base["prefill"] if with_image else base["prefill"][base["modality"] == "text"]
    received = base["received"] if with_image else base["received"][base["modality"] == "text"]
    if condition != "baseline" and alpha != 1.0:
        prefill = np.clip(prefill + 0.05 * rng.standard_normal(prefill.shape), 0, 1)
        received = received * 0.5  # no draw: the conditions' other draws keep their values
    logits = base["logits"].copy()
    if alpha == 0.1:
        # the baseline's top token falls to rank exactly TOP_RANK_AT_0_1 at step 0
        top = int(np.argmax(logits[0]))
        others = np.delete(np.arange(m.vocab), top)
        logits[0, others] += 0.2 * rng.standard_normal(m.vocab - 1)
        ranked = np.sort(logits[0, others])[::-1]
        logits[0, top] = (ranked[TOP_RANK_AT_0_1 - 1] + ranked[TOP_RANK_AT_0_1]) / 2
        logits[1:] += 0.3 * rng.standard_normal(logits[1:].shape)
    elif condition != "baseline" and alpha != 1.0:
        scale = 0.5 if alpha is None else abs(np.log(alpha))
        logits = logits + scale * rng.standard_normal(logits.shape)
    if attention is None:
        raise ValueError(f"{condition}: no decode attention (a condition without an image keeps the baseline's)")
    logprobs = _log_softmax(logits)
    layer, decoder_layer = np.arange(m.n_layers + 1), np.arange(m.n_layers)
    return {
        **_tower(m, rng, i, int(vision.sum()) if with_image else 0),
        **_branches_and_lens(m, rng, hidden),
        **_router(m, rng, modality),
        **_geometry(modality),
        "position": Variable(("token",), np.arange(n, dtype=np.int64)),
        "modality": Variable(("token",), modality.astype(str)),
        "token_id": Variable(("token",), token_id.astype(np.int64)),
        "hidden": Variable(("token", "layer", "dim"), hidden.astype(np.float32), {"layer": layer}),
        "keys": Variable(("token", "decoder_layer", "kv"), keys.astype(np.float32), {"decoder_layer": decoder_layer}),
        "values": Variable(("token", "decoder_layer", "kv"), values.astype(np.float32), {"decoder_layer": decoder_layer}),
        "prefill_vision_mass": Variable(("token", "decoder_layer", "head"), prefill.astype(np.float32),
                                        {"decoder_layer": decoder_layer}),
        "prefill_text_attention": Variable(("token", "decoder_layer", "head"), received.astype(np.float32),
                                           {"decoder_layer": decoder_layer}),
        "decode_attention": Variable(("token", "step", "decoder_layer", "head"), attention.astype(np.float32),
                                     {"decoder_layer": decoder_layer}),
        "logprobs": Variable(("run", "step", "vocab"), logprobs[None].astype(np.float32)),
        "generated": Variable(("run", "step"), logprobs.argmax(-1)[None].astype(np.int64)),
    }


ATTN_PART = 0.4  # the attention branch's part of each update; the MLP's is the rest
LENS_K = 5


def _branches_and_lens(m: SyntheticModel, rng: np.random.Generator, hidden: np.ndarray) -> dict[str, Variable]:
    """`attn_out` = ATTN_PART · (h_{l+1} − h_l) and `mlp_out` the rest (the residual identity holds);
    the logit lens: the top LENS_K of a random log-softmax per (token, layer)."""
    update = hidden[:, 1:] - hidden[:, :-1]
    decoder_layer, layer = {"decoder_layer": np.arange(m.n_layers)}, {"layer": np.arange(m.n_layers + 1)}
    lens = _log_softmax(2.0 * rng.standard_normal((*hidden.shape[:2], m.vocab)))
    order = np.argsort(-lens, axis=-1, kind="stable")[..., :LENS_K]
    return {
        "attn_out": Variable(("token", "decoder_layer", "dim"), (ATTN_PART * update).astype(np.float32), decoder_layer),
        "mlp_out": Variable(("token", "decoder_layer", "dim"), ((1 - ATTN_PART) * update).astype(np.float32), decoder_layer),
        "lens_ids": Variable(("token", "layer", "lens_rank"), order.astype(np.int64), layer),
        "lens_logprobs": Variable(("token", "layer", "lens_rank"),
                                  np.take_along_axis(lens, order, -1).astype(np.float32), layer),
    }


VISION_BIAS = 1.5


def _router(m: SyntheticModel, rng: np.random.Generator, modality: np.ndarray) -> dict[str, Variable]:
    """Router logits (vision tokens biased towards the first half of the experts) and their top-k."""
    logits = rng.standard_normal((len(modality), m.n_layers, m.experts))
    logits[modality == "vision", :, : m.experts // 2] += VISION_BIAS
    chosen = np.argsort(-logits, axis=-1, kind="stable")[..., : m.top_k]
    decoder_layer = {"decoder_layer": np.arange(m.n_layers)}
    return {"router_logits": Variable(("token", "decoder_layer", "expert"), logits.astype(np.float32), decoder_layer),
            "router_experts": Variable(("token", "decoder_layer", "expert_rank"), chosen.astype(np.int64), decoder_layer)}


def _tower(m: SyntheticModel, rng: np.random.Generator, i: int, n_vision: int) -> dict[str, Variable]:
    """The vision-tower captures and the embedding table of one run (see the module doc)."""
    out = {"embed_table_norms": Variable(("run", "embed_row"), m.table()[None].astype(np.float32))}
    if not n_vision:
        return out
    n = PATCHES_PER_TOKEN * n_vision
    directions = _unit(rng.standard_normal((n, m.vision_layers + 1, m.vision_dim)))
    scale = sample_factor(i) * np.append(vision_layer_norm(np.arange(m.vision_layers)), TOWER_NORM)
    rows = directions * scale[None, :, None]
    out["vision_hidden"] = Variable(("vision_patch", "vision_layer", "vision_dim"), rows[:, :-1].astype(np.float32),
                                    {"vision_layer": np.arange(m.vision_layers)})
    out["vision"] = Variable(("vision_patch", "vision_dim"), rows[:, -1].astype(np.float32))
    out["patch_position"] = Variable(("vision_patch",), np.arange(n, dtype=np.int64))
    return out


def synthetic_store_once(path: str | Path, **kwargs) -> SyntheticStore:
    """`write_synthetic_store(path, **kwargs)` unless a previous call already completed it (a
    marker file beside the store records that): lets several test modules share one store."""
    path = Path(path)
    marker = path.with_name(path.name + ".complete")
    if not marker.exists():
        store = write_synthetic_store(path, **kwargs)
        marker.write_text("synthetic store complete\n")
        return store
    models = kwargs.get("models", DEFAULT_MODELS)
    n, first = kwargs.get("n_samples", 4), kwargs.get("first_sample", 0)
    alphas = tuple(kwargs.get("alphas", (0.1, 1.0, 3.0)))
    extra = kwargs.get("extra_conditions", ("blank", "none", "hybrid"))
    return SyntheticStore(path, tuple(models), [f"synthetic/{i:03d}" for i in range(first, first + n)], alphas,
                          ["baseline", *[f"alpha={a}" for a in alphas], *extra])


def write_probe_store(path: str | Path, n_samples: int = 40, n_layers: int = 3, dim: int = 16, signal: float = 3.0,
                      signal_from: int = 1, classes: tuple[str, ...] = ("red", "blue"), n_vision: int = 6,
                      n_text: int = 4, conditions: tuple[str, ...] = ("baseline", "blank"), seed: int = 0,
                      model_id: str = "syn/probe") -> SyntheticStore:
    """A store with a planted linear signal (the `probe` analysis's known answer): sample i has the
    field `colour` = classes[i % len(classes)] (run label `run_colour`, and `run_category` "color"
    for even samples, "shape" for odd ones); every token's `hidden` is standard normal noise, and
    under `baseline` the vision tokens of layers >= `signal_from` add `signal` times a fixed unit
    direction per class (each class its own). Text, boundary tokens, layers below `signal_from` and
    every other condition (e.g. `blank`) hold noise only: a probe decodes the colour from baseline
    vision tokens at those layers, and nothing anywhere else."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    directions = _unit(rng.standard_normal((len(classes), dim)))
    samples = [f"probe/{i:04d}" for i in range(n_samples)]
    modality = np.array(["text"] * n_text + ["boundary"] + ["vision"] * n_vision + ["boundary"] + ["text"] * 2)
    n = len(modality)
    layer = np.arange(n_layers + 1)
    with StoreWriter(path) as writer:
        writer.ensure_model(model_id, {"family": "synthetic", "n_layers": n_layers, "hidden_size": dim})
        for i, sample in enumerate(samples):
            colour = classes[i % len(classes)]
            for condition in conditions:
                hidden = np.random.default_rng([seed, i, sum(map(ord, condition))]).standard_normal((n, n_layers + 1, dim))
                if condition == "baseline":
                    hidden[np.ix_(modality == "vision", layer >= signal_from)] += signal * directions[i % len(classes)]
                labels = {"run_colour": colour, "run_category": "color" if i % 2 == 0 else "shape"}
                writer.write_sample(model_id, condition, sample, {
                    "position": Variable(("token",), np.arange(n, dtype=np.int64)),
                    "modality": Variable(("token",), modality),
                    "token_id": Variable(("token",), np.arange(n, dtype=np.int64) % 7),
                    "hidden": Variable(("token", "layer", "dim"), hidden.astype(np.float32), {"layer": layer}),
                    **{name: Variable(("run",), np.array([text], dtype=object)) for name, text in labels.items()},
                }, condition_attrs={"image": "blank" if condition == "blank" else "real"})
    return SyntheticStore(path, (), samples, (), list(conditions))
