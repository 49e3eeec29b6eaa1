"""Small data sets the shard tests write themselves, and a helper to compare shard sets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def _pixels(seed: int, height: int, width: int, channels: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, size=(height, width, channels), dtype=np.uint8)


def write_class_folders(root: Path, n: int, classes: int = 3, size: tuple[int, int] = (12, 10)) -> Path:
    """``root/<class>/<i>.png``: RGBA PNGs, height x width = size, labels round robin."""
    for i in range(n):
        folder = root / str(i % classes)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = _pixels(i, *size, 4)
        pixels[..., 3] = 255
        Image.fromarray(pixels, "RGBA").save(folder / f"{i:04d}.png")
    return root


def write_label_file_set(root: Path, n: int, classes: int = 3, size: tuple[int, int] = (16, 12)) -> Path:
    """``root/img/*.jpg`` + ``root/identity_CelebA.txt`` (identities 1..classes), CelebA style."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        name = f"{i + 1:06d}.jpg"
        Image.fromarray(_pixels(1000 + i, *size, 3)).save(root / "img" / name, quality=90)
        lines.append(f"{name} {i % classes + 1}")
    (root / "identity_CelebA.txt").write_text("\n".join(lines) + "\n")
    return root


def write_id_set(root: Path, n: int, classes: int = 2, size: tuple[int, int] = (8, 8)) -> Path:
    """``root/data/<id>.npy`` (uint8 CHW) + ``root/ids.json`` with train/validation partitions."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    ids = [f"id-{i:04d}" for i in range(n)]
    for i, sample_id in enumerate(ids):
        np.save(root / "data" / f"{sample_id}.npy", _pixels(2000 + i, *size, 3).transpose(2, 0, 1).copy())
    partition = {"train": ids[: n * 3 // 4], "validation": ids[n * 3 // 4 :]}
    labels = {sample_id: i % classes for i, sample_id in enumerate(ids)}
    (root / "ids.json").write_text(json.dumps({"partition": partition, "labels": labels}))
    return root


def shard_set_bytes(root: Path) -> dict[str, bytes]:
    """Every file of a folder, by name (to compare two shard sets byte for byte)."""
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


@pytest.fixture(scope="session")
def digi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 RGBA PNGs in 3 class folders (12x10)."""
    return write_class_folders(tmp_path_factory.mktemp("digi"), 40)


@pytest.fixture(scope="session")
def celeb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 JPEGs (16x12) with an identity_CelebA.txt."""
    return write_label_file_set(tmp_path_factory.mktemp("celeb"), 24)


@pytest.fixture(scope="session")
def ids(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 .npy tensors with ids.json (train 15, validation 5)."""
    return write_id_set(tmp_path_factory.mktemp("ids"), 20)


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory, digi: Path) -> Callable[..., Path]:
    """Pack ``digi`` once per distinct set of arguments (session cache); returns the folder."""
    from stoker.packer import pack

    cache: dict[str, Path] = {}

    def make(**kwargs: object) -> Path:
        key = repr(sorted(kwargs.items()))
        if key not in cache:
            out = tmp_path_factory.mktemp("packed")
            pack(digi, out, progress=False, workers=0, **kwargs)  # type: ignore[arg-type]
            cache[key] = out
        return cache[key]

    return make


@pytest.fixture()
def copy_of() -> Callable[[Path, Path], Path]:
    """Copy a shard set folder (so a test can damage its copy)."""
    import shutil

    def copy(src: Path, dst: Path) -> Path:
        shutil.copytree(src, dst)
        return dst

    return copy
