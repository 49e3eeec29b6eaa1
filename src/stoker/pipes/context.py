"""Where and when one iteration of a pipe runs: its epoch, its rank and its worker.

A :class:`Context` is worked out once, when a pipe is iterated, and handed to the stages
that need it (``shuffle`` for its epoch seed, ``shard`` for its slice, ``concat`` to pass
it on), so that every stage of one iteration agrees on the epoch and the placement.

The epoch seed rule
-------------------
A shuffle stage draws its buffer's numbers from :func:`stoker.order.epoch_rng`, the one
seed rule of every stoker reader, with

* ``seed``: the shuffle's own seed (``shuffle(seed=...)``, or one drawn from torch's
  global generator when the pipe was built, so every worker and every copy agree);
* the epoch: the number given to :meth:`Pipe.set_epoch` plus ``iteration``, how many
  times this pipe object was iterated in this process since (persistent DataLoader
  workers and ``num_workers=0`` loops count on to the next epoch's order by
  themselves); with no ``set_epoch``, ``iteration`` alone, so a pipe iterated in one
  process reads the orders of epochs 0, 1, 2, ...;
* and, only when no epoch was set, ``(LOADER_SEED, loader_seed)`` as the stream, where ``loader_seed`` is the DataLoader's base seed of this
  epoch, ``get_worker_info().seed - get_worker_info().id``, the same in every worker of
  one epoch and new each epoch for non-persistent workers (whose copies of the pipe are
  always at iteration 0). It is left out (``None``) outside DataLoader workers and
  under torch.distributed with more than one rank (each rank draws its own base seed
  and the ranks must agree): there, non-persistent workers of a pipe that is never
  given ``set_epoch`` read the same order every epoch; stoker's loader always sets it.

Once an epoch is set the order is a function of ``seed`` and the epoch alone, whenever
and wherever the workers started, which is what lets a resumed run read exactly the
same stream; a full buffer (``buffer_size`` at least the stream) then gives
:func:`stoker.order.permutation` ``(n, seed, epoch)``, the map-style samplers' order.

Every input of the rule is the same in every worker and rank of one epoch, so a shuffle
placed before ``shard()`` gives each of them the same permutation, and each keeps a
disjoint share of it (:mod:`stoker.order`'s split): every sample is seen exactly once
per epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.utils.data import get_worker_info

from stoker.loading.placement import distributed_placement, worker_placement
from stoker.order import LOADER_SEED, epoch_seed

__all__ = ["Context"]


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
        block: items of the rank's share dealt to one worker at a time (``shard()``): the
            loader's batch size under stoker's loader (:meth:`Pipe.split_by_batch`), else 1.
    """

    epoch: int | None = None
    iteration: int = 0
    loader_seed: int | None = None
    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    block: int = 1

    @classmethod
    def current(
        cls, epoch: int | None = None, iteration: int = 0, placement: tuple[int, int] | None = None, block: int = 1
    ) -> Context:
        """Read the worker and rank this process runs as.

        Args:
            epoch: the pipe's ``set_epoch`` number, if any.
            iteration: how many times the pipe was iterated since.
            placement: ``(rank, world_size)`` seen when the pipe was pickled, used when
                torch.distributed is not initialised here (a spawned worker).
            block: items dealt to one worker at a time.
        """
        rank, world_size = distributed_placement() or placement or (0, 1)
        info = get_worker_info()
        if info is None:  # the loader's process, or a thread of its thread backend
            return cls(epoch, iteration, None, rank, world_size, *worker_placement(), block)
        loader_seed = info.seed - info.id if world_size == 1 else None
        return cls(epoch, iteration, loader_seed, rank, world_size, info.id, info.num_workers, block)

    @property
    def order_epoch(self) -> int:
        """The epoch whose order this iteration reads: ``epoch + iteration`` (``iteration`` when no epoch is set)."""
        return (self.epoch or 0) + self.iteration

    def epoch_seed(self, seed: int) -> int:
        """The seed a shuffle with ``seed`` draws from in this iteration (see the module docs).

        ``numpy.random.default_rng`` of it is :func:`stoker.order.epoch_rng` of the rule's inputs.

        Example:
            >>> Context(epoch=2).epoch_seed(7) == Context(epoch=1, iteration=1).epoch_seed(7) == epoch_seed(7, 2)
            True
        """
        if self.epoch is None and self.loader_seed is not None:
            return epoch_seed(seed, self.order_epoch, LOADER_SEED, self.loader_seed)
        return epoch_seed(seed, self.order_epoch)
