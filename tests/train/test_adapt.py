"""stoker.train.engine.adapt: trying the train loader's settings on the first steps changes no batch, figure or weight."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from stoker import Scenario, fit, make_loader, open_data
from stoker.cli.train import train as train_command
from stoker.train import SmallCNN
from stoker.train.engine import adapt as adapt_module
from stoker.train.engine import loop
from stoker.train.engine.adapt import Adapter, Setting
from stoker.train.loggers import Logger

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def quick_trials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trials of a few batches each, whatever their seconds and their cost: a short run tries every candidate."""
    monkeypatch.setattr(adapt_module, "MIN_SECONDS", 0.0)
    monkeypatch.setattr(adapt_module, "TIME_SHARE", 1.0)
    monkeypatch.setattr(adapt_module, "MIN_RUN_S", 0.0)
    monkeypatch.setattr(adapt_module, "ABORT_FACTOR", 100.0)


class _SeesBatches:
    """A forward pre-hook: a digest of every training batch the model is given."""

    def __init__(self) -> None:
        self.digests: list[str] = []

    def __call__(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if module.training:
            self.digests.append(hashlib.sha256(args[0].detach().numpy().tobytes()).hexdigest()[:16])


def _run(folders: Path, tmp_path: Path, name: str, adapt: bool, workers: int = 0) -> tuple[Any, ...]:
    data = open_data(folders, valid=0.25, image_size=16, seed=0)
    train = make_loader(data["train"], batch_size=2, num_workers=workers, device="cpu", seed=5)
    valid = make_loader(data["valid"], batch_size=8, shuffle=False, num_workers=0, device="cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Dropout(0.1), SmallCNN(data.num_classes, width=8))  # dropout: the global RNG, saved
    seen = _SeesBatches()
    model.register_forward_pre_hook(seen)
    scenario = Scenario(model, torch.optim.AdamW(model.parameters(), lr=2e-3), nn.CrossEntropyLoss(), train, valid,
                        epochs=3, device="cpu", log_dir=tmp_path, name=name, adapt=adapt, loggers=("csv",),
                        progress=False, plot=False)
    history = fit(scenario)
    figures = [(e.train_loss, e.train_acc, e.valid_loss, e.valid_acc, e.train_samples) for e in history.epochs]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    record = json.loads((tmp_path / name / "run.json").read_text())
    return seen.digests, figures, weights, record, train


def test_adapting_changes_no_batch_figure_or_weight(folders: Path, tmp_path: Path, quick_trials: None) -> None:
    fixed_batches, fixed_figures, fixed_weights, fixed_record, fixed_loader = _run(folders, tmp_path, "fixed", adapt=False)
    batches, figures, weights, record, loader = _run(folders, tmp_path, "adapted", adapt=True)
    trials = record["adapt"]["trials"]
    # It really tried other settings: several backends and worker counts, changed between batches.
    assert record["adapt"]["enabled"] and len({(t["backend"], t["workers"]) for t in trials}) >= 3
    assert record["adapt"]["switches"] >= 2
    assert batches == fixed_batches  # every step saw the same samples, in the same order
    assert figures == fixed_figures  # bit-identical figures...
    assert all(torch.equal(weights[k], fixed_weights[k]) for k in fixed_weights)  # ...and weights
    in_force = record["adapt"]["in_force"]
    assert (loader.backend, loader.num_workers, loader.prefetch_factor) == (in_force["backend"], in_force["workers"],
                                                                              in_force["prefetch"])
    assert record["adapt"]["rechecks"] or in_force == record["adapt"]["chosen"]  # a re-check may end with the run
    assert fixed_record["adapt"]["enabled"] is False  # --no-adapt keeps the settings as given
    assert (fixed_loader.backend, fixed_loader.num_workers, fixed_loader.prefetch_factor) == ("process", 0, 2)
    assert record["adapt"]["given"] == {"backend": "process", "workers": 0, "prefetch": 2, "threads": None}


def test_a_short_run_tries_nothing_and_says_why(folders: Path, tmp_path: Path) -> None:
    data = open_data(folders, valid=0.25, image_size=16, seed=0)
    train = make_loader(data["train"], batch_size=40, num_workers=0, device="cpu")
    model = SmallCNN(data.num_classes, width=8)
    fit(Scenario(model, torch.optim.SGD(model.parameters(), 0.01), nn.CrossEntropyLoss(), train, None, epochs=1,
                 device="cpu", log_dir=tmp_path, name="short", loggers=(), plot=False))
    record = json.loads((tmp_path / "short" / "run.json").read_text())["adapt"]
    assert not record["enabled"] and "too short" in record["reason"] and record["trials"] == []
    assert (train.backend, train.num_workers) == ("process", 0)


def test_a_stream_keeps_its_workers() -> None:
    from stoker import Pipe

    loader = make_loader(Pipe.from_iterable([(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)] * 8), batch_size=2,
                         num_workers=0, device="cpu")
    adapter = Adapter(loader, torch.device("cpu"), batches=10_000)
    assert not adapter.active and "stream split by worker" in adapter.reason


def test_threads_are_tried_exactly_when_asked(folders: Path, quick_trials: None) -> None:
    """The host-threads stage sets torch's threads between batches when asked, whatever the device, and never otherwise.

    ``fit`` asks only off the CPU (make_adapter): a CPU run's record says threads None
    (test_adapting_changes_no_batch_figure_or_weight)."""
    data = open_data(folders, valid=0.25, image_size=16, seed=0)
    loader = make_loader(data["train"], batch_size=2, num_workers=0, device="cpu")
    lines: list[str] = []
    adapter = Adapter(loader, torch.device("cpu"), batches=10_000, try_threads=True, say=lines.append)
    before = torch.get_num_threads()
    try:
        for _ in range(4):
            for _batch in adapter.batches():
                pass
    finally:
        torch.set_num_threads(before)
    assert any(t["threads"] is not None and t["threads"] != before for t in adapter.record()["trials"])
    assert lines and lines[0].startswith("adapt ")
    plain = Adapter(loader, torch.device("cpu"), batches=10_000)
    assert plain.given == Setting(loader.backend, loader.num_workers, loader.prefetch_factor, None)
    try:
        for _ in range(4):
            for _batch in plain.batches():
                pass
    finally:
        torch.set_num_threads(before)
    assert plain.trials and all(t["threads"] is None for t in plain.record()["trials"])


def test_no_adapt_flag_keeps_the_settings(folders: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(train_command, ["--data", str(folders), "--epochs", "1", "--image-size", "16",
                                       "--batch-size", "40", "--workers", "0", "--no-adapt", "--no-progress",
                                       "--log-dir", str(tmp_path), "--name", "flag"])
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "flag" / "run.json").read_text())
    assert record["adapt"]["enabled"] is False and "--no-adapt" in record["adapt"]["reason"]
    assert record["config"]["run"]["adapt"] is False


def _golden_module() -> Any:
    """tests/train/test_fit_golden.py, loaded by path (the tests are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fit_golden_cases", Path(__file__).with_name("test_fit_golden.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", ["accum3-sync5", "stop-train", "plain-bf16"])
def test_the_golden_runs_are_the_same_with_adapt_off(case: str, folders: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The fit goldens run with adapt on (the default); their digests are those of adapt off, on any machine
    (the recorded digests are pinned to one CPU): too short to try settings, or not a stoker Loader."""
    golden = _golden_module()
    on = golden.run_case(case, folders, tmp_path / "on", monkeypatch, caplog)
    caplog.clear()
    monkeypatch.setattr(loop, "make_adapter", lambda run: None)  # what fit does with adapt=False
    off = golden.run_case(case, folders, tmp_path / "off", monkeypatch, caplog)
    assert on == off


def test_reconfigure_between_batches_continues_the_same_epoch(folders: Path) -> None:
    """Every setting adapt may switch to, mid-epoch: the batches of the epoch are those of an unchanged loader."""
    data = open_data(folders, valid=0.25, image_size=16, seed=0)

    def epoch_keys(loader: Any) -> list[bytes]:
        return [images.numpy().tobytes() + labels.numpy().tobytes() for images, labels in loader]

    plain = make_loader(data["train"], batch_size=7, num_workers=0, device="cpu", seed=2)
    expected = [epoch_keys(plain), epoch_keys(plain)]  # two epochs: the order is a function of (seed, epoch)
    loader = make_loader(data["train"], batch_size=7, num_workers=0, device="cpu", seed=2)
    settings = [("thread", 2, 1), ("process", 1, 3), ("process", 0, 2), ("thread", 1, 2)]
    got: list[list[bytes]] = []
    for _epoch in range(2):
        batches: list[bytes] = []
        stream = iter(loader)
        for i, setting in enumerate(settings):
            for _ in range(3 + i):
                images, labels = next(stream)
                batches.append(images.numpy().tobytes() + labels.numpy().tobytes())
            position = loader.state_dict()
            stream.close()  # type: ignore[attr-defined]
            loader.reconfigure(backend=setting[0], num_workers=setting[1], prefetch_factor=setting[2])  # type: ignore[arg-type]
            loader.load_state_dict(position)
            stream = iter(loader)
        batches += [images.numpy().tobytes() + labels.numpy().tobytes() for images, labels in stream]
        got.append(batches)
    assert got == expected  # each sample exactly once per epoch, in the same batches
    assert (loader.backend, loader.num_workers, loader.prefetch_factor) == ("thread", 1, 2)


def test_reconfigure_refuses_a_stream() -> None:
    from stoker import Pipe
    from stoker.errors import ConfigError

    loader = make_loader(Pipe.from_iterable(range(8)), batch_size=2, num_workers=0, device="cpu")
    with pytest.raises(ConfigError, match="splits its stream by worker"):
        loader.reconfigure(num_workers=2)


READ_S = 0.04  # a sample's read in the stopped run: a wait, not CPU work


def _slow_storage(image: torch.Tensor) -> torch.Tensor:
    """The image as it is, after a wait of ``READ_S`` (storage, not the CPU): the step waits for data under any load."""
    time.sleep(READ_S)
    return image


class _StopAt(Logger):
    """A logger that asks the run to stop (as Ctrl-C) after training batch ``batch`` of epoch 1."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def batch_end(self, progress: Any) -> None:
        if (progress.phase, progress.epoch, progress.batch) == ("train", 1, self.batch):
            raise KeyboardInterrupt


def test_a_stop_during_the_trials_resumes_to_the_same_weights(folders: Path, tmp_path: Path, quick_trials: None) -> None:
    """last.pt taken while a trial's setting is in force holds the position, not the setting: the resumed run
    (its loader as given, adapting again) ends with the weights of an uninterrupted run without adapt.

    The stopped run's samples wait to be read (:func:`_slow_storage`, the same images), so its step waits for data
    whatever else runs on the machine: adapt tries more readers, and the stop falls inside their trials.
    """

    def scenario(name: str, adapt: bool, resume: bool = False, slow: bool = False) -> tuple[Scenario, _SeesBatches]:
        data = open_data(folders, valid=0.25, image_size=16, seed=0, transform=_slow_storage if slow else None)
        train = make_loader(data["train"], batch_size=2, num_workers=0, device="cpu", seed=5)
        torch.manual_seed(1 if resume else 0)  # a resumed run starts from other weights: last.pt must win
        model = nn.Sequential(nn.Dropout(0.1), SmallCNN(data.num_classes, width=8))
        seen = _SeesBatches()
        model.register_forward_pre_hook(seen)
        return Scenario(model, torch.optim.AdamW(model.parameters(), lr=2e-3), nn.CrossEntropyLoss(), train, None,
                        epochs=3, device="cpu", log_dir=tmp_path, name=name, adapt=adapt, resume=resume,
                        checkpoint_every_steps=5, loggers=(), progress=False, plot=False), seen

    fixed, fixed_seen = scenario("fixed", adapt=False)
    fit(fixed)
    first, first_seen = scenario("stopped", adapt=True, slow=True)
    with pytest.raises(KeyboardInterrupt):
        fit(first, callbacks=[_StopAt(23)])  # inside the trials: the run settles 8 batches, then 8 a trial
    stopped = json.loads((tmp_path / "stopped" / "run.json").read_text())["adapt"]
    # The premise: the stop came while a trial's other setting was in force (the step waited, so more readers).
    assert stopped["enabled"] and stopped["switches"] >= 1 and len(stopped["trials"]) >= 2, stopped
    assert stopped["trials"][0]["wait_share"] >= adapt_module.MARGIN, stopped
    assert stopped["in_force"] != stopped["given"], stopped
    again, again_seen = scenario("stopped", adapt=True, resume=True)
    fit(again)
    assert len(first_seen.digests) == 23 and first_seen.digests + again_seen.digests == fixed_seen.digests
    assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), fixed.model.state_dict().values(),
                                                 strict=True))


def test_a_run_of_seconds_keeps_its_settings(folders: Path, tmp_path: Path, quick_trials: None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The first trial projects the run's time; under MIN_RUN_S nothing else is tried (no change, no worker start)."""
    monkeypatch.setattr(adapt_module, "MIN_RUN_S", 1e9)
    *_, record, loader = _run(folders, tmp_path, "seconds", adapt=True)
    adapt = record["adapt"]
    assert adapt["enabled"] and len(adapt["trials"]) == 1 and adapt["switches"] == 0 and adapt["rechecks"] == 0
    assert "the settings are kept" in adapt["reason"] and adapt["chosen"] == adapt["given"]
    assert (loader.backend, loader.num_workers) == ("process", 0)
