"""Mid-epoch checkpoints: an interrupted-and-resumed run ends bit for bit as an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from stoker import CheckpointError, ClassFolderDataset, ConfigError, make_loader
from stoker.train import Logger, Scenario, SmallCNN, fit, load_checkpoint, read_csv, save_checkpoint


def _scenario(folders: Path, tmp_path: Path, name: str, *, workers: int, resume: bool, seed: int,
              epochs: int = 2, grad_accum: int = 1, every: int | None = None, sync_every: int = 1) -> Scenario:
    torch.manual_seed(seed)  # a resumed run starts from other weights: the checkpoint must win
    train, valid = ClassFolderDataset(folders).split(valid=0.25, seed=0)
    model = nn.Sequential(nn.Dropout(0.1), SmallCNN(4, width=8))  # dropout draws from the global RNG
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    return Scenario(
        model, optimizer, nn.CrossEntropyLoss(),
        make_loader(train, batch_size=16, num_workers=workers, device="cpu", seed=3),
        make_loader(valid, batch_size=16, shuffle=False, num_workers=workers, device="cpu"),
        epochs=epochs, log_dir=tmp_path, name=name, resume=resume, grad_accum=grad_accum,
        scheduler=torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=epochs * 8 // grad_accum + 1),
        scheduler_interval="step", checkpoint_every_steps=every, sync_every=sync_every, plot=False, device="cpu",
        progress=False,
        loggers=("csv", "tensorboard"),
    )


class _InterruptAt(Logger):
    """Raises KeyboardInterrupt from batch_end at (phase, epoch, batch), as a Ctrl-C in a callback."""

    def __init__(self, phase: str, epoch: int, batch: int) -> None:
        self.at = (phase, epoch, batch)
        self.seen: list[tuple[str, int, int]] = []

    def batch_end(self, progress):  # type: ignore[no-untyped-def]
        self.seen.append((progress.phase, progress.epoch, progress.batch))
        if (progress.phase, progress.epoch, progress.batch) == self.at:
            raise KeyboardInterrupt


def _same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


@pytest.fixture(scope="module")
def straight(folders: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[nn.Module, Path]]:
    """The uninterrupted runs, one per worker count and grad_accum (computed once)."""
    out = {}
    root = tmp_path_factory.mktemp("straight")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests' own runs (conftest): float sums depend on the thread count
    try:
        for workers, accum in ((0, 1), (2, 1), (0, 2)):
            scenario = _scenario(folders, root, f"s{workers}-{accum}", workers=workers, resume=False, seed=0,
                                 grad_accum=accum)
            fit(scenario)
            out[workers * 10 + accum] = (scenario.model, root / f"s{workers}-{accum}")
    finally:
        torch.set_num_threads(threads)
    return out


def _check_same_run(run_dir: Path, straight_dir: Path) -> None:
    rows, expected = read_csv(run_dir / "metrics.csv"), read_csv(straight_dir / "metrics.csv")
    assert [r["epoch"] for r in rows] == [1.0, 2.0]  # no duplicate, no missing row
    for column in ("loss/train", "acc/train", "loss/valid", "acc/valid", "lr"):
        assert [r[column] for r in rows] == [r[column] for r in expected], column
    history = load_checkpoint(run_dir / "last.pt")["history"]["epochs"]
    assert [e["train_samples"] for e in history] == [120, 120]
    assert all(e["time_s"] >= e["train_time_s"] > 0 and e["time_s"] >= e["data_wait_s"] >= 0 for e in history)


# The straight runs read back every batch; runs that read back every few batches must end the same.
@pytest.mark.parametrize(("workers", "at", "sync_every"), [
    (0, ("train", 1, 3), 1), (2, ("train", 2, 5), 1), (0, ("valid", 1, 2), 1),
    (0, ("train", 1, 3), 5), (2, ("train", 2, 5), 5), (0, ("valid", 1, 2), 2),
])
def test_interrupt_then_resume_is_bit_identical(folders: Path, tmp_path: Path, straight, workers: int, at,
                                                sync_every: int) -> None:
    interrupted = _scenario(folders, tmp_path, "split", workers=workers, resume=False, seed=0, sync_every=sync_every)
    with pytest.raises(KeyboardInterrupt):
        fit(interrupted, callbacks=[_InterruptAt(*at)])
    state = load_checkpoint(tmp_path / "split" / "last.pt")
    phase, epoch, batch = at
    assert state["partial"]["epoch"] == epoch and state["partial"]["phase"] == phase
    if phase == "train":  # the logger hears of the batch at the read-back after it, and the stop comes there
        assert state["partial"]["train"]["batches"] == -(-batch // sync_every) * sync_every
    assert json.loads((tmp_path / "split" / "run.json").read_text())["status"] == "interrupted"

    torch.manual_seed(999)  # disturb the global RNG: resume must restore it
    resumed = _scenario(folders, tmp_path, "split", workers=workers, resume=True, seed=1, sync_every=sync_every)
    history = fit(resumed)
    assert history.stopped == "finished" and len(history) == 2
    _same_weights(resumed.model, straight[workers * 10 + 1][0])
    _check_same_run(tmp_path / "split", straight[workers * 10 + 1][1])


@pytest.mark.parametrize("sync_every", [1, 3])
def test_a_stop_asked_mid_accumulation_waits_for_the_step(folders: Path, tmp_path: Path, straight, sync_every: int) -> None:
    interrupted = _scenario(folders, tmp_path, "acc", workers=0, resume=False, seed=0, grad_accum=2, sync_every=sync_every)
    with pytest.raises(KeyboardInterrupt):
        fit(interrupted, callbacks=[_InterruptAt("train", 1, 3)])
    assert load_checkpoint(tmp_path / "acc" / "last.pt")["partial"]["train"]["batches"] == 4  # the step boundary
    resumed = _scenario(folders, tmp_path, "acc", workers=0, resume=True, seed=1, grad_accum=2, sync_every=sync_every)
    fit(resumed)
    _same_weights(resumed.model, straight[2][0])


@pytest.mark.parametrize("sync_every", [1, 5])
def test_checkpoint_every_steps_writes_last_pt_mid_epoch(folders: Path, tmp_path: Path, straight, sync_every: int) -> None:
    saved: list[int] = []

    class Watch(Logger):
        def batch_end(self, progress):  # type: ignore[no-untyped-def]
            if progress.phase == "train" and progress.batch == 5:
                state = load_checkpoint(tmp_path / "every" / "last.pt")  # written after batch 3 (3 steps)
                saved.append(state["partial"]["train"]["batches"])

    scenario = _scenario(folders, tmp_path, "every", workers=0, resume=False, seed=0, every=3, epochs=2,
                         sync_every=sync_every)  # 5: the checkpoint after step 3 reads back early, the one after 6 too
    fit(scenario, callbacks=[Watch()])
    assert saved == [3, 3]
    assert load_checkpoint(tmp_path / "every" / "last.pt")["partial"] is None  # the epoch's own checkpoint came last
    _same_weights(scenario.model, straight[1][0])  # checkpoints change nothing
    with pytest.raises(ConfigError, match="checkpoint_every_steps"):
        Scenario(scenario.model, scenario.optimizer, nn.CrossEntropyLoss(), [], None, epochs=1, checkpoint_every_steps=0)


def test_a_last_pt_that_does_not_fit_is_a_checkpoint_error(folders: Path, tmp_path: Path) -> None:
    fit(_scenario(folders, tmp_path, "fit", workers=0, resume=False, seed=0, epochs=1))
    path = tmp_path / "fit" / "last.pt"
    good = load_checkpoint(path)

    def resume_with(state: dict) -> CheckpointError:
        save_checkpoint(state, path)
        with pytest.raises(CheckpointError) as caught:
            fit(_scenario(folders, tmp_path, "fit", workers=0, resume=True, seed=0))
        assert str(path) in str(caught.value)
        return caught.value

    wrong_shape = {**good, "model": {k: v[:1] if v.ndim else v for k, v in good["model"].items()}}
    assert "its model does not fit this run" in str(resume_with(wrong_shape))
    assert "missing ['rng']" in str(resume_with({k: v for k, v in good.items() if k != "rng"}))
    assert "optimizer" in str(resume_with({**good, "optimizer": {"state": {}, "param_groups": []}}))
    bad_partial = {**good, "partial": {"epoch": 2, "phase": "train"}}
    assert "mid-epoch entry is damaged" in str(resume_with(bad_partial))
    loader_state = {**good, "partial": {"epoch": 2, "phase": "train", "loader": {"format": "x"}, "lr": 0.1,
                                        "train": {"batches": 1, "samples": 16, "hits": 1, "loss_sum": 1.0},
                                        "train_timer": {"wall_s": 1.0, "data_wait_s": 0.1}}}
    assert "train loader position does not fit" in str(resume_with(loader_state))


def test_history_state_round_trips(folders: Path, tmp_path: Path) -> None:
    from stoker.train import History

    history = fit(_scenario(folders, tmp_path, "h", workers=0, resume=False, seed=0, epochs=1))
    again = History()
    again.load_state_dict(json.loads(json.dumps(history.state_dict())))
    assert again.epochs == history.epochs and (again.best_acc, again.best_epoch) == (history.best_acc, history.best_epoch)
    with pytest.raises(ConfigError, match="missing"):
        again.load_state_dict({"epochs": []})
