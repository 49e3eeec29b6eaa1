"""Every command stoker prints as a hint is one that runs.

Two parts: every hint written in the source (``stoker CMD --flag``, ``torchrun ...``,
``pip install 'stoker[extra]'``) names a real command, real flags of it and real extras;
and the hints of a distributed run, as stoker prints them, are run: the torchrun launch
the launch errors suggest starts a 2-rank ``stoker train`` (``-m stoker``), which is
interrupted, and the resume command its one "interrupted" line gives continues the run.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import stoker
from stoker.cli.main import main
from stoker.errors import ConfigError

SRC = Path(stoker.__file__).resolve().parent
ROOT = SRC.parents[1]
TIMEOUT_S = 240

_HINT = re.compile(
    r"torchrun (?=-)[^`()\n]*|stoker (?:" + "|".join(map(re.escape, main.commands)) + r")\b[^`()\n;]*|pip install [^`()\n;]*"
)


def _messages(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string of a module except docstrings, f-strings with ``{}`` where a value goes."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
            docstrings.update(id(v) for v in node.values)
    found += [(node.lineno, node.value) for node in ast.walk(tree)
              if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]
    return found


def _source_hints() -> list[tuple[str, str]]:
    return [(f"{path.relative_to(SRC.parent)}:{line}", match.group(0).strip())
            for path in sorted(SRC.rglob("*.py"))
            for line, text in _messages(ast.parse(path.read_text(encoding="utf-8")))
            for match in _HINT.finditer(text)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC.parent), env.get("PYTHONPATH")) if p)
    return env


def _class_folders(root: Path) -> Path:
    from PIL import Image

    from stoker.sources.synthetic import render

    for label in range(4):
        (root / str(label)).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(render(label, 16, 16, seed=0, index=label * 8 + i), "RGB").save(root / str(label) / f"{i}.png")
    return root


def _launch_hints(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The torchrun commands of the two launch errors, as stoker words them."""
    from stoker.train.engine.distributed import _env_int, join_launch

    texts = []
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ConfigError) as bad_rank:
        _env_int("RANK")
    texts.append(str(bad_rank.value))
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as no_rendezvous:
        join_launch("cpu")
    texts.append(str(no_rendezvous.value))
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    hints = [m.group(0) for text in texts for m in re.finditer(r"torchrun [^()]*?-m stoker train \.\.\.", text)]
    assert len(hints) == 2, texts
    return hints


def test_every_hint_in_the_source_names_a_real_command_flags_and_extras() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    hints = _source_hints()
    assert len(hints) > 30  # the scan finds them (today about fifty)
    wrong = []
    for where, hint in hints:
        if hint.startswith("pip install"):
            named = re.findall(r"stoker\[([^\]]+)\]", hint)
            if not named or any(e != "{}" and e not in extras for e in named):
                wrong.append(f"{where}: {hint!r} names an extra pyproject.toml does not declare")
            continue
        if hint.startswith("torchrun"):
            if "-m stoker" not in hint:
                wrong.append(f"{where}: {hint!r}: torchrun runs a script or a module: -m stoker")
            continue
        name = hint.split()[1].rstrip(":,.")  # "stoker demo: ..." is a hint too
        options = {opt for param in main.commands[name].params for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", [])}
        for flag in re.findall(r"(?<!\S)--[a-z][a-z0-9-]*", hint):
            if flag not in options | {"--help"}:
                wrong.append(f"{where}: {hint!r}: `stoker {name}` has no {flag}")
    from stoker.fs.remote import _EXTRAS  # the extras the URL readers' hints fill in

    wrong += [f"stoker.fs: pip install 'stoker[{e}]' is not an extra" for e in {*_EXTRAS.values(), "remote"} - extras]
    assert not wrong, "hints that would not run:\n" + "\n".join(wrong)


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs torch.distributed with gloo")
def test_the_torchrun_and_resume_hints_of_a_distributed_run_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _class_folders(tmp_path / "data")
    runs = tmp_path / "runs"
    train_args = ["--data", str(data), "--epochs", "1000", "--batch-size", "4", "--workers", "0", "--device", "cpu",
                  "--log-dir", str(runs), "--name", "ddp", "--no-progress"]
    # 1. The launch errors' hint, with 2 for N and the run's arguments for "...": a 2-rank run of `-m stoker`.
    hints = {" ".join(shlex.split(h.replace(" N ", " 2 "))) for h in _launch_hints(monkeypatch)}
    assert hints == {"torchrun --standalone --nproc-per-node 2 -m stoker train ..."}, hints
    launch = [*shlex.split(hints.pop())[:-1], *train_args]
    run_dir = runs / "ddp"
    with (tmp_path / "out.txt").open("w") as out:
        proc = subprocess.Popen(launch, env=_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + TIMEOUT_S
            while not (run_dir / "last.pt").is_file() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert (run_dir / "last.pt").is_file(), (tmp_path / "out.txt").read_text()[-4000:]
            proc.send_signal(signal.SIGINT)  # Ctrl-C to torchrun: it passes it to both ranks, which stop together
            proc.wait(timeout=TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
    output = (tmp_path / "out.txt").read_text()
    assert "run folder:" not in output
    # 2. One "interrupted" line for the run (rank 0's), with the command that continues it.
    lines = [line for line in output.splitlines() if line.startswith("interrupted; ")]
    assert len(lines) == 1, output[-4000:]
    resume = lines[0].partition("continue with ")[2]
    assert resume == f"torchrun --standalone --nproc-per-node 2 -m stoker train --log-dir {runs} --name ddp --resume", lines
    done = int(torch.load(run_dir / "last.pt", map_location="cpu", weights_only=True)["epoch"])
    again = subprocess.run([*shlex.split(resume), "--epochs", str(done + 1)], env=_env(), capture_output=True, text=True,
                           timeout=TIMEOUT_S)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-4000:]
    assert again.stdout.count("run folder:") == 1 and f"resuming {run_dir}: it was interrupted" in again.stdout
