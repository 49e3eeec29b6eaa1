"""stoker.train.engine.distributed: joining a torchrun launch, and refusing launches that cannot work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from stoker.errors import ConfigError
from stoker.train.engine.distributed import join_launch


def test_a_single_process_runs_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ranks = join_launch("cpu")
    assert (ranks.rank, ranks.world_size, ranks.main, ranks.active) == (0, 1, True, False)
    assert ranks.sum([1.0, 2.0]) == [1.0, 2.0] and ranks.broadcast_text("x") == "x"


def test_bad_launches_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(ConfigError, match="no rendezvous.*torchrun"):
        join_launch("cpu")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(ConfigError, match="RANK='two'"):
        join_launch("cpu")
    monkeypatch.setenv("RANK", "0")
    if not torch.cuda.is_available():
        monkeypatch.setenv("STOKER_DIST_BACKEND", "nccl")
        with pytest.raises(ConfigError, match="NCCL needs CUDA"):
            join_launch("auto")


def test_collectives_over_two_gloo_ranks(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent('''
        import json, os, sys
        from stoker.train.engine.distributed import join_launch
        ranks = join_launch("cpu", timeout_s=60)
        out = {"sum": ranks.sum([ranks.rank + 1.0]), "max": ranks.max([float(ranks.rank)]),
               "any": ranks.any(ranks.rank == 1), "text": ranks.broadcast_text(f"from {ranks.rank}"),
               "none": ranks.broadcast_text(None if ranks.main else "x")}
        open(os.path.join(sys.argv[1], f"rank{ranks.rank}.json"), "w").write(json.dumps(out))
        ranks.close()
    '''))
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out == {"sum": [3.0], "max": [1.0], "any": True, "text": "from 0", "none": None}
