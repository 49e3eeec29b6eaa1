"""Loader settings: what ``stoker tune`` chooses, as a ``[data]`` table ``stoker train`` reads.

The file holds the loader's knobs under the keys of the training configuration's
``[data]`` table, so it merges into a training config (``stoker train CONFIG
--loader-config FILE``) or pastes into one. What they were measured on is kept in a
``[tuned_for]`` table (the storage, the data folder, its layout, the rate), because
settings carry over only to the storage they were measured on: :func:`check_tuned_for`
refuses another storage and warns of other data of the same storage, saying how to
re-tune. ``docs/guides/bench-and-tune.md`` shows such a file.

Example:
    >>> s = LoaderSettings(workers=4, backend="thread", prefetch_factor=4)
    >>> LoaderSettings.from_toml(s.to_toml()) == s
    True
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from stoker import _tomllib as tomllib
from stoker.bench.methods import METHODS, cuda_available
from stoker.errors import ConfigError, MissingFileError
from stoker.fs import local_path
from stoker.loading.backends import BACKENDS

__all__ = ["DECODERS", "GPU_DECODERS", "LOADER_KEYS", "LoaderSettings", "check_decoder_here", "check_tuned_for",
           "describe_loader", "load_data_table", "load_settings", "save_settings"]

# The keys of a training config's [data] table that these settings write and read.
LOADER_KEYS: tuple[str, ...] = ("workers", "backend", "prefetch_factor", "decoder")
DECODERS: tuple[str, ...] = ("auto", "full", "nvjpeg")  # ShardDataset's decoder= (stoker.shards.read.dataset.DECODERS)
GPU_DECODERS: tuple[str, ...] = ("nvjpeg",)  # the ones that need a CUDA device

_MEASURED_RE = re.compile(r"^# measured: ([0-9.,]+) img/s reading (\S+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class LoaderSettings:
    """The loader's knobs, and what they were measured with.

    Two settings are equal when they set the loader the same way; ``method`` and
    ``img_per_s`` only record the measurement.

    Attributes:
        workers: loader workers (processes or threads); 0 loads in the main process;
            ``None`` (the default) leaves them to :func:`stoker.make_loader`'s rule, this
            rank's share of the machine (:mod:`stoker.loading.workers`), and writes no key.
        backend: ``"process"`` (DataLoader workers) or ``"thread"`` (a thread pool).
        prefetch_factor: batches each worker loads ahead.
        method: the storage the settings were measured on: a name of
            :data:`~stoker.bench.methods.METHODS` (``"files"``, ``"shards-pixels"``...).
        img_per_s: the rate they measured, if known.
        data: the data they were tuned on (its absolute path), if known.
        layout: that data's layout (``"class_folders"``, ``"split_folders"``...), if known.
        batch_size: the batch size they were measured at, if known (a run at another
            batch size is warned: workers and prefetch depth follow the batch).
        decoder: how encoded shards decode (``"nvjpeg"``: on the GPU, where ``stoker tune``
            found the GPU decode fastest); ``None`` (the default): the data set's own
            (``"auto"``), and no key is written.
    """

    workers: int | None = None  # make_loader's rule: the machine's share (a stream split by worker: its fallback)
    backend: str = "process"
    prefetch_factor: int = 2
    method: str = field(default="files", compare=False)
    img_per_s: float | None = field(default=None, compare=False)
    data: str | None = field(default=None, compare=False)
    layout: str | None = field(default=None, compare=False)
    batch_size: int | None = field(default=None, compare=False)
    decoder: str | None = None

    def __post_init__(self) -> None:
        problem = _problem({f.name: getattr(self, f.name) for f in fields(self)})
        if problem is not None:
            raise ConfigError(f"loader settings: {problem}")

    def loader_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :func:`stoker.make_loader` these settings fix (no ``num_workers`` when the
        workers are left to the machine's share).

        Example:
            >>> LoaderSettings(workers=3).loader_kwargs()
            {'num_workers': 3, 'backend': 'process', 'prefetch_factor': 2}
            >>> LoaderSettings(backend="thread").loader_kwargs()
            {'backend': 'thread', 'prefetch_factor': 2}
        """
        workers = {} if self.workers is None else {"num_workers": self.workers}
        return {**workers, "backend": self.backend, "prefetch_factor": self.prefetch_factor}

    def replace(self, **changes: Any) -> LoaderSettings:
        """A copy with some fields changed (and checked)."""
        return replace(self, **changes)

    def data_table(self) -> dict[str, Any]:
        """The ``[data]`` keys of a training config these settings set (workers left to the machine: no key).

        Example:
            >>> LoaderSettings(workers=4, backend="thread").data_table()
            {'workers': 4, 'backend': 'thread', 'prefetch_factor': 2}
        """
        return {key: getattr(self, key) for key in LOADER_KEYS if getattr(self, key) is not None}

    def to_toml(self, comment: str = "") -> str:
        """A TOML ``[data]`` table, with ``comment`` lines and the measurement on top."""
        lines = [f"# {line}" for line in comment.splitlines()]
        if self.img_per_s is not None:
            lines.append(f"# measured: {self.img_per_s:.1f} img/s reading {self.method}")
        lines.append("[data]")
        for key, value in self.data_table().items():
            lines.append(f"{key} = {_toml_value(value)}")
        tuned_for = {"storage": self.method, "data": self.data, "layout": self.layout, "img_per_s": self.img_per_s,
                     "batch_size": self.batch_size}
        if self.data is not None or self.img_per_s is not None:
            lines += ["", "[tuned_for]"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in tuned_for.items() if value is not None]
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
        tuned_for = tomllib.loads(text).get("tuned_for")
        if isinstance(tuned_for, dict):
            return settings.replace(**_tuned_for(tuned_for, where))
        measured = _MEASURED_RE.search(text)  # files written before [tuned_for]
        if measured and measured.group(2) in METHODS:
            settings = settings.replace(img_per_s=float(measured.group(1).replace(",", "")), method=measured.group(2))
        return settings


