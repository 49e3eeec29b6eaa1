"""The TOML configuration of ``stoker train``: four tables, validated before anything runs.

::

    [data]
    path = "data/digiface"        # class folders, a label file, ids, a shard set, or a list
    batch_size = 128
    [model]
    name = "resnet18"             # small_cnn or any torchvision classifier; classes from the data
    [optim]
    name = "sgd"                  # sgd | adam | adamw
    lr = 0.1
    [run]
    epochs = 30
    amp = "bf16"                  # auto | off | bf16 | fp16

Each key is said once, as a field of its table's dataclass, with its check, help and flag
in its metadata (:func:`~stoker.train.runner.keys.config_key`): the checks of a file, of
``--set table.key=value``, of the flags and of :class:`~stoker.train.Scenario`, the flags
themselves and ``stoker train --keys`` (:func:`describe_keys`) all come from there. A bad
key or value is a :class:`~stoker.ConfigError` naming where it was given (the file, the
flag, ``--set ...``) and what it accepts. Relative paths are relative to the current directory.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stoker import _tomllib as tomllib
from stoker.errors import ConfigError, MissingFileError, NetworkError
from stoker.fs import join
from stoker.loading.backends import BACKENDS as LOADER_BACKENDS
from stoker.loading.workers import FALLBACK_WORKERS
from stoker.order import SHUFFLE_SCOPES
from stoker.train.runner.keys import (
    Check,
    as_bool,
    choice,
    config_key,
    crop_box,
    device_name,
    model_name,
    nonempty_text,
    number,
    optional,
    path_list,
    pixel_size,
    read_toml_value,
    tag_table,
    whole,
)

__all__ = [
    "AMP_MODES",
    "DataConfig",
    "KeyFlag",
    "ModelConfig",
    "OPTIMIZERS",
    "OptimConfig",
    "RESUME_MAY_CHANGE",
    "RunConfig",
    "SCHEDULERS",
    "TrainConfig",
    "apply_override",
    "describe_keys",
    "key_flags",
    "load_config",
    "parse_config",
]

AMP_MODES: tuple[str, ...] = ("auto", "off", "bf16", "fp16")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adamw")
SCHEDULERS: tuple[str, ...] = ("none", "cosine", "step", "onecycle")
BACKENDS: tuple[str, ...] = ("auto", *LOADER_BACKENDS)
ON_ERROR: tuple[str, ...] = ("raise", "skip")
DECODERS: tuple[str, ...] = ("auto", "full", "nvjpeg")  # ShardDataset's decoder= (stoker.shards.read.dataset.DECODERS)


# --- the four tables: every key's type, default, check, help and flag, said once ------------


@dataclass
class DataConfig:
    """``[data]``: where the samples are and how they are batched."""

    path: list[str] = config_key(path_list, factory=list, doc="data folder(s) or file(s); the layout is detected", flag="--data")
    labels: str | None = config_key(optional(nonempty_text), None, doc="the label file, when a folder holds several .txt files")
    crop: tuple[int, int, int, int] | None = config_key(optional(crop_box), None, doc="crop every image: [top, left, height, width]")
    valid: float = config_key(number(0.0, 1.0, open_min=True, open_max=True), 0.1, doc="share held out for validation",
                       flag="--valid-share")
    valid_path: list[str] = config_key(path_list, factory=list, flag="--valid",
                                doc="separate validation data, any layout (a shard set too), same classes; instead of valid")
    image_size: tuple[int, int] | None = config_key(optional(pixel_size), None, doc="resize to this size (int or [h, w])")
    batch_size: int = config_key(whole(1), 64, doc="samples per batch")
    workers: int | None = config_key(
        optional(whole(0)), None,
        doc="loader worker processes (or threads); default: what the data measured fastest with, else this rank's "
            f"share of the cores less what training needs (a stream split by worker: {FALLBACK_WORKERS})",
    )
    prefetch_factor: int = config_key(whole(1), 2, doc="batches each worker loads ahead")
    place_readers: bool | None = config_key(
        optional(as_bool), None, doc="readers at a lower priority, and off the training cores where there are cores to "
                                     "spare (Linux), so that the training thread keeps its CPU; default: on an accelerator"
    )
    backend: str = config_key(choice(*BACKENDS), "auto", doc="auto | process | thread (auto: what suits the data)")
    on_error: str = config_key(choice(*ON_ERROR), "raise", doc="raise | skip (skip: bad samples are counted, not fatal)")
    shuffle_scope: str = config_key(
        choice(*SHUFFLE_SCOPES), "auto",
        doc="auto | split | blocks: what the training shuffle spans (blocks: blocks of shards a remote set's cache "
            "holds, each fetched once per epoch; auto: blocks when the set does not fit --cache-limit)",
    )
    decoder: str = config_key(
        choice(*DECODERS), "auto",
        doc="how encoded shards decode: auto (the GPU where it measured faster on the first batch) | full | nvjpeg "
            "(on the GPU; what `stoker tune` records when the GPU was fastest)",
    )
    label_order: str = config_key(
        choice("auto", "sorted"), "auto", doc="auto: numeric class folder names are labels | sorted: names numbered in order"
    )


@dataclass
class ModelConfig:
    """``[model]``: which network."""

    name: str = config_key(model_name, "small_cnn", doc="small_cnn or a torchvision classifier (resnet18, resnet50...)", flag="--model")
    num_classes: int | None = config_key(optional(whole(2)), None, doc="outputs; default: the data's class count")


@dataclass
class OptimConfig:
    """``[optim]``: optimizer, learning rate and schedule."""

    name: str = config_key(choice(*OPTIMIZERS), "adamw", doc="sgd | adam | adamw", flag="--optimizer")
    lr: float = config_key(number(0.0, open_min=True), 1e-3, doc="learning rate")
    weight_decay: float = config_key(number(0.0), 0.0, doc="weight decay")
    momentum: float = config_key(number(0.0, 1.0, open_max=True), 0.9, doc="sgd momentum")
    scheduler: str = config_key(choice(*SCHEDULERS), "none", doc="none | cosine | step | onecycle")
    step_epochs: int = config_key(whole(1), 10, doc="step scheduler: epochs between decays")
    gamma: float = config_key(number(0.0, 1.0, open_min=True), 0.1, doc="step scheduler: decay factor")
    label_smoothing: float = config_key(number(0.0, 1.0, open_max=True), 0.0, doc="cross-entropy label smoothing")


@dataclass
class RunConfig:
    """``[run]``: how long, where, on what, and what to call it."""

    epochs: int = config_key(whole(1), 10, doc="total epochs")
    device: str = config_key(device_name, "auto", doc="auto (CUDA when available), cpu, cuda, cuda:N")
    amp: str = config_key(choice(*AMP_MODES), "auto",
                          doc="mixed precision: auto (bf16 on a CUDA device that supports it, else off) | off | bf16 | fp16")
    compile: bool = config_key(as_bool, False, doc="torch.compile the model")
    channels_last: bool | None = config_key(
        optional(as_bool), None,
        doc="model and batches in channels_last memory format; default: on for a convolutional model on CUDA under AMP",
    )
    grad_accum: int = config_key(whole(1), 1, doc="batches per optimizer step")
    log_dir: str = config_key(nonempty_text, "runs", doc="folder holding the run folders (a path, or a URL such as s3://bucket/runs)")
    name: str | None = config_key(optional(nonempty_text), None, doc="run folder name; default: the start time")
    tags: dict[str, str] = config_key(tag_table, factory=dict, flag="--tag",
                               doc='labels to group runs by, e.g. { category = "shards" }')
    seed: int = config_key(whole(0), 0, doc="seeds weights, split and shuffle order")
    patience: int | None = config_key(optional(whole(1)), None, doc="stop after this many epochs without a better valid accuracy")
    test: bool = config_key(as_bool, False, doc="after training, evaluate the data's test split once with best.pt (run.json, test.csv)")
    resume: bool = config_key(as_bool, False, doc="continue the run `name` from its last.pt, with the config in its run.json")
    cpu_threads: int | None = config_key(
        optional(whole(1)), None, doc="torch compute threads on the CPU; default: the cores the loader workers leave"
    )
    checkpoint_every_steps: int | None = config_key(
        optional(whole(1)), None, doc="also write last.pt every this many optimizer steps (mid-epoch resume)"
    )
    sync_every: int | None = config_key(
        optional(whole(1)), None, doc="read the loss back from the device every N batches; default 16 on CUDA, 1 elsewhere"
    )
    progress: bool = config_key(as_bool, True, doc="show progress bars")
    adapt: bool = config_key(as_bool, True, doc="try loader workers/backend/prefetch in the first steps, keep the fastest")
    loader_bound_share: float = config_key(number(0.0, 1.0), 0.3, doc="data-wait share that counts as loader-bound")


_TABLES: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig, "run": RunConfig}

# Keys a resumed run may set to other values than its run.json holds: where it runs, how
# fast it loads, how long it goes on, what it shows. Every other key is the run itself.
RESUME_MAY_CHANGE: frozenset[str] = frozenset({
    "run.epochs", "run.device", "run.progress", "run.patience", "run.resume", "run.log_dir", "run.name", "run.test",
    "run.loader_bound_share", "run.checkpoint_every_steps", "run.sync_every", "run.cpu_threads", "run.adapt",
    "run.channels_last", "data.workers", "data.prefetch_factor", "data.backend",
    "data.place_readers",
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


def _origin(origins: Mapping[str, str], name: str, source: str) -> str:
    """Where ``name`` (``table.key``, or ``table`` alone) was given: a flag, ``--set ...``, a file; else ``source``."""
    if name in origins:
        return origins[name]
    return next((where for k, where in origins.items() if k.partition(".")[0] == name), source)


def parse_config(raw: Mapping[str, Any], source: str = "<config>", origins: Mapping[str, str] | None = None) -> TrainConfig:
    """Check raw tables (parsed TOML) and build a :class:`TrainConfig`.

    Args:
        raw: ``{table: {key: value}}``.
        source: where the tables come from (the file), the start of every message.
        origins: ``{"table.key": where}`` for keys given elsewhere (``"--epochs"``,
            ``"--set run.epochs=0"``, a settings file): a message about such a key
            starts with that instead.

    Raises:
        ConfigError: every unknown table or key (a key of another table says which one it
            belongs in; else the keys its table takes) and every bad value (with what the key
            accepts), all at once; each line starts with where it was given.
    """
    origins = origins or {}
    tables: dict[str, Any] = {}
    problems: list[str] = []
    for table_name, table in raw.items():
        where = _origin(origins, table_name, source)
        if table_name not in _TABLES:
            problems.append(f"{where}: unknown table [{table_name}]; the tables are {', '.join(f'[{t}]' for t in _TABLES)}")
            continue
        if not isinstance(table, Mapping):
            problems.append(f"{where}: {table_name} must be a table ([{table_name}]), got {table!r}")
            continue
        cls = _TABLES[table_name]
        known = {f.name: f for f in fields(cls)}
        values = {}
        for name, value in table.items():
            where = origins.get(f"{table_name}.{name}", source)
            if name not in known:
                problems.append(f"{where}: {_unknown_key(table_name, name, list(known))}")
                continue
            try:
                values[name] = known[name].metadata["check"](value, f"{table_name}.{name}")
            except ConfigError as exc:
                problems.append(f"{where}: {exc}")
        if not problems:
            tables[table_name] = cls(**values)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} mistakes in the config:\n  " + "\n  ".join(problems))
    config = TrainConfig(**tables, source=source)
    _check_together(config)
    return config


def _unknown_key(table_name: str, name: str, known: list[str]) -> str:
    """What is wrong with ``name`` in ``[table_name]``: the table it belongs in, else the nearest key and the ones there are."""
    homes = [t for t, cls in _TABLES.items() if t != table_name and name in {f.name for f in fields(cls)}]
    if homes:
        return f"unknown key {table_name}.{name}: {name} belongs in [{homes[0]}] ({homes[0]}.{name})"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown key {table_name}.{name}{hint}; [{table_name}] takes: {', '.join(known)}"


def _check_together(config: TrainConfig) -> None:
    """Checks that span keys."""
    if config.run.resume and config.run.name is None:
        raise ConfigError(f"{config.source}: run.resume needs run.name, the run folder to continue (under run.log_dir)")


def apply_override(raw: dict[str, Any], assignment: str) -> str:
    """Apply ``table.key=value`` to raw tables; the value is read as TOML, else as text.

    ``optim.lr=0.01`` sets a number, ``run.tags={category="shards"}`` a table,
    ``data.path=/data/x`` text (no quotes needed).

    Returns:
        The key set, ``"table.key"``.

    Raises:
        ConfigError: the assignment is not ``table.key=value``.
    """
    name, sep, value_text = assignment.partition("=")
    table, dot, name = name.strip().partition(".")
    if not sep or not dot or not table or not name or "." in name:
        raise ConfigError(f"--set {assignment!r}: expected table.key=value, e.g. optim.lr=0.01")
    section = raw.setdefault(table, {})
    if not isinstance(section, dict):
        raise ConfigError(f"--set {assignment!r}: {table} is not a table")
    section[name] = read_toml_value(value_text)
    return f"{table}.{name}"


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str] = (),
    values: Mapping[str, Any] | None = None,
    origins: Mapping[str, str] | None = None,
    records: Callable[[TrainConfig], str | None] | None = None,
) -> TrainConfig:
    """Read a TOML config (or start from the defaults when ``path`` is None), apply overrides, check.

    Args:
        path: the ``.toml`` file, or ``None``.
        overrides: ``table.key=value`` assignments (text), applied in order.
        values: ``{"table.key": value}`` with raw values (command-line flags), applied
            last; a dict value adds to the table already there (``run.tags``).
        origins: ``{"table.key": where}``: each of ``values``' flag or file, for messages; default ``"<flags>"``.
        records: to resume, the text of the run's ``run.json`` given the config as given
            (``None``: there is none); default: read ``run.log_dir/run.name/run.json``
            (``stoker train`` reads it at a URL, or over several machines the newest).

    With ``run.resume`` the run's own config comes from its ``run.json``: the keys given
    must equal it, except those in :data:`RESUME_MAY_CHANGE` (epochs, device, workers...).

    Raises:
        MissingFileError: the file does not exist.
        ConfigError: the TOML is malformed (with its line), or a key or value is bad,
            or (resuming) a given key differs from the run's own config.

    Example:
        >>> cfg = load_config(None, ["data.path=data/digiface", "optim.lr=0.01", "run.epochs=3"])
        >>> cfg.optim.lr, cfg.run.epochs
        (0.01, 3)
    """
    raw: dict[str, Any] = {}
    source = "<flags>"
    where: dict[str, str] = {}
    if path is not None:
        source = str(path)
        try:
            toml_text = Path(path).read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is dropped
        except FileNotFoundError:
            raise MissingFileError(f"{path}: config file not found") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not a UTF-8 text file (byte {exc.start}); save it as UTF-8 TOML") from None
        try:
            raw = tomllib.loads(toml_text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    for assignment in overrides:
        where[apply_override(raw, assignment)] = f"--set {assignment}"
    for name, value in (values or {}).items():
        table, _, field_name = name.partition(".")
        section = raw.setdefault(table, {})
        if isinstance(value, dict) and isinstance(section.get(field_name), dict):
            value = {**section[field_name], **value}  # a table (run.tags) adds to the one there
        section[field_name] = value
        where[name] = (origins or {}).get(name, "<flags>")
    config = parse_config(raw, source, where)
    if config.run.resume:
        return _with_the_runs_config(raw, config, source, where, records)
    return config


def _no_such_run(log_dir: Path, name: str) -> str:
    """The message for ``--name NAME --resume`` when ``log_dir/NAME`` holds no run record."""
    runs = sorted(p.parent.name for p in log_dir.glob("*/run.json") if p.parent.name != name) if log_dir.is_dir() else []
    where = f"{log_dir / name}" + (" has no run.json" if (log_dir / name).is_dir() else " does not exist")
    known = f"; runs in {log_dir}: {', '.join(runs[:8])}{' ...' if len(runs) > 8 else ''}" if runs else ""
    return (f"no run called {name!r} to resume in {log_dir} ({where}){known}; check --name and --log-dir, "
            "or start a new run with --data (without --resume)")


def _damaged_record(record_path: str, why: str) -> str:
    """The one line for a run whose ``run.json`` cannot be read: never replaced silently, the user chooses."""
    return (
        f"{record_path}: cannot resume: the run's record is damaged ({why}); it holds the config the run continues "
        "with. Restore it from a copy and run again; or, to continue from last.pt with the config given now (the "
        "file and flags), move run.json aside and run again; or start a new run under another --name"
    )


def _with_the_runs_config(given: dict[str, Any], config: TrainConfig, source: str, origins: Mapping[str, str],
                          records: Callable[[TrainConfig], str | None] | None = None) -> TrainConfig:
    """The config a resumed run continues with: its own, from ``run.json``, plus what was given.

    A key given (in the file, by a flag or ``--set``) must equal the run's own value,
    unless it is one of :data:`RESUME_MAY_CHANGE`; ``run.tags`` may add tags.

    Raises:
        ConfigError: given keys differ from the run's own config (names each, both values).
    """
    record_path = join(config.run.log_dir, str(config.run.name), "run.json")  # a path or a URL
    try:
        text = records(config) if records is not None else Path(record_path).read_text(encoding="utf-8")
    except NetworkError:
        raise
    except UnicodeDecodeError as exc:
        raise ConfigError(_damaged_record(record_path, f"not UTF-8 text at byte {exc.start}")) from None
    except OSError:
        text = None
    if text is None:
        if not config.data.path:  # nothing to go on: say which run is missing, not which key
            raise ConfigError(_no_such_run(Path(config.run.log_dir), str(config.run.name))) from None
        return config  # no record to follow: the given config it is (fit says if there is nothing to resume)
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise ConfigError(_damaged_record(record_path, f"not JSON: {exc}")) from None
    if not isinstance(record, dict):
        raise ConfigError(_damaged_record(record_path, f"JSON {type(record).__name__}, not an object"))
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
    return parse_config(merged, source, origins)


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


def _default(f: Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


@dataclass(frozen=True)
class KeyFlag:
    """The ``stoker train`` option of one config key, as its field's metadata says.

    Attributes:
        key: ``"table.key"``.
        flag: the option, e.g. ``"--batch-size"`` (a switch also takes ``--no-...``).
        check: the key's :class:`~stoker.train.runner.keys.Check` (how the option reads its
            text, what kind of option it is, and what the value must be).
        doc: the key's help.
        default: its default value.
    """

    key: str
    flag: str
    check: Check
    doc: str
    default: Any

    @property
    def param(self) -> str:
        """The option's parameter name (``run__epochs``): one per key, never two options alike."""
        return self.key.replace(".", "__")

    def help(self) -> str:
        """The option's ``--help`` line: the key, its help and its default."""
        shown = "" if self.default in (None, [], {}) or self.check.kind == "switch" else f" [default: {_toml(self.default)}]"
        state = "auto" if self.default is None else ("on" if self.default else "off")
        on = f" [default: {state}]" if self.check.kind == "switch" else ""
        more = {"many": "; repeat for several", "pairs": "; adds one, repeat for several"}.get(self.check.kind, "")
        return f"{self.key}: {self.doc}{more}.{shown}{on}"


def key_flags() -> list[KeyFlag]:
    """Every config key's ``stoker train`` option, in table order: what the command line is made of.

    Raises:
        ConfigError: two keys claim one flag (a mistake in the field metadata).
    """
    found: list[KeyFlag] = []
    seen: dict[str, str] = {}
    for table, cls in _TABLES.items():
        for f in fields(cls):
            flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
            name = f"{table}.{f.name}"
            if flag in seen:
                raise ConfigError(f"{name} and {seen[flag]} both claim {flag}; give one of them another flag= in its field")
            seen[flag] = name
            found.append(KeyFlag(name, flag, f.metadata["check"], f.metadata["doc"], _default(f)))
    return found


def describe_keys() -> str:
    """Every table and key with its default, help and flag, as a TOML file (``stoker train --keys``)."""
    flags = {k.key: k.flag for k in key_flags()}
    lines = []
    for table, cls in _TABLES.items():
        lines.append(f"[{table}]")
        for f in fields(cls):
            default = _default(f)
            assignment = f"# {f.name} =" if default is None else f"{f.name} = {_toml(default)}"
            lines.append(f"{assignment:<28} # {f.metadata['doc']} ({flags[f'{table}.{f.name}']})")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
