"""ShardStream: every sample exactly once per epoch, for any workers x ranks; order follows the epoch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import ConfigError
from stoker.loading import make_loader
from stoker.shards import ShardStream, stream_order
from stoker.shards.read.stream import shard_groups


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=8),
    world_size=st.integers(min_value=1, max_value=4),
    num_workers=st.integers(min_value=1, max_value=4),
    buffer=st.integers(min_value=1, max_value=50),
    shuffle=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**40),
    epoch=st.integers(min_value=0, max_value=1000),
    at_once=st.integers(min_value=1, max_value=9),
)
def test_every_sample_exactly_once_for_any_workers_and_ranks(
    sizes: list[int], world_size: int, num_workers: int, buffer: int, shuffle: bool, seed: int, epoch: int, at_once: int
) -> None:
    total = sum(sizes)
    per_rank = []
    everything = []
    for rank in range(world_size):
        mine = [
            stream_order(sizes, seed=seed, epoch=epoch, shuffle=shuffle, shuffle_buffer=buffer,
                         rank=rank, world_size=world_size, worker=w, num_workers=num_workers, shards_at_once=at_once)
            for w in range(num_workers)
        ]
        per_rank.append(sum(len(m) for m in mine))
        everything.extend(np.concatenate(mine).tolist())
    assert sorted(everything) == list(range(total))
    assert max(per_rank) - min(per_rank) <= 1  # ranks get equal shares (DDP needs it)


def test_shard_order_and_rows_change_with_the_epoch_and_not_otherwise() -> None:
    kwargs = dict(seed=7, shuffle=True, shuffle_buffer=16, rank=0, world_size=1, worker=0, num_workers=1)
    first = stream_order([50, 50, 50], epoch=0, **kwargs)  # type: ignore[arg-type]
    assert np.array_equal(first, stream_order([50, 50, 50], epoch=0, **kwargs))  # type: ignore[arg-type]
    assert not np.array_equal(first, stream_order([50, 50, 50], epoch=1, **kwargs))  # type: ignore[arg-type]
    assert not np.array_equal(first, np.arange(150))
    # A buffer keeps reads local: no row leaves its shard's neighbourhood by much.
    assert np.array_equal(stream_order([5, 5], epoch=0, **{**kwargs, "shuffle": False}), np.arange(10))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        stream_order([5], epoch=0, **{**kwargs, "rank": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(("sizes", "buffer"), [([50, 50, 50], 150), ([50, 50, 50], 4096), ([3, 4], 7), ([1], 1), ([9, 9], 8)])
@pytest.mark.parametrize("workers", [1, 3])
def test_a_buffer_that_holds_every_row_gives_the_order_of_the_buffer_loop(sizes: list[int], buffer: int, workers: int) -> None:
    """stream_order takes a full shuffle without buffer_shuffle_stream's loop when the buffer holds a reader's rows: same order."""
    from stoker.order import BUFFER, buffer_shuffle_stream, epoch_rng

    for worker in range(workers):
        kwargs = dict(seed=11, epoch=3, shuffle=True, rank=0, world_size=1, worker=worker, num_workers=workers)
        mine = stream_order(sizes, shuffle_buffer=1, **kwargs)  # type: ignore[arg-type]  # a buffer of 1 keeps the order
        rng = epoch_rng(11, 3, BUFFER, 0, worker)
        looped = np.fromiter(buffer_shuffle_stream(mine.tolist(), buffer, rng), dtype=np.int64, count=len(mine))
        assert np.array_equal(stream_order(sizes, shuffle_buffer=buffer, **kwargs), looped)  # type: ignore[arg-type]


@pytest.fixture()
def unique_labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pixel shard set where every sample has its own label (so a label names a sample)."""
    from stoker.data import open_data
    from stoker.packer import pack
    from stoker.sources import FileDataset

    root = tmp_path_factory.mktemp("uniq-src")
    from PIL import Image

    for i in range(23):
        (root / f"{i:02d}").mkdir()
        Image.new("RGB", (4, 4), (i, 0, 0)).save(root / f"{i:02d}" / "x.png")
    out = tmp_path_factory.mktemp("uniq")
    ds: FileDataset = open_data(root, "train")
    pack(ds, out, store="pixels", shard_samples=5, progress=False, workers=0)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_epochs_see_every_sample_once_in_a_new_order(unique_labels: Path, workers: int) -> None:
    stream = ShardStream(unique_labels, shuffle_buffer=4, seed=1)
    loader = make_loader(stream, batch_size=4, num_workers=workers, device="cpu", persistent_workers=workers > 0)
    orders = []
    for _ in range(2):
        labels = torch.cat([batch[1] for batch in loader]).tolist()
        assert sorted(labels) == list(range(23))
        orders.append(labels)
    assert orders[0] != orders[1]  # the loader advanced the epoch, persistent workers followed


