"""The one exception family of stoker.

Every error stoker raises on purpose derives from :class:`StokerError`, so a caller
can catch them all in one place. A message says what happened, where (file and line,
or shard and row) and what to do about it.

::

    StokerError
    ├── ConfigError        bad argument, option, config key or value
    ├── DataError          the user's data is missing or malformed
    │   ├── LabelError     a label line or label mapping is wrong (names file and line)
    │   ├── MissingFileError  an id, folder or file that should exist does not
    │   └── DecodeError    an image or tensor file cannot be read or decoded
    ├── NetworkError       a URL cannot be reached or read (host, timeout, refused, stalled)
    ├── ShardError         a packed shard set is damaged, incomplete or mismatched
    ├── CheckpointError    a checkpoint cannot be saved or loaded
    └── TrainingError      training cannot go on (for example a non-finite loss)
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "DecodeError",
    "LabelError",
    "MissingFileError",
    "NetworkError",
    "ShardError",
    "StokerError",
    "TrainingError",
]


class StokerError(Exception):
    """Root of every error stoker raises on purpose."""


class ConfigError(StokerError, ValueError):
    """A bad argument, option, configuration key or value."""


class DataError(StokerError):
    """The user's data is missing or malformed."""


class LabelError(DataError):
    """A label line or label mapping is wrong."""


class MissingFileError(DataError, FileNotFoundError):
    """An id, folder or file that should exist does not."""


class DecodeError(DataError):
    """An image or tensor file cannot be read or decoded."""


class NetworkError(StokerError, ConnectionError):
    """A URL cannot be reached or read: unknown host, refused, timed out, stalled, after the retries.

    Its message is one line naming the URL and the cause. It is a ``ConnectionError`` (an
    ``OSError``) too, so code that retries dropped connections sees it as one; but the
    network layer has already retried, so stoker's own callers do not retry it again.

    ``unreachable`` is True only when nothing answered (unknown host, connection refused
    or failed, timeout): only then may a fully cached set be read offline. A store that
    answered with an error (HTTP 503, a refused request) is not offline.
    """

    unreachable: bool = False


class ShardError(StokerError):
    """A packed shard set is damaged, incomplete or does not match its manifest."""


class CheckpointError(StokerError):
    """A checkpoint cannot be saved or loaded."""


class TrainingError(StokerError):
    """Training cannot go on, for example because the loss is not finite.

    ``stopped`` is the reason a run's history records (``"non-finite loss"``, ``"no readable batch"``...).
    """

    def __init__(self, message: str, stopped: str = "non-finite loss") -> None:
        super().__init__(message)
        self.stopped = stopped
