"""A rank lost mid-run (``kill -9``): the ranks left end with one stoker line, not a gloo or DataLoader traceback.

Real ranks over gloo, one of them killed with SIGKILL once the run has saved a point to
resume from: launched as torchrun launches them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``
and a rendezvous), where the survivor finds the loss in its next collective; and by
``torchrun`` itself, whose agent then sends the survivor and its loader worker SIGTERM.

The ranks run with ``PYTHONFAULTHANDLER=1``: a wait that runs out sends them SIGABRT, so
each writes every thread's Python stack to its output, and the failure shows where they hung.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = [pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                  reason="needs torch.distributed with gloo"),
              pytest.mark.timeout(360)]  # past the test's own waits, which fail with the ranks' stacks

TIMEOUT_S = 180  # from the launch to the first last.pt (imports and the rendezvous take most of it under load)
EXIT_S = 90  # from the kill to the survivor's end (it finds the loss in its next collective)
_DIST_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH")) if p)
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **more}


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc; none where there is no /proc)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _outputs(logs: Path) -> dict[str, str]:
    """The end of every rank's and launcher's error output under ``logs``."""
    files = [*logs.rglob("*.err"), *logs.rglob("stderr.log")]
    return {str(f): f.read_text(errors="replace")[-6000:] for f in files if f.is_file()}


def _stacks_then_fail(ranks: list[int], logs: Path, what: str) -> None:
    """SIGABRT to ``ranks`` (each writes its threads' stacks to its output, see the module docs), then fail with it."""
    for pid in ranks:
        try:
            os.kill(pid, signal.SIGABRT)
        except OSError:
            pass
    time.sleep(3)
    raise AssertionError(f"{what}; the ranks' output, their stacks at the end: {_outputs(logs)}")


def _train_args(folders: Path, runs: Path) -> list[str]:
    return ["-m", "stoker", "train", "--data", str(folders), "--epochs", "1000", "--batch-size", "16", "--workers", "1",
            "--device", "cpu", "--image-size", "16", "--model", "small_cnn", "--log-dir", str(runs), "--name", "lost",
            "--no-progress", "--no-adapt"]


def _wait_for_a_saved_point(runs: Path, alive: list[subprocess.Popen[bytes]], ranks: list[int], logs: Path) -> None:
    """Until the run saved last.pt; a rank that ended fails with its output, and so do ``TIMEOUT_S`` without it."""
    deadline = time.monotonic() + TIMEOUT_S
    last = runs / "lost" / "last.pt"
    while not last.is_file() and all(p.poll() is None for p in alive) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not last.is_file():
        if all(p.poll() is None for p in alive):
            _stacks_then_fail(ranks or [pid for p in alive for pid in _children(p.pid)], logs,
                              f"no {last.name} after {TIMEOUT_S} s with the ranks alive")
        raise AssertionError(f"a rank ended before {last.name}: {_outputs(logs)}")
    time.sleep(0.5)  # into the next epoch's steps


def _rank_pid(agent: int, rank: int) -> int:
    """The pid of the worker of torchrun's agent (process ``agent``) that runs ``rank``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == agent and f"RANK={rank}".encode() in env:
            return int(entry.name)
    raise AssertionError(f"no worker of rank {rank} under torchrun's process {agent}")


def _check_one_line(err: str, lost_pid: int, runs: Path) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: rank 0 stops in epoch "), lines
    assert f"rank 1 (process {lost_pid} on {socket.gethostname()}) is gone" in lines[0], lines
    assert f"{runs / 'lost' / 'last.pt'} holds the last point saved: continue with " in lines[0], lines
    assert lines[0].endswith(f"--log-dir {runs} --name lost --resume"), lines


def test_after_kill_9_of_a_rank_the_other_ends_with_one_stoker_line(folders: Path, tmp_path: Path) -> None:
    runs, port = tmp_path / "runs", _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for rank in (0, 1):
            env = _env(WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            with open(tmp_path / f"rank{rank}.out", "wb") as out, open(tmp_path / f"rank{rank}.err", "wb") as err:
                procs.append(subprocess.Popen([sys.executable, *_train_args(folders, runs)], env=env, stdout=out, stderr=err,
                                              stdin=subprocess.DEVNULL))
        _wait_for_a_saved_point(runs, procs, [p.pid for p in procs], tmp_path)
        os.kill(procs[1].pid, signal.SIGKILL)
        procs[1].wait(timeout=30)
        try:
            code = procs[0].wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:  # a hang fails here
            _stacks_then_fail([procs[0].pid], tmp_path, f"rank 0 still runs {EXIT_S} s after rank 1 was killed")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert code == 1
    _check_one_line((tmp_path / "rank0.err").read_text(), procs[1].pid, runs)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's workers in /proc")
def test_under_torchrun_the_survivor_says_one_stoker_line_too(folders: Path, tmp_path: Path) -> None:
    runs, logs = tmp_path / "runs", tmp_path / "logs"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--redirects", "3",
              "--log-dir", str(logs), *_train_args(folders, runs)]
    with open(tmp_path / "torchrun.err", "wb") as err:
        agent = subprocess.Popen(launch, env=_env(), stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)
    try:
        _wait_for_a_saved_point(runs, [agent], [], tmp_path)
        lost = _rank_pid(agent.pid, 1)
        os.kill(lost, signal.SIGKILL)
        try:
            agent.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:  # a hang fails here
            _stacks_then_fail(_children(agent.pid), tmp_path, f"torchrun still runs {EXIT_S} s after rank 1 was killed")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)
    survivor = next(logs.glob("*/attempt_0/0/stderr.log"))
    _check_one_line(survivor.read_text(), lost, runs)  # the SIGTERM that torchrun sends it is not announced


def test_what_counts_as_a_lost_rank() -> None:
    from stoker.train.engine.distributed import Ranks, pid_space

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    here, space = socket.gethostname(), pid_space()
    ranks = Ranks(rank=0, world_size=2, processes=[(here, os.getpid(), space), (here, dead.pid, space)])
    assert ranks.gone() == [f"rank 1 (process {dead.pid} on {here}) is gone (killed, out of memory, or ended by an error "
                            "of its own: see its output)"]
    assert ranks.lost_rank(RuntimeError("anything")) == ranks.gone()[0]  # a rank known gone explains any error
    far = Ranks(rank=0, world_size=2, processes=[(here, os.getpid(), space), (here, dead.pid, space + "-elsewhere")])
    assert far.gone() == []  # a process of another machine or container cannot be checked from here, whatever its host name
    gloo = RuntimeError("[third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [10.0.0.2]:57548: Connection reset by peer")
    outer = RuntimeError("DataLoader worker (pid 7) is killed by signal: Terminated.")
    outer.__context__ = gloo  # raised while handling the backend's error, as under torchrun's SIGTERM
    said = far.lost_rank(outer)
    assert said is not None and "another rank stopped answering (gloo: Read error)" in said
    assert far.lost_rank(RuntimeError("DataLoader timed out after 30 seconds")) is None  # not the backend's words
    assert far.lost_rank(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
    assert Ranks().lost_rank(gloo) is None  # alone: no other rank to lose
