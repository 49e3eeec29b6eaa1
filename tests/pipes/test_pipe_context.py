"""The epoch seed rule: what a shuffle's seed depends on, in and out of DataLoader workers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist

from stoker.pipes import Pipe
from stoker.pipes import context as context_module
from stoker.pipes.context import Context


def fake_worker(monkeypatch: pytest.MonkeyPatch, worker: int, base_seed: int) -> None:
    info = SimpleNamespace(id=worker, num_workers=2, seed=base_seed + worker)
    monkeypatch.setattr(context_module, "get_worker_info", lambda: info)


def test_workers_of_one_epoch_share_the_seed_and_the_next_epoch_changes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seeds = {}
    for base_seed in (1000, 2000):
        for worker in (0, 1):
            fake_worker(monkeypatch, worker, base_seed)
            context = Context.current()
            assert (context.worker, context.num_workers, context.loader_seed) == (worker, 2, base_seed)
            seeds[base_seed, worker] = context.epoch_seed(7)
    assert seeds[1000, 0] == seeds[1000, 1] != seeds[2000, 0] == seeds[2000, 1]


def test_the_loader_seed_is_left_out_across_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_worker(monkeypatch, 0, 1000)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    context = Context.current(epoch=3, iteration=1)
    assert (context.rank, context.world_size, context.loader_seed) == (1, 2, None)
    assert context.epoch_seed(7) == Context(epoch=3, iteration=1).epoch_seed(7)


def test_each_input_of_the_rule_changes_the_seed() -> None:
    base = Context(epoch=None, iteration=0, loader_seed=None)
    variants = [Context(epoch=1), Context(iteration=1, loader_seed=0), Context(loader_seed=0)]
    seeds = {context.epoch_seed(7) for context in [base, *variants]} | {base.epoch_seed(8)}
    assert len(seeds) == 5
    assert Context(rank=1, world_size=2, worker=1, num_workers=3).epoch_seed(7) == base.epoch_seed(7)


def test_the_epoch_is_the_set_epoch_plus_the_iterations_since() -> None:
    # A pipe never told its epoch reads epochs 0, 1, 2, ... in one process; persistent
    # workers that started at epoch e count on to e + 1, e + 2, ... as set_epoch would.
    assert Context().epoch_seed(7) == Context(epoch=0).epoch_seed(7)
    assert Context(iteration=2).epoch_seed(7) == Context(epoch=2).epoch_seed(7) == Context(epoch=1, iteration=1).epoch_seed(7)
    assert Context(epoch=3, loader_seed=5).epoch_seed(7) == Context(epoch=3).epoch_seed(7)  # a set epoch wins


def test_concatenated_pipes_shuffle_in_the_outer_epoch() -> None:
    def halves() -> Pipe[int]:
        left = Pipe.from_iterable(range(0, 20)).shuffle(8, seed=1)
        right = Pipe.from_iterable(range(20, 40)).shuffle(8, seed=2)
        return left.concat(right).shuffle(16, seed=3)

    pipes = [halves().shard(worker=worker, num_workers=3) for worker in range(3)]
    for _ in range(2):
        assert sorted(item for pipe in pipes for item in pipe) == list(range(40))
