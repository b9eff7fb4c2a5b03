"""Linear probes on the stored residual stream: what a per-sample field (the built-in task's
category or answer, any field of a user's JSONL) is linearly readable from, per condition, layer
and token group (the `probe` analysis).

Examples are samples, never tokens: for every (condition, sample, layer) a token group gives one
feature vector of `hidden`:
- `vision`, `boundary`, `text`: the mean over the sample's tokens of that modality;
- `last`: the sample's last prompt token (the one the first answer token is read from);
- `pooled`: the mean over all of its tokens.

The label of a sample is its run label `run_<field>` (`sample_labels`); `where` keeps only the
samples whose `run_<field>` equals a value (e.g. `category=color`); samples without a value ("")
are left out. Per (condition, group, layer), scikit-learn's `LogisticRegression` on features
standardized by the training folds' mean and deviation is scored by k-fold cross-validation
over samples (`StratifiedGroupKFold`, the sample as the group: no sample is in a training and a
test fold at once, and class proportions are kept per fold; `GroupKFold` where a class has fewer
samples than folds). Each fold reports:
- `accuracy` on its test samples;
- `chance`: the accuracy of always answering the training folds' most frequent class;
- `control`: the accuracy of the same probe trained on a control task, the labels shuffled across
  samples (each sample keeps a label drawn from the same distribution, unrelated to its
  activations; Hewitt & Liang 2019, "Designing and Interpreting Probes with Control Tasks");
- `selectivity` = accuracy − control.
The summaries are the mean over folds with a 95% Student-t interval over folds (`fold_summary`).
A fold whose training samples hold a single class has no probe (NaN).

The probe fitted on all samples is kept beside the scores: `weight (condition, group, layer,
class, dim)` in the units of `hidden` (the standardization folded in) and `bias`; a class's
direction is its row (binary: +w for the second class, −w for the first), and `probe_direction`
gives it as a unit vector, what a spec's steering direction `{probe: ..., layer: ..., class: ...}`
resolves to.

Memory: `hidden` is read one block of rows at a time (at most `streaming.BLOCK_BYTES` decoded);
what is held is the per-sample features, samples × 5 groups × layers × dim per condition, never
the tokens. Never torch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import xarray as xr

from workbench.store import MODALITIES, RUN_PREFIX

from . import streaming
from .cache import MissingInputs, cached
from .streaming import as_dask, as_str, layer_values, layout

GROUPS = ("vision", "text", "boundary", "last", "pooled")
SCORES = ("accuracy", "chance", "control", "selectivity")
N_SPLITS = 5
LEVEL = 0.95
# run labels that are not fields of the sample (what the run did, not what the data says)
NOT_FIELDS = ("condition", "sample", "input", "prompt", "generated_text", "response", "answer_ids", "all_answers",
              "patches", "id_texts")


def fields(ds: xr.Dataset) -> list[str]:
    """The per-sample fields a model's runs carry (`run_<field>` of strings), e.g. category, answer."""
    out = []
    for name in ds.variables:
        name = str(name)
        field = name[len(RUN_PREFIX):]
        if name.startswith(RUN_PREFIX) and ds[name].dims == ("run",) and ds[name].dtype.kind in "UOT" \
                and field not in NOT_FIELDS:
            out.append(field)
    return sorted(out)


def parse_where(where: str | None) -> tuple[str, str] | None:
    """`FIELD=VALUE` -> (field, value); None or "" -> None."""
    if not where:
        return None
    field, sep, value = where.partition("=")
    if not sep or not field.strip():
        raise ValueError(f"--where: got {where!r}; expected FIELD=VALUE, e.g. category=color")
    return field.strip(), value.strip()


def sample_labels(ds: xr.Dataset, label: str, where: str | None = None) -> dict[str, str]:
    """Sample -> its value of `label` (`run_<label>`), the samples `where` keeps, those without a value left out."""
    kept = parse_where(where)
    for field in [label] + ([kept[0]] if kept else []):
        if RUN_PREFIX + field not in ds.variables:
            raise MissingInputs(f"the per-sample field {field!r} (run_{field}); the store's fields: "
                                f"{', '.join(fields(ds)) or 'none'}")
    samples = as_str(ds[RUN_PREFIX + "sample"].values)
    values = as_str(ds[RUN_PREFIX + label].values)
    keep = np.ones(len(samples), bool) if kept is None else as_str(ds[RUN_PREFIX + kept[0]].values) == kept[1]
    out: dict[str, str] = {}
    for sample, value, ok in zip(samples.tolist(), values.tolist(), keep.tolist()):
        if ok and value and sample not in out:
            out[sample] = value
    return out


