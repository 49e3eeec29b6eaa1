"""bench: every method x workers in the JSON with the right counts; a wrong method is not timed."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stoker import ClassFolderDataset, ConfigError
from stoker.bench import BenchData, LoaderSettings, Method, bench, quick_bench, render_markdown, save_report
from stoker.bench.methods import build_files
from stoker.bench.report import recommendation, result_notes


class _DropsFirstSample:
    """A loader that loses one sample per epoch: the bug the benchmark must catch."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        for i, (images, labels) in enumerate(self.loader):
            yield (images[1:], labels[1:]) if i == 0 else (images, labels)


def _build_dropping(data: BenchData, settings: LoaderSettings) -> Iterable[Any]:
    return _DropsFirstSample(build_files(data, settings))


DROPPING = Method("drops-one", "decode", _build_dropping)


@pytest.fixture(scope="module")
def result(tiny_root: Path):
    return bench(
        ClassFolderDataset(tiny_root),
        methods=["files", "pipe", "shards-encoded", "shards-pixels", DROPPING],
        workers=[0, 1],
        batch_size=8,
        device="cpu",
        limits_time_s=0.05,
        progress=False,
    )


def test_every_method_and_setting_is_in_the_json(result, tmp_path: Path) -> None:
    paths = save_report(result, tmp_path)
    report = json.loads(paths["json"].read_text())
    runs = {(r["method"], r["workers"], r["backend"]): r for r in report["runs"]}
    methods = ("files", "pipe", "shards-encoded", "shards-pixels", "drops-one")
    assert set(runs) == {(m, w, "process") for m in methods for w in (0, 1)}
    for (method, _, _), run in runs.items():
        if method != "drops-one":
            assert run["status"] == "ok", run["reason"]
            assert run["samples"] == 40 and run["label_checksum"] == report["expected_checksum"]
            assert run["img_per_s"] > 0 and 0 < run["fraction_of_limit"]
    assert report["limits"]["decode_img_per_s"] > 0 and report["samples"] == 40
    assert set(report["pack_s"]) == {"encoded", "pixels"} and report["limits"]["sequential_read_bytes_per_s"] > 0
    assert paths["png"].stat().st_size > 0 and "| workers |" in paths["markdown"].read_text()


def test_a_method_that_drops_a_sample_is_incorrect_and_not_timed(result) -> None:
    for workers in (0, 1):
        run = result.run("drops-one", workers, "process")
        assert run.status == "incorrect" and "39 samples" in run.reason and "1 missing" in run.reason
        assert run.img_per_s is None and run.epoch_s is None
    table = render_markdown(result)
    assert "INCORRECT" in table
    assert any("drops-one" in note and "INCORRECT" in note for note in result_notes(result))


def test_the_thread_backend_runs_and_a_stream_is_marked_unsupported_on_it(tiny: ClassFolderDataset) -> None:
    result = bench(tiny, methods=["files", "pipe"], workers=[2], backends=["thread"], batch_size=8,
                   device="cpu", limits_time_s=0.05, progress=False)
    assert result.run("files", 2, "thread").status == "ok"
    assert result.run("pipe", 2, "thread").status == "unsupported"
    assert "—" in render_markdown(result)


def test_a_shuffle_buffer_too_small_for_class_sorted_files_is_flagged(tiny: ClassFolderDataset) -> None:
    result = bench(tiny, methods=["pipe"], workers=[0], batch_size=8, shuffle_buffer=2,
                   device="cpu", limits_time_s=0.05, progress=False)
    run = result.run("pipe", 0)
    assert run.status == "ok" and run.shuffle is not None and run.shuffle.verdict == "poor"
    flagged = [note for note in result_notes(result) if "shuffle buffer of 2 is too small" in note]
    assert len(flagged) == 1 and "--shuffle-buffer" in flagged[0]


