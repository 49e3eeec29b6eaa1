"""What the training process loses when stoker's readers run flat out, and what keeps it.

A stand-in training step: the main thread does a fixed amount of CPU work (``--launch-ops``
small torch calls, standing for the kernel launches of a model's step), then sleeps
``--gpu-ms`` (standing for the device computing, which takes no CPU). The readers read
generated CelebA-like JPEGs (178x218, cropped ``(40, 20, 138, 138)`` to 112x112) as files
and as encoded shards, with ``--workers`` readers (default: the usable cores, flat out:
the step is faster than they are, so they never rest). Each row is a reader placement
(:class:`stoker.loading.reader_cpu.ReaderPlacement`) given to ``make_loader``:

- ``alone``: the step with no readers (a batch made once): the launch time it needs;
- ``as is``: readers run as the training process does (``place_readers=False``);
- ``nice +N``: worker processes (or loader threads) at niceness +N;
- ``off CPU 0``: worker processes on every CPU of the affinity but the first, where the
  training thread then runs;
- ``default on a GPU``: what ``make_loader`` applies on this machine when the model trains on
  an accelerator (``plan_readers(True)``).

For each, per step: the launch's wall time (``launch ms``), its CPU time on the main thread
(``cpu ms``; wall above CPU is time the thread was ready but not running), and the images
the readers delivered per second. Rounds are interleaved (every row once per round, the
order reversed every other round), so a drift in the machine's load cancels; the table
gives each ratio per round and its median: the launch time against ``alone`` (1.00: the
readers cost the step nothing), the reading rate against ``as is`` of the same data.

Run::

    python benchmarks/bench_train_cpu.py --rounds 5
    python benchmarks/bench_train_cpu.py --quick   # smoke test, seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

from stoker.cores import usable_cores  # noqa: E402
from stoker.data import open_data  # noqa: E402
from stoker.loading import make_loader  # noqa: E402
from stoker.loading.reader_cpu import ReaderPlacement, plan_readers  # noqa: E402
from stoker.packer import pack  # noqa: E402
from stoker.shards import ShardDataset  # noqa: E402
from stoker.sources.synthetic import make_celeba  # noqa: E402

SIZE = (112, 112)
CROP = (40, 20, 138, 138)


def prepare(root: Path, n: int, classes: int, cores: int) -> dict[str, Path]:
    """Generate the JPEG files and pack them as encoded shards, once per folder."""
    p = {"files": root / "celeba", "shards": root / "jpeg"}
    if not (root / ".complete").exists():
        make_celeba(p["files"], n, classes=classes, workers=cores, progress=False, overwrite=True)
        pack([p["files"]], p["shards"], store="encoded", size=SIZE, crop=CROP, label_order="sorted", seed=0,
             progress=False, workers=cores, overwrite=True)
        (root / ".complete").write_text("")
    return p


def launch(ops: int) -> None:
    """The step's CPU part: ``ops`` small torch calls, as a model's step launches its kernels."""
    x = torch.zeros(8)
    for _ in range(ops):
        torch.add(x, 1.0, out=x)


class Row:
    """One reader placement over one data set and backend (``data`` None: the step alone)."""

    def __init__(self, name: str, data: str | None, backend: str, placement: ReaderPlacement | None) -> None:
        self.name, self.data, self.backend, self.placement = name, data, backend, placement
        self.launch_ms: list[float] = []
        self.cpu_ms: list[float] = []
        self.img_per_s: list[float] = []

    @property
    def label(self) -> str:
        return "step alone" if self.data is None else f"{self.data}, {self.backend} | {self.name}"


def timed(row: Row, datasets: dict[str, Any], args: argparse.Namespace) -> None:
    """Run the stand-in loop for ``args.seconds``; append this round's figures to ``row``."""
    batches: Any
    if row.data is None:
        batch = (torch.zeros(args.batch_size, 3, *SIZE, dtype=torch.uint8), torch.zeros(args.batch_size, dtype=torch.int64))
        loader = None
        batches = iter(lambda: batch, None)
    else:
        loader = make_loader(datasets[row.data], batch_size=args.batch_size, num_workers=args.workers, device=None,
                             backend=row.backend, persistent_workers=True, place_readers=row.placement,  # type: ignore[arg-type]
                             prefetch_factor=2)

        def forever() -> Any:
            while True:
                yield from loader

        batches = forever()
    next(batches)  # the readers are up
    launch_s = cpu_s = 0.0
    steps = images = 0
    gpu_s = args.gpu_ms / 1000
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        images_, _ = next(batches)
        images += len(images_)
        t0, c0 = time.perf_counter(), time.thread_time()
        launch(args.launch_ops)
        launch_s += time.perf_counter() - t0
        cpu_s += time.thread_time() - c0
        time.sleep(gpu_s)  # the device computes; the CPU is free
        steps += 1
    wall = time.perf_counter() - start
    del batches
    if loader is not None:
        loader.close()
        del loader
    row.launch_ms.append(1000 * launch_s / steps)
    row.cpu_ms.append(1000 * cpu_s / steps)
    row.img_per_s.append(images / wall)


