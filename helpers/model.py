"""The reference model (a small CNN) and its shipped fp32 checkpoint."""

from pathlib import Path

import torch
from torch import nn

from .data import CLASSES

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CHECKPOINT = DATA_DIR / "reference_cnn.pt"
REGENERATE = "python -m tools.reference"


class ShapesCNN(nn.Module):
    """Four conv-BatchNorm-ReLU blocks (32x32 -> 4x4, global average pool), a linear classifier."""

    def __init__(self, num_classes: int = len(CLASSES), widths: tuple[int, ...] = (16, 32, 64, 64)):
        super().__init__()
        layers: list[nn.Module] = []
        in_channels = 3
        for i, width in enumerate(widths):
            conv = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
            layers += [conv, nn.BatchNorm2d(width), nn.ReLU()]
            layers.append(nn.MaxPool2d(2) if i < len(widths) - 1 else nn.AdaptiveAvgPool2d(1))
            in_channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(in_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def load_weights(model: nn.Module, path: str | Path, device: str | torch.device, regenerate: str,
                 note: str = "") -> nn.Module:
    """``model`` loaded from ``path`` (``weights_only=True``) on ``device``, eval mode."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint {path.name} not found in {path.parent.name}/. "
                                f"Regenerate it from the repository root with: {regenerate}{note}")
    model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    return model.to(device).eval()


def load_reference_model(path: str | Path = CHECKPOINT,
                         device: str | torch.device = "cpu") -> ShapesCNN:
    """The trained fp32 reference model in eval mode (see :func:`load_weights`)."""
    return load_weights(ShapesCNN(), path, device, REGENERATE, "  (about 20 s on 2 CPU cores).")
