"""Checkpoints: atomic writes, weights_only loads, RNG states that round-trip."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker import CheckpointError
from stoker.train import load_checkpoint, save_checkpoint
from stoker.train.engine.checkpoint import get_rng_state, set_rng_state


def test_save_load_round_trip(tmp_path: Path) -> None:
    state = {"model": {"w": torch.arange(6.0)}, "epoch": 3, "history": [{"loss": 0.5}], "best_acc": float("-inf")}
    save_checkpoint(state, tmp_path / "last.pt")
    loaded = load_checkpoint(tmp_path / "last.pt")
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["epoch"] == 3 and loaded["history"] == [{"loss": 0.5}] and loaded["best_acc"] == float("-inf")


def test_interrupted_write_leaves_the_old_checkpoint_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path)

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt  # the user pressed Ctrl-C mid-write

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"epoch": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left behind


class _NotPlain:
    pass


def test_load_refuses_pickled_objects_and_damaged_files(tmp_path: Path) -> None:
    torch.save({"model": _NotPlain()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(tmp_path / "evil.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "evil.pt").read_bytes()[:40])
    with pytest.raises(CheckpointError, match="cut.pt"):
        load_checkpoint(tmp_path / "cut.pt")
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")


def test_rng_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    save_checkpoint({"rng": get_rng_state()}, tmp_path / "rng.pt")
    before = (torch.rand(3), np.random.rand(3).tolist(), random.random())
    set_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    after = (torch.rand(3), np.random.rand(3).tolist(), random.random())
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]
