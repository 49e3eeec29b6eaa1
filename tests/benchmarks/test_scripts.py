"""Every benchmark script still runs end to end (tiny sizes; the numbers are not checked here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(script: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent / "src")}  # this checkout's stoker, not an installed one
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=cwd, capture_output=True, text=True, timeout=240, env=env,
    )
    said = [line for line in (done.stdout + done.stderr).splitlines() if "error" in line.lower() and "File " not in line]
    assert done.returncode == 0, "\n".join(said[-20:]) + "\n---\n" + done.stdout[-2000:] + done.stderr[-4000:]  # a rank's error line, not only the tail
    return done.stdout


def test_bench_shards_reports_every_target(tmp_path: Path) -> None:
    out = _run("bench_shards.py", "--n", "200", "--seconds", "0.3", "--only", "digiface", "--out", str(tmp_path), cwd=tmp_path)
    assert "pixels shards" in out and "target" in out


def test_bench_gpu_train_smoke_on_cpu(tmp_path: Path) -> None:
    out = _run("bench_gpu_train.py", "--allow-cpu", "--n", "48", "--classes", "4", "--epochs", "1",
               "--cases", "files:off+sync4", "--quiet", "--out", str(tmp_path / "gpu"), cwd=tmp_path)
    assert "| files:off+sync4 | 4 |" in out
    assert (tmp_path / "gpu" / "results.json").is_file()


def test_bench_ddp_gpu_smoke_on_cpu(tmp_path: Path) -> None:
    # Without CUDA: a tiny gloo run through torchrun -m stoker.cli.main train.
    import json

    _run("bench_ddp_gpu.py", "--out", str(tmp_path / "ddp"), cwd=tmp_path)
    result = json.loads((tmp_path / "ddp" / "ddp_results.json").read_text())
    assert result["ok"] and result["status"] == "finished" and result["img_per_s"] > 0
    assert 0 <= result["data_wait_share"] <= result["slowest_data_wait_share"] + 1e-9


def test_bench_decode_measures_every_part(tmp_path: Path) -> None:
    out = _run("bench_decode.py", "--n", "64", "--classes", "4", "--seconds", "0.1", "--rounds", "1",
               "--out", str(tmp_path / "decode"), cwd=tmp_path)
    for part in ("| gather |", "| jpeg |", "| png |", "| nvjpeg |"):
        assert part in out
    assert "torchvision Dataset + DataLoader" in out and "x baseline" in out
    assert "full decode, 2 processes at once" in out and "PNG decode, 2 processes at once" in out


def test_bench_gpu_train_issue_cases_smoke_on_cpu(tmp_path: Path) -> None:
    out = _run("bench_gpu_train.py", "--allow-cpu", "--n", "48", "--classes", "4", "--epochs", "1", "--batch-size", "16",
               "--model", "small_cnn", "--cases", "pixels:off", "jpeg:off", "nvjpeg:off", "synthetic:off", "--quiet",
               "--out", str(tmp_path / "gpu"), cwd=tmp_path)
    for case in ("pixels:off", "jpeg:off", "nvjpeg:off", "synthetic:off"):
        assert f"| {case} |" in out
    assert "nvJPEG decode on cpu" in out and "pixel shards:" in out


@pytest.mark.parametrize(
    ("script", "args", "expect"),
    [
        ("bench_loading.py", ("--n", "100", "--workers", "0", "--methods", "files,shards-pixels", "--out", "out"),
         "shards-pixels"),
        ("bench_shuffle_quality.py", ("--n", "5000", "--classes", "50"), "packed class-sorted"),
        ("bench_shuffle_quality.py", ("--n", "2000", "--classes", "20", "--blocks", "--shard-samples", "100"),
         "| 20 (all: the plain shuffle) |"),
        ("bench_threads.py", ("--n", "64", "--workers", "1", "--repeats", "1"), "lowered / default"),
        ("bench_png_guard.py", ("--quick", "--loader", "64", "--out", "png"), "encoded shards, thread x2 (libspng)"),
        ("bench_file_reader.py", ("--quick", "--out", "reader"), "| CPU seconds per image, all processes"),
        ("fuzz_decode.py", ("--cases", "40", "--baseline", "0", "--jpeg", "40"), "| **all** | 40 |"),
    ],
)
def test_small_benchmarks_run(tmp_path: Path, script: str, args: tuple[str, ...], expect: str) -> None:
    assert expect in _run(script, *args, cwd=tmp_path)


def test_bench_remote_reports_cold_and_warm(tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="bench_remote needs s3fs: pip install 'stoker[test]'")
    pytest.importorskip("moto.server", reason="bench_remote needs moto's server: pip install 'moto[server]'")
    caches = tmp_path / "caches"  # never the user's own cache folder in a test
    out = _run("bench_remote.py", "--n", "120", "--shard-samples", "40", "--size", "16", "--out", str(tmp_path / "r"),
               "--cache-dir", str(caches), cwd=tmp_path)
    assert "S3, cold cache" in out and "S3, warm cache" in out and "| local disk" in out
    assert f"cache folder {caches}" in out and "creating a file there takes" in out
    assert not any(caches.iterdir())  # the run's own folder in it is removed


def test_bench_remote_measures_the_client_cpu_per_gb(tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="bench_remote needs s3fs: pip install 'stoker[test]'")
    pytest.importorskip("moto.server", reason="bench_remote needs moto's server: pip install 'moto[server]'")
    caches = tmp_path / "caches"
    out = _run("bench_remote.py", "--n", "120", "--shard-samples", "40", "--size", "16", "--out", str(tmp_path / "r"),
               "--cache-dir", str(caches), "--cpu-rounds", "2", cwd=tmp_path)
    assert "client CPU per GB, cold stream / serial download" in out and "rate, cold stream / serial download" in out
    assert "\n2 | " in out  # a line per round
    assert not any(caches.iterdir())


def test_bench_remote_plan_reports_gets_and_hit_rates(tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="bench_remote needs s3fs: pip install 'stoker[test]'")
    pytest.importorskip("moto.server", reason="bench_remote needs moto's server: pip install 'moto[server]'")
    caches = tmp_path / "caches"
    out = _run("bench_remote.py", "--plan", "--n", "160", "--shard-samples", "20", "--size", "16", "--epochs", "1",
               "--limit-share", "0.5", "--out", str(tmp_path / "r"), "--cache-dir", str(caches), cwd=tmp_path)
    for readers in ("| 1 x 1 |", "| 2 x 1 |", "| 2 x 2 |"):
        assert readers in out
    assert "GETs / shard / epoch" in out and "plan / optimal / LRU" in out
    assert not any(caches.iterdir())  # the run's own folder in it is removed


def test_gpu_check_runs_its_parts_and_says_what_happened(tmp_path: Path) -> None:
    # On a machine without a GPU the GPU parts say so and the script still finishes: a lent GPU's
    # minutes must not be spent finding a broken script.
    out = tmp_path / "gpu"
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(BENCHMARKS.parent / "src")}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "quick"], env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert "== env" in summary and "== tests" in summary and "== fitsync" in summary
    assert summary.count("rc=0") >= 2  # env and tests
    if "available False" in summary:
        assert "no CUDA device" in summary


def test_bench_peers_quick_prints_every_ratio_by_round(tmp_path: Path) -> None:
    out = _run("bench_peers.py", "--quick", "--out", str(tmp_path / "peers"), cwd=tmp_path)
    for part in ("| jpeg | encoded JPEG shards", "| png | encoded PNG shards", "| pixels-png | pixel shards",
                 "| pixels-jpeg | pixel shards", "torch threads 1", "2-thread mapped copy (limit)"):
        assert part in out
    row = next(line for line in out.splitlines() if line.startswith("| pixels-jpeg |"))
    assert len(row.split("|")[4].split(" / ")) >= 5  # at least 5 interleaved rounds, each shown


def test_bench_lightning_threads_runs(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    out = _run("bench_lightning_threads.py", "--n", "48", "--size", "16", "--repeats", "1", cwd=tmp_path)
    assert "ratio:" in out and "| ComputeThreads |" in out


def test_gpu_check_readers_mode_runs_tiny_on_the_cpu(tmp_path: Path) -> None:
    # The GPU target (encoded shards at >= 0.9x the synthetic ceiling) is measured by this mode on a
    # lent GPU; here its parts run on a few images so that the GPU's minutes never find it broken.
    # Its part readers-cpu is bench_train_cpu.py --quick: every placement row is checked here.
    out = tmp_path / "gpu"
    env = {**os.environ, "OUT": str(out), "TINY": "1", "PYTHONPATH": str(BENCHMARKS.parent / "src")}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_check.sh"), "readers"], env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = (out / "summary.txt").read_text()
    assert summary.count("rc=0") == 3, summary  # env, readers-train, readers-cpu
    table = (out / "readers" / "results.md").read_text()
    for case in ("synthetic:off", "jpeg:off", "jpeg:off+unplaced", "jpeg:off+proc2", "jpeg:off+proc2+unplaced"):
        assert f"| {case} |" in table
    assert "| 2 process |" in table and "x synthetic img/s (target >= 0.9x)" in table
    cpu = (out / "readers" / "cpu.md").read_text()
    for row in ("| step alone | alone |", "| files, process | as is |", "| files, process | nice +10 |",
                "| shards, process | nice +10 |", "| shards, process | default on a GPU (",
                "| shards, thread | threads nice +10 |"):
        assert row in cpu, row
    assert "default placement here for a GPU run:" in cpu
    placements = [r["reader_placement"] for r in json.loads((out / "readers" / "results.json").read_text())["results"]
                  if r["source"] == "jpeg"]
    assert [p["nice"] > 0 or "not Linux" in p["reason"] for p in placements] == [True, False, True, False]


@pytest.mark.skipif(importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.nvimgcodec") is None,
                    reason="needs nvImageCodec (pip install nvidia-nvimgcodec-cu13)")
def test_bench_gpu_decode_times_the_region_decode_against_whole_images(tmp_path: Path) -> None:
    out = _run("bench_gpu_decode.py", "--region", "2", "--tiny", "--n", "32", "--batch-size", "8", "--seconds", "0.2",
               "--out", "rg", cwd=tmp_path)
    region = json.loads((tmp_path / "rg" / "region.json").read_text())
    assert len(region["by_region"]) == len(region["whole"]) == 2 and region["median_ratio"] > 0
    assert "by region / whole images on cpu" in out
