"""Shared test data for the training tests: small class folders made on the spot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from PIL import Image

from stoker.sources.synthetic import render


def write_class_folders(root: Path, classes: int, per_class: int, size: int, seed: int = 0) -> Path:
    """``root/<class>/<i>.png``: learnable synthetic RGB images of ``size`` x ``size``."""
    for label in range(classes):
        (root / str(label)).mkdir(parents=True)
        for i in range(per_class):
            pixels = render(label, size, size, seed=seed, index=label * per_class + i)
            Image.fromarray(pixels, "RGB").save(root / str(label) / f"{i}.png", compress_level=1)
    return root


@pytest.fixture(scope="session")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes x 40 images of 32x32: enough for a small CNN to learn in seconds."""
    return write_class_folders(tmp_path_factory.mktemp("folders"), classes=4, per_class=40, size=32)


@pytest.fixture(autouse=True)
def one_compute_thread() -> Iterator[None]:
    # The test machine has two cores shared with loader workers and other suites; torch's
    # spinning OpenMP threads are several times slower than one thread when oversubscribed.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
