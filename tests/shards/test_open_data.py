"""stoker.data.open_data: the one way in to data at a path, for every command (shard sets included).

It lives with the shard tests for their small data sets (tests/shards/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from stoker.data import DataSplits, detect_layout, open_data
from stoker.errors import ConfigError, MissingFileError
from stoker.shards import ShardDataset
from stoker.sources import ClassFolderDataset


def test_detects_each_layout(digi: Path, celeb: Path, ids: Path, packed: Callable[..., Path]) -> None:
    assert detect_layout(digi) == "class_folders"
    assert detect_layout(celeb) == "label_file"
    assert detect_layout(celeb / "identity_CelebA.txt") == "label_file"
    assert detect_layout(ids) == "ids"
    assert detect_layout(ids / "ids.json") == "ids"
    assert detect_layout(packed(store="encoded", shard_samples=7)) == "shards"
    with pytest.raises(MissingFileError):
        detect_layout(digi / "nope")


def test_open_one_split(digi: Path, celeb: Path, ids: Path, packed: Callable[..., Path]) -> None:
    assert len(open_data(digi, "train")) == 40
    labelled = open_data(celeb, "train", crop=(1, 1, 4, 4))
    assert len(labelled) == 24 and labelled.index.sources[0].crop == (1, 1, 4, 4)
    assert labelled.index.sources[0].name == celeb.name
    assert len(open_data(ids, "valid")) == 5 and len(open_data(ids / "ids.json", "train")) == 15
    assert isinstance(open_data(packed(store="encoded", shard_samples=7), "train"), ShardDataset)
    with pytest.raises(ConfigError, match="no split 'valid'"):
        open_data(digi, "valid")


def test_open_sources_and_splits_lay_labels_side_by_side(digi: Path, celeb: Path, ids: Path) -> None:
    both = open_data([celeb, digi], "train")
    assert len(both) == 64 and both.num_classes == 4 + 3
    splits = open_data([ids, digi])
    assert list(splits) == ["train", "valid"]
    assert splits["train"].classes == splits["valid"].classes and splits["train"].num_classes == 2 + 3
    assert len(splits["valid"]) == 5 and len(splits["train"]) == 15 + 40


def test_same_folder_names_get_distinct_source_names(tmp_path: Path, digi: Path) -> None:
    import shutil

    for parent in ("a", "b"):
        shutil.copytree(digi, tmp_path / parent / "data")
    both = open_data([tmp_path / "a" / "data", tmp_path / "b" / "data"], "train")
    assert [s.name for s in both.index.sources] == ["data-1", "data-2"]
    assert len(both) == 2 * len(ClassFolderDataset(digi))


def test_ambiguous_label_file_asks_for_labels(celeb: Path, tmp_path: Path) -> None:
    import shutil

    copy = shutil.copytree(celeb, tmp_path / "c")
    (copy / "identity_CelebA.txt").rename(copy / "a.txt")
    (copy / "b.txt").write_text("000001.jpg 1\n")
    with pytest.raises(ConfigError, match="--labels"):
        open_data(copy)
    assert len(open_data(copy, "train", labels=copy / "b.txt")) == 1


def test_splits_keep_one_label_space_and_loader_defaults(digi: Path, packed: Callable[..., Path]) -> None:
    data = open_data(digi, valid=0.25, seed=3)
    assert isinstance(data, DataSplits) and list(data) == ["train", "valid"] and data.held_out
    assert len(data["train"]) + len(data["valid"]) == 40 and data.num_classes == 3
    assert not set(data["train"].index.keys) & set(data["valid"].index.keys)
    # A shard set without a valid split is held out the same way (same draw as the files),
    # as views that keep the set's measured loader defaults (a torch Subset would lose them).
    shards = open_data(packed(store="pixels", shard_samples=7), valid=0.25, seed=3)
    assert shards.is_shards and list(shards) == ["train", "valid"]
    for split in ("train", "valid"):
        view = shards[split]
        assert isinstance(view, ShardDataset) and view.loader_defaults == {"backend": "process", "num_workers": 0}
        assert len(view) == len(data[split])
        assert sorted(view.labels.tolist()) == sorted(data[split].labels.tolist())
    batch = shards["valid"].__getitems__([0, 1])
    assert batch.labels.tolist() == shards["valid"].labels[:2].tolist()


def test_image_size_and_separate_validation_data(digi: Path, celeb: Path, packed: Callable[..., Path]) -> None:
    data = open_data(digi, image_size=8, valid_paths=digi)
    image, _ = data["valid"][0]
    assert tuple(image.shape) == (3, 8, 8) and len(data["valid"]) == 40
    pixels = packed(store="pixels", shard_samples=7)
    on_shards = open_data(pixels, valid_paths=digi, image_size=(12, 10))  # a shard set validated by a folder
    assert isinstance(on_shards["train"], ShardDataset) and on_shards["train"].transform is None  # stored at that size
    assert len(on_shards["valid"]) == 40
    with pytest.raises(ConfigError, match="classes"):
        open_data(digi, valid_paths=celeb)


def test_split_folders_are_splits_not_classes(tmp_path: Path, digi: Path) -> None:
    import shutil

    root = tmp_path / "tree"
    shutil.copytree(digi, root / "train")
    shutil.copytree(digi / "0", root / "val" / "0")  # validation lacks class 1 and 2
    shutil.copytree(digi / "2", root / "val" / "2")
    assert detect_layout(root) == "split_folders"
    data = open_data(root)
    assert list(data) == ["train", "valid"] and data.num_classes == 3
    valid = data["valid"]
    assert set(valid.labels.tolist()) == {0, 2}  # same label mapping as train, not renumbered 0, 1
    (root / "extra").mkdir()
    (root / "extra" / "x").mkdir()
    with pytest.raises(ConfigError, match="ambiguous"):
        open_data(root)


def test_shard_sets_open_alone(digi: Path, packed: Callable[..., Path]) -> None:
    with pytest.raises(ConfigError, match="alone"):
        open_data([packed(store="encoded", shard_samples=7), digi])
    with pytest.raises(ConfigError, match="crop"):
        open_data(packed(store="encoded", shard_samples=7), crop=(0, 0, 4, 4))
    with pytest.raises(ConfigError, match="protocol"):  # URLs open through fsspec (tests/remote); unknown ones fail clearly
        open_data("nosuchproto://bucket/data")


def test_empty_classes_are_reported_and_sorted_order_removes_them(
    tmp_path: Path, digi: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import shutil

    from click.testing import CliRunner

    from stoker.cli.inspect import inspect

    for name in ("1", "2"):  # numbered from 1: label 0 has no samples
        shutil.copytree(digi / name, tmp_path / "one-based" / name)
    with caplog.at_level(logging.WARNING, logger="stoker"):
        data = open_data(tmp_path / "one-based")
    assert data.num_classes == 3 and data.empty_classes == [0]
    assert "1 of 3 classes have no samples ('0')" in caplog.text and "label_order='sorted'" in caplog.text
    result = CliRunner().invoke(inspect, [str(tmp_path / "one-based")])
    assert "1 classes have no samples" in result.output
    sorted_data = open_data(tmp_path / "one-based", label_order="sorted")
    assert sorted_data.classes == ("1", "2") and not sorted_data.empty_classes


def test_label_files_numbered_from_one_can_be_compacted(celeb: Path) -> None:
    auto = open_data(celeb)
    assert auto.num_classes == 4 and auto.empty_classes == [0]  # identities 1..3, as in CelebA
    compact = open_data(celeb, label_order="sorted")
    assert compact.classes == ("1", "2", "3") and not compact.empty_classes
    assert sorted(set(compact["train"].labels.tolist())) == [0, 1, 2]


def test_paths_open_data_finds_stay_inside_the_folder(tmp_path: Path, celeb: Path) -> None:
    """A stranger's folder whose img/ (or label file) links elsewhere is refused, not followed."""
    from stoker.errors import LabelError

    outside = tmp_path / "outside"
    shutil.copytree(celeb / "img", outside)
    data = tmp_path / "data"
    data.mkdir()
    (data / "img").symlink_to(outside, target_is_directory=True)
    shutil.copy(celeb / "identity_CelebA.txt", data / "identity_CelebA.txt")
    with pytest.raises(LabelError, match="outside the data folder"):
        open_data(data)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train").symlink_to(outside.parent / "elsewhere", target_is_directory=True)
    (outside.parent / "elsewhere" / "0").mkdir(parents=True)
    shutil.copy(next(outside.iterdir()), outside.parent / "elsewhere" / "0" / "a.jpg")
    with pytest.raises(LabelError, match="outside the data folder"):
        open_data(tree)
