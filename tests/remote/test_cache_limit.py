"""The cache limit holds for a stream over a set four times larger, 2 epochs, 2 ranks x 2 workers, on moto's S3 server.

A thread samples the disk the cache folder takes as the processes read: every file's
blocks, plus any file of the folder that a process still holds open or mapped after it
was deleted (``/proc/<pid>/fd`` and ``/proc/<pid>/maps``). The GETs are counted from the
server's own request log.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from stoker import pack
from stoker.errors import ConfigError
from stoker.shards import ShardDataset, ShardStream
from stoker.shards.cache_entries import entry_cost

from .conftest import upload_folder, write_class_folders

SHARDS = 16
EPOCHS = 2


def _keys(items: list[tuple[torch.Tensor, int]]) -> list[str]:
    """What identifies each sample: its pixels (every image is random)."""
    return [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image, _ in items]


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def _deleted_but_held(root: str, pids: list[int]) -> int:
    """Bytes of files under ``root`` that are deleted but still open or mapped by one of ``pids``."""
    held: dict[tuple[int, int], int] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
                if target.startswith(root) and target.endswith("(deleted)"):
                    st = os.stat(fd)
                    held[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            except OSError:
                continue
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            if root in line and line.endswith("(deleted)"):
                span, _, _, _, inode = line.split()[:5]
                lo, hi = (int(x, 16) for x in span.split("-"))
                held.setdefault((-1, int(inode)), hi - lo)
    return sum(held.values())


def _disk(root: Path) -> int:
    """Blocks of every file under ``root``, each inode once (a walk can meet a file renamed meanwhile twice)."""
    seen: dict[tuple[int, int], int] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            seen[(st.st_dev, st.st_ino)] = st.st_blocks * 512
    return sum(seen.values())


class _Sampler(threading.Thread):
    """Samples the cache folder's disk use (deleted-but-held files included) until stopped."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.peak, self.samples = root, 0, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            used = _disk(self.root) + _deleted_but_held(str(self.root), _descendants(os.getpid()))
            self.peak, self.samples = max(self.peak, used), self.samples + 1
            time.sleep(0.002)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=30)


def _gets(log: Path, prefix: str) -> int:
    """GET requests of shard objects under ``prefix`` in moto's request log."""
    pattern = re.compile(rf'"GET /{re.escape(prefix)}/train-\d+\.arrow')
    return sum(1 for line in log.read_text(errors="replace").splitlines() if pattern.search(line))


def _read_rank(rank: int, url: str, cache: str, limit: int, out: str, ranks: int, workers: int) -> None:
    stream = ShardStream(url, cache_dir=cache, cache_limit=limit, rank=rank, world_size=ranks, shuffle_buffer=4, read_rows=16)
    context = "fork" if workers else None
    loader = DataLoader(stream, batch_size=16, num_workers=workers, collate_fn=_keys, multiprocessing_context=context)
    epochs = []
    for epoch in range(EPOCHS):
        stream.set_epoch(epoch)
        epochs.append([key for batch in loader for key in batch])
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"epochs": epochs, "plan": [stream.shards_at_once, stream.fetch_ahead]}))


@pytest.fixture(scope="module")
def pack16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """512 random 16x16 images in 16 pixel shards of 32."""
    root = tmp_path_factory.mktemp("pack16")
    data = write_class_folders(root / "data", SHARDS * 32, classes=4, size=(16, 16))
    out = root / "packed"
    pack(data, out, store="pixels", shard_samples=32, workers=0, progress=False)
    return out


@pytest.mark.parametrize(("ranks", "workers"), [(1, 0), (2, 2)])
def test_a_stream_four_times_the_cache_holds_its_limit(
    s3_server: str, bucket: str, pack16: Path, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
    forked_ranks: Callable[..., None], ranks: int, workers: int,
) -> None:
    """Peak disk <= limit and every sample once per epoch, with 1 reader and with 2 ranks x 2 workers.

    GETs <= shards x epochs is asserted for one reader. Several readers that are not in
    step (ranks without a collective between them, workers ahead of each other) read
    from more shards at once than this limit holds, so shards come back after eviction;
    the stream says so at start (see the test below).
    """
    url = upload_folder(pack16, f"{bucket}/packed")
    local = ShardDataset(pack16)
    infos = local.manifest.shards
    assert len(infos) == SHARDS
    limit = 4 * entry_cost(max(i.bytes for i in infos))
    assert sum(entry_cost(i.bytes) for i in infos) >= 4 * limit - 4 * 4096  # the set is four times the limit
    logs = sorted(tmp_path_factory.getbasetemp().glob("moto*/server.log"))
    assert logs, "moto's request log was not found"
    before = _gets(logs[0], url.removeprefix("s3://"))
    cache = tmp_path / "cache"
    sampler = _Sampler(cache)
    sampler.start()
    try:
        forked_ranks(_read_rank, url, str(cache), limit, str(tmp_path), ranks, workers, world_size=ranks, timeout_s=240)
    finally:
        sampler.stop()
    every = sorted(_keys([(image, 0) for image, _ in (local[i] for i in range(len(local)))]))  # type: ignore[misc]
    results: list[dict[str, Any]] = []
    for rank in range(ranks):
        results.append(json.loads((tmp_path / f"rank{rank}.json").read_text()))
    for epoch in range(EPOCHS):
        seen = sorted(key for r in results for key in r["epochs"][epoch])
        assert seen == every  # every sample exactly once per epoch, over both ranks
    gets = _gets(logs[0], url.removeprefix("s3://")) - before
    assert sampler.samples > 10
    assert sampler.peak <= limit, f"the cache folder took {sampler.peak:,} bytes, over its limit of {limit:,}"
    assert gets > 0
    if ranks * max(workers, 1) == 1:
        assert gets <= SHARDS * EPOCHS, f"{gets} GETs for {SHARDS} shards x {EPOCHS} epochs"


