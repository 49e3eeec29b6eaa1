"""Progress bars are drawn only on a terminal, and never under --quiet.

The commands run as a user runs them (``python -m stoker``), their stdout and stderr sent
to files (a log) or to a pseudo-terminal; a bar frame is a carriage return not followed
by a newline (a terminal turns ``\\n`` into ``\\r\\n``).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

TIMEOUT_S = 240
_FRAME = re.compile(r"\r(?!\n)")


def _frames(text: str) -> int:
    return len(_FRAME.findall(text))


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 random 16x16 PNGs in 4 class folders."""
    root = tmp_path_factory.mktemp("bars") / "data"
    for i in range(48):
        (root / str(i % 4)).mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 255, size=(16, 16, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / str(i % 4) / f"{i}.png")
    return root


def _to_files(args: list[str], tmp_path: Path, name: str) -> tuple[int, str, str]:
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        done = subprocess.run([sys.executable, "-m", "stoker", *args], stdout=o, stderr=e, cwd=tmp_path,
                              timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    # the bytes as written: text mode would turn each "\r" into a newline
    return done.returncode, out.read_bytes().decode(errors="replace"), err.read_bytes().decode(errors="replace")


def _on_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run with stdout and stderr on a pseudo-terminal; everything it wrote there."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a bar needs columns to draw in
    proc = subprocess.Popen([sys.executable, "-m", "stoker", *args], stdout=child, stderr=child, cwd=cwd,
                            stdin=subprocess.DEVNULL)
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if ready:
                try:
                    data = os.read(main, 65536)
                except OSError:  # the child closed its end
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    return code, b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def packed(folders: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from stoker import pack

    out = tmp_path_factory.mktemp("bars-packed") / "packed"
    pack(folders, out, store="pixels", shard_samples=8, workers=0, progress=False)
    return out


COMMANDS = {
    "make-data": ["make-data", "digiface", "made", "--n", "300", "--classes", "3"],
    "pack": ["pack", "{data}", "packed", "--store", "pixels", "--workers", "0", "--shard-samples", "8"],
    "verify": ["verify", "{packed}", "--workers", "0"],
    "bench": ["bench", "{data}", "--methods", "files,shards-pixels", "--workers", "0", "--batch-size", "8",
              "--limit-seconds", "0.2", "--out", "bench"],
    "tune": ["tune", "{data}", "--budget", "5s", "--batch-size", "8", "--max-workers", "0", "--out", "loader.toml"],
    "train": ["train", "--data", "{data}", "--epochs", "1", "--batch-size", "8", "--workers", "0", "--image-size", "16",
              "--log-dir", "runs", "--name", "quiet", "--no-adapt"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_long_command_draws_no_bar_into_a_log(name: str, folders: Path, packed: Path, tmp_path: Path) -> None:
    """Redirected to files: the command's lines, not one bar frame."""
    args = [a.format(data=folders, packed=packed) for a in COMMANDS[name]]
    code, out, err = _to_files(args, tmp_path, name)
    assert code == 0, (name, out[-2000:], err[-3000:])
    assert _frames(out) == 0 and _frames(err) == 0, (name, err[-1500:])
    assert out.strip() or err.strip(), name  # it still says what it did


def test_a_bar_on_a_terminal_and_none_under_quiet(folders: Path, tmp_path: Path) -> None:
    code, shown = _on_terminal(["pack", str(folders), "a", "--store", "pixels", "--workers", "0"], tmp_path)
    assert code == 0, shown[-2000:]
    assert _frames(shown) > 0, shown[-2000:]  # the bar is drawn on a terminal
    code, quiet = _on_terminal(["pack", str(folders), "b", "--store", "pixels", "--workers", "0", "--quiet"], tmp_path)
    assert code == 0, quiet[-2000:]
    assert _frames(quiet) == 0 and "packed 48 samples" in quiet, quiet[-2000:]


@pytest.mark.parametrize("command", ["demo", "pack", "bench", "tune", "verify"])
def test_every_long_command_takes_quiet(command: str) -> None:
    from click.testing import CliRunner

    from stoker.cli.main import main

    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "--quiet" in result.output


def test_quiet_ends_with_its_command(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`--quiet` in a command run in-process leaves no quiet behind for what runs next."""
    import os

    from click.testing import CliRunner

    from stoker.cli.main import main as cli
    from stoker.terminal import QUIET_ENV

    before = os.environ.get(QUIET_ENV)
    result = CliRunner().invoke(cli, ["make-data", "ids", str(tmp_path / "ids"), "--n", "20", "--classes", "2"])
    assert result.exit_code == 0, result.output
    CliRunner().invoke(cli, ["verify", str(tmp_path / "ids"), "--quiet", "--workers", "0"])  # no shard set: fails after --quiet
    assert os.environ.get(QUIET_ENV) == before
