"""stoker.fs: a URL stays a URL (never a local folder named ``s3:``), a local path stays local."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import ConfigError, MissingFileError
from stoker.fs import Location, is_url, join, local_path, where


def test_plain_paths_and_file_urls_are_local() -> None:
    assert where("data/x") == Path("data/x")
    assert where("file:///tmp/x") == Path("/tmp/x")
    assert local_path("s3://bucket/x") is None
    assert is_url("s3://b/x") and is_url("simplecache::s3://b/x") and not is_url("data/s3:x")


def test_urls_keep_their_slashes() -> None:
    assert join("s3://bucket/packed", "manifest.json") == "s3://bucket/packed/manifest.json"
    assert join("s3://bucket/packed/", "a", "b") == "s3://bucket/packed/a/b"
    place = where("memory://bucket/packed/")
    assert isinstance(place, Location)
    assert place.url == "memory://bucket/packed" and place.name == "packed"


def test_memory_round_trip_and_listing() -> None:
    place = Location("memory://stoker-fs-test/folder")
    place.write_bytes("a.txt", b"hello")
    place.write_bytes("sub/b.png", b"x")
    assert place.read_bytes("a.txt") == b"hello"
    assert place.sizes() == {"a.txt": 5}
    assert place.list_dirs() == ["sub"]
    assert place.walk_files() == ["a.txt", "sub/b.png"]
    with pytest.raises(MissingFileError, match="memory://stoker-fs-test/folder/nope"):
        place.read_bytes("nope")
    with pytest.raises(ConfigError, match="larger than 2 bytes"):
        place.read_bytes("a.txt", max_bytes=2)


def test_a_location_pickles_without_its_filesystem() -> None:
    place = Location("memory://stoker-fs-test/p", {"skip_instance_cache": False})
    state = place.__getstate__()
    assert state == {"url": "memory://stoker-fs-test/p", "storage_options": {"skip_instance_cache": False}}
    copy = Location.__new__(Location)
    copy.__setstate__(state)
    assert copy == place and copy.path == place.path


def test_a_missing_filesystem_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_gcsfs(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("gcsfs"):
            raise ImportError("No module named 'gcsfs'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gcsfs)
    with pytest.raises(ConfigError, match=r"pip install 'stoker\[gcs\]'"):
        Location("gs://bucket/packed")


def test_an_unknown_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="protocol"):
        Location("nosuchproto://bucket/x")
