"""An S3 API server on 127.0.0.1 (moto's), buckets on it, and small data sets to put there.

The server is a child process on a free port, started once per session and stopped
after; the tests reach it through ``AWS_ENDPOINT_URL`` (botocore's own setting, which
s3fs follows), so no test passes an endpoint of its own and nothing leaves the machine.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest
from PIL import Image

_START_TIMEOUT_S = 60.0
_TEST_TIMEOUT_S = 300  # a hung download, lock or Ray task fails the test instead of the run
_counter = itertools.count()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the moto server exited at start (status {proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the moto server did not listen on 127.0.0.1:{port} within {_START_TIMEOUT_S:.0f} s")


@pytest.fixture(autouse=True)
def _fail_instead_of_hanging() -> Iterator[None]:
    """Every remote test fails with TimeoutError after ``_TEST_TIMEOUT_S`` seconds (SIGALRM)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"the test ran over {_TEST_TIMEOUT_S} s: something hangs")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(_TEST_TIMEOUT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The endpoint URL of a fresh S3 API server; the environment points fsspec/s3fs at it."""
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs: pip install 'stoker[test]'")
    pytest.importorskip("moto.server", reason="the S3 tests need moto's server: pip install 'stoker[test]'")
    port = _free_port()
    folder = tmp_path_factory.mktemp("moto")
    log = open(folder / "server.log", "wb")
    recording = {"MOTO_RECORDER_FILEPATH": str(folder / "recording.jsonl")}  # where moto's recorder API writes
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **recording},
    )
    endpoint = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in _ENV}
    try:
        _wait_for(port, proc)
        os.environ.update({**_ENV, "AWS_ENDPOINT_URL": endpoint})
        yield endpoint
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


_ENV = {
    "AWS_ENDPOINT_URL": "",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class ServerRecord:
    """The requests moto's server answered, from its own recorder API (``/moto-api/recorder/``), not its log's format.

    A test counts requests through this record: the server writes it as JSON lines whatever
    the status of the answer, and whatever its log prints.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def _call(self, action: str) -> str:
        url = f"{self.endpoint}/moto-api/recorder/{action}"
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30) as answer:
            return str(answer.read().decode())

    def start(self) -> None:
        """Forget what was recorded, and record every request from now on."""
        self._call("reset-recording")
        self._call("start-recording")

    def stop(self) -> None:
        self._call("stop-recording")

    def requests(self) -> list[dict[str, Any]]:
        """Every request recorded since :meth:`start`: ``method``, ``url``, ``headers`` (and the body moto keeps)."""
        return [json.loads(line) for line in self._call("download-recording").splitlines() if line.strip()]

    def count(self, method: str, path: re.Pattern[str]) -> int:
        """Requests of ``method`` whose URL path matches ``path`` (from its start)."""
        return sum(1 for r in self.requests() if r["method"] == method and path.match(urlparse(r["url"]).path))


@pytest.fixture
def server_record(s3_server: str) -> Iterator[ServerRecord]:
    """moto's record of the requests it answers during the test (started empty, stopped after)."""
    record = ServerRecord(s3_server)
    record.start()
    try:
        yield record
    finally:
        record.stop()


@pytest.fixture
def bucket(s3_server: str) -> str:
    """``s3://<a new empty bucket>``."""
    import s3fs

    name = f"stoker-test-{os.getpid()}-{next(_counter)}"
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(name)
    return f"s3://{name}"


def write_class_folders(root: Path, n: int, classes: int = 4, size: tuple[int, int] = (12, 10)) -> Path:
    """``root/<class>/<i>.png``: random RGB PNGs, labels round robin."""
    for i in range(n):
        folder = root / str(i % classes)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 255, size=(*size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:04d}.png")
    return root


def pack_random(root: Path, shards: int, per_shard: int) -> Path:
    """``shards`` pixel shards of ``per_shard`` random 16x16 images in 4 classes, packed at ``root/packed``."""
    from stoker import pack

    data = write_class_folders(root / "data", shards * per_shard, classes=4, size=(16, 16))
    pack(data, root / "packed", store="pixels", shard_samples=per_shard, workers=0, progress=False)
    return root / "packed"


def upload_folder(local: Path, url: str) -> str:
    """Copy every file of ``local`` (recursively) to ``url``; returns ``url``."""
    from stoker.fs import RemoteLocation

    place = RemoteLocation(url)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            place.upload(path, path.relative_to(local).as_posix())
    place.invalidate()
    return url


@pytest.fixture(scope="session")
def small_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 PNGs in 4 class folders."""
    return write_class_folders(tmp_path_factory.mktemp("small") / "data", 40, classes=4)


@pytest.fixture(scope="session")
def small_pack(tmp_path_factory: pytest.TempPathFactory, small_folders: Path) -> Path:
    """``small_folders`` packed locally, pixels 12x10, 8 samples per shard (5 shards)."""
    from stoker import pack

    out = tmp_path_factory.mktemp("small-pack") / "packed"
    pack(small_folders, out, store="pixels", shard_samples=8, workers=0, progress=False)
    return out
