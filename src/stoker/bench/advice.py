"""One packing advice for every command that gives one (inspect, bench, tune).

Each names the same command, built here: pixel shards (nothing to decode when read) at
the size the images were read at, and ``--channels 1`` when every image looked at is
gray (a third of the bytes, and the same pixels: readers broadcast one channel to three).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["GRAY_SAMPLES", "looks_gray", "pack_command"]

#: Images looked at, spread over the data set, to call it gray.
GRAY_SAMPLES = 16


def looks_gray(dataset: Any, samples: int = GRAY_SAMPLES) -> bool:
    """Whether every one of up to ``samples`` images spread over ``dataset`` is gray (one channel, or three equal ones).

    A sample that cannot be read counts as not gray: the advice is then the colour one.
    """
    n = len(dataset)
    if n == 0:
        return False
    for i in sorted({round(k * (n - 1) / max(samples - 1, 1)) for k in range(min(samples, n))}):
        try:
            image = dataset[i][0]
        except Exception:  # a bad sample: no claim about the data (the readers report it where it matters)
            return False
        if not isinstance(image, torch.Tensor) or image.ndim != 3:
            return False
        if image.shape[0] == 3 and not (torch.equal(image[0], image[1]) and torch.equal(image[1], image[2])):
            return False
        if image.shape[0] not in (1, 3):
            return False
    return True


def pack_command(data: str = "DATA", size: tuple[int, int] | None = None, gray: bool = False) -> str:
    """```stoker pack DATA OUT --store pixels [--size HxW] [--channels 1]```, quoted for a message."""
    size_flag = f" --size {size[0]}x{size[1]}" if size else ""
    channels = " --channels 1" if gray else ""
    return f"`stoker pack {data} OUT --store pixels{size_flag}{channels}`"
