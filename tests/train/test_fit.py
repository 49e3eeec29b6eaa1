"""fit: learns, weighs the loss exactly, resumes bit for bit, stops on NaN, accounts for time."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from stoker import ClassFolderDataset, TrainingError, make_loader
from stoker.train import History, Logger, Scenario, SmallCNN, fit, load_checkpoint, read_csv


def _loaders(folders: Path, workers: int = 0, batch_size: int = 16):
    train, valid = ClassFolderDataset(folders).split(valid=0.25, seed=0)
    return (
        make_loader(train, batch_size=batch_size, num_workers=workers, device="cpu", seed=3),
        make_loader(valid, batch_size=32, shuffle=False, num_workers=workers, device="cpu"),
    )


def _quiet(**kwargs) -> dict:
    return {"device": "cpu", "progress": False, "loggers": ("csv", "tensorboard"), **kwargs}


def test_small_cnn_learns_far_above_chance(folders: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    train, valid = _loaders(folders)
    model = SmallCNN(4, width=16)
    scenario = Scenario(
        model, torch.optim.AdamW(model.parameters(), lr=3e-3), nn.CrossEntropyLoss(), train, valid,
        epochs=5, log_dir=tmp_path, name="learn", **_quiet(),
    )
    history = fit(scenario)
    assert history.best_acc >= 0.8  # chance is 0.25
    assert history.stopped == "finished" and len(history) == 5
    last = history.last
    assert last is not None and last.train_samples == 120 and last.valid_samples == 40
    assert 0 <= last.data_wait_s <= last.time_s and last.img_per_s > 0
    assert last.compute_s == pytest.approx(last.time_s - last.data_wait_s)
    for name in ("metrics.csv", "run.json", "best.pt", "last.pt", "curves.png"):
        assert (tmp_path / "learn" / name).is_file(), name


class _Fixed(nn.Module):
    """Logits that depend on the sample only (so the expected loss can be computed directly)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-1, 1, 12).view(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def test_epoch_loss_is_exact_with_a_short_last_batch(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(10, 4, generator=g), torch.randint(0, 3, (10,), generator=g)
    batches = [(x[i : i + 4], y[i : i + 4]) for i in range(0, 10, 4)]  # sizes 4, 4, 2
    model = _Fixed()
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(), batches, batches,
        epochs=1, log_dir=tmp_path, preprocess=None, plot=False, **_quiet(),
    )
    stats = fit(scenario)[0]
    with torch.no_grad():
        logits = model(x)
        expected = nn.functional.cross_entropy(logits, y).item()
        naive = sum(nn.functional.cross_entropy(model(bx), by).item() for bx, by in batches) / 3
        expected_acc = (logits.argmax(1) == y).float().mean().item()
    assert not math.isclose(naive, expected, rel_tol=1e-4)  # the test can tell the two apart
    assert stats.train_loss == pytest.approx(expected, rel=1e-6)
    assert stats.valid_loss == pytest.approx(expected, rel=1e-6)
    assert stats.train_acc == pytest.approx(expected_acc) and stats.valid_acc == pytest.approx(expected_acc)
    assert stats.train_samples == stats.valid_samples == 10


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _resumable(folders: Path, tmp_path: Path, workers: int, epochs: int, name: str, resume: bool, seed: int) -> Scenario:
    torch.manual_seed(seed)  # a resumed run starts from other weights: the checkpoint must win
    model = nn.Sequential(nn.Dropout(0.1), SmallCNN(4, width=8))  # dropout draws from the global RNG
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train, valid = _loaders(folders, workers=workers)
    return Scenario(
        model, optimizer, nn.CrossEntropyLoss(), train, valid, epochs=epochs, log_dir=tmp_path, name=name,
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5), resume=resume,
        plot=False, **_quiet(),
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_gives_bit_identical_weights(folders: Path, tmp_path: Path, workers: int) -> None:
    straight = _resumable(folders, tmp_path, workers, epochs=2, name="straight", resume=False, seed=0)
    fit(straight)

    first = _resumable(folders, tmp_path, workers, epochs=1, name="split", resume=False, seed=0)
    fit(first)
    torch.manual_seed(999)  # disturb the global RNG: resume must restore it
    second = _resumable(folders, tmp_path, workers, epochs=2, name="split", resume=True, seed=1)
    history = fit(second)

    a, b = _state(straight.model), _state(second.model)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert second.optimizer.param_groups[0]["lr"] == straight.optimizer.param_groups[0]["lr"]
    rows = read_csv(tmp_path / "split" / "metrics.csv")
    assert [r["epoch"] for r in rows] == [1.0, 2.0]
    straight_rows = read_csv(tmp_path / "straight" / "metrics.csv")
    for column in ("loss/train", "acc/train", "loss/valid", "acc/valid", "lr"):
        assert [r[column] for r in rows] == [r[column] for r in straight_rows], column
    assert len(history) == 2 and history.stopped == "finished"


def test_resume_rewrites_csv_rows_past_the_checkpoint(folders: Path, tmp_path: Path) -> None:
    fit(_resumable(folders, tmp_path, 0, epochs=1, name="r", resume=False, seed=0))
    csv_path = tmp_path / "r" / "metrics.csv"
    with open(csv_path, "a") as f:  # a row written just before a crash, with no checkpoint after it
        f.write(csv_path.read_text().splitlines()[-1].replace("1,", "2,", 1) + "\n")
    fit(_resumable(folders, tmp_path, 0, epochs=2, name="r", resume=True, seed=0))
    assert [r["epoch"] for r in read_csv(csv_path)] == [1.0, 2.0]


class _NanAt:
    """Cross-entropy, except NaN at one (epoch, batch) of training."""

    def __init__(self, epoch: int, batch: int, batches_per_epoch: int) -> None:
        self.at = (epoch - 1) * batches_per_epoch + batch
        self.calls = 0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(logits, labels)
        if torch.is_grad_enabled():
            self.calls += 1
            if self.calls == self.at:
                return loss * float("nan")
        return loss


def test_nan_loss_stops_the_run_and_last_good_checkpoint_loads(folders: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    train, valid = _loaders(folders)
    model = SmallCNN(4, width=8)
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.01), _NanAt(2, 3, len(train)), train, valid,
        epochs=3, log_dir=tmp_path, name="nan", **_quiet(),
    )
    with pytest.raises(TrainingError, match=r"epoch 2, batch 3"):
        fit(scenario)
    state = load_checkpoint(tmp_path / "nan" / "last.pt")
    assert state["epoch"] == 1
    fresh = SmallCNN(4, width=8)
    fresh.load_state_dict(state["model"])
    assert all(torch.isfinite(p).all() for p in fresh.parameters())
    assert len(read_csv(tmp_path / "nan" / "metrics.csv")) == 1
    assert json.loads((tmp_path / "nan" / "run.json").read_text())["status"] == "non-finite loss"


