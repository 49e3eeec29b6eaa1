"""The built-in ``load_image`` stage: file path -> decoded uint8 RGB image.

It is also the worked example of a registered stage: a generator function over the
items, decorated with ``@register_stage(name)``, becomes the method ``pipe.name(...)``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch

from stoker.decode.image import decode_sample
from stoker.errors import DataError, MissingFileError
from stoker.fs import where
from stoker.loading.skips import Skipped, check_on_error
from stoker.pipes.registry import register_stage

__all__ = ["load_image"]

log = logging.getLogger("stoker")


@register_stage("load_image", one_to_one=True)
def load_image(
    paths: Iterator[str | os.PathLike[str] | Skipped], keep_path: bool = True, on_error: str = "raise"
) -> Iterator[tuple[str | os.PathLike[str], torch.Tensor] | torch.Tensor | Skipped]:
    """Read and decode each file: ``path -> (path, image)``, or ``image`` alone.

    The image is a uint8 RGB CHW tensor, decoded by :func:`stoker.decode.image.decode_sample`
    according to the file's suffix (images, ``.pt``, ``.npy``).

    Args:
        paths: the file paths, for example from ``Pipe.list_files``.
        keep_path: yield ``(path, image)`` pairs (default) or the images alone.
        on_error: ``"raise"`` (default) stops at the first bad file; ``"skip"`` yields a
            :class:`~stoker.loading.skips.Skipped` marker in its place, which stoker's collate
            drops and counts (with torch's own DataLoader, pass ``collate_fn=stoker.loading.collate``).

    Raises:
        MissingFileError: a listed file is gone.
        DecodeError: a file cannot be decoded.
        ConfigError: ``on_error`` is not ``"raise"`` or ``"skip"``.

    Example:
        >>> from stoker.pipes import Pipe
        >>> pipe = Pipe.list_files("data/digiface", masks="*.png", recursive=True).load_image()
        >>> path, image = next(iter(pipe))
        >>> image.dtype, image.shape[0]
        (torch.uint8, 3)
    """
    check_on_error(on_error, "load_image: on_error")
    skipped: list[str] = []
    for path in paths:
        if isinstance(path, Skipped):
            yield path
            continue
        try:
            try:
                data = where(path).read_bytes()  # a local file or a URL
            except FileNotFoundError:
                raise MissingFileError(f"{path}: file not found; it was listed but is gone, list again") from None
            image = decode_sample(data, os.fspath(path))
        except DataError as exc:
            if on_error == "raise":
                raise
            skipped.append(str(exc))
            yield Skipped(os.fspath(path), str(exc))
            continue
        yield (path, image) if keep_path else image
    if skipped:
        shown = "; ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        log.warning("load_image skipped %d bad file(s) (on_error='skip'): %s", len(skipped), shown)
