"""A pixel pack that resizes images says so once: to which size, how many, and how to choose (--size)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stoker import pack


def _mixed(root: Path) -> Path:
    """6 PNGs of 12x10 (the first listed) and 4 of 16x16, in two class folders."""
    rng = np.random.default_rng(0)
    for i in range(10):
        h, w = (12, 10) if i < 6 else (16, 16)
        folder = root / str(i % 2)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"{i:02d}.png")
    return root


def _notes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "resized" in r.getMessage()]


def test_a_pack_to_the_first_images_size_says_how_many_were_resized_and_how_to_choose(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _mixed(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        manifest = pack(data, tmp_path / "out", store="pixels", shard_samples=4, workers=0, progress=False)
    assert manifest.image_size == (12, 10)  # 0/00.png, the first listed
    assert _notes(caplog) == [
        "pack: resized 4 of 10 images to 12x10 (the first image's size): their sizes differ; "
        "choose another with --size HEIGHTxWIDTH (size=(height, width))"
    ]


def test_a_pack_to_a_given_size_says_so_and_one_of_equal_sizes_says_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = _mixed(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        pack(data, tmp_path / "out", store="pixels", size=(16, 16), workers=2, shard_samples=4, progress=False)
    assert _notes(caplog) == ["pack: resized 6 of 10 images to 16x16 (the size given): their sizes differ; "
                              "--size HEIGHTxWIDTH (size=) chose it"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        pack(tmp_path / "out", tmp_path / "again", store="pixels", workers=0, progress=False)
    assert _notes(caplog) == []


def test_the_cli_prints_the_note_once_on_stderr(tmp_path: Path) -> None:
    data = _mixed(tmp_path / "data")
    result = subprocess.run([sys.executable, "-m", "stoker", "pack", str(data), str(tmp_path / "out"), "--store", "pixels",
                             "--workers", "0"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("resized 4 of 10 images to 12x10") == 1 and "--size" in result.stderr
