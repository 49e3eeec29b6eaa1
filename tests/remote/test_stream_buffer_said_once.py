"""A stream's buffer lowered for a tight cache is said once per run, not by every worker process each epoch.

The run is a process of its own (2 worker processes, 2 epochs), so the lines counted are
everything its processes wrote to stderr, workers included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import pack_random

SCRIPT = textwrap.dedent(
    """
    import logging, os, sys
    from pathlib import Path

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(process)d %(message)s")
    from stoker.fs import RemoteLocation
    from stoker.loading import make_loader
    from stoker.shards import ShardDataset, ShardStream
    from stoker.shards.cache.entries import entry_cost

    packed, cache = Path(sys.argv[1]), Path(sys.argv[2])
    place = RemoteLocation("memory://stoker-said-once/set")  # the worker processes are forked: they see it too
    for path in sorted(packed.rglob("*")):
        if path.is_file():
            place.upload(path, path.relative_to(packed).as_posix())
    place.invalidate()
    limit = 4 * entry_cost(max(i.bytes for i in ShardDataset(packed).manifest.shards))
    stream = ShardStream("memory://stoker-said-once/set", cache_dir=cache, cache_limit=limit, shuffle_buffer=256,
                         read_rows=16)
    loader = make_loader(stream, batch_size=16, num_workers=2, backend="process", device="cpu")
    print("pid", os.getpid(), flush=True)
    for epoch in range(2):
        loader.set_epoch(epoch)
        print("epoch", epoch, sum(len(labels) for _, labels in loader), flush=True)
    """
)


@pytest.fixture(scope="module")
def pack16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """512 random 16x16 images in 16 pixel shards of 32."""
    return pack_random(tmp_path_factory.mktemp("pack16"), shards=16, per_shard=32)


def test_a_lowered_buffer_is_said_once_by_a_run_with_two_workers_over_two_epochs(pack16: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK", "WORLD_SIZE")}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(pack16), str(tmp_path / "cache")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = run.stdout.splitlines()
    assert lines[1:3] == ["epoch 0 512", "epoch 1 512"], run.stdout  # both epochs read whole
    told = [line for line in run.stderr.splitlines() if "shuffle buffer of 256 rows is lowered" in line]
    assert len(told) == 1, run.stderr[-4000:]
    assert told[0].split()[0] == lines[0].split()[1]  # said by the run's own process, not by a worker
    assert "a larger --cache-limit keeps the buffer" in told[0]
