"""Parallel loading: ``make_loader`` and its building blocks."""

from __future__ import annotations

from stoker.loading.collate import Batch, collate, to_device
from stoker.loading.loader import Loader, make_loader, resolve_device

__all__ = ["Batch", "Loader", "collate", "make_loader", "resolve_device", "to_device"]
