"""PNG through libspng: the same pixels as Pillow in every mode, Pillow for the rest, errors as DecodeError."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable

import numpy as np
import pytest
import torch
from fuzzing.png import png_case
from PIL import Image

from stoker.decode import image as decode
from stoker.decode.image import _decode_with_pil, decode_image, png_decoder
from stoker.errors import DecodeError

_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _packed_rows(samples: np.ndarray, depth: int) -> list[bytes]:
    """Each row of ``samples`` (H x W x C integers) as PNG packs it, without its filter byte."""
    if depth == 16:
        return [row.astype(">u2").tobytes() for row in samples]
    if depth == 8:
        return [row.astype(np.uint8).tobytes() for row in samples]
    per = 8 // depth  # samples per byte, the first in the high bits
    shifts = np.array([8 - depth * (i + 1) for i in range(per)], np.uint8)
    rows = []
    for row in samples:
        flat = row.reshape(-1).astype(np.uint8)
        flat = np.concatenate([flat, np.zeros((-len(flat)) % per, np.uint8)]).reshape(-1, per)
        rows.append((flat << shifts).sum(axis=1).astype(np.uint8).tobytes())
    return rows


def png(
    samples: np.ndarray,
    depth: int,
    colour: int,
    interlace: bool = False,
    palette: np.ndarray | None = None,
    trns: bytes | None = None,
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> bytes:
    """A PNG written by hand: any colour type and bit depth, Adam7, tRNS and other chunks."""
    if samples.ndim == 2:
        samples = samples[:, :, None]
    height, width, channels = samples.shape
    if channels != _CHANNELS[colour]:
        raise ValueError(f"colour type {colour} has {_CHANNELS[colour]} samples per pixel, got {channels}")
    raw = bytearray()
    for x0, y0, dx, dy in _ADAM7 if interlace else ((0, 0, 1, 1),):
        part = samples[y0::dy, x0::dx]
        if part.size:
            for row in _packed_rows(part, depth):
                raw += b"\x00" + row
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, int(interlace))
    chunks = [_chunk(b"IHDR", header), *(_chunk(kind, body) for kind, body in extra)]
    if palette is not None:
        chunks.append(_chunk(b"PLTE", palette.astype(np.uint8).tobytes()))
    if trns is not None:
        chunks.append(_chunk(b"tRNS", trns))
    chunks += [_chunk(b"IDAT", zlib.compress(bytes(raw))), _chunk(b"IEND", b"")]
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunks)


def _modes() -> dict[str, tuple[np.ndarray, int, int, np.ndarray | None, bytes | None]]:
    """name -> (samples, bit depth, colour type, palette, tRNS): every PNG mode."""
    rng = np.random.default_rng(0)
    shape = (13, 11)  # odd, so that Adam7's passes and the bit packing have partial ends
    modes: dict[str, tuple[np.ndarray, int, int, np.ndarray | None, bytes | None]] = {}
    for depth in (1, 2, 4, 8, 16):
        gray = rng.integers(0, 2**depth, shape)
        modes[f"gray {depth}-bit"] = (gray, depth, 0, None, None)
        modes[f"gray {depth}-bit, tRNS"] = (gray, depth, 0, None, struct.pack(">H", int(gray[0, 0])))
    for depth in (8, 16):
        rgb = rng.integers(0, 2**depth, (*shape, 3))
        modes[f"RGB {depth}-bit"] = (rgb, depth, 2, None, None)
        modes[f"RGB {depth}-bit, tRNS"] = (rgb, depth, 2, None, struct.pack(">HHH", *map(int, rgb[0, 0])))
        modes[f"gray+alpha {depth}-bit"] = (rng.integers(0, 2**depth, (*shape, 2)), depth, 4, None, None)
        modes[f"RGBA {depth}-bit"] = (rng.integers(0, 2**depth, (*shape, 4)), depth, 6, None, None)
    for depth in (1, 2, 4, 8):
        palette = rng.integers(0, 256, (2**depth, 3))
        index = rng.integers(0, 2**depth, shape)
        modes[f"palette {depth}-bit"] = (index, depth, 3, palette, None)
        alpha = rng.integers(0, 256, 2 ** (depth - 1) + 1).astype(np.uint8).tobytes()  # a short tRNS, as allowed
        modes[f"palette {depth}-bit, tRNS"] = (index, depth, 3, palette, alpha)
    return modes


_MODES = _modes()
_GAMMA = {
    "no gamma": (),
    "gAMA 1/2.2": ((b"gAMA", struct.pack(">I", 45455)),),
    "gAMA 1.0 + sRGB + cHRM": (
        (b"gAMA", struct.pack(">I", 100000)),
        (b"sRGB", b"\x00"),
        (b"cHRM", struct.pack(">8I", 31270, 32900, 64000, 33000, 30000, 60000, 15000, 6000)),
    ),
}
# What libspng decodes (through imagecodecs' formats); the rest goes to Pillow.
_BY_SPNG = {name for name in _MODES if "gray+alpha" not in name and not ("16-bit" in name and "RGBA" not in name)}


@pytest.fixture
def spng_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the calls into libspng (the real one runs)."""
    if decode._spng_decode is None:
        pytest.fail("imagecodecs is a dependency of stoker: install it (pip install imagecodecs)")
    calls: list[int] = []
    real: Callable[[np.ndarray], np.ndarray] = decode._spng_decode

    def counted(buffer: np.ndarray) -> np.ndarray:
        calls.append(1)
        return real(buffer)

    monkeypatch.setattr(decode, "_spng_decode", counted)
    return calls