@pytest.mark.parametrize("every_steps", [None, 2])
def test_a_non_finite_loss_in_the_first_epoch_says_whether_a_checkpoint_exists(folders: Path, tmp_path: Path,
                                                                              every_steps: int | None) -> None:
    # NaN at epoch 1, batch 6: with no mid-epoch checkpoint there is no last.pt to speak of; with one every
    # 2 steps, last.pt holds batch 4.
    scenario = _every(folders, tmp_path, "nan1", sync_every=1, loss_fn=_NanAt(1, 6, 8), every_steps=every_steps)
    with pytest.raises(TrainingError, match=r"epoch 1, batch 6;") as caught:
        fit(scenario)
    message = str(caught.value)
    last = tmp_path / "nan1" / "last.pt"
    if every_steps is None:
        assert not last.exists()
        assert "before its first checkpoint, so there is no last.pt to resume from" in message
        assert "still holds" not in message
    else:
        assert load_checkpoint(last)["partial"]["train"]["batches"] == 4
        assert f"{last} still holds the last good point" in message
    assert "Lower the learning rate" in message
    # The folder holds no run then: starting again under the same name works, as the message says.
    if every_steps is None:
        assert len(fit(_every(folders, tmp_path, "nan1", sync_every=1, epochs=1))) == 1


def _every(folders: Path, tmp_path: Path, name: str, sync_every: int, grad_accum: int = 1, loss_fn=None,
           every_steps: int | None = None, epochs: int = 2) -> Scenario:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Dropout(0.1), SmallCNN(4, width=8))  # dropout draws from the global RNG
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    train, valid = ClassFolderDataset(folders).split(valid=0.25, seed=0)
    return Scenario(
        model, optimizer, loss_fn or nn.CrossEntropyLoss(),
        make_loader(train, batch_size=16, device="cpu", seed=3),  # 8 batches, the last short: not a multiple of 5
        make_loader(valid, batch_size=6, shuffle=False, device="cpu"),  # 7 batches: a full window, then a short one
        epochs=epochs, log_dir=tmp_path, name=name, grad_accum=grad_accum, sync_every=sync_every,
        checkpoint_every_steps=every_steps, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
        plot=False, **_quiet(),
    )


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_reading_back_every_few_batches_changes_no_figure_and_no_weight(folders: Path, tmp_path: Path,
                                                                         grad_accum: int) -> None:
    seen: dict[int, list[tuple[str, int, float, float]]] = {}

    class Record(Logger):
        def __init__(self, key: int) -> None:
            self.key = key

        def batch_end(self, progress):  # type: ignore[no-untyped-def]
            seen.setdefault(self.key, []).append((progress.phase, progress.batch, progress.loss, progress.acc))

    runs = {}
    for sync_every in (1, 5):
        scenario = _every(folders, tmp_path, f"s{sync_every}", sync_every, grad_accum)
        runs[sync_every] = (fit(scenario, callbacks=[Record(sync_every)]), scenario.model)
    (one, one_model), (five, five_model) = runs[1], runs[5]
    figures = ("train_loss", "train_acc", "valid_loss", "valid_acc", "lr", "train_samples", "valid_samples")
    assert [[getattr(e, f) for f in figures] for e in one.epochs] == [[getattr(e, f) for f in figures] for e in five.epochs]
    assert (one.best_acc, one.best_epoch) == (five.best_acc, five.best_epoch)
    a, b = _state(one_model), _state(five_model)
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert seen[1] == seen[5] and len(seen[5]) == 2 * (8 + 7)  # every batch reported, each with its own figures
    assert json.loads((tmp_path / "s5" / "run.json").read_text())["sync_every"] == 5


