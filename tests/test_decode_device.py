"""stoker.decode.device: the batched device path, run on CPU tensors (the same ops torchvision runs on a GPU)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from stoker.decode import device as dev
from stoker.decode.headers import declared_size
from stoker.decode.image import decode_sample, resize
from stoker.decode.jpeg import decode_jpeg_resized
from stoker.errors import DecodeError

# The device path resizes through float (as torchvision does on a GPU); the CPU path's uint8
# resize rounds differently: at most 1 grey level apart on the same decoded pixels.
MAX_ABS_DIFF_SAME_DECODE = 1
MAX_MEAN_ABS_DIFF = 2.0  # a GPU decoder (its own IDCT and upsampling) against the CPU path

# Both engines run here: nvImageCodec through its libjpeg-turbo backend (the test extra installs it;
# 0.9 and later decode without a GPU), with the same calls, region decode included, as on CUDA.
_NVIMAGECODEC = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.nvimgcodec") is not None
ENGINES = ["torchvision", pytest.param("nvimagecodec", marks=pytest.mark.skipif(
    not _NVIMAGECODEC, reason="needs nvImageCodec (pip install nvidia-nvimgcodec-cu12)"))]


def _decoder(engine: str, **options: bool) -> dev.DeviceDecoder:
    decoder = dev.DeviceDecoder("cpu", engine=engine, **options)  # type: ignore[arg-type]
    assert decoder.engine == engine  # installed and not started would be a silent torchvision run
    return decoder


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A photo-like RGB image: smooth gradients, a few discs with edges, mild noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.stack([128 + 100 * np.sin(x / (7 + seed) + y / 23), 128 + 90 * np.cos(y / 11 - x / 31),
                      (x * 255 / max(width - 1, 1)) * 0.6 + 40], axis=-1)
    for _ in range(4):
        cy, cx, r = rng.integers(0, height), rng.integers(0, width), rng.integers(3, max(4, min(height, width) // 3))
        image[(y - cy) ** 2 + (x - cx) ** 2 < r**2] = rng.integers(0, 255, 3)
    return np.clip(image + rng.normal(0, 6, image.shape), 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, mode: str = "RGB", **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def _blob(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def _joined(blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), offsets


def _with_size(data: bytes, height: int, width: int) -> bytes:
    at = data.index(b"\xff\xc0")
    return data[: at + 5] + struct.pack(">HH", height, width) + data[at + 9 :]


def _full_path(blobs: list[np.ndarray], boxes: list, size: tuple[int, int], j: int) -> torch.Tensor:
    return resize(decode_sample(blobs[j].tobytes(), f"{j}.jpg", boxes[j]), size)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_decodes_as_the_cpu_path_within_the_resize_rounding(engine: str) -> None:
    size = (56, 48)
    blobs = [_blob(encode(photo(218, 178, seed=i))) for i in range(5)]
    blobs += [_blob(encode(photo(90, 120, seed=7), "L")), _blob(encode(photo(64, 64, seed=8), subsampling=1))]
    blobs += [_blob(encode(photo(218, 178, seed=9), progressive=True)), _blob(encode(photo(40, 30, seed=10)))]
    # Crops of one size at two places in images of one size (a gather), two other crop sizes, whole images of
    # three sizes, one crop already at the output size.
    boxes = [(40, 20, 138, 138), (30, 10, 138, 138), (40, 20, 138, 138), (0, 0, 100, 90), None, None,
             (8, 8, 56, 48), (40, 20, 138, 138), None]
    calls: list[int] = []

    def on_cpu(j: int) -> torch.Tensor:
        calls.append(j)
        return _full_path(blobs, boxes, size, j)

    batch = _decoder(engine).decode(blobs, boxes, size, on_cpu)
    assert calls == [] and batch.on_cpu == 0 and batch.ready is None
    assert batch.by_region == (sum(box is not None for box in boxes) if engine == "nvimagecodec" else 0)
    assert batch.images.shape == (len(blobs), 3, *size) and batch.images.dtype == torch.uint8
    for j in range(len(blobs)):
        expected = _full_path(blobs, boxes, size, j)
        assert int((batch.images[j].int() - expected.int()).abs().max()) <= MAX_ABS_DIFF_SAME_DECODE, j
        reduced = decode_jpeg_resized(blobs[j], size, boxes[j])
        if reduced is not None:
            assert float((batch.images[j].float() - reduced.float()).abs().mean()) <= MAX_MEAN_ABS_DIFF, j
    assert torch.equal(batch.images[6], _full_path(blobs, boxes, size, 6))  # a crop at the output size: no resize


@pytest.mark.parametrize("engine", ENGINES)
def test_what_the_device_cannot_take_goes_to_the_cpu_path_in_place(engine: str) -> None:
    size = (16, 16)
    good = encode(photo(40, 48, seed=1))
    blobs = [
        _blob(good),
        _blob(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40),  # not a JPEG
        _blob(_with_size(good, 48679, 59164)),  # the pixel limit
        _blob(good[: len(good) // 2]),  # truncated: decodes partly or fails, on the CPU too
        _blob(encode(photo(40, 48, seed=2))),
        _blob(good),
    ]
    boxes = [None, None, None, None, (0, 0, 400, 400), (4, 4, 20, 20)]  # [4]: a box outside the image
    calls: list[int] = []

    def on_cpu(j: int) -> torch.Tensor:
        calls.append(j)
        return torch.full((3, *size), j, dtype=torch.uint8)

    batch = _decoder(engine).decode(blobs, boxes, size, on_cpu)
    assert set(calls) >= {1, 2, 4} and set(calls) <= {1, 2, 3, 4} and batch.on_cpu == len(calls)
    for j in calls:
        assert torch.equal(batch.images[j], torch.full((3, *size), j, dtype=torch.uint8))
    assert int((batch.images[5].int() - _full_path(blobs, boxes, size, 5).int()).abs().max()) <= 1


def test_the_header_pass_refuses_crafted_sizes_and_colour_transforms_before_any_decoder() -> None:
    good = encode(photo(40, 48, seed=3))
    at = good.index(b"\xff\xc0")
    app = b"\xff\xe1" + struct.pack(">H", 2 + 9) + b"\xff\xc0\x00\x11\x08" + struct.pack(">HH", 60000, 60000)
    adobe = b"\xff\xee" + struct.pack(">H", 14) + b"Adobe\x00\x64\x00\x00\x00\x00\x00"
    rgb_ids = bytearray(good)
    rgb_ids[at + 10], rgb_ids[at + 13], rgb_ids[at + 16] = ord("R"), ord("G"), ord("B")
    cases = {
        "good": (good, True),
        "huge": (_with_size(good, 48679, 59164), False),
        "huge behind garbage": (good[:at] + b"\x13\x37" + _with_size(good, 30000, 40000)[at:], False),
        "a larger look-alike inside an APP segment": (good[:2] + app + good[2:], False),
        "zero height": (_with_size(good, 0, 48), False),
        "no frame header": (good[:at], False),
        "cut inside the frame header": (good[: at + 7], False),
        "four components": (good[: at + 9] + b"\x04" + good[at + 10 :], False),
        "Adobe marker": (good[:2] + adobe + good[2:], False),
        "R, G, B component ids": (bytes(rgb_ids), False),
        "PNG": (b"\x89PNG\r\n\x1a\n" + b"\x00" * 30, False),
        "empty": (b"", False),
        "two bytes": (b"\xff\xd8", False),
    }
    joined, offsets = _joined([data for data, _ in cases.values()])
    checked = dev.check_headers(joined, offsets)
    assert dict(zip(cases, checked.ok.tolist(), strict=True)) == {name: ok for name, (_, ok) in cases.items()}
    assert checked.pixels[0] == 40 * 48 and checked.pixels[1] == 48679 * 59164
    limited = dev.check_headers(*_joined([good, good]), max_pixels=40 * 48 - 1)
    assert not limited.ok.any()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_huge_header_never_goes_to_the_device_decoder_and_the_cpu_path_names_it(engine: str) -> None:
    good = encode(photo(40, 48, seed=4))
    blobs = [_blob(good), _blob(_with_size(good, 48679, 59164))]

    def on_cpu(j: int) -> torch.Tensor:
        return resize(decode_sample(blobs[j].tobytes(), f"row{j}.jpg"), (16, 16))

    with pytest.raises(DecodeError, match="row1.jpg: .*pixels, more than the limit"):
        _decoder(engine).decode(blobs, [None, None], (16, 16), on_cpu)


def test_the_header_pass_never_lets_through_what_the_precise_header_walk_refuses() -> None:
    from fuzzing.jpeg import jpeg_case

    from stoker.decode.image import get_max_pixels

    cases = [jpeg_case(seed)[1] for seed in range(390)]
    checked = dev.check_headers(*_joined(cases))
    for data, ok in zip(cases, checked.ok.tolist(), strict=True):
        if ok:
            size = declared_size(data)
            assert size is not None and 0 < size[0] * size[1] <= get_max_pixels()


_FUZZ_CHILD = r"""
import json, resource, sys, warnings
warnings.simplefilter("ignore")
import numpy as np, torch
from fuzzing.jpeg import jpeg_case
from stoker.decode.device import DeviceDecoder
from stoker.decode.image import decode_sample, resize
from stoker.errors import DecodeError

