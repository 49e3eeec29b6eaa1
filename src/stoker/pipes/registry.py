"""Stages registered by name, so that ``pipe.<name>(...)`` adds them to a pipe.

This is the place of torchdata's ``@functional_datapipe("name")``: decorate a generator
function ``stage(items: Iterator, *args, **kwargs) -> Iterator`` and every pipe gains a
method of that name. The function itself is stored in the pipe, so a pipe that uses it
pickles to worker processes as long as the function lives at module level.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from stoker.errors import ConfigError

__all__ = ["StageFn", "is_one_to_one", "register_stage", "registered_stage", "registered_stages", "reserve_names"]

StageFn = Callable[..., Iterator[Any]]
F = TypeVar("F", bound=StageFn)

_STAGES: dict[str, StageFn] = {}
_ONE_TO_ONE: set[str] = set()
_RESERVED: set[str] = set()  # the Pipe's own methods (pipe.py reserves them): no stage may take these names


def reserve_names(names: Iterable[str]) -> None:
    """Keep ``names`` (the ``Pipe`` class's own methods) from being registered as stages.

    Raises:
        ConfigError: a stage is registered already under one of ``names``.
    """
    names = set(names)
    taken = sorted(names & set(_STAGES))
    if taken:
        raise ConfigError(f"register_stage: {', '.join(map(repr, taken))} registered as stage(s) but also Pipe method(s); "
                          "rename the stage(s)")
    _RESERVED.update(names)


def register_stage(name: str, *, replace: bool = False, one_to_one: bool = False) -> Callable[[F], F]:
    """Register a generator function as the pipe stage ``name``.

    Args:
        name: the method name the stage gets on every ``Pipe``.
        replace: allow replacing another function registered under this name (a ``Pipe``
            method never can be).
        one_to_one: the stage yields one item per item it reads, in order (as ``map``), so a
            resumed epoch skips the items before it runs; it must pass ``Skipped`` markers on.

    Returns:
        A decorator that registers the function and returns it unchanged.

    Raises:
        ConfigError: ``name`` is not a valid public method name, is a ``Pipe`` method,
            or is registered already for another function (and ``replace`` is false).

    Example:
        >>> from stoker.pipes import Pipe, register_stage
        >>> @register_stage("pairs")
        ... def pairs(items, fill=None):
        ...     items = iter(items)
        ...     for first in items:
        ...         yield first, next(items, fill)
        >>> list(Pipe.from_iterable(range(5)).pairs(fill=-1))
        [(0, 1), (2, 3), (4, -1)]
    """
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ConfigError(
            f"register_stage: {name!r} is not a valid stage name; use a public identifier like 'load_image'"
        )
    if name in _RESERVED:
        raise ConfigError(f"register_stage: {name!r} is a Pipe method and cannot be replaced; choose another name")

    def register(fn: F) -> F:
        if not callable(fn):
            raise ConfigError(f"register_stage({name!r}): expected a generator function, got {type(fn).__name__}")
        # The same function defined again (a module reloaded, a notebook cell run twice) is no clash.
        if name in _STAGES and not replace and _describe(_STAGES[name]) != _describe(fn):
            raise ConfigError(
                f"register_stage: a stage named {name!r} is registered already "
                f"({_describe(_STAGES[name])}); choose another name, or pass replace=True"
            )
        _STAGES[name] = fn
        if one_to_one:
            _ONE_TO_ONE.add(name)
        else:
            _ONE_TO_ONE.discard(name)
        return fn

    return register


def registered_stage(name: str) -> StageFn | None:
    """The stage function registered as ``name``, or ``None``."""
    return _STAGES.get(name)


def is_one_to_one(name: str) -> bool:
    """Whether the stage ``name`` was registered with ``one_to_one=True``."""
    return name in _ONE_TO_ONE


def registered_stages() -> dict[str, StageFn]:
    """A copy of the registry: name -> stage function."""
    return dict(_STAGES)


def _describe(fn: StageFn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
