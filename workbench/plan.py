"""Plan: a validated spec compiled against one model's config into what its runs must do.

Everything a spec asks that a model cannot give (a vision site on a text model, a layer beyond its
depth, an edit a site does not support) is refused here, located in the spec file like any other
spec error, before anything runs or is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, overload

from .capture import CapturePlan, PatchCapture
from .records import Record
from .extend import InterventionKind, intervention_kinds
from .interventions import Intervention, needs_source
from .sites import PROJECTOR_PART_PREFIX, SITES, is_projector_site, site as site_entry
from .spec import SpecError, capture_sites, editable_sites
from .spec.sweeps import unbracketed

if TYPE_CHECKING:
    from .spec import Spec
    from .models.model import ImageMode, ModelInfo

SpecPath = tuple[Any, ...]
# what each site access is, in "'<kind>' acts at ..." messages (`workbench.sites.Site.access`)
ACCESS_WORDS = {"sequence": "sequence sites", "modules": "the projector", "patches": "the vision tower",
                "branch": "a decoder layer's branch outputs", "heads": "the attention heads' outputs"}
# the sites a `source` condition's values are read at (`workbench.capture.SiteValues`)
SOURCE_SITES = ("embed", "layer", "attn_heads", "attn_out", "mlp_out")


def build_intervention(kind: InterventionKind, raw: Any, layers: tuple[int, ...] | None) -> Intervention:
    """The runtime intervention of a validated spec entry (sweep variables already substituted)."""
    positions = getattr(raw, "positions", "all")
    positions = positions if isinstance(positions, str) else tuple(positions)
    return kind.runtime.from_spec(raw, {"site": raw.site, "positions": positions, "layers": layers})


class PlanError(SpecError):
    """A spec that is valid on its own but asks for something a model lacks."""


class KVSwapPlan(Record):
    """Decode-time KV substitution: the donor's `parts` ("keys", "values" or both) at `positions`
    of `layers` replace this condition's before the last prompt token runs (see
    `workbench.backends.local`). Its repr, stored in the condition's attrs, says what was swapped."""

    donor: str
    positions: str | tuple[int, ...]
    layers: tuple[int, ...]
    parts: tuple[str, ...]
    _fields = ("donor", "positions", "layers", "parts")
    _defaults = {"parts": ("keys", "values")}


class ConditionPlan(Record):
    # name, sweep {variable: value}, image (real | blank | none), interventions, kv_swap
    name: str
    sweep: dict[str, Any]
    image: ImageMode
    interventions: tuple[Intervention, ...]
    kv_swap: KVSwapPlan | None
    _fields = ("name", "sweep", "image", "interventions", "kv_swap")
    _defaults = {"interventions": (), "kv_swap": None}

    @property
    def sources(self) -> list[str]:
        """Conditions whose values this one needs first (patch / add-direction sources)."""
        return [s for s in (needs_source(i) for i in self.interventions) if s]

    def store_attrs(self) -> dict[str, Any]:
        return {
            "sweep": dict(self.sweep),
            "image": self.image,
            "interventions": [repr(i) for i in self.interventions],
            "kv_swap": repr(self.kv_swap) if self.kv_swap else None,
        }


class ModelPlan(Record):
    # info (workbench.models.ModelInfo), conditions [ConditionPlan], capture (CapturePlan),
    # batch_size (`backend.batch_size`: conditions per forward, locally and on NDIF alike)
    info: ModelInfo
    conditions: PlanConditions | list[ConditionPlan]
    capture: CapturePlan
    batch_size: int
    _fields = ("info", "conditions", "capture", "batch_size")
    _defaults = {"batch_size": 1}
    _factories = {"capture": CapturePlan}
    _mutable = True

    def condition(self, name: str) -> ConditionPlan:
        by_name = getattr(self.conditions, "by_name", None)  # `PlanConditions`, named not here: this
        # class travels by value to NDIF, whose sandbox refuses the `abc` a Sequence would bring
        return by_name(name) if by_name else next(c for c in self.conditions if c.name == name)


