"""Equal steps on every rank: one implementation of "every rank yields the same number of batches".

Under ``DistributedDataParallel`` a rank with one batch more than another reaches a
collective the others never join (gloo fails, NCCL hangs). Readers split an epoch by
rank and the parts need not give the same number of batches, so the guarantee lives
here, in the loading layer, where every loop gets it. It is kept in one of two ways:

* **By construction** where every rank's count is known to be the same
  (:func:`steps_are_certain`: a map-style set under the even split, ``on_error="raise"``).
* **By agreement** elsewhere: :class:`EqualSteps` agrees before each batch, in one
  all-reduce on a CPU (gloo) group (:func:`flag_group`), whether every rank still has one.

The guide to several GPUs (``docs/guides/distributed.md``, "Equal steps") says more.

Example:
    >>> steps = EqualSteps([[1, 2], [3]])  # alone: every batch, nothing trimmed
    >>> [len(b) for b in steps], steps.trimmed
    ([2, 1], 0)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, Sampler

from stoker.loading.collate import Batch
from stoker.loading.contract import SupportsOnError
from stoker.loading.samplers import EpochSampler

__all__ = ["EqualSteps", "KeepsStepsEqual", "batch_samples", "every_rank_has_a_batch", "flag_group", "ranks_in_step", "steps_are_certain"]

T = TypeVar("T")

_flag_group: list[Any] = []  # [default process group, the gloo group its flags go over] once made


@runtime_checkable
class KeepsStepsEqual(Protocol):
    """An iterable of batches that keeps the ranks in step itself (a stoker :class:`~stoker.Loader`).

    :class:`EqualSteps` passes such an iterable through when ``equal_steps`` is true,
    and takes ``trimmed`` from it, so wrapping any loader never agrees twice.
    """

    @property
    def equal_steps(self) -> bool:
        """Whether every rank gets the same number of batches from a pass."""
        ...

    @property
    def trimmed(self) -> int:
        """Samples the last pass left out on this rank to keep the ranks in step."""
        ...


def ranks_in_step() -> bool:
    """Whether there are ranks to keep in step: ``torch.distributed`` is initialised with more than one."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def steps_are_certain(dataset: Dataset | IterableDataset, sampler: Sampler[int] | None) -> bool:
    """Whether every rank yields the same number of batches of ``dataset`` without agreeing on it.

    True for a map-style data set under the even rank split (an ``EpochSampler`` with
    ``even=True``: every rank draws the same number of indices, so makes the same
    number of batches) whose reader raises on
    a bad sample (:class:`~stoker.loading.contract.SupportsOnError` with ``"raise"``), so
    that every batch made is yielded. Anything else (an iterable, a reader that skips or
    does not say) is agreed on at every step.
    """
    if isinstance(dataset, IterableDataset) or not (isinstance(sampler, EpochSampler) and sampler.even):
        return False
    return isinstance(dataset, SupportsOnError) and dataset.on_error == "raise"


def batch_samples(batch: Any) -> int:
    """Samples in a batch: a :class:`Batch`'s size, else the length of its first tensor (or of the batch).

    Used to count what :class:`EqualSteps` trims. ``(images, labels)``, ``[images,
    labels]``, ``{"image": ...}`` and a bare tensor count their first dimension; an
    object without a length counts as one sample.

    Example:
        >>> batch_samples((torch.zeros(4, 3, 2, 2), torch.zeros(4)))
        4
    """
    if isinstance(batch, Batch):
        return batch.size
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        return batch_samples(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, list | tuple):
        if batch and isinstance(batch[0], torch.Tensor | list | tuple | dict | Batch):
            return batch_samples(batch[0])
        return len(batch)
    try:
        return len(batch)
    except TypeError:
        return 1


