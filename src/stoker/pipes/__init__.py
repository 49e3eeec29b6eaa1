"""The streaming Pipe: torchdata-style DataPipe verbs on a plain IterableDataset.

::

    from stoker.pipes import Pipe

    pipe = Pipe.list_files("train/", masks="*.jpg").shuffle(10_000, seed=0).shard().load_image()
    loader = torch.utils.data.DataLoader(pipe, batch_size=64, num_workers=8)

Add your own stages with :func:`register_stage`.
"""

from __future__ import annotations

import stoker.pipes.load_image  # noqa: F401  (registers the built-in load_image stage)
from stoker.pipes.pipe import Pipe
from stoker.pipes.registry import register_stage, registered_stages

__all__ = ["Pipe", "register_stage", "registered_stages"]