decoder, size, counts = DeviceDecoder(sys.argv[2], engine=sys.argv[3]), (32, 32), {}
assert decoder.engine == sys.argv[3] or sys.argv[3] == "auto", decoder.engine
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for seed in range(int(sys.argv[1])):
    kind, data = jpeg_case(seed)
    blobs = [np.frombuffer(data, np.uint8), np.frombuffer(jpeg_case(0)[1], np.uint8)]
    where = {}
    def on_cpu(j):
        try:
            image = resize(decode_sample(blobs[j].tobytes(), "case.jpg"), size)
        except DecodeError:
            where[j] = "cpu refused"
            return torch.zeros((3, *size), dtype=torch.uint8)
        where[j] = "cpu"
        return image
    try:
        decoder.decode(blobs, [None, None], size, on_cpu)
        outcome = where.get(0, "device")
    except Exception as exc:
        outcome = "other error: " + type(exc).__name__
    key = kind + "|" + outcome
    counts[key] = counts.get(key, 0) + 1
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start
print(json.dumps({"counts": counts, "grown_kib": grown}))
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine", ["auto", *ENGINES[1:]])
def test_crafted_jpegs_through_the_batched_path_decode_or_go_to_the_cpu_without_crashing(engine: str) -> None:
    # The fuzz battery's cases (tests/support/fuzzing/jpeg.py) in a child process: a crash is an exit code.
    support = Path(__file__).parent / "support"
    paths = os.pathsep.join([str(support), str(Path(dev.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", _FUZZ_CHILD, "260", "cuda" if torch.cuda.is_available() else "cpu", engine],
        capture_output=True, text=True, timeout=220, env={**os.environ, "PYTHONPATH": paths},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = {key.split("|")[1] for key in result["counts"]}
    assert outcomes <= {"device", "cpu", "cpu refused"}, result["counts"]
    assert sum(result["counts"].values()) == 260
    huge = {key.split("|")[1] for key in result["counts"] if key.startswith("huge")}
    assert huge == {"cpu refused"}, result["counts"]
    assert result["grown_kib"] < 1 << 20, result  # no case took a GiB


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_batch_is_ready_after_its_event_and_matches_the_cpu_run() -> None:
    size = (112, 112)
    blobs = [_blob(encode(photo(218, 178, seed=i))) for i in range(16)]
    boxes = [(40, 20, 138, 138)] * 16

    def on_cpu(j: int) -> torch.Tensor:
        return _full_path(blobs, boxes, size, j)

    decoder = dev.DeviceDecoder("cuda")
    on_gpu = decoder.decode(blobs, boxes, size, on_cpu)
    assert on_gpu.ready is not None and on_gpu.images.device.type == "cuda" and on_gpu.on_cpu == 0
    assert on_gpu.by_region == (16 if decoder.engine == "nvimagecodec" else 0)
    on_gpu.ready.wait()
    for j in range(16):
        assert float((on_gpu.images[j].cpu().float() - on_cpu(j).float()).abs().mean()) <= MAX_MEAN_ABS_DIFF
    if decoder.engine == "nvimagecodec":  # the hardware engine's region decode against its whole decode
        whole = dev.DeviceDecoder("cuda", roi=False).decode(blobs, boxes, size, on_cpu)
        whole.ready.wait()  # type: ignore[union-attr]
        assert float((whole.images.float() - on_gpu.images.float()).abs().mean()) <= MAX_MEAN_ABS_DIFF
    torchvision = dev.DeviceDecoder("cuda", engine="torchvision").decode(blobs, boxes, size, on_cpu)
    torchvision.ready.wait()  # type: ignore[union-attr]
    cpu = dev.DeviceDecoder("cpu").decode(blobs, boxes, size, on_cpu).images
    assert float((torchvision.images.cpu().float() - cpu.float()).abs().mean()) <= MAX_MEAN_ABS_DIFF


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_over_the_decode_budget_is_decoded_a_part_at_a_time_with_the_same_result(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    size = (24, 24)
    blobs = [_blob(encode(photo(60 + 4 * i, 50, seed=i))) for i in range(6)]
    boxes = [None, (2, 3, 40, 40), None, (0, 0, 60, 50), (5, 5, 30, 20), None]
    whole = _decoder(engine).decode(blobs, boxes, size, lambda j: pytest.fail(f"image {j} fell back"))
    parts: list[int] = []
    decoder = _decoder(engine)
    original = decoder._decode_part

    def counted(tensors: list[torch.Tensor], part_boxes: list) -> object:
        parts.append(len(tensors))
        return original(tensors, part_boxes)

    monkeypatch.setattr(decoder, "_decode_part", counted)
    monkeypatch.setattr(dev, "DECODE_BUDGET_BYTES", 2 * 3 * 64 * 50)  # about two images a part
    split = decoder.decode(blobs, boxes, size, lambda j: pytest.fail(f"image {j} fell back"))
    assert len(parts) >= 3 and sum(parts) == 6 and max(parts) <= 3
    assert torch.equal(split.images, whole.images) and split.by_region == whole.by_region


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_a_region_decode_gives_the_pixels_of_the_whole_decode_cropped(engine: str) -> None:
    # libjpeg-turbo's region decode against its whole decode: equal, not within a tolerance.
    size = (40, 40)
    blobs = [_blob(encode(photo(218, 178, seed=i), subsampling=i % 3)) for i in range(6)]
    blobs.append(_blob(encode(photo(90, 120, seed=6), "L")))
    blobs.append(_blob(encode(photo(218, 178, seed=7), progressive=True)))
    boxes = [(40, 20, 138, 138), (1, 3, 50, 61), (7, 9, 100, 33), (0, 0, 218, 178), None, (0, 0, 300, 10),
             (10, 10, 40, 40), (40, 20, 138, 138)]  # [5]: taller than its image
    fell_back: dict[bool, list[int]] = {True: [], False: []}
    batches = {}
    for roi in (True, False):
        def on_cpu(j: int, roi: bool = roi) -> torch.Tensor:
            fell_back[roi].append(j)
            return torch.full((3, *size), 7, dtype=torch.uint8)

        batches[roi] = _decoder(engine, roi=roi).decode(blobs, boxes, size, on_cpu)
    assert fell_back == {True: [5], False: [5]}
    assert batches[True].by_region == 6 and batches[False].by_region == 0
    assert torch.equal(batches[True].images, batches[False].images)
    for j in range(len(blobs)):
        if j != 5:
            assert int((batches[True].images[j].int() - _full_path(blobs, boxes, size, j).int()).abs().max()) <= 1, j


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_bytes_the_engine_cannot_parse_go_to_the_cpu_path_and_the_engine_stays(engine: str) -> None:
    good = encode(photo(40, 48, seed=5))
    sof = good.index(b"\xff\xc0")
    frame_only = good[:2] + good[sof : sof + 19] + b"\xff\xd9"  # a frame header and nothing to decode
    blobs = [_blob(good), _blob(frame_only), _blob(good)]
    assert dev.check_headers(*_joined([good, frame_only, good])).ok.tolist() == [True, True, True]
    calls: list[int] = []

    def on_cpu(j: int) -> torch.Tensor:
        calls.append(j)
        return torch.zeros((3, 16, 16), dtype=torch.uint8)

    decoder = _decoder(engine)
    batch = decoder.decode(blobs, [None, (0, 0, 20, 20), None], (16, 16), on_cpu)
    assert calls == [1] and batch.on_cpu == 1 and decoder.engine == engine
    assert torch.equal(batch.images[0], batch.images[2]) and batch.images[0].float().mean() > 10


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_a_region_decode_of_another_size_than_its_box_goes_to_the_cpu_path(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An engine that ignored the region would hand back the whole image as the crop: wrong pixels, said nowhere.
    good = encode(photo(60, 50, seed=11))
    blobs, boxes = [_blob(good), _blob(good)], [(4, 4, 30, 20), None]
    decoder = _decoder(engine)
    engine_decode = decoder._nvimagecodec.decode  # type: ignore[union-attr]

    def region_ignored(tensors: list[torch.Tensor], part_boxes: list | None, stream: object) -> object:
        images, cropped = engine_decode(tensors, None, stream)  # whole images...
        return images, np.array([box is not None for box in part_boxes or [None] * len(tensors)])  # ...called crops

    monkeypatch.setattr(decoder._nvimagecodec, "decode", region_ignored)
    calls: list[int] = []

    def on_cpu(j: int) -> torch.Tensor:
        calls.append(j)
        return _full_path(blobs, boxes, (16, 16), j)

    batch = decoder.decode(blobs, boxes, (16, 16), on_cpu)
    assert calls == [0] and batch.on_cpu == 1
    assert torch.equal(batch.images[0], _full_path(blobs, boxes, (16, 16), 0))


class _Event:
    """A CUDA event's two calls as the holder uses them: passed or not, and a wait that makes it pass."""

    def __init__(self) -> None:
        self.passed = self.waited = False

    def query(self) -> bool:
        return self.passed

    def synchronize(self) -> None:
        self.waited = self.passed = True


def test_engine_memory_is_held_until_its_event_passes_and_within_the_bound() -> None:
    # The nvImageCodec images a part's kernels read are let go without the host waiting, unless over the bound.
    held = dev._Held(most_bytes=250)
    events = [_Event() for _ in range(4)]
    held.add(events[0], "part 0", 100)
    held.add(events[1], "part 1", 100)
    assert [keep for _, keep, _ in held.parts] == ["part 0", "part 1"] and held.bytes == 200
    held.add(events[2], "part 2", 100)  # 300 > 250: the host waits for the oldest only
    assert events[0].waited and not events[1].waited
    assert [keep for _, keep, _ in held.parts] == ["part 1", "part 2"] and held.bytes == 200
    events[1].passed = True
    held.add(events[3], "part 3", 100)  # part 1 is done: let go without a wait; part 2 is not
    assert not events[1].waited and not events[2].waited
    assert [keep for _, keep, _ in held.parts] == ["part 2", "part 3"] and held.bytes == 200
