"""One resolution path for every model argument (a spec's `models`, `--models`, `workbench check
MODEL`): a tiny model's name, a local checkpoint directory, or a Hugging Face repo id 'org/name'.

:func:`model_ref_problem` is the syntactic half, torch-free (the spec validates with it): what is
wrong with an argument that can be none of the three, with "did you mean" for a misspelt tiny name.
:func:`resolve_model` adds the config half (`model.model_info`: a directory without a model, a hub
id that is not cached or cannot be reached) and puts the argument's place in front of every
message, so `run`, `validate --models-check` and `check` say the same thing about the same argument.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import TYPE_CHECKING, Any

from .architectures import tiny_architectures

if TYPE_CHECKING:
    from .model import ModelInfo

TINY_MODEL_NAMES = tuple(a.tiny for a in tiny_architectures() if a.tiny)
# the tiny models trained on the built-in task (workbench.models.training), each with checkpoints
TRAINED_MODEL_NAMES = ("tiny-smolvlm-trained", "tiny-qwen3vl-trained")
MODEL_EXPECTED = (f"one of {', '.join(TINY_MODEL_NAMES)}, {', '.join(TRAINED_MODEL_NAMES)} (a checkpoint: "
                  "NAME@step-N), a Hugging Face repo id 'org/name', or a local checkpoint directory")
_TRAINED_REF = re.compile(r"(?P<name>[\w.-]+?)@step-(?P<step>\d+)")
_HF_REPO_RE = re.compile(r"[\w.-]+/[\w.-]+")


def _describe(value: Any) -> str:
    text = repr(value)
    return f"got {text if len(text) <= 60 else text[:57] + '...'} ({type(value).__name__})"


def _is_dir(value: str) -> bool:
    return os.path.isdir(os.path.expanduser(value))  # isdir swallows odd paths (NUL bytes)


def _looks_like_path(value: str) -> bool:
    """Written as a path: it cannot be a hub id (those are exactly 'org/name')."""
    return value.startswith((".", "/", "~")) or value.endswith("/") or value.count("/") > 1 or "\\" in value


def parse_trained_ref(value: str) -> tuple[str, int | None] | None:
    """(name, step) of a trained model `tiny-…-trained` (step None: its last) or of one of its
    checkpoints `tiny-…-trained@step-N`; None if `value` names none."""
    if value in TRAINED_MODEL_NAMES:
        return value, None
    match = _TRAINED_REF.fullmatch(value)
    if match and match["name"] in TRAINED_MODEL_NAMES:
        return match["name"], int(match["step"])
    return None


def model_ref_problem(value: Any) -> str | None:
    """None when `value` names a model the workbench can look for; else "<what is wrong>;
    expected <what a model argument is>"."""
    if not isinstance(value, str) or not value.strip():
        return f"{_describe(value)}; expected {MODEL_EXPECTED}"
    if value in TINY_MODEL_NAMES or parse_trained_ref(value) is not None or _is_dir(value):
        return None
    path = os.path.expanduser(value)
    if os.path.exists(path):
        return f"{value!r} is a file, not a directory; expected {MODEL_EXPECTED}"
    if _looks_like_path(value):
        return f"no directory {value!r} (from {os.getcwd()}); expected {MODEL_EXPECTED}"
    if _HF_REPO_RE.fullmatch(value):
        return None
    close = difflib.get_close_matches(value, TINY_MODEL_NAMES + TRAINED_MODEL_NAMES, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown model {value!r}{hint}; expected {MODEL_EXPECTED}"


def resolve_model(value: str, where: str, infer: bool = False) -> "ModelInfo":
    """The model `value` names, its config read (no weights); a ModelError (exit 2) located at
    `where` ("command line: --models[0]", "spec.yaml:3: models[0]", "command line: MODEL").
    infer: a model of an unregistered type is read through the layout its modules follow
    (`workbench.models.infer`, for `workbench check`) instead of refused."""
    from ..errors import ModelError
    from .infer import inferred_info
    from .model import model_info

    problem = model_ref_problem(value)
    if problem is not None:
        raise ModelError(f"{where}: {problem}")
    try:
        return inferred_info(value)[0] if infer else model_info(value)
    except ModelError as err:
        raise ModelError(f"{where}: {err}", hint=err.hint) from err
