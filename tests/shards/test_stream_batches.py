"""A ShardStream whose reads are the loader's batches hands them over whole: the same batches as item by item."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch

from stoker.errors import ConfigError
from stoker.loading import make_loader
from stoker.loading.collate import collate
from stoker.shards import ShardStream

BATCH = 3  # 40 samples: every reader ends on a short batch (20 each for 2 workers)


def _damage_row(root: Path, shard_name: str, row: int) -> None:
    """Flip a byte inside one row's image bytes (the PNG's CRC check must catch it)."""
    path = root / shard_name
    data = pa.ipc.open_file(str(path)).read_all().column("image")[row].as_py()
    raw = bytearray(path.read_bytes())
    start = raw.find(data)
    assert start >= 0
    raw[start + len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def _batches(stream: ShardStream, workers: int, drop_last: bool, item_by_item: bool, epochs: int = 2) -> list[Any]:
    # A collate other than the stream's own (equal in what it does) makes the loader read item by item.
    kwargs: dict[str, Any] = {"collate_fn": functools.partial(collate)} if item_by_item else {}
    loader = make_loader(stream, batch_size=BATCH, num_workers=workers, device="cpu", drop_last=drop_last, seed=3, **kwargs)
    assert loader._whole_batches is not item_by_item  # the path this test means to compare
    out = []
    for _ in range(epochs):
        out.append([(images.clone(), labels.clone()) for images, labels in loader])
        out[-1].append(len(loader.skipped))
    return out


@pytest.mark.parametrize(("store", "workers", "drop_last"), [("pixels", 0, False), ("pixels", 2, True),
                                                              ("encoded", 0, True), ("encoded", 2, False)])
def test_whole_batches_equal_the_item_by_item_ones_bad_samples_included(
    packed: Callable[..., Path], copy_of: Callable[[Path, Path], Path], tmp_path: Path,
    store: str, workers: int, drop_last: bool,
) -> None:
    root = copy_of(packed(store=store, size=(12, 10), shard_samples=7), tmp_path / "set")
    on_error = "raise"
    if store == "encoded":  # two bad rows: their markers count as items, so the batch edges must match
        on_error = "skip"
        first = ShardStream(root).dataset.shards.infos
        _damage_row(root, first[0].name, 2)
        _damage_row(root, first[3].name, 5)

    def stream() -> ShardStream:
        return ShardStream(root, shuffle_buffer=5, read_rows=BATCH, seed=7, on_error=on_error)  # type: ignore[arg-type]

    whole = _batches(stream(), workers, drop_last, item_by_item=False)
    items = _batches(stream(), workers, drop_last, item_by_item=True)
    assert len(whole) == len(items)
    for epoch_whole, epoch_items in zip(whole, items, strict=True):
        assert epoch_whole[-1] == epoch_items[-1]  # as many skipped
        assert len(epoch_whole) == len(epoch_items)
        for (a_images, a_labels), (b_images, b_labels) in zip(epoch_whole[:-1], epoch_items[:-1], strict=True):
            assert torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)
    if store == "encoded":
        assert whole[0][-1] == 2
    counted = sum(len(labels) for labels in (b[1] for b in whole[0][:-1]))
    assert counted <= 40 and (drop_last or counted == 40 - whole[0][-1])


def test_reads_of_another_size_are_read_item_by_item(packed: Callable[..., Path]) -> None:
    stream = ShardStream(packed(store="pixels", size=(12, 10), shard_samples=7), read_rows=BATCH + 1)
    loader = make_loader(stream, batch_size=BATCH, num_workers=0, device="cpu")
    assert not loader._whole_batches
    assert sum(len(labels) for _, labels in loader) == 40
    with pytest.raises(ConfigError, match="read item by item"):
        next(stream.batches_from(0, BATCH))


def test_a_stream_made_without_read_rows_reads_the_first_loaders_batches(packed: Callable[..., Path]) -> None:
    stream = ShardStream(packed(store="pixels", size=(12, 10), shard_samples=7))
    assert stream.read_rows == 256
    first = make_loader(stream, batch_size=BATCH, num_workers=0, device="cpu")
    assert first._whole_batches and stream.read_rows == BATCH
    other = make_loader(stream, batch_size=BATCH + 2, num_workers=0, device="cpu")  # it keeps the first's reads
    assert not other._whole_batches and stream.read_rows == BATCH
    assert sum(len(labels) for _, labels in first) == sum(len(labels) for _, labels in other) == 40


def test_a_pixel_stream_is_read_in_the_training_process_by_default(packed: Callable[..., Path]) -> None:
    from stoker.loading.workers import default_workers

    pixels = ShardStream(packed(store="pixels", size=(12, 10), shard_samples=7))
    encoded = ShardStream(packed(store="encoded", size=(12, 10), shard_samples=7))
    assert make_loader(pixels, batch_size=BATCH, device="cpu").num_workers == 0  # a copy: shipping it costs more
    # a stream dealt by batch: the machine's share, as map-style data (stoker.loading.workers)
    assert make_loader(encoded, batch_size=BATCH, device="cpu").num_workers == default_workers({}, accelerator=False)
    assert make_loader(pixels, batch_size=BATCH, device="cpu", num_workers=2).num_workers == 2  # a caller's choice stands


@pytest.mark.parametrize("gather_threads", [1, 2])  # 2: a batch over many shards is copied into a reused buffer
def test_whole_batches_held_by_the_caller_are_never_overwritten(packed: Callable[..., Path], gather_threads: int) -> None:
    root = packed(store="pixels", size=(12, 10), shard_samples=7)
    stream = ShardStream(root, seed=5)
    stream.dataset.shards.gather_threads = gather_threads
    held = list(make_loader(stream, batch_size=BATCH, num_workers=0, device="cpu"))  # not copied
    copied = [(images.clone(), labels.clone()) for images, labels in
              make_loader(ShardStream(root, seed=5), batch_size=BATCH, num_workers=0, device="cpu",
                          collate_fn=functools.partial(collate))]
    assert len(held) == len(copied)
    for (images, labels), (want_images, want_labels) in zip(held, copied, strict=True):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
