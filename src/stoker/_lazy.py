"""Public names imported on first use (PEP 562), for the packages whose parts need torch.

``stoker``, ``stoker.loading`` and ``stoker.bench`` keep a map of each public name to the
module it lives in, so importing the package (as ``stoker --help`` does) costs nothing
until a name is used.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str,
    homes: Mapping[str, str],
    namespace: MutableMapping[str, Any],
    public: list[str],
    renamed: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package whose names live in ``homes``.

    ``renamed`` maps an old public name to its new one: the old name still works, with a
    ``DeprecationWarning`` naming the new one on every use.

    Example:
        >>> namespace: dict = {}
        >>> getattr_, dir_ = lazy_names("demo", {"sqrt": "math"}, namespace, ["sqrt"], renamed={"root": "sqrt"})
        >>> getattr_("sqrt")(9.0), "sqrt" in namespace, dir_()
        (3.0, True, ['sqrt'])
    """

    def getattr_(name: str) -> Any:
        if renamed and name in renamed:
            new = renamed[name]
            warnings.warn(f"{package}.{name} is now {package}.{new}; import {new} (the old name goes in a later version)",
                          DeprecationWarning, stacklevel=2)
            return getattr_(new)
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *public, *homes})

    return getattr_, dir_
