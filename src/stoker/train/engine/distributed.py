"""One training run over many processes: joining torch.distributed as ``torchrun`` launched it.

``torchrun`` (or any launcher) sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
rendezvous (``MASTER_ADDR``/``MASTER_PORT``). :func:`join_launch` reads them, checks them,
initialises the process group (NCCL on CUDA, gloo on the CPU) and puts each rank on
``cuda:LOCAL_RANK``. A process that was not launched that way runs alone, as before; a
user who initialised the group themselves keeps their group.

Every rank runs the same code; :class:`Ranks` says which one this is and does the few
collective operations the training loop needs (sums over ranks, agreement on a stop,
the slowest rank's figures).
"""

from __future__ import annotations

import datetime
import gc
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stoker.errors import ConfigError
from stoker.lifetime import pid_alive
from stoker.loading.placement import local_ranks

__all__ = ["Ranks", "join_launch", "launched", "pid_space", "unwrap"]

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
DEFAULT_TIMEOUT_S = 300.0  # a rank that waits longer than this for the others stops with an error
_joined = False  # join_launch initialised the process group now in place (an early join: `--resume` reads run.json)
# What gloo and NCCL say when the process at the other end of a collective is gone.
_PEER_LOST = re.compile(
    r"connection (reset|closed|refused) by peer|broken pipe|socket closed|read error|write error|timed out"
    r"|communicator was aborted",
    re.IGNORECASE,
)


