"""A tiny class-folder data set, made once for the bench tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from stoker import ClassFolderDataset


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes x 10 PNGs of 16x16, in class folders (class-sorted on disk)."""
    root = tmp_path_factory.mktemp("bench-tiny")
    rng = np.random.default_rng(0)
    for label in range(4):
        (root / str(label)).mkdir()
        for j in range(10):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8), "RGB").save(root / str(label) / f"{j}.png")
    return root


@pytest.fixture()
def tiny(tiny_root: Path) -> ClassFolderDataset:
    return ClassFolderDataset(tiny_root)
