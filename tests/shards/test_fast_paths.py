"""The fast read paths equal the reference ones: threaded pixel gathers, batched JPEG decode, nvJPEG's CPU fallback."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image

from stoker.cores import usable_cores
from stoker.decode import jpeg
from stoker.errors import ConfigError, DecodeError
from stoker.loading import make_loader
from stoker.shards import ShardDataset
from stoker.shards.pack import writer as writer_module
from stoker.shards.read import dataset as dataset_module
from stoker.shards.read import gather as gather_module


@pytest.fixture(scope="module")
def many_batches(tmp_path_factory: pytest.TempPathFactory, digi: Path) -> Path:
    """Pixel shards of 7 rows, each in record batches of 2 rows: a random batch spans many of both."""
    from stoker.packer import pack

    out = tmp_path_factory.mktemp("many-batches")
    small = functools.partial(writer_module.ShardWriter, record_batch_bytes=2 * 3 * 8 * 8)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer_module, "ShardWriter", small)
        pack(digi, out, store="pixels", size=(8, 8), shard_samples=7, progress=False, workers=0)
    return out


def _reference_rows(ds: ShardDataset, indices: np.ndarray) -> np.ndarray:
    """Rows read one at a time from the Arrow files with pyarrow, the slow obvious way."""
    rows = []
    for i in indices.tolist():
        shard, row = ds.shards.locate(np.asarray([i]))
        table = pa.ipc.open_file(str(ds.shards.root / ds.shards.infos[int(shard[0])].name)).read_all()
        rows.append(np.frombuffer(table.column("image")[int(row[0])].as_py(), dtype=np.uint8))
    return np.stack(rows)


def test_the_test_set_spans_many_shards_and_record_batches(many_batches: Path) -> None:
    ds = ShardDataset(many_batches)
    ds.shards.all_labels()  # opens every shard
    assert len(ds.shards.infos) >= 4 and len(ds.shards._segment_views) >= 2 * len(ds.shards.infos)


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_a_threaded_gather_equals_reading_row_by_row(
    many_batches: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gather_module, "GATHER_SPLIT_BYTES", 3 * 8 * 8)  # split even these tiny batches
    ds = ShardDataset(many_batches)
    rng = np.random.default_rng(threads)
    n = len(ds)
    cases = [rng.permutation(n), rng.integers(0, n, 50), np.arange(n), np.arange(2, 6), np.asarray([n - 1, 0, n - 1]),
             np.asarray([3])]
    for indices in cases:
        out = np.full((len(indices), ds.shards.row_bytes), 7, dtype=np.uint8)
        ds.shards.read_pixels(indices, out, threads=threads)
        assert np.array_equal(out, _reference_rows(ds, indices))
    ds.shards.read_pixels(np.zeros(0, dtype=np.int64), np.zeros((0, ds.shards.row_bytes), np.uint8), threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_fancy_index_over_every_shard_equals_reading_row_by_row(
    many_batches: Path, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gather_module, "GATHER_SPLIT_BYTES", 3 * 8 * 8)  # two threads split even these tiny batches
    ds = ShardDataset(many_batches)
    ds.shards.gather_threads = threads
    rng = np.random.default_rng(0)
    n = len(ds)
    kept = []  # batches still held: a reused buffer must never be one of them
    for indices in [rng.permutation(n), rng.integers(0, n, 50), np.arange(n), np.arange(2, 6), np.asarray([n - 1, 0, n - 1]),
                    np.asarray([3]), np.zeros(0, dtype=np.int64)] * 3:
        rows = ds.shards.gather_pixels(indices)
        kept.append((indices, rows))
        assert rows.shape == (len(indices), ds.shards.row_bytes) and rows.flags.c_contiguous and rows.flags.writeable
    for indices, rows in kept:
        if len(indices):
            assert np.array_equal(rows, _reference_rows(ds, indices))
    for bad in ([n], [-1], [0, n + 5]):
        with pytest.raises(IndexError, match="out of range"):
            ds.shards.gather_pixels(np.asarray(bad))


_AFTER_CLOSE = """
import gc, sys
import numpy as np
from stoker.shards import ShardDataset
ds = ShardDataset(sys.argv[1])
order = np.arange(len(ds))[::-1].copy()
expected = ds.shards.gather_pixels(order)
span = ds.shards._span
segment, local = ds.shards._segments(order)
where, rows = span._first[segment] + local * span._per_row, span.rows
ds.shards.close()  # closes every shard file; the span's array still points into their maps
del span
gc.collect()
assert np.array_equal(rows[where], expected)  # a freed map crashes here
assert np.array_equal(ds.shards.gather_pixels(order), expected)  # reopened
"""


def test_the_row_span_keeps_the_memory_maps_alive_after_close(many_batches: Path) -> None:
    # In a child process: a map freed too early is a crash, which must fail this test, not the suite.
    done = subprocess.run([sys.executable, "-c", _AFTER_CLOSE, str(many_batches)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_gather_in_a_forked_worker_makes_its_own_threads(many_batches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = ShardDataset(many_batches)
    gather_module.gather_pool()  # a pool in this process, which a forked child must not use
    loader = make_loader(ds, batch_size=16, num_workers=2, backend="process", device="cpu", persistent_workers=False)
    seen = [int(label) for _, labels in loader for label in labels]
    assert sorted(seen) == sorted(ds.labels.tolist())


@pytest.mark.parametrize(("backend", "workers", "threads"),
                         [("process", 0, 1), ("process", 0, 2), ("thread", 2, 2), ("process", 2, 2)])
def test_every_pixel_sample_once_per_epoch_whatever_the_gather(
    many_batches: Path, backend: str, workers: int, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gather_module, "GATHER_SPLIT_BYTES", 3 * 8 * 8)
    ds = ShardDataset(many_batches)
    ds.shards.gather_threads = threads
    expected = {bytes(_reference_rows(ds, np.asarray([i]))[0]): int(ds.labels[i]) for i in range(len(ds))}
    loader = make_loader(ds, batch_size=8, shuffle=True, num_workers=workers, backend=backend,  # type: ignore[arg-type]
                         device="cpu", persistent_workers=False)
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = []
        for images, labels in loader:
            for image, label in zip(images, labels.tolist(), strict=True):
                key = image.numpy().tobytes()
                assert expected[key] == label
                seen.append(key)
        assert sorted(seen) == sorted(expected)  # every sample once (the images are distinct)


def test_pixel_shards_default_to_one_fancy_index_in_the_training_process(many_batches: Path) -> None:
    ds = ShardDataset(many_batches)
    assert ds.loader_defaults == {"backend": "process", "num_workers": 0}
    assert ds.shards.gather_threads is None  # 1 or 2 copying threads by the machine's load
    calls: list[str] = []
    for name in ("read_batch", "read_pixels"):
        method = getattr(ds.shards, name)
        setattr(ds.shards, name, lambda *a, _m=method, _n=name, **k: (calls.append(_n), _m(*a, **k))[1])
    ds.__getitems__(np.arange(len(ds))[::-1].copy())
    assert calls == ["read_batch"]  # labels and pixels with one look-up; not a row-by-row copy
    ds.shards.gather_threads = 2
    ds.__getitems__(np.arange(len(ds))[::-1].copy())
    assert calls[-1] == "read_batch"  # its threads copy into a reused buffer


def test_a_batch_read_is_the_labels_and_pixels_read_apart(many_batches: Path) -> None:
    ds = ShardDataset(many_batches)
    n = len(ds)
    for indices in [np.random.default_rng(1).permutation(n), np.arange(2, 6), np.asarray([3]), np.zeros(0, dtype=np.int64)]:
        labels, pixels = ds.shards.read_batch(indices)
        assert np.array_equal(labels, ds.shards.read_labels(indices))
        assert np.array_equal(pixels, ds.shards.gather_pixels(indices))
    with pytest.raises(IndexError, match="out of range"):
        ds.shards.read_batch(np.asarray([n]))
    out = np.zeros((n, 2 * ds.shards.row_bytes), dtype=np.uint8)[:, ::2]  # a caller's buffer torch cannot fill in place
    ds.shards.read_pixels(np.arange(n)[::-1].copy(), out, threads=2)
    assert np.array_equal(out, _reference_rows(ds, np.arange(n)[::-1].copy()))


@pytest.mark.parametrize(("cores", "busy", "threads"), [(2, 0.9, 2), (2, 1.5, 2), (2, 2.1, 1), (1, 0.0, 1), (8, 6.0, 2),
                                                      (8, 7.6, 1)])
def test_a_second_copying_thread_only_while_a_core_is_idle(cores: int, busy: float, threads: int) -> None:
    assert gather_module.copy_threads_for(cores, busy) == threads


def test_the_first_look_takes_the_load_average_and_a_look_lasts_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gather_module, "usable_cores", lambda: 2)
    monkeypatch.setattr(gather_module.os, "getloadavg", lambda: (2.1, 2.1, 2.1))
    monkeypatch.setattr(gather_module, "_seen", None)
    assert gather_module.idle_copy_threads() == 1
    monkeypatch.setattr(gather_module.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert gather_module.idle_copy_threads() == 1  # looked again only after LOAD_CHECK_S


def test_the_readers_own_copying_helpers_are_not_counted_as_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gather_module, "usable_cores", lambda: 2)
    monkeypatch.setattr(gather_module, "_busy_seconds", lambda: 100.0)
    monkeypatch.setattr(gather_module, "_helper_cpu", [5.0])

    def threads_after(busy_before: float, helpers_before: float) -> int:
        two_seconds_ago = time.monotonic() - 2.0
        gather_module._seen = gather_module._CpuSample(os.getpid(), two_seconds_ago, busy_before, helpers_before, 1)
        return gather_module.idle_copy_threads()

    monkeypatch.setattr(gather_module, "_seen", None)
    # 3.6 busy seconds in 2 s: 1.8 cores, past 1.5; but 1.0 of them was the reader's own helper
    assert threads_after(96.4, 4.0) == 2
    assert threads_after(96.4, 5.0) == 1  # the helper did nothing: 1.8 cores busy besides it
    assert threads_after(99.0, 5.0) == 2  # 0.5 cores busy


def test_copying_helpers_count_their_cpu_time() -> None:
    rows = np.random.default_rng(0).integers(0, 255, (4096, 4096), dtype=np.uint8)
    out = np.empty_like(rows)
    before = gather_module._helper_cpu[0]
    for _ in range(5):
        gather_module.take_rows(rows, np.arange(len(rows))[::-1].copy(), out, threads=2)
    assert np.array_equal(out, rows[::-1])
    assert gather_module._helper_cpu[0] > before


@pytest.mark.skipif("OpenMP" not in torch.__config__.parallel_info(), reason="torch without its OpenMP runtime keeps one count for the process")
def test_copying_threads_run_torch_on_one_thread_whatever_the_process_set() -> None:
    """A process at torch's default threads (the cores) must not have each copying thread spread over them all."""
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()
    started = threading.Event()

    def copy(lo: int, hi: int) -> None:
        with lock:
            seen.append((threading.get_ident(), torch.get_num_threads()))
        started.set()
        time.sleep(0.02)  # so that a helper takes parts too

    def elsewhere() -> None:  # a thread of the user's, running while the copy does
        started.wait(10)
        with lock:
            seen.append((-1, torch.get_num_threads()))

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        other = threading.Thread(target=elsewhere)
        other.start()
        gather_module.split_copy(8, 2, gather_module.GATHER_SPLIT_BYTES, copy)
        other.join(10)
        assert torch.get_num_threads() == 3  # the caller's own count is back
    finally:
        torch.set_num_threads(before)
    copiers = {ident for ident, _ in seen if ident != -1}
    assert len(copiers) == 2, seen  # the caller and a helper both copied
    assert [count for ident, count in seen if ident != -1] == [1] * 8
    assert (-1, 3) in seen  # another thread keeps the process's count meanwhile


