"""A small local copy of DatBench with its schema, built with `datasets` itself: nine tiny
configs of ROWS rows each, images in the modes the real ones come in. DatBench's tests and the
accuracy tests read it (the fixtures `saved_copy` and `source_rows` in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import datasets
from PIL import Image

from workbench.spec import DATBENCH_CONFIGS

ROWS = 15
MODES = ("RGB", "RGBA", "L", "P")  # the real images are not all RGB

# DatBench's features, as its hub README declares them.
FEATURES = datasets.Features(
    {
        "id": datasets.Value("string"),
        "image": datasets.Image(),
        "question": datasets.Value("string"),
        "prompt_format": {"prefix": datasets.Value("string"), "suffix": datasets.Value("string")},
        "answer": datasets.Value("string"),
        "eval_mode": datasets.Value("string"),
        "judge_prompt": datasets.Value("string"),
        "is_circular": datasets.Value("bool"),
        "source_info": {"dataset": datasets.Value("string"), "original_idx": datasets.Value("string")},
        "eval_metrics": {"discrimination": datasets.Value("float64"), "is_frontier": datasets.Value("bool")},
        "all_answers": datasets.List(datasets.Value("string")),
        "metadata": datasets.Value("string"),
    }
)


def row(config: str, i: int) -> dict:
    k = DATBENCH_CONFIGS.index(config)
    mode = MODES[i % len(MODES)]
    color = {"RGB": (10 * i, 20 * k, 50), "RGBA": (10 * i, 20 * k, 50, 128), "L": 10 * i, "P": i}[mode]
    image = Image.new(mode, (8 + i, 6 + k), color)
    if mode == "P":
        image.putpalette([(7 * c) % 256 for c in range(768)])
    image.putpixel((0, 0), 200 if mode in ("L", "P") else (200, 10 * k, i, 255)[: len(mode)])
    return {
        "id": f"{config}_{i:04d}",
        "image": image,
        "question": f"Q{i} about {config}?",
        "prompt_format": {"prefix": f"[{config}] ", "suffix": " Answer briefly."},
        "answer": f"A{i}",
        "eval_mode": "direct" if i % 2 else "judge",
        "judge_prompt": "",
        "is_circular": False,
        "source_info": {"dataset": f"src-{config}", "original_idx": str(100 + i)},
        "eval_metrics": {"discrimination": 0.1 * i, "is_frontier": i % 3 == 0},
        "all_answers": [f"A{i}", f"a{i}"],
        "metadata": "{}",
    }


def config_dataset(config: str) -> "datasets.Dataset":
    rows = [row(config, i) for i in range(ROWS)]
    return datasets.Dataset.from_list(rows, features=FEATURES)


def save_copy(root: Path) -> Path:
    """<root>/<config>: `DatasetDict({"test": ...}).save_to_disk`, the documented layout."""
    for config in DATBENCH_CONFIGS:
        datasets.DatasetDict({"test": config_dataset(config)}).save_to_disk(str(root / config))
    return root


def source_rows() -> dict[str, dict]:
    """Every row of the copy by the sample id the workbench gives it."""
    return {f"datbench/{c}/{c}_{i:04d}": row(c, i) for c in DATBENCH_CONFIGS for i in range(ROWS)}
