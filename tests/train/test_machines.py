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
import signal
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

# moto's S3 server (tests/remote/conftest.py), for the run folder at a URL
_spec = importlib.util.spec_from_file_location("_remote_fixtures", Path(__file__).resolve().parents[1] / "remote" / "conftest.py")
assert _spec is not None and _spec.loader is not None
_remote = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_remote)
s3_server = _remote.s3_server


@pytest.fixture(autouse=True)
def _fresh_s3_clients() -> None:
    """s3fs keeps one filesystem per set of arguments, made with the endpoint of its time: this module's server is another."""
    s3fs = pytest.importorskip("s3fs")
    s3fs.S3FileSystem.clear_instance_cache()


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


def _start(machines: list[Path], *args: str) -> list[subprocess.Popen[str]]:
    """``stoker train ARGS`` on two agents; ``machines[k]`` (its working folder) gets node rank k, so rank k."""
    port = _free_port()
    agents = []
    for node, machine in enumerate(machines):
        machine.mkdir(parents=True, exist_ok=True)
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node),
             "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "stoker", "train", *args],
            cwd=machine, env=_env(machine), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,  # its own process group: a hung agent's workers end with it
        ))
    return agents


def _finish(launches: dict[str, list[subprocess.Popen[str]]]) -> dict[str, tuple[list[int], list[str]]]:
    """Every launch's exit statuses and outputs (agent by agent), once all ended; a hang fails by the timeout."""
    done: dict[str, tuple[list[int], list[str]]] = {}
    try:
        for key, agents in launches.items():
            outputs = [agent.communicate(timeout=TIMEOUT_S)[0] for agent in agents]
            done[key] = ([agent.returncode for agent in agents], outputs)
    finally:
        for agents in launches.values():
            for agent in agents:
                try:
                    os.killpg(agent.pid, signal.SIGKILL)  # the agent and the rank it started, if still there
                except ProcessLookupError:
                    pass
                agent.wait()
    return done


def _ok(done: tuple[list[int], list[str]]) -> list[str]:
    codes, outputs = done
    assert codes == [0, 0], "\n---\n".join(o[-3000:] for o in outputs)
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
def runs(tmp_path_factory: pytest.TempPathFactory, folders: Path, s3_server: str) -> dict[str, Any]:
    """Every launch of this file, independent ones at the same time (start-up is most of their time).

    First: the uninterrupted two-epoch run; the run stopped after epoch 1 with machine a
    holding rank 0, in local folders and in a bucket (test_handover.py checks nothing to resume).
    Then the resumes: with b holding rank 0 and with a; and from the bucket with b.
    """
    import s3fs

    root = tmp_path_factory.mktemp("machines")
    s3fs.S3FileSystem.clear_instance_cache()  # an earlier module's filesystem would still point at its own server
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("stoker-machines")
    log_url = "s3://stoker-machines/runs"
    first = _finish({
        "reference": _start([root / "ref" / "a", root / "ref" / "b"], *_flags(folders, "--epochs", "2")),
        "stopped": _start([root / "stop" / "a", root / "stop" / "b"], *_flags(folders, "--epochs", "1")),
        "url": _start([root / "url" / "a", root / "url" / "b"], *_flags(folders, "--epochs", "1", "--log-dir", log_url)),
    })
    _ok(first["reference"]), _ok(first["stopped"]), _ok(first["url"])
    stopped = root / "stop"
    assert (stopped / "a" / "runs" / "m" / "last.pt").is_file() and not (stopped / "b" / "runs").exists()
    for rank0 in ("a", "b"):
        shutil.copytree(stopped, root / f"resume-{rank0}")
    second = _finish({
        "b": _start([root / "resume-b" / "b", root / "resume-b" / "a"], *_resume()),
        "a": _start([root / "resume-a" / "a", root / "resume-a" / "b"], *_resume()),
        "url": _start([root / "url" / "b", root / "url" / "a"], *_resume("--log-dir", log_url)),
    })
    return {"root": root, "first": first, "second": second, "log_url": log_url}


