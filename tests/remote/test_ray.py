"""Packing on a local Ray cluster gives the bytes of a local pack, fails in one line leaving nothing half-written,
and says how to install Ray without it."""

from __future__ import annotations

import builtins
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import stoker
from stoker import pack
from stoker.cli.main import main as cli
from stoker.errors import ConfigError, DataError, ShardError, StokerError
from stoker.fs import RemoteLocation

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


def _broken_copy(small_folders: Path, root: Path) -> tuple[Path, Path]:
    """A copy of ``small_folders`` where one image (not the first, which sets the size) no longer decodes."""
    copy = root / "data"
    shutil.copytree(small_folders, copy)
    broken = sorted(copy.rglob("*.png"))[-1]
    broken.write_bytes(b"\x89PNG\r\n\x1a\n this file was damaged after it was listed")
    return copy, broken


def test_a_failing_ray_task_is_one_line_and_leaves_no_tmp(
    ray_cluster: Any, s3_server: str, bucket: str, small_folders: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, broken = _broken_copy(small_folders, tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["pack", str(data), str(out), "--engine", "ray", "--store", "pixels", "--shard-samples", "8", "--quiet"]
    )
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and broken.name in lines[0], result.output
    assert "ray::" not in result.output and "Traceback" not in result.output
    assert not list(out.rglob("*.tmp"))

    url = f"{bucket}/ray-broken"
    with pytest.raises(StokerError, match=broken.name) as caught:
        pack(data, url, engine="ray", cache_dir=tmp_path / "cache", **_ARGS)
    assert "ray::" not in str(caught.value)
    place = RemoteLocation(url)
    place.invalidate()
    assert not [n for n in place.sizes() if n.endswith(".tmp") or n == "manifest.json"]
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_a_ray_task_error_is_unwrapped_to_its_cause() -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'stoker[ray]' to run the Ray tests")
    from stoker.shards.pack.ray_engine import task_failure

    ours = DataError("data/3/0007.png: not a PNG image")
    wrapped = ray.exceptions.RayTaskError("_write_in_task", "Traceback (most recent call last):\n  ...", ours)
    assert task_failure(wrapped.as_instanceof_cause(), "out/train-00001.arrow") is ours
    other = ray.exceptions.RayTaskError("_write_in_task", "Traceback ...", MemoryError("no room"))
    error = task_failure(other, "s3://b/out/train-00002.arrow")
    assert isinstance(error, ShardError) and "\n" not in str(error)
    assert str(error).startswith("s3://b/out/train-00002.arrow: writing this shard on Ray failed: MemoryError: no room")
