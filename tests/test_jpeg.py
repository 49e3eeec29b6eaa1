"""stoker.decode.jpeg: the fast path gives exactly the pixels of full decode + crop + antialiased resize."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from stoker.decode import jpeg
from stoker.decode.image import decode_sample, resize

pytestmark = pytest.mark.skipif(not jpeg.available(), reason="simplejpeg is not installed")



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
# once took a 1/2, 1/4 and 1/8 DCT scale, odd sizes, boxes at every edge and off any grid.
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
def test_the_fast_path_gives_the_full_paths_pixels(
    kind: str, height: int, width: int, box: tuple[int, int, int, int] | None, size: tuple[int, int]
) -> None:
    options = dict(KINDS[kind])
    mode = str(options.pop("mode", "RGB"))
    data = encode(photo(height, width, seed=height + width), mode, **options)
    fast = jpeg.decode_jpeg_resized(data, size, box)
    assert fast is not None and fast.dtype == torch.uint8 and fast.is_contiguous()
    assert tuple(fast.shape) == (3, *size)
    assert torch.equal(fast, reference(data, size, box))


@pytest.mark.parametrize("subsampling", [0, 1, 2])
def test_high_frequencies_and_a_changed_quantisation_table_do_not_part_the_paths(subsampling: int) -> None:
    # A noise image read at a quarter of its size, and the same file with a quantisation
    # table byte raised: a reduced DCT scale differed from the full path by a mean of 3 and 37.
    noise = np.random.default_rng(subsampling).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).save(buffer, "JPEG", quality=95, subsampling=subsampling)
    data = buffer.getvalue()
    table = data.index(b"\xff\xdb") + 5  # DQT: marker, length, precision/id, then 64 entries in zigzag order
    crafted = data[: table + 63] + b"\xc8" + data[table + 64 :]  # the last (highest-frequency) entry: 200
    for blob in (data, crafted):
        for size in ((64, 64), (32, 32), (16, 16)):
            assert torch.equal(jpeg.decode_jpeg_resized(blob, size, None), reference(blob, size, None))  # type: ignore[arg-type]


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


def _mixed_batch() -> tuple[list[bytes], list[tuple[int, int, int, int] | None], list[int]]:
    """JPEGs of several sizes, kinds and boxes interleaved, with ones only the full path takes among them."""
    kinds = ["baseline", "progressive", "4:4:4", "grayscale"]
    blobs: list[bytes] = []
    boxes: list[tuple[int, int, int, int] | None] = []
    for i in range(14):
        options = dict(KINDS[kinds[i % len(kinds)]])
        mode = str(options.pop("mode", "RGB"))
        height, width = (64, 48) if i % 3 else (96, 80)  # two decoded sizes, interleaved
        blobs.append(encode(photo(height, width, seed=i), mode, **options))
        boxes.append((8, 8, 32, 32) if i % 2 else None)
    cmyk = io.BytesIO()
    Image.fromarray(photo(64, 48)).convert("CMYK").save(cmyk, "JPEG", quality=90)
    blobs[5] = cmyk.getvalue()
    blobs[8] = blobs[8][: len(blobs[8]) // 2]  # truncated, in the middle of a group: its slot is reused
    return blobs, boxes, [5, 8]


@pytest.mark.parametrize("chunk_bytes", [jpeg.CHUNK_BYTES, 2 * 64 * 48 * 3, 100])
def test_chunks_and_groups_give_the_same_batch_as_image_by_image(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    # 100 bytes: every image is larger than a chunk and gets a buffer of its own
    blobs, boxes, rejected = _mixed_batch()
    size = (20, 24)
    alone = [jpeg.decode_jpeg_resized(data, size, box) for data, box in zip(blobs, boxes, strict=True)]
    monkeypatch.setattr(jpeg, "CHUNK_BYTES", chunk_bytes)
    out = torch.full((len(blobs), 3, *size), 7, dtype=torch.uint8)
    assert jpeg.decode_jpegs_into(blobs, boxes, size, out) == rejected
    for j, image in enumerate(alone):
        if j in rejected:
            assert image is None and bool((out[j] == 7).all())  # left for the full path, untouched
        else:
            assert image is not None and torch.equal(out[j], image)
            assert torch.equal(out[j], reference(blobs[j], size, boxes[j]))


def test_threads_decode_side_by_side_into_buffers_of_their_own() -> None:
    from concurrent.futures import ThreadPoolExecutor

    blobs, boxes, rejected = _mixed_batch()
    size = (16, 16)

    def batch(shift: int) -> torch.Tensor:
        order = [(j + shift) % len(blobs) for j in range(len(blobs))]
        out = torch.zeros((len(blobs), 3, *size), dtype=torch.uint8)
        jpeg.decode_jpegs_into([blobs[j] for j in order], [boxes[j] for j in order], size, out)
        return out[torch.as_tensor([order.index(j) for j in range(len(blobs))])]  # back in the original order

    expected = batch(0)
    with ThreadPoolExecutor(4) as pool:
        for result in pool.map(batch, [1, 2, 3, 4, 5, 6, 7, 8] * 3):
            assert torch.equal(result, expected)
    assert all(not bool(expected[j].any()) for j in rejected)


def test_a_cmyk_jpeg_is_left_to_the_full_path() -> None:
    cmyk = io.BytesIO()
    Image.fromarray(photo(64, 48)).convert("CMYK").save(cmyk, "JPEG", quality=90)
    assert jpeg.decode_jpeg_resized(cmyk.getvalue(), (16, 16), None) is None
    assert decode_sample(cmyk.getvalue(), "x.jpg").shape == (3, 64, 48)  # which reads it


def test_boxes_outside_the_image_are_left_to_the_full_path() -> None:
    data = encode(photo(50, 40))
    assert jpeg.decode_jpeg_resized(data, (10, 10), (40, 0, 20, 20)) is None
    assert jpeg.decode_jpeg_resized(data, (10, 10), (0, -1, 20, 20)) is None


def _with_sof(data: bytes, *, height: int | None = None, width: int | None = None, luma_sampling: int | None = None) -> bytes:
    """The same JPEG with its frame header (SOF0) changed: declared size or the first component's sampling byte."""
    at = data.index(b"\xff\xc0")
    frame = bytearray(data)
    if height is not None:
        frame[at + 5 : at + 7] = height.to_bytes(2, "big")
    if width is not None:
        frame[at + 7 : at + 9] = width.to_bytes(2, "big")
    if luma_sampling is not None:
        frame[at + 11] = luma_sampling
    return bytes(frame)