def describe_loader(workers: int | None, backend: str, prefetch_factor: int) -> str:
    """``"2 process workers, prefetch 4"``; with no workers, ``"no workers (loads in the training process)"``:
    the prefetch depth and backend only apply to workers; ``None``: the machine's share."""
    if workers is None:
        return f"the machine's share of {backend} workers, prefetch {prefetch_factor}"
    if workers == 0:
        return "no workers (loads in the training process)"
    return f"{workers} {backend} worker{'' if workers == 1 else 's'}, prefetch {prefetch_factor}"


def _toml_value(value: Any) -> str:
    """A TOML value: strings quoted and escaped (a path may hold backslashes or quotes)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _tuned_for(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The fields of :class:`LoaderSettings` a ``[tuned_for]`` table sets, checked."""
    out: dict[str, Any] = {}
    storage = table.get("storage", "files")
    if storage not in METHODS:
        raise ConfigError(f"{where}: tuned_for.storage must be one of {', '.join(METHODS)}; got {storage!r}")
    out["method"] = storage
    for key in ("data", "layout"):
        if key in table:
            if not isinstance(table[key], str):
                raise ConfigError(f"{where}: tuned_for.{key} must be text; got {table[key]!r}")
            out[key] = table[key]
    if "img_per_s" in table:
        rate = table["img_per_s"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)):
            raise ConfigError(f"{where}: tuned_for.img_per_s must be a number; got {rate!r}")
        out["img_per_s"] = float(rate)
    if "batch_size" in table:
        size = table["batch_size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"{where}: tuned_for.batch_size must be a whole number >= 1; got {size!r}")
        out["batch_size"] = size
    return out


def _problem(values: Mapping[str, Any], key_prefix: str = "") -> str | None:
    """What is wrong with these settings' values (keys named with ``key_prefix``), or None."""
    method, backend = values["method"], values["backend"]
    if method not in METHODS:
        return f"method must be one of {', '.join(METHODS)}; got {method!r}"
    if backend not in BACKENDS:
        return f"{key_prefix}backend must be one of {', '.join(BACKENDS)}; got {backend!r}"
    for name, minimum in (("workers", 0), ("prefetch_factor", 1)):
        value = values[name]
        if value is None and name == "workers":  # left to the machine's share
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            return f"{key_prefix}{name} must be a whole number >= {minimum}; got {value!r}"
    decoder = values.get("decoder")
    if decoder is not None and decoder not in DECODERS:
        return f"{key_prefix}decoder must be one of {', '.join(DECODERS)}; got {decoder!r}"
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
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is not TOML: dropped
    except FileNotFoundError:
        raise MissingFileError(f"{path}: loader settings file not found; write one with `stoker tune DATA --out {path}`") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}); write it again with `stoker tune DATA --out {path}`") from None


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
        ConfigError: not TOML, no ``[data]`` table, or a bad value (naming the file and the key); a GPU
            decoder where torch sees no CUDA device (:func:`check_decoder_here`).
    """
    path = Path(path)
    settings = LoaderSettings.from_toml(_read(path), where=str(path))
    check_decoder_here(settings, str(path))
    return settings


def load_data_table(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``[data]`` table of a settings file as written, its loader keys checked as :func:`load_settings` checks them.

    ``stoker train --loader-config FILE`` merges it into the training config: keys the
    file does not set keep the config's values, and ``backend = "auto"`` stays ``"auto"``.

    Raises:
        MissingFileError: no such file.
        ConfigError: not TOML, no ``[data]`` table, or a bad loader value (naming the file and the key); a GPU
            decoder where torch sees no CUDA device.

    Example:
        >>> path = save_settings(LoaderSettings(workers=2, backend="thread", prefetch_factor=4), "loader.toml")
        >>> load_data_table(path)
        {'workers': 2, 'backend': 'thread', 'prefetch_factor': 4}
    """
    path = Path(path)
    table = _data_table(_read(path), str(path))
    check_decoder_here(LoaderSettings.from_table(table, str(path)), str(path))
    return table


