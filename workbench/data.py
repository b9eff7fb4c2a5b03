"""Samples to run a spec on: the offline built-in set, DatBench, a JSONL file, or an image folder.

The built-in set is drawn with PIL from a per-sample seed, so it needs no downloads, is
pixel-identical across runs, and sample ``i`` never depends on how many samples were asked
for (``builtin_samples(4) == builtin_samples(8)[:4]``), which lets ``--limit`` runs resume.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, NoReturn

from PIL import Image, ImageDraw

from .definitions import check_eval_mode
from .errors import DataError
from .spec import DATBENCH_CONFIGS
from .spec.problems import undecodable_at

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Sample",
    "builtin_samples",
    "datbench_samples",
    "jsonl_samples",
    "folder_samples",
    "load_samples",
    "iter_samples",
    "DatBenchError",
    "SampleFileError",
    "CATEGORIES",
    "DATBENCH_REPO",
]


@dataclass(frozen=True)
class Sample:
    id: str  # stable unique id, e.g. "builtin/counting/003"
    image: Image.Image | None
    question: str  # the full prompt text to put after the image
    category: str  # e.g. "counting"
    answer: str | None = None
    # how `answer` is scored against generated text (workbench.definitions.EVAL_MODES), or None
    eval_mode: str | None = None
    # every accepted answer (DatBench's `all_answers`); a response matching any of them is right
    all_answers: tuple[str, ...] = ()


def input_hash(sample: Sample) -> str:
    """A digest of everything a sample feeds the model (question, image pixels, size, mode): the
    store keeps it per sample, and a resume refuses a sample whose input changed under its id."""
    import hashlib

    h = hashlib.sha256(sample.question.encode("utf-8"))
    if sample.image is not None:
        h.update(f"|{sample.image.mode}|{sample.image.size}|".encode())
        h.update(sample.image.tobytes())
    return h.hexdigest()[:32]


# --------------------------------------------------------------------------- built-in set

CATEGORIES = ("counting", "color", "shape", "spatial")
SHAPES = ("circle", "square", "triangle")
COLORS = {
    "red": (220, 40, 40),
    "green": (40, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (230, 190, 20),
    "purple": (140, 60, 180),
    "orange": (240, 130, 30),
}
# Mixed, mostly non-square sizes: the tiny SmolVLM tiles images, so shape matters.
SIDES = (64, 96, 128)
RELATIONS = ("left", "right", "above", "below")


@dataclass(frozen=True)
class _Shape:
    kind: str
    color: str


@dataclass(frozen=True)
class SceneObject:
    """One shape as drawn: its kind and colour, the pixel box PIL filled (inclusive corners) and
    its grid cell."""

    kind: str
    color: str
    box: tuple[int, int, int, int]
    cell: tuple[int, int]  # (col, row)


def _paint(pen: ImageDraw.ImageDraw, kind: str, box: tuple[int, int, int, int], fill: Any) -> None:
    x0, y0, x1, y1 = box
    if kind == "circle":
        pen.ellipse(box, fill=fill)
    elif kind == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(x0 + (x1 - x0 + 1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)


class _Canvas:
    """A white-ish image divided into a grid of cells, one shape per cell."""

    def __init__(self, rng: random.Random):
        self.width, self.height = rng.choice(SIDES), rng.choice(SIDES)
        self.cell = min(self.width, self.height) // 3
        self.cols, self.rows = self.width // self.cell, self.height // self.cell
        background = tuple(rng.randint(235, 255) for _ in range(3))
        self.image = Image.new("RGB", (self.width, self.height), background)
        self.rng = rng
        self.objects: list[SceneObject] = []

    def free_cells(self, count: int) -> list[tuple[int, int]]:
        cells = [(col, row) for row in range(self.rows) for col in range(self.cols)]
        return self.rng.sample(cells, count)

    def draw(self, shape: _Shape, col: int, row: int) -> None:
        size = int(self.cell * self.rng.uniform(0.55, 0.75))
        slack = self.cell - size
        x0 = col * self.cell + self.rng.randint(0, slack)
        y0 = row * self.cell + self.rng.randint(0, slack)
        box = (x0, y0, x0 + size - 1, y0 + size - 1)
        _paint(ImageDraw.Draw(self.image), shape.kind, box, COLORS[shape.color])
        self.objects.append(SceneObject(shape.kind, shape.color, box, (col, row)))


def object_mask(size: tuple[int, int], objects: Iterable[SceneObject]) -> np.ndarray:
    """A (height, width) uint8 array: 1 + the index of the object drawn at each pixel, 0 on the
    background; the same PIL calls as the image, so it covers exactly the shapes' pixels."""
    import numpy as np

    mask = Image.new("L", size, 0)
    pen = ImageDraw.Draw(mask)
    for index, obj in enumerate(objects, 1):
        _paint(pen, obj.kind, obj.box, index)
    return np.asarray(mask)


