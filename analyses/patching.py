"""Patching scans: the effect of each (layer, position group) patch on a metric of the output,
normalized to 0 at the base run and 1 at the donor run (the `patching` analysis; the scans are
`workbench.spec.scans`).

A scan's run stores beside its sweep values `dir` (denoising | noising), `scan_base` (the
condition it runs as), `scan_donor` (where the patched values come from), `scan_site`, `l` and
`pos`. Per sample s and run r, from `logprobs` at decode step 0 (the prompt's next token, the one
step whose context every run shares), the metric m is one of:

- `logit_diff`: ln p(a) − ln p(b) for two token ids a, b (`--tokens A,B`): the logit difference,
  as the softmax's normalizer cancels;
- `answer_logprob`: ln p(a₀), a₀ the first token of the sample's stored answer (`run_answer_ids`);
- `kl`: KL(p_base ‖ p_r) in nats (`analyses.compare.output_comparison`): 0 at the base by definition.

A scan with method: attribution stores no forward per run but `attribution`, the estimate of
m_r − m_base (`workbench.attribution`) on the metric it was run for: its cells read m_base +
that estimate, and appear only when the analysis asks for that metric and those tokens.

The normalized effect of a cell is a ratio of means over the samples holding all three values,
(mean_s m_r − mean_s m_base) / (mean_s m_donor − mean_s m_base), ROME's normalization (Meng et al.
2022, "Locating and Editing Factual Associations in GPT", causal tracing): 0 where the patch does
nothing, 1 where it gives the donor's metric. Its 95% CI is a percentile bootstrap over samples
(`analyses.bootstrap.resample_indices`: the same resamples for the numerator and the denominator,
so they stay paired). Never torch.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr

from .bootstrap import LEVEL, MIN_SAMPLES, N_RESAMPLES, SEED, STATS, resample_indices, summarize
from .cache import MissingInputs
from .compare import answer_ids, output_comparison
from .streaming import as_str, layout

METRICS = ("kl", "logit_diff", "answer_logprob")
METRIC_LABELS = {"kl": "KL(base ‖ run), nats", "logit_diff": "ln p(a) − ln p(b)",
                 "answer_logprob": "ln p(answer's first token)"}
SCAN_COORDS = ("run_dir", "run_scan_base", "run_scan_donor", "run_scan_site", "run_l", "run_pos")
DIRECTIONS = ("denoising", "noising")
_GROUP_ORDER = ("vision", "text", "boundary", "all")


@dataclass(frozen=True)
class ScanRun:
    """One stored run of a scan: its condition, the scan's name, and what it patched."""

    condition: str
    scan: str
    direction: str
    layer: int
    position: str
    base: str
    donor: str
    site: str
    head: int | None = None   # the one head patched (a scan over `heads`), None: the site's whole value
    method: str = "patching"  # attribution: the run stores an estimate of m(run) − m(base), not a forward
    estimated: str = ""       # an attribution run's metric and tokens, `logit_diff:5,17`


def scan_runs(ds: xr.Dataset) -> list[ScanRun]:
    """Every scan run a model's Dataset holds (none: a store without scans)."""
    if any(name not in ds.coords for name in SCAN_COORDS):
        return []
    labels = {name: as_str(ds[name].values) for name in SCAN_COORDS if name != "run_l"}
    layers = np.asarray(ds["run_l"].values, dtype=float)
    heads = np.asarray(ds["run_h"].values, dtype=float) if "run_h" in ds.coords else np.full(len(layers), np.nan)
    method = {name: as_str(ds[f"run_scan_{name}"].values) if f"run_scan_{name}" in ds.coords else
              np.full(len(layers), "") for name in ("method", "metric", "tokens")}
    conditions = as_str(ds["run_condition"].values)
    runs: dict[str, ScanRun] = {}
    for i in np.flatnonzero(labels["run_scan_base"] != ""):
        name = str(conditions[i])
        if name not in runs:
            runs[name] = ScanRun(name, name.partition("[")[0], str(labels["run_dir"][i]), int(layers[i]),
                                 str(labels["run_pos"][i]), str(labels["run_scan_base"][i]),
                                 str(labels["run_scan_donor"][i]), str(labels["run_scan_site"][i]),
                                 None if np.isnan(heads[i]) else int(heads[i]), str(method["method"][i]) or "patching",
                                 f"{method['metric'][i]}:{method['tokens'][i]}" if method["method"][i] else "")
    return sorted(runs.values(), key=lambda r: (r.scan, r.direction, r.layer, -1 if r.head is None else r.head,
                                                position_key(r.position)))


def position_key(position: str) -> tuple:
    """The groups first (vision, text, boundary, all), then token positions in prompt order
    (indices, then `last-k` from the earliest, then `last`)."""
    if position in _GROUP_ORDER:
        return (0, _GROUP_ORDER.index(position), 0)
    if re.fullmatch(r"[0-9]+(\+[0-9]+)*", position):
        return (1, int(position.split("+")[0]), 0)
    back = 0 if position == "last" else int(position.rpartition("-")[2]) if position.startswith("last-") else -1
    return (2, -back, position)