def check_decoder_here(settings: LoaderSettings, where: str) -> None:
    """Refuse settings that decode on the GPU where torch sees no CUDA device (one line: what, where, what to do).

    Raises:
        ConfigError: ``decoder = "nvjpeg"`` (``stoker tune`` found the GPU decode fastest there) and no CUDA here.
    """
    if settings.decoder not in GPU_DECODERS:
        return
    if not cuda_available():
        raise ConfigError(f"{where}: decoder = {settings.decoder!r} decodes on the GPU (stoker tune found it fastest on "
                          f"a CUDA machine), and torch sees no CUDA device here; re-tune on this machine (`stoker tune "
                          f"{settings.data or 'DATA'} --out {where}`) or delete the decoder line")


def _storage_of(path: Path) -> tuple[str, list[str]] | None:
    """(the METHODS name of the storage at ``path``, the source folders it was packed from), or None if unknown."""
    from stoker.data import detect_layout
    from stoker.errors import StokerError
    from stoker.shards.format.manifest import Manifest

    try:
        if detect_layout(path) != "shards":
            return "files", [str(path)]
        manifest = Manifest.load(path)
    except StokerError:
        return None  # not openable here: the run itself will say why
    storage = next((name for name, m in METHODS.items() if m.store == manifest.store), None)
    if storage is None:
        return None
    return storage, [str(s.root) for s in manifest.sources]


def _inside(folder: str, tuned: str) -> bool:
    """True when ``folder`` is the tuned data folder or lies inside it (a split of it)."""
    here, there = Path(folder).resolve(), Path(tuned).resolve()
    return here == there or there in here.parents


def check_tuned_for(
    settings: LoaderSettings, data: Sequence[str | os.PathLike[str]], where: str = "loader settings",
    batch_size: int | None = None,
) -> list[str]:
    """Check settings from ``stoker tune`` against the data a run is about to load (see the module docs).

    Settings that do not say what they were tuned for (written by hand, or by an older
    ``stoker tune``) are not checked.

    Args:
        settings: what :func:`load_settings` read.
        data: the paths the run trains on (``data.path``); URLs are not checked.
        where: the settings file, named in messages.
        batch_size: the run's batch size, if known: another than the settings were tuned at is warned.

    Returns:
        Warnings to show: the same storage, but other data than it was tuned on; another batch size.

    Raises:
        ConfigError: the data is another storage (files, encoded or pixel shards) than the settings were tuned
            for; the message says what they were tuned for and how to re-tune.

    Example:
        >>> tuned = LoaderSettings(workers=0, method="shards-pixels", data=os.path.abspath("packed"))
        >>> check_tuned_for(tuned, ["packed"], "loader.toml")  # the pixel shards it was tuned on
        []
        >>> check_tuned_for(tuned, ["data/digiface"], "loader.toml")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        stoker.errors.ConfigError: loader.toml: tuned for shards-pixels of ..., but data/digiface is files: ...
    """
    if settings.data is None and settings.img_per_s is None:
        return []  # says nothing about what it was measured on
    measured = [settings.layout, f"{settings.img_per_s:,.0f} img/s" if settings.img_per_s is not None else None]
    shown = ", ".join(m for m in measured if m)
    tuned = settings.method + (f" of {settings.data}" if settings.data else "") + (f" ({shown})" if shown else "")
    retune_data = settings.data or "DATA"
    warnings: list[str] = []
    if batch_size is not None and settings.batch_size is not None and batch_size != settings.batch_size:
        warnings.append(
            f"{where}: tuned at batch size {settings.batch_size}, and this run uses {batch_size}: the workers and "
            f"prefetch depth that keep up with one batch size may not with another. Pass --batch-size "
            f"{settings.batch_size}, or re-tune: `stoker tune {retune_data} --batch-size {batch_size} --out {where}`"
        )
    for item in data:
        path = local_path(item)
        if path is None:  # a URL: its storage is not looked at
            continue
        found = _storage_of(path)
        if found is None:
            continue
        storage, sources = found
        same_shards = METHODS[storage].store is not None and METHODS[settings.method].store == METHODS[storage].store
        if storage != settings.method and not same_shards:  # the GPU decode of encoded shards reads shards-encoded
            store = METHODS[storage].store
            source = sources[0] if store is not None and sources else str(path)
            raise ConfigError(
                f"{where}: tuned for {tuned}, but {path} is {storage}: settings measured on one storage do not "
                f"carry over to another. Re-tune for this data: `stoker tune {source} --storages {storage} --out {where}`"
                + (f" (or train on the {settings.method} it was tuned for: `stoker pack {retune_data} OUT --store "
                   f"{METHODS[settings.method].store}`)" if METHODS[settings.method].store else "")
                + f"; to use the settings anyway, delete the [tuned_for] table from {where}"
            )
        if settings.data is not None and not any(_inside(s, settings.data) for s in (str(path), *sources)):  # itself, or its source
            warnings.append(
                f"{where}: tuned for {tuned}; {path} is other data of the same storage, for which other settings "
                f"may be faster: re-tune with `stoker tune {sources[0] if sources else path} --out {where}`"
            )
    return warnings
