"""stoker train --resume: no flags repeated, conflicting flags refused, Ctrl-C saves, a killed run restarts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import stoker
from stoker import ConfigError
from stoker.cli.train import train
from stoker.train import load_checkpoint, read_csv


def _flags(folders: Path, log_dir: Path, name: str, *more: str) -> list[str]:
    return ["--data", str(folders), "--batch-size", "8", "--workers", "0", "--image-size", "16", "--lr", "0.003",
            "--device", "cpu", "--log-dir", str(log_dir), "--name", name, "--seed", "1", "--no-progress", *more]


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = load_checkpoint(a)["model"], load_checkpoint(b)["model"]
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_takes_the_runs_own_config_and_refuses_conflicting_flags(tmp_path: Path, folders: Path) -> None:
    first = CliRunner().invoke(train, [*_flags(folders, tmp_path, "r"), "--epochs", "1", "--tag", "who=me"])
    assert first.exit_code == 0, first.output

    conflict = CliRunner().invoke(train, ["--log-dir", str(tmp_path), "--name", "r", "--resume", "--batch-size", "32",
                                          "--model", "resnet18"])
    assert isinstance(conflict.exception, ConfigError)
    message = str(conflict.exception)
    assert "data.batch_size = 32 (the run has 8)" in message and "model.name = 'resnet18'" in message
    assert "run.json" in message

    same = ["--batch-size", "8", "--data", str(folders), "--tag", "who=me"]  # equal to the stored values: fine
    resumed = CliRunner().invoke(train, ["--log-dir", str(tmp_path), "--name", "r", "--resume", "--epochs", "2",
                                         "--no-progress", *same])
    assert resumed.exit_code == 0, resumed.output
    assert [r["epoch"] for r in read_csv(tmp_path / "r" / "metrics.csv")] == [1, 2]
    record = json.loads((tmp_path / "r" / "run.json").read_text())
    assert record["config"]["data"]["batch_size"] == 8 and record["config"]["data"]["image_size"] == [16, 16]
    assert record["config"]["run"]["epochs"] == 2 and record["tags"] == {"who": "me"}


def test_a_run_killed_before_its_first_last_pt_starts_again(tmp_path: Path, folders: Path) -> None:
    run_dir = tmp_path / "k"
    run_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record = {"name": "k", "status": "running", "pid": dead.pid, "host": socket.gethostname(),
              "summary": {"epochs_done": 0}}
    (run_dir / "run.json").write_text(json.dumps(record))
    (run_dir / "events.out.tfevents.1.old").write_text("stale")

    alive = {**record, "pid": os.getpid()}  # a run going on now is still a run
    (run_dir / "run.json").write_text(json.dumps(alive))
    busy = CliRunner().invoke(train, [*_flags(folders, tmp_path, "k"), "--epochs", "1"])
    assert isinstance(busy.exception, ConfigError) and "already holds a run" in str(busy.exception)

    (run_dir / "run.json").write_text(json.dumps(record))
    again = CliRunner().invoke(train, [*_flags(folders, tmp_path, "k"), "--epochs", "1"])
    assert again.exit_code == 0, again.output
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    assert not (run_dir / "events.out.tfevents.1.old").exists()

    finished = CliRunner().invoke(train, [*_flags(folders, tmp_path, "k"), "--epochs", "1"])
    assert isinstance(finished.exception, ConfigError) and "already holds a run" in str(finished.exception)


def test_sigint_to_stoker_train_saves_mid_epoch_and_resume_is_bit_identical(tmp_path: Path, folders: Path) -> None:
    flags = ["--epochs", "2", "--workers", "2", "--checkpoint-every-steps", "1"]
    straight = CliRunner().invoke(train, [*_flags(folders, tmp_path, "straight"), *flags])
    assert straight.exit_code == 0, straight.output

    env = {**os.environ, "PYTHONPATH": str(Path(stoker.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", "from stoker.cli.main import main; main()", "train",
               *_flags(folders, tmp_path, "split"), *flags]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        last = tmp_path / "split" / "last.pt"
        deadline = time.monotonic() + 120  # a hang fails here, not in the suite's timeout
        while not last.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert last.exists(), process.communicate(timeout=60)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, out + err
    assert "holds this point" in err and "--resume" in err
    partial = load_checkpoint(last)["partial"]
    assert partial is not None and partial["phase"] in ("train", "valid")

    resumed = CliRunner().invoke(train, ["--log-dir", str(tmp_path), "--name", "split", "--resume", "--no-progress"])
    assert resumed.exit_code == 0, resumed.output
    _same_weights(tmp_path / "split" / "last.pt", tmp_path / "straight" / "last.pt")
    rows, expected = read_csv(tmp_path / "split" / "metrics.csv"), read_csv(tmp_path / "straight" / "metrics.csv")
    assert [r["epoch"] for r in rows] == [1, 2]
    assert [r["loss/train"] for r in rows] == [r["loss/train"] for r in expected]


@pytest.mark.parametrize("value", ["0", "x"])
def test_checkpoint_every_steps_is_checked(tmp_path: Path, folders: Path, value: str) -> None:
    result = CliRunner().invoke(train, [*_flags(folders, tmp_path, "c"), "--checkpoint-every-steps", value])
    assert result.exit_code != 0
