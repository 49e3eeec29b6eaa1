"""The type names shared across stoker's layers, each defined once.

* :data:`PathLike`: a path on this machine, as a string or a path object (``str | os.PathLike``).
  Where a function says so, the string may also be a URL.
* :data:`PathOrURL` (defined in :mod:`stoker.fs`, beside :class:`~stoker.fs.Location`): a
  ``PathLike``, a URL, or a ``Location``; what every reader of a folder or file takes.
* :data:`Transform`: what a data set applies to each decoded image, a uint8 ``(C, H, W)``
  tensor in, anything out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import torch

__all__ = ["PathLike", "Transform"]

PathLike = Union[str, "os.PathLike[str]"]  # a local path (or a URL string where the function says so)
Transform = Callable[["torch.Tensor"], Any]  # applied to each decoded uint8 (C, H, W) image
