"""``stoker inspect`` checks the stream's mixing at the loader's own worker count when --workers is left out."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker import pack
from stoker.cli.inspect import inspect
from stoker.cores import CORES_ENV
from stoker.loading.workers import batches_follow_workers
from stoker.shards import ShardStream


@pytest.fixture(scope="module")
def packs(digi: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inspect")
    for store in ("encoded", "pixels"):
        pack(digi, root / store, store=store, workers=0, progress=False)
    return {store: root / store for store in ("encoded", "pixels")}


def _stream_line(root: Path) -> str:
    result = CliRunner().invoke(inspect, [str(root), "--shuffle-buffer", "16"])
    assert result.exit_code == 0, result.output
    return next(line for line in result.output.splitlines() if "stream (buffer 16" in line)


def test_the_stream_check_assumes_the_loaders_default(packs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CORES_ENV, "16")
    assert not batches_follow_workers(ShardStream)  # a local stream deals by batch: no constant
    assert "workers" not in _stream_line(packs["pixels"])  # a pixel stream is read in the training process
    monkeypatch.setattr(ShardStream, "elastic", True, raising=False)  # a stream whose batches no worker count changes
    assert "8 workers x 1 rank" in _stream_line(packs["encoded"])  # the machine's: half of 16 cores beside a CPU model