class _Checker:
    """Collects (spec path, message) problems for one model. A problem in a swept run is located
    at the run (conditions.steer[c=0.5]...); one that every run of its condition shares is
    reported once, at the condition."""

    def __init__(self, info: ModelInfo):
        self.info = info
        # (path at the condition, message) -> (path as first found, how many runs found it)
        self.found: dict[tuple[SpecPath, str], tuple[SpecPath, int]] = {}

    def add(self, path: SpecPath, message: str) -> None:
        key = (tuple(getattr(part, "base", part) for part in path), message)
        first, count = self.found.get(key, (path, 0))
        self.found[key] = (first, count + 1)

    def problems(self, runs: Callable[[str], int]) -> list[tuple[SpecPath, str]]:
        """(path, message) of each problem; `runs(condition)`: how many runs it expands to."""
        out = []
        for (at_condition, message), (first, count) in self.found.items():
            base = getattr(first[1], "base", None) if len(first) > 1 else None
            if base is None or count >= runs(base):
                out.append((at_condition, message))
            else:
                more = f" (and {count - 1} more runs of '{base}')" if count > 1 else ""
                out.append((first, message + more))
        return out

    def layers(self, value: Any, path: SpecPath, top: int, vision: bool = False) -> tuple[int, ...]:
        """Layer indices 0..top ('all' expands); out-of-range ones are problems."""
        if value in (None, "all"):
            return tuple(range(top + 1))
        bad = [l for l in value if l > top]
        if bad:
            depth = f"{self.info.n_vision_layers} vision layers" if vision else f"{self.info.n_layers} decoder layers"
            self.add(path, f"layers {bad} out of range ({depth}); expected 0..{top}")
        return tuple(sorted(set(l for l in value if l <= top)))

    def site(self, site: str, path: SpecPath, allowed: tuple[str, ...], what: str) -> bool:
        arch = self.info.arch
        parts = [PROJECTOR_PART_PREFIX + p for p in arch.projector_parts]
        if site_entry(site).vision and not arch.is_multimodal:
            self.add(path, f"a text-only model has no site {site!r}; expected a site of a text model")
        elif site not in allowed:
            self.add(path, f"site {site!r} cannot be {what}; expected one of {', '.join(allowed)}")
        elif site not in SITES and site not in parts:  # a connector part of another family
            self.add(path, f"{arch.family}'s connector has no part {site!r}; expected one of {', '.join(parts)}")
        else:
            return True
        return False

    def layer_range(self, site: str) -> int:
        """The highest index a per-layer site takes on this model."""
        index = site_entry(site).index
        if index == "vision_layer":
            return self.info.n_vision_layers - 1
        return self.info.n_layers - (index in ("decoder_layer", "cross_layer"))

    def layer_kinds(self, site: str, value: Any, layers: tuple[int, ...], path: SpecPath) -> tuple[int, ...]:
        """`layers` where `site` exists on this model (`site_layers`): `all` keeps those, a listed
        layer of another kind is a problem naming why it lacks the site."""
        kinds = site_layers(self.info, site)
        if kinds is None:
            return layers
        allowed, why = kinds
        bad = [l for l in layers if l not in allowed]
        if bad and value not in (None, "all"):
            self.add(path, f"{self.info.arch.family}'s decoder layers {bad} {why}: no {site!r} there; expected "
                     f"layers among {', '.join(map(str, allowed)) or '(none)'}")
        return tuple(l for l in layers if l in allowed)


# sites read inside a decoder layer's self-attention (its cache, its attention call, its output)
SELF_ATTENTION_SITES = ("keys", "values", "keys_pre", "attention", "attn_heads", "attn_out")


def site_layers(info: Any, site: str) -> tuple[tuple[int, ...], str] | None:
    """The decoder layers where a per-layer `site` exists on this model, and why the others lack
    it; None: at every layer. A cross-attention family's cross-attention layers hold the image's
    K/V (`cross_kv`) and gated branches, its other layers every decoder-layer site; a hybrid's
    non-attention layers (LFM2's short convolutions) have no self-attention sites."""
    index = "kv_swap" if site == "kv_swap" else site_entry(site).index
    cross = tuple(info.cross_attention_layers)
    if index == "cross_layer":
        return cross, "self-attend over the text (the image's K/V are at the cross-attention layers)"
    if index == "kv_swap":
        if cross:
            return cross, "self-attend over the text: a KV swap takes the cross-attention KV of the donor's image"
        return site_layers(info, "keys")
    if index != "decoder_layer" or info.attention_layers is None:
        return None
    if cross:
        return tuple(info.attention_layers), ("cross-attend to the image (their K/V are the site 'cross_kv'; "
                                              "their branches are tanh-gated, not the modules' outputs)")
    # every decoder-layer site, not only the self-attention ones: a store keeps one
    # `decoder_layer` coordinate, which `keys` and `mlp_out` of one spec must share
    kinds = getattr(info.arch, "layer_types", None) or "layer types"
    what = "no self-attention, no KV cache there" if site in SELF_ATTENTION_SITES else "the decoder-layer sites " \
        "take the attention layers, so every decoder_layer variable of a store shares them"
    return tuple(info.attention_layers), f"are not attention layers (the config's {kinds}): {what}"


