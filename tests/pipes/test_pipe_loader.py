"""A Pipe inside a real torch DataLoader: exactly once per epoch, a new order each epoch."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, get_worker_info

from stoker.pipes import Pipe

SIZE = 300


def with_worker_id(item: int) -> tuple[int, int]:
    info = get_worker_info()
    return (-1 if info is None else info.id), item


def shuffled_shards() -> Pipe[int]:
    return Pipe.from_iterable(range(SIZE)).shuffle(buffer_size=64, seed=7).shard()


def epoch_items(loader: DataLoader) -> list[int]:
    return [int(item) for batch in loader for item in batch]


def test_main_process_loader_sees_each_item_once_per_epoch_in_new_order() -> None:
    loader = DataLoader(shuffled_shards(), batch_size=16, num_workers=0)
    first, second = epoch_items(loader), epoch_items(loader)
    assert sorted(first) == sorted(second) == list(range(SIZE))
    assert first != second


def test_persistent_workers_see_each_item_once_per_epoch_in_new_order() -> None:
    loader = DataLoader(shuffled_shards(), batch_size=16, num_workers=2, persistent_workers=True)
    first, second = epoch_items(loader), epoch_items(loader)
    assert sorted(first) == sorted(second) == list(range(SIZE))
    assert first != second
    assert sorted(first[:100]) != sorted(second[:100])  # a new permutation, not the same one re-interleaved


def test_shard_without_overrides_gives_workers_disjoint_halves_each_epoch() -> None:
    pipe = shuffled_shards().map(with_worker_id)
    loader = DataLoader(pipe, batch_size=None, num_workers=2, generator=torch.Generator().manual_seed(0))
    epochs = []
    for _ in range(2):  # non-persistent workers: a new DataLoader base seed each epoch
        by_worker: dict[int, list[int]] = {0: [], 1: []}
        for worker, item in loader:
            by_worker[int(worker)].append(int(item))
        assert len(by_worker[0]) == len(by_worker[1]) == SIZE // 2
        assert not set(by_worker[0]) & set(by_worker[1])
        assert sorted(by_worker[0] + by_worker[1]) == list(range(SIZE))
        epochs.append(by_worker)
    assert epochs[0] != epochs[1]

