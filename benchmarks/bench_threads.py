"""Why ``fit`` lowers torch's compute threads on the CPU: one training epoch, both ways, side by side.

Generates DigiFace-like data, then trains ``SmallCNN`` for one epoch with a 2-worker
loader, alternating (A/B/A/B) between torch's own thread count and the rule of
``stoker.train.engine.threads`` (``max(1, cores - workers)``), and prints img/s and the ratio.

Run::

    python benchmarks/bench_threads.py --n 2000 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from stoker import Scenario, fit, make_loader, open_data  # noqa: E402
from stoker.sources.synthetic import make_digiface  # noqa: E402
from stoker.train import SmallCNN  # noqa: E402
from stoker.train.engine.threads import usable_cores  # noqa: E402


def _epoch(data_dir: Path, log_dir: Path, workers: int, threads: int, tag: str) -> float:
    data = open_data(data_dir, valid=0.1, image_size=64)
    train = make_loader(data["train"], batch_size=64, num_workers=workers, device="cpu")
    model = SmallCNN(num_classes=data.num_classes)
    history = fit(Scenario(model, torch.optim.AdamW(model.parameters(), 3e-3), nn.CrossEntropyLoss(), train, None,
                           epochs=1, device="cpu", log_dir=log_dir, name=tag, loggers=(), plot=False, cpu_threads=threads))
    train.close()
    return history.epochs[-1].img_per_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="images to generate")
    parser.add_argument("--workers", type=int, default=2, help="loader worker processes")
    parser.add_argument("--repeats", type=int, default=2, help="A/B pairs")
    args = parser.parse_args(argv)
    cores = usable_cores()
    default_threads = torch.get_num_threads()
    lowered = max(1, cores - args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_digiface(root / "data", n=args.n, classes=10, progress=False)
        rates: dict[str, list[float]] = {"default": [], "lowered": []}
        for i in range(args.repeats):
            for kind, threads in (("default", default_threads), ("lowered", lowered)):
                rates[kind].append(_epoch(root / "data", root / "runs", args.workers, threads, f"{kind}-{i}"))
    a, b = statistics.median(rates["default"]), statistics.median(rates["lowered"])
    print(f"{cores} cores, {args.workers} loader workers, {args.n} images, one epoch each, median of {args.repeats}\n")
    print("| torch threads | img/s |")
    print("|---|---:|")
    print(f"| {default_threads} (torch's default) | {a:,.0f} |")
    print(f"| {lowered} (stoker's rule) | {b:,.0f} |")
    print(f"\nlowered / default: {b / a:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