def _random_shape(rng: random.Random) -> _Shape:
    return _Shape(rng.choice(SHAPES), rng.choice(sorted(COLORS)))


def _different_shape(rng: random.Random, target: _Shape, *, kind: bool, color: bool) -> _Shape:
    """A shape that differs from target in kind and/or colour, as asked."""
    kinds = [k for k in SHAPES if k != target.kind] if kind else [target.kind]
    colors = [c for c in sorted(COLORS) if c != target.color] if color else [target.color]
    return _Shape(rng.choice(kinds), rng.choice(colors))


def _counting(canvas: _Canvas) -> tuple[str, str]:
    rng = canvas.rng
    target = _random_shape(rng)
    count = rng.randint(1, 4)
    # Distractors share the kind or the colour, so counting needs both attributes.
    distractors = []
    for _ in range(rng.randint(0, 2)):
        other_kind = rng.random() < 0.5
        distractors.append(_different_shape(rng, target, kind=other_kind, color=not other_kind))
    shapes = [target] * count + distractors
    for shape, (col, row) in zip(shapes, canvas.free_cells(len(shapes))):
        canvas.draw(shape, col, row)
    question = f"How many {target.color} {target.kind}s are in the image? Answer with a number."
    return question, str(count)


def _color(canvas: _Canvas) -> tuple[str, str]:
    rng = canvas.rng
    target = _random_shape(rng)
    distractor = _different_shape(rng, target, kind=True, color=True)
    for shape, (col, row) in zip((target, distractor), canvas.free_cells(2)):
        canvas.draw(shape, col, row)
    return f"What color is the {target.kind}? Answer with one word.", target.color


def _shape(canvas: _Canvas) -> tuple[str, str]:
    rng = canvas.rng
    target = _random_shape(rng)
    distractor = _different_shape(rng, target, kind=True, color=True)
    for shape, (col, row) in zip((target, distractor), canvas.free_cells(2)):
        canvas.draw(shape, col, row)
    question = f"What shape is the {target.color} object? Answer with circle, square, or triangle."
    return question, target.kind


def _spatial(canvas: _Canvas) -> tuple[str, str]:
    rng = canvas.rng
    first = _random_shape(rng)
    second = _different_shape(rng, first, kind=rng.random() < 0.5, color=True)
    relation = rng.choice(RELATIONS)
    # Put the pair in one row (left/right) or one column (above/below), so the relation is clear.
    if relation in ("left", "right"):
        row, (a, b) = rng.randrange(canvas.rows), sorted(rng.sample(range(canvas.cols), 2))
        first_at, second_at = ((a, row), (b, row)) if relation == "left" else ((b, row), (a, row))
    else:
        col, (a, b) = rng.randrange(canvas.cols), sorted(rng.sample(range(canvas.rows), 2))
        first_at, second_at = ((col, a), (col, b)) if relation == "above" else ((col, b), (col, a))
    canvas.draw(first, *first_at)
    canvas.draw(second, *second_at)
    question = (
        f"Is the {first.color} {first.kind} to the left of, to the right of, above, or below "
        f"the {second.color} {second.kind}? Answer with left, right, above, or below."
    )
    return question, relation


_MAKERS: dict[str, Callable[[_Canvas], tuple[str, str]]] = {
    "counting": _counting,
    "color": _color,
    "shape": _shape,
    "spatial": _spatial,
}
# how each category's answer is scored: a count is a number, the others one word
BUILTIN_EVAL_MODES = {"counting": "numeric", "color": "exact", "shape": "exact", "spatial": "exact"}


