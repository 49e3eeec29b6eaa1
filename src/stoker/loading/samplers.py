"""stoker's samplers of a map-style data set: each epoch's order and each rank's share of it.

The order of epoch ``e`` is :func:`stoker.order.permutation` ``(len(dataset), seed, e)``
(or ``0..n-1`` unshuffled), and a rank reads its share by the rule of
:mod:`stoker.order`: rank ``r`` of ``R`` reads positions ``r, r + R, r + 2R, ...``.

* :class:`EpochSampler` with one rank: the shuffled (or sequential) single-process order.
* :class:`EpochSampler` with ``even=True`` (``make_loader``'s training split under
  torch.distributed): every rank reads ``len // world_size`` samples, the same number,
  so every rank runs the same number of steps; the last ``len % world_size`` of each
  epoch's order are dropped (:attr:`EpochSampler.trimmed`), never padded with repeats.
  It replaces torch's ``DistributedSampler(drop_last=True)``.
* :class:`RankSlice` (``even=False``): every sample exactly once over the ranks, the
  shares differing by at most one (for validation).

A shard set larger than its cache (:class:`~stoker.loading.contract.SupportsShuffleBlocks`)
is shuffled in blocks of shards that the cache holds (:func:`stoker.order.block_permutation`,
``scope``), so each shard is fetched once per epoch; the split by rank is the same.

The loader's workers do not split a map-style order: whole batches go to the workers
in turn, and the loader puts them back in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from stoker.errors import ConfigError
from stoker.loading.contract import SupportsShuffleBlocks
from stoker.order import (
    SHUFFLE_SCOPES,
    ShuffleBlocks,
    ShuffleScope,
    block_permutation,
    check_placement,
    even_trim,
    permutation,
    share,
    share_size,
)

__all__ = ["EpochSampler", "IndexBatches", "RankSlice", "shuffle_blocks"]


class EpochSampler(Sampler[int]):
    """Rank ``rank``'s share of each epoch's order of a map-style data set (see the module docs).

    Args:
        dataset: anything with a length (only ``len(dataset)`` is read).
        rank, world_size: which rank's share to read (one rank: the whole epoch).
        shuffle: a new permutation each epoch (:meth:`set_epoch`); False reads ``0..n-1``.
        seed: the seed of the permutations.
        even: drop the last ``len % world_size`` samples of each epoch's order, so every
            rank reads the same number (training); False reads every sample once over
            the ranks (validation).
        scope: what a shuffle spans: ``"split"``, the whole data set; ``"blocks"``, blocks
            of the shards its cache holds (a shard set at a URL with a cache limit);
            ``"auto"`` (default): blocks where the data set does not fit its cache.

    Raises:
        ConfigError: ``rank`` out of range for ``world_size``; an unknown ``scope``, or
            ``"blocks"`` for a data set that cannot be read in blocks.

    Example:
        >>> sampler = EpochSampler(range(5), rank=1, world_size=2, shuffle=False)
        >>> list(sampler), len(sampler), sampler.trimmed
        ([1, 3], 2, 1)
    """

    def __init__(
        self, dataset: Any, rank: int = 0, world_size: int = 1, *, shuffle: bool = True, seed: int = 0, even: bool = True,
        scope: ShuffleScope = "auto",
    ) -> None:
        check_placement(rank, world_size, where="sampler")
        self.n, self.rank, self.world_size = len(dataset), rank, world_size
        self.shuffle, self.seed, self.even = shuffle, seed, even
        self.epoch = 0
        self.blocks = shuffle_blocks(dataset, scope) if shuffle else None

    @property
    def trimmed(self) -> int:
        """Samples of each epoch no rank reads: the tail an even split drops (0 when not even)."""
        return even_trim(self.n, self.world_size) if self.even else 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next pass reads (when shuffling)."""
        self.epoch = epoch

    def order(self) -> np.ndarray:
        """The whole epoch's order (every rank's share interleaved), before the split."""
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        if self.blocks is not None:
            return block_permutation(self.blocks, self.seed, self.epoch)
        return permutation(self.n, self.seed, self.epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(share(self.order(), self.rank, self.world_size, even=self.even).tolist())

    def __len__(self) -> int:
        return share_size(self.n, self.rank, self.world_size, even=self.even)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.n} samples, rank={self.rank}, world_size={self.world_size}, "
            f"shuffle={self.shuffle}, seed={self.seed}, even={self.even}"
            f"{'' if self.blocks is None else f', blocks of <= {self.blocks.budget:,} bytes'})"
        )


def shuffle_blocks(dataset: Any, scope: ShuffleScope) -> ShuffleBlocks | None:
    """How ``dataset``'s shuffle of ``scope`` groups its samples (None: one shuffle of the whole data set).

    Raises:
        ConfigError: an unknown ``scope``, or ``"blocks"`` for a data set without shards in a cache.
    """
    if scope not in SHUFFLE_SCOPES:
        raise ConfigError(f"shuffle_scope must be one of {', '.join(SHUFFLE_SCOPES)} (--shuffle-scope), got {scope!r}")
    if isinstance(dataset, SupportsShuffleBlocks):
        return dataset.shuffle_blocks(scope)
    if scope == "blocks":
        raise ConfigError(
            f"shuffle_scope='blocks' (--shuffle-scope blocks) groups the shards of a shard set read through a "
            f"limited cache; {type(dataset).__name__} has none: use 'auto' or 'split'"
        )
    return None


class RankSlice(EpochSampler):
    """Rank ``rank``'s share of a map-style data set, without padding or trimming: positions ``rank::world_size``.

    Unlike torch's ``DistributedSampler`` it never repeats a sample to even the ranks
    out, and unlike the even split it drops none, so over all ranks every sample is
    read exactly once (the ranks' shares differ by at most one sample). For
    validation: counts stay exact, and the loop runs no collective inside it, so
    unequal batch counts cannot hang.

    Example:
        >>> list(RankSlice(range(5), rank=1, world_size=2))
        [1, 3]
    """

    def __init__(self, dataset: Any, rank: int, world_size: int, shuffle: bool = False, seed: int = 0) -> None:
        super().__init__(dataset, rank, world_size, shuffle=shuffle, seed=seed, even=False)


class IndexBatches(Sampler[list[int]]):
    """``sampler``'s indices in lists of ``batch_size`` (the last one shorter unless ``drop_last``).

    torch's ``BatchSampler`` does the same, but without ``drop_last`` it fills each batch
    by a Python loop per index; this cuts the sampler's iterator in C (``islice``).
    """

    def __init__(self, sampler: Sampler[int], batch_size: int, drop_last: bool) -> None:
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self) -> Iterator[list[int]]:
        indices = iter(self.sampler)
        while batch := list(islice(indices, self.batch_size)):
            if self.drop_last and len(batch) < self.batch_size:
                return
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
