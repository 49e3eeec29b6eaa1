"""Pipe.list_files and Pipe.from_iterable."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.errors import ConfigError, MissingFileError
from stoker.pipes import Pipe


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in ["b.jpg", "a.jpg", "c.png", "notes.txt", "sub/d.jpg", "sub/deeper/e.png"]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    (tmp_path / "folder.jpg").mkdir()  # a folder whose name matches is not a file
    return tmp_path


def names(pipe: Pipe[str], root: Path) -> list[str]:
    return [Path(path).relative_to(root).as_posix() for path in pipe]


def test_list_files_is_sorted_and_filtered_by_mask(folder: Path) -> None:
    assert names(Pipe.list_files(folder, masks="*.jpg"), folder) == ["a.jpg", "b.jpg"]
    assert names(Pipe.list_files(str(folder)), folder) == ["a.jpg", "b.jpg", "c.png", "notes.txt"]


def test_list_files_takes_several_masks_and_recurses(folder: Path) -> None:
    pipe = Pipe.list_files(folder, masks=["*.png", "*.jpg"], recursive=True)
    expected = ["a.jpg", "b.jpg", "c.png", "sub/d.jpg", "sub/deeper/e.png"]
    assert names(pipe, folder) == expected
    assert names(pipe, folder) == expected  # a recipe: a second iteration gives every file again, in the same order
    (folder / "sub" / "deeper" / "f.jpg").write_bytes(b"x")
    assert names(pipe, folder) == [*expected, "sub/deeper/f.jpg"]  # every iteration lists the folder again


def test_list_files_names_a_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(MissingFileError, match="nope: folder not found"):
        Pipe.list_files(missing)


def test_list_files_says_what_to_do_when_nothing_matches(folder: Path) -> None:
    with pytest.raises(MissingFileError, match=r"no files matching \['\*\.gif'\].*recursive=True"):
        Pipe.list_files(folder, masks="*.gif")
    empty = folder / "empty"
    empty.mkdir()
    with pytest.raises(MissingFileError, match="empty: no files"):
        Pipe.list_files(empty)


def test_list_files_notices_a_folder_emptied_later(folder: Path) -> None:
    pipe = Pipe.list_files(folder, masks="*.txt")
    (folder / "notes.txt").unlink()
    with pytest.raises(MissingFileError, match="no files matching"):
        list(pipe)


def test_list_files_rejects_a_file_and_bad_masks(folder: Path) -> None:
    with pytest.raises(MissingFileError, match="is a file, not a folder"):
        Pipe.list_files(folder / "a.jpg")
    with pytest.raises(ConfigError, match="masks"):
        Pipe.list_files(folder, masks=[])


def test_from_iterable_rejects_one_shot_iterators_and_non_iterables() -> None:
    with pytest.raises(ConfigError, match="one-shot iterator"):
        Pipe.from_iterable(x for x in range(3))
    with pytest.raises(ConfigError, match="expected an iterable"):
        Pipe.from_iterable(3)  # type: ignore[arg-type]


def test_from_iterable_iterates_again_each_epoch() -> None:
    pipe = Pipe.from_iterable(range(3))
    assert list(pipe) == list(pipe) == [0, 1, 2]
    assert len(pipe) == 3
