"""The TOML configuration of ``stoker train``: four tables, validated before anything runs.

::

    [data]
    path = "data/digiface"        # class folders, a label file, ids, a shard set, or a list
    valid = 0.1                   # held out when the data has no validation split
    image_size = 64               # or [height, width]; default: as stored
    batch_size = 128
    workers = 4

    [model]
    name = "resnet18"             # small_cnn or any torchvision classifier; classes from the data

    [optim]
    name = "sgd"                  # sgd | adam | adamw
    lr = 0.1
    momentum = 0.9
    weight_decay = 5e-4
    scheduler = "cosine"          # none | cosine | step | onecycle

    [run]
    epochs = 30
    amp = "bf16"                  # off | bf16 | fp16
    log_dir = "runs"
    name = "resnet18-shards"
    tags = { category = "shards" }

Every key is checked: an unknown key or a bad value is a :class:`~stoker.ConfigError`
naming the key and what it accepts. Relative paths are relative to the current
directory. Overrides (``--set optim.lr=0.01``) are applied to the raw tables before
the checks, so they get the same messages.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stoker import _tomllib as tomllib
from stoker.errors import ConfigError, MissingFileError
from stoker.loading.backends import BACKENDS as LOADER_BACKENDS
from stoker.train.scenario import AMP_MODES

__all__ = [
    "DataConfig",
    "ModelConfig",
    "OPTIMIZERS",
    "OptimConfig",
    "RESUME_MAY_CHANGE",
    "RunConfig",
    "SCHEDULERS",
    "TrainConfig",
    "apply_override",
    "describe_keys",
    "load_config",
    "parse_config",
]

OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw")
SCHEDULERS: tuple[str, ...] = ("none", "cosine", "step", "onecycle")
BACKENDS: tuple[str, ...] = ("auto", *LOADER_BACKENDS)
ON_ERROR: tuple[str, ...] = ("raise", "skip")

Check = Callable[[Any, str], Any]  # (raw value, "table.key") -> clean value, or ConfigError

_MAX_SIDE = 16384  # the largest image side a shard can hold; larger cannot be allocated per batch anyway


# --- value checks: each takes the raw TOML value and the key, returns the clean value ---


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "a whole number", float: "a number", str: "text", list: "a list", dict: "a table"}.get(
        type(value), type(value).__name__
    )


def _int(minimum: int) -> Check:
    def check(value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{key} must be a whole number >= {minimum}, got {value!r}")
        return value

    return check


def _float(minimum: float, maximum: float = float("inf"), open_min: bool = False, open_max: bool = False) -> Check:
    low, high = ("(" if open_min else "["), (")" if open_max else "]")

    def check(value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number in {low}{minimum}, {maximum}{high}, got {_kind(value)} {value!r}")
        v = float(value)
        if not math.isfinite(v):
            raise ConfigError(f"{key} must be a finite number in {low}{minimum}, {maximum}{high}, got {value!r}")
        if v < minimum or v > maximum or (open_min and v == minimum) or (open_max and v == maximum):
            raise ConfigError(f"{key} must be a number in {low}{minimum}, {maximum}{high}, got {value!r}")
        return v

    return check


def _choice(*allowed: str) -> Check:
    def check(value: Any, key: str) -> str:
        if value not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")
        return value

    return check


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be non-empty text, got {value!r}")
    return value


def _optional(check: Check) -> Check:
    def optional(value: Any, key: str) -> Any:
        return None if value is None else check(value, key)

    return optional


def _paths(value: Any, key: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(p, str) and p for p in items):
        raise ConfigError(f"{key} must be a path or a list of paths, got {value!r}")
    return list(items)


def _size(value: Any, key: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value, value]
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 8 <= v <= _MAX_SIDE for v in value)
    ):
        raise ConfigError(f"{key} must be a size in pixels (8 to {_MAX_SIDE}) or [height, width], got {value!r}")
    return (value[0], value[1])


def _crop(value: Any, key: str) -> tuple[int, int, int, int]:
    if not isinstance(value, list) or len(value) != 4 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(f"{key} must be [top, left, height, width] in pixels, got {value!r}")
    return (value[0], value[1], value[2], value[3])


def _tags(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
        raise ConfigError(f'{key} must be a table of text values, e.g. {{ category = "shards" }}, got {value!r}')
    return {str(k): str(v) for k, v in value.items()}


def _device(value: Any, key: str) -> str:
    text = _text(value, key)
    import torch

    if text == "auto":
        return text
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N; got {value!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{key} = {text!r}, but this machine has no CUDA GPU; use device = \"auto\" or \"cpu\"")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{key} = {text!r}, but this machine has {count} GPU(s): cuda:0..cuda:{count - 1}")
    elif device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigError(f"{key} = {text!r}, but MPS is not available here; use device = \"auto\" or \"cpu\"")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N; got {value!r}")
    return text


def _model_name(value: Any, key: str) -> str:
    from stoker.train.models import model_names

    text = _text(value, key)
    names = model_names()
    if text not in names:
        close = difflib.get_close_matches(text, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"{key} {text!r} is not a known model{hint}; use small_cnn or a torchvision classifier "
            "such as resnet18, resnet50, efficientnet_b0, convnext_tiny"
        )
    return text


def _key(check: Check, default: Any = MISSING, factory: Callable[[], Any] | None = None, doc: str = "") -> Any:
    """A dataclass field carrying its check and a one-line help."""
    meta = {"check": check, "doc": doc}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# --- the four tables --------------------------------------------------------------------


@dataclass
class DataConfig:
    """``[data]``: where the samples are and how they are batched."""

    path: list[str] = _key(_paths, factory=list, doc="data folder(s) or file(s); the layout is detected")
    labels: str | None = _key(_optional(_text), None, doc="the label file, when a folder holds several .txt files")
    crop: tuple[int, int, int, int] | None = _key(_optional(_crop), None, doc="crop every image: [top, left, height, width]")
    valid: float = _key(_float(0.0, 1.0, open_min=True, open_max=True), 0.1, doc="share held out for validation")
    valid_path: list[str] = _key(_paths, factory=list, doc="separate validation data (same layout) instead of `valid`")
    image_size: tuple[int, int] | None = _key(_optional(_size), None, doc="resize to this size (int or [h, w])")
    batch_size: int = _key(_int(1), 64, doc="samples per batch")
    workers: int | None = _key(
        _optional(_int(0)), None, doc="loader worker processes (or threads); default: what the data reads fastest with, else 2"
    )
    prefetch_factor: int = _key(_int(1), 2, doc="batches each worker loads ahead")
    backend: str = _key(_choice(*BACKENDS), "auto", doc="auto | process | thread (auto: what suits the data)")
    on_error: str = _key(_choice(*ON_ERROR), "raise", doc="raise | skip (skip: bad samples are counted, not fatal)")
    label_order: str = _key(
        _choice("auto", "sorted"), "auto", doc="auto: numeric class folder names are labels | sorted: names numbered in order"
    )


@dataclass
class ModelConfig:
    """``[model]``: which network."""

    name: str = _key(_model_name, "small_cnn", doc="small_cnn or a torchvision classifier (resnet18, resnet50...)")
    num_classes: int | None = _key(_optional(_int(2)), None, doc="outputs; default: the data's class count")


@dataclass
class OptimConfig:
    """``[optim]``: optimizer, learning rate and schedule."""

    name: str = _key(_choice(*OPTIMIZERS), "adamw", doc="sgd | adam | adamw")
    lr: float = _key(_float(0.0, open_min=True), 1e-3, doc="learning rate")
    weight_decay: float = _key(_float(0.0), 0.0, doc="weight decay")
    momentum: float = _key(_float(0.0, 1.0, open_max=True), 0.9, doc="sgd momentum")
    scheduler: str = _key(_choice(*SCHEDULERS), "none", doc="none | cosine | step | onecycle")
    step_epochs: int = _key(_int(1), 10, doc="step scheduler: epochs between decays")
    gamma: float = _key(_float(0.0, 1.0, open_min=True), 0.1, doc="step scheduler: decay factor")
    label_smoothing: float = _key(_float(0.0, 1.0, open_max=True), 0.0, doc="cross-entropy label smoothing")


@dataclass
class RunConfig:
    """``[run]``: how long, where, on what, and what to call it."""

    epochs: int = _key(_int(1), 10, doc="total epochs")
    device: str = _key(_device, "auto", doc="auto (CUDA when available), cpu, cuda, cuda:N")
    amp: str = _key(_choice(*AMP_MODES), "off", doc="mixed precision: off | bf16 | fp16")
    compile: bool = _key(_bool, False, doc="torch.compile the model")
    grad_accum: int = _key(_int(1), 1, doc="batches per optimizer step")
    log_dir: str = _key(_text, "runs", doc="folder holding the run folders")
    name: str | None = _key(_optional(_text), None, doc="run folder name; default: the start time")
    tags: dict[str, str] = _key(_tags, factory=dict, doc='labels to group runs by, e.g. { category = "shards" }')
    seed: int = _key(_int(0), 0, doc="seeds weights, split and shuffle order")
    patience: int | None = _key(_optional(_int(1)), None, doc="stop after this many epochs without a better valid accuracy")
    resume: bool = _key(_bool, False, doc="continue the run `name` from its last.pt, with the config in its run.json")
    cpu_threads: int | None = _key(
        _optional(_int(1)), None, doc="torch compute threads on the CPU; default: the cores the loader workers leave"
    )
    checkpoint_every_steps: int | None = _key(
        _optional(_int(1)), None, doc="also write last.pt every this many optimizer steps (mid-epoch resume)"
    )
    sync_every: int | None = _key(
        _optional(_int(1)), None, doc="read the loss back from the device every N batches; default 16 on CUDA, 1 elsewhere"
    )
    progress: bool = _key(_bool, True, doc="show progress bars")
    loader_bound_share: float = _key(_float(0.0, 1.0), 0.3, doc="data-wait share that counts as loader-bound")


_TABLES: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "run": RunConfig}

# Keys a resumed run may set to other values than its run.json holds: where it runs, how
# fast it loads, how long it goes on, what it shows. Every other key is the run itself.
RESUME_MAY_CHANGE: frozenset[str] = frozenset({
    "run.epochs", "run.device", "run.progress", "run.patience", "run.resume", "run.log_dir", "run.name",
    "run.loader_bound_share", "run.checkpoint_every_steps", "run.sync_every", "run.cpu_threads", "data.workers", "data.prefetch_factor", "data.backend",
})
_PATH_KEYS = ("data.path", "data.valid_path", "data.labels")


@dataclass
class TrainConfig:
    """The whole configuration of a training run (see the module docstring for the keys).

    Example:
        >>> cfg = parse_config({"data": {"path": "digiface"}, "run": {"epochs": 3}})
        >>> cfg.run.epochs, cfg.optim.name
        (3, 'adamw')
    """

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    source: str = "<config>"

    def to_dict(self) -> dict[str, Any]:
        """The four tables as plain dicts (what ``run.json`` and checkpoints record)."""
        return {name: asdict(getattr(self, name)) for name in _TABLES}


def parse_config(raw: Mapping[str, Any], source: str = "<config>") -> TrainConfig:
    """Check raw tables (parsed TOML) and build a :class:`TrainConfig`.

    Raises:
        ConfigError: an unknown table or key (with the allowed ones), or a bad value
            (with what the key accepts); the message starts with ``source``.
    """
    tables: dict[str, Any] = {}
    for table_name, table in raw.items():
        if table_name not in _TABLES:
            raise ConfigError(f"{source}: unknown table [{table_name}]; the tables are {', '.join(f'[{t}]' for t in _TABLES)}")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{source}: {table_name} must be a table ([{table_name}]), got {table!r}")
        cls = _TABLES[table_name]
        known = {f.name: f for f in fields(cls)}
        values = {}
        for key, value in table.items():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"{source}: unknown key {table_name}.{key}{hint}; [{table_name}] takes: {', '.join(known)}")
            try:
                values[key] = known[key].metadata["check"](value, f"{table_name}.{key}")
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from None
        tables[table_name] = cls(**values)
    config = TrainConfig(**tables, source=source)
    _check_together(config)
    return config


def _check_together(config: TrainConfig) -> None:
    """Checks that span keys."""
    if config.run.resume and config.run.name is None:
        raise ConfigError(f"{config.source}: run.resume needs run.name, the run folder to continue (under run.log_dir)")


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply ``table.key=value`` to raw tables; the value is read as TOML, else as text.

    ``optim.lr=0.01`` sets a number, ``run.tags={category="shards"}`` a table,
    ``data.path=/data/x`` text (no quotes needed).

    Raises:
        ConfigError: the assignment is not ``table.key=value``.
    """
    key, sep, text = assignment.partition("=")
    table, dot, name = key.strip().partition(".")
    if not sep or not dot or not table or not name or "." in name:
        raise ConfigError(f"--set {assignment!r}: expected table.key=value, e.g. optim.lr=0.01")
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    section = raw.setdefault(table, {})
    if not isinstance(section, dict):
        raise ConfigError(f"--set {assignment!r}: {table} is not a table")
    section[name] = value


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str] = (),
    values: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """Read a TOML config (or start from the defaults when ``path`` is None), apply overrides, check.

    Args:
        path: the ``.toml`` file, or ``None``.
        overrides: ``table.key=value`` assignments (text), applied in order.
        values: ``{"table.key": value}`` with typed values (command-line flags), applied
            last; a dict value adds to the table already there (``run.tags``).

    With ``run.resume`` the run's own config comes from its ``run.json``
    (``run.log_dir/run.name``), so nothing needs repeating: the keys given must equal
    it, except those in :data:`RESUME_MAY_CHANGE` (epochs, device, workers...).

    Raises:
        MissingFileError: the file does not exist.
        ConfigError: the TOML is malformed (with its line), or a key or value is bad,
            or (resuming) a given key differs from the run's own config.

    Example:
        >>> cfg = load_config("train.toml", ["optim.lr=0.01", "run.epochs=3"])  # doctest: +SKIP
    """
    raw: dict[str, Any] = {}
    source = "<flags>"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise MissingFileError(f"{path}: config file not found") from None
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    for assignment in overrides:
        apply_override(raw, assignment)
    for key, value in (values or {}).items():
        table, _, name = key.partition(".")
        section = raw.setdefault(table, {})
        if isinstance(value, dict) and isinstance(section.get(name), dict):
            value = {**section[name], **value}  # a table (run.tags) adds to the one there
        section[name] = value
    config = parse_config(raw, source)
    if config.run.resume:
        return _with_the_runs_config(raw, config, source)
    return config


