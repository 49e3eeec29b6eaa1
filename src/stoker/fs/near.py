"""What a mistyped local path probably meant: the nearest names in the folder above it.

A path that does not exist is answered with the names of its parent folder that are
close to its last part (difflib's ratio), so ``--data fmnsit`` says "did you mean
fmnist?". Only local paths are looked at: a URL costs a request, and its error says more.
"""

from __future__ import annotations

import difflib
import os

__all__ = ["did_you_mean", "nearest_paths"]


def nearest_paths(path: str, n: int = 3) -> list[str]:
    """Up to ``n`` existing paths beside ``path`` whose names are close to its name, closest first.

    The first part of ``path`` that is missing is the one compared (``dta/train`` with
    ``data/`` beside it gives ``data/train``); nothing when that part's folder cannot be
    listed.
    """
    parts = os.path.normpath(os.path.expanduser(path)).split(os.sep)
    for depth in range(1, len(parts) + 1):
        head = os.sep.join(parts[:depth]) or os.sep
        if os.path.lexists(head):
            continue
        parent = os.sep.join(parts[: depth - 1]) or (os.sep if depth > 1 else "")  # "" is the working folder
        try:
            names = sorted(os.listdir(parent or "."))
        except OSError:
            return []
        close = difflib.get_close_matches(parts[depth - 1], names, n=n, cutoff=0.6)
        return [os.path.join(parent, name, *parts[depth:]) for name in close]
    return []


def did_you_mean(path: str) -> str:
    """``" (did you mean X?)"``, or ``" (did you mean X or Y?)"``, for a missing local ``path``; ``""`` when none is near."""
    if "://" in path or "::" in path:
        return ""
    near = nearest_paths(path)
    if not near:
        return ""
    return f" (did you mean {' or '.join(near)}?)"
