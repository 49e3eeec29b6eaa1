"""The method registry and the bench plan: one place names a loading method, everything reads it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from stoker import ClassFolderDataset, ConfigError
from stoker.bench import METHODS, BenchData, BenchPlan, LoaderSettings, Method, register_method, run_bench
from stoker.bench.methods import build_files, method_names
from stoker.loading.backends import BACKENDS


def _build_files_again(data: BenchData, settings: LoaderSettings) -> Iterable[Any]:
    return build_files(data, settings)


@pytest.fixture()
def registered() -> Iterator[Method]:
    method = register_method(Method("files-again", "decode", _build_files_again))
    try:
        yield method
    finally:
        del METHODS[method.name]


def test_the_builtin_methods_are_registered_in_order() -> None:
    assert list(METHODS) == ["files", "pipe", "shards-encoded", "shards-pixels", "shards-encoded-gpu"]
    assert method_names() == ("files", "pipe", "shards-encoded", "shards-pixels")
    assert method_names(cuda=True) == tuple(METHODS)
    assert method_names(tunable=True) == ("files", "shards-encoded", "shards-pixels")
    assert METHODS["pipe"].backends == ("process",) and METHODS["files"].backends == BACKENDS
    assert METHODS["shards-encoded-gpu"].backends == ("thread",) and METHODS["shards-encoded-gpu"].needs_cuda
    assert {name: m.store for name, m in METHODS.items() if m.store} == {
        "shards-encoded": "encoded", "shards-pixels": "pixels", "shards-encoded-gpu": "encoded"}


def test_the_gpu_method_is_a_default_only_where_cuda_is_available() -> None:
    from stoker.bench.methods import resolve_methods

    names = [m.name for m in resolve_methods(None)]
    assert ("shards-encoded-gpu" in names) == torch.cuda.is_available()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="'shards-encoded-gpu' decodes on a CUDA device, and torch sees none"):
            resolve_methods(["files", "shards-encoded-gpu"])


def test_a_registered_method_is_offered_everywhere_by_name(registered: Method, tiny_root: Path) -> None:
    from stoker.cli.main import main

    assert LoaderSettings(method="files-again").method == "files-again"
    assert "files-again" in method_names(tunable=True)
    result = run_bench(BenchPlan(ClassFolderDataset(tiny_root), methods=["files-again"], workers=[0], batch_size=8,
                                 device="cpu", limits_time_s=0.05, progress=False))
    assert result.run("files-again", 0).status == "ok"
    with pytest.raises(ConfigError, match="already registered"):
        register_method(Method("files-again", "decode", _build_files_again))
    bad = CliRunner().invoke(main, ["bench", str(tiny_root), "--methods", "nope"])
    assert bad.exit_code == 1 and "files-again" in bad.output  # the error lists the registry


def test_a_method_and_a_plan_are_checked_when_made() -> None:
    with pytest.raises(ConfigError, match="work"):
        Method("odd", "magic", _build_files_again)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="backends"):
        Method("odd", "decode", _build_files_again, backends=("gpu",))
    with pytest.raises(ConfigError, match="unknown method"):
        BenchPlan("data", methods=["nope"])
    with pytest.raises(ConfigError, match="workers"):
        BenchPlan("data", workers=[-1])
    with pytest.raises(ConfigError, match="mode"):
        BenchPlan("data", mode="fly")
    plan = BenchPlan("data", methods=["files", "pipe"], workers=(0, 2), backends=BACKENDS)
    assert [(m.name, b, w) for m, b, w in plan.runs()][:3] == [("files", "process", 0), ("files", "process", 2), ("files", "thread", 0)]
    assert [m.name for m in BenchPlan("data").resolved_methods()] == list(method_names(cuda=torch.cuda.is_available()))


def test_a_pipe_settings_on_threads_is_refused() -> None:
    with pytest.raises(ConfigError, match="pipe runs on backend 'process' only"):
        LoaderSettings(method="pipe", backend="thread")