@pytest.mark.skipif(not 2 <= usable_cores() <= 4, reason="spins a process on every core: 2 to 4 cores")
def test_other_processes_busy_on_every_core_mean_one_copying_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gather_module, "LOAD_CHECK_S", 0.2)
    monkeypatch.setattr(gather_module, "_seen", None)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores())]
    try:
        time.sleep(0.5)
        gather_module.idle_copy_threads()  # the first look: the load average
        counts = []
        for _ in range(3):
            time.sleep(0.3)
            counts.append(gather_module.idle_copy_threads())
        assert counts == [1, 1, 1]
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(timeout=10)


# -- encoded JPEG shards -----------------------------------------------------------------


def _photo(i: int, height: int, width: int) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rng = np.random.default_rng(i)
    image = np.stack([128 + 90 * np.sin(x / (5 + i % 7) + y / 17), 128 + 80 * np.cos(y / 9 - x / 23),
                      x * 200 / width + 20], axis=-1) + rng.normal(0, 5, (height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def jpeg_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Class folders of JPEGs of every kind the fast path meets (and one PNG and one CMYK JPEG it does not take)."""
    root = tmp_path_factory.mktemp("jpegs")
    kinds: list[tuple[str, dict[str, object]]] = [
        ("RGB", {}), ("RGB", {"progressive": True}), ("L", {}), ("RGB", {"subsampling": 0}), ("CMYK", {}),
    ]
    for i in range(30):
        folder = root / str(i % 3)
        folder.mkdir(exist_ok=True)
        mode, options = kinds[i % len(kinds)]
        image = Image.fromarray(_photo(i, 72 + 2 * (i % 4), 64 + 3 * (i % 3))).convert(mode)
        if i == 7:
            image.save(folder / f"{i:03d}.png")
        else:
            image.save(folder / f"{i:03d}.jpg", quality=90, **options)  # type: ignore[arg-type]
    return root


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory: pytest.TempPathFactory, jpeg_folders: Path) -> Callable[..., Path]:
    from stoker.packer import pack

    cache: dict[str, Path] = {}

    def make(size: tuple[int, int], crop: tuple[int, int, int, int] | None = None) -> Path:
        key = f"{size}{crop}"
        if key not in cache:
            out = tmp_path_factory.mktemp("jpeg-shards")
            pack(jpeg_folders, out, store="encoded", size=size, crop=crop, shard_samples=8, progress=False, workers=0)
            cache[key] = out
        return cache[key]

    return make


@pytest.mark.skipif(not jpeg.available(), reason="simplejpeg is not installed")
@pytest.mark.parametrize(("size", "crop"), [((24, 20), None), ((16, 16), (8, 4, 56, 56)), ((60, 60), (0, 0, 70, 64)),
                                            ((40, 36), None)])
def test_the_batched_jpeg_path_is_within_two_grey_levels_of_full_decode(
    jpeg_shards: Callable[..., Path], size: tuple[int, int], crop: tuple[int, int, int, int] | None
) -> None:
    root = jpeg_shards(size, crop)
    fast, full = ShardDataset(root), ShardDataset(root, decoder="full")
    order = np.random.default_rng(0).permutation(len(fast))
    for indices in (order, order[:5], np.arange(len(fast))):
        a, b = fast.__getitems__(indices), full.__getitems__(indices)
        assert torch.equal(a.labels, b.labels) and a.images.shape == b.images.shape == (len(indices), 3, *size)
        assert a.images.is_contiguous()
        for j in range(len(indices)):
            assert float((a.images[j].float() - b.images[j].float()).abs().mean()) <= 2.0
        for j, i in enumerate(indices[:6].tolist()):  # a batch read equals a sample read
            assert torch.equal(a.images[j], fast[i][0])


def test_encoded_jpeg_shards_default_to_loader_threads_unless_a_python_transform_runs(
    jpeg_shards: Callable[..., Path],
) -> None:
    root = jpeg_shards((24, 20))
    assert ShardDataset(root).mostly_jpeg()  # one PNG among 30 JPEGs
    assert ShardDataset(root).loader_defaults["backend"] == "thread"
    assert ShardDataset(root, transform=lambda image: image).loader_defaults["backend"] == "process"


@pytest.mark.parametrize(("jpegs", "backend"), [(0, "process"), (4, "process"), (12, "thread")])
def test_encoded_shards_of_mostly_png_default_to_worker_processes_under_pillow(
    tmp_path: Path, jpegs: int, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.decode import image as decode
    from stoker.packer import pack

    monkeypatch.setattr(decode, "_spng_decode", None)  # imagecodecs missing: PNGs decode with Pillow

    folder = tmp_path / "src" / "0"
    folder.mkdir(parents=True)
    for i in range(16):
        Image.fromarray(_photo(i, 20, 20)).save(folder / (f"{i:02d}.jpg" if i < jpegs else f"{i:02d}.png"))
    pack(tmp_path / "src", tmp_path / "shards", store="encoded", size=(16, 16), progress=False, workers=0)
    ds = ShardDataset(tmp_path / "shards")
    assert ds.mostly_jpeg() == (backend == "thread")
    assert ds.loader_defaults == {"backend": backend}  # the workers: the machine's share
    assert ds.subset([0, 1]).loader_defaults == ds.loader_defaults
    images, _ = next(iter(make_loader(ds, batch_size=8, device="cpu", persistent_workers=False)))
    assert images.shape == (8, 3, 16, 16)


def test_decoder_full_is_the_reference_path(jpeg_shards: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root = jpeg_shards((24, 20))
    calls: list[int] = []
    monkeypatch.setattr("stoker.decode.jpeg.decode_jpeg_resized", lambda *a: calls.append(1))
    full = ShardDataset(root, decoder="full")
    full.__getitems__(np.arange(len(full)))
    full[0]
    assert calls == []
    with pytest.raises(ConfigError, match="decoder must be one of"):
        ShardDataset(root, decoder="fast")  # type: ignore[arg-type]


@pytest.mark.parametrize(("backend", "workers"), [("process", 0), ("thread", 2), ("process", 2)])
def test_every_jpeg_sample_once_per_epoch(jpeg_shards: Callable[..., Path], backend: str, workers: int) -> None:
    ds = ShardDataset(jpeg_shards((16, 16), (8, 4, 56, 56)))
    reference = ShardDataset(ds.root, decoder="full")
    loader = make_loader(ds, batch_size=7, shuffle=True, num_workers=workers, backend=backend,  # type: ignore[arg-type]
                         device="cpu", persistent_workers=False)
    labels_seen = []
    images_seen = []
    for images, labels in loader:
        labels_seen.extend(labels.tolist())
        images_seen.append(images)
    assert sorted(labels_seen) == sorted(ds.labels.tolist())
    everything = torch.cat(images_seen)
    assert everything.shape == (len(ds), 3, 16, 16)
    full = reference.__getitems__(np.arange(len(ds))).images.float()
    # every image of the epoch is near exactly one distinct reference image
    nearest = [int(((full - image.float()).abs().mean(dim=(1, 2, 3))).argmin()) for image in everything]
    assert sorted(nearest) == list(range(len(ds)))


def _damage_row(root: Path, shard_name: str, row: int) -> None:
    """Flip a byte inside one row's image bytes (the CRC-32 check must catch it)."""
    path = root / shard_name
    table = pa.ipc.open_file(str(path)).read_all()
    data = table.column("image")[row].as_py()
    raw = bytearray(path.read_bytes())
    start = raw.find(data)
    assert start >= 0
    raw[start + len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_bad_rows_are_raised_or_skipped_by_the_batched_path(
    jpeg_shards: Callable[..., Path], copy_of: Callable[[Path, Path], Path], tmp_path: Path
) -> None:
    root = copy_of(jpeg_shards((24, 20)), tmp_path / "damaged")
    ds = ShardDataset(root)
    name = ds.shards.infos[0].name
    _damage_row(root, name, 2)
    with pytest.raises(DecodeError, match=f"{name} row 2"):
        ShardDataset(root).__getitems__(np.arange(8))
    skipping = ShardDataset(root, on_error="skip")
    batch = skipping.__getitems__(np.arange(8))
    assert len(batch) == 7 and len(batch.skipped) == 1 and "CRC-32" in batch.skipped[0].reason
    clean = ShardDataset(root, decoder="full", on_error="skip").__getitems__(np.arange(8))
    assert torch.equal(batch.labels, clean.labels)
    assert float((batch.images.float() - clean.images.float()).abs().mean()) <= 2.0


def test_a_jpeg_that_only_the_full_path_rejects_is_skipped_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.packer import pack

    folder = tmp_path / "src" / "0"
    folder.mkdir(parents=True)
    for i in range(6):
        Image.fromarray(_photo(i, 40, 40)).save(folder / f"{i}.jpg", quality=90)
    out = tmp_path / "shards"
    pack(tmp_path / "src", out, store="encoded", size=(20, 20), progress=False, workers=0, shuffle=False)
    ds = ShardDataset(out, on_error="skip")
    real = jpeg.decode_sample

    def reject_row_3(data: object, name: str, box: object = None) -> torch.Tensor:
        if " row 3:" in name:
            raise DecodeError(f"{name}: rejected")
        return real(data, name, box)  # type: ignore[arg-type]

    monkeypatch.setattr(jpeg, "decode_sample", reject_row_3)  # reader and verify decode through stoker.decode.jpeg
    monkeypatch.setattr(jpeg, "decode_jpeg_resized", lambda *args: None)
    monkeypatch.setattr("stoker.shards.read.dataset.decode_jpegs_into", lambda blobs, boxes, size, out: [3])
    batch = ds.__getitems__(np.arange(6))
    assert len(batch) == 5 and [s.key for s in batch.skipped] == ["train[3]"]
    assert batch.labels.tolist() == [int(ds.labels[i]) for i in (0, 1, 2, 4, 5)]


# -- nvJPEG: the CPU fallback runs everywhere -------------------------------------------------


def test_nvjpeg_without_cuda_falls_back_to_the_cpu_image_by_image(jpeg_shards: Callable[..., Path]) -> None:
    root = jpeg_shards((16, 16), (8, 4, 56, 56))
    nv = ShardDataset(root, decoder="nvjpeg", decode_device="cpu" if torch.cuda.is_available() else "cuda")
    assert nv.loader_defaults == {"backend": "thread", "num_workers": 1}
    indices = np.random.default_rng(1).permutation(len(nv))
    a, b = nv.__getitems__(indices), ShardDataset(root).__getitems__(indices)
    assert torch.equal(a.labels, b.labels) and a.images.device.type == "cpu"
    assert torch.equal(a.images, b.images)  # the fallback is the CPU path itself
    loader = make_loader(nv, batch_size=8, device="cpu", **nv.loader_defaults)
    assert sorted(int(x) for _, labels in loader for x in labels) == sorted(nv.labels.tolist())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback taken where torch sees no CUDA device")
def test_nvjpeg_without_cuda_says_so_once_per_process(
    jpeg_shards: Callable[..., Path], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decoder="nvjpeg" with no CUDA keeps its CPU fallback and says so once, whatever the sets and batches."""
    monkeypatch.setattr(dataset_module, "_said_no_cuda", threading.Event())  # a fresh process's state
    root = jpeg_shards((16, 16), (8, 4, 56, 56))
    with caplog.at_level("WARNING", logger="stoker"):
        for _ in range(2):
            nv = ShardDataset(root, decoder="nvjpeg")
            for loader_batch in make_loader(nv, batch_size=8, device="cpu", **nv.loader_defaults):
                assert loader_batch[0].device.type == "cpu"
    told = [r.getMessage() for r in caplog.records if "decoder='nvjpeg'" in r.getMessage()]
    assert len(told) == 1, told
    assert str(root) in told[0] and "decoder='auto'" in told[0] and "CUDA build of torch" in told[0]


def test_nvjpeg_fallback_skips_bad_rows(
    jpeg_shards: Callable[..., Path], copy_of: Callable[[Path, Path], Path], tmp_path: Path
) -> None:
    root = copy_of(jpeg_shards((24, 20)), tmp_path / "damaged")
    _damage_row(root, ShardDataset(root).shards.infos[0].name, 1)
    batch = ShardDataset(root, decoder="nvjpeg", on_error="skip").__getitems__(np.arange(8))
    assert len(batch) == 7 and len(batch.skipped) == 1


def test_auto_without_cuda_decodes_on_the_cpu_and_chooses_nothing(jpeg_shards: Callable[..., Path]) -> None:
    root = jpeg_shards((16, 16), (8, 4, 56, 56))
    auto = ShardDataset(root, decode_device="cpu" if torch.cuda.is_available() else "cuda")
    a, b = auto.__getitems__(np.arange(10)), ShardDataset(root).__getitems__(np.arange(10))
    assert a.images.device.type == "cpu" and torch.equal(a.images, b.images) and auto.decode_choice is None


def test_the_auto_measurement_times_both_paths_and_chooses_the_faster(jpeg_shards: Callable[..., Path]) -> None:
    # The measurement itself, with the device path on CPU tensors (a CUDA device runs the same code on its stream).
    root = jpeg_shards((16, 16), (8, 4, 56, 56))
    ds = ShardDataset(root)
    blobs, _, boxes = zip(*(ds.shards.checked_bytes(0, r) for r in range(8)), strict=True)
    choice = ds._measure_decoders(list(blobs), list(boxes), (16, 16), torch.device("cpu"))
    assert choice["gpu_img_per_s"] > 0 and choice["cpu_img_per_s"] > 0 and choice["batch"] == 8
    faster = "gpu" if choice["gpu_img_per_s"] >= choice["cpu_img_per_s"] else "cpu"
    assert choice["decoder"] == faster and f"{choice['cpu_threads']} CPU loader thread" in choice["reason"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_on_cuda_chooses_once_and_the_loader_delivers_ready_batches(
    jpeg_shards: Callable[..., Path], tmp_path: Path
) -> None:
    root = jpeg_shards((16, 16), (8, 4, 56, 56))
    auto, full = ShardDataset(root), ShardDataset(root, decoder="full")
    loader = make_loader(auto, batch_size=8, device="cuda", **auto.loader_defaults)
    seen = 0
    for images, labels in loader:
        assert images.device.type == "cuda"
        seen += len(labels)
    assert seen == len(auto) and auto.decode_choice is not None and auto.decode_choice["decoder"] in ("gpu", "cpu")
    from torch import nn

    from stoker.train import Scenario, SmallCNN, fit

    train = ShardDataset(root)
    model = SmallCNN(train.num_classes, width=8)
    history = fit(Scenario(model, torch.optim.SGD(model.parameters(), lr=0.01), nn.CrossEntropyLoss(),
                           make_loader(train, batch_size=8, device="cuda", **train.loader_defaults), None, epochs=1,
                           device="cuda", log_dir=tmp_path, name="auto", progress=False, loggers=("csv",)))
    record = json.loads((history.run_dir / "run.json").read_text())  # type: ignore[operator]
    assert record["decode"] == train.decode_choice and record["decode"]["device"].startswith("cuda")
    nv = ShardDataset(root, decoder="nvjpeg")
    a, b = nv.__getitems__(np.arange(12)), full.__getitems__(np.arange(12))
    assert a.ready is not None and a.images.device.type == "cuda"
    assert float((a.images.cpu().float() - b.images.float()).abs().mean()) <= 2.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvjpeg_on_the_gpu_is_within_two_grey_levels(jpeg_shards: Callable[..., Path]) -> None:
    root = jpeg_shards((16, 16), (8, 4, 56, 56))
    a = ShardDataset(root, decoder="nvjpeg").__getitems__(np.arange(12))
    b = ShardDataset(root, decoder="full").__getitems__(np.arange(12))
    assert a.images.device.type == "cuda" and torch.equal(a.labels, b.labels)
    for j in range(12):
        assert float((a.images[j].cpu().float() - b.images[j].float()).abs().mean()) <= 2.0


def test_png_rows_of_encoded_shards_still_decode(packed: Callable[..., Path]) -> None:
    root = packed(store="encoded", size=(8, 8), shard_samples=7, valid=0.25)
    fast, full = ShardDataset(root), ShardDataset(root, decoder="full")
    idx = np.arange(len(fast))
    assert torch.equal(fast.__getitems__(idx).images, full.__getitems__(idx).images)  # PNG: the full path, exactly


@pytest.mark.parametrize(("pngs", "backend"), [(16, "thread"), (8, "thread"), (4, "process")])
def test_encoded_png_shards_default_to_loader_threads_where_libspng_decodes(tmp_path: Path, pngs: int, backend: str) -> None:
    """libspng releases the GIL: mostly PNG (or PNG and JPEG) sets read on threads; other formats on processes."""
    from stoker.decode.image import png_decoder
    from stoker.packer import pack

    if png_decoder() != "libspng":
        pytest.skip("imagecodecs is not installed: PNGs decode with Pillow")
    folder = tmp_path / "src" / "0"
    folder.mkdir(parents=True)
    for i in range(16):
        Image.fromarray(_photo(i, 20, 20)).save(folder / (f"{i:02d}.png" if i < pngs else f"{i:02d}.bmp"))
    pack(tmp_path / "src", tmp_path / "shards", store="encoded", size=(16, 16), progress=False, workers=0)
    ds = ShardDataset(tmp_path / "shards")
    assert not ds.mostly_jpeg() and ds.loader_defaults["backend"] == backend
    assert ShardDataset(tmp_path / "shards", transform=lambda image: image).loader_defaults["backend"] == "process"
    images, _ = next(iter(make_loader(ds, batch_size=8, device="cpu", persistent_workers=False)))
    assert images.shape == (8, 3, 16, 16)