def _builtin_sample(index: int, seed: int) -> Sample:
    return builtin_scene(index, seed)[0]


def builtin_scene(index: int, seed: int = 0) -> tuple[Sample, list[SceneObject]]:
    """Built-in sample `index` of `seed` and the objects drawn in its image, in drawing order (the
    trained tiny models' tower stage learns from them; `object_mask` rasterizes them)."""
    # A string seed per sample: deterministic across runs and independent of n.
    rng = random.Random(f"workbench.builtin/{seed}/{index}")
    category = CATEGORIES[index % len(CATEGORIES)]  # round robin: small n spans categories
    canvas = _Canvas(rng)
    question, answer = _MAKERS[category](canvas)
    # the seed changes the drawing, so it is part of the id (seed 0 keeps the short form)
    prefix = "builtin" if seed == 0 else f"builtin-seed{seed}"
    sample = Sample(f"{prefix}/{category}/{index:03d}", canvas.image, question, category, answer,
                    BUILTIN_EVAL_MODES[category])
    return sample, canvas.objects


def builtin_samples(n: int, seed: int = 0) -> list[Sample]:
    """The first ``n`` built-in samples for ``seed`` (a prefix of any longer request)."""
    return list(iter_builtin_samples(n, seed))


def iter_builtin_samples(n: int, seed: int = 0) -> Iterator[Sample]:
    """`builtin_samples`, each drawn when it is asked for."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return (_builtin_sample(i, seed) for i in range(n))


# --------------------------------------------------------------------------- files

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")
FOLDER_QUESTION = "Describe the image."


class SampleFileError(DataError, ValueError):
    """A sample file (a JSONL record, an image) cannot be read; the message names the file and line."""


def _open_rgb(path: Path, where: str) -> Image.Image:
    """The image at `path` as RGB; `where` locates the reference (file:line) in messages."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")  # convert() loads pixels, so the file can close
    except FileNotFoundError:
        raise SampleFileError(f"{where}: image {str(path)!r} does not exist; expected an image file "
                              "(a path relative to the JSONL file)") from None
    except Image.DecompressionBombError as exc:
        raise SampleFileError(f"{where}: image {str(path)!r} is too large to open safely ({exc}); expected at most "
                              f"{Image.MAX_IMAGE_PIXELS} pixels", hint="downscale the image") from None
    except (Image.UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise SampleFileError(f"{where}: image {str(path)!r} cannot be decoded ({type(exc).__name__}: {exc}); "
                              "expected a readable PNG, JPEG, WebP, BMP or GIF file") from None


def jsonl_samples(path: str | Path, n: int) -> list[Sample]:
    """First ``n`` records of a JSONL file: {"id", "image" (relative to the file) or null,
    "question", "category"?, "answer"?, "eval_mode"?} (eval_mode: one of
    workbench.definitions.EVAL_MODES)."""
    return list(iter_jsonl_samples(path, n))


def iter_jsonl_samples(path: str | Path, n: int) -> Iterator[Sample]:
    """`jsonl_samples`, each record read when it is asked for. Each line is decoded on its own,
    so a byte that is not UTF-8 is reported with its line (a leading BOM is allowed)."""
    path = Path(path)
    if not path.is_file():
        what = "a folder" if path.is_dir() else "missing"
        raise SampleFileError(f"data.path: {str(path)!r} is {what}; expected a JSONL file (one JSON object per line)")
    seen: set[str] = set()
    count = 0
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if count >= n:
                break
            line = decoded_text(raw, path, "a UTF-8 JSONL file (one JSON object per line)", number)
            if not line.strip():
                continue
            sample = _jsonl_record(path, number, line)
            if sample.id in seen:
                raise SampleFileError(f"{path}:{number}: duplicate sample id {sample.id!r}; expected unique ids")
            seen.add(sample.id)
            count += 1
            yield sample


def decoded_text(raw: bytes, path: Path, expected: str, line: int | None = None) -> str:
    """`raw` (the whole file, or its line `line`) as UTF-8 text (a leading BOM dropped), or a
    SampleFileError naming the file, the line and column of the first byte that is not UTF-8."""
    try:
        return raw.decode("utf-8-sig" if line in (None, 1) else "utf-8")
    except UnicodeDecodeError as exc:
        at, _, what = undecodable_at(raw, exc)
        raise SampleFileError(f"{path}:{(line or 1) + at - 1}: cannot be decoded as UTF-8 ({what}); "
                              f"expected {expected}") from None


def _jsonl_record(path: Path, number: int, line: str) -> Sample:
    where = f"{path}:{number}"
    try:
        record: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise SampleFileError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno}); expected one JSON object "
                              'per line, e.g. {"id": "a", "image": "a.png", "question": "..."}') from None
    if not isinstance(record, dict):
        raise SampleFileError(f"{where}: got a JSON {type(record).__name__}; expected a JSON object")
    for key in ("id", "question"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise SampleFileError(f"{where}: {key}: got {record.get(key)!r}; expected a non-empty string")
    image = record.get("image")
    if image is not None and not isinstance(image, str):
        raise SampleFileError(f"{where}: image: got {image!r}; expected a path or null")
    answer = record.get("answer")
    try:
        eval_mode = check_eval_mode(record.get("eval_mode"), f"{where}: eval_mode")
    except ValueError as exc:
        raise SampleFileError(str(exc)) from None
    return Sample(
        id=record["id"],
        image=_open_rgb(path.parent / image, where) if image else None,
        question=record["question"],
        category=str(record.get("category") or "jsonl"),
        answer=None if answer is None else str(answer),
        eval_mode=eval_mode,
    )


def folder_samples(path: str | Path, n: int) -> list[Sample]:
    """First ``n`` images of a folder, by name; a ``<stem>.txt`` beside an image holds its
    question (default: "Describe the image.")."""
    return list(iter_folder_samples(path, n))


def iter_folder_samples(path: str | Path, n: int) -> Iterator[Sample]:
    """`folder_samples`, each image read when it is asked for (the names are listed first)."""
    folder = Path(path)
    if not folder.is_dir():
        raise SampleFileError(f"data.path: {str(folder)!r} is {'a file' if folder.exists() else 'missing'}; "
                              "expected a folder of images")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    for file in files[:n]:
        sidecar = file.with_suffix(".txt")
        question = _sidecar_question(sidecar) if sidecar.is_file() else FOLDER_QUESTION
        yield Sample(f"folder/{file.name}", _open_rgb(file, str(file)), question or FOLDER_QUESTION, "folder")


def _sidecar_question(sidecar: Path) -> str:
    try:
        raw = sidecar.read_bytes()
    except OSError as exc:
        raise SampleFileError(f"{sidecar}: cannot be read ({exc.strerror or exc}); expected a readable text file "
                              "holding the question for the image beside it") from None
    return decoded_text(raw, sidecar, "a UTF-8 text file holding the question for the image beside it").strip()


# --------------------------------------------------------------------------- DatBench

DATBENCH_REPO = "DatologyAI/DatBench"
DATBENCH_SPLIT = "test"
_DATBENCH_COLUMNS = ("id", "image", "question", "prompt_format", "answer")
_DATBENCH_LAYOUT = (
    "a folder with one `save_to_disk` dataset per config (<path>/chart, <path>/counting, ...), "
    f"or a download of the hub repo {DATBENCH_REPO}"
)


class DatBenchError(DataError, ValueError):
    """DatBench could not be loaded (offline, a wrong ``data.path``, a foreign schema)."""


def datbench_samples(
    n_per_config: int,
    seed: int = 0,
    exclude: Iterable[str] = (),
    path: str | Path | None = None,
    order: str = "shuffled",
) -> list[Sample]:
    """``n_per_config`` DatBench samples from each config not in ``exclude``.

    Rows come from ``datasets.load_dataset(path or "DatologyAI/DatBench", config,
    split="test")``; with ``path=None`` that is the hub (or the local ``datasets`` cache
    when ``HF_DATASETS_OFFLINE=1``).  A local copy (``path``) is a folder holding either

    * one ``datasets`` ``save_to_disk`` directory per config, named after it, read with
      ``datasets.load_from_disk``: ``<path>/<config>`` is a ``DatasetDict`` with a ``test``
      split (``DatasetDict({"test": ds}).save_to_disk(f"{path}/{config}")``) or a bare
      ``Dataset`` (``ds.save_to_disk(...)``); configs missing there are an error unless
      excluded.  Or
    * anything else ``load_dataset(path, config, split="test")`` understands, e.g. a download
      of the hub repo (``hf download DatologyAI/DatBench --repo-type dataset --local-dir
      <path>``: parquet files plus the README that names the configs).

    Choice: row positions ``numpy.random.default_rng([seed, crc32(config)]).permutation(rows)``,
    first ``n_per_config`` (all rows when a config has fewer), so the choice is deterministic,
    differs per config and per seed, and a smaller ``n_per_config`` gives a prefix of a larger
    one.  ``order="first"`` takes the first ``n_per_config`` rows instead (what the norm-gap
    study did).  Only the chosen rows are read (``ds.select``), so only their images are decoded.

    Order: configs in :data:`workbench.spec.DATBENCH_CONFIGS` order, each config's samples in
    chosen order.  ``Sample.id`` is ``datbench/<config>/<row id>``, ``question`` is
    ``prompt_format.prefix + question + prompt_format.suffix``, ``category`` the config,
    ``answer`` the row's ``answer``, ``eval_mode`` its ``eval_mode`` (``direct`` or ``judge``;
    None where the copy has no such column), ``all_answers`` its ``all_answers`` (every accepted
    answer; empty where there is none); the image is converted to RGB.

    Raises :class:`DatBenchError` (a ``ValueError``) when a config cannot be loaded.
    """
    if isinstance(n_per_config, bool) or not isinstance(n_per_config, int) or n_per_config < 0:
        raise ValueError(f"n_per_config must be an int >= 0, got {n_per_config!r}")
    excluded = {exclude} if isinstance(exclude, str) else set(exclude)
    unknown = sorted(excluded - set(DATBENCH_CONFIGS))
    if unknown:
        raise ValueError(f"unknown DatBench config(s) {unknown} in exclude; expected some of {list(DATBENCH_CONFIGS)}")
    return list(_iter_datbench(n_per_config, seed, excluded, path, order))


def _iter_datbench(n_per_config: int, seed: int, excluded: set[str], path: str | Path | None,
                   order: str) -> Iterator[Sample]:
    for config in DATBENCH_CONFIGS:
        if config not in excluded:
            yield from _datbench_config_samples(_load_datbench_config(config, path), config, n_per_config, seed,
                                                path, order)


def _datbench_fail(config: str, path: str | Path | None, reason: str) -> NoReturn:
    where = DATBENCH_REPO if path is None else str(path)
    hint = "set data.path to a local copy" if path is None else "check data.path"
    raise DatBenchError(
        f"data.source datbench: cannot load config {config!r} from {where!r} ({reason}); "
        f"{hint}: {_DATBENCH_LAYOUT}",
        hint="offline, --data builtin runs the spec on the built-in samples",
    )


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or "no message"
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}"


