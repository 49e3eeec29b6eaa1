"""Packing on Ray (``stoker pack SRC OUT --engine ray``): one Ray task per shard.

The driver does what a local pack does before writing — lists the sources once, makes
the shuffled plan once, claims ``OUT`` — and then each shard still to write becomes a
Ray task that encodes it and writes it straight to ``OUT`` (a folder every node sees, or
a bucket: the task stages the shard on its own node and uploads it). The task runs the
same code as a local pack's worker process (the pack hands it in), so the bytes are the
same. Ray is the cluster ``ray.init()`` finds (``RAY_ADDRESS``), or a local one it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from stoker.errors import ConfigError

if TYPE_CHECKING:
    from tqdm import tqdm

    from stoker.shards.manifest import ShardInfo
    from stoker.shards.plan import ShardPlan

__all__ = ["ENGINES", "import_ray", "write_on_ray"]

ENGINES = ("local", "ray")
_WAIT_S = 1.0



class _HasOut(Protocol):
    out: Path  # the folder the shard is written into (a bucket's staging folder on each node)


Job = TypeVar("Job", bound=_HasOut)  # what every shard writer needs: the pack's own job description


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("engine 'ray' needs Ray, which is not installed; pip install 'stoker[ray]'") from None
    return ray


def _write_in_task(write: Callable[[Job, ShardPlan, Callable[[int], None]], ShardInfo], job: Job, plan: ShardPlan) -> ShardInfo:
    """One shard, in a Ray worker: ``write`` is the function a local pack's worker process runs."""
    import torch

    torch.set_num_threads(1)
    job.out.mkdir(parents=True, exist_ok=True)  # a bucket's staging folder, on this node
    return write(job, plan, lambda n: None)


def write_on_ray(
    write: Callable[[Job, ShardPlan, Callable[[int], None]], ShardInfo], job: Job, todo: list[ShardPlan], bar: tqdm
) -> dict[str, ShardInfo]:
    """Write the shards of ``todo`` as Ray tasks running ``write(job, plan, report)``; the bar
    advances by each finished shard's samples."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    task = ray.remote(num_cpus=1)(_write_in_task)
    job_ref = ray.put(job)
    pending = [task.remote(write, job_ref, plan) for plan in todo]
    done: dict[str, ShardInfo] = {}
    try:
        while pending:
            finished, pending = ray.wait(pending, num_returns=1, timeout=_WAIT_S)
            for ref in finished:
                info = ray.get(ref)
                done[info.name] = info
                bar.update(info.samples)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return done
