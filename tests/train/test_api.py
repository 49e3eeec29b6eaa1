"""The train package's face: sorted ``__all__`` lists that resolve, in every module."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import stoker.train

MODULES = ["stoker.train"] + [m.name for m in pkgutil.walk_packages(stoker.train.__path__, "stoker.train.")]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__all__ == sorted(module.__all__)
    assert [n for n in module.__all__ if not hasattr(module, n)] == []


def test_every_public_name_has_its_home() -> None:
    """stoker.train imports its names on first use: each one in __all__ must say where it lives."""
    homes = stoker.train._HOMES  # type: ignore[attr-defined]
    assert set(homes) == set(stoker.train.__all__)
    assert all(getattr(importlib.import_module(home), name) is getattr(stoker.train, name) for name, home in homes.items())
