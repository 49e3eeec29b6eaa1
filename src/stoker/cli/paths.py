"""Paths named on the command line, checked before anything heavy is imported.

A command answers a mistyped path in well under a second, with the nearest names beside
it (``did you mean fmnist?``); torch, pyarrow and the readers are imported only once the
arguments have passed. URLs are left to the readers (a check would cost a request).
"""

from __future__ import annotations

import os

from stoker.errors import MissingFileError
from stoker.fs.location import is_url
from stoker.fs.near import did_you_mean

DATA_HINT = "pass a folder of images, a shard set or a label file"


def require_paths(paths: list[str], hint: str = DATA_HINT, name: str = "") -> None:
    """Each local path of ``paths`` exists, else a :class:`MissingFileError` naming it (after ``name``, a flag).

    Raises:
        MissingFileError: the first local path that does not exist, with ``hint`` and the nearest names.
    """
    for path in paths:
        if is_url(path) or os.path.lexists(os.path.expanduser(path)):
            continue
        raise MissingFileError(f"{name + ' ' if name else ''}{path}: not found; {hint}{did_you_mean(path)}")