def _datasets_offline() -> bool:
    import os

    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def _load_datbench_config(config: str, path: str | Path | None) -> Any:
    try:
        import datasets
    except ImportError as exc:
        _datbench_fail(config, path, f"{_short(exc)}; install the 'models' extra")
    if path is not None and not Path(path).is_dir():
        # Checked here so a missing local folder is never mistaken for a hub repo id.
        _datbench_fail(config, path, "no such folder")
    if path is None and not _datasets_offline():
        from .hub import hub_endpoint, hub_reachable

        if not hub_reachable():  # else datasets retries for half a minute per config
            raise DatBenchError(
                f"data.source datbench: cannot load config {config!r} from {DATBENCH_REPO!r}: the Hugging Face hub "
                f"({hub_endpoint()}) is unreachable; set data.path to a local copy: {_DATBENCH_LAYOUT}",
                hint="offline, --data builtin runs the spec on the built-in samples; if DatBench is in your "
                "datasets cache, set HF_DATASETS_OFFLINE=1 to read it from there")
    saved = None if path is None else Path(path) / config
    try:
        if saved is not None and ((saved / "dataset_dict.json").is_file() or (saved / "state.json").is_file()):
            ds = datasets.load_from_disk(str(saved))
            if isinstance(ds, datasets.DatasetDict):
                if DATBENCH_SPLIT not in ds:
                    _datbench_fail(config, path, f"{saved} has splits {sorted(ds)}, no {DATBENCH_SPLIT!r}")
                ds = ds[DATBENCH_SPLIT]
        else:
            ds = datasets.load_dataset(str(path) if path is not None else DATBENCH_REPO, config, split=DATBENCH_SPLIT)
    except DatBenchError:
        raise
    except Exception as exc:  # offline, missing config, corrupt files: all reported the same way
        _datbench_fail(config, path, _short(exc))
    if not isinstance(ds, datasets.Dataset):
        _datbench_fail(config, path, f"got a {type(ds).__name__}, expected a Dataset")
    missing = [c for c in _DATBENCH_COLUMNS if c not in ds.column_names]
    if missing:
        _datbench_fail(config, path, f"no column(s) {missing}; has {ds.column_names}")
    return ds


