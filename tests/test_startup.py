"""What a process that decodes nothing does not import: torchvision (with its torch._dynamo, a second) and pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from stoker.packer import pack

_CHILD = r"""
import sys
from stoker.shards import ShardDataset
data = ShardDataset(sys.argv[1], "train")
data.__getitems__([0, 1])
print(sorted(m for m in ("torchvision", "pandas") if m in sys.modules))
"""


def test_reading_a_pixel_set_imports_neither_torchvision_nor_pandas(tmp_path: Path) -> None:
    from PIL import Image

    for label in range(2):
        (tmp_path / "src" / str(label)).mkdir(parents=True)
        for j in range(3):
            Image.fromarray(np.full((8, 8, 3), 40 * j + label, np.uint8)).save(tmp_path / "src" / str(label) / f"{j}.png")
    pack(tmp_path / "src", tmp_path / "packed", store="pixels", workers=0, progress=False)
    src = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "packed")], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": src, "PATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
