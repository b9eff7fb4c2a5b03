"""What a run stores beside its captures: token labels (position, modality, id) and readable
text (each token decoded, the prompt, the question, the generated answer, the sample's
category and answers), each as a `Variable` with its dims."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from .names import ESTIMATE_DIMS
from .sites import variable_dims  # dims of every stored capture, from the site registry
from .store import Variable

if TYPE_CHECKING:
    from .backends.local import RunResult
    from .data import Sample
    from .models.model import ModelInputs


def sample_variables(inputs: ModelInputs, result: RunResult, coords: dict[str, dict[str, np.ndarray]],
                     text: dict[str, Variable] | None = None) -> dict[str, Variable]:
    """The store's variables for one run: token labels (with each token's place in the image,
    where the family keeps one) plus every capture, with their dims, and the readable labels of
    `text_labels`."""
    variables = {
        "position": Variable(("token",), np.arange(inputs.n_tokens, dtype=np.int64)),
        "modality": Variable(("token",), inputs.modality.astype(str)),
        "token_id": Variable(("token",), inputs.input_ids.astype(np.int64)),
        **{name: Variable(("token",), values) for name, values in (inputs.geometry or {}).items()},
        **(text or {}),
    }
    dims = {**variable_dims(), **ESTIMATE_DIMS}
    for name, data in {**result.tokens, **result.run, **result.patches}.items():
        variables[name] = Variable(dims[name], data, coords.get(name, {}))
    if result.patches:  # each patch's index within its sample's tower rows
        n_patches = next(iter(result.patches.values())).shape[0]
        variables["patch_position"] = Variable(("vision_patch",), np.arange(n_patches, dtype=np.int64))
    return variables


class TokenTexts:
    """Each token id decoded on its own (`token_text`), remembered per id: a run meets the same
    ids again and again (image placeholders, the chat template), and a decode call per token
    cost more than the rest of a tiny model's labels."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.texts: dict[int, str] = {}
        self.prompts: dict[tuple[int, ...], str] = {}  # the last sample's prompts: its conditions share them

    def __call__(self, ids: list[int]) -> list[str]:
        new = [i for i in dict.fromkeys(ids) if i not in self.texts]
        if new:
            decoded = self.tokenizer.batch_decode([[i] for i in new], skip_special_tokens=False,
                                                  clean_up_tokenization_spaces=False)
            self.texts.update(zip(new, decoded))
        return [self.texts[i] for i in ids]

    def prompt(self, ids: list[int]) -> str:
        """The whole prompt decoded (special tokens kept), once per distinct prompt of a sample."""
        key = tuple(ids)
        if key not in self.prompts:
            if len(self.prompts) >= 8:
                self.prompts.clear()
            self.prompts[key] = self.tokenizer.decode(ids, skip_special_tokens=False)
        return self.prompts[key]


# captures whose values are token ids of the vocabulary, named in `run_id_texts` (with an `embed_lens` capture)
ID_READOUTS = ("embed_nn_ids", "lens_ids")


def text_labels(tokenizer: Any, inputs: ModelInputs, sample: Sample, result: RunResult,
                token_texts: TokenTexts | None = None) -> dict[str, Variable]:
    """What a reader wants next to the ids: each token decoded on its own (`token_text`), and per
    run the prompt as the model saw it, the question, the generated text (with a `logits`
    capture; `run_response`: the same cut before the first special token, e.g. the end of the
    turn, with special tokens dropped: what the accuracy analysis scores) and the sample's
    category, answer, scoring mode (`run_eval_mode`, "" where the sample has none) and every
    accepted answer (`run_all_answers`, a JSON list), and the answer's token ids (`run_answer_ids`,
    a JSON list, tokenized without special tokens as the model would continue with it; `[]`
    where the sample has none: the `compare` analysis reads the first one's log-prob). With an
    `embed_lens` capture, `run_id_texts`: a JSON object {id: text} of every token id the run's
    `embed_nn_ids` and `lens_ids` name, each decoded on its own as `token_text` is."""
    ids = np.asarray(inputs.input_ids).reshape(-1).tolist()
    token_texts = token_texts or TokenTexts(tokenizer)
    tokens = token_texts(ids)
    generated = result.run.get("generated")
    labels = {
        "token_text": Variable(("token",), np.array(tokens, dtype=object)),
        "run_prompt": Variable(("run",), np.array([token_texts.prompt(ids)], dtype=object)),
        "run_question": Variable(("run",), np.array([sample.question], dtype=object)),
        "run_category": Variable(("run",), np.array([sample.category or ""], dtype=object)),
        "run_answer": Variable(("run",), np.array([sample.answer or ""], dtype=object)),
        "run_eval_mode": Variable(("run",), np.array([sample.eval_mode or ""], dtype=object)),
        "run_all_answers": Variable(("run",), np.array([json.dumps(list(sample.all_answers))], dtype=object)),
        "run_answer_ids": Variable(("run",), np.array([json.dumps(answer_ids(tokenizer, sample.answer))], dtype=object)),
    }
    read_out = [np.asarray(result.tokens[name]).reshape(-1) for name in ID_READOUTS if name in result.tokens]
    if "embed_nn_ids" in result.tokens:  # the texts of the token ids the readouts name (the prompt need not hold them)
        named = sorted(set(np.concatenate(read_out).astype(np.int64).tolist()))
        labels["run_id_texts"] = Variable(("run",), np.array([json.dumps(dict(zip(map(str, named), token_texts(named))),
                                                                         ensure_ascii=False)], dtype=object))
    if generated is not None:
        steps = [int(i) for i in np.asarray(generated).reshape(-1)]
        text = tokenizer.decode(steps, skip_special_tokens=False)
        labels["run_generated_text"] = Variable(("run",), np.array([text], dtype=object))
        labels["run_response"] = Variable(("run",), np.array([response_text(tokenizer, steps)], dtype=object))
    return labels


def answer_ids(tokenizer: Any, answer: str | None) -> list[int]:
    """The answer's token ids without special tokens (none for no answer)."""
    if not answer or not answer.strip():
        return []
    return [int(i) for i in tokenizer.encode(answer, add_special_tokens=False)]


def response_text(tokenizer: Any, ids: list[int]) -> str:
    """The generated ids as an answer: cut before the first special token (the end of the turn;
    greedy decoding runs its fixed number of steps past it), decoded, stripped."""
    special = set(getattr(tokenizer, "all_special_ids", ()) or ())
    end = next((i for i, token in enumerate(ids) if token in special), len(ids))
    return tokenizer.decode(ids[:end], skip_special_tokens=True).strip()