def _capture_plan(spec: Spec, check: _Checker) -> CapturePlan:
    """Each `capture` entry's reader, added by its site's declaration (`Site.capture`)."""
    plan = CapturePlan(max_new_tokens=spec.generate.max_new_tokens if spec.generate else 1)
    along: dict[str, tuple[int, tuple[int, ...]]] = {}  # a layer dim -> the first capture stored along it
    for i, item in enumerate(spec.capture):
        path = ("capture", i)
        if not check.site(item.site, path + ("site",), capture_sites(), "captured"):
            continue
        if item.positions != "all":
            check.add(path + ("positions",), "captures store every prompt position; expected all "
                      "(select positions when reading the store: ds.sel(modality=...))")
        entry = site_entry(item.site)
        lacking = entry.check(check.info.arch) if entry.check else None
        if lacking:
            check.add(path + ("site",), lacking)
            continue
        layers = (check.layers(item.layers, path + ("layers",), check.layer_range(item.site),
                               vision=entry.index == "vision_layer") if entry.index else None)
        if layers is not None:
            layers = check.layer_kinds(item.site, item.layers, layers, path + ("layers",))
        if layers is not None and entry.index is not None and any(entry.index in d for d in entry.stores.values()):
            # one coordinate per dim in the store: captures along the same layer dim share it
            first, first_layers = along.setdefault(entry.index, (i, layers))
            if layers != first_layers:
                check.add(path + ("layers",), f"layers {list(layers)} differ from capture[{first}]'s "
                          f"{list(first_layers)}, stored along the same dim {entry.index!r}; expected the same layers")
        assert entry.capture is not None  # every site that stores a variable declares its reader
        problem = entry.capture(plan, layers)
        if problem:
            check.add(path, problem)
    return plan


def _interventions(instance: Any, check: _Checker) -> tuple[Any, ...]:
    kinds = intervention_kinds()
    items = []
    base: SpecPath = ("conditions", instance.key, "interventions")
    for j, raw in enumerate(instance.interventions):
        path = base + (j,)
        if not check.site(raw.site, path + ("site",), editable_sites(), f"edited by '{raw.kind}'"):
            continue
        access = site_entry(raw.site).access
        if access in ("modules", "patches") and getattr(raw, "positions", "all") not in ("vision", "all"):
            check.add(path + ("positions",), f"{raw.site!r} holds only vision rows; expected vision or all")
        if access in ("modules", "patches") and instance.image == "none":
            check.add(path + ("site",), f"{raw.site!r} does not run without an image (image: none); expected a "
                      "sequence site (embed, layer) or an image")
        kind = kinds[raw.kind]
        if getattr(raw, "heads", None) is not None and access != "heads":
            check.add(path + ("heads",), f"{raw.site!r} has no heads; expected 'heads' only at a site of per-head "
                      f"values ({', '.join(n for n in editable_sites() if site_entry(n).access == 'heads')})")
        if access not in kind.accesses:
            fits = [k.name for k in kinds.values() if access in k.accesses and (k.sites is None or raw.site in k.sites)]
            check.add(path + ("kind",), f"'{raw.kind}' acts at {' and '.join(ACCESS_WORDS[a] for a in kind.accesses)}; "
                      f"expected {' or '.join(fits)} at {raw.site!r}")
        elif kind.sites is not None and raw.site not in kind.sites:
            check.add(path + ("site",), f"'{raw.kind}' edits only {' and '.join(kind.sites)}; expected one of them")
        source = kind.source_of(raw)
        if source is not None and raw.site not in SOURCE_SITES:  # what `SiteValues` reads
            check.add(path + ("site",), "values from another condition are read at sequence sites; expected "
                      f"{' or '.join(SOURCE_SITES)}")
        index = site_entry(raw.site).index
        layers = (check.layers(getattr(raw, "layers", "all"), path + ("layers",), check.layer_range(raw.site),
                               vision=index == "vision_layer") if index else None)
        if layers is not None:
            layers = check.layer_kinds(raw.site, getattr(raw, "layers", "all"), layers, path + ("layers",))
        for subpath, message in kind.check(raw, check.info) if kind.check else ():
            check.add(path + tuple(subpath), message)
        items.append(build_intervention(kind, raw, layers))
    _projector_order(instance, check, base)
    _connector_part_order(instance, check, base)
    return tuple(items)