def _with_the_runs_config(given: dict[str, Any], config: TrainConfig, source: str) -> TrainConfig:
    """The config a resumed run continues with: its own, from ``run.json``, plus what was given.

    A key given (in the file, by a flag or ``--set``) must equal the run's own value,
    unless it is one of :data:`RESUME_MAY_CHANGE`; ``run.tags`` may add tags.

    Raises:
        ConfigError: given keys differ from the run's own config (names each, both values).
    """
    record_path = Path(config.run.log_dir) / str(config.run.name) / "run.json"
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return config  # no record to follow: the given config it is (fit says if there is nothing to resume)
    stored_raw = record.get("config") if isinstance(record, dict) else None
    if not isinstance(stored_raw, dict) or not set(stored_raw) <= set(_TABLES) or not stored_raw:
        return config  # a run made by fit() directly: it recorded no stoker train config
    stored_raw = {t: {k: v for k, v in table.items() if not (t == "data" and k == "opened")}
                  for t, table in stored_raw.items() if isinstance(table, dict)}
    stored = parse_config(stored_raw, source=str(record_path))
    conflicts = []
    for table, section in given.items():
        for key in section:
            name = f"{table}.{key}"
            mine, theirs = getattr(getattr(config, table), key), getattr(getattr(stored, table), key)
            if name in RESUME_MAY_CHANGE or mine == theirs:
                continue
            if name == "run.tags" and all(theirs.get(k, v) == v for k, v in mine.items()):
                continue
            if name in _PATH_KEYS and _resolved(mine) == _resolved(theirs):
                continue
            conflicts.append(f"{name} = {mine!r} (the run has {theirs!r})")
    if conflicts:
        raise ConfigError(
            f"{source}: resuming {config.run.name!r}, but {'; '.join(conflicts)} differ from the run's own config in "
            f"{record_path}; leave them out (a resumed run takes its config from run.json) or start a new run under "
            "another name"
        )
    merged = {t: dict(table) for t, table in stored_raw.items()}
    for table, section in given.items():
        for key, value in section.items():
            if table == "run" and key == "tags" and isinstance(value, dict):
                value = {**merged.get("run", {}).get("tags", {}), **value}
            merged.setdefault(table, {})[key] = value
    return parse_config(merged, source)


def _resolved(value: Any) -> Any:
    if isinstance(value, str):
        return str(Path(value).resolve())
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    return value


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def describe_keys() -> str:
    """Every table and key with its default and help, as a TOML file (``stoker train --keys``)."""
    lines = []
    for table, cls in _TABLES.items():
        lines.append(f"[{table}]")
        for f in fields(cls):
            default = f.default_factory() if f.default_factory is not MISSING else f.default  # type: ignore[misc]
            assignment = f"# {f.name} =" if default is None else f"{f.name} = {_toml(default)}"
            lines.append(f"{assignment:<28} # {f.metadata['doc']}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
