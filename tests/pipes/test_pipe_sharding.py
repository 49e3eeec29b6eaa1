"""Exactly-once sharding across workers x ranks, with a shuffle before the shard."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.errors import ConfigError
from stoker.order import reader_of
from stoker.pipes import Pipe
from stoker.pipes.context import Context

SETTINGS = settings(max_examples=40, deadline=None)


def shard_outputs(pipes: list[Pipe[int]]) -> list[list[int]]:
    """One epoch: iterate every shard's pipe once."""
    return [list(pipe) for pipe in pipes]


def assert_exactly_once(outputs: list[list[int]], items: list[int]) -> None:
    merged = [item for output in outputs for item in output]
    assert len(merged) == len(items)
    assert Counter(merged) == Counter(items)


@SETTINGS
@given(
    items=st.lists(st.integers(0, 50), max_size=200),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 4),
    buffer_size=st.integers(1, 300),
    seed=st.integers(0, 2**32),
)
def test_shuffle_then_shard_is_exactly_once_and_reshuffles(
    items: list[int], world_size: int, num_workers: int, buffer_size: int, seed: int
) -> None:
    base = Pipe.from_iterable(items).shuffle(buffer_size, seed=seed)
    pipes = [
        base.shard(rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
        for rank in range(world_size)
        for worker in range(num_workers)
    ]
    first = shard_outputs(pipes)
    second = shard_outputs(pipes)  # each pipe object iterated again: a new epoch
    assert_exactly_once(first, items)
    assert_exactly_once(second, items)
    if len(set(items)) >= 10 and buffer_size >= 10:
        assert first != second


@SETTINGS
@given(
    items=st.lists(st.integers(), max_size=150),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 4),
    buffer_size=st.integers(1, 200),
    loader_seeds=st.lists(st.integers(0, 2**63 - 1), min_size=2, max_size=2, unique=True),
)
def test_plain_shard_in_simulated_workers_is_exactly_once(
    items: list[int], world_size: int, num_workers: int, buffer_size: int, loader_seeds: list[int]
) -> None:
    # The context a DataLoader worker sees: same loader seed in all workers of one epoch,
    # a new one each epoch (non-persistent workers).
    pipe = Pipe.from_iterable(items).shuffle(buffer_size, seed=3).shard()
    epochs = []
    for loader_seed in loader_seeds:
        contexts = [
            Context(loader_seed=loader_seed, rank=rank, world_size=world_size, worker=worker, num_workers=num_workers)
            for rank in range(world_size)
            for worker in range(num_workers)
        ]
        outputs = [list(pipe.iterate(context)) for context in contexts]
        assert_exactly_once(outputs, items)
        epochs.append(outputs)
    if len(set(items)) >= 10 and buffer_size >= 10:
        assert epochs[0] != epochs[1]


def test_shard_splits_by_rank_then_by_worker() -> None:
    # The rule of stoker.order: item i to rank i % R, then worker (i // R) % N of that rank.
    pipe = Pipe.from_iterable(range(12))
    got = {(r, w): list(pipe.shard(rank=r, world_size=2, worker=w, num_workers=3)) for r in range(2) for w in range(3)}
    assert got == {(r, w): [i for i in range(12) if reader_of(i, 2, 3) == (r, w)] for r in range(2) for w in range(3)}
    assert got[0, 0] == [0, 6] and got[1, 0] == [1, 7] and got[0, 1] == [2, 8]


def test_shard_overrides_pick_one_slice() -> None:
    pipe = Pipe.from_iterable(range(8)).shard(rank=1, world_size=2, worker=1, num_workers=2)
    assert list(pipe) == [3, 7]


@pytest.mark.parametrize(
    "overrides",
    [
        {"rank": 0},
        {"num_workers": 2},
        {"rank": 2, "world_size": 2},
        {"worker": -1, "num_workers": 2},
        {"worker": 0, "num_workers": 0},
    ],
)
def test_shard_rejects_bad_overrides(overrides: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        Pipe.from_iterable(range(4)).shard(**overrides)


def test_shard_reads_the_distributed_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    import torch.distributed as dist

    pipe = Pipe.from_iterable(range(12)).shard()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    assert list(pipe) == [1, 4, 7, 10]
    pickled = pickle.dumps(pipe)  # as for a spawned worker, where dist is not initialised
    monkeypatch.undo()
    assert list(pipe) == list(range(12))
    assert list(pickle.loads(pickled)) == [1, 4, 7, 10]


def test_len_is_what_this_rank_reads_as_for_every_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    pipe = Pipe.from_iterable(range(11)).shuffle(4, seed=0).shard()
    assert len(pipe) == 11  # one rank: the whole epoch, all workers together
    assert [len(pipe.shard(rank=r, world_size=3)) for r in range(3)] == [4, 4, 3]
    assert len(Pipe.from_iterable(range(11)).shard(rank=0, world_size=2, worker=1, num_workers=2)) == 3  # one worker's
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    assert len(pipe) == len(list(pipe)) == 5  # rank 1 of 2 reads 5 of 11
    assert len(Pipe.from_iterable(range(11)).map(str)) == 11  # no shard stage: every rank reads it all