def _connector_part_order(instance: Any, check: _Checker, base: SpecPath) -> None:
    """Connector edits of one condition share a stage, so nnsight is asked for them in the order
    the spec lists them; a part that runs earlier than an edit listed before it would be asked
    for after the forward ran past it (`OutOfOrderError` mid-run). Refuse that here: parts in the
    family's order (`Architecture.projector_parts`), the whole projector or merger after them."""
    parts = list(check.info.arch.projector_parts)

    def rank(site: str) -> int:
        part = site[len(PROJECTOR_PART_PREFIX):]
        return parts.index(part) if site not in SITES and part in parts else len(parts)

    edits = [(j, raw.site) for j, raw in enumerate(instance.interventions) if is_projector_site(raw.site)]
    for (_, before), (j, site) in zip(edits, edits[1:]):
        if rank(site) < rank(before):
            order = ", ".join(PROJECTOR_PART_PREFIX + p for p in parts)
            check.add(base + (j, "site"), f"{site!r} runs before {before!r}, listed above it; expected the "
                      f"connector edits in execution order ({order}, then projector / projector.merger)")


def _deepstack_order(instance: Any, capture: CapturePlan, check: _Checker) -> None:
    """Qwen3-VL's DeepStack mergers run inside the vision tower, between its layers, so an edit of
    their outputs (`projector`, `projector.deepstack`) cannot be served after a vision-tower
    site in one trace (nnsight serves requests in execution order, and the workbench orders
    whole sites); refuse the combination here instead of an `OutOfOrderError` mid-run."""
    if not check.info.arch.deepstack:
        return
    vision = any(isinstance(c, PatchCapture) for c in capture.outputs) or any(
        site_entry(raw.site).access == "patches" for raw in instance.interventions)
    for j, raw in enumerate(instance.interventions):
        if vision and raw.site in ("projector", "projector.deepstack"):
            check.add(("conditions", instance.key, "interventions", j, "site"),
                      f"{check.info.arch.family}'s DeepStack mergers run inside the vision tower: an edit of "
                      f"{raw.site!r} cannot share a run with the vision / vision_layer sites; expected "
                      "projector.merger here, or the vision sites in another spec")


def _projector_order(instance: Any, check: _Checker, base: SpecPath) -> None:
    """Where the projector is several modules (Qwen3-VL: the DeepStack mergers, then the merger),
    a second edit involving `projector` would ask for a module nnsight has already run past
    (`OutOfOrderError` mid-run); refuse it here instead."""
    if len(check.info.arch.projector) < 2:
        return
    edits = [j for j, raw in enumerate(instance.interventions) if is_projector_site(raw.site)]
    if len(edits) > 1 and any(instance.interventions[j].site == "projector" for j in edits):
        check.add(base + (edits[1], "site"), f"a second projector edit in one condition ({check.info.arch.family}'s "
                  "projector is several modules, served once each in execution order); expected one edit of "
                  "'projector' per condition (fold them into one: scale factors multiply)")


def compile_plan(spec: Spec, info: ModelInfo) -> ModelPlan:
    """Compile `spec` for one model; raise PlanError (located in the spec) listing every problem.
    Every condition is checked here, one at a time; the plan's conditions are compiled again when
    taken (`PlanConditions`), so a large sweep is never held."""
    check = _Checker(info)
    capture = _capture_plan(spec, check)
    images = _images(spec)
    space = spec.expand_conditions()
    for instance in space:
        _compile_condition(instance, info, capture, images, check)
    problems = check.problems(space.runs_of)
    if problems:
        raise PlanError([spec.problem(p, f"{info.model_id}: {m}") for p, m in problems], spec.source)
    return ModelPlan(info=info, conditions=PlanConditions(space, info, capture, images),
                     capture=capture, batch_size=getattr(getattr(spec, "backend", None), "batch_size", 1))


