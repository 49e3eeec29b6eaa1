"""16-bit PNGs: every reader gives the same uint8 pixels for the same file, the high byte, never the low one."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from stoker.data import open_data
from stoker.packer import pack
from stoker.shards import ShardDataset


def _png16_rgb(path: Path, pixels: np.ndarray) -> None:
    """A 16-bit RGB PNG written by hand (Pillow writes 16-bit grayscale only)."""
    height, width, _ = pixels.shape

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_sixteen_bit_pngs_read_the_same_everywhere(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rgb16 = rng.integers(0, 65536, size=(6, 5, 3), dtype=np.uint16)
    rgb16[0, 0] = (0x1234, 0x00FF, 0xFF00)
    gray16 = rng.integers(0, 65536, size=(6, 5), dtype=np.uint16)
    gray16[0, 0] = 0x1234
    (tmp_path / "src" / "0").mkdir(parents=True)
    (tmp_path / "src" / "1").mkdir(parents=True)
    _png16_rgb(tmp_path / "src" / "0" / "rgb.png", rgb16)
    Image.fromarray(gray16).save(tmp_path / "src" / "1" / "gray.png")  # mode I;16
    eight = {"0/rgb.png": (rgb16 >> 8).astype(np.uint8).transpose(2, 0, 1),
             "1/gray.png": np.repeat((gray16 >> 8).astype(np.uint8)[None], 3, axis=0)}
    assert eight["0/rgb.png"][:, 0, 0].tolist() == [0x12, 0x00, 0xFF]  # high bytes, not 0x34, 0xFF, 0x00

    files = open_data(tmp_path / "src", "train")
    pack(tmp_path / "src", tmp_path / "enc", store="encoded", workers=0, progress=False)
    pack(tmp_path / "src", tmp_path / "px", store="pixels", size=(6, 5), workers=0, progress=False)
    for reader in (files, ShardDataset(tmp_path / "enc"), ShardDataset(tmp_path / "px")):
        for i in range(len(reader)):
            key = reader.trace(i)["key"] if isinstance(reader, ShardDataset) else str(reader.index.keys[i])
            image, _ = reader[i]
            assert image.dtype == torch.uint8, type(reader).__name__
            assert np.array_equal(image.numpy(), eight[key]), (type(reader).__name__, key)


def test_netpbm_files_are_read_and_other_files_are_reported(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    Image.new("L", (4, 3), 200).save(tmp_path / "a" / "x.pgm")
    Image.new("RGB", (4, 3), (1, 2, 3)).save(tmp_path / "b" / "y.ppm")
    (tmp_path / "b" / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.WARNING, logger="stoker"):
        data = open_data(tmp_path, "train")
    assert len(data) == 2 and data[0][0][:, 0, 0].tolist() == [200, 200, 200]
    assert data[1][0][:, 0, 0].tolist() == [1, 2, 3]
    assert "ignored 1 file(s)" in caplog.text and "1 .txt" in caplog.text
