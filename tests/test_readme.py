"""Every Python block of README.md runs, in order, on the data its own make-data commands describe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from stoker.sources.synthetic import make_celeba, make_digiface, make_ids

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text(encoding="utf-8")
    blocks = python_blocks(text)
    assert len(blocks) >= 5
    # The sizes the README's "stoker make-data" lines give, read from the README itself.
    made = {kind: int(n) for kind, n in re.findall(r"stoker make-data (\w+)\s+data/\w+\s+--n (\d+)", text)}
    assert set(made) == {"digiface", "celeba", "ids"}
    monkeypatch.chdir(tmp_path)
    for kind, make in (("digiface", make_digiface), ("celeba", make_celeba), ("ids", make_ids)):
        make(tmp_path / "data" / kind, n=made[kind], classes=4, progress=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two cores shared with loader workers (see tests/train/conftest.py)
    namespace: dict[str, object] = {"__name__": "readme"}
    try:
        for number, block in enumerate(blocks, start=1):
            exec(compile(block, f"README.md python block {number}", "exec"), namespace)  # noqa: S102
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "runs" / "shards-bs128" / "metrics.csv").is_file()


def test_readme_train_toml_is_a_valid_config(tmp_path: Path) -> None:
    """The README shows train.toml in full, and its commands use it: it must pass the config's checks."""
    from stoker.train.runner.config import load_config

    blocks = re.findall(r"^```toml\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)
    assert len(blocks) == 1 and "train.toml" in README.read_text(encoding="utf-8")
    path = tmp_path / "train.toml"
    path.write_text(blocks[0], encoding="utf-8")
    config = load_config(path)
    assert (config.model.name, config.run.epochs, config.data.batch_size) == ("resnet18", 30, 128)
    assert config.data.path == ["packed"] and config.run.tags == {"category": "shards"}
