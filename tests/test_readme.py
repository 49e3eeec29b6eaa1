"""Every code block of README.md and docs/ runs, page by page, in order, on generated data.

A page's ``bash`` blocks run in ``bash -euo pipefail`` and its ``python`` blocks in one
namespace, in the order they appear, in a fresh folder holding the data the quick start
makes (``data/digiface``, ``data/celeba``, ``data/ids``; a page that makes its own data
starts empty). ``toml`` blocks must be valid configs. A block that cannot run here (it
needs a GPU, a bucket, several machines, or is the suite itself) says so on its first
line, ``# not run by the test suite: <reason>``, and the reason is checked to be there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from stoker.sources.synthetic import make_celeba, make_digiface, make_ids

ROOT = Path(__file__).resolve().parents[1]
# Pages whose blocks a test of their own runs (in a child process, with its own checks).
RUN_ELSEWHERE = {ROOT / "docs" / "guides" / "lightning.md": "tests/train/test_lightning_guide.py"}
PAGES = sorted(p for p in [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")] if p not in RUN_ELSEWHERE)
NOT_RUN = "# not run by the test suite:"
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
_MAKE_DATA = re.compile(r"stoker make-data (\w+)\s+data/\w+\s+--n (\d+)")


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of a Markdown page, in order."""
    return [(language, code) for language, code in _BLOCK.findall(text)]


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.fixture(scope="session")
def made_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data the quick start makes, at the sizes its ``stoker make-data`` lines give."""
    sizes = {kind: int(n) for kind, n in _MAKE_DATA.findall((ROOT / "docs" / "quickstart.md").read_text("utf-8"))}
    assert set(sizes) == {"digiface", "celeba", "ids"}
    root = tmp_path_factory.mktemp("made")
    for kind, make in (("digiface", make_digiface), ("celeba", make_celeba), ("ids", make_ids)):
        make(root / "data" / kind, n=sizes[kind], classes=4, progress=False)
    return root


@pytest.mark.timeout(900)  # a page runs several CLI commands, each starting torch
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_code_blocks_run(page: Path, made_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = page.read_text(encoding="utf-8")
    found = blocks(text)
    runnable = [(language, code) for language, code in found if not code.startswith(NOT_RUN)]
    for language, code in found:
        if code.startswith(NOT_RUN):
            reason = code.splitlines()[0].removeprefix(NOT_RUN).strip()
            assert len(reason) >= 10, f"{_page_id(page)}: a block not run must say why: {code.splitlines()[0]!r}"
        else:
            assert language in {"", "bash", "python", "toml", "text", "json"}, f"{_page_id(page)}: block {language!r}"
    if not any(language in {"bash", "python"} for language, _ in runnable):
        return
    if not _MAKE_DATA.search(text):  # pages that make their data start empty
        shutil.copytree(made_data / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # two cores shared with loader workers (see tests/train/conftest.py)
    namespace: dict[str, object] = {"__name__": "docs"}
    try:
        for number, (language, code) in enumerate(runnable, start=1):
            where = f"{_page_id(page)} block {number}"
            if language == "python":
                exec(compile(code, where, "exec"), namespace)  # noqa: S102
            elif language == "bash":
                result = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env,
                                        capture_output=True, text=True, timeout=280)
                assert result.returncode == 0, f"{where} failed:\n{code}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            elif language == "toml":
                _check_toml(code, tmp_path, where)
    finally:
        torch.set_num_threads(threads)


def _check_toml(code: str, folder: Path, where: str) -> None:
    """A config block must pass the config's checks (a [data] table of tuned settings alone too)."""
    from stoker.train.runner.config import load_config

    path = folder / "block.toml"
    path.write_text(code, encoding="utf-8")
    if "[model]" in code or "[run]" in code:
        load_config(path)


def test_docs_name_the_blocks_they_do_not_run() -> None:
    """The marker is what the runner looks for: a reason written another way would run the block."""
    for page in PAGES:
        for _language, code in blocks(page.read_text(encoding="utf-8")):
            first = code.splitlines()[0] if code else ""
            assert not (first.lower().startswith("# not run") and not first.startswith(NOT_RUN)), (page, first)


def test_readme_is_for_newcomers() -> None:
    """At most 400 lines, no issue numbers, commit hashes or build-machine paths."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    assert not re.search(r"\bissue \d+|\bcommit [0-9a-f]{7}|/work/|/tmp/", text)
