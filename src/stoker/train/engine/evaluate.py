"""The test split, evaluated once after training, with the best model: ``stoker train --test``.

Validation picks the best epoch; the test split, held apart, says how good that pick
is. It is read once, after the last epoch, with the weights of ``best.pt`` (the last
weights when there was no validation), every sample exactly once over the ranks, and
written to ``run.json`` (``"test"``) and ``test.csv`` in the run folder.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stoker.train.engine.checkpoint import load_checkpoint
from stoker.train.engine.distributed import Ranks
from stoker.train.engine.epoch import forward_batch
from stoker.train.engine.record import BEST_FILE, read_run_json, write_run_json

__all__ = ["TEST_FILE", "TestFigures", "evaluate_test"]

TEST_FILE = "test.csv"


@dataclass(frozen=True)
class TestFigures:
    """The test split's figures, over all ranks.

    Attributes:
        samples: test samples evaluated (each once).
        loss: mean loss per sample.
        acc: share of argmax hits.
        weights: which weights were evaluated (``"best.pt (epoch N)"`` or ``"last epoch"``).
    """

    samples: int
    loss: float
    acc: float
    weights: str


def evaluate_test(
    model: nn.Module,
    loader: Iterable[Any],
    run_dir: Path,
    ranks: Ranks,
    *,
    device: torch.device,
    preprocess: Callable[[torch.Tensor], torch.Tensor] | None,
    amp_dtype: torch.dtype | None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    memory_format: torch.memory_format | None = None,
) -> TestFigures:
    """Evaluate ``loader`` once with the weights of ``run_dir/best.pt`` and record the figures (rank 0 writes).

    Every rank reads ``best.pt`` as rank 0 has it (other machines need not see the run
    folder); ``loader`` must split the test split without padding (``make_loader(...,
    even=False)``), so each sample counts once. No collective runs inside the loop.

    Returns:
        The figures, the same on every rank.
    """
    best = run_dir / BEST_FILE
    data = ranks.broadcast_bytes(best.read_bytes() if ranks.main and best.is_file() else None)
    weights = "last epoch"
    if data is not None:
        state = load_checkpoint(best, map_location="cpu", data=data)
        model.load_state_dict(state["model"])
        weights = f"{BEST_FILE} (epoch {state.get('epoch', '?')})"
    model.to(device).eval()
    loss_sum, hits, n = 0.0, 0.0, 0
    with torch.no_grad():
        for images, labels in loader:
            loss, batch_hits, size = forward_batch(model, images, labels, device=device, preprocess=preprocess,
                                                   amp_dtype=amp_dtype, loss_fn=loss_fn, memory_format=memory_format)
            loss_sum += float(loss) * size
            hits += float(batch_hits)
            n += size
    total_loss, total_hits, total_n = ranks.sum([loss_sum, hits, n])
    figures = TestFigures(int(total_n), total_loss / total_n if total_n else math.nan,
                          total_hits / total_n if total_n else math.nan, weights)
    if ranks.main:
        _record(run_dir, figures)
    return figures


def _record(run_dir: Path, figures: TestFigures) -> None:
    """``test.csv`` (one row) and the ``"test"`` entry of ``run.json``."""
    with open(run_dir / TEST_FILE, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["split", *asdict(figures)])
        writer.writeheader()
        writer.writerow({"split": "test", **asdict(figures)})
    record = read_run_json(run_dir)
    record["test"] = asdict(figures)
    write_run_json(run_dir, record)