def metric_values(ds: xr.Dataset, metric: str, base: str, tokens: tuple[int, int] | None = None) -> xr.DataArray:
    """Per (condition, sample): the metric at decode step 0 (module doc); `base`: the run KL is
    measured from."""
    if metric not in METRICS:
        raise ValueError(f"metric: got {metric!r}; expected one of {', '.join(METRICS)}")
    if "logprobs" not in ds.data_vars:
        raise MissingInputs("logprobs (a `logits` capture)")
    if metric == "kl":
        return output_comparison(ds, base)["kl"].isel(step=0, drop=True)
    lay = layout(ds, "run")
    if metric == "logit_diff":
        if tokens is None:
            raise MissingInputs("two token ids for the logit difference (--tokens A,B)")
        vocab = ds.sizes["vocab"]
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise MissingInputs(f"token ids within the vocabulary (0..{vocab - 1}); got {bad}")
        pair = np.asarray(ds["logprobs"].isel(step=0, vocab=list(tokens)).values, dtype=np.float64)
        per_run = pair[:, 0] - pair[:, 1]
    else:
        ids = answer_ids(ds)
        have = np.flatnonzero(ids >= 0)
        per_run = np.full(len(ids), np.nan)
        if len(have):
            first = np.asarray(ds["logprobs"].isel(step=0, run=have).values, dtype=np.float64)
            per_run[have] = first[np.arange(len(have)), ids[have]]
    out = np.full((len(lay.conditions), len(lay.samples)), np.nan)
    for c, condition in enumerate(lay.conditions):
        rows = lay.condition_rows[condition]
        out[c, lay.sample_code[rows]] = per_run[rows]
    return xr.DataArray(out, dims=("condition", "sample"),
                        coords={"condition": np.array(lay.conditions, dtype=str), "sample": np.array(lay.samples, dtype=str)})


def estimates(ds: xr.Dataset) -> xr.DataArray:
    """Per (condition, sample): an attribution run's stored estimate of m(run) − m(base)."""
    if "attribution" not in ds.data_vars:
        raise MissingInputs("attribution (the estimates of a scan with method: attribution)")
    lay = layout(ds, "run")
    per_run = np.asarray(ds["attribution"].values, dtype=np.float64)
    out = np.full((len(lay.conditions), len(lay.samples)), np.nan)
    for c, condition in enumerate(lay.conditions):
        rows = lay.condition_rows[condition]
        out[c, lay.sample_code[rows]] = per_run[rows]
    return xr.DataArray(out, dims=("condition", "sample"), coords={
        "condition": np.array(lay.conditions, dtype=str), "sample": np.array(lay.samples, dtype=str)})