def launched() -> bool:
    """The environment names a multi-process launch (``WORLD_SIZE`` > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name}={value!r}: a distributed launch sets {', '.join(_ENV)} to whole numbers; start with "
            "torchrun --standalone --nproc-per-node N -m stoker train ..."
        ) from None


@dataclass
class Ranks:
    """Where this process stands in the run, and the collectives the loop uses.

    Attributes:
        rank, world_size, local_rank: this process's place (0, 1, 0 when alone).
        device: the device this rank trains on.
        owned: stoker initialised the process group (and so destroys it at the end).
        processes: every rank's ``(host, pid, pid space)``, in rank order, once :meth:`note_processes` ran.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owned: bool = False
    processes: list[tuple[str, int, str]] = field(default_factory=list)
    _flag_group: Any = field(default=None, repr=False, compare=False)

    @property
    def active(self) -> bool:
        """More than one rank."""
        return self.world_size > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes files and prints."""
        return self.rank == 0

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over ranks (float64 on the CPU group or the device)."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maxima over ranks (the slowest rank's time, the worst loss)."""
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: Sequence[float], op: Any) -> list[float]:  # op: a dist.ReduceOp member
        if not self.active:
            return [float(v) for v in values]
        t = torch.tensor(list(values), dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=op)
        return t.cpu().tolist()

    def any(self, flag: bool) -> bool:
        """Whether any rank says yes (a non-finite loss, an interrupt)."""
        return bool(self.max([1.0 if flag else 0.0])[0]) if self.active else flag

    def agree(self, *flags: bool) -> list[bool]:
        """Element-wise "any rank says yes" of a few flags, in one small all-reduce.

        This is the per-step handshake of the training loop (this rank has no batch, a
        stop was asked for, the last loss was not finite). Under NCCL it runs on a
        separate gloo group, so the handshake never waits for the GPU.
        """
        if not self.active:
            return [bool(f) for f in flags]
        if self._flag_group is None:
            # new_group is collective: every rank reaches the first agree() at the same point.
            self._flag_group = dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else dist.group.WORLD
        t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._flag_group)
        return [bool(v) for v in t.tolist()]

    def gather_text(self, text: str) -> list[str]:
        """Every rank's ``text``, in rank order, on every rank (JSON of per-rank loader states).

        Bytes in tensors padded to the longest, not ``all_gather_object``: that one pickles.
        """
        if not self.active:
            return [text]
        where = self._comm_device()
        data = text.encode()
        size = torch.tensor([len(data)], dtype=torch.int64, device=where)
        sizes = [torch.zeros(1, dtype=torch.int64, device=where) for _ in range(self.world_size)]
        dist.all_gather(sizes, size)
        lengths = [int(s.item()) for s in sizes]
        longest = max(max(lengths), 1)
        mine = torch.zeros(longest, dtype=torch.uint8, device=where)
        if data:
            mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(where)
        buffers = [torch.zeros(longest, dtype=torch.uint8, device=where) for _ in range(self.world_size)]
        dist.all_gather(buffers, mine)
        return [b[:n].cpu().numpy().tobytes().decode() for b, n in zip(buffers, lengths, strict=True)]

    def broadcast_buffers(self, model: nn.Module) -> None:
        """Give every rank rank 0's buffers (BatchNorm running statistics) before validating."""
        if not self.active:
            return
        for buffer in model.buffers():
            if buffer.device.type == "cuda" or dist.get_backend() != "nccl":
                dist.broadcast(buffer.data, src=0)

    def average_gradients(self, model: nn.Module) -> None:
        """Average every gradient over the ranks, as DDP's backward does.

        For an accumulation window whose backward passes all ran under ``no_sync()`` (the
        last, partial window of an epoch): without it each rank would step with its own
        gradients and the weights would drift apart.
        """
        if not self.active:
            return
        for param in model.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad.div_(self.world_size)

    def broadcast_text(self, text: str | None, src: int = 0) -> str | None:
        """Rank ``src``'s text on every rank (a run name chosen by the clock, a ``run.json``)."""
        data = self.broadcast_bytes(text.encode() if text is not None else None, src)
        return data.decode() if data is not None else None

    def broadcast_bytes(self, data: bytes | None, src: int = 0) -> bytes | None:
        """Rank ``src``'s bytes (``None`` stays ``None``) on every rank: ``last.pt``, so that other
        machines need not see the run folder. Only rank ``src``'s ``data`` is read."""
        if not self.active:
            return data
        # Bytes in a tensor, not broadcast_object_list: that one pickles.
        where = self._comm_device()
        mine = self.rank == src
        size = torch.tensor([len(data) if mine and data is not None else -1], dtype=torch.int64, device=where)
        dist.broadcast(size, src=src)
        n = int(size.item())
        if n <= 0:
            return None if n < 0 else b""
        buffer = torch.zeros(n, dtype=torch.uint8, device=where)
        if mine and data is not None:
            buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(where))
        dist.broadcast(buffer, src=src)
        return buffer.cpu().numpy().tobytes()

    def note_processes(self) -> None:
        """Learn every rank's host, pid and pid space (collective), so that a rank lost later can be named."""
        if self.active and not self.processes:
            for text in self.gather_text(f"{os.getpid()} {pid_space()} {socket.gethostname()}"):
                pid, space, host = text.split(" ", 2)
                self.processes.append((host, int(pid), space))

    def gone(self) -> list[str]:
        """The other ranks whose processes are gone, each in a few words (after :meth:`note_processes`).

        Only a process in this process's pid space (the same machine, boot and container)
        can be checked; one elsewhere is never said to be gone.
        """
        here = pid_space()
        return [f"rank {rank} (process {pid} on {host}) is gone (killed, out of memory, or ended by an error of its own: "
                "see its output)"
                for rank, (host, pid, space) in enumerate(self.processes)
                if rank != self.rank and space == here and not pid_alive(pid)]

    def lost_rank(self, error: BaseException) -> str | None:
        """What ``error`` means when it comes from another rank being gone, in a few words; ``None`` when it does not.

        A rank whose process on this machine is gone (killed, out of memory) is named; failing
        that, an error whose chain (``__cause__``/``__context__``) holds what gloo or NCCL say
        of a lost peer is taken as a lost rank of another machine. Anything else is not.
        """
        if not self.active:
            return None
        gone = self.gone()
        if gone:
            return "; ".join(gone)
        seen: set[int] = set()
        link: BaseException | None = error
        while link is not None and id(link) not in seen:
            seen.add(id(link))
            text = str(link)
            said = re.search(r"\b(gloo|nccl)\b", text, re.IGNORECASE)
            if isinstance(link, dist.DistNetworkError) or (
                isinstance(link, RuntimeError) and said is not None and _PEER_LOST.search(text) is not None
            ):
                cause = _PEER_LOST.search(text)
                backend = said.group(1).lower() if said is not None else "the rendezvous store"
                what = f"{backend}: {cause.group(0)}" if cause is not None else backend
                return (f"another rank stopped answering ({what}): its process or machine is gone, or the "
                        "network between them")
            link = link.__cause__ or link.__context__
        return None

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def close(self) -> None:
        """Destroy the process group if stoker made it, after the garbage it still serves is collected.

        A DistributedDataParallel wrapper lives in reference cycles; collected only at interpreter
        exit, its gloo work is torn down without an interpreter and the rank aborts ("terminate called
        without an active exception", seen once under torchrun on a loaded machine).
        """
        global _joined
        if self.owned and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()
            self.owned = _joined = False


