"""A Lightning run with and without stoker train's thread choice: one epoch each way, side by side.

Generates DigiFace-like data, then trains ``SmallCNN`` in a Lightning ``Trainer`` (CPU,
one process) over a 2-worker stoker loader, alternating (A/B/A/B) between torch's own
thread count and ``stoker.train.ComputeThreads`` around ``trainer.fit`` (the recipe of
docs/guides/lightning.md), and prints each epoch's seconds and the ratio.

Run::

    python benchmarks/bench_lightning_threads.py --n 1200 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")  # Lightning's advice on workers and loggers; not what is measured

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from stoker import make_loader, open_data  # noqa: E402
from stoker.sources.synthetic import make_digiface  # noqa: E402
from stoker.train import ComputeThreads, SmallCNN  # noqa: E402


class _Classifier(pl.LightningModule):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.net = SmallCNN(num_classes)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        images, labels = batch
        return nn.functional.cross_entropy(self.net(images.float() / 255), labels)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def _epoch_s(train: object, num_classes: int, with_threads: bool) -> float:
    torch.manual_seed(0)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    start = time.perf_counter()
    if with_threads:
        with ComputeThreads(torch.device("cpu"), [train]):
            trainer.fit(_Classifier(num_classes), train_dataloaders=train)
    else:
        trainer.fit(_Classifier(num_classes), train_dataloaders=train)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1200, help="images to generate")
    parser.add_argument("--size", type=int, default=64, help="image side the loader resizes to")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="A/B pairs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = make_digiface(folder, n=args.n, classes=4, progress=False, overwrite=True)
        data = open_data(root, image_size=args.size, seed=0)
        train = make_loader(data["train"], batch_size=32, num_workers=args.workers, device="cpu", seed=0)
        with ComputeThreads(torch.device("cpu"), [train]) as chosen:
            reason = chosen.reason
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for with_threads in (True, False):
                times[with_threads].append(_epoch_s(train, data.num_classes, with_threads))
    ours, theirs = statistics.median(times[True]), statistics.median(times[False])
    print(f"{len(data['train'])} images of {args.size}x{args.size}, {args.workers} workers; ComputeThreads: {reason}")
    print("| threads | epoch s (each run) | median |")
    print("| --- | --- | --- |")
    print(f"| torch's own ({torch.get_num_threads()}) | {', '.join(f'{t:.1f}' for t in times[False])} | {theirs:.1f} |")
    print(f"| ComputeThreads | {', '.join(f'{t:.1f}' for t in times[True])} | {ours:.1f} |")
    print(f"ratio: {theirs / ours:.2f}x faster with ComputeThreads")


if __name__ == "__main__":
    main()