def test_explicit_ranks_split_the_epoch(unique_labels: Path) -> None:
    parts = [ShardStream(unique_labels, rank=r, world_size=3, seed=2) for r in range(3)]
    seen = [[label for _, label in part] for part in parts]
    assert sorted(sum(seen, [])) == list(range(23))
    assert [len(s) for s in seen] == [len(p) for p in parts] and sum(len(p) for p in parts) == 23
    with pytest.raises(ConfigError):
        ShardStream(unique_labels, rank=3, world_size=3)
    with pytest.raises(ConfigError):
        ShardStream(unique_labels, rank=0)


def test_set_epoch_reaches_copies(unique_labels: Path, packed: Callable[..., Path]) -> None:
    import pickle

    stream = ShardStream(unique_labels)
    copy = pickle.loads(pickle.dumps(stream))
    stream.set_epoch(5)
    assert stream.epoch == 5
    assert copy.epoch in (0, 5)  # a plain pickle copies; DataLoader workers share (see the loader test)


def test_every_reader_reads_across_the_whole_epoch() -> None:
    """Over a class-sorted pack, each (rank, worker) meets every class, in step with the others.

    With one contiguous piece per reader, two workers over 10 sorted classes each read 5
    of them, and every batch held half the classes (validation accuracy fell 0.95 -> 0.87).
    Workers take their rank's order a batch (here 8 rows) at a time.
    """
    sizes = [40] * 10  # ten shards of one class each, class k in shard k (a --no-shuffle pack)
    label_of = np.repeat(np.arange(10), 40)
    for world_size, num_workers in ((1, 2), (2, 2), (1, 4)):
        for rank in range(world_size):
            for worker in range(num_workers):
                rows = stream_order(sizes, seed=0, epoch=0, shuffle=True, shuffle_buffer=1, rank=rank,
                                    world_size=world_size, worker=worker, num_workers=num_workers, shards_at_once=2,
                                    block_rows=8)
                assert set(label_of[rows].tolist()) == set(range(10)), (world_size, num_workers, rank, worker)
                # in step: the first half of its reads covers the first half of the epoch's shards (5 groups of 2)
                first = label_of[rows[: len(rows) // 2]]
                assert len(set(first.tolist())) <= 6


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=12), at_once=st.integers(1, 6),
       seed=st.integers(0, 2**32))
def test_a_merged_group_keeps_each_shards_rows_in_order_and_stays_within_its_group(
    sizes: list[int], at_once: int, seed: int
) -> None:
    """Each file is read in runs: a shard's rows come in stored order, and a group's rows come together."""
    order = stream_order(sizes, seed=seed, epoch=0, shuffle=True, shuffle_buffer=1, rank=0, world_size=1, worker=0,
                         num_workers=1, shards_at_once=at_once)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    shard_of = np.searchsorted(starts, order, side="right") - 1
    for k in range(len(sizes)):
        rows = order[shard_of == k]
        assert rows.tolist() == list(range(starts[k], starts[k + 1]))
    groups = shard_groups(np.arange(len(sizes)), at_once)
    assert max(len(g) for g in groups) <= at_once and sum(len(g) for g in groups) == len(sizes)
    assert max(len(g) for g in groups) - min(len(g) for g in groups) <= 1  # as equal as they can be
    # the shards of one stretch: a run of the order never mixes more than `at_once` shards at a time
    ends = [int(np.flatnonzero(shard_of == k).max()) for k in range(len(sizes)) if sizes[k]]
    firsts = [int(np.flatnonzero(shard_of == k).min()) for k in range(len(sizes)) if sizes[k]]
    open_at = [sum(1 for f, e in zip(firsts, ends, strict=True) if f <= i <= e) for i in range(len(order))]
    assert max(open_at, default=0) <= at_once

