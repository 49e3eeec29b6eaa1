"""Label files and id files from strangers: strict integers, a class bound, BOMs, bad encodings, wrong shapes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stoker.errors import DataError, LabelError, StokerError
from stoker.sources import ClassFolderDataset, IdDataset, LabelFileDataset

from .conftest import write_png


def _label_set(tmp_path: Path, text: str | bytes) -> tuple[Path, Path]:
    img = tmp_path / "img"
    write_png(img / "a.png")
    write_png(img / "b.png", seed=1)
    path = tmp_path / "labels.txt"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return img, path


def test_utf8_bom_at_the_start_of_a_label_file(tmp_path: Path) -> None:
    img, labels = _label_set(tmp_path, b"\xef\xbb\xbfa.png 0\nb.png 1\n")
    assert LabelFileDataset(img, labels).index.keys.tolist() == ["a.png", "b.png"]


@pytest.mark.parametrize("label", ["1_0", "+3", "3.0", "٣", "0x1"])
def test_labels_are_strict_integers(tmp_path: Path, label: str) -> None:
    img, labels = _label_set(tmp_path, f"a.png 0\nb.png {label}\n")
    with pytest.raises(LabelError, match=r"labels\.txt:2: label .* is not an integer"):
        LabelFileDataset(img, labels)


def test_negative_label_is_a_clear_error(tmp_path: Path) -> None:
    img, labels = _label_set(tmp_path, "a.png 0\nb.png -3\n")
    with pytest.raises(LabelError, match=r"labels\.txt:2: label -3 is negative"):
        LabelFileDataset(img, labels)


@pytest.mark.parametrize("label", [10**7, 10**12, 10**20])
def test_huge_labels_are_refused_before_building_classes(tmp_path: Path, label: int) -> None:
    img, labels = _label_set(tmp_path, f"a.png 0\nb.png {label}\n")
    with pytest.raises(LabelError, match=r"labels\.txt:2: label .* larger than 9,999,999"):
        LabelFileDataset(img, labels)


def test_huge_numeric_class_folder_is_refused(tmp_path: Path) -> None:
    write_png(tmp_path / "cls" / "0" / "a.png")
    write_png(tmp_path / "cls" / "100000000000000000000" / "b.png")
    with pytest.raises(LabelError, match="larger than"):
        ClassFolderDataset(tmp_path / "cls")


def _ids(tmp_path: Path) -> Path:
    write_png(tmp_path / "data" / "a.png")
    write_png(tmp_path / "data" / "b.png", seed=1)
    return tmp_path


def test_ids_csv_with_a_bom(tmp_path: Path) -> None:
    root = _ids(tmp_path)
    (root / "ids.csv").write_bytes(b"\xef\xbb\xbfid,label,split\na,0,train\nb,1,train\n")
    assert len(IdDataset.from_csv(root / "ids.csv")) == 2


def test_ids_json_with_a_bom(tmp_path: Path) -> None:
    root = _ids(tmp_path)
    body = json.dumps({"partition": {"train": ["a", "b"]}, "labels": {"a": 0, "b": 1}})
    (root / "ids.json").write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert len(IdDataset.from_json(root / "ids.json")) == 2


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"partition": {"train": 5}, "labels": {"a": 0}}, "must be a list of ids"),
        ({"partition": {"train": [["a"], "b"]}, "labels": {"a": 0, "b": 1}}, "ids must be strings or integers"),
        ({"partition": {"train": ["a", "b"]}, "labels": {"a": [0], "b": 1}}, "is not an integer"),
        ({"partition": {"train": ["a", "b"]}, "labels": {"a": 1.5, "b": 1}}, "is not an integer"),
        ({"partition": {"train": ["a", "b"]}, "labels": {"a": "+1", "b": 1}}, "is not an integer"),
        ({"partition": {"train": ["a", "b"]}, "labels": {"a": 10**20, "b": 1}}, "larger than"),
    ],
)
def test_ids_json_of_the_wrong_shape(tmp_path: Path, body: dict[str, object], match: str) -> None:
    root = _ids(tmp_path)
    (root / "ids.json").write_text(json.dumps(body))
    with pytest.raises(LabelError, match=match):
        IdDataset.from_json(root / "ids.json")


def test_deeply_nested_json_is_a_label_error(tmp_path: Path) -> None:
    root = _ids(tmp_path)
    (root / "ids.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(LabelError):
        IdDataset.from_json(root / "ids.json")


@pytest.mark.parametrize("name", ["ids.csv", "ids.json"])
def test_latin1_id_file_is_a_label_error_naming_the_line(tmp_path: Path, name: str) -> None:
    root = _ids(tmp_path)
    text = "id,label,split\na,0,train\nb\xe9,1,train\n" if name == "ids.csv" else '{"partition": {"train": ["a"]},\n"labels": {"a": 0, "\xe9": 1}}'
    (root / name).write_bytes(text.encode("latin-1"))
    with pytest.raises(LabelError, match=rf"{name}:(3|2): .*not UTF-8"):
        (IdDataset.from_csv if name == "ids.csv" else IdDataset.from_json)(root / name)


def test_csv_with_a_nul_byte_is_a_label_error(tmp_path: Path) -> None:
    root = _ids(tmp_path)
    (root / "ids.csv").write_bytes(b"id,label,split\na,0,train\nb\x00,1,train\n")
    with pytest.raises(StokerError):
        IdDataset.from_csv(root / "ids.csv")


def test_file_name_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "cls" / "0"
    write_png(folder / "a.png")
    raw = os.fsencode(folder) + b"/b\xff.png"
    with open(raw, "wb") as f:
        f.write((folder / "a.png").read_bytes())
    with pytest.raises(DataError, match="not valid UTF-8; rename the file"):
        ClassFolderDataset(tmp_path / "cls")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_unreadable_class_folder_says_cannot_read(tmp_path: Path) -> None:
    write_png(tmp_path / "cls" / "0" / "a.png")
    write_png(tmp_path / "cls" / "1" / "b.png")
    (tmp_path / "cls" / "1").chmod(0)
    try:
        with pytest.raises(DataError, match="cannot read the folder"):
            ClassFolderDataset(tmp_path / "cls")
    finally:
        (tmp_path / "cls" / "1").chmod(0o755)


def test_unreadable_class_folder_says_cannot_read_even_as_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # root reads every folder, so the permission error is raised the way the OS would raise it
    write_png(tmp_path / "cls" / "0" / "a.png")
    write_png(tmp_path / "cls" / "1" / "b.png")
    from stoker.fs import local  # where every local folder is scanned

    real = local.os.scandir
    locked = (tmp_path / "cls" / "1").resolve()

    def scandir(path: object) -> object:
        if Path(str(path)).resolve() == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)  # type: ignore[arg-type]

    monkeypatch.setattr(local.os, "scandir", scandir)
    with pytest.raises(DataError, match=r"cls/1: cannot read the folder \(permission denied\)"):
        ClassFolderDataset(tmp_path / "cls")
