"""Packing on a local Ray cluster gives the bytes of a local pack (and says how to install Ray without it)."""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stoker
from stoker import pack
from stoker.errors import ConfigError

_ARGS: dict[str, Any] = {"store": "pixels", "shard_samples": 8, "progress": False}


@pytest.fixture(scope="module")
def ray_cluster(s3_server: str) -> Iterator[Any]:
    """A local Ray cluster of 2 CPUs whose workers import this stoker and reach the test S3 server."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'stoker[ray]' to run the Ray tests")
    src = str(Path(stoker.__file__).resolve().parents[1])  # the workers import this stoker, not another install
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    env["PYTHONPATH"] = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def test_a_ray_pack_is_byte_identical_to_a_local_pack(
    ray_cluster: Any, small_folders: Path, small_pack: Path, tmp_path: Path
) -> None:
    manifest = pack(small_folders, tmp_path / "ray", engine="ray", **_ARGS)
    assert len(manifest.shards) == 5
    assert _files(tmp_path / "ray") == _files(small_pack)


def test_a_ray_pack_to_a_bucket(ray_cluster: Any, s3_server: str, bucket: str, small_folders: Path, small_pack: Path, tmp_path: Path) -> None:
    from stoker.fs import RemoteLocation

    url = f"{bucket}/ray"
    pack(small_folders, url, engine="ray", cache_dir=tmp_path / "cache", **_ARGS)
    place = RemoteLocation(url)
    assert {name: place.read_bytes(name) for name in place.sizes()} == _files(small_pack)


def test_without_ray_the_engine_says_how_to_install(
    small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_ray(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ConfigError, match=r"pip install 'stoker\[ray\]'"):
        pack(small_folders, tmp_path / "out", engine="ray", **_ARGS)
    assert not (tmp_path / "out").exists()  # nothing written
