"""What a vision token reads as in words: its nearest text tokens per layer (the `text-neighbours`
analysis), after LatentLens (Krojer et al. 2026, arXiv 2602.00462), which reads vision tokens
through their nearest contextual text embeddings and finds them more interpretable than the logit
lens says.

For every vision token t of the chosen samples in one condition and every stored layer l:
- contextual: the `k` text tokens u of the same condition, any sample, whose stored h_l(u) is
  nearest to h_l(t) by cosine cos(h_l(t), h_l(u)) = h·h' / (‖h‖ ‖h'‖): which sample, position and
  token text each is, and the cosine (`context_*`). A zero vector has no direction: never a
  neighbour, and a zero query has none;
- in the input embedding table: the `k` nearest rows by cosine, computed in the trace by the
  `embed_lens` capture (`embed_nn_ids`, `embed_nn_cos`; analyses never load weights), with each
  id's text (`embed_*`);
- beside them the logit lens's top `k` tokens and probabilities at the same token and layer (the
  `logit_lens` capture, as the `logit-lens` analysis reads it; `lens_*`).
The two captured readouts are optional: without them only the contextual neighbours are given.

Token texts: a contextual neighbour's is its own `token_text`; an id's (embedding rows, lens
tokens) is the run's `run_id_texts` (written with an `embed_lens` capture), else the text of a
prompt token of that id, else `#<id>`.

Memory: the queries' states (vision tokens of the chosen samples × layers × dim) are held; the
text tokens' `hidden` is read one block of rows at a time (`streaming.BLOCK_BYTES`), each block
merged into a running top-k per (query, layer), so the rest of the store is never held. Never
torch.
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from workbench.store import MODALITIES, RUN_PREFIX

from . import streaming
from .cache import MissingInputs, cached
from .lens import VARIABLES as LENS_VARIABLES
from .streaming import as_dask, as_str, layer_values, layout, take_rows

K = 5                  # neighbours kept per (vision token, layer)
QUERY_SAMPLES = 4      # samples whose vision tokens the table reads out when none are named
EMBED_VARIABLES = ("embed_nn_ids", "embed_nn_cos")


def query_samples(ds: xr.Dataset, condition: str, named: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The samples read out: those named that `condition` holds, else its first `QUERY_SAMPLES`."""
    lay = layout(ds, "token")
    rows = lay.condition_rows.get(condition, np.zeros(0, np.int64))
    held = [lay.samples[s] for s in sorted(set(lay.sample_code[rows].tolist()))]
    return tuple(s for s in named if s in held) if named else tuple(held[:QUERY_SAMPLES])


def id_texts(ds: xr.Dataset) -> dict[int, str]:
    """Token id -> text: every prompt token's `token_text`, then the runs' `run_id_texts`."""
    out: dict[int, str] = {}
    if "token_text" in ds.coords or "token_text" in ds:
        ids = np.asarray(ds["token_id"].values).astype(np.int64)
        first = np.unique(ids, return_index=True)[1]
        out.update(zip(ids[first].tolist(), as_str(ds["token_text"].values[first]).tolist()))
    if RUN_PREFIX + "id_texts" in ds:
        for text in as_str(ds[RUN_PREFIX + "id_texts"].values):
            if text:
                out.update({int(k): v for k, v in json.loads(text).items()})
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to norm 1 along the last axis; a zero (or non-finite) row becomes NaN."""
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((norm > 0) & np.isfinite(norm), x / norm, np.nan)


def merge_top(best_cos: np.ndarray, best_row: np.ndarray, cos: np.ndarray, rows: np.ndarray,
              k: int) -> tuple[np.ndarray, np.ndarray]:
    """The running top-k (..., k) merged with a block's cosines (..., b) of candidate `rows` (b,):
    highest cosine first, ties by the lower row; NaN cosines never enter."""
    all_cos = np.concatenate([best_cos, np.where(np.isnan(cos), -np.inf, cos)], axis=-1)
    all_row = np.concatenate([best_row, np.broadcast_to(rows, cos.shape)], axis=-1)
    order = np.lexsort((all_row, -all_cos), axis=-1)[..., :k]
    return np.take_along_axis(all_cos, order, -1), np.take_along_axis(all_row, order, -1)


def contextual(hidden: object, queries: np.ndarray, keys: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, row) of shape (queries, layers, k): the `k` rows among `keys` nearest to each query
    row per layer (row -1 and cosine NaN where fewer exist), `hidden` read in blocks of rows."""
    data = as_dask(hidden)
    n_layers, dim = data.shape[1], data.shape[2]
    q = _unit(np.asarray(take_rows(data, queries).compute(), dtype=np.float64))          # (V, L, D)
    best_cos = np.full((len(queries), n_layers, k), -np.inf)
    best_row = np.full((len(queries), n_layers, k), -1, dtype=np.int64)
    # a block: its decoded rows and its cosines against every query both within BLOCK_BYTES
    per_row = max(n_layers * dim * data.dtype.itemsize, 8 * max(1, len(queries)) * n_layers)
    for block_rows, rows in streaming.row_blocks(data, keys, per_row):
        block = _unit(np.asarray(rows.compute(), dtype=np.float64))  # (b, L, D)
        cos = np.einsum("vld,bld->vlb", q, block)
        best_cos, best_row = merge_top(best_cos, best_row, cos, block_rows, k)
    best_cos = np.where(np.isfinite(best_cos), best_cos, np.nan)
    return best_cos, np.where(np.isfinite(best_cos), best_row, -1)


