"""Paths and URLs: where a folder or file named by the user lives, behind one interface.

stoker takes a plain path, a ``file://`` URL, or any fsspec URL (``s3://``, ``gs://``,
``az://``, ``https://``, ``memory://``, chained ones like ``simplecache::s3://``) wherever
it takes a folder or a file. :func:`where` turns any of them into a :class:`Location`,
and readers ask the Location what they need (``child``, ``kinds``, ``walk``, ``open``,
``read_bytes``, ``size``, ...) without asking which kind it is:

- :class:`LocalLocation`: a local path, read with the operating system (no fsspec in
  the way), with stoker's safety checks: only regular files are read (a FIFO never
  blocks), names from a stranger's data stay inside their folder with links resolved.
- :class:`RemoteLocation`: an fsspec filesystem and a path on it, never turned into a
  local folder named ``s3:``.

Where a reader needs the bytes on local disk (a shard is memory-mapped), it asks
:attr:`Location.local_path` (None at a URL) once. Credentials and endpoints come from
fsspec's usual configuration (:mod:`stoker.fs.remote`); stoker adds none of its own.

Example:
    >>> where("data/digiface").is_local
    True
    >>> where("memory://bucket/packed").child("manifest.json").url
    'memory://bucket/packed/manifest.json'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stoker.fs.local import LocalLocation
from stoker.fs.location import PATH_OR_URL_TYPES, FileKinds, Location, PathOrURL, is_url, join, local_path, parent
from stoker.fs.remote import RemoteLocation

__all__ = [
    "PATH_OR_URL_TYPES",
    "FileKinds",
    "LocalLocation",
    "Location",
    "PathOrURL",
    "RemoteLocation",
    "is_url",
    "join",
    "local_path",
    "parent",
    "read_text",
    "where",
]


def where(path: PathOrURL, storage_options: Mapping[str, Any] | None = None) -> Location:
    """The :class:`Location` a user's path or URL names (a Location is returned as it is).

    A plain path or a ``file://`` URL is a :class:`LocalLocation`; any other URL a
    :class:`RemoteLocation` (given ``storage_options``).

    Raises:
        ConfigError: the URL's filesystem is not installed (the message names the extra).
    """
    if isinstance(path, Location):
        return path
    local = local_path(path)
    if local is not None:
        return LocalLocation(local)
    return RemoteLocation(os.fspath(path), storage_options)


def read_text(path: PathOrURL) -> str:
    """The text of a small local or remote file (UTF-8).

    Raises:
        MissingFileError: there is no such file.
        DataError: it is not a regular file.
        UnicodeDecodeError: it is not UTF-8 text.
    """
    return where(path).read_text()
