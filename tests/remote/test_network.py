"""Network failures are one line naming the URL and the cause; a stalled server times out; retries are bounded."""

from __future__ import annotations

import http.server
import io
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from click.testing import CliRunner
from fsspec.implementations.memory import MemoryFileSystem

from stoker.cli.main import main as cli
from stoker.errors import ConfigError, NetworkError
from stoker.fs import RemoteLocation
from stoker.fs.network import NetSettings, with_network_defaults

from .conftest import _free_port

_BODY = b"x" * 4096


class _Handler(http.server.BaseHTTPRequestHandler):
    """``/ok``: the body; ``/stall``: headers, then nothing; ``/stall-body``: half the body, then nothing; counts GETs."""

    gets: dict[str, int] = {}
    release = threading.Event()

    def do_HEAD(self) -> None:  # noqa: N802  (http.server's name)
        self.gets[f"HEAD {self.path}"] = self.gets.get(f"HEAD {self.path}", 0) + 1
        self._answer(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self.gets[self.path] = self.gets.get(self.path, 0) + 1
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        if self.path.startswith("/stall") and self.path != "/stall-body":  # /stall, and an S3 GET of s3://stall/...
            self.release.wait(30)  # says nothing at all, until the test ends
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(_BODY)))
        self.send_header("Accept-Ranges", "none")
        self.end_headers()
        if head:
            return
        if self.path == "/stall-body":
            self.wfile.write(_BODY[:1000])
            self.wfile.flush()
            self.release.wait(30)
            return
        self.wfile.write(_BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a small server in a thread (see :class:`_Handler`)."""
    _Handler.gets = {}
    _Handler.release = threading.Event()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Handler.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_NET_TIMEOUT", "0.5")
    monkeypatch.setenv("STOKER_NET_RETRIES", "1")


def test_a_stalled_server_is_a_network_error_within_the_timeout(http_server: str, short_timeout: None) -> None:
    assert RemoteLocation(f"{http_server}/ok").read_bytes() == _BODY
    start = time.monotonic()
    with pytest.raises(NetworkError, match=r"/stall: no answer for 0.5 s .*STOKER_NET_TIMEOUT.*\(tried 2 times\)") as info:
        RemoteLocation(f"{http_server}/stall").read_bytes()
    assert time.monotonic() - start < 10  # 2 tries of 0.5 s and a 0.5 s pause, with room for a loaded machine
    assert "\n" not in str(info.value)
    assert _Handler.gets["/stall"] == 2  # bounded: the first try and one retry


def test_a_stall_in_the_middle_of_a_download_is_a_network_error(http_server: str, short_timeout: None) -> None:
    start = time.monotonic()
    with pytest.raises(NetworkError, match=r"/stall-body: no answer for 0.5 s"):
        with RemoteLocation(f"{http_server}/stall-body").open() as f:
            while f.read(512):
                pass
    assert time.monotonic() - start < 10


def test_unknown_host_and_refused_port_are_one_line_and_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_NET_RETRIES", "3")
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(NetworkError, match=rf"http://127.0.0.1:{port}/x: connection refused") as refused:
        RemoteLocation(f"http://127.0.0.1:{port}/x").read_bytes()
    with pytest.raises(NetworkError, match=rf"ftp://127.0.0.1:{port}/x: connection refused"):
        RemoteLocation(f"ftp://127.0.0.1:{port}/x").read_bytes()
    assert time.monotonic() - start < 5  # nothing answers there a second later: no pauses, no retries
    try:
        socket.getaddrinfo("stoker-test.invalid", 443)
    except socket.gaierror:
        with pytest.raises(NetworkError, match=r"https://stoker-test.invalid/x: unknown host"):
            RemoteLocation("https://stoker-test.invalid/x").exists()
    assert "\n" not in str(refused.value) and "not found" not in str(refused.value)


@pytest.mark.parametrize("command", ["verify", "inspect"])
def test_the_cli_says_one_line_for_an_unreachable_store(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    url = f"http://127.0.0.1:{_free_port()}/packed"
    result = CliRunner().invoke(cli, [command, url])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {url}") and "connection refused" in lines[0] and "not found" not in lines[0]


def test_an_exists_on_an_unreachable_store_is_not_a_no() -> None:
    place = RemoteLocation(f"http://127.0.0.1:{_free_port()}/data")
    for ask in (place.exists, place.is_file, place.is_dir, place.size):
        with pytest.raises(NetworkError):
            ask()


def test_the_defaults_fill_in_and_the_users_options_win() -> None:
    net = NetSettings(timeout_s=7, retries=2)
    s3 = with_network_defaults("s3://b/k", {"config_kwargs": {"read_timeout": 99}, "anon": True}, net)
    assert s3["anon"] is True
    assert s3["config_kwargs"]["read_timeout"] == 99 and s3["config_kwargs"]["connect_timeout"] == 7
    https = with_network_defaults("https://h/x", {}, net)["client_kwargs"]["timeout"]
    assert (https.sock_connect, https.sock_read, https.total) == (7, 7, None)
    assert with_network_defaults("ftp://h/x", {"timeout": 3}, net) == {"timeout": 3}
    chained = with_network_defaults("simplecache::s3://b/k", {"s3": {"anon": True}}, net)
    assert chained["s3"]["anon"] is True and chained["s3"]["config_kwargs"]["connect_timeout"] == 7
    assert with_network_defaults("memory://x", {"a": 1}, net) == {"a": 1}


def test_bad_settings_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_NET_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="STOKER_NET_TIMEOUT='soon'"):
        NetSettings.from_env()
    monkeypatch.setenv("STOKER_NET_TIMEOUT", "5")
    monkeypatch.setenv("STOKER_NET_RETRIES", "-1")
    with pytest.raises(ConfigError, match="STOKER_NET_RETRIES='-1'"):
        NetSettings.from_env()


class _SlowMemory(MemoryFileSystem):
    """A filesystem without timeout settings of its own (stoker runs its calls against a deadline)."""

    protocol = "stokerslow"

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: object) -> bytes:
        if path.endswith("sleepy"):
            time.sleep(3)
        return bytes(super().cat_file(path, start, end, **kwargs))


class _FlakyFile(io.BytesIO):
    drops = 0

    def read(self, size: int | None = -1) -> bytes:
        if self.tell() >= 1000 and _FlakyFile.drops == 0:
            _FlakyFile.drops += 1
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().read(size)


class _FlakyMemory(MemoryFileSystem):
    """Memory whose first open file drops its connection after 1,000 bytes."""

    protocol = "stokerflaky"

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb":
            return super()._open(path, mode, **kwargs)
        return _FlakyFile(bytes(super().cat_file(path)))


def test_a_filesystem_without_timeouts_is_given_a_deadline(short_timeout: None) -> None:
    fsspec.register_implementation("stokerslow", _SlowMemory, clobber=True)
    place = RemoteLocation("stokerslow://net-test")
    place.write_bytes("fast", b"abc")
    place.write_bytes("sleepy", b"abc")
    assert place.read_bytes("fast") == b"abc"
    start = time.monotonic()
    with pytest.raises(NetworkError, match=r"stokerslow://net-test/sleepy: no answer for 0.5 s"):
        place.read_bytes("sleepy")
    assert time.monotonic() - start < 2.5  # 2 tries of 0.5 s and a pause of 0.5 s, not the 3 s the store takes


def test_a_dropped_connection_resumes_where_the_read_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_NET_RETRIES", "1")
    fsspec.register_implementation("stokerflaky", _FlakyMemory, clobber=True)
    _FlakyFile.drops = 0
    place = RemoteLocation("stokerflaky://net-test")
    data = bytes(range(256)) * 20
    place.write_bytes("object", data)
    got = bytearray()
    with place.open("object") as f:
        while chunk := f.read(300):
            got += chunk
    assert bytes(got) == data and _FlakyFile.drops == 1


def test_a_stalled_s3_endpoint_is_a_network_error_within_the_timeout(
    http_server: str, short_timeout: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3fs = pytest.importorskip("s3fs")
    for key, value in {"AWS_ENDPOINT_URL": http_server, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        start = time.monotonic()
        with pytest.raises(NetworkError, match=r"s3://stall/key: no answer for 0.5 s") as info:
            RemoteLocation("s3://stall/key").read_bytes()
        assert time.monotonic() - start < 10 and "\n" not in str(info.value)
        asked = sum(n for path, n in _Handler.gets.items() if path.endswith("/stall/key"))
        assert asked == 2  # bounded: the first try and one retry, botocore's and s3fs's own retries off
    finally:
        s3fs.S3FileSystem.clear_instance_cache()


def test_a_refused_request_is_one_line_and_not_retried(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_NET_RETRIES", "3")
    start = time.monotonic()
    with pytest.raises(NetworkError, match=r"s3://Not_A_Bucket/x: the store refused.*(not valid|does not exist)") as info:
        RemoteLocation("s3://Not_A_Bucket").write_bytes("x", b"abc")
    assert time.monotonic() - start < 3 and "tried" not in str(info.value)  # an invalid request: asked once


def test_a_locations_filesystem_gets_the_timeouts_and_the_users_options(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("s3fs")
    monkeypatch.setenv("STOKER_NET_TIMEOUT", "11")
    mine = RemoteLocation("s3://some-bucket/x", {"config_kwargs": {"read_timeout": 7}, "anon": True})
    assert mine.fs.config_kwargs["read_timeout"] == 7 and mine.fs.config_kwargs["connect_timeout"] == 11
    assert mine.storage_options == {"config_kwargs": {"read_timeout": 7}, "anon": True}  # what travels: the user's own
    assert mine.fs.retries == 1  # stoker retries; s3fs's own retries would multiply the attempts
