"""Equal steps on every rank, for every reader, any data size, workers and batch size (no processes).

Each rank's batches are worked out from the readers with explicit ``rank``/``world_size``
(the split ``make_loader`` and the readers make under torch.distributed), batched as the
loader batches them (each worker reads whole batches of its rank's order, taken round
robin); then the rule ``fit`` applies is run: before each step the ranks agree and all
stop as soon as any rank is out of batches. Checked: every rank runs the same number of
steps, no sample is trained on twice in an epoch, and what is left out is small (under
the even split of a map-style data set, fewer than ``world_size`` samples; for a stream,
at most one batch of a rank: its shares differ by at most one sample).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.loading.samplers import EpochSampler, RankSlice
from stoker.pipes import Pipe
from stoker.pipes.context import Context
from stoker.shards import stream_order

Batches = list[list[int]]


def _batched(items: list[int], size: int) -> Batches:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _round_robin(per_worker: list[Batches]) -> Batches:
    """The loader's order: worker 0's first batch, worker 1's first, ...; a finished worker is passed over."""
    out: Batches = []
    for k in range(max((len(b) for b in per_worker), default=0)):
        out.extend(b[k] for b in per_worker if k < len(b))
    return out


def _map_style(n: int, rank: int, world: int, workers: int, batch: int, shards: list[int]) -> Batches:
    # make_loader(..., even=True) under torch.distributed: an even split that drops, never pads.
    sampler = EpochSampler(range(n), rank, world, shuffle=True, seed=0, even=True)
    return _batched(list(sampler), batch)


def _stream(n: int, rank: int, world: int, workers: int, batch: int, shards: list[int]) -> Batches:
    w = max(workers, 1)
    return _round_robin([
        _batched(stream_order(shards, seed=1, epoch=0, shuffle=True, shuffle_buffer=7, rank=rank, world_size=world,
                              worker=k, num_workers=w, block_rows=batch).tolist(), batch)
        for k in range(w)
    ])


def _cut(pipe: Pipe[int], rank: int, world: int, workers: int, batch: int) -> Batches:
    """A cut pipe as the loader reads it: worker k of a rank takes the rank's items at shard() a batch at a time."""
    w = max(workers, 1)
    return _round_robin([
        _batched(list(pipe.shard().iterate(Context(rank=rank, world_size=world, worker=k, num_workers=w, block=batch))),
                 batch)
        for k in range(w)
    ])


def _pipe(n: int, rank: int, world: int, workers: int, batch: int, shards: list[int]) -> Batches:
    return _cut(Pipe.from_iterable(range(n)).shuffle(buffer_size=16, seed=2), rank, world, workers, batch)


def _pipe_concat(n: int, rank: int, world: int, workers: int, batch: int, shards: list[int]) -> Batches:
    half = n // 2
    return _cut(Pipe.from_iterable(range(half)).concat(Pipe.from_iterable(range(half, n))), rank, world, workers, batch)


READERS: dict[str, Callable[[int, int, int, int, int, list[int]], Batches]] = {
    "map-style (files, shard sets, concat)": _map_style,
    "ShardStream": _stream,
    "Pipe": _pipe,
    "Pipe.concat": _pipe_concat,
}


def _shard_sizes(n: int, cut: int) -> list[int]:
    sizes = [cut] * (n // cut) + ([n % cut] if n % cut else [])
    return sizes or [0]


@settings(max_examples=120, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=400),
    world=st.integers(min_value=1, max_value=5),
    workers=st.integers(min_value=0, max_value=4),
    batch=st.integers(min_value=1, max_value=37),
    cut=st.integers(min_value=1, max_value=97),
)
def test_every_rank_runs_the_same_steps_and_trains_each_sample_at_most_once(
    n: int, world: int, workers: int, batch: int, cut: int
) -> None:
    shards = _shard_sizes(n, cut)
    for name, reader in READERS.items():
        per_rank = [reader(n, r, world, workers, batch, shards) for r in range(world)]
        steps = min(len(b) for b in per_rank)  # fit: all ranks stop as soon as one is out of batches
        trained = [s for b in per_rank for batch_ in b[:steps] for s in batch_]
        assert len(trained) == len(set(trained)), name  # at most once per epoch
        assert set(trained) <= set(range(n)), name
        left = [len(b) - steps for b in per_rank]
        if name.startswith("map-style"):
            assert left == [0] * world and n - len(trained) < world, name  # only the even split's tail
        else:
            assert max(left) <= 1, name  # at most one batch: a rank's share is at most one sample longer


@settings(max_examples=60, deadline=None)
@given(n=st.integers(min_value=0, max_value=300), world=st.integers(min_value=1, max_value=5), shuffle=st.booleans())
def test_validation_split_counts_every_sample_exactly_once(n: int, world: int, shuffle: bool) -> None:
    parts = [list(RankSlice(range(n), rank=r, world_size=world, shuffle=shuffle)) for r in range(world)]
    assert sorted(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]).tolist()) == list(range(n))
    assert [len(p) for p in parts] == [len(RankSlice(range(n), r, world)) for r in range(world)]
