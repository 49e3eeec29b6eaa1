"""The library's ``pack(progress=True)`` and ``verify(progress=True)`` draw a bar on a terminal only.

Into a log (a stream that is not a terminal) a bar would be hundreds of ``\\r`` frames; the
rule is the CLI's (:mod:`stoker.terminal`), so a script or a job gets the same as ``stoker pack``.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from stoker.packer import pack
from stoker.shards import verify
from stoker.terminal import QUIET_ENV

_FRAME = re.compile(r"\r(?!\n)")


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr in a shell does."""

    def isatty(self) -> bool:
        return True


def _pack_and_verify(digi: Path, out: Path, stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv(QUIET_ENV, raising=False)
    monkeypatch.setattr("sys.stderr", stream)
    pack(digi, out, store="pixels", shard_samples=8, workers=0, progress=True)
    assert verify(out, workers=0, progress=True).ok
    return stream.getvalue()


def test_a_stream_that_is_not_a_terminal_gets_no_bar_frames(digi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = _pack_and_verify(digi, tmp_path / "log", io.StringIO(), monkeypatch)
    assert not _FRAME.findall(written), written[-500:]


def test_a_terminal_gets_the_bars(digi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    written = _pack_and_verify(digi, tmp_path / "tty", _Terminal(), monkeypatch)
    assert "pack " in written and "verify" in written and _FRAME.findall(written), written[-500:]
