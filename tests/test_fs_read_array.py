"""read_inside_array: read_inside's checks, the whole file, into writable memory; the file data set reads through it."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stoker import ClassFolderDataset
from stoker.decode.image import decode_sample
from stoker.errors import DataError, MissingFileError
from stoker.fs.local import read_inside, read_inside_array


def test_it_reads_the_whole_file_into_a_writable_array(tmp_path: Path) -> None:
    root = str(tmp_path.resolve())
    for size in (0, 1, 4096, 300_001):
        path = tmp_path / f"f{size}"
        path.write_bytes(os.urandom(size))
        got = read_inside_array(str(path), str(path), (root,))
        assert got.dtype == np.uint8 and got.flags.writeable and got.tobytes() == path.read_bytes()
        assert got.tobytes() == read_inside(str(path), str(path), (root,))


def test_it_refuses_what_read_inside_refuses(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (root / "link").symlink_to(outside / "secret")
    (root / "big").write_bytes(b"x" * 11)
    os.mkfifo(root / "fifo")
    inside = (str(root.resolve()),)
    with pytest.raises(DataError, match="outside the data folder"):
        read_inside_array(str(root / "link"), "link", inside)
    with pytest.raises(DataError, match="not a regular file"):
        read_inside_array(str(root / "fifo"), "fifo", inside)
    with pytest.raises(DataError, match="larger than 10 bytes"):
        read_inside_array(str(root / "big"), "big", inside, max_bytes=10)
    with pytest.raises(MissingFileError):
        read_inside_array(str(root / "gone"), "gone", inside)


def test_the_file_data_set_decodes_the_same_pixels_as_from_its_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for label in range(2):
        (tmp_path / str(label)).mkdir()
        for i in range(3):
            pixels = rng.integers(0, 255, (20, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / str(label) / f"{i}.jpg", quality=90)
            Image.fromarray(pixels).save(tmp_path / str(label) / f"{i}.png")
    ds = ClassFolderDataset(tmp_path)
    for i in range(len(ds)):
        path = str(ds.index.paths[i])
        assert torch.equal(ds.load_image(i), decode_sample(ds.read_bytes(i), path, ds.index.crop_of(i)))
    (tmp_path / "0" / "0.jpg").unlink()
    gone = next(i for i in range(len(ds)) if str(ds.index.paths[i]).endswith(os.path.join("0", "0.jpg")))
    with pytest.raises(MissingFileError, match="moved or deleted since the index was built"):
        ds.load_image(gone)
