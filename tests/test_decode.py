"""decode: every image format to uint8 RGB CHW, and damaged bytes only ever raise DecodeError."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from stoker.decode.image import decode_image, decode_sample, to_rgb
from stoker.errors import DecodeError


def _encoded(fmt: str, mode: str = "RGB") -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, size=(24, 16, 4), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGBA").convert(mode).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize(("fmt", "mode"), [("PNG", "RGBA"), ("PNG", "L"), ("PNG", "P"), ("JPEG", "RGB"),
                                           ("JPEG", "L"), ("BMP", "RGB"), ("TIFF", "RGB"), ("WEBP", "RGB")])
def test_every_format_becomes_uint8_rgb_chw(fmt: str, mode: str) -> None:
    image = decode_image(_encoded(fmt, mode), f"x.{fmt.lower()}")
    assert image.dtype == torch.uint8 and image.shape == (3, 24, 16)


def test_lossless_png_pixels_are_exact() -> None:
    pixels = np.random.default_rng(1).integers(0, 255, size=(9, 7, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    assert torch.equal(decode_image(buf.getvalue(), "x.png"), torch.from_numpy(pixels).permute(2, 0, 1))


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P"])
def test_png_of_every_mode_is_pillows_own_rgb_and_contiguous(mode: str) -> None:
    pixels = np.random.default_rng(2).integers(0, 255, size=(13, 11, 4), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGBA").convert(mode).save(buf, "PNG")
    with Image.open(io.BytesIO(buf.getvalue())) as img:  # Pillow's RGB of it: alpha dropped, gray repeated
        through = "RGBA" if img.mode in ("P", "PA") else "RGB"
        expected = torch.from_numpy(np.array(img.convert(through))[:, :, :3]).permute(2, 0, 1)
    image = decode_image(buf.getvalue(), "x.png")
    assert image.is_contiguous() and image.shape == (3, 13, 11) and torch.equal(image, expected)


def test_to_rgb_drops_alpha_and_repeats_gray() -> None:
    rgba = torch.arange(4 * 2 * 2, dtype=torch.uint8).view(4, 2, 2)
    assert torch.equal(to_rgb(rgba), rgba[:3])
    gray = torch.ones(2, 2, dtype=torch.uint8)
    assert to_rgb(gray).shape == (3, 2, 2)
    with pytest.raises(DecodeError):
        to_rgb(torch.zeros(5, 2, 2))


def test_png_with_a_flipped_data_byte_raises_instead_of_crashing() -> None:
    # torchvision 0.29 segfaults on this one; stoker checks chunk CRCs first.
    data = bytearray(_encoded("PNG", "RGBA"))
    data[data.index(b"IDAT") + 40] ^= 0xFF
    with pytest.raises(DecodeError, match="x.png: PNG 'IDAT' chunk fails its CRC"):
        decode_image(bytes(data), "x.png")


def test_unknown_suffix_and_empty_file() -> None:
    with pytest.raises(DecodeError, match="empty"):
        decode_sample(b"", "a.png")
    with pytest.raises(DecodeError, match="a.jpg: cannot decode"):
        decode_sample(b"hello, not an image", "a.jpg")


@settings(max_examples=150, deadline=None)
@given(fmt=st.sampled_from(["PNG", "JPEG"]), data=st.data())
def test_fuzzed_image_bytes_only_raise_decode_error(fmt: str, data: st.DataObject) -> None:
    raw = bytearray(_encoded(fmt, "RGBA" if fmt == "PNG" else "RGB"))
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    try:
        image = decode_image(bytes(raw), f"fuzz.{fmt.lower()}")
    except DecodeError:
        return
    assert image.dtype == torch.uint8 and image.shape[0] == 3
