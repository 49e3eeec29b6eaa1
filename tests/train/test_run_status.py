"""A run whose process is gone is interrupted, not running: for `stoker compare` and `stoker train --resume`.

A ``kill -9`` leaves ``run.json`` saying ``"status": "running"``; the record's pid and host
(rank 0's under torchrun) tell the next reader that nothing runs it any more.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from click.testing import CliRunner

from stoker.cli.compare import compare
from stoker.cli.train import train
from stoker.train.engine.record import describe_status, run_status
from stoker.train.runner.compare import format_table, load_run

TIMEOUT_S = 180


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH")) if p)
    return env


def _dead_pid() -> int:
    """The pid of a process that was just killed with SIGKILL (and reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return proc.pid


def test_a_running_record_whose_rank0_process_is_gone_is_interrupted() -> None:
    here = socket.gethostname()
    dead = _dead_pid()
    # Under torchrun the record holds rank 0's pid: rank 0 killed, the run is interrupted whatever the other ranks did.
    record = {"status": "running", "pid": dead, "host": here, "world_size": 2, "summary": {"epochs_done": 3}}
    assert run_status(record) == "interrupted"
    assert describe_status(record) == f"interrupted (process {dead} on {here} is gone, killed or lost) after 3 epoch(s)"
    assert run_status({**record, "pid": os.getpid()}) == "running"  # alive: still running
    assert run_status({**record, "host": here + "-elsewhere"}) == "running"  # cannot be checked from here
    assert "cannot be checked" in describe_status({**record, "host": here + "-elsewhere"})
    assert run_status({"status": "running"}) == "running"  # a record from before pids were kept
    assert run_status({**record, "status": "finished"}) == "finished"  # an ended run says how it ended
    assert run_status({}) == "unknown"


def test_a_killed_rank0_not_yet_reaped_is_interrupted_too() -> None:
    # A zombie: killed, its parent (here this test; in a container, maybe a first process that never waits) not
    # having reaped it. It still answers kill(pid, 0), but it runs nothing.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {"status": "running", "pid": proc.pid, "host": socket.gethostname(), "world_size": 2}
        assert run_status(record) == "running"
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while run_status(record) == "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run_status(record) == "interrupted"
        assert proc.poll() is not None  # now reaped: still interrupted
        assert run_status(record) == "interrupted"
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_run_killed_by_sigkill_is_interrupted_for_compare_and_resume(folders: Path, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    args = ["train", "--data", str(folders), "--epochs", "1000", "--batch-size", "32", "--workers", "0", "--device", "cpu",
            "--log-dir", str(runs), "--name", "killed", "--no-progress"]
    run_dir = runs / "killed"
    with (tmp_path / "out.txt").open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stoker", *args], env=_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while not (run_dir / "last.pt").is_file() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert (run_dir / "last.pt").is_file(), (tmp_path / "out.txt").read_text()[-3000:]
        finally:
            proc.kill()  # SIGKILL: the run has no chance to record how it ended
            proc.wait(timeout=60)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "running" and record["pid"] == proc.pid  # what the killed run left behind

    # stoker compare: interrupted, in the summary and the table.
    assert load_run(run_dir).status == "interrupted"
    assert format_table([load_run(run_dir)]).splitlines()[1].split()[-1] == "interrupted"
    shown = CliRunner().invoke(compare, [str(runs), "--out", str(tmp_path / "c.png")])
    assert shown.exit_code == 0, shown.output
    assert "interrupted" in shown.output and "running" not in shown.output

    # stoker train --resume: says the run was interrupted (its process gone), then continues it to the end.
    done = int(torch.load(run_dir / "last.pt", map_location="cpu", weights_only=True)["epoch"])
    again = CliRunner().invoke(train, ["--log-dir", str(runs), "--name", "killed", "--resume", "--epochs", str(done + 1),
                                       "--no-progress"])
    assert again.exit_code == 0, again.output
    assert f"resuming {run_dir}: it was interrupted (process {proc.pid} on {socket.gethostname()} is gone" in again.output
    assert run_status(json.loads((run_dir / "run.json").read_text())) == "finished"