def normalized_effect(run: np.ndarray, base: np.ndarray, donor: np.ndarray, n_resamples: int = N_RESAMPLES,
                      seed: int = SEED, level: float = LEVEL) -> np.ndarray:
    """(cells, samples) metric of the patched runs, (samples,) of the base and the donor ->
    (cells, 3): (mean run − mean base) / (mean donor − mean base) and its percentile bootstrap CI
    over samples, each cell over the samples holding all three values (NaN: fewer than
    `MIN_SAMPLES`, or a donor no different from the base)."""
    run = np.atleast_2d(np.asarray(run, dtype=np.float64))
    out = np.full((run.shape[0], 3), np.nan)
    if not run.shape[1]:
        return out
    idx = resample_indices(run.shape[1], n_resamples, seed)
    weights = np.zeros((idx.shape[0], run.shape[1]))
    np.add.at(weights, (np.arange(idx.shape[0])[:, None], idx), 1.0)
    tail = (1 - level) / 2 * 100
    for i, row in enumerate(run):
        ok = np.isfinite(row) & np.isfinite(base) & np.isfinite(donor)
        if not ok.any():
            continue
        w = weights[:, ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            point = (row[ok].mean() - base[ok].mean()) / (donor[ok].mean() - base[ok].mean())
            counts = w.sum(1)
            boot = ((w @ row[ok]) - (w @ base[ok])) / ((w @ donor[ok]) - (w @ base[ok]))
            boot = np.where(counts > 0, boot, np.nan)
        out[i, 0] = point
        if ok.sum() >= MIN_SAMPLES:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out[i, 1:] = np.nanpercentile(np.where(np.isfinite(boot), boot, np.nan), [tail, 100 - tail])
    return out


def _summary(values: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(rows, samples) -> (rows, 3): the mean over samples and its bootstrap CI."""
    out = summarize(xr.DataArray(values, dims=("row", "sample")), n_resamples=n_resamples, seed=seed)
    return np.asarray(out.values)


def patching_effects(ds: xr.Dataset, metric: str = "kl", tokens: tuple[int, int] | None = None,
                     n_resamples: int = N_RESAMPLES, seed: int = SEED, per_head: bool = False) -> xr.Dataset:
    """Every scan of a model: `effect` (normalized, with its CI) and the raw `metric` (mean over
    samples, CI) per (scan, direction, layer, position), NaN where the grid has no run; the base's
    and the donor's metric per (scan, direction) (`base_metric`, `donor_metric`). Coordinates
    `site` and `method` (per scan: patching, or attribution's estimates), `base` and `donor` (per
    scan and direction), `n_samples` (per cell: the samples holding the run's, the base's and the
    donor's value). Attribution scans of another metric or tokens are left out. per_head: the scans over heads
    instead (each run one head's patch), with a `head` dim after `layer`."""
    runs = [r for r in scan_runs(ds) if (r.head is not None) == per_head]
    asked = f"{metric}:{','.join(str(t) for t in tokens or ())}" if metric != "answer_logprob" else f"{metric}:"
    other = sorted({r.estimated for r in runs if r.method == "attribution" and r.estimated != asked})
    runs = [r for r in runs if r.method != "attribution" or r.estimated == asked]
    if not runs and other:
        raise MissingInputs(f"scans of real patching; the attribution scans estimated "
                            f"{', '.join(o.replace(':', ' ').strip() for o in other)} (--metric, --tokens)")
    if not runs:
        raise MissingInputs("a patching scan's runs over heads (a `scan:` with `heads`, workbench.spec.scans)"
                            if per_head else "a patching scan's runs (a condition with `scan:`, workbench.spec.scans)")
    scans = sorted({r.scan for r in runs})
    directions = [d for d in DIRECTIONS if any(r.direction == d for r in runs)]
    layers = sorted({r.layer for r in runs})
    heads = sorted({int(r.head) for r in runs if r.head is not None})
    positions = sorted({r.position for r in runs}, key=position_key)
    inner = (len(layers), len(heads), len(positions)) if per_head else (len(layers), len(positions))
    shape = (len(scans), len(directions), *inner, len(STATS))
    effect, raw = np.full(shape, np.nan), np.full(shape, np.nan)
    counts = np.zeros(shape[:-1], dtype=np.int64)
    ends = np.full((2, len(scans), len(directions), len(STATS)), np.nan)
    roles = np.full((2, len(scans), len(directions)), "", dtype=object)
    sites = np.full(len(scans), "", dtype=object)
    methods = np.array([next(r.method for r in runs if r.scan == s) for s in scans], dtype=object)
    values_by_base: dict[str, xr.DataArray] = {}
    estimated: xr.DataArray | None = None
    for (s, scan), (d, direction) in ((a, b) for a in enumerate(scans) for b in enumerate(directions)):
        cells = [r for r in runs if r.scan == scan and r.direction == direction]
        if not cells:
            continue
        base, donor = cells[0].base, cells[0].donor
        roles[:, s, d], sites[s] = (base, donor), cells[0].site
        if base not in values_by_base:
            values_by_base[base] = metric_values(ds, metric, base, tokens)
        values = values_by_base[base]
        held = set(as_str(values.condition.values).tolist())
        if base not in held or donor not in held:
            raise MissingInputs(f"the scan {scan!r}'s base {base!r} and donor {donor!r} runs")
        base_v, donor_v = values.sel(condition=base).values, values.sel(condition=donor).values
        if estimated is None and any(r.method == "attribution" for r in cells):
            estimated = estimates(ds)
        grid = np.stack([values.sel(condition=r.condition).values if estimated is None or r.method != "attribution"
                         else base_v + estimated.sel(condition=r.condition).values for r in cells])
        where = [(layers.index(r.layer), *([heads.index(int(r.head))] if r.head is not None else []),
                  positions.index(r.position)) for r in cells]
        found = normalized_effect(grid, base_v, donor_v, n_resamples=n_resamples, seed=seed)
        means = _summary(grid, n_resamples, seed)
        held_all = np.isfinite(grid) & np.isfinite(base_v) & np.isfinite(donor_v)
        for cell, e, m, n in zip(where, found, means, held_all.sum(1)):
            effect[(s, d, *cell)], raw[(s, d, *cell)], counts[(s, d, *cell)] = e, m, n
        ends[:, s, d] = _summary(np.stack([base_v, donor_v]), n_resamples, seed)
    dims = ("scan", "direction", "layer", *(("head",) if per_head else ()), "position", "stat")
    coords = {"scan": scans, "direction": directions, "layer": layers, **({"head": heads} if per_head else {}),
              "position": positions, "stat": list(STATS),
              "site": ("scan", sites.astype(str)), "method": ("scan", methods.astype(str)), "base": (("scan", "direction"), roles[0].astype(str)),
              "donor": (("scan", "direction"), roles[1].astype(str)), "n_samples": (dims[:-1], counts)}
    return xr.Dataset({"effect": (dims, effect), "metric": (dims, raw),
                       "base_metric": (("scan", "direction", "stat"), ends[0]),
                       "donor_metric": (("scan", "direction", "stat"), ends[1])},
                      coords=coords, attrs={"metric": metric, "tokens": list(tokens) if tokens else []})