def group_features(ds: xr.Dataset, condition: str) -> np.ndarray:
    """(samples of `layout(ds).samples`, GROUPS, layers, dim) features of `condition` (NaN: the
    sample has no token of that group), read one block of rows of `hidden` at a time."""
    lay = layout(ds, "token")
    hidden = as_dask(ds["hidden"].data)
    n, n_layers, dim = len(lay.samples), hidden.shape[1], hidden.shape[2]
    sums = np.zeros((n, len(MODALITIES), n_layers, dim))
    counts = np.zeros((n, len(MODALITIES)))
    last = np.full((n, n_layers, dim), np.nan)
    last_position = np.full(n, -1, dtype=np.int64)
    rows = lay.condition_rows.get(condition, np.zeros(0, np.int64))
    assert lay.position is not None
    for block_rows, read in streaming.row_blocks(hidden, rows, n_layers * dim * hidden.dtype.itemsize):
        block = np.asarray(read.compute(), dtype=np.float64)
        samples, modality = lay.sample_code[block_rows], lay.modality_code[block_rows]
        position = lay.position[block_rows]
        for s in np.unique(samples):
            mine = samples == s
            for m in np.unique(modality[mine]):
                if m >= 0:
                    at = mine & (modality == m)
                    sums[s, m] += block[at].sum(0)
                    counts[s, m] += at.sum()
            top = np.flatnonzero(mine)[np.argmax(position[mine])]
            if position[top] > last_position[s]:
                last_position[s], last[s] = position[top], block[top]
    out = np.full((n, len(GROUPS), n_layers, dim), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        for m, modality_name in enumerate(MODALITIES):
            out[:, GROUPS.index(modality_name)] = sums[:, m] / counts[:, m, None, None]
        out[:, GROUPS.index("pooled")] = sums.sum(1) / counts.sum(1)[:, None, None]
    out[:, GROUPS.index("last")] = last
    return out


@dataclass
class ProbeFit:
    """Cross-validated scores (SCORES × folds) and the probe fitted on every sample."""

    scores: np.ndarray              # (len(SCORES), n_splits), NaN where a fold has no probe
    classes: list[str]
    weight: np.ndarray              # (classes, dim) in the features' units
    bias: np.ndarray                # (classes,)


def _standardized(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Rows standardized by the training rows' mean and standard deviation (a constant column: 1),
    as scikit-learn's `StandardScaler` does (sklearn/preprocessing/_data.py, 1.9.1), without its
    per-call validation: a probe's fit is small and there are thousands of them."""
    mean, scale = train.mean(0), train.std(0)
    scale = np.where(scale > 10 * np.finfo(np.float64).eps * np.maximum(np.abs(mean), 1), scale, 1.0)
    return [(x - mean) / scale for x in (train, *others)] + [mean, scale]


def _logistic(seed: int):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=2000, random_state=seed)


def folds(y: np.ndarray, n_splits: int = N_SPLITS, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (train, test) index pairs over samples (each row one sample, its own group):
    `StratifiedGroupKFold`, or `GroupKFold` where a class has fewer samples than folds (scikit-learn
    1.9 sklearn/model_selection/_split.py refuses to stratify those)."""
    from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

    k = min(n_splits, len(y))
    if k < 2:
        return []
    groups, rows = np.arange(len(y)), np.zeros((len(y), 1))
    if np.unique(y, return_counts=True)[1].min() >= k:
        splitter: StratifiedGroupKFold | GroupKFold = StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)
    else:
        splitter = GroupKFold(n_splits=k, shuffle=True, random_state=seed)
    return list(splitter.split(rows, y, groups=groups))


def _fold_accuracy(x: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray, seed: int) -> float:
    if len(np.unique(y[train])) < 2:
        return np.nan
    x_train, x_test, _, _ = _standardized(x[train], x[test])
    model = _logistic(seed).fit(x_train, y[train])
    return float(np.mean(model.predict(x_test) == y[test]))


def control_labels(y: np.ndarray, seed: int = 0) -> np.ndarray:
    """The control task's labels: `y` permuted across samples (same distribution, no relation to x)."""
    return np.random.default_rng(seed).permutation(y)


def fit_probe(x: np.ndarray, y: np.ndarray, n_splits: int = N_SPLITS, seed: int = 0,
              splits: list[tuple[np.ndarray, np.ndarray]] | None = None) -> ProbeFit:
    """Cross-validated accuracy, chance, control accuracy and selectivity of a logistic-regression
    probe of `y` from `x` (one row per sample), and the probe fitted on all rows (module doc).
    `splits`: `folds(y, n_splits, seed)`, computed once where many `x` share one `y`."""
    scores = np.full((len(SCORES), n_splits), np.nan)
    control = control_labels(y, seed)
    for f, (train, test) in enumerate(folds(y, n_splits, seed) if splits is None else splits):
        values, counts = np.unique(y[train], return_counts=True)
        scores[0, f] = _fold_accuracy(x, y, train, test, seed)
        scores[1, f] = np.mean(y[test] == values[np.argmax(counts)])
        scores[2, f] = _fold_accuracy(x, control, train, test, seed)
    scores[3] = scores[0] - scores[2]
    classes = sorted(set(y.tolist()))
    weight, bias = np.full((len(classes), x.shape[1]), np.nan), np.full(len(classes), np.nan)
    if len(classes) >= 2:
        x_all, mean, scale = _standardized(x)
        logistic = _logistic(seed).fit(x_all, y)
        coef = logistic.coef_ / scale                 # w·(x − μ)/σ + b = (w/σ)·x + (b − (w/σ)·μ)
        intercept = logistic.intercept_ - coef @ mean
        if len(classes) == 2:                         # one row: the second class's score; the first's is its negative
            coef, intercept = np.vstack([-coef[0], coef[0]]), np.array([-intercept[0], intercept[0]])
        order = [list(logistic.classes_).index(c) for c in classes]
        weight, bias = coef[order], intercept[order]
    return ProbeFit(scores, classes, weight, bias)


def _fit_all(features: np.ndarray, known: np.ndarray, y_all: np.ndarray, n_splits: int, seed: int, classes: list[str],
             scores: np.ndarray, weight: np.ndarray, bias: np.ndarray, counts: np.ndarray) -> None:
    """Every (group, layer) probe of one condition, written into the arrays given. BLAS runs on one
    thread: a fit on a few hundred samples gains nothing from more, and on a busy machine threads
    contending cost 10x (measured with scikit-learn 1.9.1's lbfgs)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        for g in range(len(GROUPS)):
            rows = known & np.isfinite(features[:, g]).all(axis=(1, 2))
            y = y_all[rows].astype(str)
            counts[g] = rows.sum()
            if len(set(y.tolist())) < 2:
                continue
            splits = folds(y, n_splits, seed)
            for l in range(features.shape[2]):
                fit = fit_probe(features[rows, g, l], y, n_splits, seed, splits)
                scores[:, g, l] = fit.scores
                at = [classes.index(k) for k in fit.classes]
                weight[g, l, at], bias[g, l, at] = fit.weight, fit.bias


@cached("probe", version=1, variables=("hidden",))
def probe_results(ds: xr.Dataset, label: str = "category", where: str | None = None, n_splits: int = N_SPLITS,
                  seed: int = 0) -> xr.Dataset:
    """Per (condition, group, layer): the fold scores (`accuracy`, `chance`, `control`,
    `selectivity`, dim `fold`) and the probe fitted on all samples (`weight`, `bias`; module doc)."""
    labels = sample_labels(ds, label, where)
    lay = layout(ds, "token")
    _, layers = layer_values(ds, ds["hidden"])
    classes = sorted(set(labels.values()))
    if len(classes) < 2:
        raise MissingInputs(f"two or more values of {label!r} among the samples probed (found "
                            f"{', '.join(repr(c) for c in classes) or 'none'})")
    known = np.array([s in labels for s in lay.samples])
    y_all = np.array([labels.get(s, "") for s in lay.samples], dtype=object)
    dim = ds["hidden"].shape[-1]
    shape = (len(lay.conditions), len(GROUPS), len(layers))
    scores = np.full((len(SCORES), *shape, n_splits), np.nan)
    weight = np.full((*shape, len(classes), dim), np.nan, dtype=np.float32)
    bias = np.full((*shape, len(classes)), np.nan)
    counts = np.zeros(shape[:2], dtype=np.int64)
    for c, condition in enumerate(lay.conditions):
        features = group_features(ds, condition)
        _fit_all(features, known, y_all, n_splits, seed, classes, scores[:, c], weight[c], bias[c], counts[c])
    dims = ("condition", "group", "layer")
    coords = {"condition": np.array(lay.conditions, dtype=str), "group": np.array(GROUPS, dtype=str), "layer": layers,
              "class": np.array(classes, dtype=str), "fold": np.arange(n_splits), **lay.sweep_coords()}
    data: dict[str, tuple[tuple[str, ...], np.ndarray]] = {
        name: ((*dims, "fold"), scores[i]) for i, name in enumerate(SCORES)}
    data["weight"] = ((*dims, "class", "dim"), weight)
    data["bias"] = ((*dims, "class"), bias)
    data["n_probed"] = (("condition", "group"), counts)
    return xr.Dataset(data, coords=coords, attrs={"label": label, "where": where or ""})


def fold_summary(values: xr.DataArray, level: float = LEVEL) -> xr.DataArray:
    """Mean over `fold` with a Student-t interval over the folds that have a value (dim `stat`;
    no interval below two folds), and the count of such folds (`n_folds_<name>`)."""
    from scipy import stats

    v = values.transpose(..., "fold").values
    n = np.isfinite(v).sum(-1)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(v, axis=-1)
        half = stats.t.ppf((1 + level) / 2, np.maximum(n - 1, 1)) * np.nanstd(v, axis=-1, ddof=1) / np.sqrt(n)
    half = np.where(n >= 2, half, np.nan)
    bounds = (-1.0, 1.0) if values.name == "selectivity" else (0.0, 1.0)   # a t interval can overshoot a fraction's range
    dims = [d for d in values.dims if d != "fold"]
    out = xr.DataArray(np.stack([mean, np.clip(mean - half, *bounds), np.clip(mean + half, *bounds)], -1), dims=[*dims, "stat"],
                       coords={**{k: c for k, c in values.coords.items() if "fold" not in c.dims},
                               "stat": ["value", "ci_low", "ci_high"]}, name=values.name)
    return out.assign_coords(n_folds=(dims, n)).rename(n_folds=f"n_folds_{values.name}")


def probe_metrics(ds: xr.Dataset, label: str = "category", where: str | None = None, n_splits: int = N_SPLITS,
                  seed: int = 0, *, force: bool = False, cache: bool = True) -> xr.Dataset:
    """`accuracy`, `chance`, `control` and `selectivity` per (condition, group, layer): the mean
    over folds with a 95% t interval (`fold_summary`)."""
    results = probe_results(ds, label, where, n_splits, seed, force=force, cache=cache)
    out = xr.Dataset({name: fold_summary(results[name]) for name in SCORES}, attrs=results.attrs)
    return out.assign_coords(n_probed=results["n_probed"])


def probe_direction(results: xr.Dataset, layer: int, klass: str, condition: str = "baseline",
                    group: str = "vision") -> np.ndarray:
    """The unit weight vector of class `klass` of the probe at `layer` (`probe_results`' `weight`)."""
    for name, value, held in (("layer", layer, results.layer.values), ("class", klass, results["class"].values),
                              ("condition", condition, results.condition.values), ("group", group, GROUPS)):
        if value not in [type(value)(h) for h in held]:
            raise KeyError(f"{name}: no {value!r} in the probe; expected one of {', '.join(str(h) for h in held)}")
    w = np.asarray(results["weight"].sel({"condition": condition, "group": group, "layer": layer, "class": klass}).values,
                   dtype=np.float64)
    norm = float(np.linalg.norm(w))
    if not np.isfinite(norm) or norm == 0:
        raise ValueError(f"the probe has no direction for class {klass!r} at layer {layer} ({condition}, {group})")
    return w / norm
