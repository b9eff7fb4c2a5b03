"""Sparse autoencoders over the stored activations (the `sae` analysis): do the language model's
sparse features cover vision tokens, or do vision tokens sit off its dictionary?

An SAE is any directory in SAELens's format (cfg.json, sae_weights.safetensors: what `workbench
sae train` writes, or a pretrained one), loaded by `sae_lens.SAE.load_from_disk`; it reads one
stored variable at one layer (`sae_source`: the metadata `workbench_variable`/`workbench_layer`
that `workbench sae train` writes, else TransformerLens's `blocks.L.hook_resid_pre` (= `hidden` at
L) or `blocks.L.hook_resid_post` (= `hidden` at L + 1)). The stored rows are read one block at a
time (at most `streaming.BLOCK_BYTES` decoded) and encoded by the SAE's own `encode` and `decode`
(`encode_rows`; nothing of an SAE is computed by hand). Per condition and token group (`vision`,
`boundary`, `text`, and `all` tokens):

- `l0`: the mean over a sample's tokens of the number of features active (≠ 0, as SAELens's
  evals count: sae_lens/evals.py `get_sparsity_and_variance_metrics`);
- `mse`: the mean over a sample's tokens of ‖x − x̂‖²;
- `variance`: the total variance of the group's tokens over all samples, E‖x‖² − ‖E x‖² (the
  denominator of SAELens's `ExplainedVarianceCalculator`); `fvu` = a sample's `mse` / `variance`,
  `explained` = 1 − `fvu` (averaged over samples these are SAELens's explained variance with each
  sample weighted equally, so that the interval is one over samples);
- `frequency` (feature): the fraction of the group's tokens on which a feature is active, and
  `mean_activation` (feature): its mean activation over them;
- dead features: active on no token of any condition; a feature is specific to vision (text) when
  it is active there and ≥ `SPECIFIC` of its firing frequency, vision + text, is on vision (text)
  tokens (`feature_summary`).

The next-token KL of the reconstruction is measured by a run, not from the store: the store holds
no layers after the SAE's, so the reconstruction is spliced into a forward pass by the
`sae_splice` intervention (as SAELens's evaluation splices it), and `compare`'s KL of that
condition from the reference is read here (`splice_kl`) for the conditions whose recorded
interventions name this SAE (the store's `interventions` attribute), by the tokens they splice.

Torch and SAELens (the optional extra `sae`) are imported only when an SAE is encoded: the one
analysis that needs torch; none of the others import it.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from workbench.store import MODALITIES

from . import streaming
from .bootstrap import summarize
from .cache import MissingInputs, cached
from .streaming import as_dask, layer_values, layout

if TYPE_CHECKING:
    from sae_lens import SAE

GROUPS = (*MODALITIES, "all")
PER_SAMPLE = ("l0", "mse", "fvu", "explained")
SPECIFIC = 0.9           # share of a feature's firing frequency on one modality that makes it specific to it
TOP = 5                  # top features listed per token group
CONFIG = "cfg.json"      # sae_lens.constants.SAE_CFG_FILENAME (6.54)
WEIGHTS = "sae_weights.safetensors"
SPLICE = "SaeSplice("    # the repr of the `sae_splice` intervention (workbench/interventions/sae_splice.py)
SITE_VARIABLES = {"layer": "hidden"}   # an edited site -> the variable it is stored as (others: the same name)


@dataclass(frozen=True)
class SaeSource:
    """One SAE directory and what it reads: `variable` at `layer`; `digest` keys the cache;
    `model`: the model `workbench sae train` trained it on (None: an SAE from elsewhere, applied to
    every model of its width)."""

    path: str
    variable: str
    layer: int
    d_in: int
    d_sae: int
    digest: str
    model: str | None = None

    @property
    def name(self) -> str:
        return Path(self.path).name


def sae_directories(paths: tuple[str, ...] | list[str]) -> list[str]:
    """Every SAE directory among `paths`: a directory holding cfg.json, or each of its
    subdirectories that holds one (e.g. one SAE per layer)."""
    out: list[str] = []
    for i, given in enumerate(paths):
        path = Path(given)
        if (path / CONFIG).is_file():
            out.append(str(path))
            continue
        inner = sorted(str(p.parent) for p in path.glob(f"*/{CONFIG}")) if path.is_dir() else []
        if not inner:
            raise ValueError(f"--sae[{i}]: {given!r} holds no SAE in SAELens's format; expected a directory with "
                             f"{CONFIG} and {WEIGHTS} (e.g. from `workbench sae train`), or a directory of such")
        out.extend(inner)
    return out


def _hook_site(hook_name: str) -> tuple[str, int] | None:
    """TransformerLens's residual hooks as a stored variable and layer."""
    found = re.fullmatch(r"blocks\.(\d+)\.hook_resid_(pre|post)", hook_name or "")
    if found is None:
        return None
    return "hidden", int(found.group(1)) + (found.group(2) == "post")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for name in (CONFIG, WEIGHTS):
        with open(path / name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:32]


