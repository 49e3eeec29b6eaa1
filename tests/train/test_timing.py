"""PhaseTimer with device marks: the data wait is the device's idle time, not the host's time in ``next``.

CUDA events cannot be made on this machine, so :class:`EventGaps` is given marks on a
pretend device timeline: work queued at a host time runs once the device is free, and a
mark is reached when the device has done everything queued before it. What is checked
is the timer's own bookkeeping: where the marks go around ``next(loader)``, that a pair
is read only once the device has reached it, that the end of the phase waits for the
last one, and that a resumed phase carries its earlier wait.
"""

from __future__ import annotations

import pytest
import torch

from stoker.train.engine.timing import EventGaps, PhaseTimer


class _Device:
    """A pretend accelerator's timeline, in milliseconds of one clock shared with the host."""

    def __init__(self) -> None:
        self.host_ms = 0.0  # where the host is
        self.free_ms = 0.0  # when the device will have done all the work queued so far

    def queue(self, work_ms: float) -> None:
        self.free_ms = max(self.host_ms, self.free_ms) + work_ms

    def mark(self) -> _Mark:
        return _Mark(self, max(self.host_ms, self.free_ms))


class _Mark:
    def __init__(self, device: _Device, at_ms: float) -> None:
        self.device, self.at_ms = device, at_ms

    def query(self) -> bool:
        return self.device.host_ms >= self.at_ms

    def synchronize(self) -> None:
        self.device.host_ms = max(self.device.host_ms, self.at_ms)

    def elapsed_time(self, end: _Mark) -> float:
        if not (self.query() and end.query()):  # as cudaEventElapsedTime: an error before the device got there
            raise RuntimeError("elapsed time of a mark the device has not reached")
        return end.at_ms - self.at_ms


def _loader(device: _Device, batches: int, wait_ms: float):
    for i in range(batches):
        device.host_ms += wait_ms  # the host waits this long for each batch
        yield i


@pytest.mark.parametrize(("wait_ms", "work_ms", "idle_ms"), [
    (5.0, 8.0, 5.0),  # data faster than the device: only the first batch left it idle
    (20.0, 8.0, 20.0 + 12.0 + 12.0),  # data slower: idle 20 ms, then 12 ms between steps
])
def test_data_wait_is_the_devices_idle_time(wait_ms: float, work_ms: float, idle_ms: float) -> None:
    device = _Device()
    timer = PhaseTimer(torch.device("cpu"), wall_s=1.0, data_wait_s=0.5, gaps=EventGaps(device.mark))
    during = []
    for _ in timer.iterate(_loader(device, 3, wait_ms)):
        device.queue(work_ms)  # the step's work, queued without waiting for it
        during.append(timer.data_wait_s)  # reads what the device has got past, never a mark it has not reached
    assert during[0] == pytest.approx(0.5 + wait_ms / 1000)  # the first gap is done once its batch is there
    assert timer.data_wait_s == pytest.approx(0.5 + idle_ms / 1000)  # the end of the phase waited for the rest
    assert device.host_ms == device.free_ms  # ...for the device to finish
    assert timer.wall_s >= 1.0


def test_settle_waits_for_the_last_batch_fetched() -> None:
    device = _Device()
    timer = PhaseTimer(torch.device("cpu"), gaps=EventGaps(device.mark))
    batches = timer.iterate(_loader(device, 3, 4.0))
    next(batches)
    device.queue(10.0)  # busy from 4 to 14 ms; the host asks for batch 2, which is there at 8 ms
    next(batches)
    assert timer.data_wait_s == pytest.approx(0.004)  # the second gap (14 -> 14 ms) is not reached yet
    assert timer.settle() == pytest.approx(0.004) and device.host_ms == 14.0  # now it is, and it was no wait
    batches.close()
