"""Pixel batches in reused buffers: a batch the user holds keeps its values; every layout reads the right rows."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from stoker.loading import make_loader
from stoker.shards import ShardDataset
from stoker.shards.pack import writer as writer_module
from stoker.shards.read.gather import BatchBuffers


def _pack(out: Path, digi: Path, shard_samples: int, batch_rows: int | None) -> Path:
    from stoker.packer import pack

    kwargs = {"record_batch_bytes": batch_rows * 3 * 8 * 8} if batch_rows else {}
    small = functools.partial(writer_module.ShardWriter, **kwargs)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writer_module, "ShardWriter", small)
        pack(digi, out, store="pixels", size=(8, 8), shard_samples=shard_samples, progress=False, workers=0)
    return out


@pytest.fixture(scope="module", params=["one shard, one record batch", "one shard, record batches of 3", "shards of 7"])
def layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, digi: Path) -> Path:
    out = tmp_path_factory.mktemp("layout")
    if request.param == "one shard, one record batch":
        return _pack(out, digi, 1000, None)
    if request.param == "one shard, record batches of 3":
        return _pack(out, digi, 1000, 3)
    return _pack(out, digi, 7, None)


def _reference_rows(ds: ShardDataset, indices: np.ndarray) -> np.ndarray:
    """Rows read one at a time from the Arrow files with pyarrow, the slow obvious way."""
    rows = []
    for i in indices.tolist():
        shard, row = ds.shards.locate(np.asarray([i]))
        table = pa.ipc.open_file(str(ds.shards.root / ds.shards.infos[int(shard[0])].name)).read_all()
        rows.append(np.frombuffer(table.column("image")[int(row[0])].as_py(), dtype=np.uint8))
    return np.stack(rows)


def test_the_layouts_are_what_they_say(layout: Path) -> None:
    ds = ShardDataset(layout)
    files = [ds.shards.file(s) for s in range(len(ds.shards.infos))]
    batches = [len(f.pixel_segments[1]) for f in files]
    assert (len(files), batches[0]) in {(1, 1), (1, len(ds) // 3 + (len(ds) % 3 > 0))} or len(files) > 3


@pytest.mark.parametrize("threads", [1, 2])
def test_gather_pixels_equals_row_by_row_on_every_layout(layout: Path, threads: int) -> None:
    ds = ShardDataset(layout)
    rng = np.random.default_rng(threads)
    n = len(ds)
    for indices in [rng.permutation(n), rng.integers(0, n, 50), np.arange(n), np.asarray([n - 1, 0, n - 1]), np.asarray([3])]:
        rows = ds.shards.gather_pixels(indices, threads=threads)
        assert rows.shape == (len(indices), ds.shards.row_bytes) and rows.flags.c_contiguous
        assert np.array_equal(rows, _reference_rows(ds, indices))
        out = np.full((len(indices), ds.shards.row_bytes), 7, dtype=np.uint8)
        ds.shards.read_pixels(indices, out, threads=threads)
        assert np.array_equal(out, _reference_rows(ds, indices))


def test_a_held_batch_keeps_its_values_while_later_batches_are_read(layout: Path) -> None:
    ds = ShardDataset(layout)
    n = len(ds)
    rng = np.random.default_rng(0)
    orders = [rng.permutation(n)[:16] for _ in range(12)]
    held_array = ds.shards.gather_pixels(orders[0])
    held_tensor = torch.from_numpy(ds.shards.gather_pixels(orders[1])).view(16, 3, 8, 8)
    held_view = ds.shards.gather_pixels(orders[2])[2:5]
    for order in orders[3:]:
        ds.shards.gather_pixels(order)  # dropped at once: its buffer may be reused
    assert np.array_equal(held_array, _reference_rows(ds, orders[0]))
    assert np.array_equal(held_tensor.reshape(16, -1).numpy(), _reference_rows(ds, orders[1]))
    assert np.array_equal(held_view, _reference_rows(ds, orders[2])[2:5])


def test_every_batch_of_an_epoch_kept_by_the_user_keeps_its_values(layout: Path) -> None:
    ds = ShardDataset(layout)
    loader = make_loader(ds, batch_size=6, shuffle=True, device="cpu")
    expected = {bytes(_reference_rows(ds, np.asarray([i]))[0]): int(ds.labels[i]) for i in range(len(ds))}
    kept = [(images, labels) for images, labels in loader]  # every batch held to the end of the epoch
    seen = [(image.numpy().tobytes(), label) for images, labels in kept for image, label in zip(images, labels.tolist(), strict=True)]
    assert sorted(key for key, _ in seen) == sorted(expected)  # every sample once, none overwritten
    assert all(expected[key] == label for key, label in seen)


def test_a_dropped_batch_buffer_is_reused_and_a_held_one_is_not() -> None:
    buffers = BatchBuffers(keep=3)
    first = buffers.take((4, 5))
    address = first.ctypes.data
    second = buffers.take((4, 5))
    assert second.ctypes.data != address  # first is held
    del first
    assert buffers.take((4, 5)).ctypes.data == address  # dropped: reused (the result is dropped at once)
    tensor = torch.from_numpy(buffers.take((4, 5))).view(20)  # a tensor over the buffer holds it
    assert buffers.take((4, 5)).ctypes.data != tensor.data_ptr()
    view = buffers.take((4, 5))[1:]
    assert all(buffers.take((4, 5)).ctypes.data != base for base in (view.base.ctypes.data, tensor.data_ptr()))  # type: ignore[union-attr]


def test_buffers_past_the_limit_are_made_fresh_and_a_new_shape_replaces_a_free_one() -> None:
    buffers = BatchBuffers(keep=2)
    held = [buffers.take((3,)) for _ in range(4)]
    assert len({a.ctypes.data for a in held}) == 4
    del held
    short = buffers.take((2,))  # a short last batch: takes the place of a free full-size buffer
    assert short.shape == (2,)
    assert buffers.take((2,)).ctypes.data != short.ctypes.data
