"""How shard size, packing order and shuffle buffers mix the classes (labels only, no images).

The published write-up warns that shards cut from ordered data hurt convergence, and
that the shard size trades disk efficiency against shuffling. This script measures the
mixing score of :func:`stoker.shuffle_quality` (1 = as mixed as a random
permutation, 0 = as bad as class-sorted) for:

* a shard stream (shard order shuffled, then a per-reader buffer, as ``ShardStream``
  reads) over shards packed from class-sorted data without shuffling, and from shuffled
  data (what ``stoker pack`` does), for several shard sizes and buffers;
* a ``Pipe`` shuffle buffer over files listed class by class, for several buffers;
* a class-sorted pack cut into shards of one class each (``stoker pack d p --no-shuffle
  --shard-samples N``), read as a DataLoader delivers it with 0 or 2 workers on 1 or 2
  ranks: classes per batch and the score when the stream reads one shard at a time (as
  before issue 21) and several at once (``shards_at_once``, the default now), next to a
  shuffled pack's;
* a map-style set larger than its cache, shuffled in blocks of shards (``--blocks``,
  :func:`stoker.order.block_permutation`), for several blocks, over a shuffled pack
  and a class-sorted one, on 1 and 2 ranks, next to the shuffle of the whole split.

Run::

    python benchmarks/bench_shuffle_quality.py --n 100000 --classes 1000 --batch-size 256
    python benchmarks/bench_shuffle_quality.py --n 10000 --classes 10 --batch-size 256 \
        --shard-samples 500 --buffer 500          # the one-class-per-shard table of the README
    python benchmarks/bench_shuffle_quality.py --n 100000 --classes 1000 --batch-size 256 \
        --blocks --shard-samples 1000             # the block shuffle of a set larger than its cache
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from stoker.bench import shuffle_quality, simulate_buffer_shuffle, suggest_buffer_size
from stoker.order import ShuffleBlocks
from stoker.shards import stream_order
from stoker.shards.check.quality import block_shuffle_quality, loader_stream_quality
from stoker.shards.read.stream import SHARDS_AT_ONCE, shards_at_once_for


def _stream(pack_labels: np.ndarray, shard: int, buffer: int, seed: int) -> np.ndarray:
    sizes = [len(pack_labels[i : i + shard]) for i in range(0, len(pack_labels), shard)]
    order = stream_order(sizes, seed=seed, epoch=0, shuffle=True, shuffle_buffer=buffer,
                         rank=0, world_size=1, worker=0, num_workers=1)
    return pack_labels[order]


def one_class_shards(n: int, classes: int, shard: int, buffer: int, batch_size: int, seed: int) -> list[str]:
    """Table rows: a class-sorted pack in shards of ``shard`` rows, one shard at a time vs several, vs shuffled."""
    sorted_labels = np.repeat(np.arange(classes), n // classes)
    shuffled_labels = np.random.default_rng(seed).permutation(sorted_labels)
    sizes = [len(sorted_labels[i : i + shard]) for i in range(0, len(sorted_labels), shard)]
    at_once = shards_at_once_for([1] * len(sizes), SHARDS_AT_ONCE)
    rows = [
        f"{len(sorted_labels)} labels, {classes} classes in {len(sizes)} shards of {shard} (class-sorted: "
        f"{max(shard * classes // len(sorted_labels), 1)} class(es) per shard), buffer {buffer}, batch {batch_size}\n",
        "| workers x ranks | one shard at a time (before) | "
        f"{at_once} shards at once (now) | shuffled pack, {at_once} at once |",
        "|---|---|---|---|",
    ]
    for workers, ranks in ((0, 1), (2, 1), (2, 2)):
        cells = []
        for labels, k in ((sorted_labels, 1), (sorted_labels, at_once), (shuffled_labels, at_once)):
            q = loader_stream_quality(labels, sizes, classes, batch_size=batch_size, workers=workers, ranks=ranks,
                                      seed=seed, shuffle_buffer=buffer, shards_at_once=k)
            cells.append(f"{q.classes_per_batch:.1f} classes/batch, score {q.score:.2f} {q.verdict}")
        rows.append(f"| {workers} x {ranks} | " + " | ".join(cells) + " |")
    return rows


def block_shuffles(n: int, classes: int, shard: int, batch_size: int, seed: int) -> list[str]:
    """Table rows: the block shuffle's score for blocks of 1..all shards, shuffled vs class-sorted packs, 1 and 2 ranks."""
    sorted_labels = np.repeat(np.arange(classes), n // classes)
    shuffled_labels = np.random.default_rng(seed).permutation(sorted_labels)
    sizes = tuple(len(sorted_labels[i : i + shard]) for i in range(0, len(sorted_labels), shard))
    rows = [
        f"{len(sorted_labels)} labels, {classes} classes in {len(sizes)} shards of {shard}, batch {batch_size}; "
        "score 1 = as mixed as a shuffle of the whole split\n",
        "| shards per block | shuffled pack, 1 rank | shuffled pack, 2 ranks | class-sorted pack, 1 rank | class-sorted pack, 2 ranks |",
        "|---:|---|---|---|---|",
    ]
    per_block = [k for k in (1, 2, 4, 8, 16, 64) if k < len(sizes)] + [len(sizes)]
    for k in per_block:
        blocks = ShuffleBlocks(sizes, (1,) * len(sizes), budget=k)
        cells = []
        for labels in (shuffled_labels, sorted_labels):
            for ranks in (1, 2):
                q = block_shuffle_quality(labels, blocks, classes, batch_size=batch_size, ranks=ranks, seed=seed)
                cells.append(f"{q.score:.2f} {q.verdict} ({q.classes_per_batch:.1f} classes/batch)")
        label = f"{k} (all: the plain shuffle)" if k == len(sizes) else str(k)
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--classes", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-samples", type=int, default=None,
                        help="also measure a class-sorted pack cut into shards of this many rows")
    parser.add_argument("--buffer", type=int, default=500, help="the stream's buffer for --shard-samples")
    parser.add_argument("--blocks", action="store_true",
                        help="only the block shuffle of a map-style set larger than its cache (shards of --shard-samples, default 1000)")
    args = parser.parse_args(argv)
    if args.classes < 2 or args.n < args.classes:
        parser.error(f"need --classes >= 2 and --n >= --classes (got n={args.n}, classes={args.classes})")

    if args.blocks:
        print("\n".join(block_shuffles(args.n, args.classes, args.shard_samples or 1_000, args.batch_size, args.seed)))
        return 0
    sorted_labels = np.repeat(np.arange(args.classes), args.n // args.classes)
    shuffled_labels = np.random.default_rng(args.seed).permutation(sorted_labels)
    score = lambda labels: shuffle_quality(labels, args.batch_size, args.classes, args.seed)  # noqa: E731

    print(f"{len(sorted_labels)} labels, {args.classes} classes, batch {args.batch_size}\n")
    print("| shards of | stream buffer | packed class-sorted | packed shuffled |")
    print("|---:|---:|---|---|")
    for shard in (1_000, 10_000):
        for buffer in (1_000, 10_000):
            a = score(_stream(sorted_labels, shard, buffer, args.seed))
            b = score(_stream(shuffled_labels, shard, buffer, args.seed))
            print(f"| {shard:,} | {buffer:,} | {a.score:.2f} {a.verdict} | {b.score:.2f} {b.verdict} |")

    print("\n| Pipe shuffle buffer | files listed class by class |")
    print("|---:|---|")
    for buffer in (100, 1_000, 10_000, 100_000):
        q = score(simulate_buffer_shuffle(sorted_labels, buffer, args.seed))
        print(f"| {buffer:,} | {q.score:.2f} {q.verdict} |")
    enough = suggest_buffer_size(sorted_labels, args.batch_size, args.classes, args.seed)
    print(f"\nsmallest power-of-two buffer that mixes class-sorted files well: {enough:,}")
    if args.shard_samples:
        print()
        print("\n".join(one_class_shards(args.n, args.classes, args.shard_samples, args.buffer, args.batch_size, args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