def _datbench_config_samples(ds: Any, config: str, n: int, seed: int, path: str | Path | None,
                             order: str = "shuffled") -> Iterator[Sample]:
    import numpy as np

    if order == "first":  # the study's choice: the first n rows of each config
        chosen = list(range(min(n, len(ds))))
    else:
        rng = np.random.default_rng([seed, zlib.crc32(config.encode("utf-8"))])
        chosen = [int(i) for i in rng.permutation(len(ds))[:n]]
    seen: set[str] = set()
    for position, row in zip(chosen, ds.select(chosen)):
        row_id = row["id"]
        if row_id is None or str(row_id) == "":
            _datbench_fail(config, path, f"row {position} has no id")
        sample_id = f"datbench/{config}/{row_id}"
        if sample_id in seen:
            _datbench_fail(config, path, f"duplicate row id {row_id!r}")
        seen.add(sample_id)
        fmt = row["prompt_format"] or {}
        image = row["image"]
        answer = row["answer"]
        try:
            eval_mode = check_eval_mode(row.get("eval_mode"), f"row {position} ({row_id!r}) eval_mode")
        except ValueError as exc:
            _datbench_fail(config, path, str(exc))
        yield Sample(
            id=sample_id,
            image=None if image is None else image.convert("RGB"),
            question=(fmt.get("prefix") or "") + row["question"] + (fmt.get("suffix") or ""),
            category=config,
            answer=None if answer is None else str(answer),
            eval_mode=eval_mode,
            all_answers=tuple(str(a) for a in (row.get("all_answers") or ()) if a is not None),
        )


