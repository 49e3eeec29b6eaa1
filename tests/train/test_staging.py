"""A run folder at a URL: the local copy, what is uploaded when, and what a start or a resume finds there."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from stoker.errors import ConfigError
from stoker.fs import where
from stoker.train.engine import staging
from stoker.train.engine.record import prepare_run_dir

_count = itertools.count()


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh folder on fsspec's in-memory filesystem; the cache (and so the local copies) under tmp_path."""
    monkeypatch.setenv("STOKER_CACHE", str(tmp_path / "cache"))
    return f"memory://stoker-staging-{os.getpid()}-{next(_count)}/runs"


def test_push_uploads_what_changed_with_last_pt_last_and_never_temporaries(tmp_path: Path, url: str) -> None:
    local = tmp_path / "copy"
    local.mkdir()
    for name in ("last.pt", "run.json", "metrics.csv", "best.pt", ".last.pt.123.tmp"):
        (local / name).write_bytes(name.encode())
    assert staging.push(local, f"{url}/r") == ["best.pt", "metrics.csv", "run.json", "last.pt"]
    assert staging.push(local, f"{url}/r") == []  # nothing changed
    (local / "metrics.csv").write_text("epoch\n1\n")
    assert staging.push(local, f"{url}/r") == ["metrics.csv"]
    assert where(f"{url}/r").read_bytes("metrics.csv") == b"epoch\n1\n"
    assert ".last.pt.123.tmp" not in where(f"{url}/r").kinds()


def test_a_url_run_folder_starts_empty_refuses_a_second_start_and_resumes_from_the_url(url: str) -> None:
    with pytest.raises(ConfigError, match=f"{url}/r: no last.pt to resume from"):
        prepare_run_dir(url, "r", resume=True)
    name, local = prepare_run_dir(url, "r", resume=False)
    assert name == "r" and local.name == "r" and local.is_dir()
    assert not [p for p in local.iterdir() if not p.name.startswith(".")]  # nothing but its upload stamps
    (local / "last.pt").write_bytes(b"checkpoint")
    (local / "events.out.tfevents.1").write_bytes(b"events")
    staging.push(local, f"{url}/r")
    with pytest.raises(ConfigError, match=f"{url}/r: already holds a run"):
        prepare_run_dir(url, "r", resume=False)
    (local / "last.pt").unlink()
    _, again = prepare_run_dir(url, "r", resume=True)  # another machine would fetch into its own copy the same way
    assert again == local and (again / "last.pt").read_bytes() == b"checkpoint"
    assert not (again / "events.out.tfevents.1").exists()  # events stay at the URL; a resumed run adds its own
    assert staging.run_url(url, "r") == f"{url}/r" and staging.run_url("runs", "r") is None


def test_an_interrupt_of_a_url_run_names_the_url_not_the_local_copy(
    url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ctrl-C mid-epoch in a run whose folder is at a URL: the warning names the URL's last.pt and its resume command."""
    import logging

    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from stoker import make_loader
    from stoker.train import Logger, Scenario, fit

    class StopAt(Logger):
        def batch_end(self, progress):  # type: ignore[no-untyped-def]
            if (progress.phase, progress.epoch, progress.batch) == ("train", 1, 3):
                raise KeyboardInterrupt

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g)
    batches = make_loader(TensorDataset(x, y), batch_size=4, num_workers=0, device="cpu", seed=0)
    model = nn.Linear(6, 3)
    scenario = Scenario(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), batches, None,
                        epochs=2, device="cpu", log_dir=url, name="stopped", preprocess=None, checkpoint_every_steps=1,
                        loggers=(), progress=False, plot=False)
    with caplog.at_level(logging.WARNING, logger="stoker"), pytest.raises(KeyboardInterrupt):
        fit(scenario, callbacks=[StopAt()])
    [said] = [r.getMessage() for r in caplog.records if "holds this point" in r.getMessage()]
    assert f"{url}/stopped/last.pt holds this point" in said, said
    assert f"--log-dir {url} --name stopped --resume" in said and str(tmp_path / "cache") not in said
