"""Packing on Ray (``stoker pack SRC OUT --engine ray``): one Ray task per shard.

The driver does what a local pack does before writing — lists the sources once, makes
the shuffled plan once, claims ``OUT`` — and then each shard still to write becomes a
Ray task that encodes it and writes it straight to ``OUT`` (a folder every node sees, or
a bucket: the task stages the shard on its own node and uploads it). The task runs the
same code as a local pack's worker process (the pack hands it in), so the bytes are the
same. Ray is the cluster ``ray.init()`` finds (``RAY_ADDRESS``), or a local one it starts.

A failing task fails the pack with stoker's one line, not Ray's remote traceback: the
task's own :class:`~stoker.errors.StokerError` when it raised one (it names the file and
the cause), else a :class:`~stoker.errors.ShardError` naming the shard and the cause.
The other tasks are stopped first (interrupted, so that each deletes its half-written
``.tmp``; killed if they do not stop within a few seconds) and the ``.tmp`` files of the
shards still to write are removed from ``OUT`` (or, for a bucket, from the staging
folder of this node): nothing half-written is left behind, and finished shards stay for
the same command to resume from.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from stoker.errors import ConfigError, ShardError, StokerError
from stoker.shards.format.schema import TMP_SUFFIX

if TYPE_CHECKING:
    from tqdm import tqdm

    from stoker.fs import Location
    from stoker.shards.format.manifest import ShardInfo
    from stoker.shards.pack.plan import ShardPlan

__all__ = ["ENGINES", "import_ray", "task_failure", "write_on_ray"]

ENGINES = ("local", "ray")
_WAIT_S = 1.0
_STOP_S = 10.0  # how long interrupted tasks get to delete their .tmp before they are killed


class _HasOut(Protocol):
    out: Path  # the folder the shard is written into (a bucket's staging folder on each node)
    remote: Location | None  # a bucket pack's output (the shard's name in messages)


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


def task_failure(exc: BaseException, shard: str) -> StokerError:
    """Stoker's one-line error for a Ray task that failed writing ``shard`` (a path or URL).

    A :class:`ray.exceptions.RayTaskError` is unwrapped to what the task raised: a
    :class:`StokerError` is returned as it is; anything else becomes a :class:`ShardError`
    naming the shard and the cause. Other Ray failures (a worker that died, a lost
    object) name the shard and what Ray said, in one line.
    """
    ray = import_ray()
    cause: BaseException = exc
    while isinstance(cause, ray.exceptions.RayTaskError) and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    if isinstance(cause, StokerError):
        return cause
    if isinstance(cause, ray.exceptions.RayTaskError):  # the cause could not be brought back from the worker
        text = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
        return ShardError(f"{shard}: the Ray task writing this shard failed ({text}); fix the cause and run the same command again: it resumes")
    if isinstance(cause, ray.exceptions.RayError):
        what = (str(cause).strip().splitlines() or [""])[0]
        return ShardError(
            f"{shard}: the Ray task writing this shard failed ({type(cause).__name__}: {what}); "
            "run the same command again: it resumes"
        )
    what = (str(cause).strip().splitlines() or [""])[0]
    return ShardError(
        f"{shard}: writing this shard on Ray failed: {type(cause).__name__}: {what}; fix the cause and run the "
        "same command again: it resumes"
    )


def _stop(ray: Any, refs: list[Any]) -> None:
    """Stop tasks: interrupt them (each deletes its .tmp), then kill those still running."""
    if not refs:
        return
    for ref in refs:
        ray.cancel(ref, force=False)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=_STOP_S)
    for ref in running:
        ray.cancel(ref, force=True)
    if running:
        ray.wait(running, num_returns=len(running), timeout=_STOP_S)


def write_on_ray(
    write: Callable[[Job, ShardPlan, Callable[[int], None]], ShardInfo], job: Job, todo: list[ShardPlan], bar: tqdm
) -> dict[str, ShardInfo]:
    """Write the shards of ``todo`` as Ray tasks running ``write(job, plan, report)``; the bar
    advances by each finished shard's samples.

    Raises:
        StokerError: a task failed (see :func:`task_failure`); nothing half-written is left.
    """
    ray = import_ray()
    if not ray.is_initialized():
        ray.init()
    task = ray.remote(num_cpus=1)(_write_in_task)
    job_ref = ray.put(job)
    pending = {task.remote(write, job_ref, plan): plan for plan in todo}
    done: dict[str, ShardInfo] = {}
    try:
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1, timeout=_WAIT_S)
            for ref in finished:
                plan = pending.pop(ref)
                try:
                    info = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    shard = f"{job.remote.url}/{plan.name}" if job.remote is not None else str(job.out / plan.name)
                    raise task_failure(exc, shard) from None
                done[info.name] = info
                bar.update(info.samples)
    except BaseException:
        _stop(ray, list(pending))
        for plan in todo:  # what a killed task left (its shard's .tmp, its upload record's); finished shards stay
            for tmp in job.out.glob(plan.name + "*" + TMP_SUFFIX):
                tmp.unlink(missing_ok=True)
        raise
    return done
