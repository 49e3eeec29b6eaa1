"""stoker.sources.detect: opening any layout from a path (used by ``stoker pack`` and others)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stoker.errors import ConfigError, MissingFileError
from stoker.shards import ShardDataset
from stoker.sources import ClassFolderDataset
from stoker.sources.detect import detect_layout, open_source, open_sources, open_splits


def test_detects_each_layout(digi: Path, celeb: Path, ids: Path, packed: Callable[..., Path]) -> None:
    assert detect_layout(digi) == "class_folders"
    assert detect_layout(celeb) == "label_file"
    assert detect_layout(celeb / "identity_CelebA.txt") == "label_file"
    assert detect_layout(ids) == "ids"
    assert detect_layout(ids / "ids.json") == "ids"
    assert detect_layout(packed(store="encoded", shard_samples=7)) == "shards"
    with pytest.raises(MissingFileError):
        detect_layout(digi / "nope")


def test_open_source(digi: Path, celeb: Path, ids: Path, packed: Callable[..., Path]) -> None:
    assert len(open_source(digi)) == 40
    labelled = open_source(celeb, crop=(1, 1, 4, 4))
    assert len(labelled) == 24 and labelled.index.sources[0].crop == (1, 1, 4, 4)
    assert labelled.index.sources[0].name == celeb.name
    assert len(open_source(ids, "valid")) == 5 and len(open_source(ids / "ids.json")) == 15
    assert isinstance(open_source(packed(store="encoded", shard_samples=7)), ShardDataset)
    with pytest.raises(ConfigError, match="no split 'valid'"):
        open_source(digi, "valid")


def test_open_sources_and_splits_lay_labels_side_by_side(digi: Path, celeb: Path, ids: Path) -> None:
    both = open_sources([celeb, digi])
    assert len(both) == 64 and both.num_classes == 4 + 3
    splits = open_splits([ids, digi])
    assert list(splits) == ["train", "valid"]
    assert splits["train"].classes == splits["valid"].classes and splits["train"].num_classes == 2 + 3
    assert len(splits["valid"]) == 5 and len(splits["train"]) == 15 + 40


def test_same_folder_names_get_distinct_source_names(tmp_path: Path, digi: Path) -> None:
    import shutil

    for parent in ("a", "b"):
        shutil.copytree(digi, tmp_path / parent / "data")
    both = open_sources([tmp_path / "a" / "data", tmp_path / "b" / "data"])
    assert [s.name for s in both.index.sources] == ["data-1", "data-2"]
    assert len(both) == 2 * len(ClassFolderDataset(digi))


def test_ambiguous_label_file_asks_for_labels(celeb: Path, tmp_path: Path) -> None:
    import shutil

    copy = shutil.copytree(celeb, tmp_path / "c")
    (copy / "identity_CelebA.txt").rename(copy / "a.txt")
    (copy / "b.txt").write_text("000001.jpg 1\n")
    with pytest.raises(ConfigError, match="--labels"):
        open_source(copy)
    assert len(open_source(copy, labels=copy / "b.txt")) == 1
