"""stoker.train.engine.adapt end to end, with an accelerator stand-in: a step that waits without using the CPU.

The model sleeps in its forward (as a GPU step keeps the host waiting on the device, not
computing), and each sample takes a fixed wait to read (as storage does), so readers feed
the step faster the more there are, whatever else runs on this machine's two cores. With
``STOKER_CORES=8`` the search may go up to 8 loader threads. The test checks the direction
of the decisions and that no step saw other samples, never a speed.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from stoker import Scenario, fit, make_loader
from stoker.cores import CORES_ENV
from stoker.train.engine import adapt as adapt_module
from stoker.train.engine.adapt import Setting

pytestmark = pytest.mark.timeout(120)

READ_S = 0.004  # a sample's read: a wait, not CPU work
STEP_S = 0.004  # the stand-in's step: a wait, not CPU work


class _SlowStorage(Dataset):
    """Samples whose reading waits ``READ_S`` each (storage, not the CPU)."""

    def __len__(self) -> int:
        return 240

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(READ_S)
        return torch.full((4,), float(i)), i % 3


class _StandIn(nn.Module):
    """A model whose step waits ``STEP_S`` without using the CPU, as the host waits for an accelerator."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(4, 3)
        self.seen: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.seen.append(hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16])
        time.sleep(STEP_S)
        return self.head(x)


def _fit(tmp_path: Path, name: str, adapt: bool) -> tuple[list[str], dict[str, Any]]:
    train = make_loader(_SlowStorage(), batch_size=4, num_workers=1, backend="thread", device="cpu", seed=3)
    torch.manual_seed(0)
    model = _StandIn()
    fit(Scenario(model, torch.optim.SGD(model.parameters(), lr=0.01), nn.CrossEntropyLoss(), train, None, epochs=3,
                 device="cpu", log_dir=tmp_path, name=name, adapt=adapt, loggers=(), progress=False, plot=False,
                 preprocess=None))
    train.close()
    return model.seen, json.loads((tmp_path / name / "run.json").read_text())["adapt"]


def test_adapt_moves_to_more_readers_while_the_step_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "8")
    monkeypatch.setattr(adapt_module, "MIN_RUN_S", 0.0)  # a run of seconds: adapt all the same
    monkeypatch.setattr(adapt_module, "ABORT_FACTOR", 100.0)  # every trial timed to its end, however slow
    fixed, _ = _fit(tmp_path, "fixed", adapt=False)
    seen, record = _fit(tmp_path, "adapted", adapt=True)
    assert seen == fixed  # every step saw the samples it sees without adapt, in the same order
    assert record["enabled"] and record["given"]["workers"] == 1 and record["given"]["backend"] == "thread"
    timed = record["readers_timed"]
    assert timed[:2] == [1, 2]  # the step waits for one reader: twice as many next
    assert all(b == 2 * a for a, b in zip(timed[:2], timed[1:3], strict=True))  # x2 while it waits
    chosen = Setting(**record["chosen"])
    assert chosen.backend == "thread" and chosen.workers > 1 and "waited" in record["reason"]
