"""A shard set served over plain HTTP by a server that lies: a Content-Length of 10 TB never reaches the disk.

The server is ``http.server`` in a thread on 127.0.0.1, serving a real packed folder;
for one shard it claims 10 TB (on HEAD and GET) and would then send the real bytes.
The cache must refuse that shard before its first byte is written, leave nothing in
its folder, and still serve the honest shards.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from stoker.errors import ShardError
from stoker.fs import where
from stoker.shards import ShardDataset
from stoker.shards.cache.store import ShardCache

pytest.importorskip("aiohttp", reason="http:// needs aiohttp: pip install 'stoker[remote]'")

TB10 = 10 * 2**40


class _Lying(http.server.SimpleHTTPRequestHandler):
    """Serves the folder; the shard named in ``liar`` claims ``TB10`` bytes."""

    liar = ""
    asked: list[str] = []

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() == "content-length" and self.path.endswith("/" + self.liar):
            value = str(TB10)
        super().send_header(keyword, value)

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        type(self).asked.append(self.path)
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def lying_server(small_pack: Path) -> Iterator[str]:
    handler = functools.partial(_Lying, directory=str(small_pack.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{small_pack.name}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_10_tb_content_length_is_refused_before_the_first_byte(
    lying_server: str, small_pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOKER_NET_RETRIES", "0")
    manifest = ShardDataset(small_pack).manifest
    honest, liar = manifest.shards[0], manifest.shards[1]
    _Lying.liar, _Lying.asked = liar.name, []
    cache_dir = tmp_path / "cache"
    # Opening the set compares the store's sizes with the manifest: the lie is named there, before any read.
    with pytest.raises(ShardError, match=rf"{liar.name}: {TB10} bytes in {lying_server}, the manifest says {liar.bytes}"):
        ShardDataset(lying_server, cache_dir=cache_dir)
    assert not any(path.endswith(liar.name) for path in _Lying.asked)
    # The cache's own download checks the claim too (a size that changed after the set was opened).
    cache = ShardCache(cache_dir)
    assert cache.fetch(where(lying_server), honest).read_bytes() == (small_pack / honest.name).read_bytes()
    with pytest.raises(ShardError, match=rf"{liar.name}.*claims {TB10:,} bytes"):
        cache.fetch(where(lying_server), liar)
    assert not cache.has(liar)
    written = [p for p in cache_dir.rglob("*") if p.is_file() and liar.sha256 in p.name and p.stat().st_size > 0]
    assert written == []  # not a byte of the lie on disk
