"""Symbolic links are checked on the file opened, not only when the index is built; linked class folders are never dropped."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from stoker.errors import DataError
from stoker.loading.skips import Skipped
from stoker.packer import pack
from stoker.shards import ShardDataset, verify
from stoker.sources import ClassFolderDataset

from .conftest import write_png


def _data(tmp_path: Path) -> tuple[Path, Path]:
    """``root`` with classes a, b, c (2 PNGs each) and an ``outside`` folder with a secret of the same size."""
    root = tmp_path / "root"
    for c, cls in enumerate("abc"):
        for i in range(2):
            write_png(root / cls / f"{i}.png", seed=10 * c + i)
    outside = tmp_path / "outside"
    write_png(outside / "secret.png", seed=99)
    return root, outside


def _swap_for_link(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


def _index_of(ds: ClassFolderDataset, key: str) -> int:
    return [str(k) for k in ds.index.keys].index(key)


def test_a_file_swapped_for_a_link_out_of_the_root_after_indexing_is_refused_at_read(tmp_path: Path) -> None:
    root, outside = _data(tmp_path)
    ds = ClassFolderDataset(root)
    skipping = ClassFolderDataset(root, on_error="skip")
    i = _index_of(ds, "a/0.png")
    _swap_for_link(root / "a" / "0.png", outside / "secret.png")
    with pytest.raises(DataError, match=r"a/0.png: the file opened is .*outside/secret.png, outside the data folder"):
        ds[i]
    skipped = skipping[i]
    assert isinstance(skipped, Skipped) and "outside the data folder" in skipped.reason
    assert ds[_index_of(ds, "a/1.png")][0].shape == (3, 8, 6)  # the others still read


def test_a_class_folder_swapped_for_a_link_out_of_the_root_after_indexing_is_refused(tmp_path: Path) -> None:
    root, outside = _data(tmp_path)
    ds = ClassFolderDataset(root)
    planted = tmp_path / "planted"
    shutil.copytree(root / "b", planted)
    shutil.rmtree(root / "b")
    (root / "b").symlink_to(planted, target_is_directory=True)
    with pytest.raises(DataError, match="outside the data folder"):
        ds[_index_of(ds, "b/0.png")]


def test_a_link_inside_the_root_to_a_file_inside_it_keeps_working(tmp_path: Path) -> None:
    root, _ = _data(tmp_path)
    ds = ClassFolderDataset(root)
    _swap_for_link(root / "a" / "0.png", root / "c" / "1.png")
    assert np.array_equal(ds[_index_of(ds, "a/0.png")][0], ds[_index_of(ds, "c/1.png")][0])
    assert len(ClassFolderDataset(root)) == 6  # and a fresh index takes it too


@pytest.mark.parametrize("store", ["encoded", "pixels"])
def test_a_link_swapped_in_between_indexing_and_packing_fails_the_pack_naming_the_file(tmp_path: Path, store: str) -> None:
    root, outside = _data(tmp_path)
    ds = ClassFolderDataset(root)
    secret = (outside / "secret.png").read_bytes()
    _swap_for_link(root / "c" / "1.png", outside / "secret.png")
    out = tmp_path / "shards"
    with pytest.raises(DataError, match=r"c/1.png: the file opened is .*secret.png, outside the data folder"):
        pack(ds, out, store=store, progress=False, workers=0)
    assert not (out / "manifest.json").exists()
    written = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
    assert not any(secret in p.read_bytes() for p in written)  # not a byte of it in a half-written shard


def test_a_class_folder_linked_outside_the_root_is_refused_naming_it(tmp_path: Path) -> None:
    root, _ = _data(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "d"
    write_png(elsewhere / "0.png", seed=40)
    (root / "d").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(DataError, match=r"root/d: the class folder is a symbolic link to .*elsewhere/d, outside the data"):
        ClassFolderDataset(root)


def test_a_class_folder_linked_outside_the_root_is_read_with_follow_links(tmp_path: Path) -> None:
    root, outside = _data(tmp_path)
    shutil.rmtree(root / "c")
    elsewhere = tmp_path / "elsewhere" / "c"
    for i in range(2):
        write_png(elsewhere / f"{i}.png", seed=20 + i)
    (root / "c").symlink_to(elsewhere, target_is_directory=True)
    ds = ClassFolderDataset(root, follow_links=True)
    assert (len(ds.classes), len(ds)) == (3, 6)  # the run found 2 classes and 4 samples
    assert all(ds[i][0].shape == (3, 8, 6) for i in range(len(ds)))
    # Followed, the folder is read; a link inside it to somewhere else still is not.
    _swap_for_link(elsewhere / "1.png", outside / "secret.png")
    with pytest.raises(DataError, match="outside the data folder"):
        ds[_index_of(ds, "c/1.png")]


def test_a_class_folder_linked_inside_the_root_is_a_class(tmp_path: Path) -> None:
    root, _ = _data(tmp_path)
    os.symlink(root / "a", root / "d", target_is_directory=True)
    ds = ClassFolderDataset(root)
    assert ds.classes == ("a", "b", "c", "d") and len(ds) == 8
    out = tmp_path / "shards"
    pack(ds, out, store="encoded", progress=False, workers=0)
    assert verify(out, workers=0).ok and len(ShardDataset(out)) == 8