def sae_source(path: str) -> SaeSource:
    """What the SAE at `path` reads (module doc), from its cfg.json (no torch)."""
    folder = Path(path)
    cfg = json.loads((folder / CONFIG).read_text())
    meta = cfg.get("metadata") or {}
    model = None
    if "workbench_variable" in meta and "workbench_layer" in meta:
        variable, layer = str(meta["workbench_variable"]), int(meta["workbench_layer"])
        model = str(meta["model_name"]) if meta.get("workbench_store") and meta.get("model_name") else None
    else:
        site = _hook_site(str(meta.get("hook_name", "")))
        if site is None:
            raise ValueError(f"--sae: {path}: its hook {meta.get('hook_name')!r} names no stored layer; expected "
                             "metadata workbench_variable and workbench_layer, or blocks.L.hook_resid_pre/post")
        variable, layer = site
    return SaeSource(str(folder), variable, layer, int(cfg["d_in"]), int(cfg["d_sae"]), _digest(folder), model)


_MODELS: dict[tuple[str, str], SAE] = {}


def load_sae(source: SaeSource) -> SAE:
    """`sae_lens.SAE.load_from_disk` on the CPU, once per SAE (keyed by its files' digest)."""
    from workbench.sae import require_sae_lens

    require_sae_lens("the sae analysis")
    key = (source.path, source.digest)
    if key not in _MODELS:
        from sae_lens import SAE

        _MODELS[key] = SAE.load_from_disk(source.path, device="cpu").eval()
    return _MODELS[key]


