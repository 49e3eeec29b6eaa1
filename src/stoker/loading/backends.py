"""The loader backends: the one list every part of stoker reads (torch-free, for the CLI).

``"process"`` loads in torch DataLoader worker processes; ``"thread"`` in a thread pool
of the main process (where decoding releases the GIL). :func:`stoker.make_loader`,
``stoker bench``, ``stoker tune`` and the training configuration all take these names.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["BACKENDS", "Backend"]

Backend = Literal["process", "thread"]
BACKENDS: tuple[Backend, ...] = ("process", "thread")
