"""The cache limit holds for a stream over a set four times larger, 2 epochs, 2 ranks x 2 workers, on moto's S3 server.

A thread samples the disk the cache folder takes as the processes read: every file's
blocks, plus any file of the folder that a process still holds open or mapped after it
was deleted (``/proc/<pid>/fd`` and ``/proc/<pid>/maps``). The GETs are counted from the
server's own record of the requests it answered (moto's recorder API, whatever their status), not from its log.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from stoker.errors import ConfigError
from stoker.loading import make_loader
from stoker.shards import ShardDataset, ShardStream
from stoker.shards.cache import readers as cache_readers
from stoker.shards.cache.entries import entry_cost
from stoker.shards.read.fetch_ahead import disk_peak, shard_room

from .conftest import ServerRecord, pack_random, upload_folder

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


def _gets(record: ServerRecord, prefix: str) -> int:
    """GET requests of shard objects under ``prefix`` that the server answered."""
    return record.count("GET", re.compile(rf"/{re.escape(prefix)}/train-\d+\.arrow$"))


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
    return pack_random(tmp_path_factory.mktemp("pack16"), shards=SHARDS, per_shard=32)


@pytest.mark.parametrize(("ranks", "workers"), [(1, 0), (2, 2)])
def test_a_stream_four_times_the_cache_holds_its_limit(
    s3_server: str, bucket: str, pack16: Path, tmp_path: Path, server_record: ServerRecord,
    forked_ranks: Callable[..., None], ranks: int, workers: int,
) -> None:
    """Peak disk <= limit, every sample once per epoch and GETs <= shards x epochs, with 1 reader and 2 ranks x 2 workers.

    The ranks have no collective between them and the workers run ahead of each other, so
    the readers are not in step: they read by the machine's plan (a reader ahead waits for
    the slower ones before it downloads). The run has 120 s (a reader waiting 15 s for room
    a few times over would show), under a limit of a quarter of the set.
    """
    url = upload_folder(pack16, f"{bucket}/packed")
    local = ShardDataset(pack16)
    infos = local.manifest.shards
    assert len(infos) == SHARDS
    limit = 4 * entry_cost(max(i.bytes for i in infos))
    assert sum(entry_cost(i.bytes) for i in infos) >= 4 * limit - 4 * 4096  # the set is four times the limit
    server_record.start()  # the uploads are not counted
    cache = tmp_path / "cache"
    sampler = _Sampler(cache)
    sampler.start()
    try:
        forked_ranks(_read_rank, url, str(cache), limit, str(tmp_path), ranks, workers, world_size=ranks, timeout_s=120)
    finally:
        sampler.stop()
    every = sorted(_keys([(image, 0) for image, _ in (local[i] for i in range(len(local)))]))  # type: ignore[misc]
    results: list[dict[str, Any]] = []
    for rank in range(ranks):
        results.append(json.loads((tmp_path / f"rank{rank}.json").read_text()))
    for epoch in range(EPOCHS):
        seen = sorted(key for r in results for key in r["epochs"][epoch])
        assert seen == every  # every sample exactly once per epoch, over both ranks
    gets = _gets(server_record, url.removeprefix("s3://"))
    assert sampler.samples > 10
    assert sampler.peak <= limit, f"the cache folder took {sampler.peak:,} bytes, over its limit of {limit:,}"
    assert gets > 0
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


def test_a_reader_waits_a_bounded_time_for_readers_that_do_not_come(
    pack16: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 of 2 on one machine, rank 1 never comes: its window is kept for it until ARRIVAL_S, then rank 0 reads on.

    Every sample of rank 0 is read once, each shard downloaded once, and the wait is said.
    """
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)  # both ranks count as this machine's
    monkeypatch.setattr(cache_readers, "ARRIVAL_S", 1.0)
    monkeypatch.setattr(cache_readers, "SAY_WAIT_S", 0.5)
    monkeypatch.setattr(cache_readers, "_said_wait", False)
    url = upload_folder(pack16, "memory://stoker-share-test/arrival")
    limit = 4 * entry_cost(max(i.bytes for i in ShardDataset(pack16).manifest.shards))
    stream = ShardStream(url, cache_dir=tmp_path / "c", cache_limit=limit, shuffle_buffer=4, read_rows=16, rank=0,
                         world_size=2)
    with caplog.at_level("WARNING", logger="stoker"):
        start = time.monotonic()
        keys = _keys(list(stream))
        took = time.monotonic() - start
    assert len(keys) == len(set(keys)) == len(stream)
    assert stream.dataset.shards.cache.downloads == SHARDS  # type: ignore[union-attr]
    assert took >= 1.0  # it waited for rank 1 (the run's bound is the test's timeout)
    assert any("waited" in r.getMessage() and "other readers" in r.getMessage() for r in caplog.records)
    time.sleep(1.1)
    assert cache_readers.next_uses(tmp_path / "c") is None  # no reader is waited for any more: no plan
    assert not list(cache_readers.registry_dir(tmp_path / "c").glob("*/plan-*.json"))  # and the plan is removed


