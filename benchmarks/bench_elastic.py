"""What the batch split costs a ShardStream worker: its epoch's order, split by batch against split by worker.

Split by batch (elastic), each worker computes its rank's whole order (the rank's share of
the epoch through one buffer) and keeps its batches; split by worker (the split a remote
set larger than its cache still takes, and every stream took before), it shuffles its own
share only. Both are timed one right after the other in rounds of A B B A (B A A B the
next), at least 5, and the table gives the ratio by batch / by worker per round, its
median and spread.

Usage: ``python benchmarks/bench_elastic.py [--rows 1000000] [--shards 1000] [--workers 8]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from stoker.shards import stream_order


def _seconds(fn: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="samples in the split")
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8, help="loader workers of the rank")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--buffer", type=int, default=10_000, help="shuffle buffer rows")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="orders computed per timing")
    args = parser.parse_args()
    sizes = [args.rows // args.shards] * args.shards

    def order(by_batch: bool) -> Callable[[], object]:
        return lambda: stream_order(sizes, seed=0, epoch=1, shuffle=True, shuffle_buffer=args.buffer, rank=0,
                                    world_size=1, worker=1, num_workers=args.workers, block_rows=args.batch,
                                    by_batch=by_batch)

    ratios, per_worker = [], []
    for round_ in range(max(args.rounds, 5)):
        seq = (True, False, False, True) if round_ % 2 == 0 else (False, True, True, False)
        took = {True: 0.0, False: 0.0}
        for by_batch in seq:
            took[by_batch] += _seconds(order(by_batch), args.repeat)
        ratios.append(took[True] / took[False])
        per_worker.append(took[True] / 2)
    print(f"{args.rows:,} rows in {args.shards} shards, {args.workers} workers, batch {args.batch}, "
          f"buffer {args.buffer:,}")
    print("rounds (by batch / by worker):", " ".join(f"{r:.2f}" for r in ratios))
    print(f"median {statistics.median(ratios):.2f}x, spread {min(ratios):.2f}-{max(ratios):.2f}; "
          f"a worker's order by batch: {statistics.median(per_worker) * 1000:.0f} ms per epoch")


if __name__ == "__main__":
    main()