def _images(spec: Spec) -> dict[str, str]:
    """Image mode of each condition without a sweep: the only ones a kv_swap donor or an
    intervention source may name (`workbench.spec.schema._reference_problems`)."""
    return {name: cond.image for name, cond in spec.conditions.items() if not cond.runs_many}


def _compile_condition(instance: Any, info: Any, capture: CapturePlan, images: dict[str, str],
                       check: _Checker) -> ConditionPlan:
    base: SpecPath = ("conditions", instance.key)
    if instance.image != "real" and not info.arch.is_multimodal:
        check.add(base + ("image",), "a text-only model takes no image; expected real")
    kv_swap = None
    if instance.kv_swap is not None:
        swap = instance.kv_swap
        if (images[swap.donor] == "none") != (instance.image == "none"):
            check.add(base + ("kv_swap", "donor"), f"donor {swap.donor!r} has another token sequence "
                      "(image: none); expected a donor with the same sequence (real or blank image)")
        if info.arch.prefix_lm:
            check.add(base + ("kv_swap",), f"{info.arch.family} reads the whole prompt as one bidirectional "
                      "prefix: a KV swap (prefill all but the last token, then decode it) would compute "
                      "another model; expected no kv_swap for this model")
        layers = check.layers(swap.layers, base + ("kv_swap", "layers"), info.n_layers - 1)
        layers = check.layer_kinds("kv_swap", swap.layers, layers, base + ("kv_swap", "layers"))
        if info.cross_attention_layers:
            _cross_kv_swap(instance, images, check, base + ("kv_swap",))
        positions = swap.positions if isinstance(swap.positions, str) else tuple(swap.positions)
        kv_swap = KVSwapPlan(swap.donor, positions, layers, tuple(swap.parts))
        if not capture.decoding:
            check.add(base + ("kv_swap",), "a KV swap changes only the decode step; expected a "
                      "capture of logits or attention to see it")
    items = _interventions(instance, check)
    _deepstack_order(instance, capture, check)
    for item in items:
        if needs_source(item) and images.get(item.source) != instance.image and "none" in (images.get(item.source), instance.image):
            check.add(base + ("interventions",), f"source {item.source!r} has another token sequence; expected the same image mode")
    return ConditionPlan(instance.name, dict(instance.sweep), instance.image, items, kv_swap)


def _cross_kv_swap(instance: Any, images: dict[str, str], check: _Checker, path: SpecPath) -> None:
    """A cross-attention family's KV swap takes every vision token's K/V of the donor's image at
    the cross-attention layers: both runs need an image, and no text positions are chosen."""
    swap, family = instance.kv_swap, check.info.arch.family
    if "none" in (instance.image, images[swap.donor]):
        check.add(path, f"{family}'s KV swap takes the cross-attention KV of the donor's image, and a run without "
                  "an image has none; expected this condition and its donor with an image (real or blank)")
    if swap.positions not in ("vision", "all"):
        check.add(path + ("positions",), f"{family}'s image is not in the token sequence: a KV swap takes the K/V "
                  "of every vision token at the cross-attention layers; expected vision")


class PlanConditions:
    """A model's condition plans, each compiled when taken from the spec's `ConditionSpace`
    (`compile_plan` has checked them all). Never pickled into a remote job: that takes a plan
    holding the conditions it runs (`workbench.backends.remote.run_sample`)."""

    def __init__(self, space: Any, info: Any, capture: CapturePlan, images: dict[str, str]):
        self._space, self._info, self._capture, self._images = space, info, capture, images
        self._named: dict[str, ConditionPlan] = {}  # sources and donors, asked for by name per run

    def _compiled(self, instance: Any) -> ConditionPlan:
        return _compile_condition(instance, self._info, self._capture, self._images, _Checker(self._info))

    def __len__(self) -> int:
        return len(self._space)

    @overload
    def __getitem__(self, index: int) -> ConditionPlan: ...

    @overload
    def __getitem__(self, index: slice) -> list[ConditionPlan]: ...

    def __getitem__(self, index: int | slice) -> ConditionPlan | list[ConditionPlan]:
        if isinstance(index, slice):
            return [self._compiled(i) for i in self._space[index]]
        return self._compiled(self._space[index])

    def __iter__(self) -> Iterator[ConditionPlan]:
        return (self._compiled(instance) for instance in self._space)

    def names(self) -> Iterator[str]:
        return self._space.names()

    def by_name(self, name: str) -> ConditionPlan:
        if name not in self._named:
            self._named[name] = self[next(i for i, n in enumerate(self.names()) if n == name)]
        return self._named[name]

    def __repr__(self) -> str:
        return f"PlanConditions({len(self)} conditions)"