def test_disk_peak_counts_what_a_reader_must_keep_between_reads() -> None:
    """Shards read within one read cost one at a time; a shard spanning reads stays on disk across them."""
    assert disk_peak(np.asarray([0, 0, 1, 1, 2, 2]), 2) == 1  # each shard is one whole read
    assert disk_peak(np.asarray([0, 1, 2, 3]), 4) == 1  # four shards, one read: one at a time
    assert disk_peak(np.asarray([0, 1, 0, 1, 2, 2]), 2) == 2  # 0 and 1 span reads 0-1; 2 comes after them
    assert disk_peak(np.asarray([0, 1, 0, 2]), 2) == 2  # 0 spans reads 0-1, and 1 and 2 are read alone, one at a time
    assert disk_peak(np.asarray([0, 1, 1, 1, 1, 0]), 2) == 2  # 0 spans all three reads
    assert disk_peak(np.asarray([], dtype=np.int64), 2) == 0


def test_a_tight_stream_lowers_a_buffer_that_would_spread_reads_over_more_shards_than_fit(
    pack16: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A buffer larger than the shards the limit holds: lowered for the reader (said once), each shard downloaded once."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    url = upload_folder(pack16, "memory://stoker-share-test/buffer")
    limit = 4 * entry_cost(max(i.bytes for i in ShardDataset(pack16).manifest.shards))
    stream = ShardStream(url, cache_dir=tmp_path / "c", cache_limit=limit, shuffle_buffer=256, read_rows=16)
    with caplog.at_level("WARNING", logger="stoker"):
        keys = _keys(list(stream))
        stream.set_epoch(1)
        keys += _keys(list(stream))
    assert len(keys) == 2 * len(stream.dataset) and len(set(keys)) == len(stream.dataset)
    told = [r.getMessage() for r in caplog.records if "shuffle buffer of 256 rows is lowered" in r.getMessage()]
    assert len(told) == 1
    assert stream.dataset.shards.cache.downloads <= 2 * SHARDS  # type: ignore[union-attr]
    assert not any("fetched again" in r.getMessage() for r in caplog.records)
    with_buffer = stream.order()
    assert disk_peak(stream.dataset.shards.locate(with_buffer)[0], 16) <= 3  # what the limit holds


def test_a_registry_folder_open_to_others_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of the registry's name that others may write in (planted) is neither written nor trusted; said once."""
    folder = cache_readers.registry_dir(tmp_path)
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o777)
    (folder / "planted").mkdir()
    (folder / "planted" / "plan-0.json").write_text(json.dumps({"uses": [{"e" * 64: [0]}], "window": 0}))
    monkeypatch.setattr(cache_readers, "_warned", False)
    plan = cache_readers.MachinePlan(({"a" * 64: [0, 16]},), 0)
    try:
        with caplog.at_level("WARNING", logger="stoker"):
            reader = cache_readers.PlanReader(tmp_path, "pass-c", 0, 0, plan)
            reader.at(16)
        assert cache_readers.next_uses(tmp_path) is None
        assert not list(folder.glob("pass-c*"))
        assert reader.admitted("a" * 64)  # it plans alone
        assert sum("cannot be written" in r.getMessage() for r in caplog.records) == 1
        reader.close()
    finally:
        shutil.rmtree(folder)


def test_the_plan_orders_eviction_by_next_use_and_admits_within_the_window(tmp_path: Path) -> None:
    """Two readers' plan: next uses follow each reader's position; a reader ahead waits for the slower one's window."""
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    plan = cache_readers.MachinePlan(({a: [0], b: [32]}, {a: [16], c: [48]}), 16)
    assert plan.smallest_room() == 1 and plan.smallest_room(16) == 2
    first = cache_readers.PlanReader(tmp_path, "pass-d", 0, 0, plan)
    second = cache_readers.PlanReader(tmp_path, "pass-d", 0, 1, plan)
    try:
        assert cache_readers.next_uses(tmp_path) == {a: (0, 0), b: (0, 32), c: (0, 48)}
        first.at(32)
        second.at(16)
        assert cache_readers.next_uses(tmp_path) == {a: (0, 0), b: (0, 0), c: (0, 32)}  # rows each reader has to go
        assert first.admitted(b)  # first use 32 <= the slowest (16) + the window (16)
        assert not first.admitted(c)  # 48: the second reader must move on first
        second.at(32)
        assert first.admitted(c)
        second.close()  # done with epoch 0: taken to be at the start of epoch 1 for ARRIVAL_S
        assert cache_readers.next_uses(tmp_path) == {b: (0, 0)}
    finally:
        first.close()
        second.close()


