"""stoker.fs: one Location interface over a local folder and a URL (a URL stays a URL, a local path stays local)."""

from __future__ import annotations

import builtins
import itertools
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import ConfigError, DataError, LabelError, MissingFileError
from stoker.fs import LocalLocation, Location, RemoteLocation, is_url, join, local_path, read_text, where

_memory = itertools.count()


def test_plain_paths_and_file_urls_are_local() -> None:
    assert where("data/x") == LocalLocation("data/x") and where("data/x").local_path == Path("data/x")
    assert where("file:///tmp/x").local_path == Path("/tmp/x") and str(where("file:///tmp/x")) == "/tmp/x"
    assert where(Path("data/x")).is_local and os.fspath(where("data/x")) == "data/x"
    assert local_path("s3://bucket/x") is None
    assert is_url("s3://b/x") and is_url("simplecache::s3://b/x") and not is_url("data/s3:x")
    assert is_url(where("memory://b/x")) and not is_url(where("file:///tmp/x"))


def test_urls_keep_their_slashes() -> None:
    assert join("s3://bucket/packed", "manifest.json") == "s3://bucket/packed/manifest.json"
    assert join("s3://bucket/packed/", "a", "b") == "s3://bucket/packed/a/b"
    place = where("memory://bucket/packed/")
    assert isinstance(place, RemoteLocation) and not place.is_local and place.local_path is None
    assert place.url == "memory://bucket/packed" and place.name == "packed"
    assert (place / "manifest.json").url == "memory://bucket/packed/manifest.json"
    assert place.parent.url == "memory://bucket" and where(place) is place


def _fill(place: Location) -> Location:
    """The same small tree in any location: a.txt, b.png, sub/c.png, sub/deep/d.png."""
    place.write_bytes("a.txt", b"hello")
    place.write_bytes("b.png", b"bb")
    place.write_bytes("sub/c.png", b"ccc")
    place.write_bytes("sub/deep/d.png", b"dddd")
    place.invalidate()
    return place


