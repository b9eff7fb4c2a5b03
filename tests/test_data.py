"""Built-in samples are deterministic, prefix-stable, varied; file sources load."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from workbench.data import CATEGORIES, SIDES, Sample, builtin_samples, input_hash, load_samples
from workbench.spec import DataSpec


def fingerprint(samples: list[Sample]) -> list[tuple]:
    return [(s.id, s.question, s.answer, s.category, s.image.size, s.image.tobytes()) for s in samples]


def test_deterministic():
    assert fingerprint(builtin_samples(12, seed=5)) == fingerprint(builtin_samples(12, seed=5))


def test_seed_changes_content_and_ids():
    """Sample ids include everything that changes the input, so a store never confuses two seeds."""
    a, b = builtin_samples(8, seed=0), builtin_samples(8, seed=1)
    assert [s.id for s in a][0] == "builtin/counting/000" and b[0].id == "builtin-seed1/counting/000"
    assert not {s.id for s in a} & {s.id for s in b}
    assert [s.image.tobytes() for s in a] != [s.image.tobytes() for s in b]
    assert [input_hash(s) for s in a] != [input_hash(s) for s in b]
    assert [input_hash(s) for s in a] == [input_hash(s) for s in builtin_samples(8, seed=0)]


def test_prefix_stable():
    assert builtin_samples(4) == builtin_samples(8)[:4]
    assert fingerprint(builtin_samples(3, seed=2)) == fingerprint(builtin_samples(20, seed=2)[:3])


def test_ids_unique_and_shaped():
    samples = builtin_samples(40)
    assert len({s.id for s in samples}) == 40
    assert samples[3].id == f"builtin/{samples[3].category}/003"
    assert all(s.id.startswith("builtin/") for s in samples)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_sizes_vary_and_are_not_all_square(seed):
    sizes = [s.image.size for s in builtin_samples(16, seed)]
    assert all(w in SIDES and h in SIDES for w, h in sizes)
    assert any(w != h for w, h in sizes)
    assert len(set(sizes)) >= 3


def test_images_are_rgb_with_drawn_shapes():
    for sample in builtin_samples(8):
        assert isinstance(sample.image, Image.Image) and sample.image.mode == "RGB"
        assert len(sample.image.getcolors(maxcolors=4096)) >= 2  # background plus shapes


def test_categories_round_robin():
    samples = builtin_samples(8)
    assert [s.category for s in samples] == list(CATEGORIES) * 2
    assert {s.category for s in builtin_samples(4)} == set(CATEGORIES)


def test_questions_and_answers_fit_categories():
    for s in builtin_samples(40, seed=3):
        if s.category == "counting":
            assert s.question.startswith("How many ") and s.answer in {"1", "2", "3", "4"}
        elif s.category == "color":
            assert s.question.startswith("What color is the ") and s.answer.isalpha()
        elif s.category == "shape":
            assert s.answer in {"circle", "square", "triangle"}
        else:
            assert s.answer in {"left", "right", "above", "below"}


def test_load_samples_builtin_uses_n_and_seed():
    samples = load_samples(DataSpec(source="builtin", n=3, seed=4))
    assert fingerprint(samples) == fingerprint(builtin_samples(3, seed=4))


def test_load_samples_jsonl(tmp_path):
    Image.new("RGB", (40, 30), "red").save(tmp_path / "a.png")
    records = [
        {"id": "q1", "image": "a.png", "question": "What colour?", "category": "color", "answer": "red"},
        {"id": "q2", "image": None, "question": "Text only?"},
        {"id": "q3", "image": "a.png", "question": "Beyond n"},
    ]
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    samples = load_samples(DataSpec(source="jsonl", n=2, path=str(path)))
    assert [s.id for s in samples] == ["q1", "q2"]
    assert samples[0].image.size == (40, 30) and samples[0].answer == "red"
    assert samples[1].image is None and samples[1].category == "jsonl" and samples[1].answer is None


def test_load_samples_jsonl_reports_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "question": "q"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_samples(DataSpec(source="jsonl", n=5, path=str(path)))


def test_load_samples_folder(tmp_path):
    for name in ("b.png", "a.jpg"):
        Image.new("RGB", (20, 10), "blue").save(tmp_path / name)
    (tmp_path / "a.txt").write_text("What is this?\n")
    samples = load_samples(DataSpec(source="folder", n=5, path=str(tmp_path)))
    assert [s.id for s in samples] == ["folder/a.jpg", "folder/b.png"]
    assert [s.question for s in samples] == ["What is this?", "Describe the image."]