@cached("text-neighbours", version=1, variables=("hidden",))
def text_neighbours(ds: xr.Dataset, condition: str = "baseline", samples: tuple[str, ...] | None = None,
                    k: int = K) -> xr.Dataset:
    """Per vision token of `samples` (None: every sample) in `condition`, per layer: its `k` nearest
    text tokens by cosine (`context_cos`, `context_row`, `context_sample`, `context_position`,
    `context_text`), its nearest embedding-table rows (`embed_id`, `embed_cos`, `embed_text`) and
    the logit lens's top tokens (`lens_id`, `lens_prob`, `lens_text`), where those are stored."""
    lay = layout(ds, "token")
    if condition not in lay.condition_rows:
        raise MissingInputs(f"condition {condition!r} (the store holds {', '.join(lay.conditions)})")
    rows = lay.condition_rows[condition]
    wanted = np.isin(np.array(lay.samples, dtype=object)[lay.sample_code[rows]], list(samples)) \
        if samples is not None else np.ones(len(rows), bool)
    vision, text = MODALITIES.index("vision"), MODALITIES.index("text")
    queries = rows[wanted & (lay.modality_code[rows] == vision)]
    keys = rows[lay.modality_code[rows] == text]
    if not len(queries) or not len(keys):
        raise MissingInputs(f"vision and text tokens under {condition!r} (found {len(queries)} vision tokens of the "
                            f"samples read out, {len(keys)} text tokens)")
    _, layers = layer_values(ds, ds["hidden"])
    assert lay.position is not None  # the token dim's layout has positions
    cos, nearest = contextual(ds["hidden"].data, queries, keys, k)
    texts = as_str(ds["token_text"].values) if "token_text" in ds.coords or "token_text" in ds \
        else np.asarray(ds["token_id"].values).astype(str)
    found = nearest >= 0
    at = np.where(found, nearest, 0)
    dims = ("query", "layer", "rank")
    data: dict[str, tuple[tuple[str, ...], np.ndarray]] = {
        "context_cos": (dims, cos),
        "context_row": (dims, nearest),
        "context_sample": (dims, np.where(found, np.array(lay.samples, dtype=object)[lay.sample_code[at]], "")),
        "context_position": (dims, np.where(found, lay.position[at], -1)),
        "context_text": (dims, np.where(found, texts[at].astype(object), "")),
    }
    names = id_texts(ds)
    name_of = np.vectorize(lambda i: names.get(int(i), f"#{int(i)}"), otypes=[object])
    if all(v in ds.data_vars for v in EMBED_VARIABLES):
        ids = np.asarray(take_rows(ds["embed_nn_ids"].data, queries).compute())[..., :k].astype(np.int64)
        data["embed_id"] = (dims, ids)
        data["embed_cos"] = (dims, np.asarray(take_rows(ds["embed_nn_cos"].data, queries).compute())[..., :k]
                             .astype(np.float64))
        data["embed_text"] = (dims, name_of(ids))
    if all(v in ds.data_vars for v in LENS_VARIABLES):
        ids = np.asarray(take_rows(ds["lens_ids"].data, queries).compute())[..., :k].astype(np.int64)
        data["lens_id"] = (dims, ids)
        data["lens_prob"] = (dims, np.exp(np.asarray(take_rows(ds["lens_logprobs"].data, queries).compute())[..., :k]
                                          .astype(np.float64)))
        data["lens_text"] = (dims, name_of(ids))
    coords = {"layer": layers, "rank": np.arange(k),
              "query_row": ("query", queries),
              "query_sample": ("query", np.array(lay.samples, dtype=str)[lay.sample_code[queries]]),
              "query_position": ("query", lay.position[queries])}
    return xr.Dataset(data, coords=coords, attrs={"condition": condition})


def layer_summary(result: xr.Dataset) -> xr.Dataset:
    """Per layer: the mean over vision tokens of the nearest contextual and embedding cosines and of
    the lens's top-1 probability, and each readout's most frequent top-1 text (`*_top`, with its
    share of the vision tokens)."""
    out: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
    for prefix, value in (("context", "context_cos"), ("embed", "embed_cos"), ("lens", "lens_prob")):
        if value not in result:
            continue
        top1 = result[value].isel(rank=0).values
        with np.errstate(invalid="ignore"):
            out[f"{prefix}_mean"] = (("layer",), np.nanmean(np.where(np.isfinite(top1), top1, np.nan), axis=0))
        words: list[str] = []
        shares: list[float] = []
        for column in result[f"{prefix}_text"].isel(rank=0).values.T:
            kept = np.array([w for w in column.tolist() if w != ""], dtype=object).astype(str)
            if not len(kept):
                words.append("")
                shares.append(np.nan)
                continue
            values, counts = np.unique(kept, return_counts=True)
            best = int(np.argmax(counts))
            words.append(str(values[best]))
            shares.append(float(counts[best]) / len(column))
        out[f"{prefix}_top"] = (("layer",), np.array(words, dtype=object))
        out[f"{prefix}_top_share"] = (("layer",), np.array(shares, dtype=float))
    return xr.Dataset(out, coords={"layer": result.layer.values}, attrs={"n_vision": int(result.sizes["query"])})