def encode(sae: SAE, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(features, reconstruction) of rows `x` by the SAE's own encode and decode, as float32."""
    import torch

    with torch.no_grad():
        features = sae.encode(torch.as_tensor(np.ascontiguousarray(x), dtype=sae.dtype))
        reconstruction = sae.decode(features)
    return features.float().numpy(), reconstruction.float().numpy()


def _rows(ds: xr.Dataset, source: SaeSource) -> tuple[Any, int]:
    if source.variable not in ds.data_vars:
        raise MissingInputs(f"{source.variable} (the variable the SAE {source.path} reads)")
    _, layers = layer_values(ds, ds[source.variable])
    if source.layer not in layers.tolist():
        raise MissingInputs(f"layer {source.layer} of {source.variable} (the SAE {source.path} reads it)")
    if ds[source.variable].shape[-1] != source.d_in:
        raise MissingInputs(f"{source.variable} of width {source.d_in} (the SAE's d_in; the store's is "
                            f"{ds[source.variable].shape[-1]})")
    return as_dask(ds[source.variable].data), int(layers.tolist().index(source.layer))


def encode_rows(ds: xr.Dataset, source: SaeSource, rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(row indices, x, features, reconstruction) block by block over `rows` of the SAE's variable
    at its layer, each block at most `streaming.BLOCK_BYTES` decoded."""
    data, at = _rows(ds, source)
    sae = load_sae(source)
    width = max(data.shape[-1] * 4, (source.d_sae + source.d_in) * 4)
    for block_rows, read in streaming.row_blocks(data, rows, width):
        x = np.asarray(read[:, at].compute(), dtype=np.float32)
        features, reconstruction = encode(sae, x)
        yield block_rows, x, features, reconstruction


class _Sums:
    """Per (sample, group) token sums of one condition, and per group feature sums."""

    def __init__(self, n_samples: int, dim: int, d_sae: int):
        g = len(GROUPS)
        self.n = np.zeros((n_samples, g))
        self.l0 = np.zeros((n_samples, g))
        self.sq_error = np.zeros((n_samples, g))
        self.sq_norm = np.zeros(g)
        self.sum_x = np.zeros((g, dim))
        self.fires = np.zeros((g, d_sae))
        self.activation = np.zeros((g, d_sae))

    def add(self, samples: np.ndarray, groups: np.ndarray, x: np.ndarray, f: np.ndarray, r: np.ndarray) -> None:
        x64 = x.astype(np.float64)
        active = f != 0
        l0, error, sq_norm = active.sum(1), ((x64 - r) ** 2).sum(1), (x64 ** 2).sum(1)
        everything = len(GROUPS) - 1
        for g in [*np.unique(groups).tolist(), everything]:   # each modality present, and `all`
            at = groups == g if g != everything else np.ones(len(groups), bool)
            np.add.at(self.n[:, g], samples[at], 1)
            np.add.at(self.l0[:, g], samples[at], l0[at])
            np.add.at(self.sq_error[:, g], samples[at], error[at])
            self.sq_norm[g] += sq_norm[at].sum()
            self.sum_x[g] += x64[at].sum(0)
            self.fires[g] += active[at].sum(0)
            self.activation[g] += f[at].sum(0)


def sae_results(ds: xr.Dataset, sae: str, *, force: bool = False, cache: bool = True) -> xr.Dataset:
    """Per (condition, group[, sample | feature]): the module doc's quantities for the SAE at
    directory `sae`. Cached in the store when it reads `hidden` (the cache's key covers the SAE's
    files by their digest: a retrained SAE is not read from the cache)."""
    source = sae_source(sae)
    if source.variable == "hidden":
        return _hidden_results(ds, sae, source.digest, force=force, cache=cache)
    return _results(ds, source)


@cached("sae", version=1, variables=("hidden",))
def _hidden_results(ds: xr.Dataset, sae: str, digest: str) -> xr.Dataset:
    return _results(ds, sae_source(sae))


def _results(ds: xr.Dataset, source: SaeSource) -> xr.Dataset:
    lay = layout(ds, "token")
    n_samples, n_conditions = len(lay.samples), len(lay.conditions)
    shape = (n_conditions, len(GROUPS))
    per_sample = {name: np.full((*shape, n_samples), np.nan) for name in PER_SAMPLE}
    variance = np.full(shape, np.nan)
    tokens = np.zeros(shape, np.int64)
    frequency = np.full((*shape, source.d_sae), np.nan)
    mean_activation = np.full((*shape, source.d_sae), np.nan)
    for c, condition in enumerate(lay.conditions):
        rows = lay.condition_rows[condition]
        rows = rows[lay.modality_code[rows] >= 0]
        sums = _Sums(n_samples, source.d_in, source.d_sae)
        for block_rows, x, f, r in encode_rows(ds, source, rows):
            sums.add(lay.sample_code[block_rows], lay.modality_code[block_rows], x, f, r)
        with np.errstate(invalid="ignore", divide="ignore"):
            n_group = sums.n.sum(0)
            variance[c] = sums.sq_norm / n_group - ((sums.sum_x / n_group[:, None]) ** 2).sum(1)
            mse = np.where(sums.n > 0, sums.sq_error / sums.n, np.nan).T
            per_sample["l0"][c] = np.where(sums.n > 0, sums.l0 / sums.n, np.nan).T
            per_sample["mse"][c] = mse
            per_sample["fvu"][c] = mse / variance[c][:, None]
            per_sample["explained"][c] = 1 - per_sample["fvu"][c]
            frequency[c] = sums.fires / n_group[:, None]
            mean_activation[c] = sums.activation / n_group[:, None]
        tokens[c] = sums.n.sum(0)
    dims = ("condition", "group")
    data: dict[str, tuple[tuple[str, ...], np.ndarray]] = {
        name: ((*dims, "sample"), values) for name, values in per_sample.items()}
    data.update(variance=(dims, variance), n_tokens=(dims, tokens), frequency=((*dims, "feature"), frequency),
                mean_activation=((*dims, "feature"), mean_activation))
    coords = {"condition": np.array(lay.conditions, dtype=str), "group": np.array(GROUPS, dtype=str),
              "sample": np.array(lay.samples, dtype=str), "feature": np.arange(source.d_sae), **lay.sweep_coords()}
    return xr.Dataset(data, coords=coords, attrs={"sae": source.path, "variable": source.variable,
                                                  "layer": source.layer, "d_sae": source.d_sae})


def sae_metrics(ds: xr.Dataset, sae: str, n_resamples: int = 1000, seed: int = 0, *, force: bool = False,
                cache: bool = True) -> xr.Dataset:
    """`l0`, `mse`, `fvu`, `explained` per (condition, group): the mean over samples with a 95%
    bootstrap CI (dim `stat`), with `n_tokens` and `variance` beside them."""
    results = sae_results(ds, sae, force=force, cache=cache)
    summary = summarize(results[list(PER_SAMPLE)], n_resamples=n_resamples, seed=seed)
    return summary.assign(variance=results["variance"], n_tokens=results["n_tokens"]).assign_attrs(results.attrs)


@dataclass(frozen=True)
class FeatureSummary:
    """Feature counts of one SAE on one condition (module doc)."""

    dead: int                    # active on no token of any condition
    alive: dict[str, int]        # group -> features active on at least one of its tokens
    specific: dict[str, int]     # vision / text -> features specific to it
    top: dict[str, list[tuple[int, float, float]]]   # group -> (feature, frequency, mean activation), by mean activation


def feature_summary(results: xr.Dataset, condition: str, top: int = TOP) -> FeatureSummary:
    """Dead, alive, modality-specific and top features of `condition` (`sae_results`)."""
    freq = np.nan_to_num(results["frequency"].values)
    dead = int((freq.reshape(-1, freq.shape[-1]).sum(0) == 0).sum())
    at = results.sel(condition=condition)
    f = {str(g): np.nan_to_num(at["frequency"].sel(group=g).values) for g in GROUPS}
    act = {str(g): np.nan_to_num(at["mean_activation"].sel(group=g).values) for g in GROUPS}
    both = f["vision"] + f["text"]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(both > 0, f["vision"] / both, np.nan)
    specific = {"vision": int(((share >= SPECIFIC) & (f["vision"] > 0)).sum()),
                "text": int(((share <= 1 - SPECIFIC) & (f["text"] > 0)).sum())}
    best = {g: [(int(i), float(f[g][i]), float(act[g][i])) for i in np.argsort(-act[g], kind="stable")[:top]
                if act[g][i] > 0] for g in GROUPS}
    return FeatureSummary(dead, {g: int((f[g] > 0).sum()) for g in GROUPS}, specific, best)


def splice_conditions(ds: xr.Dataset, source: SaeSource) -> dict[str, str]:
    """Condition -> the token group its `sae_splice` of this SAE replaced (`vision`, `text`,
    `boundary`, `all`, or the positions listed), from the interventions each condition's run
    recorded (the model's `interventions` attribute: their reprs)."""
    recorded = json.loads(ds.attrs.get("interventions") or "{}")
    out: dict[str, str] = {}
    for condition, reprs in recorded.items():
        for text in reprs:
            if not text.startswith(SPLICE):
                continue
            fields = _keywords(text)
            variable = SITE_VARIABLES.get(str(fields.get("site")), str(fields.get("site")))
            layers = fields.get("layers") or ()
            same = Path(str(fields.get("sae", ""))).resolve() == Path(source.path).resolve() \
                or _same_files(str(fields.get("sae", "")), source)
            if same and variable == source.variable and source.layer in tuple(layers):
                positions = fields.get("positions", "all")
                out[condition] = positions if isinstance(positions, str) else ",".join(map(str, positions))
    return out


def _same_files(path: str, source: SaeSource) -> bool:
    try:
        return _digest(Path(path)) == source.digest
    except OSError:
        return False


def _keywords(text: str) -> dict[str, Any]:
    """The keyword arguments of a recorded repr `Kind(a=1, b='x')` (literals only)."""
    call = ast.parse(text, mode="eval").body
    out: dict[str, Any] = {}
    for keyword in getattr(call, "keywords", []):
        try:
            out[str(keyword.arg)] = ast.literal_eval(keyword.value)
        except ValueError:
            continue
    return out


def splice_kl(ds: xr.Dataset, source: SaeSource, reference: str = "baseline", step: int = 0,
              n_resamples: int = 1000, seed: int = 0, force: bool = False) -> dict[str, xr.DataArray]:
    """Token group spliced -> `compare`'s KL(reference ‖ spliced condition) at `step` (summary,
    dim `stat`), for each condition that spliced this SAE in (`splice_conditions`)."""
    from .compare import output_metrics

    spliced = splice_conditions(ds, source)
    if not spliced or "logprobs" not in ds.data_vars:
        return {}
    summary = output_metrics(ds, reference, force=force, n_resamples=n_resamples, seed=seed)
    held = [str(c) for c in summary.condition.values]
    return {group: summary["kl"].sel(condition=condition, step=step)
            for condition, group in spliced.items() if condition in held}
