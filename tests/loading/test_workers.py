"""The one worker default: the data set's measured loader_defaults, else FALLBACK_WORKERS, wherever workers are left out."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset

from stoker import ConfigError, make_loader
from stoker.loading.workers import FALLBACK_WORKERS, default_workers


class _Numbers(Dataset):
    def __init__(self, loader_defaults: dict[str, Any] | None = None) -> None:
        if loader_defaults is not None:
            self.loader_defaults = loader_defaults

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.zeros(3, 8, 8, dtype=torch.uint8), i % 2


def test_the_rule_measured_defaults_else_the_one_fallback() -> None:
    assert FALLBACK_WORKERS == 2  # stated in the README ("Loading in parallel") and the data.workers help
    assert default_workers(None) == default_workers({}) == default_workers({"backend": "thread"}) == FALLBACK_WORKERS
    assert default_workers({"num_workers": 0}) == 0 and default_workers({"num_workers": 3}) == 3
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ConfigError, match="loader_defaults give num_workers"):
            default_workers({"num_workers": bad})


def test_make_loader_takes_the_rule_when_workers_are_left_out() -> None:
    """stoker train defers to it too (data.workers unset: tests/train/test_data.py)."""
    assert make_loader(_Numbers(), batch_size=4, device="cpu").num_workers == FALLBACK_WORKERS
    assert make_loader(_Numbers({"num_workers": 1}), batch_size=4, device="cpu").num_workers == 1
    assert make_loader(_Numbers({"num_workers": 1}), batch_size=4, num_workers=0, device="cpu").num_workers == 0