def test_crafted_headers_are_left_to_the_full_path_whatever_simplejpeg_raises() -> None:
    """simplejpeg raises KeyError (not ValueError) on a luma sampling byte of 0x14: never out of stoker."""
    data = encode(photo(48, 40))
    crafted = _with_sof(data, luma_sampling=0x14)
    simplejpeg = pytest.importorskip("simplejpeg")
    with pytest.raises(Exception) as raised:  # what the library does with it, so the test keeps its point
        simplejpeg.decode_jpeg_header(crafted)
    assert not isinstance(raised.value, ValueError)
    assert jpeg.decode_jpeg_resized(crafted, (16, 16), None) is None
    out = torch.zeros((2, 3, 16, 16), dtype=torch.uint8)
    assert jpeg.decode_jpegs_into([data, crafted], [None, None], (16, 16), out) == [1]
    assert out[0].any()


def test_a_huge_declared_size_is_refused_before_any_allocation() -> None:
    """48679x59164 declared in a small file: the fast path does not take it; the full path refuses it by the limit."""
    import tracemalloc

    from stoker.errors import DecodeError

    bomb = _with_sof(encode(photo(48, 40)), height=48679, width=59164)
    out = torch.zeros((1, 3, 32, 32), dtype=torch.uint8)
    tracemalloc.start()
    try:
        assert jpeg.decode_jpeg_resized(bomb, (32, 32), (0, 0, 128, 128)) is None
        assert jpeg.decode_jpegs_into([bomb], [None], (32, 32), out) == [0]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB allocated for an image that is refused"
    with pytest.raises(DecodeError, match="pixels, more than the limit"):
        decode_sample(bomb, "bomb.jpg")


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
        assert mean_abs_diff(batch[j].cpu(), reference(blobs[j].tobytes(), size, boxes[j])) <= 2.0  # nvJPEG is another decoder: its rounding


def test_the_fast_decoder_is_trusted_only_where_it_decodes_as_the_full_path() -> None:
    import simplejpeg

    class Drifted:  # another libjpeg-turbo build: one grey level off somewhere
        __version__ = "drifted"

        @staticmethod
        def decode_jpeg(data: bytes, **options: object) -> np.ndarray:
            pixels = simplejpeg.decode_jpeg(data, **options).copy()
            pixels[0, 0, 0] ^= 1
            return pixels

    assert jpeg._same_pixels_as_the_full_path(simplejpeg)
    assert not jpeg._same_pixels_as_the_full_path(Drifted())
