"""Small data the reliability tests make themselves, and a runner for steps that could hang or crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

SRC = str(Path(__file__).resolve().parents[2] / "src")


def write_png(path: Path, seed: int = 0, size: tuple[int, int] = (8, 6)) -> Path:
    """A small RGB PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def run_isolated(code: str, timeout_s: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh Python (stoker from this checkout); a hang ends at ``timeout_s``.

    Returns the finished process; a timeout is returned as return code -9 with a note in stderr.
    """
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(exc.cmd, -9, out, f"timed out after {timeout_s} s (hang)")