@pytest.mark.parametrize(("nan_batch", "saved_at"), [(3, None), (6, 4)])
def test_a_non_finite_loss_read_back_late_names_its_batch_and_saves_nothing_after_it(
        folders: Path, tmp_path: Path, nan_batch: int, saved_at: int | None) -> None:
    # Read back every 8 batches: the bad loss is found after it, at the checkpoint due after batch 4
    # (which must then not be written) or at the end of the epoch.
    scenario = _every(folders, tmp_path, "nan", sync_every=8, loss_fn=_NanAt(2, nan_batch, 8), every_steps=4, epochs=3)
    with pytest.raises(TrainingError, match=rf"epoch 2, batch {nan_batch};"):
        fit(scenario)
    state = load_checkpoint(tmp_path / "nan" / "last.pt")
    assert state["epoch"] == 1
    assert (state["partial"]["train"]["batches"] if state["partial"] else None) == saved_at
    if saved_at is not None:
        assert math.isfinite(state["partial"]["train"]["loss_sum"])
    fresh = nn.Sequential(nn.Dropout(0.1), SmallCNN(4, width=8))
    fresh.load_state_dict(state["model"])
    assert all(torch.isfinite(p).all() for p in fresh.parameters())
    assert len(read_csv(tmp_path / "nan" / "metrics.csv")) == 1


class _ShrinkingLoss:
    """Cross-entropy scaled down every call: the loss falls while accuracy stays put."""

    def __init__(self) -> None:
        self.scale = 1.0

    def __call__(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.scale *= 0.9
        return nn.functional.cross_entropy(logits, labels) * self.scale


def test_best_is_by_valid_accuracy_and_patience_stops(folders: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    train, valid = _loaders(folders)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4))  # no batch norm: lr 0 freezes it
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.0), _ShrinkingLoss(), train, valid,
        epochs=10, log_dir=tmp_path, name="p", patience=2, plot=False, **_quiet(),
    )
    history = fit(scenario)
    assert history.stopped == "patience" and len(history) == 3
    assert history.column("valid_loss")[2] < history.column("valid_loss")[0]  # loss improved...
    assert history.best_epoch == 1  # ...but accuracy did not, and accuracy decides
    assert load_checkpoint(tmp_path / "p" / "best.pt")["epoch"] == 1


class _SlowLoader:
    """An iterable of batches that makes the loop wait for each one."""

    def __init__(self, batches, delay_s: float) -> None:
        self.batches, self.delay_s = batches, delay_s

    def __iter__(self):
        for batch in self.batches:
            time.sleep(self.delay_s)
            yield batch


def test_loader_bound_epoch_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    model = _Fixed()
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), _SlowLoader(batches, 0.05),
        batches, epochs=1, log_dir=tmp_path, preprocess=None, plot=False, device="cpu", progress=False,
        loggers=("console",),
    )
    stats = fit(scenario)[0]
    assert stats.data_wait_share > 0.5 and stats.data_wait_s >= 0.1
    out = capsys.readouterr().out
    assert "1/1 - tLoss" in out and "img/s - wait" in out
    assert f"loader-bound: {stats.data_wait_share:.0%} of the epoch waiting for data; try `stoker tune`" in out


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_amp_modes_run_on_the_cpu(tmp_path: Path, amp: str) -> None:
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    model = _Fixed()
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batches, batches,
        epochs=2, log_dir=tmp_path, preprocess=None, plot=False, amp=amp, grad_accum=2, **_quiet(),
    )
    history = fit(scenario)
    assert all(math.isfinite(e.train_loss) for e in history.epochs)
    assert "scaler" in load_checkpoint(tmp_path / history.run_dir.name / "last.pt")  # type: ignore[union-attr]


def test_callbacks_see_every_event_in_order(tmp_path: Path) -> None:
    events: list[str] = []

    class Recorder(Logger):
        def start(self, run, history):
            events.append(f"start {run.epochs}")

        def epoch_start(self, epoch, batches):
            events.append(f"epoch {epoch} {batches}")

        def batch_end(self, progress):
            events.append(f"{progress.phase} {progress.batch}")

        def epoch_end(self, stats):
            events.append(f"end {stats.epoch}")

        def end(self, history: History):
            events.append(history.stopped)

    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    batches = [(x[:4], y[:4]), (x[4:], y[4:])]
    model = _Fixed()
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batches, batches[:1],
        epochs=1, log_dir=tmp_path, preprocess=None, plot=False, device="cpu", progress=False, loggers=(),
    )
    fit(scenario, callbacks=[Recorder()])
    assert events == ["start 1", "epoch 1 3", "train 1", "train 2", "valid 1", "end 1", "finished"]