def test_max_seconds_gives_a_partial_run(tiny: ClassFolderDataset) -> None:
    result = bench(tiny, methods=["files"], workers=[0], batch_size=4, max_seconds=1e-6,
                   device="cpu", limits_time_s=0.05, progress=False)
    run = result.run("files", 0)
    assert run.status == "partial" and run.samples == 4 and run.img_per_s is not None
    assert "partial" in render_markdown(result)


def test_train_mode_reports_the_data_wait_share(tiny: ClassFolderDataset) -> None:
    result = bench(tiny, methods=["files"], workers=[0], mode="train", model="small_cnn", batch_size=20,
                   device="cpu", limits_time_s=0.05, progress=False)
    run = result.run("files", 0)
    assert run.status == "ok" and 0.0 < run.data_wait_share < 1.0


def test_bad_arguments_are_config_errors(tiny: ClassFolderDataset) -> None:
    with pytest.raises(ConfigError, match="unknown method"):
        bench(tiny, methods=["nope"])
    with pytest.raises(ConfigError, match="workers"):
        bench(tiny, methods=["files"], workers=[-1])
    with pytest.raises(ConfigError, match="backends"):
        bench(tiny, methods=["files"], backends=["gpu"])


def test_quick_bench_echoes_the_table_for_the_demo(tiny: ClassFolderDataset) -> None:
    lines: list[str] = []
    result = quick_bench(tiny, echo=lines.append, workers=(0,), batch_size=8)
    text = "\n".join(lines)
    assert "| workers | files | pipe | shards-encoded | shards-pixels |" in text and "Limits on this machine" in text
    assert all(r.status == "ok" for r in result.runs)
    # the wait before the table says what it is doing: the limits, the packing, each run as it ends
    table = next(i for i, line in enumerate(lines) if "| workers |" in line)
    steps = lines[:table]
    assert steps[0].startswith("   measuring the limits of this machine")
    assert any(line.startswith("   packing ") for line in steps)
    assert sum(line.startswith("   [") for line in steps) == len(result.runs)


def test_every_run_of_a_method_is_measured_against_the_same_machine_limit(result) -> None:
    for method in ("files", "shards-encoded", "shards-pixels"):
        runs = [result.run(method, w) for w in (0, 1)]
        limits = {r.extra["limit_img_per_s"] for r in runs}
        sequential = method.startswith("shards")
        work = "pixels" if method == "shards-pixels" else "decode"
        # these runs read through the page cache (not --cold): they are held to its rate, not the disk's
        assert limits == {result.limits.machine_limit(work, sequential=sequential, cached=True)[0]}
        # CPU time ticks in 10 ms steps: a tiny run may read 0, but is always reported
        assert all(r.cpu_s_per_1k_img is not None and r.peak_memory_bytes > 0 for r in runs)
    assert recommendation(result).startswith("Recommendation: use ")


def test_a_stream_over_a_reused_unshuffled_pack_is_scored_per_workers_and_flagged(tiny_root: Path, tmp_path: Path) -> None:
    from stoker.packer import pack

    pack(tiny_root, tmp_path / "pixels", store="pixels", shuffle=False, progress=False, workers=0)
    result = bench(ClassFolderDataset(tiny_root), methods=["shards-pixels"], workers=[0], batch_size=8, packed=tmp_path,
                   shuffle_buffer=2, device="cpu", limits_time_s=0.05, progress=False)
    assert result.run("shards-pixels", 0).status == "ok"
    assert set(result.stream_quality) == {"pixels"} and result.stream_quality["pixels"][0].verdict == "poor"
    text = render_markdown(result)
    assert "Mixing of a ShardStream over these shards" in text and "pixels: 0 workers" in text
    notes = result_notes(result)
    assert any("ShardStream over the pixels shards is not well mixed" in note for note in notes)
    assert result.stream_fixes["pixels"].startswith("with 0 workers, ")  # the setting that fixes it, in the note
    assert any(f"To fix it, {result.stream_fixes['pixels']}" in note for note in notes)
    assert result.to_dict()["stream_quality"]["pixels"]["0"]["verdict"] == "poor"