def flag_group() -> Any:
    """The process group the ranks' per-step flags go over: a CPU-capable one (see the module docs).

    The default group when it takes CPU tensors; under a NCCL-only default group a gloo
    group made on first use and kept for that default group (making it is a collective:
    every rank calls this at the same point, as every rank's first agreement is).
    """
    world = dist.group.WORLD
    backend = str(dist.get_backend()).lower()
    if "gloo" in backend or "mpi" in backend or backend.startswith("cpu:") or not dist.is_gloo_available():
        return world
    if not _flag_group or _flag_group[0] is not world:  # none yet, or made for a group since destroyed
        _flag_group[:] = [world, dist.new_group(backend="gloo")]
    return _flag_group[1]


def every_rank_has_a_batch() -> Callable[[bool], bool]:
    """The per-step agreement of :class:`EqualSteps`: ``agree(mine)`` is whether every rank said True.

    One all-reduce (``MIN``) of one ``int32`` over :func:`flag_group`, on the device that
    group's backend takes; every rank must call it the same number of times.
    """
    group = flag_group()
    flag = torch.zeros(1, dtype=torch.int32, device=_flag_device(group))

    def agree(mine: bool) -> bool:
        flag.fill_(1 if mine else 0)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return bool(flag.item())

    return agree


def _flag_device(group: Any) -> torch.device:
    """Where the flag tensor lives: the CPU, unless the group is device-only (NCCL without gloo)."""
    backend = str(dist.get_backend(group)).lower()
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class EqualSteps(Generic[T]):
    """Iterates any iterable of batches so that every rank yields the same number of them.

    Under a process group of more than one rank, before each batch the ranks agree
    whether every rank still has one; the first time one has none, every rank stops at
    that step and reads the rest of its batches without yielding them (counted in
    :attr:`trimmed`). Alone it yields every batch. Every rank must iterate it in step. A
    stoker :class:`~stoker.Loader` made with ``even=True`` keeps the ranks in step itself
    and is passed through.

    Args:
        batches: any iterable of batches (a ``DataLoader``, a stoker loader, a generator).
        samples: how many samples a batch holds; default :func:`batch_samples`.
        agree: called with whether this rank has a batch, returns whether every rank has
            one; default: one all-reduce over the process group (:func:`every_rank_has_a_batch`).

    Attributes:
        trimmed: samples this rank read in the last pass but did not yield.
        steps: batches yielded in the last (or current) pass, the same on every rank.
        trimmed_batches: batches this rank read in the last pass but did not yield.

    Example:
        >>> steps = EqualSteps(torch.utils.data.DataLoader(range(10), batch_size=4))
        >>> [len(b) for b in steps], steps.trimmed  # alone: every batch
        ([4, 4, 2], 0)
    """

    def __init__(
        self,
        batches: Iterable[T],
        *,
        samples: Callable[[T], int] = batch_samples,
        agree: Callable[[bool], bool] | None = None,
    ) -> None:
        self.batches = batches
        self.samples = samples
        self.agree = agree
        self.trimmed = 0
        self.trimmed_batches = 0
        self.steps = 0

    def __iter__(self) -> Iterator[T]:
        self.trimmed = self.trimmed_batches = self.steps = 0
        agree = self.agree
        source = self.batches
        if agree is None:
            keeper = source if isinstance(source, KeepsStepsEqual) and source.equal_steps else None
            if keeper is not None or not ranks_in_step():
                for batch in source:
                    self.steps += 1
                    yield batch
                self.trimmed = keeper.trimmed if keeper is not None else 0
                return
            agree = every_rank_has_a_batch()
        stream = iter(source)
        out = False  # this rank has no batch left
        while True:
            try:
                batch = next(stream)
            except StopIteration:
                out = True
            if not agree(not out):
                break
            self.steps += 1
            yield batch
        if not out:  # another rank is out: read the rest of this rank's (a few at most) and count it
            self._trim(batch)
            for rest in stream:
                self._trim(rest)

    @property
    def equal_steps(self) -> bool:
        """Always true: every rank gets the same number of batches from a pass (so wrapping it again agrees once)."""
        return True

    def _trim(self, batch: T) -> None:
        self.trimmed += self.samples(batch)
        self.trimmed_batches += 1

    def __repr__(self) -> str:
        return f"EqualSteps({self.batches!r})"
