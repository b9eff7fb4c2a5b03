"""Every file the workbench reads (a spec, a JSONL file, a folder's images and text sidecars) is
refused, when it cannot be decoded, with its path, its line where it has lines, and what was
expected: exit 2, one `error:` line, no traceback, and the store it would write left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from workbench.cli import main


def snapshot(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stored(tmp_path_factory, workbench_cache) -> Path:
    """A real store (tiny-llama, one built-in sample) that every refused run below points at."""
    root = tmp_path_factory.mktemp("stored")
    spec = root / "kept.yaml"
    spec.write_text(f"name: kept\nmodels: [tiny-llama]\ndata: {{source: builtin, n: 1}}\nconditions: {{baseline: {{}}}}\n"
                    f"capture: [{{site: layer, layers: [1]}}]\nstore: {{path: {root / 'kept.zarr'}}}\n")
    assert main(["run", str(spec), "--no-progress", "--no-table"]) == 0
    return root / "kept.zarr"


@pytest.fixture
def store(stored, tmp_path):
    """A copy of the kept store; afterwards it must be byte for byte what it was."""
    import shutil

    copy = tmp_path / "copy.zarr"
    shutil.copytree(stored, copy)
    before = snapshot(copy)
    yield copy
    assert snapshot(copy) == before, "a refused run changed the store"


def refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def data_spec(tmp_path: Path, data: str) -> Path:
    spec = tmp_path / "own.yaml"
    spec.write_text(f"name: own\nmodels: [tiny-llama]\ndata: {data}\nconditions: {{baseline: {{}}}}\n"
                    f"capture: [{{site: layer, layers: [1]}}]\nstore: {{path: {tmp_path / 'new.zarr'}}}\n")
    return spec


def png(path: Path) -> Path:
    Image.new("RGB", (32, 32), "red").save(path)
    return path


# (what the folder holds: name -> bytes, or None for a valid PNG; the phrase naming the fault)
FOLDERS = {
    "a sidecar in Latin-1": ({"a.png": None, "a.txt": "Quelle est la couleur?\nCaf\xe9 au lait".encode("latin-1")},
                             "{dir}/a.txt:2: cannot be decoded as UTF-8 (byte 0xe9 at column 4: invalid continuation "
                             "byte); expected a UTF-8 text file holding the question"),
    "a sidecar in UTF-16": ({"a.png": None, "a.txt": "What?".encode("utf-16")},
                            "{dir}/a.txt:1: cannot be decoded as UTF-8 (it starts with a UTF-16 byte-order mark)"),
    "a truncated image": ({"a.png": "truncate"}, "{dir}/a.png: image '{dir}/a.png' cannot be decoded (OSError"),
    "an image that is text": ({"b.jpg": b"not a jpeg"}, "{dir}/b.jpg: image '{dir}/b.jpg' cannot be decoded "
                              "(UnidentifiedImageError"),
}


@pytest.mark.parametrize("case", list(FOLDERS))
def test_undecodable_folder_files(tmp_path, capsys, store, case):
    files, phrase = FOLDERS[case]
    folder = tmp_path / "images"
    folder.mkdir()
    for name, content in files.items():
        if content is None:
            png(folder / name)
        elif content == "truncate":
            whole = png(folder / name).read_bytes()
            (folder / name).write_bytes(whole[: len(whole) // 2])
        else:
            (folder / name).write_bytes(content)
    spec = data_spec(tmp_path, f"{{source: folder, path: {folder}, n: 4}}")
    err = refused(["run", str(spec), "--store", str(store), "--no-progress"], capsys)
    assert phrase.format(dir=folder) in err


def test_the_issue_s_sidecar_into_a_new_store_writes_nothing(tmp_path, capsys):
    folder = tmp_path / "images"
    folder.mkdir()
    png(folder / "a.png")
    (folder / "a.txt").write_bytes(b"\xff\xfe\x00broken")
    spec = data_spec(tmp_path, f"{{source: folder, path: {folder}, n: 4}}")
    err = refused(["run", str(spec), "--no-progress"], capsys)
    assert f"{folder}/a.txt:1: cannot be decoded as UTF-8" in err
    assert not (tmp_path / "new.zarr").exists()


JSONL = {
    "a Latin-1 line": ([b'{"id": "a", "question": "q?"}', b'{"id": "b", "question": "caf\xe9?"}'],
                       "samples.jsonl:2: cannot be decoded as UTF-8 (byte 0xe9 at column 29: invalid continuation "
                       "byte); expected a UTF-8 JSONL file (one JSON object per line)"),
    "a NUL-padded (UTF-16) file": (['{"id": "a", "question": "q?"}'.encode("utf-16")],
                                   "samples.jsonl:1: cannot be decoded as UTF-8 (it starts with a UTF-16 byte-order mark)"),
    "a binary file": ([b'{"id": "a", "question": "q?"}', bytes(range(128, 256))],
                      "samples.jsonl:2: cannot be decoded as UTF-8 (byte 0x80 at column 1: invalid start byte)"),
}


@pytest.mark.parametrize("case", list(JSONL))
def test_undecodable_jsonl_lines(tmp_path, capsys, store, case):
    lines, phrase = JSONL[case]
    data = tmp_path / "samples.jsonl"
    data.write_bytes(b"".join(line + b"\n" for line in lines))
    spec = data_spec(tmp_path, f"{{source: jsonl, path: {data}, n: 4}}")
    err = refused(["run", str(spec), "--store", str(store), "--no-progress"], capsys)
    assert f"{tmp_path}/{phrase}" in err


def test_a_byte_order_mark_is_not_an_error(tmp_path):
    from workbench.data import jsonl_samples

    data = tmp_path / "samples.jsonl"
    data.write_bytes(b'\xef\xbb\xbf{"id": "a", "question": "q?"}\n{"id": "b", "question": "r?"}\n')
    assert [s.id for s in jsonl_samples(data, 5)] == ["a", "b"]


SPECS = {
    "Latin-1": (b"name: caf\xe9\nmodels: [tiny-llama]\n", "{spec}:1: (document): cannot be decoded as UTF-8 (byte 0xe9 "
                "at column 10: invalid continuation byte); expected a UTF-8 YAML file"),
    "UTF-16": ("name: a\nmodels: [tiny-llama]\n".encode("utf-16"),
               "{spec}:1: (document): cannot be decoded as UTF-8 (it starts with a UTF-16 byte-order mark)"),
    "a NUL byte": (b"name: a\nmodels: [tiny-llama]\ncapture: [{site: la\x00yer}]\n",
                   "{spec}:3: (document): unacceptable character #x0000 at column 20 (a control character); "
                   "expected printable text"),
}


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", list(SPECS))
def test_undecodable_specs(tmp_path, capsys, monkeypatch, case, command):
    content, phrase = SPECS[case]
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "bad.yaml"
    spec.write_bytes(content)
    err = refused([command, str(spec)], capsys)
    assert phrase.format(spec=spec) in err
    assert [p.name for p in tmp_path.iterdir()] == ["bad.yaml"]


def test_a_spec_with_a_byte_order_mark_is_read(tmp_path, capsys):
    spec = tmp_path / "bom.yaml"
    spec.write_bytes(b"\xef\xbb\xbf" + f"name: bom\nmodels: [tiny-llama]\nconditions: {{baseline: {{}}}}\n"
                     f"capture: [{{site: layer}}]\nstore: {{path: {tmp_path / 's.zarr'}}}\n".encode())
    assert main(["validate", str(spec)]) == 0
