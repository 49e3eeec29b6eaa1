"""Run by ``torchrun`` in tests/loading/test_equal_steps.py (not a test module itself): a hand-written DDP loop.

Usage: ``torchrun ... equal_steps_script.py OUT FOLDERS PACKED``. No ``fit``: the loop a user
writes, over ``make_loader`` of every reader (1,001 samples, 2 workers, batch 50, 2 epochs,
a DDP model doing backward at every step), plus a plain torch DataLoader and a stoker loader
wrapped in ``EqualSteps``. Every rank writes ``OUT/rank<R>.json``: per reader and epoch the steps it
ran, the sample numbers it trained on, ``loader.trimmed``, the bad samples skipped and
how many agreements (``all_reduce`` calls from stoker) it made.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

N = 1001


def numbered(i: int) -> tuple[torch.Tensor, int]:
    """Sample ``i``: a 4x4 image whose first two channels spell ``i`` (as the test's PNGs do)."""
    image = torch.zeros((3, 4, 4), dtype=torch.uint8)
    image[0], image[1] = i % 256, i // 256
    return image, i % 4


def sample_ids(images: torch.Tensor) -> list[int]:
    return (images[:, 0, 0, 0].long() + 256 * images[:, 1, 0, 0].long()).tolist()


class SkipsSome(Dataset):
    """Map-style, ``on_error="skip"``: the even samples below 100 are bad, so rank 0's first batch comes out empty."""

    on_error = "skip"

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> Any:
        from stoker.loading.skips import Skipped

        return Skipped(f"#{i}", "bad on purpose") if i < 100 and i % 2 == 0 else numbered(i)


def main(out: Path, folders: str, packed: str) -> None:
    from stoker import make_loader
    from stoker.loading.steps import EqualSteps
    from stoker.pipes import Pipe
    from stoker.shards import ShardDataset, ShardStream
    from stoker.sources import ClassFolderDataset

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    agreements = [0]
    reduce = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:  # DDP reduces in C++; only stoker's agreements come here
        agreements[0] += 1
        return reduce(*args, **kwargs)

    dist.all_reduce = counted  # type: ignore[assignment]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    mine = [numbered(i) for i in range(rank, N, 2)]  # a user's own split: 501 and 500 samples
    readers: dict[str, Callable[[], Any]] = {
        "pipe": lambda: make_loader(Pipe.from_iterable(range(N)).shuffle(N, seed=3).shard().map(numbered),
                                    batch_size=50, num_workers=2, device="cpu"),
        "stream": lambda: make_loader(ShardStream(packed, shuffle_buffer=64, seed=1), batch_size=50, num_workers=2,
                                      device="cpu"),
        "folders": lambda: make_loader(ClassFolderDataset(folders), batch_size=50, num_workers=2, device="cpu"),
        "shards": lambda: make_loader(ShardDataset(packed), batch_size=50, num_workers=2, device="cpu"),
        "skipping": lambda: make_loader(SkipsSome(), batch_size=50, num_workers=0, device="cpu", shuffle=False),
        "dataloader": lambda: EqualSteps(DataLoader(mine, batch_size=50)),
        # fit's way: wrap whatever loader it is given; a stoker loader keeps the ranks in step itself (agrees once).
        "wrapped": lambda: EqualSteps(make_loader(Pipe.from_iterable(range(N)).shard().map(numbered), batch_size=50,
                                                  num_workers=0, device="cpu")),
    }
    record: dict[str, list[dict[str, Any]]] = {}
    for name, make in readers.items():
        loader = make()
        record[name] = []
        for _ in range(2):
            agreements[0], steps, seen = 0, 0, []
            for images, labels in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(ddp(images.float() / 255), labels).backward()  # DDP all-reduces here
                optimizer.step()
                steps += 1
                seen.extend(sample_ids(images))
            record[name].append({
                "steps": steps, "seen": seen, "trimmed": loader.trimmed, "agreements": agreements[0],
                "skipped": len(getattr(loader, "skipped", ())), "equal_steps": loader.equal_steps,
            })
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    (out / f"rank{rank}.json").write_text(json.dumps({"readers": record, "digest": digest}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
