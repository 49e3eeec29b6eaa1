"""Which rank holds the newest last.pt, and handing it over, over two real gloo ranks, each with its own folder."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stoker.errors import ConfigError
from stoker.train.engine.checkpoint import save_checkpoint
from stoker.train.engine.handover import find_holder, hand_over, newest_record, progress_of


def _last(path: Path, epoch: int, partial: dict[str, Any] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"epoch": epoch, "partial": partial, "model": {"w": torch.full((2,), float(epoch))}}, path)


def _rank_main(rank: int, folder: str) -> None:
    import torch.distributed as dist

    from stoker.train.engine.distributed import Ranks

    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    ranks = Ranks(rank, 2, rank)
    run_dir = Path(folder, f"machine{rank}", "runs", "x")  # each rank's own folder
    found: dict[str, Any] = {}
    try:
        try:
            find_holder(ranks, run_dir)
        except ConfigError as exc:
            found["none"] = str(exc)
        found["no record"] = newest_record(ranks, run_dir)
        # Rank 0 holds epoch 1; rank 1 is 3 batches into epoch 2: rank 1's is the newest.
        _last(run_dir / "last.pt", 1, {"phase": "train", "train": {"batches": 3}} if rank == 1 else None)
        (run_dir / "run.json").write_text(json.dumps({"rank": rank}))
        holder = find_holder(ranks, run_dir)
        found["holder"] = [holder.rank, list(holder.progress)]
        data = hand_over(ranks, holder, run_dir / "last.pt")
        found["same bytes"] = data == (Path(folder, "machine1", "runs", "x", "last.pt").read_bytes())
        found["record"] = newest_record(ranks, run_dir)
        found["no best"] = hand_over(ranks, holder, run_dir / "best.pt")
        # Equal progress: the lowest rank (rank 0, which then needs nothing handed over).
        _last(run_dir / "last.pt", 2)
        found["tie"] = find_holder(ranks, run_dir).rank
        Path(folder, f"rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def test_the_newest_last_pt_over_the_ranks_is_found_and_handed_over(tmp_path: Path, forked_ranks: Callable[..., None]) -> None:
    forked_ranks(_rank_main, str(tmp_path))
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "no last.pt to resume from on any of the 2 ranks" in found["none"] and found["no record"] is None
        assert found["holder"] == [1, [1, 1, 3]] and found["same bytes"] is True
        assert json.loads(found["record"]) == {"rank": 1} and found["no best"] is None
        assert found["tie"] == 0


def test_progress_orders_boundaries_mid_training_and_mid_validation(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    assert progress_of(path) is None
    keys = []
    for epoch, partial in [(1, None), (1, {"phase": "train", "train": {"batches": 2}}),
                           (1, {"phase": "train", "train": {"batches": 5}}), (1, {"phase": "valid", "train": {"batches": 9}}),
                           (2, None)]:
        _last(path, epoch, partial)
        keys.append(progress_of(path))
    assert keys == sorted(keys) and len(set(keys)) == 5
    path.write_bytes(b"not a checkpoint")
    assert progress_of(path) == (-1, 0, 0)  # damaged: older than any other, loading it says what is wrong
