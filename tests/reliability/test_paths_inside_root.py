"""Paths a data description names stay inside its root: no ``../``, no absolute paths, no escaping symlinks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stoker.errors import LabelError
from stoker.sources import ClassFolderDataset, IdDataset, LabelFileDataset

from .conftest import write_png


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    return write_png(tmp_path / "secret.png", seed=9)


def _label_set(tmp_path: Path, lines: list[str]) -> tuple[Path, Path]:
    img = tmp_path / "data" / "img"
    write_png(img / "a.png")
    (tmp_path / "data" / "labels.txt").write_text("\n".join(lines) + "\n")
    return img, tmp_path / "data" / "labels.txt"


@pytest.mark.parametrize("name", ["../../secret.png", "{secret}"])
def test_label_file_naming_a_file_outside_is_a_label_error_naming_the_line(tmp_path: Path, secret: Path, name: str) -> None:
    img, labels = _label_set(tmp_path, ["a.png 0", f"{name.format(secret=secret)} 1"])
    with pytest.raises(LabelError, match=r"labels\.txt:2: .*outside the data folder"):
        LabelFileDataset(img, labels)


def test_label_file_symlink_out_of_the_folder_is_refused(tmp_path: Path, secret: Path) -> None:
    img, labels = _label_set(tmp_path, ["a.png 0", "b.png 1"])
    (img / "b.png").symlink_to(secret)
    with pytest.raises(LabelError, match=r"labels\.txt:2: 'b.png' resolves to .*outside the data folder"):
        LabelFileDataset(img, labels)


def test_symlink_inside_the_folder_is_fine(tmp_path: Path) -> None:
    img, labels = _label_set(tmp_path, ["a.png 0", "sub/b.png 1"])
    (img / "sub").mkdir()
    (img / "sub" / "b.png").symlink_to(img / "a.png")
    assert len(LabelFileDataset(img, labels)) == 2


def test_etc_passwd_in_a_label_file(tmp_path: Path) -> None:
    img, labels = _label_set(tmp_path, ["a.png 0", "/etc/passwd 1"])
    with pytest.raises(LabelError, match=r"labels\.txt:2: '/etc/passwd' points outside"):
        LabelFileDataset(img, labels)


def test_ids_that_climb_out_are_label_errors(tmp_path: Path, secret: Path) -> None:
    data = tmp_path / "set" / "data"
    write_png(data / "a.png")
    ids = tmp_path / "set" / "ids.json"
    ids.write_text(json.dumps({"partition": {"train": ["a", "../../secret"]}, "labels": {"a": 0, "../../secret": 1}}))
    with pytest.raises(LabelError, match=r"ids\.json: id '\.\./\.\./secret' .*not a plain file name"):
        IdDataset.from_json(ids)


def test_id_file_symlinked_outside_is_refused(tmp_path: Path, secret: Path) -> None:
    data = tmp_path / "set" / "data"
    write_png(data / "a.png")
    (data / "b.png").symlink_to(secret)
    ids = tmp_path / "set" / "ids.csv"
    ids.write_text("id,label,split\na,0,train\nb,1,train\n")
    with pytest.raises(LabelError, match=r"id 'b'.*outside the data folder"):
        IdDataset.from_csv(ids)


def test_class_folder_symlink_outside_is_refused(tmp_path: Path, secret: Path) -> None:
    write_png(tmp_path / "cls" / "0" / "a.png")
    (tmp_path / "cls" / "0" / "b.png").symlink_to(secret)
    with pytest.raises(LabelError, match="outside the data folder"):
        ClassFolderDataset(tmp_path / "cls")