@pytest.fixture(params=["local", "memory"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """The small tree in a local folder and at a ``memory://`` URL."""
    url = str(tmp_path / "tree") if request.param == "local" else f"memory://stoker-fs-test-{os.getpid()}-{next(_memory)}/tree"
    return _fill(where(url))


def test_the_interface_answers_the_same_for_a_folder_and_a_url(tree: Location) -> None:
    # naming
    assert tree.name == "tree" and (tree / "a.txt").suffix == ".txt" and tree.child("sub", "c.png").name == "c.png"
    assert tree.url_of("a.txt") == join(tree.url, "a.txt") and str(tree.child("sub").parent) == str(tree)
    assert tree.contains(tree / "sub" / "c.png") and not (tree / "sub").contains(tree)
    # questions
    assert tree.exists() and tree.is_dir() and not tree.is_file() and tree.is_dir("sub")
    assert tree.is_file("a.txt") and (tree / "a.txt").is_file() and not tree.exists("nope")
    assert tree.size("sub/c.png") == 3 and tree.size("nope") is None
    # reading
    assert tree.read_bytes("a.txt") == b"hello" and (tree / "a.txt").read_text() == "hello"
    with tree.open("sub/deep/d.png") as f:
        assert f.read() == b"dddd"
    with pytest.raises(MissingFileError, match="nope"):
        tree.read_bytes("nope")
    with pytest.raises(MissingFileError, match="nope"):
        tree.open("nope")
    with pytest.raises(DataError, match="larger than 2 bytes"):
        tree.read_bytes("a.txt", max_bytes=2)
    assert read_text(tree.url_of("a.txt")) == "hello"
    # listing
    assert tree.kinds() == {"a.txt": "file", "b.png": "file", "sub": "dir"}
    assert tree.sizes() == {"a.txt": 5, "b.png": 2} and tree.list_dirs() == ["sub"]
    assert [folder for folder, _ in tree.walk()] == ["", "sub", "sub/deep"]
    assert [folder for folder, _ in tree.walk(prune=lambda rel: rel == "sub/deep")] == ["", "sub"]
    assert tree.walk_files() == ["a.txt", "b.png", "sub/c.png", "sub/deep/d.png"]
    assert [p.name for p in tree.glob("*.png")] == ["b.png"]
    # untrusted names
    folder = tree.resolve()
    assert folder.file_inside("b.png", "labels.txt:1", folder.kinds()) == folder.url_of("b.png")
    assert folder.file_inside("sub/c.png", "labels.txt:2") == folder.url_of("sub/c.png")
    assert folder.file_inside("gone.png", "labels.txt:3", folder.kinds()) is None
    with pytest.raises(LabelError, match="labels.txt:4.*outside the data folder"):
        folder.file_inside("../x.png", "labels.txt:4")
    with pytest.raises(DataError, match="labels.txt:5.*sub"):
        folder.file_inside("sub", "labels.txt:5", folder.kinds())
    # writing
    tree.remove("a.txt")
    tree.remove("a.txt")  # already gone: nothing to do
    tree.invalidate()
    assert not tree.exists("a.txt") and tree.sizes() == {"b.png": 2}


def test_a_missing_folder_lists_nothing(tree: Location) -> None:
    gone = tree / "gone"
    assert not gone.exists() and not gone.is_dir() and gone.sizes() == {} and gone.list_dirs() == []


def test_a_local_location_keeps_links_inside_and_refuses_what_is_not_a_file(tmp_path: Path) -> None:
    outside = tmp_path / "secret.png"
    outside.write_bytes(b"s")
    place = _fill(where(tmp_path / "tree")).resolve()
    (tmp_path / "tree" / "link.png").symlink_to(outside)
    (tmp_path / "tree" / "inner.png").symlink_to(tmp_path / "tree" / "b.png")
    kinds = place.kinds()
    assert kinds["link.png"] == "link"
    with pytest.raises(LabelError, match="resolves to .*secret.png, outside the data folder"):
        place.file_inside("link.png", "labels.txt:1", kinds)
    assert place.file_inside("inner.png", "labels.txt:2", kinds) == str(tmp_path / "tree" / "b.png")
    assert not place.contains(where(tmp_path / "tree" / "link.png")) and place.contains(where(tmp_path / "tree" / "inner.png"))
    with pytest.raises(DataError, match="not a regular file"):
        place.read_bytes("sub")  # a folder opened as a file
    fifo = tmp_path / "tree" / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file"):  # O_NONBLOCK: refused, never a hang
        place.open("pipe.png")


def test_a_location_pickles_without_its_filesystem() -> None:
    place = RemoteLocation("memory://stoker-fs-test/p", {"skip_instance_cache": False})
    state = place.__getstate__()
    assert state == {"url": "memory://stoker-fs-test/p", "storage_options": {"skip_instance_cache": False}}
    copy = pickle.loads(pickle.dumps(place))
    assert copy == place and copy.path == place.path
    local = where("data/x")
    assert pickle.loads(pickle.dumps(local)) == local and local != where("memory://data/x")


def test_a_missing_filesystem_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_gcsfs(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("gcsfs"):
            raise ImportError("No module named 'gcsfs'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gcsfs)
    with pytest.raises(ConfigError, match=r"pip install 'stoker\[gcs\]'"):
        where("gs://bucket/packed")


def test_an_unknown_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="protocol"):
        where("nosuchproto://bucket/x")


def test_an_s3_round_trip(bucket: str, tmp_path: Path) -> None:
    place = where(f"{bucket}/tree")
    assert isinstance(place, RemoteLocation)
    _fill(place)
    (tmp_path / "up.bin").write_bytes(b"uploaded")
    place.upload(tmp_path / "up.bin", "sub/up.bin")
    place.invalidate()
    assert place.kinds() == {"a.txt": "file", "b.png": "file", "sub": "dir"}
    assert place.walk_files() == ["a.txt", "b.png", "sub/c.png", "sub/deep/d.png", "sub/up.bin"]
    assert place.read_bytes("sub/up.bin") == b"uploaded" and place.size("sub/deep/d.png") == 4
    with place.open("b.png") as f:
        assert f.read() == b"bb"
    with pytest.raises(MissingFileError, match=f"{bucket}/tree/nope"):
        place.read_bytes("nope")
    copy = pickle.loads(pickle.dumps(place))  # as a DataLoader worker or a Ray task gets it
    assert copy.read_bytes("a.txt") == b"hello"
