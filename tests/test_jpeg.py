"""stoker.jpeg: the reduced-scale path stays within 2 grey levels of full decode + antialiased resize."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from stoker import jpeg
from stoker.decode import decode_sample, resize

pytestmark = pytest.mark.skipif(not jpeg.available(), reason="simplejpeg is not installed")

MAX_MEAN_ABS_DIFF = 2.0  # grey levels, the tolerance


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A photo-like RGB image: smooth gradients, a few shapes with edges, mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([
        128 + 100 * np.sin(x / (7 + seed) + y / 23),
        128 + 90 * np.cos(y / 11 - x / 31),
        (x * 255 / max(width - 1, 1)) * 0.6 + 40,
    ], axis=-1)
    for _ in range(4):
        cy, cx, r = rng.integers(0, height), rng.integers(0, width), rng.integers(3, max(4, min(height, width) // 3))
        image[(y - cy) ** 2 + (x - cx) ** 2 < r**2] = rng.integers(0, 255, 3)
    image += rng.normal(0, 6, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, mode: str = "RGB", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def reference(data: bytes, size: tuple[int, int], box: tuple[int, int, int, int] | None) -> torch.Tensor:
    return resize(decode_sample(data, "x.jpg", box), size)


def mean_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().mean())


KINDS = {
    "baseline": {},
    "progressive": {"progressive": True},
    "4:4:4": {"subsampling": 0},
    "4:2:2": {"subsampling": 1},
    "grayscale": {"mode": "L"},
}

# (image height, width, crop box or None, output size): CelebA's setting, reductions that
# take a 1/2, 1/4 and 1/8 scale, odd sizes, boxes at every edge, and boxes that are not
# on the scaled grid (which must fall back to a larger scale, not misplace the crop).
CASES = [
    (218, 178, (40, 20, 138, 138), (112, 112)),
    (218, 178, (40, 20, 138, 138), (56, 56)),
    (218, 178, (40, 20, 138, 138), (32, 32)),
    (256, 256, None, (16, 16)),
    (218, 178, None, (64, 64)),
    (256, 256, None, (32, 32)),
    (512, 384, None, (48, 40)),
    (37, 53, None, (11, 17)),
    (101, 77, (0, 0, 64, 48), (30, 20)),
    (200, 160, (136, 96, 64, 64), (16, 16)),
    (200, 160, (0, 96, 200, 64), (40, 16)),
    (199, 161, (3, 5, 101, 99), (25, 24)),
    (64, 64, None, (64, 64)),
    (64, 64, None, (96, 80)),
]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize(("height", "width", "box", "size"), CASES)
def test_reduced_decode_is_within_two_grey_levels_of_the_full_path(
    kind: str, height: int, width: int, box: tuple[int, int, int, int] | None, size: tuple[int, int]
) -> None:
    options = dict(KINDS[kind])
    mode = str(options.pop("mode", "RGB"))
    data = encode(photo(height, width, seed=height + width), mode, **options)
    fast = jpeg.decode_jpeg_resized(data, size, box)
    assert fast is not None and fast.dtype == torch.uint8 and fast.is_contiguous()
    assert tuple(fast.shape) == (3, *size)
    assert mean_abs_diff(fast, reference(data, size, box)) <= MAX_MEAN_ABS_DIFF


def test_at_full_scale_it_is_the_full_path_exactly() -> None:
    data = encode(photo(218, 178))
    box, size = (40, 20, 138, 138), (112, 112)
    assert jpeg.reduced_scale((218, 178), box, size) == 8
    assert torch.equal(jpeg.decode_jpeg_resized(data, size, box), reference(data, size, box))  # type: ignore[arg-type]


def test_the_scale_is_the_smallest_power_of_two_that_keeps_the_crop_on_the_grid() -> None:
    assert jpeg.reduced_scale((218, 178), (40, 20, 138, 138), (56, 56)) == 8  # 69 < 2 x 56 at 1/2
    assert jpeg.reduced_scale((218, 178), (40, 20, 138, 138), (32, 32)) == 4  # 69 >= 2 x 32
    assert jpeg.reduced_scale((256, 256), None, (16, 16)) == 1
    assert jpeg.reduced_scale((256, 256), None, (17, 16)) == 2
    assert jpeg.reduced_scale((199, 161), (3, 5, 101, 99), (25, 24)) == 8  # odd corners: no reduced grid fits
    assert jpeg.reduced_scale((64, 64), None, (96, 80)) == 8  # upscaling: never reduce


def test_a_batch_equals_image_by_image_and_reports_what_it_could_not_take() -> None:
    size = (24, 20)
    blobs: list[bytes] = [encode(photo(64 + 8 * (i % 3), 48, seed=i)) for i in range(7)]
    boxes: list[tuple[int, int, int, int] | None] = [None, (8, 8, 40, 32), None, (0, 0, 48, 40), None, None, None]
    cmyk = io.BytesIO()
    Image.fromarray(photo(40, 40)).convert("CMYK").save(cmyk, "JPEG", quality=90)
    png = io.BytesIO()
    Image.fromarray(photo(40, 40)).save(png, "PNG")
    blobs[4], blobs[5] = cmyk.getvalue(), png.getvalue()
    blobs[6] = blobs[6][: len(blobs[6]) // 2]  # truncated: the full path must decide
    out = torch.zeros((len(blobs), 3, *size), dtype=torch.uint8)
    failed = jpeg.decode_jpegs_into(blobs, boxes, size, out)
    assert failed == [4, 5, 6]
    for j in (0, 1, 2, 3):
        assert torch.equal(out[j], jpeg.decode_jpeg_resized(blobs[j], size, boxes[j]))  # type: ignore[arg-type]
    for j in (4, 5, 6):
        assert jpeg.decode_jpeg_resized(blobs[j], size, boxes[j]) is None


def test_boxes_outside_the_image_are_left_to_the_full_path() -> None:
    data = encode(photo(50, 40))
    assert jpeg.decode_jpeg_resized(data, (10, 10), (40, 0, 20, 20)) is None
    assert jpeg.decode_jpeg_resized(data, (10, 10), (0, -1, 20, 20)) is None


def test_the_device_path_falls_back_to_the_cpu_image_by_image() -> None:
    size = (16, 16)
    blobs = [np.frombuffer(encode(photo(40, 32, seed=i)), dtype=np.uint8) for i in range(3)]
    boxes = [None, (4, 4, 32, 24), None]

    def on_cpu(j: int) -> torch.Tensor:
        return reference(blobs[j].tobytes(), size, boxes[j])

    expected = torch.stack([on_cpu(j) for j in range(3)])
    for device in ("cpu", "cuda") if not torch.cuda.is_available() else ("cpu",):
        batch = jpeg.decode_batch_on_device(blobs, boxes, size, torch.device(device), on_cpu)
        assert batch.device.type == "cpu" and torch.equal(batch, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvjpeg_matches_the_cpu_within_two_grey_levels() -> None:
    size = (56, 56)
    blobs = [np.frombuffer(encode(photo(218, 178, seed=i)), dtype=np.uint8) for i in range(4)]
    blobs.append(np.frombuffer(b"not a jpeg", dtype=np.uint8))
    boxes = [(40, 20, 138, 138)] * 5
    cpu_calls: list[int] = []

    def on_cpu(j: int) -> torch.Tensor:
        cpu_calls.append(j)
        return torch.zeros((3, *size), dtype=torch.uint8)

    batch = jpeg.decode_batch_on_device(blobs, boxes, size, torch.device("cuda"), on_cpu)
    assert batch.device.type == "cuda" and cpu_calls == [4]
    for j in range(4):
        assert mean_abs_diff(batch[j].cpu(), reference(blobs[j].tobytes(), size, boxes[j])) <= MAX_MEAN_ABS_DIFF
