"""The memory format ``fit`` trains in: channels_last where the convolutions are faster in it.

cuDNN's tensor-core convolutions take NHWC (channels_last) input; a model in the default
NCHW layout under AMP pays for transposes around every convolution. So ``fit`` puts a
convolutional model and its input batches in channels_last when it trains on CUDA under
AMP, unless told not to (``Scenario.channels_last=False``, ``run.channels_last = false``,
``stoker train --no-channels-last``). Asked for explicitly (``True``), it is used on any
device. The results are the same up to floating-point rounding; only speed changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Layout", "choose_layout", "is_convolutional"]


@dataclass(frozen=True)
class Layout:
    """The memory format a run chose and why (what ``run.json`` records under ``channels_last``).

    Attributes:
        channels_last: the model and the input batches are in ``torch.channels_last``.
        reason: one line saying why, in the user's terms.
    """

    channels_last: bool
    reason: str

    @property
    def memory_format(self) -> torch.memory_format | None:
        """``torch.channels_last``, or ``None`` (the tensors as they come)."""
        return torch.channels_last if self.channels_last else None

    def record(self) -> dict[str, object]:
        """``{"enabled": ..., "reason": ...}`` for ``run.json``."""
        return {"enabled": self.channels_last, "reason": self.reason}


def is_convolutional(model: nn.Module) -> bool:
    """Whether ``model`` has a 2-d convolution (the layers channels_last speeds up)."""
    return any(isinstance(m, nn.Conv2d) for m in model.modules())


def choose_layout(asked: bool | None, device: torch.device, amp: str, model: nn.Module) -> Layout:
    """The layout of a run: what was asked, else channels_last for a convolutional model on CUDA under AMP.

    Example:
        >>> choose_layout(None, torch.device("cpu"), "bf16", nn.Conv2d(3, 8, 3)).channels_last
        False
        >>> choose_layout(True, torch.device("cpu"), "off", nn.Conv2d(3, 8, 3)).channels_last
        True
    """
    if asked is True:
        return Layout(True, "asked for (channels_last=True, --channels-last)")
    if asked is False:
        return Layout(False, "turned off (channels_last=False, --no-channels-last)")
    if device.type != "cuda":
        return Layout(False, f"default: off on {device.type} (on by default on CUDA under AMP)")
    if amp == "off":
        return Layout(False, "default: off without AMP (on by default on CUDA under amp bf16 or fp16)")
    if not is_convolutional(model):
        return Layout(False, "default: off, the model has no 2-d convolution")
    return Layout(True, f"default: on for a convolutional model on CUDA under amp {amp} (--no-channels-last turns it off)")