def load_samples(data_spec: Any) -> list[Sample]:
    """Samples for a spec's ``data`` section (a :class:`workbench.spec.DataSpec`).

    File sources keep file order (``seed`` is unused there) so limited runs are prefixes.
    For ``datbench``, ``n`` is per config and ``path`` (optional) is a local copy; see
    :func:`datbench_samples`.
    """
    return list(iter_samples(data_spec))


def iter_samples(data_spec: Any) -> Iterator[Sample]:
    """`load_samples`, one sample at a time: each is read or drawn when it is asked for, so a
    large source is never held at once (the runner reads it this way)."""
    source = data_spec.source
    if source == "builtin":
        return iter_builtin_samples(data_spec.n, data_spec.seed)
    if source == "jsonl":
        return iter_jsonl_samples(data_spec.path, data_spec.n)
    if source == "folder":
        return iter_folder_samples(data_spec.path, data_spec.n)
    if source == "datbench":
        if isinstance(data_spec.n, bool) or not isinstance(data_spec.n, int) or data_spec.n < 0:
            raise ValueError(f"n_per_config must be an int >= 0, got {data_spec.n!r}")
        return _iter_datbench(data_spec.n, data_spec.seed, set(data_spec.exclude), data_spec.path, data_spec.order)
    raise ValueError(f"unknown data source {source!r}; expected builtin, datbench, jsonl or folder")
