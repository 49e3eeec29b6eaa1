"""What one configuration key is: its check, its help, and how it is given on the command line.

A key of the training configuration is a dataclass field made by :func:`config_key`; its
metadata holds everything said about it, once:

* ``check``: a :class:`Check`, which takes the raw value (from TOML, a flag or Python)
  and the key's name and returns the clean value or raises a
  :class:`~stoker.ConfigError` naming the key and what it accepts;
* ``doc``: one line of help (``stoker train --keys`` and ``stoker train --help``);
* ``flag``: the ``stoker train`` option that sets it (default ``--`` and the key's name
  with dashes).

The check also says how the option reads its text (:attr:`Check.parse`) and what kind of
option it is (:attr:`Check.kind`), so the command line is generated from the fields and
a value is accepted or refused the same way wherever it comes from.

Example:
    >>> whole(1)(3, "run.epochs")
    3
    >>> whole(1)(True, "run.epochs")
    Traceback (most recent call last):
    ...
    stoker.errors.ConfigError: run.epochs must be a whole number >= 1, got True
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

from stoker import _tomllib as tomllib
from stoker.errors import ConfigError

__all__ = [
    "Check",
    "FlagKind",
    "as_bool",
    "choice",
    "config_key",
    "crop_box",
    "device_name",
    "model_name",
    "nonempty_text",
    "number",
    "optional",
    "path_list",
    "pixel_size",
    "read_toml_value",
    "tag_table",
    "whole",
]

FlagKind = Literal["value", "switch", "many", "pairs"]

_MAX_SIDE = 16384  # the largest image side a shard can hold; larger cannot be allocated per batch anyway
_WHOLE_RE = re.compile(r"^\s*[+-]?\d+\s*$")


def read_toml_value(text: str) -> Any:
    """``text`` read as a TOML value (``3``, ``0.1``, ``true``, ``[32, 32]``, ``{a = "b"}``), else the text itself.

    Example:
        >>> read_toml_value("[32, 32]"), read_toml_value("/data/x")
        ([32, 32], '/data/x')
    """
    try:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def _parse_whole(text: str) -> Any:
    return int(text) if _WHOLE_RE.match(text) else text  # anything else reaches the check, which names the key


def _parse_number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _as_text(text: str) -> Any:
    return text


@dataclass(frozen=True)
class Check:
    """One key's check: ``check(value, key)`` returns the clean value or raises ConfigError naming ``key``.

    Attributes:
        run: the check itself.
        parse: how one command-line value (text) becomes the raw value ``run`` takes;
            text it cannot read is passed on as text, so the check refuses it with the
            same message as a bad TOML value.
        metavar: what the option's value looks like in ``--help``.
        kind: ``"value"`` (``--key VALUE``), ``"switch"`` (``--key/--no-key``),
            ``"many"`` (``--key VALUE``, repeated: a list) or ``"pairs"``
            (``--key NAME=VALUE``, repeated: a table that adds to the one there).
    """

    run: Callable[[Any, str], Any]
    parse: Callable[[str], Any] = _as_text
    metavar: str = "TEXT"
    kind: FlagKind = "value"

    def __call__(self, value: Any, key: str) -> Any:
        return self.run(value, key)


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "a whole number", float: "a number", str: "text", list: "a list", dict: "a table"}.get(
        type(value), type(value).__name__
    )


#: The largest whole number a key takes unless it says otherwise: what every count stoker passes
#: to Python, numpy and torch (slices, islice, sizes) fits in, with room.
MAX_WHOLE = 2**31 - 1


def whole(minimum: int, maximum: int = MAX_WHOLE) -> Check:
    """A whole number ``>= minimum`` and ``<= maximum`` (a boolean is not a number here)."""

    def check(value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{key} must be a whole number >= {minimum}, got {value!r}")
        if value > maximum:
            raise ConfigError(f"{key} must be a whole number from {minimum} to {maximum}, got {value!r}")
        return value

    return Check(check, _parse_whole, "N")


def number(minimum: float, maximum: float = float("inf"), open_min: bool = False, open_max: bool = False) -> Check:
    """A finite number in ``[minimum, maximum]`` (``open_*``: that end excluded); returned as a float."""
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

    return Check(check, _parse_number, "X")


def choice(*allowed: str) -> Check:
    """One of ``allowed``."""

    def check(value: Any, key: str) -> str:
        if value not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(allowed)}; got {value!r}")
        return value

    return Check(check, _as_text, "[" + "|".join(allowed) + "]")


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


as_bool = Check(_bool, read_toml_value, "", "switch")
"""``true`` or ``false`` (a switch on the command line: ``--key/--no-key``)."""


def _text(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be non-empty text, got {value!r}")
    return value


nonempty_text = Check(_text)
"""Non-empty text."""


def optional(check: Check) -> Check:
    """``None`` (not set) or what ``check`` accepts."""

    def run(value: Any, key: str) -> Any:
        return None if value is None else check(value, key)

    return Check(run, check.parse, check.metavar, check.kind)


def _paths(value: Any, key: str) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, str) and p for p in items):
        raise ConfigError(f"{key} must be a path or a list of paths, got {value!r}")
    return list(items)


path_list = Check(_paths, _as_text, "PATH", "many")
"""A path or a list of paths (on the command line: the option repeated)."""


def _size(value: Any, key: str) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value, value]
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and 8 <= v <= _MAX_SIDE for v in value)
    ):
        raise ConfigError(f"{key} must be a size in pixels (8 to {_MAX_SIDE}) or [height, width], got {value!r}")
    return (value[0], value[1])


pixel_size = Check(_size, read_toml_value, "PX|[H,W]")
"""A square size in pixels or ``[height, width]``."""


def _crop(value: Any, key: str) -> tuple[int, int, int, int]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 4
        or not all(isinstance(v, int) and not isinstance(v, bool) and v <= _MAX_SIDE for v in value)
        or min(value[0], value[1]) < 0
        or min(value[2], value[3]) < 1
    ):
        raise ConfigError(
            f"{key} must be [top, left, height, width] in pixels: top and left from 0, height and width from 1 "
            f"(each at most {_MAX_SIDE}), got {value!r}"
        )
    return (value[0], value[1], value[2], value[3])


crop_box = Check(_crop, read_toml_value, "[T,L,H,W]")
"""A crop box ``[top, left, height, width]`` in pixels."""


def _tags(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(v, (str, int, float, bool)) for v in value.values()):
        raise ConfigError(f'{key} must be a table of text values, e.g. {{ category = "shards" }}, got {value!r}')
    return {str(k): str(v) for k, v in value.items()}


tag_table = Check(_tags, _as_text, "KEY=VALUE", "pairs")
"""A table of text values (on the command line: ``--tag KEY=VALUE``, repeated)."""


def _device(value: Any, key: str) -> str:
    name = _text(value, key)
    if name == "auto":
        return name
    import torch  # only a device other than auto needs torch to be checked

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N; got {value!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{key} = {name!r}, but this machine has no CUDA GPU; use device = \"auto\" or \"cpu\"")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"{key} = {name!r}, but this machine has {count} GPU(s): cuda:0..cuda:{count - 1}")
    elif device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigError(f"{key} = {name!r}, but MPS is not available here; use device = \"auto\" or \"cpu\"")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N; got {value!r}")
    return name


device_name = Check(_device, _as_text, "DEVICE")
"""``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``, and present on this machine."""


def _model_name(value: Any, key: str) -> str:
    from stoker.train.runner.models import check_model_name

    return check_model_name(_text(value, key), key)


model_name = Check(_model_name, _as_text, "NAME")
"""``small_cnn`` or a torchvision classifier's name."""


def config_key(
    check: Check,
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    doc: str,
    flag: str | None = None,
) -> Any:
    """A config dataclass field carrying its check, its one-line help and its ``stoker train`` flag.

    Args:
        check: what the key accepts.
        default: its value when not given (or ``factory`` for a list or table).
        doc: one line of help.
        flag: the option's name, e.g. ``"--data"``; default ``--`` and the key's name
            with dashes (``batch_size``: ``--batch-size``).
    """
    meta = {"check": check, "doc": doc, "flag": flag}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)
