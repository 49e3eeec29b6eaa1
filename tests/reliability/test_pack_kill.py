"""``kill -9`` of ``stoker pack`` leaves no worker processes behind (a real kill, a real pack)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
from PIL import Image

from .conftest import SRC


def _children(pid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.add(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(condition: object, limit_s: float) -> bool:
    """Poll ``condition()`` until true or ``limit_s`` passes (a generous limit, not a measurement)."""
    stop = threading.Event()
    for _ in range(int(limit_s / 0.005)):
        if condition():  # type: ignore[operator]
            return True
        stop.wait(0.005)
    return False


def test_kill_9_of_pack_takes_its_workers_with_it(tmp_path: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 255, (256, 256, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    for label in range(2):
        (tmp_path / "cls" / str(label)).mkdir(parents=True)
        for i in range(1500):
            (tmp_path / "cls" / str(label) / f"{i:05d}.png").write_bytes(buffer.getvalue())
    env = {**os.environ, "PYTHONPATH": SRC}
    pack = subprocess.Popen(
        [sys.executable, "-c", "from stoker.cli.main import main; main()", "pack", str(tmp_path / "cls"),
         str(tmp_path / "out"), "--store", "pixels", "--size", "32x32", "--shard-samples", "50", "--workers", "2",
         "--quiet"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    workers: set[int] = set()
    try:
        assert _wait_for(lambda: len(_children(pack.pid)) >= 2 or pack.poll() is not None, 180)
        workers = _children(pack.pid)
        assert pack.poll() is None and workers, "the pack ended before its workers could be seen"
        os.kill(pack.pid, signal.SIGKILL)
        pack.wait(timeout=60)
        assert _wait_for(lambda: not any(_alive(w) for w in workers), 60), "workers outlived a kill -9 of pack"
    finally:
        for w in workers:  # never leave them behind, whatever happened
            if _alive(w):
                os.kill(w, signal.SIGKILL)
        if pack.poll() is None:
            pack.kill()
        pack.wait()
    assert not (tmp_path / "out" / "manifest.json").exists()
