"""Where the shard cache lives: ``$STOKER_CACHE``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``.

Its own module, below both :mod:`stoker.shards.cache.store` (the shards) and
:mod:`stoker.shards.cache.manifests` (the manifests), which keep their files there.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_cache_dir"]


def default_cache_dir() -> Path:
    """``$STOKER_CACHE``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    env = os.environ.get("STOKER_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stoker"
