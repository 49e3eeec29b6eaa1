"""Parallel loading: ``make_loader`` and its building blocks.

The names are imported on first use (PEP 562), so that the torch-free parts of this
package (:mod:`stoker.loading.backends`, :mod:`stoker.loading.skips`) can be imported
without torch, as ``stoker --help`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stoker._lazy import lazy_names

if TYPE_CHECKING:
    from stoker.loading.collate import Batch, collate, to_device
    from stoker.loading.contract import MapReader, StreamReader
    from stoker.loading.loader import Loader, make_loader, resolve_device
    from stoker.loading.samplers import EpochSampler, RankSlice
    from stoker.loading.steps import EqualSteps

__all__ = [
    "Batch", "EpochSampler", "EqualSteps", "Loader", "MapReader", "RankSlice", "StreamReader", "collate", "make_loader",
    "resolve_device", "to_device",
]

# Public name -> the module it lives in (imported on first use).
_HOMES: dict[str, str] = {
    "Batch": "stoker.loading.collate",
    "EpochSampler": "stoker.loading.samplers",
    "EqualSteps": "stoker.loading.steps",
    "Loader": "stoker.loading.loader",
    "MapReader": "stoker.loading.contract",
    "RankSlice": "stoker.loading.samplers",
    "StreamReader": "stoker.loading.contract",
    "collate": "stoker.loading.collate",
    "make_loader": "stoker.loading.loader",
    "resolve_device": "stoker.loading.loader",
    "to_device": "stoker.loading.collate",
}

__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)
