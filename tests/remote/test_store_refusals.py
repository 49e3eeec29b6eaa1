"""A store that answers 401, 403, 404 or 503 is an error, never "offline"; only a store nothing answers for is.

The store is ``http.server`` in a thread on 127.0.0.1 serving a real packed folder, then
answering one status to every request, then stopped (connection refused).
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from stoker.cli.main import main as cli
from stoker.errors import ConfigError, NetworkError, ShardError
from stoker.shards import ShardDataset, verify

pytest.importorskip("aiohttp", reason="http:// needs aiohttp: pip install 'stoker[remote]'")


class _Answering(http.server.SimpleHTTPRequestHandler):
    """Serves the folder while ``status`` is 0; otherwise answers ``status`` to everything."""

    status = 0

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        if self.status:
            self.send_error(self.status)
            return
        super().do_GET()

    def do_HEAD(self) -> None:  # noqa: N802
        if self.status:
            self.send_error(self.status)
            return
        super().do_HEAD()

    def log_message(self, *args: object) -> None:
        pass


class _Store:
    def __init__(self, folder: Path) -> None:
        _Answering.status = 0
        handler = functools.partial(_Answering, directory=str(folder.parent))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{folder.name}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.running = True

    def stop(self) -> None:
        if self.running:
            self.server.shutdown()
            self.server.server_close()
            self.running = False


@pytest.fixture
def store(small_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Store]:
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("STOKER_NET_RETRIES", "0")  # a 503 is retried otherwise: no pauses in the test
    served = _Store(small_pack)
    try:
        yield served
    finally:
        served.stop()


def _read_all(url: str) -> list[int]:
    data = ShardDataset(url)
    return data.__getitems__(list(range(len(data)))).labels.tolist()


def _verify_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["verify", *args, "--quiet", "--workers", "0"])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


@pytest.mark.parametrize(("status", "error", "words"), [
    (401, ConfigError, "access denied"),
    (403, ConfigError, "access denied"),
    (404, ShardError, "not found"),
    (503, NetworkError, "HTTP 503"),
])
def test_a_store_that_answers_an_error_is_not_offline(
    store: _Store, status: int, error: type[Exception], words: str, small_pack: Path
) -> None:
    # Before: 403 and 503 read the cached copies, and `verify URL` exited 0 "(offline: ...)".
    first = _read_all(store.url)  # every shard is in the cache now
    assert first == _read_all(str(small_pack))
    _Answering.status = status
    with pytest.raises(error, match=words):
        ShardDataset(store.url)
    code, output = _verify_cli(store.url)
    assert code != 0 and "offline" not in output, output
    assert words in output


def test_only_an_unreachable_store_is_offline_and_verify_says_it_checked_only_the_cache(store: _Store) -> None:
    first = _read_all(store.url)
    store.stop()  # connection refused: nothing answers
    assert _read_all(store.url) == first  # from the cache
    report = verify(store.url, workers=0)
    assert report.ok and report.offline
    code, output = _verify_cli(store.url)
    assert code == 1 and "only the cached copies were checked" in output and "--accept-cache" in output
    code, output = _verify_cli(store.url, "--accept-cache")
    assert code == 0, output
