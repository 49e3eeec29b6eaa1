"""How many loader workers a data set gets when none are asked for: the one rule, stated once.

The rule: the data set's measured ``loader_defaults["num_workers"]`` where it has one (a
shard set knows what reads it fastest: pixel shards 0, in the training process; encoded
shards one per core), else :data:`FALLBACK_WORKERS`.

The worker count is a speed setting only: for every reader (map-style, ``Pipe``,
``ShardStream``) the batches a rank sees are the same for any worker count and either
backend, and a mid-epoch checkpoint resumes under another count (the "Batches" rule of
:mod:`stoker.order`), so a default may differ from one machine to the next without
changing a run. (One exception, said where it applies: a ``ShardStream`` over a remote
split larger than its cache limit, whose workers must read the same shards at once.) Two workers keep decoding beside the training step on any machine with
two cores or more, and are what the README's baseline rows ran with.

``make_loader``, ``stoker train`` (``data.workers`` left out) and ``stoker inspect``
all take this rule; set ``num_workers`` / ``--workers`` to choose.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stoker.errors import ConfigError

__all__ = ["FALLBACK_WORKERS", "default_workers"]

FALLBACK_WORKERS = 2
"""Loader workers for data that has not measured what reads it fastest."""


def default_workers(loader_defaults: Mapping[str, Any] | None) -> int:
    """The worker count of a data set whose ``loader_defaults`` are these (``None`` or ``{}``: it has none).

    Raises:
        ConfigError: ``loader_defaults["num_workers"]`` is not a whole number >= 0.

    Example:
        >>> default_workers({"num_workers": 0, "backend": "process"}), default_workers(None)
        (0, 2)
    """
    workers = (loader_defaults or {}).get("num_workers")
    if workers is None:
        return FALLBACK_WORKERS
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ConfigError(
            f"the data set's loader_defaults give num_workers={workers!r}, not a whole number >= 0; "
            "fix its loader_defaults or pass num_workers"
        )
    return workers
