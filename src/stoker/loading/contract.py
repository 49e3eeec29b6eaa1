"""The reader contract: what stoker's loader asks of a data set, written down as protocols.

Any torch ``Dataset`` or ``IterableDataset`` can be given to :func:`~stoker.make_loader`;
what a reader can do beyond that (start an epoch's order, resume in the middle of it,
read a batch in one call, make its own batches, say how it is read fastest, say whether
it drops bad samples) is one small protocol each, and the loader asks with
``isinstance(dataset, SupportsX)`` (the protocols are ``runtime_checkable``: a reader
conforms by having the member, whether or not it names the protocol).

Two composites say what a reader is as a whole, and stoker's readers name the one they
claim in their class line, so mypy checks every signature:

* :class:`MapReader`: random access by index, a batch at a time, with a bad-sample
  policy (``FileDataset`` and its layouts, ``ShardDataset``).
* :class:`StreamReader`: an iterable that reads the order of the epoch it is set to and
  can start anywhere in it (``Pipe``, ``ShardStream``).

Example:
    >>> class Squares:
    ...     def set_epoch(self, epoch: int, /) -> None: ...
    >>> isinstance(Squares(), SupportsEpoch)
    True
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from stoker.loading.skips import OnError
from stoker.order import ShuffleBlocks, ShuffleScope

if TYPE_CHECKING:
    import torch

__all__ = [
    "MapReader",
    "StreamReader",
    "SupportsBatchLists",
    "SupportsBatchSplit",
    "SupportsBatchesFrom",
    "SupportsCollate",
    "SupportsEpoch",
    "SupportsGetItems",
    "SupportsIterFrom",
    "SupportsLoaderDefaults",
    "SupportsOnError",
    "SupportsOrderPlan",
    "SupportsShuffleBlocks",
    "SupportsReadFor",
]


@runtime_checkable
class SupportsEpoch(Protocol):
    """A reader whose order depends on the epoch (as ``DistributedSampler.set_epoch``)."""

    def set_epoch(self, epoch: int, /) -> None:
        """Read the order of ``epoch`` on the next iteration.

        The loader calls it before every epoch, in the main process and (for an
        iterable) in each worker, so the order is a function of the reader's seed and
        ``epoch`` alone, the same in every process and after a resume. A map-style
        reader shuffled by the loader's sampler may do nothing.
        """


@runtime_checkable
class SupportsIterFrom(Protocol):
    """An iterable that can start at a position of its epoch without reading what comes before."""

    def iter_from(self, start: int, /) -> Iterator[Any]:
        """This process's items of the current epoch from item ``start`` on (``iter_from(0)`` is ``iter``).

        The items must be exactly those an uninterrupted pass gives after its first
        ``start``: the loader resumes an epoch by giving each worker the number of items
        it had already batched. Without it the loader reads and discards them.
        """
        ...


@runtime_checkable
class SupportsGetItems(Protocol):
    """A map-style reader that reads a batch of samples in one call (torch's ``__getitems__``)."""

    def __getitems__(self, indices: list[int], /) -> Sequence[Any]:
        """The samples (or :class:`~stoker.loading.skips.Skipped` markers) at ``indices``, in order.

        Torch's DataLoader and stoker's thread backend call it once per batch, so a
        reader can gather a batch's rows at once; the result goes to the collate
        function as it is.
        """
        ...


@runtime_checkable
class SupportsCollate(Protocol):
    """A reader that makes its own batches (the loader's default ``collate_fn``)."""

    def collate_fn(self, samples: Any, /) -> Any:
        """One batch from what a batch's reads returned (a list of samples, or ``__getitems__``'s result).

        Returning a :class:`~stoker.loading.collate.Batch` lets the loader count the bad
        samples dropped; a batch of size 0 (every sample was bad) is not yielded.
        Usually a ``staticmethod``.
        """
        ...


@runtime_checkable
class SupportsBatchesFrom(Protocol):
    """An iterable whose reads are the loader's batches: it hands them over whole, already collated.

    Item by item, a DataLoader pulls ``batch_size`` items through Python one at a time and
    collates them, copying every image a second time; a reader that reads a batch's rows
    in one call anyway (``ShardStream``) can give the batch itself. The loader takes this
    path only with the reader's own ``collate_fn``, and only where
    :meth:`take_batch_size` says the batches are exactly those of the item-by-item path.
    """

    def take_batch_size(self, batch_size: int, /) -> bool:
        """The loader's batch size, told once as the loader is made (a reader may size its reads by it).

        Returns True when :meth:`batches_from` gives, for ``batch_size``, exactly the
        batches item-by-item reading would; the loader then reads that way.
        """
        ...

    def batches_from(self, start: int, batch_size: int, /) -> Iterator[tuple[int, Any]]:
        """This process's items of the epoch from ``start`` (a multiple of ``batch_size``) on, a batch at a time.

        Each element is ``(items, batch)``: how many items the batch stands for (bad
        samples included, so the loader counts positions as item by item) and what
        ``collate_fn`` makes of them. Every batch holds ``batch_size`` items but the last.
        """
        ...


@runtime_checkable
class SupportsBatchSplit(Protocol):
    """A stream that deals its rank's order to the loader's workers a batch at a time: elastic.

    Batch ``b`` of the rank is items ``[b * B, (b + 1) * B)`` of the rank's order, read whole
    by worker ``b % N`` (:mod:`stoker.order`, "Batches"), so the batches do not depend on the
    worker count or the backend, and a position taken under one worker count resumes under
    another.
    """

    def split_by_batch(self, batch_size: int, /) -> bool:
        """Deal this rank's order in blocks of ``batch_size`` items from now on.

        The loader calls it as it is made, in its own process, and before every epoch in
        each worker. Returns True when the reader does so; False when it cannot (a ``Pipe``
        whose split is not the loader's to make), and the loader then keeps the worker
        count fixed for its state.
        """
        ...


@runtime_checkable
class SupportsBatchLists(Protocol):
    """A stream that cuts its own batches, so that items dropped after the cut shorten a batch, never shift one.

    A stage that drops items (a filter, a bad sample skipped) makes a stream's positions
    depend on the data; batched item by item, one drop would move every later batch's
    boundary. A reader of this kind fixes each batch's boundary where its order is dealt
    (``Pipe``: at ``shard()``) and runs what follows on one batch at a time.
    """

    def batch_lists_from(self, start: int, batch_size: int, /) -> Iterator[tuple[int, list[Any]]]:
        """This process's batches of the epoch from item ``start`` (a multiple of ``batch_size``) on, uncollated.

        Each element is ``(items, samples)``: how many items of the order the batch stands
        for (``batch_size`` but the last; the loader counts positions in these) and the
        samples left of them, which the loader's collate function makes into the batch.
        """
        ...


@runtime_checkable
class SupportsLoaderDefaults(Protocol):
    """A reader that knows the loader settings that read it fastest."""

    @property
    def loader_defaults(self) -> Mapping[str, Any]:
        """``make_loader`` keyword arguments (``num_workers``, ``backend``) used where the caller gave none."""
        ...


@runtime_checkable
class SupportsReadFor(Protocol):
    """A reader that decodes where the batches go: ``make_loader`` tells it the loader's device (a reader that may
    decode on a GPU must not decode there for a run that trains on the CPU, then copy back)."""

    def read_for(self, device: torch.device) -> None:
        """The device the batches of the loader being made go to."""
        ...


@runtime_checkable
class SupportsOrderPlan(Protocol):
    """A reader whose order depends on settings besides the seed, the epoch and the placement.

    The loader records the plan in its state and refuses a state taken under another
    (:meth:`~stoker.Loader.load_state_dict`): resumed mid-epoch under another plan, the
    rest of that epoch would read some samples twice and others not at all.
    """

    def order_plan(self) -> Mapping[str, Any]:
        """What fixes this reader's order beyond seed, epoch and placement: plain values, compared on resume."""
        ...


@runtime_checkable
class SupportsShuffleBlocks(Protocol):
    """A map-style reader whose samples live in files that a cache holds a few at a time (a remote shard set).

    The sampler asks it how to group its shuffle (:func:`stoker.order.block_permutation`),
    so that every stretch of an epoch reads only the files the cache holds at once.
    """

    def shuffle_blocks(self, scope: ShuffleScope, /) -> ShuffleBlocks | None:
        """The grouping for a shuffle of this ``scope`` (``"auto"``, ``"split"``, ``"blocks"``); None: one shuffle of the whole split."""
        ...


@runtime_checkable
class SupportsOnError(Protocol):
    """A reader with a bad-sample policy.

    ``on_error == "raise"`` promises that every sample read is a sample (a bad one
    raises), so a batch is never empty: under the even rank split the loader then knows
    every rank's number of steps without asking the others (:mod:`stoker.loading.steps`).
    Under ``"skip"`` a batch can come out empty, and the ranks agree at every step.
    """

    on_error: OnError


@runtime_checkable
class MapReader(SupportsGetItems, SupportsOnError, Protocol):
    """A map-style reader: ``len``, ``reader[i]``, ``__getitems__`` and a bad-sample policy."""

    def __len__(self) -> int:
        """Samples in the data set (the loader's sampler draws indices below it)."""
        ...

    def __getitem__(self, index: int, /) -> Any:
        """Sample ``index``: ``(image, label)``, or a ``Skipped`` marker under ``on_error="skip"``."""
        ...


@runtime_checkable
class StreamReader(SupportsEpoch, SupportsIterFrom, SupportsCollate, Protocol):
    """An iterable reader: the epoch's order from :meth:`set_epoch`, resumable with :meth:`iter_from`.

    Under DataLoader workers and ``torch.distributed`` ranks each process reads its own
    part of the epoch, so over all of them every item is read once; stoker's readers deal
    a rank's part to its workers a batch at a time (:class:`SupportsBatchSplit`). The
    ranks' parts may differ in length: the loader keeps their steps equal
    (:mod:`stoker.loading.steps`).
    """

    def __iter__(self) -> Iterator[Any]:
        """This process's items of the current epoch (``iter_from(0)``)."""
        ...
