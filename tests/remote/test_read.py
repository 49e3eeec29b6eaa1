"""Shard sets in a bucket read like local ones: exactly once per epoch, with 0 and 2 workers."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from stoker.errors import ShardError
from stoker.loading import make_loader
from stoker.shards import ShardDataset, ShardStream

from .conftest import upload_folder


def _digests(images: torch.Tensor) -> list[str]:
    return [hashlib.sha256(image.numpy().tobytes()).hexdigest() for image in images]


def _local_digests(local: Path) -> list[str]:
    ds = ShardDataset(local)
    return sorted(_digests(ds.__getitems__(list(range(len(ds)))).images))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["map", "stream"])
def test_a_bucket_epoch_is_every_sample_once(
    s3_server: str, bucket: str, small_pack: Path, tmp_path: Path, workers: int, kind: str
) -> None:
    url = upload_folder(small_pack, f"{bucket}/packed")
    options = {"cache_dir": tmp_path / "cache"}
    ds = ShardDataset(url, **options) if kind == "map" else ShardStream(url, shuffle_buffer=6, read_rows=5, **options)
    loader = make_loader(ds, batch_size=7, num_workers=workers, device="cpu", persistent_workers=False)
    expected = _local_digests(small_pack)
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = [d for images, _ in loader for d in _digests(images)]
        assert sorted(seen) == expected
    # every shard is in the cache once, whichever process fetched it
    assert len(list((tmp_path / "cache" / "sha256").glob("*/*.arrow"))) == len(ShardDataset(small_pack).manifest.shards)


def test_a_url_that_is_not_a_shard_set(s3_server: str, bucket: str, tmp_path: Path) -> None:
    with pytest.raises(ShardError, match=f"{bucket}/nothing: not found"):
        ShardDataset(f"{bucket}/nothing", cache_dir=tmp_path)


def test_a_deleted_shard_is_found_on_opening(s3_server: str, bucket: str, small_pack: Path, tmp_path: Path) -> None:
    from stoker.fs import RemoteLocation

    url = upload_folder(small_pack, f"{bucket}/packed")
    RemoteLocation(url).remove("train-00003.arrow")
    with pytest.raises(ShardError, match="train-00003.arrow.*is missing"):
        ShardDataset(url, cache_dir=tmp_path)


def test_a_shard_set_on_an_http_server(small_pack: Path, tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys
    import time

    pytest.importorskip("aiohttp", reason="http:// needs aiohttp: pip install 'stoker[remote]'")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(small_pack.parent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP server did not start"
                time.sleep(0.1)
        ds = ShardDataset(f"http://127.0.0.1:{port}/{small_pack.name}", cache_dir=tmp_path / "cache")
        every = list(range(len(ds)))
        assert sorted(_digests(ds.__getitems__(every).images)) == _local_digests(small_pack)
    finally:
        server.terminate()
        server.wait(timeout=10)
