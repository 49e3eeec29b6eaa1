"""How shard size, packing order and shuffle buffers mix the classes (labels only, no images).

The published write-up warns that shards cut from ordered data hurt convergence, and
that the shard size trades disk efficiency against shuffling. This script measures the
mixing score of :func:`stoker.shuffle_quality` (1 = as mixed as a random
permutation, 0 = as bad as class-sorted) for:

* a shard stream (shard order shuffled, then a per-reader buffer, as ``ShardStream``
  reads) over shards packed from class-sorted data without shuffling, and from shuffled
  data (what ``stoker pack`` does), for several shard sizes and buffers;
* a ``Pipe`` shuffle buffer over files listed class by class, for several buffers.

Run::

    python benchmarks/bench_shuffle_quality.py --n 100000 --classes 1000 --batch-size 256
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from stoker.bench import shuffle_quality, simulate_buffer_shuffle, suggest_buffer_size
from stoker.shards import stream_order


def _stream(pack_labels: np.ndarray, shard: int, buffer: int, seed: int) -> np.ndarray:
    sizes = [len(pack_labels[i : i + shard]) for i in range(0, len(pack_labels), shard)]
    order = stream_order(sizes, seed=seed, epoch=0, shuffle=True, shuffle_buffer=buffer,
                         rank=0, world_size=1, worker=0, num_workers=1)
    return pack_labels[order]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--classes", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.classes < 2 or args.n < args.classes:
        parser.error(f"need --classes >= 2 and --n >= --classes (got n={args.n}, classes={args.classes})")

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
    return 0


if __name__ == "__main__":
    sys.exit(main())