def test_png_decoder_is_libspng() -> None:
    assert png_decoder() == "libspng"


@pytest.mark.parametrize("gamma", list(_GAMMA))
@pytest.mark.parametrize("interlace", [False, True], ids=["progressive", "Adam7"])
@pytest.mark.parametrize("mode", list(_MODES))
def test_every_mode_decodes_exactly_as_pillow(mode: str, interlace: bool, gamma: str, spng_calls: list[int]) -> None:
    samples, depth, colour, palette, trns = _MODES[mode]
    data = png(samples, depth, colour, interlace, palette, trns, _GAMMA[gamma])
    reference = _decode_with_pil(memoryview(data), "ref.png", 10**9).numpy()  # what stoker gave before libspng
    image = decode_image(data, f"{mode}.png")
    assert image.dtype == torch.uint8 and image.is_contiguous()
    assert image.shape == reference.shape == (3, 13, 11)
    assert np.array_equal(image.numpy(), reference)
    assert len(spng_calls) == (mode in _BY_SPNG)  # the new path, where it can; Pillow for the rest


def test_high_byte_of_16_bit_rgba_as_pillow_gives() -> None:
    rgba = np.zeros((2, 3, 4), np.int64)
    rgba[0, 0] = (0x1234, 0x00FF, 0xFF00, 0x8000)
    image = decode_image(png(rgba, 16, 6), "deep.png")
    assert image[:, 0, 0].tolist() == [0x12, 0x00, 0xFF]


@pytest.mark.parametrize("kind", [b"zTXt", b"iTXt", b"iCCP"])
def test_compressed_ancillary_chunks_go_to_pillow(kind: bytes, spng_calls: list[int]) -> None:
    # libspng inflates these without a limit (a 2 MB zTXt took 1 GB); Pillow stops at 1 MB.
    body = {b"zTXt": b"k\x00\x00", b"iTXt": b"k\x00\x01\x00\x00\x00", b"iCCP": b"p\x00\x00"}[kind] + zlib.compress(b"x" * 100)
    rgb = np.random.default_rng(1).integers(0, 256, (5, 4, 3))
    data = png(rgb, 8, 2, extra=((kind, body),))
    assert np.array_equal(decode_image(data, "text.png").numpy(), rgb.astype(np.uint8).transpose(2, 0, 1))
    assert spng_calls == []


def test_crafted_png_through_libspng_is_a_decode_error_naming_the_file(spng_calls: list[int]) -> None:
    kind, data = png_case(0)  # 8-bit RGB, one bit of its zlib stream flipped, CRCs valid
    assert kind == "flip bit in IDAT" and data[24:26] == b"\x08\x02"
    with pytest.raises(DecodeError, match=r"shard-3\.arrow row 17"):
        decode_image(data, "shard-3.arrow row 17")
    assert spng_calls == [1]


def test_anything_libspng_raises_leaves_pillow_to_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(buffer: np.ndarray) -> np.ndarray:
        raise KeyError("not a library error stoker knows")

    monkeypatch.setattr(decode, "_spng_decode", broken)
    _, bad = png_case(0)
    with pytest.raises(DecodeError, match="bad.png"):
        decode_image(bad, "bad.png")
    rgb = np.random.default_rng(2).integers(0, 256, (6, 7, 3))
    assert np.array_equal(decode_image(png(rgb, 8, 2), "good.png").numpy(), rgb.astype(np.uint8).transpose(2, 0, 1))


def test_without_imagecodecs_pillow_decodes_every_png(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decode, "_spng_decode", None)
    assert png_decoder() == "pillow"
    out = io.BytesIO()
    Image.fromarray(np.full((4, 5, 4), 77, np.uint8), "RGBA").save(out, "PNG")
    assert decode_image(out.getvalue(), "a.png").shape == (3, 4, 5)


def test_pixel_limit_is_checked_before_libspng_allocates(spng_calls: list[int]) -> None:
    data = bytearray(png(np.zeros((2, 2, 4), np.int64), 8, 6))
    data[16:24] = struct.pack(">II", 50_000, 50_000)  # 2.5 gigapixels: 10 GB of RGBA if allocated
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    with pytest.raises(DecodeError, match=r"50000x50000 .* more than the limit"):
        decode_image(bytes(data), "bomb.png")
    assert spng_calls == []
    with pytest.raises(DecodeError, match="more than the limit"):
        decode_image(png(np.zeros((40, 40, 4), np.int64), 8, 6), "small.png", max_pixels=1_000)
    assert spng_calls == []


def test_png_from_arrow_bytes_and_numpy_views_decodes(spng_calls: list[int]) -> None:
    rgb = np.random.default_rng(3).integers(0, 256, (9, 8, 3))
    data = png(rgb, 8, 2)
    padded = np.frombuffer(b"xx" + data, np.uint8)[2:]  # a view into a larger buffer, as a shard's column gives
    for source in (data, bytearray(data), memoryview(data), padded):
        assert np.array_equal(decode_image(source, "v.png").numpy(), rgb.astype(np.uint8).transpose(2, 0, 1))
    assert len(spng_calls) == 4