def condition_names(conditions: PlanConditions | Iterable[ConditionPlan]) -> Iterator[str]:
    """The names of a plan's conditions, in order, none compiled for it."""
    names = getattr(conditions, "names", None)  # a `PlanConditions`
    return names() if names else (c.name for c in conditions)


def renamed_runs(held: Iterable[str], conditions: PlanConditions | Iterable[ConditionPlan]) -> str | None:
    """Why a store cannot be resumed with these conditions, if it holds swept runs under the names
    a store written before runs were named after their condition gave them ('c=0.5' for
    'steer[c=0.5]': no '['; a condition's own name holds no '='). Resuming would store every such
    run again under its new name, so it is refused; the store still opens and analyses as it is
    (analyses read the swept values, `analyses.streaming.Layout.sweep`)."""
    old = sorted(name for name in held if "=" in name and "[" not in name)
    if not old:
        return None
    now = {unbracketed(name): name for name in condition_names(conditions) if name.endswith("]")}
    pairs = [f"'{name}' is now '{now[name]}'" for name in old if name in now][:3]
    example = "; ".join(pairs) if pairs else f"e.g. '{old[0]}'"
    return (f"the store holds {len(old)} swept run(s) named without their condition ({example}): a swept "
            "run is named '<condition>[<variable>=<value>,...]', so resuming would store these runs again "
            "under the new names")


def explicit_positions(spec: Spec) -> bool:
    """Whether any condition names token positions by index (then sequence lengths matter)."""
    for instance in spec.expand_conditions():
        swap = [instance.kv_swap.positions] if instance.kv_swap else []
        if any(_explicit(p) for p in [getattr(i, "positions", "all") for i in instance.interventions] + swap):
            return True
    return False


def _explicit(positions: Any) -> bool:
    """Whether `positions` names tokens by index (a list, `last-k`, `i+j`): lengths matter."""
    return not isinstance(positions, str) or positions.startswith("last-") or positions[:1].isdigit()


def _reach(positions: Any) -> int | None:
    """How many tokens a prompt needs beyond `positions`' largest index, less one (None: a group
    every prompt has): `last-k` needs k + 1 tokens, a list its largest index + 1."""
    if isinstance(positions, str):
        if positions.startswith("last-"):
            return int(positions[len("last-"):])
        return max(int(p) for p in positions.split("+")) if positions[:1].isdigit() else None
    return max(positions) if positions else None


def check_positions(spec: Spec, info: ModelInfo, lengths: dict[str, list[tuple[str, int]]]) -> None:
    """Refuse explicit positions beyond a sample's sequence. `lengths[image_mode]` holds
    (sample id, number of tokens) of every sample's prompt in that image mode."""
    check = _Checker(info)
    space = spec.expand_conditions()
    for instance in space:
        sample, n = min(lengths[instance.image], key=lambda item: item[1])
        base: SpecPath = ("conditions", instance.key)
        entries = [(base + ("interventions", j, "positions"), getattr(raw, "positions", "all"), n)
                   for j, raw in enumerate(instance.interventions)]
        if instance.kv_swap is not None:  # the swap edits the cache of all but the last token
            entries.append((base + ("kv_swap", "positions"), instance.kv_swap.positions, n - 1))
        for path, positions, limit in entries:
            reach = _reach(positions)
            if reach is not None and reach >= limit:
                shown = positions if isinstance(positions, str) else max(positions)
                check.add(path, f"{info.model_id}: position {shown} is out of range for sample {sample!r} "
                          f"({limit} positions); expected positions < {limit}")
    problems = check.problems(space.runs_of)
    if problems:
        raise PlanError([spec.problem(p, m) for p, m in problems], spec.source)
