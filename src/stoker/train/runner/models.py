"""Models by name: a small CNN that trains quickly on a CPU, or any torchvision classifier.

Weights always start random (``weights=None``): stoker never downloads anything. Models
take float images already normalised by :class:`~stoker.train.engine.scenario.Preprocess`.
"""

from __future__ import annotations

import difflib

import torch
from torch import nn

from stoker.errors import ConfigError

__all__ = ["SMALL_CNN", "SmallCNN", "build_model", "model_names"]

SMALL_CNN = "small_cnn"


class SmallCNN(nn.Module):
    """Four strided conv-batchnorm-ReLU blocks, global average pooling and a linear head.

    At the default width: 241,184 parameters in the blocks and 129 per class in the head
    (242,474 for 10 classes). Any input size of at least 16x16 works.

    Args:
        num_classes: outputs of the head.
        width: channels of the first block (doubled in the next two).

    Example:
        >>> SmallCNN(10)(torch.zeros(2, 3, 64, 64)).shape
        torch.Size([2, 10])
    """

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        channels = [3, width, 2 * width, 4 * width, 4 * width]
        blocks: list[nn.Module] = []
        for c_in, c_out in zip(channels, channels[1:], strict=False):
            blocks += [nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 3, H, W] float
        x = self.features(x)  # [B, 4w, H/16, W/16]
        return self.head(self.pool(x).flatten(1))  # [B, num_classes]


def check_model_name(name: str, key: str = "model.name") -> str:
    """``name`` if it is a model :func:`build_model` knows (the one check: config, flags and Python).

    Raises:
        ConfigError: an unknown name, with the closest known ones.
    """
    if name == SMALL_CNN:  # no torchvision import (torch._dynamo with it: a second) for the CPU model
        return name
    names = model_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"{key} {name!r} is not a known model{hint}; use {SMALL_CNN!r} or a torchvision classifier "
            "such as resnet18, resnet50, efficientnet_b0, convnext_tiny (see torchvision.models.list_models())"
        )
    return name


def model_names() -> list[str]:
    """Every name :func:`build_model` accepts: ``small_cnn`` and torchvision's classifiers."""
    import torchvision.models

    return [SMALL_CNN, *torchvision.models.list_models(module=torchvision.models)]


def build_model(name: str, num_classes: int) -> nn.Module:
    """Build a model by name with ``num_classes`` outputs and random weights.

    Args:
        name: ``"small_cnn"`` or a torchvision classification model (``"resnet18"``,
            ``"resnet50"``, ``"efficientnet_b0"``, ``"convnext_tiny"``...).
        num_classes: outputs of the classification head (>= 2).

    Raises:
        ConfigError: an unknown name (with close matches) or a bad class count.

    Example:
        >>> build_model("resnet18", num_classes=10).fc.out_features
        10
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError(f"model: num_classes must be a whole number >= 2, got {num_classes!r}")
    if name == SMALL_CNN:
        return SmallCNN(num_classes)
    check_model_name(name)
    import torchvision.models

    try:
        return torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model.name {name!r}: cannot build it with {num_classes} classes ({exc})") from None
