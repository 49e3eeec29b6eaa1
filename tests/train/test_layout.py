"""channels_last in fit: the model and its batches in that memory format when chosen, the same results, the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from stoker import ClassFolderDataset, ConfigError, make_loader
from stoker.cli.train import train
from stoker.train import Scenario, SmallCNN, fit
from stoker.train.engine.layout import choose_layout

CL = torch.channels_last


class Recording(nn.Module):
    """SmallCNN that notes whether every input batch it sees is channels_last (and not merely square-contiguous)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = SmallCNN(4, width=8)
        self.formats: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A [B, 3, H, W] batch with C > 1 and H*W > 1 is channels_last exactly when its channel stride is 1.
        self.formats.append(x.stride(1) == 1 and x.is_contiguous(memory_format=CL))
        return self.net(x)


def _run(folders: Path, tmp_path: Path, name: str, channels_last: bool | None, amp: str = "off") -> tuple[Recording, dict]:
    torch.manual_seed(0)
    train_set, valid_set = ClassFolderDataset(folders).split(valid=0.25, seed=0)
    model = Recording()
    scenario = Scenario(
        model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), nn.CrossEntropyLoss(),
        make_loader(train_set, batch_size=16, num_workers=0, device="cpu", seed=3),
        make_loader(valid_set, batch_size=32, shuffle=False, num_workers=0, device="cpu"),
        epochs=2, device="cpu", amp=amp, log_dir=tmp_path, name=name, channels_last=channels_last,
        progress=False, loggers=("csv",), plot=False, adapt=False,
    )
    history = fit(scenario)
    record = json.loads((tmp_path / name / "run.json").read_text())
    record["history"] = [(e.train_loss, e.valid_loss, e.valid_acc) for e in history.epochs]
    return model, record


def test_channels_last_puts_the_model_and_every_batch_in_that_format_and_changes_no_result(
        folders: Path, tmp_path: Path) -> None:
    plain, plain_record = _run(folders, tmp_path, "plain", channels_last=False)
    last, last_record = _run(folders, tmp_path, "last", channels_last=True)

    convs = [m.weight for m in last.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=CL) and not w.is_contiguous() for w in convs)
    assert last.formats and all(last.formats)  # training and validation batches alike
    assert plain.formats and not any(plain.formats)
    assert not any(w.is_contiguous(memory_format=CL) and not w.is_contiguous()
                   for w in (m.weight for m in plain.modules() if isinstance(m, nn.Conv2d)))

    assert last_record["channels_last"]["enabled"] is True and "asked" in last_record["channels_last"]["reason"]
    assert plain_record["channels_last"]["enabled"] is False
    # Same weights at the start, same batches: the same run up to floating-point rounding.
    for a, b in zip(plain_record["history"], last_record["history"], strict=True):
        assert a == pytest.approx(b, rel=1e-3, abs=1e-4)
    assert last_record["history"][-1][0] < last_record["history"][0][0]  # and it trains


def test_channels_last_under_bf16_autocast_trains(folders: Path, tmp_path: Path) -> None:
    model, record = _run(folders, tmp_path, "bf16", channels_last=True, amp="bf16")
    assert all(model.formats) and record["channels_last"]["enabled"] is True
    assert all(torch.isfinite(torch.tensor(h[0])) for h in record["history"])


def test_off_by_default_on_the_cpu_and_the_record_says_why(folders: Path, tmp_path: Path) -> None:
    model, record = _run(folders, tmp_path, "default", channels_last=None, amp="bf16")
    assert not any(model.formats)
    assert record["channels_last"] == {"enabled": False, "reason": "default: off on cpu (on by default on CUDA under AMP)"}


def test_the_default_rule() -> None:
    cuda, cpu, conv, mlp = torch.device("cuda"), torch.device("cpu"), SmallCNN(3), nn.Linear(4, 2)
    assert choose_layout(None, cuda, "bf16", conv).channels_last
    assert choose_layout(None, cuda, "fp16", conv).channels_last
    assert not choose_layout(None, cuda, "off", conv).channels_last
    assert not choose_layout(None, cuda, "bf16", mlp).channels_last
    assert not choose_layout(None, cpu, "bf16", conv).channels_last
    assert not choose_layout(False, cuda, "bf16", conv).channels_last
    assert choose_layout(True, cpu, "off", mlp).channels_last


def test_the_key_and_the_flag(tmp_path: Path, folders: Path) -> None:
    with pytest.raises(ConfigError, match="channels_last must be true or false"):
        Scenario(nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), nn.CrossEntropyLoss(),
                 [], None, epochs=1, channels_last="yes")  # type: ignore[arg-type]
    config = tmp_path / "t.toml"
    config.write_text(f'[data]\npath = "{folders}"\nbatch_size = 32\nworkers = 0\nvalid = 0.25\n[model]\nname = "small_cnn"\n'
                      f'[run]\nlog_dir = "{tmp_path / "runs"}"\ndevice = "cpu"\nepochs = 1\nadapt = false\n')
    for flag, name, expected in (("--channels-last", "on", True), ("--no-channels-last", "off", False)):
        result = CliRunner().invoke(train, [str(config), flag, "--name", name, "--no-progress"])
        assert result.exit_code == 0, result.output
        record = json.loads((tmp_path / "runs" / name / "run.json").read_text())
        assert record["config"]["run"]["channels_last"] is expected
        assert record["channels_last"]["enabled"] is expected
    help_text = CliRunner().invoke(train, ["--help"]).output
    assert "--channels-last / --no-channels-last" in help_text and "[default: auto]" in help_text
