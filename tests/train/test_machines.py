"""Several machines without a shared folder: two torchrun agents, each with its own run folder (or a bucket).

Each "machine" is a torchrun agent on 127.0.0.1 with its own working folder (and its own
cache), one rank each, meeting at a static rendezvous; ``--node-rank`` decides which
agent holds rank 0, so both orders are forced. A run stopped after epoch 1 and resumed
to epoch 2 with only ``--name RUN --resume`` must end bit-exact with the uninterrupted
two-epoch run, whichever machine holds rank 0 when it resumes, and with ``--log-dir`` a
bucket URL on moto's S3 server. A hang fails by the subprocess timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from stoker.train import load_checkpoint

TIMEOUT_S = 180
_SRC = Path(__file__).resolve().parents[2] / "src"

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")

# moto's S3 server and a bucket on it (tests/remote/conftest.py), for the run folder at a URL
_spec = importlib.util.spec_from_file_location("_remote_fixtures", Path(__file__).resolve().parents[1] / "remote" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_remote = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_remote)
s3_server, bucket = _remote.s3_server, _remote.bucket


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(machine: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH")) if p)
    env["STOKER_CACHE"] = str(machine / "cache")  # nothing shared between the machines, not even the cache
    env["OMP_NUM_THREADS"] = "1"
    return env


def _launch(machines: list[Path], *args: str) -> list[str]:
    """``stoker train ARGS`` on two agents; ``machines[k]`` (its working folder) gets node rank k, so rank k."""
    port = _free_port()
    agents = []
    for node, machine in enumerate(machines):
        machine.mkdir(parents=True, exist_ok=True)
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
             "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "stoker", "train", *args],
            cwd=machine, env=_env(machine), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        ))
    try:
        outputs = [agent.communicate(timeout=TIMEOUT_S)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [agent.returncode for agent in agents] == [0, 0], "\n---\n".join(o[-3000:] for o in outputs)
    return outputs


def _flags(data: Path, *more: str) -> list[str]:
    return ["--data", str(data), "--batch-size", "16", "--workers", "0", "--image-size", "16", "--lr", "0.003",
            "--device", "cpu", "--seed", "1", "--no-progress", "--name", "m", *more]


def _resume(*more: str) -> list[str]:
    return ["--name", "m", "--resume", "--epochs", "2", "--no-progress", *more]  # nothing else: the config comes from run.json


def _same_run(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Bit-exact: weights, optimizer state and every epoch's figures (times aside)."""
    assert a["epoch"] == b["epoch"] == 2
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    figures = ("train_loss", "train_acc", "valid_loss", "valid_acc", "train_samples")
    rows = [[{k: e[k] for k in figures} for e in state["history"]["epochs"]] for state in (a, b)]
    assert rows[0] == rows[1] and len(rows[0]) == 2


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, folders: Path) -> dict[str, Any]:
    """The uninterrupted two-epoch run over the two machines: its last.pt."""
    root = tmp_path_factory.mktemp("reference")
    _launch([root / "a", root / "b"], *_flags(folders, "--epochs", "2"))
    assert not (root / "b" / "runs").exists()  # rank 0 alone writes, on its own machine
    return load_checkpoint(root / "a" / "runs" / "m" / "last.pt")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory, folders: Path) -> Path:
    """Machines a (rank 0) and b after epoch 1: the run folder is on a only."""
    root = tmp_path_factory.mktemp("stopped")
    _launch([root / "a", root / "b"], *_flags(folders, "--epochs", "1"))
    assert (root / "a" / "runs" / "m" / "last.pt").is_file() and not (root / "b" / "runs").exists()
    return root


@pytest.mark.parametrize("rank0", ["b", "a"])
def test_a_run_resumes_bit_exact_whichever_machine_holds_rank_0(
    reference: dict[str, Any], stopped: Path, tmp_path: Path, rank0: str
) -> None:
    shutil.copytree(stopped, tmp_path, dirs_exist_ok=True)
    other = "a" if rank0 == "b" else "b"
    outputs = _launch([tmp_path / rank0, tmp_path / other], *_resume())
    # Rank 0 keeps the run in its own folder from now on: last.pt (handed over when it was on the other machine),
    # best.pt, metrics.csv with both epochs and run.json.
    run_dir = tmp_path / rank0 / "runs" / "m"
    _same_run(load_checkpoint(run_dir / "last.pt"), reference)
    assert (run_dir / "best.pt").is_file()
    assert [line.split(",")[0] for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]] == ["1", "2"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["summary"]["epochs_done"] == 2 and record["world_size"] == 2
    assert "2/2 - tLoss" in outputs[0] and "tLoss" not in outputs[1]  # rank 0 alone printed


def test_nothing_to_resume_on_any_machine_is_one_error_on_both(tmp_path: Path, folders: Path) -> None:
    port_flags = _flags(folders, "--epochs", "1", "--resume")
    port = _free_port()
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
             "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "stoker", "train", *port_flags],
            cwd=tmp_path, env=_env(tmp_path / str(node)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [agent.communicate(timeout=TIMEOUT_S)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [agent.returncode for agent in agents] == [1, 1] or all(agent.returncode != 0 for agent in agents), outputs
    assert all("no last.pt to resume from on any of the 2 ranks" in out for out in outputs), outputs


def test_a_run_folder_at_a_bucket_url_resumes_bit_exact_on_the_other_machine(
    reference: dict[str, Any], tmp_path: Path, folders: Path, bucket: str
) -> None:
    log_dir = f"{bucket}/runs"
    _launch([tmp_path / "a", tmp_path / "b"], *_flags(folders, "--epochs", "1", "--log-dir", log_dir))
    from stoker.fs import where

    run = where(f"{log_dir}/m")
    assert {"last.pt", "best.pt", "run.json", "metrics.csv"} <= set(run.kinds())
    assert any(name.startswith("events.out.tfevents.") for name in run.kinds())
    # Resumed with machine b holding rank 0: b has never seen the run; the bucket has everything.
    outputs = _launch([tmp_path / "b", tmp_path / "a"], *_resume("--log-dir", log_dir))
    run.invalidate()
    _same_run(load_checkpoint("last.pt", data=run.read_bytes("last.pt")), reference)
    rows = run.read_bytes("metrics.csv").decode().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["1", "2"]
    assert json.loads(run.read_bytes("run.json"))["status"] == "finished"
    assert f"run folder: {log_dir}/m" in outputs[0]
    assert not (tmp_path / "a" / "runs").exists() and not (tmp_path / "b" / "runs").exists()  # nothing local but the cache
