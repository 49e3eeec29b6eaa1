"""The bench report tells the answer: a recommendation, one meaning of a share, cost per cell, a readable chart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.bench import BenchResult, Limits, MethodResult, recommendation, render_markdown, save_report
from stoker.bench.monitor import ProcessMonitor
from stoker.bench.report import figure, report_dict, step_img_per_s

# Decode-bound PNGs on 2 cores: 1,000 img/s per core; reads and copies are far faster.
_LIMITS = Limits(cores=2, decode_img_per_s=1000.0, memcpy_bytes_per_s=1e10, read_bytes_per_s=1e9, read_cold=True,
                 encoded_bytes_per_img=10_000.0, decoded_bytes_per_img=30_000.0, sequential_read_bytes_per_s=2e9)


def _run(method: str, workers: int, img_per_s: float, status: str = "ok", work: str = "decode") -> MethodResult:
    run = MethodResult(method, workers, "process", status=status, samples=1000 if status != "incorrect" else 999,
                    cpu_seconds=2.5, peak_rss_bytes=2_000_000_000, peak_pss_bytes=1_500_000_000)
    if status in ("ok", "partial"):
        run.img_per_s, run.epoch_s = img_per_s, 1000 / img_per_s
        limit, name = _LIMITS.machine_limit("decode" if work == "decode" else "pixels", sequential=method.startswith("shards"))
        run.extra.update(limit_img_per_s=limit, limit_name=name, fraction_of_limit=img_per_s / limit)
    else:
        run.reason = "saw 999 samples in an epoch of 1000 (1 missing)"
    return run


def _result(runs: list[MethodResult]) -> BenchResult:
    return BenchResult(description="photos", samples=1000, num_classes=10, size=None, batch_size=64, mode="load",
                       model=None, epochs=1, max_seconds=None, limits=_LIMITS, runs=runs)


def _decode_bound() -> BenchResult:
    return _result([
        _run("files", 0, 900.0), _run("files", 2, 1370.0),
        _run("shards-encoded", 2, 1500.0),
        _run("shards-pixels", 0, 27_400.0, work="pixels"), _run("shards-pixels", 2, 20_000.0, work="pixels"),
    ])


def test_the_report_ends_with_a_recommendation_and_its_ratio_to_plain_files_at_their_best() -> None:
    result = _decode_bound()
    line = recommendation(result)
    assert line.startswith("Recommendation: use pixel shards with 0 workers: 27,400 img/s, 20x plain files at their best")
    assert "(2 workers, 1,370 img/s)" in line
    # decode is the limit of the encoded images: the line makes the case for pixel shards, with the figures
    assert "decoding is the limit" in line and "decode nothing" in line
    assert ("(encoded shards, 2 workers) keeps up 1,500 img/s after its first batch, 75% of the 2,000 img/s this "
            "machine decodes on 2 cores") in line
    assert "27,400 img/s after their first batch here (0 workers), 18x the fastest method that decodes" in line
    assert "pack them once with `stoker pack DATA OUT --store pixels`. Only loading was timed: " in line
    text = render_markdown(result)
    assert text.rstrip().splitlines()[-1] == f"**{line}**" and text.count("Recommendation:") == 1
    assert render_markdown(result, details=False).rstrip().endswith(f"**{line}**")
    assert "Recommendation:" not in render_markdown(result, recommend=False)
    assert report_dict(result)["recommendation"] == line


def _trained(run: MethodResult, wait: float) -> MethodResult:
    run.data_wait_share = wait
    return run


def test_in_train_mode_the_case_for_pixel_shards_names_what_the_step_could_take() -> None:
    # the step waited 75% of the time for encoded shards: it could take 4x their rate
    result = _result([_trained(_run("files", 2, 1400.0), 0.8), _trained(_run("shards-encoded", 2, 1600.0), 0.75)])
    result.size = (112, 112)
    line = recommendation(result)
    assert "keeps up 1,600 img/s after its first batch, 80% of the 2,000 img/s" in line
    assert "the training step alone could take 6,400 img/s" in line
    assert "`stoker pack DATA OUT --store pixels --size 112x112`" in line
    assert step_img_per_s(result) == pytest.approx(6400.0)


def test_no_case_for_pixel_shards_when_the_step_or_something_else_is_the_limit() -> None:
    # the step is slower than decoding: the data hardly waited
    step_bound = _result([_trained(_run("files", 2, 1800.0), 0.05)])
    line = recommendation(step_bound)
    assert "the training step (about 1,895 img/s alone) is the limit here, not decoding" in line
    assert "--store pixels" not in line
    # decoding far below the machine's decode rate: not decode-bound (more workers would help)
    assert "decoding is the limit" not in recommendation(_result([_run("files", 2, 1100.0)]))
    # what a run keeps up after its first batch counts, not its start-up
    started = _run("files", 2, 1100.0)
    started.steady_img_per_s = 1700.0
    assert "keeps up 1,700 img/s after its first batch, 85%" in recommendation(_result([started]))
    # pixel shards measured no faster: nothing to argue for
    slow_pixels = recommendation(_result([_run("shards-encoded", 2, 1800.0), _run("shards-pixels", 0, 1500.0, work="pixels")]))
    assert "pixel shards were no faster here (1,500 img/s)" in slow_pixels and "--store pixels" not in slow_pixels


def test_without_pixel_shards_a_decode_bound_report_suggests_them() -> None:
    line = recommendation(_result([_run("files", 0, 900.0), _run("files", 2, 1800.0)]))
    assert line.startswith("Recommendation: use plain files with 2 workers: 1,800 img/s")
    assert "--methods files,shards-pixels" in line and "--store pixels" in line


def test_an_incorrect_run_is_never_recommended_and_nothing_correct_says_so() -> None:
    line = recommendation(_result([_run("files", 0, 900.0), _run("shards-pixels", 0, 1e6, status="incorrect")]))
    assert "use plain files with 0 workers" in line
    assert "none" in recommendation(_result([_run("files", 0, 1.0, status="incorrect")]))


def test_a_share_means_the_same_for_1_and_2_workers_and_is_explained_once() -> None:
    # 1 worker at 1,000 img/s and 2 workers at 2,000 img/s: the second worker doubled the rate
    assert _LIMITS.machine_limit("decode") == (2000.0, "decode")
    one, two = _run("files", 1, 1000.0), _run("files", 2, 2000.0)
    assert one.extra["fraction_of_limit"] == pytest.approx(0.5) and two.extra["fraction_of_limit"] == pytest.approx(1.0)
    text = render_markdown(_result([one, two]))
    assert "(50%)" in text and "(100%)" in text
    assert text.count("In brackets: img/s as a share of the most this machine allows") == 1
    assert "with all its 2 cores" in text and "same yardstick for every row" in text


def test_every_cell_shows_cpu_seconds_per_1000_images_and_peak_memory(tmp_path: Path) -> None:
    result = _decode_bound()
    table = render_markdown(result, details=False)
    assert table.count("2.50 CPU-s/1k img · 1.50 GB") == len(result.runs)
    report = json.loads(save_report(result, tmp_path)["json"].read_text())
    for run in report["runs"]:
        assert run["cpu_seconds"] == 2.5 and run["cpu_s_per_1k_img"] == pytest.approx(2.5)
        assert run["peak_memory_bytes"] == 1_500_000_000


def test_the_chart_labels_every_tick_and_marks_crosses_only_when_there_are_some() -> None:
    from matplotlib import pyplot as plt

    fig = figure(_decode_bound())
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert len(labels) >= 3 and all(labels)  # a range of one decade or more, every tick readable
        assert not ax.yaxis.get_minorticklocs().size  # no unlabelled minor ticks
        assert [t.get_text() for t in ax.get_xticklabels()] == ["files", "shards-encoded", "shards-pixels"]
        assert "incorrect" not in ax.get_title()
        assert "27,400" in [t.get_text() for t in ax.texts]  # every bar carries its rate
    finally:
        plt.close(fig)
    fig = figure(_result([_run("files", 0, 900.0), _run("files", 2, 1.0, status="incorrect")]))
    try:
        assert "x: an incorrect or failed run" in fig.axes[0].get_title()
        labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
        assert labels and all(labels)  # one bar: still a labelled axis
    finally:
        plt.close(fig)


_BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\n"


def test_the_monitor_counts_a_worker_process_that_exits_between_polls() -> None:
    # Polls every 100 s: the worker is never seen running; its CPU time must still count.
    with ProcessMonitor(interval_s=100.0, pss_interval_s=0) as monitor:
        subprocess.run([sys.executable, "-c", _BURN], check=True)
    assert monitor.cpu_seconds >= 0.3


def test_the_quick_bench_of_the_demo_prints_the_recommendation_once_as_its_last_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import stoker.bench.benchmark as benchmark

    result = _decode_bound()
    monkeypatch.setattr(benchmark, "run_bench", lambda plan, echo=None: result)
    printed: list[str] = []
    benchmark.quick_bench("photos", echo=printed.append)
    text = "\n".join(printed)
    assert text.count("Recommendation:") == 1 and printed[-1] == recommendation(result)


def test_a_warm_run_is_held_to_the_page_cache_rate_and_a_cold_one_to_the_disk() -> None:
    # The 662 % of issue 22: tiny files read from the page cache, measured against the disk's file-by-file rate.
    limits = Limits(cores=2, decode_img_per_s=50_000.0, memcpy_bytes_per_s=1e10, read_bytes_per_s=5e6, read_cold=True,
                    encoded_bytes_per_img=1_000.0, decoded_bytes_per_img=2_400.0, cached_read_bytes_per_s=6e7)
    assert limits.machine_limit("decode") == (5_000.0, "storage read")  # --cold: the disk's 5,000 files/s
    # through the page cache: one core's 60,000 files/s x 2 cores, so decoding (100,000 img/s) binds
    assert limits.bounds("decode", 2, cached=True)["page-cache read"] == pytest.approx(120_000.0)
    assert limits.machine_limit("decode", cached=True) == (100_000.0, "decode")
    assert "page-cache read 60 MB/s per core" in limits.summary()


def test_a_rate_above_its_limit_says_so_instead_of_a_share_over_100_percent() -> None:
    run = _run("files", 0, 900.0)
    run.extra.update(limit_name="storage read", fraction_of_limit=6.62)
    text = render_markdown(_result([run, _run("files", 2, 1400.0)]))
    assert "662%" not in text and "above the storage read limit" in text
    assert "the data came from the page cache, not the disk" in text
    assert "(70%)" in text  # a share within the limit is still a number
