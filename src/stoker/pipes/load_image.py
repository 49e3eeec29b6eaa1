"""The built-in ``load_image`` stage: file path -> decoded uint8 RGB image.

It is also the worked example of a registered stage: a generator function over the
items, decorated with ``@register_stage(name)``, becomes the method ``pipe.name(...)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import torch

from stoker.decode import decode_sample
from stoker.errors import MissingFileError
from stoker.pipes.registry import register_stage

__all__ = ["load_image"]


@register_stage("load_image")
def load_image(
    paths: Iterator[str | os.PathLike[str]], keep_path: bool = True
) -> Iterator[tuple[str | os.PathLike[str], torch.Tensor] | torch.Tensor]:
    """Read and decode each file: ``path -> (path, image)``, or ``image`` alone.

    The image is a uint8 RGB CHW tensor, decoded by :func:`stoker.decode.decode_sample`
    according to the file's suffix (images, ``.pt``, ``.npy``).

    Args:
        paths: the file paths, for example from ``Pipe.list_files``.
        keep_path: yield ``(path, image)`` pairs (default) or the images alone.

    Raises:
        MissingFileError: a listed file is gone.
        DecodeError: a file cannot be decoded.

    Example:
        >>> from stoker.pipes import Pipe
        >>> pipe = Pipe.list_files("train/", masks="*.png").load_image()  # doctest: +SKIP
        >>> path, image = next(iter(pipe))  # doctest: +SKIP
        >>> image.dtype, image.shape[0]  # doctest: +SKIP
        (torch.uint8, 3)
    """
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise MissingFileError(f"{path}: file not found; it was listed but is gone, list again") from None
        image = decode_sample(data, os.fspath(path))
        yield (path, image) if keep_path else image
