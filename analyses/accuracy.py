"""Task accuracy: each run's greedy response scored against its sample's answer.

Per run the store holds `run_response` (the generated text cut before the first special token,
special tokens dropped), `run_answer`, `run_all_answers`, `run_eval_mode` and `run_category`. A
store written before these labels existed lacks `run_response` (the table says so); in one resumed
across that change the older runs hold `""` for all of them (a newer run's `run_all_answers` is
at least `[]`), and those runs are left unscored rather than scored as empty responses. A run is scored 1 (correct), 0 (wrong) or left unscored (NaN: no answer, or
`eval_mode` `judge`) by its mode (`workbench.definitions.EVAL_MODES`):

- normalization (every mode): Unicode NFKC, lower case, whitespace runs collapsed to one space,
  punctuation and quotes at either end stripped (`"Red."` -> `red`); only the response's first
  non-empty line counts.
- `exact`: normalized response == normalized answer.
- `choice`: the option letter of each side: the whole text is one letter (`B`), or it starts
  with a letter set off by brackets or punctuation (`(B)`, `[B]`, `B.`, `B)`, `B:`, `B. red`),
  after an optional `answer:` / `the answer is`; the letters must be equal (`(b) red` vs `B`
  is correct). A response without a letter is wrong.
- `numeric`: the first number of the response (thousands commas dropped, `-` sign, decimals,
  or a number word zero..twenty) against the answer's number: correct when
  |x − y| ≤ max(ABS_TOL, REL_TOL·|y|).
- `direct` (DatBench's deterministic mode) and no mode (`""`): `choice` if the answer is an
  option letter (`B`, `(B)`, `B.`), `numeric` if the normalized answer is a number, else `exact`.
- `judge`: not scored; counted in the table's `unscored` column.
- several accepted answers (`run_all_answers`, DatBench's `all_answers`, beside `run_answer`):
  right if the response is right for any of them (`score_any`).

Accuracy per condition (and per category) is the mean score over samples with a 95% bootstrap
CI over samples (`bootstrap.summarize`); the categories' samples are resampled within each
category.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata

import numpy as np
import xarray as xr

from workbench.definitions import EVAL_MODES

from .bootstrap import N_RESAMPLES, SEED, summarize
from .cache import MissingInputs
from .streaming import as_str, layout

REL_TOL = 0.01
ABS_TOL = 1e-6
NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_EDGE_PUNCTUATION = " \t\"'`.,;:!?()[]{}<>*_-"
_LETTER = re.compile(r"^(?:the answer is|answer\s*:|answer is)?\s*(?:\(([a-z])\)|\[([a-z])\]|([a-z])(?:$|[.):]))")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?|-?\.\d+")


def first_line(text: str) -> str:
    """The first non-empty line, NFKC, lower case, whitespace runs collapsed to one space."""
    lines = [line for line in unicodedata.normalize("NFKC", text).splitlines() if line.strip()]
    return " ".join(lines[0].lower().split()) if lines else ""


def normalize(text: str) -> str:
    """`first_line` with punctuation and quotes at either end stripped: what `exact` compares."""
    return first_line(text).strip(_EDGE_PUNCTUATION)


def option_letter(text: str) -> str | None:
    """The option letter a text gives (`B`, `(B)`, `B.`, `B) red`, `Answer: B`), lower case, or None."""
    match = _LETTER.match(first_line(text))
    return next((g for g in match.groups() if g), None) if match else None


def _digits(text: str) -> str:
    return re.sub(r"(?<=\d),(?=\d)", "", first_line(text))  # 1,234 -> 1234


def first_number(text: str) -> float | None:
    """The first number in a text (commas between digits dropped), or a number word; else None."""
    match = _NUMBER.search(_digits(text))
    if match:
        return float(match.group())
    words = [w.strip(_EDGE_PUNCTUATION) for w in first_line(text).split()]
    return next((float(NUMBER_WORDS[w]) for w in words if w in NUMBER_WORDS), None)


def resolved_mode(answer: str, eval_mode: str) -> str:
    """The rule a run is scored by: `direct` and no mode resolve by the answer's form."""
    if eval_mode not in ("", "direct"):
        return eval_mode
    norm = normalize(answer)
    if len(norm) == 1 and norm.isascii() and norm.isalpha():
        return "choice"
    if _NUMBER.fullmatch(_digits(answer).rstrip(".")):
        return "numeric"
    return "exact"


