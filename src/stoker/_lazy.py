"""Public names imported on first use (PEP 562), for the packages whose parts need torch.

``stoker``, ``stoker.loading`` and ``stoker.bench`` keep a map of each public name to the
module it lives in, so importing the package (as ``stoker --help`` does) costs nothing
until a name is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, str], namespace: MutableMapping[str, Any], public: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose names live in ``homes``.

    Example:
        >>> __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), __all__)  # doctest: +SKIP
    """

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *public, *homes})

    return getattr_, dir_