@pytest.fixture(scope="module")
def reference(runs: dict[str, Any]) -> dict[str, Any]:
    """The uninterrupted two-epoch run over the two machines: its last.pt (on machine a, rank 0)."""
    assert not (runs["root"] / "ref" / "b" / "runs").exists()  # rank 0 alone writes, on its own machine
    return load_checkpoint(runs["root"] / "ref" / "a" / "runs" / "m" / "last.pt")


@pytest.mark.parametrize("rank0", ["b", "a"])
def test_a_run_resumes_bit_exact_whichever_machine_holds_rank_0(runs: dict[str, Any], reference: dict[str, Any], rank0: str) -> None:
    outputs = _ok(runs["second"][rank0])
    # Rank 0 keeps the run in its own folder from now on: last.pt (handed over when it was on the other machine),
    # best.pt, metrics.csv with both epochs and run.json.
    run_dir = runs["root"] / f"resume-{rank0}" / rank0 / "runs" / "m"
    _same_run(load_checkpoint(run_dir / "last.pt"), reference)
    assert (run_dir / "best.pt").is_file()
    assert [line.split(",")[0] for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]] == ["1", "2"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["summary"]["epochs_done"] == 2 and record["world_size"] == 2
    assert "2/2 - tLoss" in outputs[0] and "tLoss" not in outputs[1]  # rank 0 alone printed


def test_a_run_folder_at_a_bucket_url_resumes_bit_exact_on_the_other_machine(runs: dict[str, Any], reference: dict[str, Any]) -> None:
    from stoker.fs import where

    log_url, root = runs["log_url"], runs["root"]
    outputs = _ok(runs["second"]["url"])
    run = where(f"{log_url}/m")
    names = set(run.kinds())
    assert {"last.pt", "best.pt", "run.json", "metrics.csv"} <= names
    assert sum(name.startswith("events.out.tfevents.") for name in names) == 2  # one per launch, both in the bucket
    # Resumed with machine b holding rank 0: b had never seen the run; the bucket had everything.
    _same_run(load_checkpoint("last.pt", data=run.read_bytes("last.pt")), reference)
    rows = run.read_bytes("metrics.csv").decode().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == ["1", "2"]
    assert json.loads(run.read_bytes("run.json"))["status"] == "finished"
    assert f"run folder: {log_url}/m" in outputs[0]
    assert not (root / "url" / "a" / "runs").exists() and not (root / "url" / "b" / "runs").exists()  # only the cache


def test_one_process_continues_a_bucket_run_from_another_machines_cache(
    tmp_path: Path, folders: Path, s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs
    from click.testing import CliRunner

    from stoker import ConfigError
    from stoker.cli.train import train
    from stoker.fs import where

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("stoker-solo")
    log_url = "s3://stoker-solo/runs"
    flags = _flags(folders, "--epochs", "1", "--log-dir", log_url)
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "a-cache"))  # machine a
    done = CliRunner().invoke(train, flags)
    assert done.exit_code == 0, done.output
    assert f"run folder: {log_url}/m (this machine's copy: {tmp_path / 'a-cache'}" in done.output
    again = CliRunner().invoke(train, flags)  # a new run under the same name at the URL is refused
    assert isinstance(again.exception, ConfigError) and f"{log_url}/m: already holds a run" in str(again.exception)

    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "b-cache"))  # machine b: only the bucket in common
    resumed = CliRunner().invoke(train, _resume("--log-dir", log_url))
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming {log_url}/m: it was finished after 1 epoch(s)" in resumed.output
    whole = CliRunner().invoke(train, _flags(folders, "--epochs", "2", "--log-dir", str(tmp_path / "local")))
    assert whole.exit_code == 0, whole.output
    run = where(f"{log_url}/m")
    run.invalidate()
    _same_run(load_checkpoint("last.pt", data=run.read_bytes("last.pt")), load_checkpoint(tmp_path / "local" / "m" / "last.pt"))
    assert [row.split(",")[0] for row in run.read_bytes("metrics.csv").decode().splitlines()[1:]] == ["1", "2"]