def pid_space() -> str:
    """Where this process's pid means something: the host, its boot and its pid namespace (a container has its own).

    Two processes with the same pid space can check each other's pids; host names alone
    can repeat (containers called ``localhost``). Without ``/proc`` it is the host name.
    """
    parts = [socket.gethostname()]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass
    return ":".join(part.replace(" ", "_") for part in parts)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a ``DistributedDataParallel`` (or ``torch.compile``) wrapper, else the model."""
    while True:
        inner = getattr(model, "module", None) if isinstance(model, nn.parallel.DistributedDataParallel) else None
        inner = inner if inner is not None else getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def join_launch(device: str | torch.device = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> Ranks:
    """Join the run ``torchrun`` launched, or the group the caller initialised, or run alone.

    Args:
        device: ``"auto"`` (``cuda:LOCAL_RANK`` when CUDA is there, else the CPU), ``"cpu"``,
            or ``"cuda"``; a given ``cuda:N`` is taken as asked for a single process only.
        timeout_s: how long a collective may wait for the other ranks before it fails.

    Returns:
        This process's :class:`Ranks` (``world_size`` 1 when not launched).

    Raises:
        ConfigError: ``WORLD_SIZE`` set without a rendezvous (``MASTER_ADDR``/``MASTER_PORT``),
            more ranks on this machine than GPUs, or NCCL asked for without CUDA
            (``STOKER_DIST_BACKEND=nccl`` on a CPU machine).
    """
    global _joined
    wants_cpu = str(device) == "cpu"
    if dist.is_available() and dist.is_initialized():  # the caller's own group, or one an earlier join_launch made
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        on_cuda = dist.get_backend() == "nccl" or (torch.cuda.is_available() and not wants_cpu)
        return Ranks(rank, world, local, torch.device("cuda", local) if on_cuda else torch.device("cpu"), owned=_joined)
    if not launched():
        return Ranks()
    rank, world, local = (_env_int(name) for name in _ENV)
    if not 0 <= rank < world:
        raise ConfigError(f"RANK={rank} is out of range for WORLD_SIZE={world}; check the launcher")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"WORLD_SIZE={world} is set but {' and '.join(missing)} is not: there is no rendezvous to join. "
            "Launch with torchrun (torchrun --standalone --nproc-per-node 2 -m stoker train ...), or unset WORLD_SIZE"
        )
    backend = os.environ.get("STOKER_DIST_BACKEND") or ("nccl" if torch.cuda.is_available() and not wants_cpu else "gloo")
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"STOKER_DIST_BACKEND={backend!r}: use nccl (GPUs) or gloo (CPUs)")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ConfigError("NCCL needs CUDA GPUs and none is visible here; use gloo (leave STOKER_DIST_BACKEND unset) on CPUs")
        gpus = torch.cuda.device_count()
        local_world = local_ranks(unknown=world)
        if local_world > gpus or local >= gpus:
            raise ConfigError(
                f"{local_world} ranks on this machine but {gpus} GPU(s): give --nproc-per-node {gpus} or fewer "
                "(one GPU per rank)"
            )
        chosen = torch.device("cuda", local)
        torch.cuda.set_device(chosen)
    else:
        chosen = torch.device("cpu")
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"could not join the distributed run ({backend}, rank {rank} of {world}): {exc}") from None
    _joined = True
    return Ranks(rank, world, local, chosen, owned=True)
