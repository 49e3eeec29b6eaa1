"""The lock object of a bucket prefix: refused while held, renewed, taken over only when stale, never lost silently.

Run on moto's S3 server (conditional PUTs) and on fsspec's memory filesystem (no
conditional writes: write, read back, compare).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from stoker.errors import ConfigError, ShardError
from stoker.fs import RemoteLocation
from stoker.shards.pack.bucket_lock import BucketLock
from stoker.shards.pack.replace import LOCK_NAME

_count = itertools.count()


@pytest.fixture(params=["s3", "memory"])
def prefix(request: pytest.FixtureRequest) -> Iterator[RemoteLocation]:
    """An empty prefix on S3 (moto) or in fsspec's memory filesystem."""
    if request.param == "s3":
        url = f"{request.getfixturevalue('bucket')}/locked"
    else:
        url = f"memory://stoker-lock-test-{os.getpid()}-{next(_count)}"
    place = RemoteLocation(url)
    yield place
    place.remove(LOCK_NAME)


def _plant(place: RemoteLocation, host: str, pid: int, renewed: float, lease_s: float = 120.0) -> None:
    body = {"lock": "stoker-pack", "host": host, "pid": pid, "token": "someone-else", "renewed": renewed, "lease_s": lease_s}
    place.write_bytes(LOCK_NAME, json.dumps(body).encode())


def _holder(place: RemoteLocation) -> dict[str, object]:
    place.invalidate()
    return json.loads(place.read_bytes(LOCK_NAME))  # type: ignore[no-any-return]


def test_a_held_lock_refuses_a_second_holder_and_is_removed_after(prefix: RemoteLocation) -> None:
    with BucketLock(prefix) as first:
        assert _holder(prefix)["token"] == first.token
        with pytest.raises(ConfigError, match=r"another `stoker pack` \(host .* pid \d+\) is writing into this prefix.*wait for it"):
            BucketLock(prefix).acquire()
        first.confirm()
    assert not prefix.exists(LOCK_NAME)
    with BucketLock(prefix):  # free again
        pass


def test_the_lease_is_renewed_while_held(prefix: RemoteLocation) -> None:
    with BucketLock(prefix, lease_s=1.0) as lock:
        first = float(_holder(prefix)["renewed"])  # type: ignore[arg-type]
        deadline = time.monotonic() + 30
        while float(_holder(prefix)["renewed"]) < first + 1.0:  # type: ignore[arg-type]
            assert time.monotonic() < deadline, "the lease was not renewed"
            time.sleep(0.1)
        with pytest.raises(ConfigError, match="another `stoker pack`"):  # held past its first lease
            BucketLock(prefix).acquire()
        lock.confirm()


def test_an_expired_lease_is_taken_over_with_a_note(prefix: RemoteLocation, caplog: pytest.LogCaptureFixture) -> None:
    _plant(prefix, "another-host", 4242, renewed=time.time() - 600)
    with caplog.at_level(logging.WARNING, logger="stoker"), BucketLock(prefix) as lock:
        assert _holder(prefix)["token"] == lock.token
    assert "took over the pack lock of host another-host pid 4242 (its lease ran out" in caplog.text


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over(prefix: RemoteLocation, caplog: pytest.LogCaptureFixture) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    _plant(prefix, socket.gethostname(), gone.pid, renewed=time.time())
    with caplog.at_level(logging.WARNING, logger="stoker"), BucketLock(prefix):
        pass
    assert f"pid {gone.pid} no longer runs on this host" in caplog.text


def test_a_live_lock_elsewhere_is_not_taken_over(prefix: RemoteLocation) -> None:
    _plant(prefix, "another-host", 4242, renewed=time.time())
    with pytest.raises(ConfigError, match="host another-host pid 4242"):
        BucketLock(prefix).acquire()
    assert _holder(prefix)["token"] == "someone-else"


def test_a_lock_taken_over_stops_the_pack_before_its_manifest(prefix: RemoteLocation) -> None:
    lock = BucketLock(prefix)
    lock.acquire()
    try:
        _plant(prefix, "another-host", 4242, renewed=time.time())  # its lease ran out meanwhile, say: another took it
        with pytest.raises(ShardError, match="lost its lock .*taken over by host another-host pid 4242.*before writing the manifest"):
            lock.confirm()
    finally:
        lock.release()
    assert _holder(prefix)["token"] == "someone-else"  # the other's lock is not removed


def test_an_object_that_is_not_a_lock_is_named(prefix: RemoteLocation) -> None:
    prefix.write_bytes(LOCK_NAME, b"\xff not json")
    with pytest.raises(ConfigError, match=r"is not a stoker pack lock.*delete that object"):
        BucketLock(prefix).acquire()


def test_of_two_packs_starting_at_once_on_s3_exactly_one_gets_the_lock(s3_server: str, bucket: str) -> None:
    place = RemoteLocation(f"{bucket}/race")
    for _ in range(8):
        barrier = threading.Barrier(2)
        outcomes: list[object] = []

        def take(lock: BucketLock, barrier: threading.Barrier = barrier, outcomes: list[object] = outcomes) -> None:
            barrier.wait(30)
            try:
                lock.acquire()
                outcomes.append(lock)
            except ConfigError as exc:
                outcomes.append(exc)

        locks = [BucketLock(place), BucketLock(place)]
        threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        winners = [o for o in outcomes if isinstance(o, BucketLock)]
        assert len(outcomes) == 2 and len(winners) == 1, outcomes
        assert _holder(place)["token"] == winners[0].token
        winners[0].release()
