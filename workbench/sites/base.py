"""The site registry: every named place in the forward pass (`SITES`), one module per site
beside this one, each declared with `register_site` (re-exported by `workbench.extend`).

A site says where it runs (`stage`: nnsight serves requests only in execution order, so every
operation carries an `order` key built here and the backend sorts by it), which index a per-layer
site takes, whether it needs a vision tower, which variables (with their dims) a capture stores,
whether an intervention may edit it, and how its value is reached (`access`, resolved by
`site_tensor` / `site_modules`). A site's module also holds where its value is read (`tensor`), the
reader a capture of it adds to the plan (`capture`) and what a model must have for it (`check`).
The spec's, the plan's and the interventions' site lists, the runner's variable dims and the
store's reserved names are derived from the registry (`workbench.sites`). Adding a site is adding
its module.

Residual-stream convention, the same for every architecture: `layer` index 0 is the LLM input (the
embedding sequence after image features are scattered in); index l >= 1 is the residual stream
after l decoder layers have run (before the final norm; for Qwen3-VL after the DeepStack add, since
it is what decoder layer l receives). With L decoder layers the indices are 0..L: index l < L is
read at the input of decoder layer l, index L at the input of the final norm. Qwen3-VL's
`layer.pre_deepstack` l (l >= 1) is decoder layer l-1's own output, before the DeepStack add.

Vision side: `vision_layer` v is the output of vision-tower layer v (0..V-1, its own index, never
mixed with the LLM's `layer`); `vision` is the tower's output as the connector receives it. Both
have one row per vision patch (before any merging: their count differs from the LLM's vision
tokens), stored along their own `vision_patch` dim. The connector's parts
(`Architecture.projector_parts`) are sites `projector.<part>` (e.g. `projector.mm_soft_emb_norm`),
edited like `projector`; not captured (their layouts differ: Gemma-3's `avg_pool` output is
channels-first), the connector's output being `layer` 0 at the vision tokens.

Stages order whole sites. Where a connector module runs inside the vision tower (Qwen3-VL's
DeepStack mergers, between its blocks) that order is not the forward's, and the plan refuses the
combinations it would break (`workbench.plan`).

Shipped to NDIF servers with the plan (the registry travels as the `SITES` that `site` reads):
builtins, numpy and `Record` only, here and in every site module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from ..models.protocol import ModelLike
from ..records import Record

if TYPE_CHECKING:
    from ..models.architectures import Architecture


class Site(Record):
    """One named site. Fields:
    name; stage: its place in one forward (embeddings, vision tower layers, tower output,
      connector, decoder, final norm, head)
    index: the index a per-layer site takes: `layer` (residual 0..L), `decoder_layer` (0..L-1),
      `vision_layer` (0..V-1); None: one value per forward
    vision: exists only on a model with a vision tower
    stores: {variable: dims} a capture of it writes (empty: cannot be captured); the first
      dim is the row dim: `token` (one row per prompt position), `vision_patch` (per patch of
      the vision tower) or `run` (one row per sample and condition)
    editable: scale / zero / ... may change it
    access: how its value is reached: `sequence` (a (batch, seq, dim) tensor over the LLM's
      positions: edits select positions), `patches` (a vision-tower tensor, one row per patch:
      edits act on every row), `modules` (the outputs of connector modules), `weights` (a
      parameter, read once per run), `branch` (a module inside a decoder layer,
      `Architecture.branch_outputs`), `source` (an operation inside self-attention's forward,
      `Architecture.key_projection_call`), `attention`, `cache`, `head` (read by their captures)
    phase: where inside its stage (a decoder layer, for `decoder_layer` sites) a read happens, a
      number: 0 edits, 1 reads at the input; inside a decoder layer `keys_pre` 2, `attention` 3,
      `attn_heads` 3.5, `attn_out` 4, `mlp_out` 5, the layer's own output `LAYER_OUTPUT_PHASE` (a site between two
      takes a number between theirs, e.g. 4.5); an editable site read inside its stage is edited
      at its own phase, just before it is read
    steps: `prefill`: read in the prompt forward only; `decode`: also at every decode step
    tensor: (model, layer) -> the live tensor of a `sequence`, `patches`, `branch` or `source` site
    capture: (CapturePlan, layers) -> None, or a problem: adds the site's reader to the plan
    check: (Architecture) -> None, or why this family lacks the site
    read_key: (layer) -> the execution-order key of a read, where it is not (stage, layer, phase)"""

    name: str
    stage: int
    index: str | None
    vision: bool
    stores: dict[str, tuple[str, ...]]
    editable: bool
    access: str
    phase: float
    steps: str
    tensor: Callable[..., Any] | None
    capture: Callable[..., str | None] | None
    check: Callable[[Architecture], str | None] | None
    read_key: Callable[[int | None], tuple[int, int, int]] | None
    _fields = ("name", "stage", "index", "vision", "stores", "editable", "access", "phase", "steps", "tensor",
               "capture", "check", "read_key")
    _defaults = {"index": None, "vision": False, "editable": False, "phase": 1, "steps": "prefill", "tensor": None,
                 "capture": None, "check": None, "read_key": None}
    _factories = {"stores": dict}
    _hidden = ("tensor", "capture", "check", "read_key")

    @property
    def variable(self) -> str | None:
        """The main stored variable (None: the site cannot be captured)."""
        return next(iter(self.stores), None)


PROJECTOR_PART_PREFIX = "projector."
# every registered site in forward order: by (stage, phase), then as registered (the built-ins by
# module name, as `workbench.sites` imports them, then a plugin's)
SITES: dict[str, Site] = {}


def register_site(entry: Site) -> Site:
    """Declare a site (one module per site; the spec, the plan and the captures read it here)."""
    if not isinstance(entry, Site):
        raise TypeError(f"register_site takes a Site; got {entry!r}")
    if entry.name.startswith(PROJECTOR_PART_PREFIX) and entry.access != "modules":
        raise ValueError(f"{entry.name!r}: names under 'projector.' are connector modules (access 'modules')")
    SITES[entry.name] = entry
    ordered = sorted(SITES.values(), key=lambda s: (s.stage, s.phase))  # stable: ties keep their order
    SITES.clear()
    SITES.update((s.name, s) for s in ordered)
    return entry


# -- the lists the spec, the plan and the store derive from the registry, read when asked (a
# plugin's site registers after this package is imported)


def site_names() -> tuple[str, ...]:
    return tuple(SITES)


def capture_sites() -> tuple[str, ...]:
    """The sites a capture can read (those that store a variable)."""
    return tuple(n for n, s in SITES.items() if s.variable)


def editable_sites() -> tuple[str, ...]:
    return tuple(n for n, s in SITES.items() if s.editable)


def variable_dims() -> dict[str, tuple[str, ...]]:
    """Dims of every stored capture variable, e.g. variable_dims()["hidden"] == ("token", "layer", "dim")."""
    return {v: tuple(dims) for s in SITES.values() for v, dims in s.stores.items()}


# a connector part `projector.<part>`: an edit of that module's output, like `projector`
PROJECTOR_PART = Site("projector.<part>", 3, vision=True, editable=True, access="modules")


def site(name: str) -> Site:
    """The registry entry of `name` (a connector part `projector.<part>` shares one entry)."""
    if name in SITES:
        return SITES[name]
    if name.startswith(PROJECTOR_PART_PREFIX):
        return PROJECTOR_PART.replace(name=name)
    raise KeyError(f"unknown site {name!r}")


def part_sites(architectures: Any) -> tuple[str, ...]:
    """`projector.<part>` for every connector part the given families declare (the registered
    families' parts are known to the spec)."""
    names = [PROJECTOR_PART_PREFIX + part for arch in architectures for part in arch.projector_parts]
    return tuple(n for n in dict.fromkeys(names) if n not in SITES)


def is_projector_site(name: str) -> bool:
    """The projector, its merger or a connector part: edits act on module outputs."""
    return site(name).access == "modules"


LAYER_OUTPUT_PHASE = 6  # decoder layer l's own output (`layer.pre_deepstack` l + 1)


def order(name: str, layer: int | None = None, phase: float = 0) -> tuple[int, int, float]:
    """Execution-order key: stage, then layer, then phase (0 intervene before 1 capture; the
    decoder-layer sites read inside a layer take their `Site.phase`)."""
    return (site(name).stage, -1 if layer is None else layer, phase)


def read_order(name: str, layer: int | None) -> tuple[int, int, float]:
    """The key of a capture's read of `name` at `layer`: the site's own `read_key` where it
    has one (`layer.pre_deepstack`), else its stage, the layer and its `phase`."""
    entry = site(name)
    return entry.read_key(layer) if entry.read_key else order(name, layer, entry.phase)


# -- resolving a site to the live model (inside a trace) ------------------------------------------


class BatchRow(Record):
    """Where batch row `index` of a forward of `of` rows lies in its tensors.

    units: each row's share of the image-side tensors' first dim (its `pixel_values` rows: Qwen's
      flat patches, InternVL's tiles), when rows of different samples differ there; None: every
      row owns an equal block (one sample's conditions, or samples whose image inputs match).
    length: the row's real tokens in this forward (rows of different samples are right-padded
      to the longest: positions 0..length-1 are the row's own, the rest pads); None: every
      position is the row's (no padding, or a one-token decode step)."""

    index: int
    of: int
    units: tuple[int, ...] | None
    length: int | None
    _fields = ("index", "of", "units", "length")
    _defaults = {"units": None, "length": None}


def batch_rows(tensor: Any, row: "BatchRow | tuple[int, int] | None") -> Any:
    """The rows of batch row `row` (a `BatchRow`, or (index, of)) in `tensor`'s first dim, a view
    (in-place edits reach the forward). A (batch, seq, dim) stream has one row per batch row; an
    image-side tensor (Qwen's flat (patches or tokens, dim) tower and merger outputs, InternVL's
    tiles, SmolVLM's tiles of every sample) is the rows' blocks in order, each row's block in
    proportion to its `units` (patches -> merged tokens keep the proportion: every row's image
    shrinks by the same merge factor), equal blocks without units. A first dimension of 1 is
    shared by every row (a broadcast mask). None: the whole tensor (unbatched)."""
    if row is None or tensor.shape[0] == 1:
        return tensor
    index, of = (row.index, row.of) if isinstance(row, BatchRow) else row
    units = row.units if isinstance(row, BatchRow) else None
    if units is None or tensor.shape[0] == of:  # equal blocks; or one row per batch row
        block = tensor.shape[0] // of
        return tensor[index * block:(index + 1) * block]
    n, total = tensor.shape[0], sum(units)
    start, end = n * sum(units[:index]), n * sum(units[:index + 1])
    if start % total or end % total:
        raise ValueError(f"a tensor of {n} rows does not split over batch rows of {list(units)} units")
    return tensor[start // total:end // total]


def token_rows(tensor: Any, row: "BatchRow | tuple[int, int] | None") -> Any:
    """A (batch, seq, ...) sequence tensor's share of batch row `row`, its pads cut off: (1,
    length, ...) of the row's real positions (right padding puts them first)."""
    rows = batch_rows(tensor, row)
    length = row.length if isinstance(row, BatchRow) else None
    return rows if length is None else rows[:, :length]


def residual_envoy(model: ModelLike, layer: int) -> Any:
    """The envoy whose `.input` is the residual stream at `layer` (see the convention above)."""
    if layer < model.n_layers:
        return model.decoder_layers()[layer]
    return model.module(model.arch.final_norm)[0]


def running_layer(model: ModelLike, layer: int, inputs: Any) -> int:
    """The residual index whose envoy's input holds `layer`'s stream in this forward: itself, but
    for a cross-attention layer in a run without an image, which does not run (transformers 5.25
    models/mllama/modeling_mllama.py `MllamaTextModel.forward`) and so passes the stream on
    unchanged to the next running layer."""
    if "pixel_values" not in inputs.encoding:
        while layer in model.info.cross_attention_layers:
            layer += 1
    return layer


def site_modules(model: ModelLike, name: str) -> dict[str, Any]:
    """{"path#i": envoy} of the modules whose outputs a `modules` site edits: the whole projector
    (all its modules), the merger alone, or one declared connector part."""
    arch = model.arch
    if name == "projector":
        paths = arch.projector
    elif name == "projector.merger":
        paths = (cast(str, arch.projector_merger),)  # a vision site: every multimodal family declares one
    else:
        paths = (arch.projector_parts[name[len(PROJECTOR_PART_PREFIX):]],)
    return {f"{path}#{i}": envoy for path in paths for i, envoy in enumerate(model.module(path))}


def connector_modules(model: ModelLike) -> dict[str, Any]:
    """Every connector module an edit can reach, in execution order: the declared parts (in the
    family's order; they run inside the projector, or are its modules), then the projector's."""
    arch = model.arch
    out: dict[str, Any] = {}
    for name in [PROJECTOR_PART_PREFIX + part for part in arch.projector_parts] + ["projector"]:
        for key, envoy in site_modules(model, name).items():
            out.setdefault(key, envoy)
    return out


def first_tensor(value: Any) -> Any:
    """A module's main tensor: encoder layers and towers may return tuples or ModelOutputs."""
    return value if hasattr(value, "shape") else value[0]


def branch_output(model: ModelLike, name: str, layer: int) -> Any:
    """The output of the module inside decoder layer `layer` that `Architecture.branch_outputs`
    names for site `name` (`attn_out`, `mlp_out`)."""
    envoy = model.decoder_layers()[layer]
    for attribute in model.arch.branch_outputs[name].split("."):
        envoy = getattr(envoy, attribute)
    return first_tensor(envoy.output)


def site_tensor(model: ModelLike, name: str, layer: int | None = None) -> Any:
    """The live tensor of a site that has one (`Site.tensor`). Sequence sites are (batch, seq,
    dim); patch sites keep the tower's own layout (batch of tiles x patches x dim, or patches x
    dim for Qwen), rows flattened by the capture."""
    tensor = site(name).tensor
    if tensor is None:
        raise KeyError(f"site {name!r} has no tensor of its own")
    return tensor(model, layer)


def position_index(positions: str | list[int] | tuple[int, ...], modality: np.ndarray) -> np.ndarray:
    """Sequence positions selected by a spec's `positions`: a modality name, `all`, `last` (the
    prompt's final token), `last-k` (k tokens before it), `i` or `i+j+...` (those token positions,
    one group), or indices."""
    n = modality.shape[0]
    if isinstance(positions, str):
        if positions == "all":
            return np.arange(n)
        if positions == "last" or positions.startswith("last-"):
            back = int(positions[len("last-"):]) if positions != "last" else 0
            if back >= n:
                raise IndexError(f"position {positions!r} out of range for a sequence of {n} tokens")
            return np.array([n - 1 - back], dtype=np.int64)
        if positions[:1].isdigit():  # "5", "3+4+5": token positions named as one word
            return position_index([int(p) for p in positions.split("+")], modality)
        return np.flatnonzero(modality == positions)
    index = np.asarray(list(positions), dtype=np.int64)
    if (index >= n).any():
        raise IndexError(f"positions {index[index >= n].tolist()} out of range for a sequence of {n} tokens")
    return index


def to_device(value: Any, like: Any, dtype: Any = None) -> Any:
    """A host tensor sent into a forward, on `like`'s device (in `dtype` if given). On CUDA it
    does not block: a blocking copy to the device waits for every kernel the forward queued
    before it, while from pageable memory CUDA stages the copy at once (so `value` may be freed
    after). Elsewhere a plain copy (MPS's non-blocking copies have had races)."""
    device = like.device
    return value.to(device=device, dtype=dtype, non_blocking=device.type == "cuda")
