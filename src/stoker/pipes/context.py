"""Where and when one iteration of a pipe runs: its epoch, its rank and its worker.

A :class:`Context` is worked out once, when a pipe is iterated, and handed to the stages
that need it (``shuffle`` for its epoch seed, ``shard`` for its slice, ``concat`` to pass
it on), so that every stage of one iteration agrees on the epoch and the placement.

The epoch seed rule
-------------------
A shuffle stage draws its permutation from ``mix_seed(seed, epoch, iteration,
loader_seed)``, where

* ``seed`` is the shuffle's own seed (``shuffle(seed=...)``, or one drawn from torch's
  global generator when the pipe was built, so every worker and every copy agree);
* ``epoch`` is the number given to :meth:`Pipe.set_epoch`, or ``None``;
* ``iteration`` counts how many times this pipe object was iterated in this process
  since the last ``set_epoch`` (it moves persistent DataLoader workers and
  ``num_workers=0`` loops on to a new order each epoch);
* ``loader_seed`` is the DataLoader's base seed of this epoch,
  ``get_worker_info().seed - get_worker_info().id``: the same in every worker of one
  epoch, new each epoch for non-persistent workers. It is left out (``None``) outside
  DataLoader workers, under torch.distributed with more than one rank (each rank draws
  its own base seed and the ranks must agree), and once an epoch was set: then the
  order is a function of ``seed`` and ``epoch`` alone, whenever and wherever the
  workers started, which is what lets a resumed run read exactly the same stream.

Every input of the rule is the same in every worker and rank of one epoch, so a shuffle
placed before ``shard()`` gives each of them the same permutation, and each keeps a
disjoint slice of it: every sample is seen exactly once per epoch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from torch.utils.data import get_worker_info

from stoker.loading.placement import distributed_placement

__all__ = ["Context", "mix_seed"]


def mix_seed(*parts: int | None) -> int:
    """Mix integers (or ``None``) into one 63-bit seed, the same in every process.

    Example:
        >>> mix_seed(7, None, 0, None) == mix_seed(7, None, 0, None) != mix_seed(7, None, 1, None)
        True
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True)
class Context:
    """Where and when one iteration of a pipe runs.

    Attributes:
        epoch: the number given to ``Pipe.set_epoch``, or ``None``.
        iteration: how many times the pipe was iterated in this process since then.
        loader_seed: the DataLoader's base seed of this epoch, or ``None``.
        rank: this process's torch.distributed rank (0 when not distributed).
        world_size: the number of ranks (1 when not distributed).
        worker: this DataLoader worker's id (0 in the main process).
        num_workers: the number of DataLoader workers (1 in the main process).
    """

    epoch: int | None = None
    iteration: int = 0
    loader_seed: int | None = None
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    @classmethod
    def current(
        cls, epoch: int | None = None, iteration: int = 0, placement: tuple[int, int] | None = None
    ) -> Context:
        """Read the worker and rank this process runs as.

        Args:
            epoch: the pipe's ``set_epoch`` number, if any.
            iteration: how many times the pipe was iterated since.
            placement: ``(rank, world_size)`` seen when the pipe was pickled, used when
                torch.distributed is not initialised here (a spawned worker).
        """
        rank, world_size = distributed_placement() or placement or (0, 1)
        info = get_worker_info()
        if info is None:
            return cls(epoch, iteration, None, rank, world_size)
        loader_seed = info.seed - info.id if world_size == 1 else None
        return cls(epoch, iteration, loader_seed, rank, world_size, info.id, info.num_workers)

    def epoch_seed(self, seed: int) -> int:
        """The seed a shuffle with ``seed`` uses in this epoch (see the module docs)."""
        loader_seed = self.loader_seed if self.epoch is None else None
        return mix_seed(seed, self.epoch, self.iteration, loader_seed)
