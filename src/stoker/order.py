"""The order of an epoch: one seed rule, one permutation, one buffer shuffle, one split by rank and worker.

Every reader of stoker takes its order from here (the map-style samplers, the loader's
worker seeds, the ``Pipe``'s ``shuffle`` and ``shard``, ``ShardStream``, the pack plan):

* **Seed**: :func:`epoch_seed` ``(seed, epoch, *stream)``; ``stream`` names what the numbers are for.
* **Order**: :func:`permutation` ``(n, seed, epoch)``; a shuffle buffer as large as the stream gives the same.
* **Split**: position ``i`` goes to rank ``i % R``, and within a rank's share to its workers
  in blocks of ``block`` items, round robin (:func:`reader_of`, :func:`share`).
* **Batches**: blocks of one batch, so a rank's batches depend on the seed, the epoch, the
  rank count and the batch size, never on the worker count or the backend.
* **Blocks**: a shard set larger than its cache shuffles in blocks of shards (:func:`block_permutation`).
* **Trim**: only an even split trims (:func:`even_trim`); ``len()`` is this rank's share.

The rule in full is in the loading guide (``docs/guides/loading.md``, "The order of an epoch, exactly").

Example:
    >>> order = permutation(10, seed=0, epoch=0)
    >>> sorted(order.tolist()) == list(range(10))
    True
    >>> parts = [share(order, rank=r, world_size=2, worker=w, num_workers=2) for r in (0, 1) for w in (0, 1)]
    >>> sorted(int(x) for p in parts for x in p) == list(range(10))
    True
    >>> [len(p) for p in parts], share_size(10, rank=0, world_size=2)
    ([3, 2, 3, 2], 5)
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Literal, TypeVar

import numpy as np

from stoker.errors import ConfigError

__all__ = [
    "BLOCKS",
    "BUFFER",
    "INTERLEAVE",
    "LOADER_SEED",
    "PACK",
    "SHUFFLE_SCOPES",
    "WORKER_SEEDS",
    "ShuffleBlocks",
    "ShuffleScope",
    "block_permutation",
    "batches_before",
    "buffer_shuffle_array",
    "buffer_shuffle_stream",
    "check_placement",
    "epoch_rng",
    "epoch_seed",
    "even_trim",
    "iter_share",
    "permutation",
    "reader_of",
    "share",
    "share_size",
]

T = TypeVar("T")

# What the numbers of an epoch are for, as the first integer of ``stream`` (the epoch's
# order itself has an empty stream).
BUFFER = 1  # a rank's shuffle buffer: (BUFFER, rank, 0), the 0 where a worker id stood before the batch split
WORKER_SEEDS = 2  # the base seed of the loader's worker processes
PACK = 3  # the pack plan: (PACK, crc32(split))
LOADER_SEED = 4  # a Pipe's order in a DataLoader epoch it was never told: (LOADER_SEED, base seed)
INTERLEAVE = 5  # ShardStream's merge of the rows of the shards it reads at once: (INTERLEAVE,)
BLOCKS = 6  # a block shuffle: (BLOCKS,) for the order of the shards, (BLOCKS, b) for the samples of block b

ShuffleScope = Literal["auto", "split", "blocks"]
# What a map-style shuffle spans: "split", the whole split at once; "blocks", blocks of shards that fit
# the cache (block_permutation); "auto", blocks where the split does not fit its cache, else the split.
SHUFFLE_SCOPES: tuple[ShuffleScope, ...] = ("auto", "split", "blocks")

_PICKS = 1024  # buffer positions drawn at a time (a fixed count, so the draws never depend on the caller)


def _words(parts: tuple[int, ...]) -> list[int]:
    """Each integer as two 32-bit words (taken mod 2**64), then how many there were.

    The fixed width and the trailing count keep every tuple's words distinct (numpy's
    ``SeedSequence`` would read ``[a, b]`` and ``[a, b, 0]`` alike).
    """
    words: list[int] = []
    for part in parts:
        if isinstance(part, bool):
            raise ConfigError(f"order: seeds, epochs and stream ids are integers, got {part!r}")
        try:
            value = operator.index(part) % 2**64
        except TypeError:
            raise ConfigError(f"order: seeds, epochs and stream ids are integers, got {part!r}") from None
        words += [value & 0xFFFFFFFF, value >> 32]
    words.append(len(parts))
    return words


def epoch_seed(seed: int, epoch: int, *stream: int) -> int:
    """The 63-bit seed of ``stream`` in ``epoch`` of a run seeded ``seed``: the one seed rule.

    Args:
        seed: the run's (or reader's) seed; any integer, taken mod 2**64.
        epoch: the epoch number.
        stream: what the numbers are for: nothing for the epoch's order, else a
            purpose (:data:`BUFFER`, :data:`WORKER_SEEDS`, :data:`PACK`) and its ids.

    Returns:
        An integer in ``[0, 2**63)``, the same in every process (fit for
        ``torch.manual_seed``, ``random.Random`` or numpy).

    Raises:
        ConfigError: a part is not an integer.

    Example:
        >>> epoch_seed(0, 1) == epoch_seed(0, 1) != epoch_seed(0, 2)
        True
        >>> epoch_seed(0, 1) != epoch_seed(0, 1, BUFFER, 0, 0)
        True
    """
    state = np.random.SeedSequence(_words((seed, epoch, *stream))).generate_state(1, np.uint64)
    return int(state[0]) >> 1


def epoch_rng(seed: int, epoch: int, *stream: int) -> np.random.Generator:
    """A numpy generator seeded by :func:`epoch_seed` ``(seed, epoch, *stream)``.

    Example:
        >>> int(epoch_rng(0, 0).integers(1000)) == int(epoch_rng(0, 0).integers(1000))
        True
    """
    return np.random.default_rng(epoch_seed(seed, epoch, *stream))


def permutation(n: int, seed: int, epoch: int, *stream: int) -> np.ndarray:
    """The order of ``n`` items in ``epoch``: a permutation of ``0..n-1`` (``int64``).

    Example:
        >>> permutation(5, seed=0, epoch=0).tolist() == permutation(5, seed=0, epoch=0).tolist()
        True
        >>> sorted(permutation(5, seed=0, epoch=1).tolist())
        [0, 1, 2, 3, 4]
    """
    if n < 0:
        raise ConfigError(f"permutation: n must be >= 0, got {n}")
    return epoch_rng(seed, epoch, *stream).permutation(int(n)).astype(np.int64, copy=False)


@dataclass(frozen=True)
class ShuffleBlocks:
    """How a block shuffle groups the shards of a split (see :func:`block_permutation`).

    Attributes:
        sizes: samples of each shard, in the split's order.
        costs: what each shard takes in the cache (bytes).
        budget: the most a block's shards may take together (a block holds one shard at least).
        positions: the items in shard order (those of shard 0, then of shard 1...), for items
            not numbered so (a view of some rows of a split); None: items ``0..n-1`` are.
    """

    sizes: tuple[int, ...]
    costs: tuple[int, ...]
    budget: int
    positions: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.costs) or any(v < 0 for v in (*self.sizes, *self.costs)) or self.budget < 1:
            raise ConfigError(f"ShuffleBlocks: one size and one cost (>= 0) per shard and a budget >= 1, got {self!r}")
        if self.positions is not None and len(self.positions) != sum(self.sizes):
            raise ConfigError(f"ShuffleBlocks: {len(self.positions)} positions for {sum(self.sizes)} items")

    def blocks(self, shard_order: np.ndarray) -> list[np.ndarray]:
        """``shard_order`` cut into blocks: consecutive shards whose costs sum to at most :attr:`budget`.

        Example:
            >>> [b.tolist() for b in ShuffleBlocks((1, 1, 1), (4, 4, 9), budget=8).blocks(np.arange(3))]
            [[0, 1], [2]]
        """
        out: list[np.ndarray] = []
        start, used = 0, 0
        for at, shard in enumerate(shard_order.tolist()):
            cost = self.costs[shard]
            if at > start and used + cost > self.budget:
                out.append(shard_order[start:at])
                start, used = at, 0
            used += cost
        if start < len(shard_order):
            out.append(shard_order[start:])
        return out

    def smallest_block(self) -> int:
        """Samples that every block but an epoch's last holds at least (whatever the shard order).

        A block ends where the next shard would pass the budget, so it holds at least
        ``budget // max(costs)`` shards (one at least), each of at least ``min(sizes)`` samples.
        """
        if not self.sizes:
            return 0
        return max(1, self.budget // max(max(self.costs), 1)) * min(self.sizes)

    def budget_for(self, samples: int) -> int:
        """A budget whose every block (but an epoch's last) holds at least ``samples`` samples."""
        if not self.sizes:
            return self.budget
        return -(-max(samples, 1) // max(min(self.sizes), 1)) * max(self.costs)

    def plan(self) -> dict[str, int]:
        """What fixes the grouping beyond seed and epoch: plain values for a loader's state (``order_plan``)."""
        return {"shuffle_blocks_budget": int(self.budget)}  # a view's rows come from the split's seed, also in the state


def block_permutation(blocks: ShuffleBlocks, seed: int, epoch: int) -> np.ndarray:
    """The order of an epoch shuffled in blocks of shards: a permutation of ``0..n-1`` (``int64``).

    The shards are permuted, cut into blocks (:meth:`ShuffleBlocks.blocks`), and each
    block's samples permuted; sample ``i`` of the split is row ``i - start`` of the shard
    whose samples start at ``start`` (or, with :attr:`ShuffleBlocks.positions`, item
    ``positions[i]``). All of the split in one block: :func:`permutation`.

    Example:
        >>> b = ShuffleBlocks(sizes=(3, 3, 3), costs=(1, 1, 1), budget=1)
        >>> order = block_permutation(b, seed=0, epoch=0)
        >>> sorted(order.tolist()) == list(range(9)), sorted(order[:3] // 3) == [order[0] // 3] * 3
        (True, True)
        >>> whole = ShuffleBlocks(sizes=(3, 3), costs=(1, 1), budget=2)
        >>> block_permutation(whole, 0, 0).tolist() == permutation(6, 0, 0).tolist()
        True
    """
    sizes = np.asarray(blocks.sizes, dtype=np.int64)
    n = int(sizes.sum())
    if sum(blocks.costs) <= blocks.budget and blocks.positions is None:
        return permutation(n, seed, epoch)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    shard_order = permutation(len(sizes), seed, epoch, BLOCKS)
    out = np.empty(n, dtype=np.int64)
    at = 0
    for b, block in enumerate(blocks.blocks(shard_order)):
        items = np.concatenate([np.arange(starts[s], starts[s] + sizes[s], dtype=np.int64) for s in block.tolist()])
        out[at : at + len(items)] = items[permutation(len(items), seed, epoch, BLOCKS, b)]
        at += len(items)
    return out if blocks.positions is None else np.asarray(blocks.positions, dtype=np.int64)[out]


def buffer_shuffle_stream(items: Iterable[T], buffer_size: int, rng: np.random.Generator) -> Iterator[T]:
    """Yield ``items`` in an order drawn from ``rng`` through a buffer of ``buffer_size`` items.

    The buffer fills with the first items; then each new item takes the place of a
    randomly drawn one, which is yielded; at the end the buffer is yielded in a random
    order. Memory stays at ``buffer_size`` items. A buffer at least as large as the
    stream gives ``items[rng.permutation(len(items))]``: a full shuffle.

    Args:
        items: the stream (read once, lazily).
        buffer_size: items held at a time (at least 1).
        rng: where the draws come from, normally :func:`epoch_rng`.

    Raises:
        ConfigError: ``buffer_size`` below 1.

    Example:
        >>> sorted(buffer_shuffle_stream(range(5), 3, epoch_rng(0, 0)))
        [0, 1, 2, 3, 4]
        >>> list(buffer_shuffle_stream(range(4), 10, epoch_rng(0, 0))) == permutation(4, 0, 0).tolist()
        True
    """
    size = _buffer_size(buffer_size, "buffer_shuffle_stream")
    buffer: list[T] = []
    picks: list[int] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        if not picks:
            picks = rng.integers(0, size, _PICKS).tolist()[::-1]  # popped from the end, in drawn order
        index = picks.pop()
        yield buffer[index]
        buffer[index] = item
    for index in rng.permutation(len(buffer)).tolist():
        yield buffer[index]


def buffer_shuffle_array(items: np.ndarray, buffer_size: int, rng: np.random.Generator) -> np.ndarray:
    """:func:`buffer_shuffle_stream` of an array, all at once: the same order from the same draws, without a loop per item.

    Step ``t`` of the buffer loop writes item ``buffer_size + t`` into the drawn slot
    ``picks[t]`` and yields what that slot held: the item the slot's previous step wrote,
    or the slot's first item. Sorting the steps by slot (then by time) puts each step
    next to the one before it in its slot, so every yield is known at once; the buffer
    left at the end is each slot's last write, yielded in ``rng.permutation`` order. The
    draws are the loop's, in its order (``_PICKS`` at a time), so ``rng`` ends in the same
    state.

    Example:
        >>> a = buffer_shuffle_array(np.arange(50), 8, epoch_rng(0, 0))
        >>> a.tolist() == list(buffer_shuffle_stream(range(50), 8, epoch_rng(0, 0)))
        True
    """
    size, items = _buffer_size(buffer_size, "buffer_shuffle_array"), np.asarray(items)
    n = len(items)
    if n <= size:  # the loop only fills the buffer, then yields it in a random order
        return items[rng.permutation(n)]
    steps = n - size
    picks = np.concatenate([rng.integers(0, size, _PICKS) for _ in range(-(-steps // _PICKS))])[:steps]
    # The steps, slot by slot, each slot's in time order: a stable sort (a radix sort for slots that fit 16 bits).
    by_slot = np.argsort(picks.astype(np.uint16) if size <= 1 << 16 else picks, kind="stable")
    slots = picks[by_slot]
    written = size + by_slot  # the item each of those steps writes
    first = np.ones(steps, dtype=bool)
    first[1:] = slots[1:] != slots[:-1]
    held = np.where(first, slots, np.concatenate(([0], written[:-1])))  # what the slot held before the step
    out = np.empty(n, dtype=np.int64)
    out[by_slot] = held
    last = np.append(first[1:], True)  # a slot's last step is the one before the next slot's first
    left = np.arange(size, dtype=np.int64)
    left[slots[last]] = written[last]
    out[steps:] = left[rng.permutation(size)]
    return items[out]



def _buffer_size(value: object, where: str) -> int:
    """``value`` as a buffer size (a positive integer); ConfigError naming ``where`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{where}: buffer_size must be a positive integer, got {value!r}")
    return int(value)


def check_placement(rank: object, world_size: object, worker: object = 0, num_workers: object = 1, where: str = "order") -> None:
    """Raise unless ``0 <= rank < world_size`` and ``0 <= worker < num_workers`` (integers).

    Raises:
        ConfigError: naming the value out of range, prefixed with ``where``.
    """
    for index_name, index, count_name, count in (
        ("rank", rank, "world_size", world_size),
        ("worker", worker, "num_workers", num_workers),
    ):
        if not (
            isinstance(index, (int, np.integer)) and isinstance(count, (int, np.integer))
            and not isinstance(index, bool) and not isinstance(count, bool) and 0 <= index < count
        ):
            raise ConfigError(
                f"{where}: {index_name}={index!r} with {count_name}={count!r} is out of range; "
                f"expected integers with 0 <= {index_name} < {count_name}"
            )


def reader_of(position: int, world_size: int, num_workers: int = 1, block: int = 1) -> tuple[int, int]:
    """``(rank, worker)`` that reads ``position`` of an epoch's order: the split rule itself.

    Example:
        >>> [reader_of(i, world_size=2, num_workers=2) for i in range(6)]
        [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0), (1, 0)]
        >>> [reader_of(i, world_size=1, num_workers=2, block=2)[1] for i in range(6)]
        [0, 0, 1, 1, 0, 0]
    """
    return position % world_size, (position // world_size // block) % num_workers


def even_trim(n: int, world_size: int) -> int:
    """Items an even split drops from the end of an epoch's order of ``n``: ``n % world_size``.

    Example:
        >>> even_trim(10, 3)
        1
    """
    return n % world_size


def share(
    order: np.ndarray, rank: int, world_size: int, worker: int = 0, num_workers: int = 1, *, block: int = 1, even: bool = False
) -> np.ndarray:
    """The items of ``order`` (an epoch's order) that ``(rank, worker)`` reads, in the order it reads them.

    Args:
        order: the epoch's order (any 1-D array).
        rank, world_size: the rank and the number of ranks.
        worker, num_workers: the worker of that rank and the rank's number of workers.
        block: items of the rank's share dealt to one worker at a time.
        even: first drop the last ``len(order) % world_size`` items (:func:`even_trim`).

    Raises:
        ConfigError: a placement out of range, or ``block`` below 1.

    Example:
        >>> share(np.arange(7), rank=1, world_size=2).tolist()
        [1, 3, 5]
        >>> share(np.arange(7), rank=0, world_size=2, even=True).tolist()
        [0, 2, 4]
        >>> share(np.arange(8), rank=0, world_size=1, worker=1, num_workers=2, block=2).tolist()
        [2, 3, 6, 7]
    """
    check_placement(rank, world_size, worker, num_workers)
    if block < 1:
        raise ConfigError(f"order: block must be >= 1, got {block}")
    if even:
        order = order[: len(order) - even_trim(len(order), world_size)]
    mine = order[rank::world_size]
    if num_workers == 1:
        return mine
    return mine[np.arange(len(mine)) // block % num_workers == worker]


def iter_share(
    items: Iterable[T], rank: int, world_size: int, worker: int = 0, num_workers: int = 1, *, block: int = 1
) -> Iterator[T]:
    """The items of a stream that ``(rank, worker)`` reads: the rule of :func:`share`, nothing trimmed.

    Example:
        >>> list(iter_share(range(10), rank=1, world_size=2, worker=1, num_workers=2))
        [3, 7]
    """
    check_placement(rank, world_size, worker, num_workers)
    if block < 1:
        raise ConfigError(f"order: block must be >= 1, got {block}")
    if block == 1:
        yield from islice(items, rank + world_size * worker, None, world_size * num_workers)
        return
    for position, item in enumerate(items):
        if reader_of(position, world_size, num_workers, block) == (rank, worker):
            yield item


def share_size(
    n: int, rank: int, world_size: int, worker: int | None = None, num_workers: int = 1, *, block: int = 1, even: bool = False
) -> int:
    """How many of an epoch's ``n`` items ``(rank, worker)`` reads; ``worker=None``: all of the rank's workers.

    Example:
        >>> [share_size(10, r, 3) for r in range(3)], [share_size(10, r, 3, even=True) for r in range(3)]
        ([4, 3, 3], [3, 3, 3])
        >>> [share_size(10, 0, 1, w, num_workers=3, block=2) for w in range(3)]
        [4, 4, 2]
    """
    check_placement(rank, world_size, 0 if worker is None else worker, num_workers)
    if block < 1:
        raise ConfigError(f"order: block must be >= 1, got {block}")
    if even:
        n -= even_trim(n, world_size)
    mine = len(range(rank, n, world_size))
    if worker is None:
        return mine
    cycle = block * num_workers
    left = mine - mine // cycle * cycle
    return mine // cycle * block + min(max(left - worker * block, 0), block)


def batches_before(batches: int, worker: int, num_workers: int) -> int:
    """How many of a rank's first ``batches`` batches worker ``worker`` of ``num_workers`` reads (batch ``b`` is worker ``b % N``'s).

    Example:
        >>> [batches_before(5, w, 2) for w in (0, 1)], [batches_before(5, w, 3) for w in (0, 1, 2)]
        ([3, 2], [2, 2, 1])
    """
    check_placement(0, 1, worker, num_workers, where="batches_before")
    if batches < 0:
        raise ConfigError(f"batches_before: batches must be >= 0, got {batches}")
    return max(0, -(-(batches - worker) // num_workers))
