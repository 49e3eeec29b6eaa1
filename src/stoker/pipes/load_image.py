"""The built-in ``load_image`` stage: file path -> decoded uint8 RGB image.

It is also the worked example of a registered stage: a generator function over the
items, decorated with ``@register_stage(name)``, becomes the method ``pipe.name(...)``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch

from stoker.decode import decode_sample
from stoker.errors import ConfigError, DataError, MissingFileError
from stoker.fs import where
from stoker.pipes.registry import register_stage

__all__ = ["load_image"]

log = logging.getLogger("stoker")


@register_stage("load_image")
def load_image(
    paths: Iterator[str | os.PathLike[str]], keep_path: bool = True, on_error: str = "raise"
) -> Iterator[tuple[str | os.PathLike[str], torch.Tensor] | torch.Tensor]:
    """Read and decode each file: ``path -> (path, image)``, or ``image`` alone.

    The image is a uint8 RGB CHW tensor, decoded by :func:`stoker.decode.decode_sample`
    according to the file's suffix (images, ``.pt``, ``.npy``).

    Args:
        paths: the file paths, for example from ``Pipe.list_files``.
        keep_path: yield ``(path, image)`` pairs (default) or the images alone.
        on_error: ``"raise"`` (default) stops at the first bad file; ``"skip"`` drops
            missing or undecodable files and logs how many (and the first few) when
            the pass ends — per worker process, never silently.

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
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"load_image: on_error must be 'raise' or 'skip', got {on_error!r}")
    skipped: list[str] = []
    for path in paths:
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
            continue
        yield (path, image) if keep_path else image
    if skipped:
        shown = "; ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else "")
        log.warning("load_image skipped %d bad file(s) (on_error='skip'): %s", len(skipped), shown)
