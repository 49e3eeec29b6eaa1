"""Crafted images: no PNG crashes the process, huge declared sizes are refused, frames and bombs."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from fuzzing.png import PNG_MUTATIONS, png_case, run_guarded
from PIL import Image

from stoker.decode.image import _check_png_chunks, decode_image, get_max_pixels, png_decoder, set_max_pixels
from stoker.errors import ConfigError, DecodeError


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, "PNG")
    return out.getvalue()


def _with_header_size(png: bytes, width: int, height: int) -> bytes:
    body = struct.pack(">II", width, height) + png[24:29]
    return png[:16] + body + struct.pack(">I", zlib.crc32(b"IHDR" + body)) + png[33:]


def test_three_hundred_crafted_pngs_never_crash_the_process() -> None:
    # Each case keeps valid CRCs; torchvision's libpng path segfaulted on most of these.
    counts = run_guarded("png", range(300), timeout_s=300)
    outcomes = {outcome for (_, outcome) in counts}
    assert sum(counts.values()) == 300
    assert outcomes <= {"decoded", "DecodeError"}, counts
    assert {kind for (kind, _) in counts} == set(PNG_MUTATIONS)
    # ... and most of them went through libspng, stoker's PNG decoder (the child imports the same stoker).
    assert png_decoder() == "libspng"
    through_spng = sum(_png_route(png_case(seed)[1]) for seed in range(300))
    assert through_spng > 100, through_spng


def _png_route(data: bytes) -> bool:
    """Whether stoker gives this PNG to libspng (after its chunk checks), rather than refusing it or using Pillow."""
    try:
        return _check_png_chunks(memoryview(data), "case.png")
    except DecodeError:
        return False


def test_crafted_pngs_through_libspng_alone_never_crash() -> None:
    # The library itself, without stoker's CRC walk and size check in front of it.
    counts = run_guarded("png", range(200), timeout_s=300, decoder="imagecodecs-spng")
    assert sum(counts.values()) == 200
    assert {outcome for (_, outcome) in counts} <= {"decoded", "DecodeError"}, counts


def test_a_broken_zlib_stream_with_valid_crcs_is_a_decode_error() -> None:
    kind, data = png_case(0)  # "flip bit in IDAT"
    assert kind == "flip bit in IDAT"
    with pytest.raises(DecodeError, match="case.png"):
        decode_image(data, "case.png")


def test_png_declaring_60000_squared_is_refused_before_decoding() -> None:
    bomb = _with_header_size(_png(np.zeros((8, 8, 3), np.uint8)), 60_000, 60_000)
    with pytest.raises(DecodeError, match=r"60000x60000 .* more than the limit"):
        decode_image(bomb, "bomb.png")


def test_jpeg_declaring_huge_dimensions_is_refused_before_decoding() -> None:
    out = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(out, "JPEG")
    data = bytearray(out.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 60_000, 60_000)
    with pytest.raises(DecodeError, match="60000x60000"):
        decode_image(bytes(data), "huge.jpg")


def test_pil_decompression_bomb_is_a_decode_error() -> None:
    # TIFF goes through PIL; PIL's own DecompressionBombError must not escape.
    out = io.BytesIO()
    Image.new("L", (20_000, 10_000)).save(out, "TIFF", compression="tiff_deflate")
    with pytest.raises(DecodeError, match="more than the limit"):
        decode_image(out.getvalue(), "big.tif")


def test_pixel_limit_is_configurable() -> None:
    data = _png(np.zeros((30, 40, 3), np.uint8))
    try:
        set_max_pixels(1000)
        assert get_max_pixels() == 1000
        with pytest.raises(DecodeError, match="1,200 pixels"):
            decode_image(data, "a.png")
        assert decode_image(data, "a.png", max_pixels=1200).shape == (3, 30, 40)
        with pytest.raises(ConfigError):
            set_max_pixels(0)
    finally:
        set_max_pixels(None)
    assert decode_image(data, "a.png").shape == (3, 30, 40)


@pytest.mark.parametrize("suffix", ["GIF", "PNG"])
def test_animated_image_gives_its_first_frame(suffix: str) -> None:
    frames = [Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)) for i in range(3)]
    out = io.BytesIO()
    frames[0].save(out, suffix, save_all=True, append_images=frames[1:])
    image = decode_image(out.getvalue(), f"anim.{suffix.lower()}")
    assert image.shape == (3, 10, 12)
    assert int(image.max()) == 0  # the first frame is black


def test_16_bit_png_is_scaled_to_8_bits() -> None:
    image = decode_image(_png(np.full((4, 5), 65535, np.uint16)), "deep.png")
    assert image.dtype.is_floating_point is False and image.shape == (3, 4, 5)
    assert int(image.min()) == 255


def test_run_guarded_names_the_decoders_it_knows() -> None:
    with pytest.raises(ConfigError, match="'stoker', 'torchvision', 'pyspng'"):
        run_guarded("png", range(3), decoder="libpng")
