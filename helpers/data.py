"""The reference dataset: coloured shapes drawn with Pillow from a seed (offline, deterministic)."""

import math
from functools import lru_cache

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader, TensorDataset

CLASSES = ("circle", "ring", "square", "frame", "triangle", "plus", "star", "crescent")
IMAGE_SIZE = 32
_SUPERSAMPLE = 3  # draw large, then downsample: smooth edges like a photographed object
TRAIN_SEED, TEST_SEED = 2024, 7
N_TRAIN, N_TEST = 6000, 2000


def _polygon(cx: float, cy: float, radius: float, corners: int, angle: float,
             inner: float = 1.0) -> list:
    """Points of a regular polygon (or a star when ``inner`` < 1) centred on (cx, cy)."""
    steps = corners * (2 if inner < 1.0 else 1)
    radii = [radius * (inner if inner < 1.0 and k % 2 else 1.0) for k in range(steps)]
    angles = [angle + 2 * math.pi * k / steps for k in range(steps)]
    return [(cx + r * math.cos(a), cy + r * math.sin(a)) for r, a in zip(radii, angles)]


def _draw(draw: ImageDraw.ImageDraw, label: str, cx: float, cy: float, r: float, angle: float,
          colour, background) -> None:
    width = max(2, int(r * 0.35))
    if label == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif label == "ring":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], outline=colour, width=width)
    elif label == "square":
        draw.polygon(_polygon(cx, cy, r * 1.1, 4, angle), fill=colour)
    elif label == "frame":
        draw.polygon(_polygon(cx, cy, r * 1.1, 4, angle), outline=colour, width=width)
    elif label == "triangle":
        draw.polygon(_polygon(cx, cy, r * 1.15, 3, angle), fill=colour)
    elif label == "plus":
        for a in (angle, angle + math.pi / 2):
            dx, dy = r * math.cos(a), r * math.sin(a)
            draw.line([cx - dx, cy - dy, cx + dx, cy + dy], fill=colour, width=int(r * 0.6))
    elif label == "star":
        draw.polygon(_polygon(cx, cy, r * 1.15, 5, angle, inner=0.45), fill=colour)
    elif label == "crescent":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
        bx, by = cx + 0.55 * r * math.cos(angle), cy + 0.55 * r * math.sin(angle)
        draw.ellipse([bx - 0.8 * r, by - 0.8 * r, bx + 0.8 * r, by + 0.8 * r], fill=background)
    else:  # pragma: no cover - CLASSES is closed
        raise ValueError(label)


def render_shapes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw ``n`` images (uint8, N x 3 x 32 x 32) with balanced labels (int64), from ``seed`` alone:
    one shape of random size, position, rotation and colour on a random background, pixel noise."""
    rng = np.random.default_rng(seed)
    size = IMAGE_SIZE * _SUPERSAMPLE
    labels = rng.permutation(np.arange(n) % len(CLASSES))
    images = np.empty((n, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        background = rng.integers(0, 256, 3)
        colour = (background + rng.integers(90, 167, 3)) % 256  # contrasts with the background
        image = Image.new("RGB", (size, size), tuple(int(c) for c in background))
        r = rng.uniform(0.25, 0.36) * size
        cx, cy = rng.uniform(r + 2, size - r - 2, 2)
        _draw(ImageDraw.Draw(image), CLASSES[label], cx, cy, r, rng.uniform(0, 2 * math.pi),
              tuple(int(c) for c in colour), tuple(int(c) for c in background))
        small = np.asarray(image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR), dtype=np.int16)
        noise = rng.normal(0, 10, small.shape)
        images[i] = np.clip(small + noise, 0, 255).astype(np.uint8)
    images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    return images, torch.from_numpy(labels).long()


def to_float(images: torch.Tensor) -> torch.Tensor:
    """uint8 images to float32 in [-1, 1], the input scale the reference model was trained on."""
    return images.float().div(127.5).sub(1.0)


@lru_cache(maxsize=4)
def shapes_dataset(split: str = "train", n: int | None = None) -> TensorDataset:
    """The reference dataset, float32 in [-1, 1]: 'train' (6000), 'test' (2000), or its first n."""

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', not {split!r}")
    seed, full = (TRAIN_SEED, N_TRAIN) if split == "train" else (TEST_SEED, N_TEST)
    images, labels = render_shapes(full if n is None else n, seed)
    return TensorDataset(to_float(images), labels)


def make_loader(dataset: TensorDataset, batch_size: int = 128, shuffle: bool = True,
                seed: int = 0) -> DataLoader:
    """A DataLoader shuffled by its own seeded ``torch.Generator`` (reproducible epochs)."""
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)
