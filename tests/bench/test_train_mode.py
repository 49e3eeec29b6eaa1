"""bench --mode train: the step stoker train runs, a no-loading row, and a last line in training terms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from stoker import ClassFolderDataset
from stoker.bench import BenchResult, Limits, MethodResult, bench, recommendation, render_markdown
from stoker.bench.step import Ceiling, StepSetting, make_train_step, measure_ceiling
from stoker.cli.main import main

_LIMITS = Limits(cores=2, decode_img_per_s=1000.0, memcpy_bytes_per_s=1e10, read_bytes_per_s=1e9, read_cold=True,
                 encoded_bytes_per_img=10_000.0, decoded_bytes_per_img=30_000.0, sequential_read_bytes_per_s=2e9)


def _run(method: str, workers: int, img_per_s: float, ceiling: float | None = None) -> MethodResult:
    run = MethodResult(method, workers, "process", status="ok", samples=1000, cpu_seconds=2.5)
    run.img_per_s, run.epoch_s, run.data_wait_share = img_per_s, 1000 / img_per_s, 0.1
    run.extra.update(limit_img_per_s=2000.0, limit_name="decode", fraction_of_limit=img_per_s / 2000.0)
    if ceiling is not None:
        run.extra["fraction_of_ceiling"] = img_per_s / ceiling
    return run


def _trained(runs: list[MethodResult], step_ms: float, batch: int = 256) -> BenchResult:
    ceiling = Ceiling(step_ms / 1e3, batch, 20)
    for run in runs:
        run.extra["fraction_of_ceiling"] = (run.img_per_s or 0.0) / ceiling.img_per_s
    return BenchResult(description="photos", samples=1000, num_classes=10, size=(112, 112), batch_size=batch, mode="train",
                       model="resnet50", epochs=1, max_seconds=None, limits=_LIMITS, runs=runs,
                       step=StepSetting("resnet50", "cuda:0", "bf16", True, "adamw"), ceiling=ceiling)


def test_the_last_line_says_what_share_of_the_step_each_method_feeds_and_what_to_do() -> None:
    # 4.096 ms per batch of 256: 62,500 img/s; plain files 38,750 (62 %), pixel shards 61,250 (98 %)
    result = _trained([_run("files", 2, 38_750.0), _run("files", 4, 30_000.0), _run("shards-encoded", 2, 45_000.0),
                       _run("shards-pixels", 0, 61_250.0)], step_ms=4.096)
    line = recommendation(result)
    assert line == (
        "Recommendation: the step takes 4.1 ms per batch of 256 (resnet50, bf16, channels_last, adamw, on cuda:0); "
        "plain files feed 62% of the step (2 workers); pixel shards 98% of the step (0 workers): "
        "pack with `stoker pack DATA OUT --store pixels --size 112x112`."
    )
    text = render_markdown(result)
    assert text.rstrip().splitlines()[-1] == f"**{line}**"
    assert "| no loading | 4.10 ms per step · 62,500 img/s: the ceiling (one batch already on the device) | — |" in text
    assert "38,750 img/s (above the decode limit) · feeds 62% of the step" in text
    assert "mode train (resnet50, bf16, channels_last, adamw, on cuda:0)" in text


def test_when_the_step_is_the_limit_the_line_says_the_gain_is_small() -> None:
    result = _trained([_run("files", 2, 59_000.0), _run("shards-pixels", 0, 62_000.0)], step_ms=4.096)
    line = recommendation(result)
    assert "plain files feed 94% of the step (2 workers): the step is the limit, so another method gains little" in line
    assert "pixel shards feed 99% of the step (0 workers), at most 5% faster training." in line
    assert "stoker pack" not in line
    # a method that kept up with the step alone is said to feed all of it, never "103 %"
    over = recommendation(_trained([_run("files", 2, 64_000.0), _run("shards-pixels", 0, 65_000.0)], step_ms=4.096))
    assert "plain files feed all of the step" in over and "no faster training" in over


def test_a_step_still_waiting_says_so_and_plain_files_can_be_the_answer() -> None:
    line = recommendation(_trained([_run("files", 2, 20_000.0), _run("shards-encoded", 4, 40_000.0)], step_ms=4.096))
    assert "plain files feed 32% of the step (2 workers); encoded shards 64% of the step (4 workers): pack with " \
           "`stoker pack DATA OUT --store encoded`; the step still waits for data" in line
    assert line.endswith("the step still waits for data (36% of its rate is not fed): try more workers.")
    on_cpu = _trained([_run("files", 2, 20_000.0), _run("shards-encoded", 4, 40_000.0)], step_ms=4.096)
    on_cpu.step = StepSetting("small_cnn", "cpu", "off", False, "adamw")
    assert recommendation(on_cpu).endswith("on the CPU the readers take cores the step itself uses, so no method "
                                           "reaches the step alone.")
    alone = recommendation(_trained([_run("files", 2, 50_000.0), _run("pipe", 2, 30_000.0)], step_ms=4.096))
    assert alone.endswith("plain files feed 80% of the step (2 workers): no method tried fed it more; "
                          "use plain files with 2 workers.")


def test_load_mode_says_only_loading_was_timed_and_what_a_step_would_need() -> None:
    result = _trained([_run("files", 2, 1_280.0), _run("shards-pixels", 0, 25_600.0)], step_ms=4.0, batch=64)
    result.mode, result.step, result.ceiling = "load", None, None
    line = recommendation(result)
    assert line.startswith("Recommendation: use pixel shards with 0 workers: 25,600 img/s, 20x plain files")
    assert line.endswith(
        " Only loading was timed: a training step waits for none of these methods only if it takes at least 2.5 ms "
        "per batch of 64 (25,600 img/s, the fastest here); `stoker bench DATA --mode train --model NAME` times the "
        "step itself and each method as a share of it.")


def test_the_step_is_stoker_trains_and_the_ceiling_times_it_without_loading() -> None:
    step, setting = make_train_step("small_cnn", 4, torch.device("cpu"))
    assert setting == StepSetting("small_cnn", "cpu", "off", False, "adamw")  # float32 on the CPU, train's optimizer
    step, setting = make_train_step("small_cnn", 4, torch.device("cpu"), amp="bf16", channels_last=True, optimizer="sgd")
    assert setting.describe() == "small_cnn, bf16, channels_last, sgd, on cpu"
    assert setting.train_flags() == "--model small_cnn --amp bf16 --optimizer sgd"
    images, labels = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8), torch.arange(8) % 4
    ceiling = measure_ceiling(step, images, labels, torch.device("cpu"), steps=3)
    assert ceiling.steps == 3 and ceiling.batch_size == 8 and ceiling.step_s > 0
    assert ceiling.img_per_s == 8 / ceiling.step_s


def test_a_train_mode_bench_has_the_no_loading_row_and_judges_every_run_by_it(tiny: ClassFolderDataset) -> None:
    result = bench(tiny, methods=["files", "shards-pixels"], workers=[0], mode="train", model="small_cnn", batch_size=20,
                   device="cpu", limits_time_s=0.05, progress=False)
    assert result.ceiling is not None and result.ceiling.batch_size == 20 and result.ceiling.steps >= 3
    assert result.step == StepSetting("small_cnn", "cpu", "off", False, "adamw")
    for run in result.runs:
        assert run.status == "ok"
        assert run.extra["fraction_of_ceiling"] == run.img_per_s / result.ceiling.img_per_s
    text = render_markdown(result)
    assert "| no loading |" in text and "feeds " in text
    assert recommendation(result).startswith("Recommendation: the step takes ")
    record = result.to_dict()
    assert record["step"]["optimizer"] == "adamw" and record["ceiling"]["img_per_s"] == result.ceiling.img_per_s


def test_the_bench_command_takes_the_steps_precision_format_and_optimizer(tiny_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["bench", str(tiny_root), "--methods", "files", "--workers", "0", "--mode", "train",
                                       "--model", "small_cnn", "--batch-size", "20", "--device", "cpu", "--amp", "bf16",
                                       "--channels-last", "--optimizer", "sgd", "--limit-seconds", "0.05",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert report["step"] == {"model": "small_cnn", "device": "cpu", "amp": "bf16", "channels_last": True,
                              "optimizer": "sgd"}
    assert report["recommendation"].startswith("Recommendation: the step takes ")
    assert "| no loading |" in result.output


def test_the_bench_step_takes_stoker_trains_default_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule: `stoker train`'s default amp ("auto") and the bench's step agree on every device (bf16 on a CUDA
    device that supports it, off on the CPU, where the goldens stay fp32)."""
    from stoker.bench.step import default_amp
    from stoker.train.engine.run import resolve_amp
    from stoker.train.runner.config import RunConfig

    assert RunConfig().amp == "auto"
    cpu = torch.device("cpu")
    assert resolve_amp(RunConfig().amp, cpu) == default_amp(cpu) == "off"
    assert make_train_step("small_cnn", 4, cpu, amp="auto", optimizer="sgd")[1].amp == "off"
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for supported, amp in ((True, "bf16"), (False, "off")):  # a GPU without bf16 (before Ampere): off, as the run
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda supported=supported: supported)
        assert resolve_amp(RunConfig().amp, cuda) == default_amp(cuda) == amp
    assert resolve_amp("fp16", cuda) == "fp16"