def rows_for(cores: int, quick: bool) -> list[Row]:
    """The placements compared: each data set's as is, niceness, CPUs, and the default."""
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    default = plan_readers(True)  # what make_loader applies when the model trains on an accelerator
    rows = [Row("alone", None, "process", None)]
    for data in ("files", "shards"):
        rows.append(Row("as is", data, "process", ReaderPlacement(reason="as is")))
        if not quick:
            rows.append(Row("nice +5", data, "process", ReaderPlacement(nice=5)))
        rows.append(Row("nice +10", data, "process", ReaderPlacement(nice=10)))
        if len(affinity) > 1 and not quick:
            rows.append(Row("off CPU 0", data, "process", ReaderPlacement(cpus=tuple(affinity[1:]))))
            rows.append(Row("nice +10, off CPU 0", data, "process", ReaderPlacement(nice=10, cpus=tuple(affinity[1:]))))
        cpus = "all CPUs" if default.cpus is None else f"{len(default.cpus)} CPUs"
        rows.append(Row(f"default on a GPU (nice +{default.nice}, {cpus})", data, "process", default))
    rows.append(Row("as is", "shards", "thread", ReaderPlacement(reason="as is")))
    rows.append(Row("threads nice +10", "shards", "thread", ReaderPlacement(threads_nice=10)))
    return rows


def median_ratio(values: list[float], against: list[float]) -> tuple[float, str]:
    ratios = [v / a for v, a in zip(values, against, strict=True)]
    return statistics.median(ratios), " / ".join(f"{r:.2f}" for r in ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1500, help="images generated")
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=None, help="readers; default: the usable cores (flat out)")
    parser.add_argument("--launch-ops", type=int, default=400, help="small torch calls per step (the launches)")
    parser.add_argument("--gpu-ms", type=float, default=5.0, help="the step's sleep (the device computing)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per row and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="data folder (default: a temporary one)")
    parser.add_argument("--quick", action="store_true", help="a smoke test: few images, short rows, 1 round, no CPU-set rows")
    args = parser.parse_args()
    if args.quick:
        args.n, args.classes, args.batch_size, args.seconds, args.rounds, args.launch_ops = 96, 4, 16, 0.4, 1, 50
    cores = usable_cores()
    args.workers = cores if args.workers is None else args.workers
    torch.set_num_threads(1)  # the stand-in step's calls are tiny: one thread, as a GPU run's Python thread
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        p = prepare(root, args.n, args.classes, cores)
        datasets = {"files": open_data(p["files"], split="train", crop=CROP, image_size=SIZE, label_order="sorted"),
                    "shards": ShardDataset(p["shards"])}
        rows = rows_for(cores, args.quick)
        print(f"{cores} usable cores, {args.workers} readers, batch {args.batch_size}, {args.launch_ops} launches "
              f"+ {args.gpu_ms} ms sleep a step, {args.rounds} rounds of {args.seconds} s; torch {torch.__version__}, "
              f"python {sys.version.split()[0]}", flush=True)
        print(f"default placement here for a GPU run: {plan_readers(True).reason}", flush=True)
        for r in range(args.rounds):
            for row in rows if r % 2 == 0 else rows[::-1]:
                timed(row, datasets, args)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    alone = rows[0]
    print()
    print("| data, backend | readers | launch ms | cpu ms | img/s | launch / alone (median; rounds) | img/s / as is (median) |")
    print("|---|---|---:|---:|---:|---|---:|")
    base: dict[tuple[str | None, str], Row] = {}
    for row in rows:
        if row.name == "as is":
            base[(row.data, row.backend)] = row
        ratio, each = median_ratio(row.launch_ms, alone.launch_ms)
        ref = base.get((row.data, row.backend))
        rate = f"{median_ratio(row.img_per_s, ref.img_per_s)[0]:.2f}" if ref is not None and row.data else "-"
        print(f"| {row.label.split(' | ')[0]} | {row.name} | {statistics.median(row.launch_ms):.2f} | "
              f"{statistics.median(row.cpu_ms):.2f} | {statistics.median(row.img_per_s):.0f} | {ratio:.2f}; {each} | {rate} |")


if __name__ == "__main__":
    main()
