"""stoker's file data set against a hand-written torchvision Dataset: the same files, crop, resize and workers.

The question: what does stoker's reading of one sample file cost beyond the decode and the
resize that both do? stoker keeps its guarantees on every read (the file opened lies
inside the data folder, checked on the open descriptor; regular files only; the size
and pixel limits read from the header before a decoder allocates; the error policy); the
hand-written Dataset reads ``torchvision.io.read_file``, decodes with
``torchvision.io.decode_image`` (RGB), crops and resizes with
``torchvision.transforms.v2.functional.resize``, and checks nothing.

Generated CelebA-like JPEGs (178x218), crop ``(40, 20, 138, 138)``, resized to 112x112,
batch 256, both through a DataLoader with the same worker processes (prefetch 4,
persistent). Each round times A B B A (B A A B in the next), each part half of
``--seconds``, so a drift of the machine's load within a round cancels. Two ratios per
round, stoker over the baseline:

- **images per second** (higher is better for stoker): what a training loop gets;
- **CPU seconds per image** of all processes (the main one and every worker; lower is
  better for stoker): what each sample costs, which another program on a shared machine
  changes less than it changes the rate.

Run::

    python benchmarks/bench_file_reader.py --n 2000 --rounds 7
    python benchmarks/bench_file_reader.py --quick   # smoke test, seconds
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker.data import open_data  # noqa: E402
from stoker.loading import make_loader  # noqa: E402
from stoker.sources.synthetic import make_celeba  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the baseline is bench_peers' own
from bench_peers import TorchvisionFiles  # noqa: E402

SIZE = (112, 112)
CROP = (40, 20, 138, 138)


class Timed:
    """One loader, made once (persistent workers): a timing runs whole passes, counting after each pass's first batch."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.me = psutil.Process()

    def _cpu_s(self) -> float:
        procs = [self.me, *self.me.children(recursive=True)]
        total = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def __call__(self, seconds: float) -> tuple[float, float, int]:
        """``(wall seconds, CPU seconds of every process, images)`` of at least ``seconds`` of loading."""
        seen, wall, cpu = 0, 0.0, 0.0
        while wall < seconds:
            batches = iter(self.loader)
            next(batches)  # a pass's first batch waits for the workers' first reads: not counted
            start, cpu_start = time.perf_counter(), self._cpu_s()
            for images, labels in batches:
                if tuple(images.shape[1:]) != (3, *SIZE):
                    raise RuntimeError(f"unexpected batch {tuple(images.shape)}")
                seen += len(labels)
                if wall + time.perf_counter() - start >= seconds:
                    break
            wall += time.perf_counter() - start
            cpu += self._cpu_s() - cpu_start
        return wall, cpu, seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="images")
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2, help="worker processes of both loaders")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds each loader is timed per round")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (at least 5)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 96 images, batch 16, 0.2 s per timing")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "stoker-bench-file-reader")
    args = parser.parse_args()
    if args.quick:
        args.n, args.classes, args.batch, args.seconds = 96, 4, 16, 0.2
    rounds = max(5, args.rounds)
    torch.set_num_threads(1)  # fit's setting where the loaders take the cores
    logging.getLogger("stoker").setLevel(logging.ERROR)
    folder = args.out / f"celeba-n{args.n}"
    if not (folder / "identity_CelebA.txt").exists():
        make_celeba(folder, args.n, classes=args.classes, progress=False, overwrite=True)
    data = open_data(folder, split="train", crop=CROP, image_size=SIZE, label_order="sorted")
    baseline = TorchvisionFiles([Path(p) for p in data.index.paths], [int(x) for x in data.labels], CROP)
    common: dict[str, Any] = {"batch_size": args.batch, "shuffle": True, "num_workers": args.workers, "prefetch_factor": 4}
    timers = {
        "stoker": Timed(make_loader(data, backend="process", device=None, **common)),
        "torchvision": Timed(torch.utils.data.DataLoader(baseline, persistent_workers=args.workers > 0, **common)
                             if args.workers else torch.utils.data.DataLoader(baseline, batch_size=args.batch, shuffle=True)),
    }
    rates: list[float] = []
    costs: list[float] = []
    for r in range(rounds):
        order = ("stoker", "torchvision", "torchvision", "stoker") if r % 2 == 0 else (
            "torchvision", "stoker", "stoker", "torchvision")
        sums = {name: np.zeros(3) for name in timers}
        for name in order:
            sums[name] += np.asarray(timers[name](args.seconds / 2))
        rate = {name: s[2] / s[0] for name, s in sums.items()}
        cost = {name: s[1] / s[2] for name, s in sums.items()}
        rates.append(rate["stoker"] / rate["torchvision"])
        costs.append(cost["stoker"] / cost["torchvision"])
        print(f"  round {r + 1}: stoker {rate['stoker']:,.0f} img/s, {cost['stoker'] * 1e6:,.0f} CPU-us/img; torchvision "
              f"{rate['torchvision']:,.0f} img/s, {cost['torchvision'] * 1e6:,.0f} CPU-us/img", file=sys.stderr, flush=True)
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"\n`python benchmarks/bench_file_reader.py {' '.join(sys.argv[1:])}` — {len(data):,} JPEGs 178x218, crop {CROP}, "
          f"resized to {SIZE[0]}x{SIZE[1]}, batch {args.batch}, {args.workers} worker processes each, {cores} cores, "
          f"torch {torch.__version__}, {rounds} interleaved rounds of {args.seconds:g} s per loader, load average at the "
          f"end {load}\n")
    print("| stoker file data set / hand-written torchvision Dataset | ratio by round | median | spread |")
    print("|---|---|---:|---:|")
    for label, values in (("images per second (higher: stoker faster)", rates),
                          ("CPU seconds per image, all processes (lower: stoker cheaper)", costs)):
        v = np.asarray(values)
        print(f"| {label} | {' / '.join(f'{x:.2f}' for x in v)} | {np.median(v):.2f} | {v.min():.2f}–{v.max():.2f} |")


if __name__ == "__main__":
    main()