def test_a_limit_too_small_for_a_stream_says_the_smallest_that_works(s3_server: str, bucket: str, pack16: Path,
                                                                    tmp_path: Path) -> None:
    url = upload_folder(pack16, f"{bucket}/small-limit")
    cost = entry_cost(max(i.bytes for i in ShardDataset(pack16).manifest.shards))
    with pytest.raises(ConfigError, match=r"smallest limit that works is ([0-9,]+) bytes") as refused:
        ShardStream(url, cache_limit=cost + 1, cache_dir=tmp_path / "c")
    smallest = int(re.search(r"works is ([0-9,]+) bytes", str(refused.value)).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 2 * cost <= smallest <= 2 * cost + 8192  # two shards, and what the cached manifest takes
    ShardStream(url, cache_limit=smallest, cache_dir=tmp_path / "c")  # and it does work


def test_random_reads_of_a_split_larger_than_the_cache_hold_it_and_read_like_local(
    pack16: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = upload_folder(pack16, "memory://stoker-limit-test/map")
    local = ShardDataset(pack16)
    limit = 3 * entry_cost(max(i.bytes for i in local.manifest.shards))
    remote = ShardDataset(url, cache_dir=tmp_path / "c", cache_limit=limit)
    order = torch.randperm(len(local), generator=torch.Generator().manual_seed(0)).tolist()
    with caplog.at_level("WARNING", logger="stoker"):
        for start in range(0, len(order), 64):
            batch = order[start : start + 64]
            got, want = remote.__getitems__(batch), local.__getitems__(batch)
            assert got.images.equal(want.images) and got.labels.equal(want.labels)  # type: ignore[union-attr]
            assert _disk(tmp_path / "c") <= limit
    assert any("smallest limit that fetches each shard once" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("local_world", "local_rank", "placement", "says"),
    [
        ("2", "0", None, True), ("2", "1", None, False), ("1", "0", None, False),
        (None, None, (0, 2), True), (None, None, (1, 2), False),  # no torchrun count: every rank may be on this host
    ],
)
def test_readers_sharing_a_tight_cache_are_told_the_limit_that_downloads_once(
    pack16: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    local_world: str | None, local_rank: str | None, placement: tuple[int, int] | None, says: bool,
) -> None:
    """Several readers on one machine cannot promise one download per shard under a tight limit: one of them says so.

    The limit it names holds the whole split, so a stream given it is no longer tight.
    """
    for name, value in (("LOCAL_WORLD_SIZE", local_world), ("LOCAL_RANK", local_rank)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    rank, world_size = placement or (None, None)
    url = upload_folder(pack16, f"memory://stoker-share-test/{local_world}-{local_rank}-{rank}")
    limit = 4 * entry_cost(max(i.bytes for i in ShardDataset(pack16).manifest.shards))
    stream = ShardStream(url, cache_dir=tmp_path / "c", cache_limit=limit, shuffle_buffer=4, read_rows=16,
                         rank=rank, world_size=world_size)
    with caplog.at_level("WARNING", logger="stoker"):
        assert len(list(stream)) == len(stream)
    told = [r.getMessage() for r in caplog.records if "readers on this machine" in r.getMessage()]
    assert len(told) == (1 if says else 0)
    if says:
        assert f"{local_world or world_size} readers" in told[0]
        whole = int(re.search(r"once per epoch is ([0-9,]+) bytes", told[0]).group(1).replace(",", ""))  # type: ignore[union-attr]
        assert not ShardStream(url, cache_dir=tmp_path / "c2", cache_limit=whole).dataset.shards.tight
        assert ShardStream(url, cache_dir=tmp_path / "c3", cache_limit=whole - 4096).dataset.shards.tight
