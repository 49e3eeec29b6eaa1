"""Training over several processes (gloo on the CPU): one run, equal steps, global figures, no hang.

Each test starts real ranks with ``torchrun`` running ``ddp_script.py``; a hang fails the
test by the subprocess timeout. Process start-up is most of the time, so each launch
runs several checks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner

from stoker.errors import CheckpointError
from stoker.train.engine.distributed import Ranks

SCRIPT = Path(__file__).with_name("ddp_script.py")
TIMEOUT_S = 240  # a hang fails here, long before torch's 30-minute collective timeout

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[2] / "src"), env.get("PYTHONPATH")) if p)
    return env


def _torchrun(*args: str, timeout_s: float = TIMEOUT_S, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT), *args]
    return subprocess.run(cmd, env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout_s)


def _avx2_only() -> dict[str, str]:
    """test_fit_golden.AVX2_ONLY (the tests are not a package): what holds the ranks to the pinned AVX2 kernels."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fit_golden_env", Path(__file__).with_name("test_fit_golden.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.AVX2_ONLY)


def _ranks_out(out: Path, mode: str, world: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(world)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _class_folders(root: Path, classes: int, per_class: int, size: int) -> Path:
    from PIL import Image

    from stoker.sources.synthetic import render

    for label in range(classes):
        (root / str(label)).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(render(label, size, size, seed=0, index=label * per_class + i), "RGB").save(root / str(label) / f"{i}.png")
    return root


def _numbered_shards(root: Path, n: int) -> Path:
    """A pixel shard set of ``n`` 4x4 images whose first two channels spell the sample's number."""
    from PIL import Image

    from stoker.packer import pack

    src = root / "src"
    for c in range(4):
        (src / str(c)).mkdir(parents=True)
    for i in range(n):
        Image.new("RGB", (4, 4), (i % 256, i // 256, 0)).save(src / str(i % 4) / f"{i:04d}.png", compress_level=1)
    pack(src, root / "packed", store="pixels", shard_samples=100, progress=False, workers=0)
    return root / "packed"


def test_torchrun_stoker_train_is_one_run_that_resumes_alone(tmp_path: Path) -> None:
    from stoker.cli.train import train
    from stoker.packer import pack
    from stoker.shards import ShardDataset

    _class_folders(tmp_path / "folders", classes=4, per_class=13, size=16)
    pack(tmp_path / "folders", tmp_path / "packed", store="pixels", valid=0.25, workers=0, progress=False)
    n_train, n_valid = (len(ShardDataset(tmp_path / "packed", split)) for split in ("train", "valid"))
    runs = tmp_path / "runs"
    args = ["--data", str(tmp_path / "packed"), "--epochs", "2", "--batch-size", "8", "--workers", "0",
            "--device", "cpu", "--log-dir", str(runs), "--name", "ddp", "--no-progress"]
    done = _torchrun("cli", str(tmp_path), "train", *args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]

    # One run: one folder, one CSV, one TensorBoard file; rank 0 alone printed.
    assert [p.name for p in runs.iterdir()] == ["ddp"]
    run_dir = runs / "ddp"
    assert len(list(run_dir.glob("metrics.csv"))) == 1 and len(list(run_dir.glob("events.out.tfevents.*"))) == 1
    assert done.stdout.count("2/2 - tLoss") == 1 and done.stdout.count("run folder:") == 1
    record = json.loads((run_dir / "run.json").read_text())
    assert record["world_size"] == 2 and record["status"] == "finished"
    for epoch in record["epochs"]:  # global figures: the even split trims n % 2; validation counts every sample once
        assert epoch["train_samples"] == n_train - n_train % 2 and epoch["trimmed"] == n_train % 2
        assert epoch["valid_samples"] == n_valid
    a, b = _ranks_out(tmp_path, "cli")
    assert a["digest"] is not None and a["digest"] == b["digest"]  # DDP kept the weights identical

    # last.pt holds the unwrapped model, and one process continues it from the epoch boundary.
    state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=True)
    assert not any(key.startswith("module.") for key in state["model"])
    again = CliRunner().invoke(train, [*args[:2], "--epochs", "3", "--log-dir", str(runs), "--name", "ddp", "--resume",
                                       "--no-progress"])
    assert again.exit_code == 0, again.output
    record = json.loads((run_dir / "run.json").read_text())
    assert record["world_size"] == 1 and [e["train_samples"] for e in record["epochs"]][-1] == n_train


def test_two_torchrun_agents_train_over_a_stream_and_a_pipe_in_step(tmp_path: Path) -> None:
    # Two "nodes" of one rank each, meeting at a c10d rendezvous on this machine: the multi-node path.
    root = _numbered_shards(tmp_path / "data", 1001)
    port = _free_port()
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "stoker-test",
             str(SCRIPT), "stream,pipe", str(tmp_path), str(root)],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for node in (0, 1)
    ]
    try:
        outputs = [agent.communicate(timeout=TIMEOUT_S)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for mode in ("stream", "pipe"):
        a, b = _ranks_out(tmp_path, mode)
        # 1,001 samples, 2 ranks x 2 workers, batch 50: 10 and 11 batches; both ran 10 steps.
        assert a["steps"] == b["steps"] == 10 and a["digest"] == b["digest"]
        seen = a["seen"] + b["seen"]
        assert len(seen) == len(set(seen)) and set(seen) <= set(range(1001))  # every sample at most once
        assert a["train_samples"] == len(seen) and a["trimmed"] == 1001 - len(seen)
    # The Pipe accumulated over 3 batches: DDP all-reduced at batches 3, 6 and 9 only (the partial
    # window of batch 10 is averaged by hand), not at every batch.
    assert _ranks_out(tmp_path, "pipe")[0]["reductions"] == 3


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One torchrun launch for several tests (process start-up is most of their time), held to AVX2 for the trace."""
    out = tmp_path_factory.mktemp("launch")
    return _torchrun("stop,resume,nan,nan-late,trace,crash", str(out), env=_avx2_only()), out


def test_stop_resume_nan_and_crash_agree_over_the_ranks(launch: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, tmp_path = launch
    assert (tmp_path / "nan-rank1.json").is_file(), done.stdout[-2000:] + done.stderr[-6000:]
    # Ctrl-C on rank 1: both ranks stop after the same step; last.pt holds each rank's loader position.
    stopped, resumed = _ranks_out(tmp_path, "stop"), _ranks_out(tmp_path, "resume")
    assert [r.get("interrupted") for r in stopped] == [True, True], done.stderr[-3000:]
    assert stopped[0]["steps"] == stopped[1]["steps"] == 3
    # ... and both continue from their own positions: the epoch is the uninterrupted one (10 steps, no repeats).
    assert [s["steps"] + r["steps"] for s, r in zip(stopped, resumed, strict=True)] == [10, 10]
    seen = [i for run in (*stopped, *resumed) for i in run["seen"]]
    assert len(seen) == len(set(seen)) == resumed[0]["train_samples"] == 1000
    assert resumed[0]["digest"] == resumed[1]["digest"]
    a, b = _ranks_out(tmp_path, "nan")
    assert a["error"] == b["error"] and "non-finite loss" in a["error"] and "epoch 1, batch 3" in a["error"]
    assert a["steps"] == b["steps"] == 3
    # Read back every 5 batches: both ranks train on to batch 5, then agree, and name the bad batch alike.
    a, b = _ranks_out(tmp_path, "nan-late")
    assert a["error"] == b["error"] and "epoch 1, batch 3;" in a["error"] and a["steps"] == b["steps"] == 5
    # Then rank 1 raises at its second step: the launch ends (with an error) instead of waiting on it.
    assert done.returncode != 0 and "rank 1 breaks down" in done.stderr


# Recorded under AVX2 kernels (the launch holds every rank to them on any x86_64 machine with AVX2, as
# test_fit_golden.py does); collectives re-recorded for the skipped count summed each epoch (0fafb4f, as in
# test_fit_golden.py: nothing else changed); from fit before it was split into named steps, per rank; re-recorded for the order module and for
# equal steps in the loader (collectives, and rank 0's logger calls: a stream's len() under ranks is unknown now),
# see test_fit_golden.py; collectives re-recorded for the ranks' pids gathered at set-up (one gather_text, so that a
# lost rank is named by the others; nothing else changed).
TRACE_ENVIRONMENT = "torch 2.14.1, x86_64, AVX2"
TRACE_GOLDEN: list[dict[str, Any]] = [
    {
        "collectives": "21e04ebe6b6e4146bdc6649f055a39cc38b317437984be736cd225133ea94f28",
        "calls": 43,
        "weights": "430e29280dfd79c3eeb458f9c8eee8a1c6e7cb5787ae1b0e97b785788b9dc4aa",
        "history": "63642b0139c7875cf2aedc2fcc17f9837e13f5a1b365c3ad7f24e38324bd4663",
        "trimmed": 1,
        "environment": "torch 2.14.1, x86_64, AVX2",
        "events": "fed04e71bca9cb88e34b28876567575f818e846aaa5b458f5f6a613e76fe55ee",
        "last": "6d004435212b8291edb4a9ae0c1bad06e7b5e15da9fe4e1fba7d270a2b9d1712",
        "best": "e5d64119946f03052a70d3b32275447a5c08fc486d08167bbec68d499f2243d1",
    },
    {
        "collectives": "21e04ebe6b6e4146bdc6649f055a39cc38b317437984be736cd225133ea94f28",
        "calls": 43,
        "weights": "430e29280dfd79c3eeb458f9c8eee8a1c6e7cb5787ae1b0e97b785788b9dc4aa",
        "history": "63642b0139c7875cf2aedc2fcc17f9837e13f5a1b365c3ad7f24e38324bd4663",
        "trimmed": 1,
        "environment": "torch 2.14.1, x86_64, AVX2",
    },
]


def test_two_ranks_make_the_recorded_collectives_and_weights_bit_for_bit(
        launch: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    done, out = launch
    assert (out / "trace-rank1.json").is_file(), done.stdout[-2000:] + done.stderr[-6000:]
    a, b = _ranks_out(out, "trace")
    # The same collectives in the same order on both ranks, one set of weights; one sample trimmed a epoch.
    assert a["calls"] == b["calls"] and a["weights"] == b["weights"] and a["history"] == b["history"]
    assert a["trimmed"] == 1
    print(f"\nTRACE_GOLDEN {json.dumps([a, b])}")  # to re-record: pytest -s -k recorded
    if a["environment"] != TRACE_ENVIRONMENT:
        pytest.skip(f"the golden digests pin {TRACE_ENVIRONMENT}; this is {a['environment']}")
    assert [a, b] == TRACE_GOLDEN


def test_a_mid_epoch_checkpoint_resumes_on_its_own_number_of_ranks_only(tmp_path: Path) -> None:
    from stoker.train.engine.run import _my_partial

    partial = {"epoch": 2, "phase": "train", "loader": {}, "train": {}, "train_timer": {}, "lr": 0.1, "world_size": 2,
               "ranks": [{"loader": {"r": 0}, "train": {}, "train_timer": {}}, {"loader": {"r": 1}, "train": {}, "train_timer": {}}]}
    assert _my_partial(partial, Ranks(rank=1, world_size=2), tmp_path / "last.pt")["loader"] == {"r": 1}  # type: ignore[index]
    with pytest.raises(CheckpointError, match="middle of epoch 2 on 2 rank.*--nproc-per-node 2"):
        _my_partial(partial, Ranks(), tmp_path / "last.pt")
    assert _my_partial(None, Ranks(), tmp_path / "last.pt") is None


def test_stoker_train_refuses_a_launch_without_rendezvous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stoker.cli.main import main

    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(main, ["train", "--data", str(tmp_path), "--device", "cpu", "--log-dir", str(tmp_path / "runs")])
    assert result.exit_code == 1 and "no rendezvous" in result.output and "torchrun" in result.output
    assert not (tmp_path / "runs").exists()  # refused before anything was written
