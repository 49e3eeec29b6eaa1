"""Loader settings: what ``stoker tune`` chooses, as a ``[data]`` table ``stoker train`` reads.

The file holds the loader's knobs under the keys of the training configuration's
``[data]`` table, so it can be merged into a training config (``stoker train CONFIG
--loader-config FILE``) or pasted into one. What the knobs were measured with (the
storage and the rate) is kept in comments, since the storage is a choice of data, not
of the loader::

    # written by `stoker tune digiface --budget 60s` on 2025-01-01 10:00
    # measured: 2150 img/s reading shards-pixels
    [data]
    workers = 2
    backend = "thread"
    prefetch_factor = 4

Example:
    >>> s = LoaderSettings(workers=4, backend="thread", prefetch_factor=4)
    >>> LoaderSettings.from_toml(s.to_toml()) == s
    True
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from stoker import _tomllib as tomllib
from stoker.bench.methods import METHODS
from stoker.errors import ConfigError, MissingFileError
from stoker.loading.backends import BACKENDS

__all__ = ["LOADER_KEYS", "LoaderSettings", "load_data_table", "load_settings", "save_settings"]

# The keys of a training config's [data] table that these settings write and read.
LOADER_KEYS: tuple[str, ...] = ("workers", "backend", "prefetch_factor")

_MEASURED_RE = re.compile(r"^# measured: ([0-9.,]+) img/s reading (\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class LoaderSettings:
    """The loader's knobs, and what they were measured with.

    Two settings are equal when they set the loader the same way; ``method`` and
    ``img_per_s`` only record the measurement.

    Attributes:
        workers: loader workers (processes or threads); 0 loads in the main process.
        backend: ``"process"`` (DataLoader workers) or ``"thread"`` (a thread pool).
        prefetch_factor: batches each worker loads ahead.
        method: the storage the settings were measured on: a name of
            :data:`~stoker.bench.methods.METHODS` (``"files"``, ``"shards-pixels"``...).
        img_per_s: the rate they measured, if known.
    """

    workers: int = 2
    backend: str = "process"
    prefetch_factor: int = 2
    method: str = field(default="files", compare=False)
    img_per_s: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        problem = _problem({f.name: getattr(self, f.name) for f in fields(self)})
        if problem is not None:
            raise ConfigError(f"loader settings: {problem}")

    def loader_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`stoker.make_loader` these settings fix.

        Example:
            >>> LoaderSettings(workers=3).loader_kwargs()
            {'num_workers': 3, 'backend': 'process', 'prefetch_factor': 2}
        """
        return {"num_workers": self.workers, "backend": self.backend, "prefetch_factor": self.prefetch_factor}

    def replace(self, **changes: Any) -> LoaderSettings:
        """A copy with some fields changed (and checked)."""
        return replace(self, **changes)

    def data_table(self) -> dict[str, Any]:
        """The ``[data]`` keys of a training config these settings set.

        Example:
            >>> LoaderSettings(workers=4, backend="thread").data_table()
            {'workers': 4, 'backend': 'thread', 'prefetch_factor': 2}
        """
        return {key: getattr(self, key) for key in LOADER_KEYS}

    def to_toml(self, comment: str = "") -> str:
        """A TOML ``[data]`` table, with ``comment`` lines and the measurement on top."""
        lines = [f"# {line}" for line in comment.splitlines()]
        if self.img_per_s is not None:
            lines.append(f"# measured: {self.img_per_s:.1f} img/s reading {self.method}")
        lines.append("[data]")
        for key, value in self.data_table().items():
            lines.append(f'{key} = "{value}"' if isinstance(value, str) else f"{key} = {value}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_table(cls, table: dict[str, Any], where: str = "loader settings") -> LoaderSettings:
        """Settings from a ``[data]`` table; keys of the table that are not loader knobs are ignored.

        A training config's ``[data]`` table holds more (``path``, ``batch_size``...);
        the loader's knobs missing from it keep their defaults, and ``backend = "auto"``
        counts as the default ``"process"``.
        """
        values = {key: table[key] for key in LOADER_KEYS if key in table}
        if values.get("backend") == "auto":
            del values["backend"]
        defaults = {f.name: f.default for f in fields(cls)}
        problem = _problem({**defaults, **values}, key_prefix="data.")
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")
        return cls(**values)

    @classmethod
    def from_toml(cls, text: str, where: str = "loader settings") -> LoaderSettings:
        """Settings from TOML text with a ``[data]`` table (and the measurement comment, if any)."""
        settings = cls.from_table(_data_table(text, where), where)
        measured = _MEASURED_RE.search(text)
        if measured and measured.group(2) in METHODS:
            settings = settings.replace(img_per_s=float(measured.group(1).replace(",", "")), method=measured.group(2))
        return settings


def _problem(values: Mapping[str, Any], key_prefix: str = "") -> str | None:
    """What is wrong with these settings' values (keys named with ``key_prefix``), or None."""
    method, backend = values["method"], values["backend"]
    if method not in METHODS:
        return f"method must be one of {', '.join(METHODS)}; got {method!r}"
    if backend not in BACKENDS:
        return f"{key_prefix}backend must be one of {', '.join(BACKENDS)}; got {backend!r}"
    for name, minimum in (("workers", 0), ("prefetch_factor", 1)):
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            return f"{key_prefix}{name} must be a whole number >= {minimum}; got {value!r}"
    if backend not in METHODS[method].backends:
        return f"{method} runs on backend {' or '.join(repr(b) for b in METHODS[method].backends)} only; got {backend!r}"
    return None


def _data_table(text: str, where: str) -> dict[str, Any]:
    """The ``[data]`` table of TOML ``text``; ``where`` names the file in errors."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from None
    table = document.get("data")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: no [data] table; write one with `stoker tune DATA --out FILE`")
    return table


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"{path}: loader settings file not found; write one with `stoker tune DATA --out {path}`") from None


def save_settings(settings: LoaderSettings, path: str | os.PathLike[str], comment: str = "") -> Path:
    """Write ``settings`` as TOML to ``path`` (through a temporary name) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(settings.to_toml(comment), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_settings(path: str | os.PathLike[str]) -> LoaderSettings:
    """Read settings written by :func:`save_settings`, or the ``[data]`` table of a training config.

    Raises:
        MissingFileError: no such file.
        ConfigError: not TOML, no ``[data]`` table, or a bad value (naming the file and the key).
    """
    path = Path(path)
    return LoaderSettings.from_toml(_read(path), where=str(path))


def load_data_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``[data]`` table of a settings file as written, its loader keys checked as :func:`load_settings` checks them.

    ``stoker train --loader-config FILE`` merges it into the training config: keys the
    file does not set keep the config's values, and ``backend = "auto"`` stays ``"auto"``.

    Raises:
        MissingFileError: no such file.
        ConfigError: not TOML, no ``[data]`` table, or a bad loader value (naming the file and the key).

    Example:
        >>> load_data_table("loader.toml")  # doctest: +SKIP
        {'workers': 2, 'backend': 'thread', 'prefetch_factor': 4}
    """
    path = Path(path)
    table = _data_table(_read(path), str(path))
    LoaderSettings.from_table(table, str(path))
    return table