def test_the_dead_readers_records_are_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader whose process is gone holds nothing back; a plan no reader reads any more is removed."""
    a = "a" * 64
    plan = cache_readers.MachinePlan(({a: [0]}, {a: [64]}), 0)
    reader = cache_readers.PlanReader(tmp_path, "pass-e", 0, 0, plan)
    (reader.folder / "reader-1.json").write_text(json.dumps({"pid": 2**22 + 7, "epoch": 0, "at": 0}))  # above pid_max
    reader.at(32)
    assert reader.admitted("b" * 64)  # a shard outside the plan: nothing keeps room for it
    assert cache_readers.next_uses(tmp_path) == {}  # the live reader's uses are behind it, the other is gone
    monkeypatch.setattr(cache_readers, "ARRIVAL_S", 0.0)
    reader.close()
    assert cache_readers.next_uses(tmp_path) is None
    assert not list(reader.folder.glob("plan-*.json"))


def test_a_mid_epoch_resume_under_another_cache_plan_is_refused(pack16: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit plans a tight stream's order: the same limit resumes exactly, another one is refused mid-epoch, not at an epoch's end."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    url = upload_folder(pack16, "memory://stoker-share-test/plan")
    cost = entry_cost(max(i.bytes for i in ShardDataset(pack16).manifest.shards))

    def loader(limit: int) -> Any:
        stream = ShardStream(url, cache_dir=tmp_path / f"c{limit}", cache_limit=limit, shuffle_buffer=256, read_rows=16)
        return make_loader(stream, batch_size=16, num_workers=0, device="cpu", collate_fn=_keys)

    whole = [key for batch in loader(4 * cost) for key in batch]
    first = loader(4 * cost)
    taken = []
    for batch in first:
        taken += batch
        if len(taken) >= 96:
            break
    state = first.state_dict()
    again = loader(4 * cost)
    again.load_state_dict(state)
    assert taken + [key for batch in again for key in batch] == whole  # the same plan: exactly the rest
    with pytest.raises(ConfigError, match="cache_room"):
        loader(6 * cost).load_state_dict(state)
    done = again.state_dict()  # at the epoch's end
    loader(6 * cost).load_state_dict(done)


def test_a_stream_larger_than_its_cache_gives_the_same_batches_for_every_worker_count(
    s3_server: str, bucket: str, pack16: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Split by batch under a limit too: 0, 1 and 2 workers and the thread backend give the same batches, each shard once."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    url = upload_folder(pack16, f"{bucket}/elastic")
    limit = 4 * entry_cost(max(i.bytes for i in ShardDataset(pack16).manifest.shards))

    def batches(workers: int, backend: str = "process") -> list[list[str]]:
        stream = ShardStream(url, cache_dir=tmp_path / f"cache-{workers}-{backend}", cache_limit=limit, shuffle_buffer=4)
        assert stream.split_by_batch(16) is True
        loader = make_loader(stream, batch_size=16, num_workers=workers, backend=backend, device="cpu", seed=1,
                             collate_fn=_keys)
        got = [list(batch) for batch in loader]
        if workers == 0:
            assert stream.dataset.shards.cache.downloads == SHARDS  # type: ignore[union-attr]
        return got

    alone = batches(0)
    assert sorted(k for b in alone for k in b) == sorted(_keys([(i, 0) for i, _ in (ShardDataset(pack16)[j] for j in range(SHARDS * 32))]))  # type: ignore[misc]
    assert batches(2) == alone
    assert batches(2, "thread") == alone


def test_a_limit_below_what_the_machines_plan_needs_is_said_once_with_the_smallest_that_is_not(
    pack16: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two ranks on this machine: the warning comes exactly when the plan needs more shards at once than the limit holds."""
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(cache_readers, "ARRIVAL_S", 0.0)  # rank 1 does not come: rank 0 reads on at once
    url = upload_folder(pack16, "memory://stoker-share-test/room")
    cost = entry_cost(max(i.bytes for i in ShardDataset(pack16).manifest.shards))
    said = {}
    for room in (2, 3, 4, 5):
        caplog.clear()
        stream = ShardStream(url, cache_dir=tmp_path / f"c{room}", cache_limit=room * cost + 8192, shuffle_buffer=16,
                             read_rows=16, rank=0, world_size=2)
        with caplog.at_level("WARNING", logger="stoker"):
            assert len(_keys(list(stream))) == len(stream)
        told = [r.getMessage() for r in caplog.records if "the readers of this machine need" in r.getMessage()]
        plan, _, _ = stream.machine_plan(0, 2, 0, 1)
        holds = shard_room(stream.dataset.shards)
        assert len(told) == (plan.smallest_room() > holds)
        if told:
            smallest = int(re.search(r"is ([0-9,]+) bytes", told[0]).group(1).replace(",", ""))  # type: ignore[union-attr]
            assert smallest >= plan.smallest_room() * cost
        said[room] = bool(told)
    assert any(said.values()) and not all(said.values()), said  # the plan (shards at once, buffer) follows the limit
