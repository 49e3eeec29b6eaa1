"""Loader settings: what ``stoker tune`` chooses and ``stoker train --loader-config`` reads.

The file is a small TOML table ``[data]`` so that it can be read on its own or merged
into a training configuration::

    # written by `stoker tune` on 2025-01-01: 2150 img/s measured
    [data]
    method = "shards-pixels"
    workers = 2
    backend = "process"
    prefetch_factor = 4
    read_batch = 256

Example:
    >>> s = LoaderSettings(workers=4, backend="thread")
    >>> LoaderSettings.from_toml(s.to_toml()) == s
    True
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from stoker.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["BACKENDS", "METHODS", "LoaderSettings", "load_settings", "save_settings"]

# The loading methods the benchmark compares; one stoker reader each.
METHODS: tuple[str, ...] = ("files", "pipe", "shards-encoded", "shards-pixels")
BACKENDS: tuple[str, ...] = ("process", "thread")


@dataclass(frozen=True)
class LoaderSettings:
    """How to load one data set: the method (storage) and the loader's knobs.

    Attributes:
        method: ``"files"`` (one file per sample), ``"pipe"`` (a streaming Pipe over
            the files), ``"shards-encoded"`` or ``"shards-pixels"`` (packed shards).
        workers: loader workers (processes or threads); 0 loads in the main process.
        backend: ``"process"`` (DataLoader workers) or ``"thread"`` (a thread pool).
        prefetch_factor: batches each worker loads ahead.
        read_batch: samples read together from a shard (shards only).
        shuffle_buffer: items the Pipe's shuffle buffer holds (pipe only).
        img_per_s: what these settings measured, for the record (not a setting).
    """

    method: str = "files"
    workers: int = 2
    backend: str = "process"
    prefetch_factor: int = 2
    read_batch: int = 256
    shuffle_buffer: int = 10_000
    img_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"loader settings: method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"loader settings: backend must be 'process' or 'thread'; got {self.backend!r}")
        for name, minimum in (("workers", 0), ("prefetch_factor", 1), ("read_batch", 1), ("shuffle_buffer", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"loader settings: {name} must be a whole number >= {minimum}; got {value!r}")
        if self.backend == "thread" and self.method == "pipe":
            raise ConfigError("loader settings: a Pipe streams and needs backend='process'")

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

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``img_per_s`` left out when unknown)."""
        out = asdict(self)
        if out["img_per_s"] is None:
            del out["img_per_s"]
        return out

    def to_toml(self, comment: str = "") -> str:
        """The settings as a TOML ``[data]`` table, with ``comment`` lines on top."""
        lines = [f"# {line}" for line in comment.splitlines()]
        lines.append("[data]")
        for key, value in self.to_dict().items():
            lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, table: dict[str, Any], where: str = "loader settings") -> LoaderSettings:
        """Settings from a dict such as a TOML ``[data]`` table; unknown keys are errors."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        try:
            return cls(**table)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {str(exc).removeprefix('loader settings: ')}") from None

    @classmethod
    def from_toml(cls, text: str, where: str = "loader settings") -> LoaderSettings:
        """Settings from TOML text with a ``[data]`` table."""
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where}: not valid TOML ({exc})") from None
        table = document.get("data")
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: no [data] table; write one with `stoker tune DATA --out FILE`")
        return cls.from_dict(table, where)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def save_settings(settings: LoaderSettings, path: str | os.PathLike[str], comment: str = "") -> Path:
    """Write ``settings`` as TOML to ``path`` (through a temporary name) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(settings.to_toml(comment), encoding="utf-8")
    os.replace(tmp, path)
    return path


def load_settings(path: str | os.PathLike[str]) -> LoaderSettings:
    """Read settings written by :func:`save_settings` (or any TOML with a ``[data]`` table).

    Raises:
        MissingFileError: no such file.
        ConfigError: not TOML, no ``[data]`` table, or a bad key or value (naming the file).
    """
    from stoker.errors import MissingFileError

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFileError(f"{path}: loader settings file not found; write one with `stoker tune DATA --out {path}`") from None
    return LoaderSettings.from_toml(text, where=str(path))
