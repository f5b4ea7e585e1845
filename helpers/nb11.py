"""Notebook 11's scaffolding: 08's GPT and its data, layer swapping, batched greedy decoding, byte
counts and tables. The techniques themselves (int8 and int4 quantisation, the two int4 conventions,
the quantised Linear layers, the timing) are written in the notebook's cells."""

import torch
from torch import nn

from .nb08 import GPT, batch, greedy, load_gpt, mean_loss, token_splits  # noqa: F401
from .nb10 import convert_linears  # noqa: F401


def prompts(ids: torch.Tensor, count: int, length: int, seed: int) -> torch.Tensor:
    """``count`` seeded windows of ``length`` ids from ``ids``: the prompts greedy decoding continues."""
    return batch(ids, count, length, torch.Generator().manual_seed(seed))[0]


def agreement(generated: torch.Tensor, reference: torch.Tensor) -> tuple[float, int]:
    """The share of generated ids equal to the reference's at the same position, and how many
    continuations are identical to the reference's from first to last id."""
    same = generated == reference
    return same.float().mean().item(), int(same.all(1).sum())


def buffer_bytes(module: nn.Module) -> int:
    """Bytes held by a module's parameters and buffers (a quantised layer's codes, scales and zeros)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def linear_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """The (out, in) shape of every ``nn.Linear`` of ``model``."""
    return [tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear)]


def accuracy_table(rows: dict[str, dict[str, float]]) -> str:
    """Scheme by measure (validation losses, agreement shares and counts), as aligned text."""
    columns = list(next(iter(rows.values())))
    first = max(len(name) for name in rows) + 2
    width = max(len(c) for c in columns) + 2
    lines = [" " * first + "".join(f"{c:>{width}}" for c in columns)]
    for name, row in rows.items():
        cells = (f"{row[c]:>{width}}" if isinstance(row[c], (int, str)) else f"{row[c]:>{width}.4f}"
                 for c in columns)
        lines.append(f"{name:<{first}}" + "".join(cells))
    return "\n".join(lines)


def formats_table(rows: list[tuple[str, ...]], heads: tuple[str, ...]) -> str:
    """Rows of text cells under ``heads``, columns as wide as their widest cell."""
    widths = [max(len(row[i]) for row in (heads, *rows)) + 2 for i in range(len(heads))]
    return "\n".join("".join(f"{cell:<{w}}" for cell, w in zip(row, widths)).rstrip()
                     for row in (heads, *rows))
