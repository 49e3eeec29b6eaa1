"""Only regular files are data: FIFOs and devices give a clear error instead of a hang or exhausted memory.

Each risky step runs in a subprocess with a timeout, so a regression fails the test
instead of hanging the suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stoker.errors import DataError
from stoker.sources import ClassFolderDataset, LabelFileDataset
from stoker.sources.dataset import read_file_bytes

from .conftest import run_isolated, write_png


def test_fifo_named_jpg_in_class_folders_is_an_error_not_a_hang(tmp_path: Path) -> None:
    write_png(tmp_path / "cls" / "0" / "a.png")
    os.mkfifo(tmp_path / "cls" / "0" / "b.jpg")
    done = run_isolated(
        "from stoker.sources import ClassFolderDataset\n"
        "from stoker.errors import DataError\n"
        "try:\n"
        f"    ds = ClassFolderDataset({str(tmp_path / 'cls')!r})\n"
        "    [ds[i] for i in range(len(ds))]\n"
        "except DataError as exc:\n"
        "    print('DataError:', exc)\n",
        timeout_s=60,
    )
    assert done.returncode == 0, done.stderr
    assert "b.jpg" in done.stdout and "not a regular file" in done.stdout


def test_fifo_in_a_label_file_is_an_error(tmp_path: Path) -> None:
    img = tmp_path / "img"
    write_png(img / "a.png")
    os.mkfifo(img / "b.jpg")
    (tmp_path / "labels.txt").write_text("a.png 0\nb.jpg 1\n")
    with pytest.raises(DataError, match="not a regular file"):
        LabelFileDataset(img, tmp_path / "labels.txt")


def test_symlink_to_dev_zero_is_refused(tmp_path: Path) -> None:
    write_png(tmp_path / "cls" / "0" / "a.png")
    (tmp_path / "cls" / "0" / "z.png").symlink_to("/dev/zero")
    with pytest.raises(DataError):
        ClassFolderDataset(tmp_path / "cls")


def test_reading_a_fifo_or_device_directly_never_blocks(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f.jpg")
    done = run_isolated(
        "from stoker.sources.dataset import read_file_bytes\n"
        "from stoker.errors import DataError\n"
        f"for p in ({str(tmp_path / 'f.jpg')!r}, '/dev/zero'):\n"
        "    try:\n"
        "        read_file_bytes(p)\n"
        "    except DataError as exc:\n"
        "        print('DataError:', exc)\n",
        timeout_s=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("not a regular file") == 2
    with pytest.raises(DataError):
        read_file_bytes(str(tmp_path))


def test_fifo_as_a_shard_in_verify_is_a_fault_not_a_hang(tmp_path: Path) -> None:
    from stoker.packer import pack

    write_png(tmp_path / "cls" / "0" / "a.png")
    write_png(tmp_path / "cls" / "1" / "b.png", seed=1)
    manifest = pack(tmp_path / "cls", tmp_path / "packed", workers=0, progress=False)
    shard = tmp_path / "packed" / manifest.shards[0].name
    shard.unlink()
    os.mkfifo(shard)
    done = run_isolated(
        "from stoker.shards import verify\n"
        f"report = verify({str(tmp_path / 'packed')!r}, workers=0)\n"
        "print(report.ok, report.summary())\n",
        timeout_s=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("False") and "not a regular file" in done.stdout
