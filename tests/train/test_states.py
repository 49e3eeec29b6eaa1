"""Tally and History states: versioned like the Loader's, checked on load, and the unversioned shape still loads."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from stoker import ClassFolderDataset, ConfigError, make_loader
from stoker.train import (
    EpochStats,
    History,
    Logger,
    Scenario,
    SmallCNN,
    fit,
    load_checkpoint,
    read_csv,
    save_checkpoint,
)
from stoker.train.engine.history import HISTORY_STATE_FORMAT
from stoker.train.engine.tally import TALLY_STATE_FORMAT, Tally


def _tally() -> Tally:
    tally = Tally("train", 2, 8)
    tally.add(0.5, 3, 4)
    tally.add(0.25, 4, 4)
    return tally


def test_tally_state_names_its_format_and_round_trips() -> None:
    state = _tally().state_dict()
    assert state == {"format": TALLY_STATE_FORMAT, "batches": 2, "samples": 8, "hits": 7, "loss_sum": 3.0}
    again = Tally("train", 2, 8)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert (again.batches, again.samples, again.hits, again.loss, again.acc) == (2, 8, 7, 0.375, 7 / 8)


def test_an_unversioned_tally_state_from_before_still_loads() -> None:
    again = Tally("train", 2, 8)
    again.load_state_dict({"batches": 2, "samples": 8, "hits": 7, "loss_sum": 3.0})  # what the previous version wrote
    assert (again.batches, again.samples, again.hits, again.loss_sum) == (2, 8, 7, 3.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "stoker-tally/9"}, r"format 'stoker-tally/9', but this stoker reads stoker-tally/1"),
        ({"hits": None}, r"hits=None"),
        ({"batches": True}, r"batches=True"),
        ({"samples": -1}, r"samples=-1"),
        ({"samples": 2.5}, r"samples=2\.5"),
        ({"hits": 9}, r"hits=9 > samples=8"),
        ({"loss_sum": math.nan}, r"loss_sum=nan"),
        ({"loss_sum": "3"}, r"loss_sum='3'"),
    ],
)
def test_a_tally_state_of_another_format_or_ill_typed_is_refused(change: dict[str, Any], message: str) -> None:
    tally = Tally("train", 2, 8)
    with pytest.raises(ConfigError, match=message) as caught:
        tally.load_state_dict({**_tally().state_dict(), **change})
    assert "delete the run folder's last.pt" in str(caught.value)  # what to do
    assert (tally.batches, tally.samples, tally.hits, tally.loss_sum) == (0, 0, 0, 0.0)  # nothing changed
    with pytest.raises(ConfigError, match=r"missing \['loss_sum'\]"):
        tally.load_state_dict({"batches": 1, "samples": 1, "hits": 1})
    with pytest.raises(ConfigError, match="a list"):
        tally.load_state_dict([1, 2, 3])  # type: ignore[arg-type]


def _history() -> History:
    history = History()
    for epoch in (1, 2):
        history.epochs.append(EpochStats(epoch, 1.0 / epoch, 0.5, 1.1, 0.4 + epoch / 10, 2.0, 1.8, 0.5, 1.5, 100.0, 0.25,
                                         1e-3, 120, 40, skipped=1, trimmed=2, slowest_data_wait_share=0.3))
    history.best_acc, history.best_epoch = 0.6, 2
    return history


def test_history_state_names_its_format_and_round_trips() -> None:
    state = _history().state_dict()
    assert state["format"] == HISTORY_STATE_FORMAT
    again = History()
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.epochs == _history().epochs and (again.best_acc, again.best_epoch) == (0.6, 2)
    empty = History()
    empty.load_state_dict(json.loads(json.dumps(History().state_dict())))  # -inf survives
    assert empty.best_acc == -math.inf and empty.epochs == []


def test_an_unversioned_history_state_from_before_still_loads() -> None:
    state = _history().state_dict()
    del state["format"]
    for epoch in state["epochs"]:  # an older stoker had neither these figures nor the format
        for name in ("skipped", "trimmed", "slowest_data_wait_share"):
            del epoch[name]
    again = History()
    again.load_state_dict(state)
    assert [e.epoch for e in again.epochs] == [1, 2] and again.epochs[0].trimmed == 0 and again.best_epoch == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.update(format="stoker-history/0"), r"format 'stoker-history/0', but this stoker reads stoker-history/1"),
        (lambda s: s.pop("best_epoch"), r"missing \['best_epoch'\]"),
        (lambda s: s.update(epochs={"1": {}}), r"epochs must be a list"),
        (lambda s: s["epochs"][1].pop("valid_acc"), r"epoch 1 lacks \['valid_acc'\]"),
        (lambda s: s["epochs"][0].update(train_samples=True), r"epoch 0 has train_samples=True, not a whole number"),
        (lambda s: s["epochs"][0].update(train_samples=1.5), r"epoch 0 has train_samples=1\.5, not a whole number"),
        (lambda s: s["epochs"][0].update(lr="0.1"), r"epoch 0 has lr='0\.1', not a number"),
        (lambda s: s["epochs"].append(7), r"epoch 2 must be a dict of figures"),
        (lambda s: s.update(best_epoch=-1), r"best_epoch must be a whole number >= 0, got -1"),
        (lambda s: s.update(best_acc=None), r"best_acc must be a number, got None"),
    ],
)
def test_a_history_state_of_another_format_or_ill_typed_is_refused(change: Any, message: str) -> None:
    state = _history().state_dict()
    change(state)
    history = History()
    with pytest.raises(ConfigError, match=message) as caught:
        history.load_state_dict(state)
    assert "History.state_dict()" in str(caught.value)  # what to do
    assert history.epochs == [] and history.best_epoch == 0  # nothing changed


class _StopAt(Logger):
    """A Ctrl-C in the middle of epoch 2's training: fit saves a mid-epoch last.pt and stops."""

    def batch_end(self, progress):  # type: ignore[no-untyped-def]
        if (progress.phase, progress.epoch, progress.batch) == ("train", 2, 4):
            raise KeyboardInterrupt


