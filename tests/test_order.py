"""stoker.order: the one seed rule, permutation, buffer shuffle and split, and the orders every reader reads.

The golden orders pin what each reader reads in epochs 0 and 1 (2 ranks x 2 workers
where a reader splits by worker): a change to any of them changes the order of a
resumed run, so it must be a decision (and a line in the README's "Changes").
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stoker.order
from stoker.errors import ConfigError
from stoker.loading.samplers import EpochSampler, RankSlice
from stoker.mixing import simulate_buffer_shuffle
from stoker.order import (
    BUFFER,
    INTERLEAVE,
    WORKER_SEEDS,
    buffer_shuffle_stream,
    epoch_rng,
    epoch_seed,
    even_trim,
    iter_share,
    permutation,
    reader_of,
    share,
    share_size,
)
from stoker.pipes import Pipe
from stoker.shards.pack.plan import shuffled_rows
from stoker.shards.read.stream import stream_order


def test_the_module_examples_hold() -> None:
    result = doctest.testmod(stoker.order, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 10 and result.failed == 0


# -- golden orders (this version's; see the README's "Changes") ------------------------


def test_golden_permutation_and_seeds() -> None:
    assert permutation(12, 0, 0).tolist() == [9, 1, 3, 11, 4, 10, 2, 8, 6, 5, 0, 7]
    assert permutation(12, 0, 1).tolist() == [10, 7, 1, 11, 8, 3, 6, 5, 2, 4, 9, 0]
    assert (epoch_seed(0, 0, WORKER_SEEDS), epoch_seed(0, 1, WORKER_SEEDS)) == (4770480587057352170, 3445966716504608220)


def _sampled(sampler: EpochSampler, epoch: int) -> list[int]:
    sampler.set_epoch(epoch)
    return list(sampler)


def test_golden_map_style_samplers() -> None:
    even = [EpochSampler(range(11), r, 2, shuffle=True, seed=0) for r in (0, 1)]
    assert [_sampled(s, 0) for s in even] == [[4, 3, 9, 10, 5], [6, 8, 2, 1, 0]]
    assert [_sampled(s, 1) for s in even] == [[1, 8, 3, 7, 4], [10, 6, 5, 2, 9]]
    uneven = [RankSlice(range(11), r, 2, shuffle=True, seed=0) for r in (0, 1)]
    assert [_sampled(s, 0) for s in uneven] == [[4, 3, 9, 10, 5, 7], [6, 8, 2, 1, 0]]
    assert [_sampled(s, 1) for s in uneven] == [[1, 8, 3, 7, 4, 0], [10, 6, 5, 2, 9]]


def test_golden_pipe_shuffle_then_shard() -> None:
    def read(epoch: int) -> dict[tuple[int, int], list[int]]:
        out = {}
        for r in (0, 1):
            for w in (0, 1):
                pipe = Pipe.from_iterable(range(24)).shuffle(8, seed=0).shard(rank=r, world_size=2, worker=w, num_workers=2)
                pipe.set_epoch(epoch)
                out[r, w] = list(pipe)
        return out

    assert read(0) == {(0, 0): [7, 9, 6, 5, 17, 22], (0, 1): [3, 12, 16, 18, 21, 23],
                       (1, 0): [1, 2, 13, 0, 19, 20], (1, 1): [10, 11, 14, 8, 15, 4]}
    assert read(1) == {(0, 0): [5, 1, 12, 7, 0, 13], (0, 1): [3, 11, 8, 17, 14, 18],
                       (1, 0): [2, 4, 6, 20, 15, 21], (1, 1): [10, 9, 16, 19, 22, 23]}


def test_golden_shard_stream() -> None:
    """Pinned since ShardStream reads several shards at once (issue 21): the default merges all four
    shards here (32 at once), ``shards_at_once=2`` two groups of two, one after the other. Since the
    batch split (elastic determinism) the rank's order is pinned, read by one worker as before (these
    values are the one-worker orders of the version before, unchanged), and its workers take it a
    block at a time."""

    def read(epoch: int, **at_once: int) -> dict[int, list[int]]:
        return {
            r: stream_order([6, 6, 6, 6], seed=0, epoch=epoch, shuffle=True, shuffle_buffer=3, rank=r,
                            world_size=2, worker=0, num_workers=1, **at_once).tolist()
            for r in (0, 1)
        }

    assert read(0) == {0: [0, 9, 7, 13, 10, 14, 19, 15, 6, 4, 23, 11], 1: [12, 1, 2, 3, 20, 21, 22, 18, 8, 16, 5, 17]}
    assert read(1) == {0: [0, 2, 6, 19, 8, 20, 3, 9, 17, 16, 5, 21], 1: [1, 7, 18, 14, 12, 13, 15, 10, 22, 4, 23, 11]}
    assert read(0, shards_at_once=1) == {0: [16, 6, 14, 8, 0, 2, 10, 18, 12, 4, 22, 20],
                                         1: [15, 7, 9, 11, 1, 3, 5, 13, 17, 21, 19, 23]}
    assert read(1, shards_at_once=1) == {0: [12, 18, 14, 20, 16, 8, 6, 22, 2, 0, 4, 10],
                                         1: [17, 15, 19, 23, 13, 21, 9, 1, 11, 7, 3, 5]}
    assert read(0, shards_at_once=2) == {0: [7, 8, 13, 9, 0, 19, 17, 22, 12, 21, 23, 3],
                                         1: [14, 16, 10, 11, 18, 20, 1, 6, 15, 4, 2, 5]}
    assert read(1, shards_at_once=2) == {0: [18, 21, 12, 16, 13, 1, 6, 17, 10, 9, 4, 7],
                                         1: [14, 20, 15, 23, 19, 22, 2, 3, 8, 0, 11, 5]}
    # Worker w of 3 reads blocks w, w + 3, ... of 5 rows of its rank's order.
    for rank, order in read(0).items():
        parts = [stream_order([6, 6, 6, 6], seed=0, epoch=0, shuffle=True, shuffle_buffer=3, rank=rank, world_size=2,
                              worker=w, num_workers=3, block_rows=5).tolist() for w in range(3)]
        assert parts == [order[0:5], order[5:10], order[10:]]


def test_golden_pack_plan_and_simulated_buffer() -> None:
    assert shuffled_rows(10, 0, "train").tolist() == [1, 7, 0, 9, 3, 4, 8, 6, 2, 5]
    assert shuffled_rows(10, 0, "val").tolist() == [6, 9, 5, 2, 0, 7, 4, 3, 8, 1]
    assert simulate_buffer_shuffle(np.arange(10), 4, seed=0).tolist() == [3, 0, 1, 6, 5, 7, 2, 9, 4, 8]


# -- one rule: the readers agree with each other ---------------------------------------


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 60), seed=st.integers(-(2**63), 2**64 - 1), epoch=st.integers(0, 5), world=st.integers(1, 4))
def test_every_reader_of_one_order_reads_the_same_rank_shares(n: int, seed: int, epoch: int, world: int) -> None:
    order = permutation(n, seed, epoch)
    for rank in range(world):
        pipe = Pipe.from_iterable(range(n)).shuffle(max(n, 1), seed=seed).shard(rank=rank, world_size=world)
        pipe.set_epoch(epoch)  # a full buffer: the epoch's permutation
        sampler = RankSlice(range(n), rank, world, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        assert list(pipe) == list(sampler) == share(order, rank, world).tolist()
        even = EpochSampler(range(n), rank, world, shuffle=True, seed=seed)
        even.set_epoch(epoch)
        assert list(even) == share(order, rank, world, even=True).tolist() == list(sampler)[: n // world]


def test_the_simulated_buffer_is_the_pipe_shuffle_of_epoch_0() -> None:
    labels = np.repeat(np.arange(5), 30)
    pipe = Pipe.from_iterable(labels.tolist()).shuffle(16, seed=3)
    assert list(pipe) == simulate_buffer_shuffle(labels, 16, seed=3).tolist()  # never set: epoch 0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 90), world=st.integers(1, 4), workers=st.integers(1, 4), block=st.integers(1, 5), even=st.booleans())
def test_the_split_is_disjoint_complete_and_agrees_with_the_rule(n: int, world: int, workers: int, block: int, even: bool) -> None:
    order = np.arange(n)
    parts = {(r, w): share(order, r, world, w, workers, block=block, even=even).tolist()
             for r in range(world) for w in range(workers)}
    kept = n - (even_trim(n, world) if even else 0)
    assert sorted(i for p in parts.values() for i in p) == list(range(kept))  # exactly once; only the tail trimmed
    for (r, w), part in parts.items():
        assert all(reader_of(i, world, workers, block) == (r, w) for i in part)
        assert part == sorted(part)  # in the epoch's order
        assert len(part) == share_size(n, r, world, w, workers, block=block, even=even)
        if not even:
            assert list(iter_share(iter(range(n)), r, world, w, workers, block=block)) == part
    for r in range(world):
        assert share_size(n, r, world, even=even) == sum(len(parts[r, w]) for w in range(workers))
    if even:
        assert {share_size(n, r, world, even=True) for r in range(world)} == {n // world}


def test_a_full_buffer_is_the_permutation_and_a_buffer_of_one_keeps_the_order() -> None:
    assert list(buffer_shuffle_stream(range(50), 50, epoch_rng(4, 2))) == permutation(50, 4, 2).tolist()
    assert list(buffer_shuffle_stream(range(50), 1, epoch_rng(4, 2))) == list(range(50))
    mixed = list(buffer_shuffle_stream(range(5000), 64, epoch_rng(4, 2)))
    assert sorted(mixed) == list(range(5000)) and mixed != list(range(5000))


def test_streams_and_epochs_draw_independent_numbers() -> None:
    seeds = {epoch_seed(0, 0), epoch_seed(0, 1), epoch_seed(1, 0), epoch_seed(0, 0, 0), epoch_seed(0, 0, BUFFER, 0, 0),
             epoch_seed(0, 0, BUFFER, 0, 1), epoch_seed(0, 0, BUFFER, 1, 0), epoch_seed(2**32, 0), epoch_seed(-1, 0),
             epoch_seed(0, 0, INTERLEAVE)}
    assert len(seeds) == 10
    assert all(0 <= s < 2**63 for s in seeds)


@pytest.mark.parametrize("bad", [1.5, "1", True, None])
def test_the_seed_rule_takes_integers_only(bad: object) -> None:
    with pytest.raises(ConfigError, match="integers"):
        epoch_seed(bad, 0)  # type: ignore[arg-type]


def test_a_placement_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="rank=2 with world_size=2"):
        share(np.arange(4), rank=2, world_size=2)
    with pytest.raises(ConfigError, match="worker=1 with num_workers=1"):
        share_size(4, 0, 1, worker=1)
    with pytest.raises(ConfigError, match="block"):
        share(np.arange(4), 0, 1, block=0)
    with pytest.raises(ConfigError, match="buffer_size"):
        list(buffer_shuffle_stream(range(3), 0, epoch_rng(0, 0)))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 2600), size=st.integers(1, 2100), seed=st.integers(0, 2**32 - 1))
def test_the_array_buffer_shuffle_is_the_buffer_loop_draw_for_draw(n: int, size: int, seed: int) -> None:
    from stoker.order import buffer_shuffle_array

    items = np.random.default_rng(seed).integers(-10**9, 10**9, n)  # any values, not positions
    loop_rng, array_rng = epoch_rng(seed, 1), epoch_rng(seed, 1)
    looped = list(buffer_shuffle_stream(items.tolist(), size, loop_rng))
    assert buffer_shuffle_array(items, size, array_rng).tolist() == looped
    assert loop_rng.integers(0, 2**62) == array_rng.integers(0, 2**62)  # the same draws: the generators end alike


def test_the_array_buffer_shuffle_keeps_the_loops_order_for_a_buffer_past_16_bits() -> None:
    from stoker.order import buffer_shuffle_array

    items = np.arange(70_000)
    size = (1 << 16) + 7  # slots that do not fit the 16-bit radix sort
    assert buffer_shuffle_array(items, size, epoch_rng(3, 2)).tolist() == list(buffer_shuffle_stream(items.tolist(), size, epoch_rng(3, 2)))
