"""The bad-sample policy: the marker a skipped sample leaves, and the policy names.

Under ``on_error="skip"`` a reader returns (or a stream yields) a :class:`Skipped`
marker in place of a sample it could not read. The collate functions drop the markers
and count them in the :class:`~stoker.loading.collate.Batch`; the loader adds them up
per epoch (``Loader.skipped``) and reports them, so a skip is never silent. Every
reader — file data sets, shard sets, streams, the Pipe's ``load_image`` — uses this one
marker, so the counts are the same whatever the data is read with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stoker.decode.headers import BAD_SAMPLE_HINT
from stoker.errors import ConfigError

__all__ = ["ON_ERROR_POLICIES", "OnError", "Skipped", "check_on_error", "without_skip_advice"]

OnError = Literal["raise", "skip"]
ON_ERROR_POLICIES: tuple[str, ...] = ("raise", "skip")


@dataclass(frozen=True)
class Skipped:
    """Stands in for a bad sample under ``on_error="skip"``; the collate counts and drops it."""

    key: str
    reason: str


def check_on_error(on_error: object, where: str = "on_error") -> OnError:
    """``on_error`` if it is a known policy, else a :class:`ConfigError`."""
    if on_error not in ON_ERROR_POLICIES:
        raise ConfigError(f"{where} must be 'raise' or 'skip', got {on_error!r}")
    return on_error  # type: ignore[return-value]


def without_skip_advice(reason: str) -> str:
    """A bad sample's message without the advice to skip bad samples: what a run that already skips reports."""
    return reason.replace(f"; {BAD_SAMPLE_HINT}", "").replace(BAD_SAMPLE_HINT, "").rstrip("; ")