def _scenario(folders: Path, tmp_path: Path, resume: bool) -> Scenario:
    torch.manual_seed(0)
    train, valid = ClassFolderDataset(folders).split(valid=0.25, seed=0)
    model = SmallCNN(4, width=8)
    return Scenario(model, torch.optim.AdamW(model.parameters(), lr=2e-3), nn.CrossEntropyLoss(),
                    make_loader(train, batch_size=16, num_workers=0, device="cpu", seed=3),
                    make_loader(valid, batch_size=16, shuffle=False, num_workers=0, device="cpu"),
                    epochs=2, log_dir=tmp_path, name="old", resume=resume, plot=False, device="cpu", progress=False,
                    loggers=("csv",))


def test_a_mid_epoch_last_pt_of_the_previous_version_resumes(folders: Path, tmp_path: Path) -> None:
    """A last.pt written before the formats were named (no "format" in history or tallies) still resumes."""
    with pytest.raises(KeyboardInterrupt):
        fit(_scenario(folders, tmp_path, resume=False), callbacks=[_StopAt()])
    path = tmp_path / "old" / "last.pt"
    state = load_checkpoint(path)
    assert state["history"]["format"] == HISTORY_STATE_FORMAT and state["partial"]["train"]["format"] == TALLY_STATE_FORMAT
    del state["history"]["format"], state["partial"]["train"]["format"]  # the previous version's shape
    save_checkpoint(state, path)
    history = fit(_scenario(folders, tmp_path, resume=True))
    assert [e.epoch for e in history.epochs] == [1, 2] and history.epochs[1].train_samples == 120
    assert [r["epoch"] for r in read_csv(tmp_path / "old" / "metrics.csv")] == [1, 2]