def score(response: str, answer: str, eval_mode: str = "") -> float:
    """1.0 if `response` answers `answer` under `eval_mode` (module doc), 0.0 if not, NaN if the run
    is not scored (no answer, or `judge`). An unknown mode raises ValueError naming it."""
    if eval_mode not in ("", *EVAL_MODES):
        raise ValueError(f"eval_mode: got {eval_mode!r}; expected one of {', '.join(EVAL_MODES)} (or '' for none)")
    if not answer.strip() or eval_mode == "judge":
        return math.nan
    mode = resolved_mode(answer, eval_mode)
    if mode == "choice":
        letter = option_letter(answer) or normalize(answer)
        return float(option_letter(response) == letter)
    if mode == "numeric":
        got, want = first_number(response), first_number(answer)
        if want is None:
            raise ValueError(f"eval_mode numeric: the answer {answer!r} holds no number; expected a numeric answer")
        return float(got is not None and abs(got - want) <= max(ABS_TOL, REL_TOL * abs(want)))
    return float(normalize(response) == normalize(answer))


def score_any(response: str, answers: list[str], eval_mode: str = "") -> float:
    """The best score of `response` over every accepted answer (NaN if none is scored)."""
    scores = [score(response, a, eval_mode) for a in dict.fromkeys(answers)]
    return max((s for s in scores if not math.isnan(s)), default=math.nan)


def _accepted(answer: str, all_answers: str) -> list[str]:
    """`run_answer` and the JSON list of `run_all_answers` ("" or absent: none), blanks dropped."""
    extra = json.loads(all_answers) if all_answers else []
    return [a for a in (answer, *extra) if a.strip()]


def lacking(ds: xr.Dataset) -> list[str]:
    """What the analysis needs that a model's Dataset lacks (empty: it can run)."""
    missing = [] if "run_response" in ds.variables else [
        "run_response (a `logits` capture; `generate: {max_new_tokens: N}` for more than one token)"]
    return missing + ([] if "run_answer" in ds.variables else ["run_answer"])


def run_scores(ds: xr.Dataset) -> xr.Dataset:
    """Per (condition, sample): `score` (1, 0, NaN = not scored), and per sample its `category` and
    `judged` (whether its mode is `judge`)."""
    if lacking(ds):
        raise MissingInputs(", ".join(lacking(ds)))
    lay = layout(ds, "run")
    texts = as_str(ds["run_response"].values)
    answers = as_str(ds["run_answer"].values)
    modes = as_str(ds["run_eval_mode"].values) if "run_eval_mode" in ds.variables else np.full(len(answers), "")
    extra = as_str(ds["run_all_answers"].values) if "run_all_answers" in ds.variables else np.full(len(answers), "")
    categories = as_str(ds["run_category"].values) if "run_category" in ds.variables else np.full(len(answers), "")
    scores = np.full((len(lay.conditions), len(lay.samples)), np.nan)
    category = np.full(len(lay.samples), "", dtype=object)
    judged = np.zeros(len(lay.samples), dtype=bool)
    for c, condition in enumerate(lay.conditions):
        for row in lay.condition_rows[condition]:
            s = lay.sample_code[row]
            if extra[row] or "run_all_answers" not in ds.variables:  # "": written before the labels existed
                scores[c, s] = score_any(texts[row], _accepted(answers[row], extra[row]), modes[row])
            category[s], judged[s] = categories[row], modes[row] == "judge"
    coords = {"condition": np.array(lay.conditions, dtype=str), "sample": np.array(lay.samples, dtype=str),
              **lay.sweep_coords()}
    return xr.Dataset({"score": (("condition", "sample"), scores),
                       "category": ("sample", category.astype(str)), "judged": ("sample", judged)}, coords=coords)


def accuracy(ds: xr.Dataset, *, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> xr.Dataset:
    """Accuracy per condition (`accuracy`, over every scored sample) and per condition and category
    (`accuracy_by_category`), each the mean score with a 95% bootstrap CI over samples, and
    `unscored`: the samples with an answer but mode `judge`."""
    scores = run_scores(ds)
    overall = summarize(scores["score"], n_resamples=n_resamples, seed=seed)
    categories = sorted(set(scores["category"].values.tolist()))
    data = xr.Dataset({"accuracy": overall})
    if categories:
        data["accuracy_by_category"] = xr.concat([_category_accuracy(scores, c, n_resamples, seed) for c in categories],
                                                 dim="category")
    data["unscored"] = xr.DataArray(int(scores["judged"].sum()))
    return data


def _category_accuracy(scores: xr.Dataset, category: str, n_resamples: int, seed: int) -> xr.DataArray:
    """Accuracy per condition over the samples of one category (resampled within it)."""
    est = summarize(scores["score"].where(scores["category"] == category, drop=True), n_resamples=n_resamples,
                    seed=seed)
    counts = est["n_samples"].values[None]
    return est.drop_vars("n_samples").expand_dims(category=[category]).assign_coords(
        n_samples_by_category=(("category", "condition"), counts))
