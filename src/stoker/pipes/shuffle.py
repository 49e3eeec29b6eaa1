"""The shuffle buffer: a seeded, bounded-memory shuffle of a stream.

The buffer holds ``buffer_size`` items; each new item takes the place of a random one,
which is yielded (:func:`stoker.order.buffer_shuffle_stream`, the one buffer shuffle of every
stoker reader). A buffer as large as the stream is a full shuffle. The seed of each
epoch follows the rule in :mod:`stoker.pipes.context`, so every worker and rank draws
the same permutation in one epoch and a new one the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from stoker.errors import ConfigError
from stoker.order import buffer_shuffle_stream
from stoker.pipes.compose import Step, same_length

if TYPE_CHECKING:
    from stoker.pipes.context import Context

__all__ = ["shuffle_items", "shuffle_step"]

T = TypeVar("T")


def shuffle_items(items: Iterator[T], buffer_size: int, seed: int, *, context: Context) -> Iterator[T]:
    """The ``shuffle`` stage: a buffer shuffle seeded for this epoch."""
    yield from buffer_shuffle_stream(items, buffer_size, np.random.default_rng(context.epoch_seed(seed)))


def shuffle_step(buffer_size: int, seed: int | None = None) -> Step:
    """Check the arguments of ``Pipe.shuffle`` and make its step.

    With ``seed=None`` a seed is drawn now from torch's global generator, so that copies
    of the pipe in every worker agree, and ``torch.manual_seed`` makes a run repeatable.

    Raises:
        ConfigError: ``buffer_size`` is not a positive integer, or ``seed`` not an integer.
    """
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise ConfigError(f"shuffle: buffer_size must be a positive integer, got {buffer_size!r}")
    if seed is None:
        seed = int(torch.empty((), dtype=torch.int64).random_().item())
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"shuffle: seed must be an integer or None, got {seed!r}")
    return Step("shuffle", shuffle_items, (buffer_size, seed), needs_context=True, length=same_length)
