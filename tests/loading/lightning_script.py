"""Run in tests/loading/test_equal_steps.py (not a test module itself): Lightning's DDP over a stoker loader.

Usage: ``python lightning_script.py OUT``. ``Trainer(strategy="ddp", accelerator="cpu",
devices=2)`` starts the second rank itself (it runs this script again). The training
data is a ``Pipe`` of 1,001 numbered samples through ``make_loader`` (2 workers, batch
50): Lightning leaves an iterable that is not a torch ``DataLoader`` as it is, so the
rank split and the equal steps are stoker's. Every rank writes ``OUT/lightning-rank<R>.json``.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

N = 1001


def numbered(i: int) -> tuple[torch.Tensor, int]:
    image = torch.zeros((3, 4, 4), dtype=torch.uint8)
    image[0], image[1] = i % 256, i // 256
    return image, i % 4


def main(out: Path) -> None:
    import lightning.pytorch as pl

    from stoker import make_loader
    from stoker.pipes import Pipe

    warnings.filterwarnings("ignore")  # Lightning's advice on workers and logging; not what is tested

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(48, 4))
            self.epochs: list[dict[str, Any]] = []

        def on_train_epoch_start(self) -> None:
            self.epochs.append({"steps": 0, "seen": []})

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            images, labels = batch
            self.epochs[-1]["steps"] += 1
            self.epochs[-1]["seen"].extend((images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()).tolist())
            return nn.functional.cross_entropy(self.net(images.float() / 255), labels)

        def on_train_epoch_end(self) -> None:
            self.epochs[-1]["trimmed"] = self.loader.trimmed

        def train_dataloader(self) -> Any:  # the process group exists here, so make_loader splits by rank
            pipe = Pipe.from_iterable(range(N)).shuffle(N, seed=3).shard().map(numbered)
            self.loader = make_loader(pipe, batch_size=50, num_workers=2, device="cpu")
            return self.loader

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    torch.manual_seed(0)
    model = Model()
    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model)
    (out / f"lightning-rank{trainer.global_rank}.json").write_text(json.dumps({"epochs": model.epochs}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
