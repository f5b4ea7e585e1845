"""Notebook 08's scaffolding: a byte-level GPT with a KV cache, its seeded corpus and batches."""

import random
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from . import timing
from .model import DATA_DIR, load_weights

CHECKPOINT = DATA_DIR / "reference_gpt.pt"
REGENERATE = "python -m tools.reference --gpt"
Cache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (batch, heads, T, d)

_SUBJECTS = ("the model", "a float16 weight", "the bfloat16 copy", "the optimizer", "every layer",
             "the cache", "a small update", "the loss", "the gradient", "the attention score",
             "the master weight", "the scaler", "a long prompt", "the next token", "the laptop",
             "the GPU")
_VERBS = ("rounds", "keeps", "stores", "loses", "scales", "reads", "writes", "doubles", "halves",
          "moves", "checks", "overflows", "adds", "casts", "measures", "skips")
_OBJECTS = ("the exponent", "eight bits", "a tiny step", "the softmax", "every byte",
            "the residual", "sixteen bits", "the logits", "the mask", "the memory",
            "a million tokens", "the bias")
_ENDINGS = (" in float32.", " on the GPU.", " at batch one.", " before the step.",
            " after the norm.", " without a warning.", ".", ".", " twice.", " for each head.")


def corpus_text(n_sentences: int = 6000, seed: int = 0) -> str:
    """Short ASCII sentences from ``seed`` (``random.Random.choice`` repeats on every Python 3)."""
    rng = random.Random(seed)
    sentences = (" ".join((rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)))
                 + rng.choice(_ENDINGS) for _ in range(n_sentences))
    return " ".join(sentence[0].upper() + sentence[1:] for sentence in sentences)


def encode(text: str) -> torch.Tensor:
    """The bytes of ``text`` as token ids (int64): the vocabulary is the 256 byte values."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    """The text of a sequence of byte ids."""
    return bytes(ids.tolist()).decode("utf-8", errors="replace")


def token_splits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The corpus as byte ids, split 90 % / 10 % into training and validation ids."""
    ids = encode(corpus_text(seed=seed))
    cut = int(0.9 * len(ids))
    return ids[:cut], ids[cut:]


def batch(ids: torch.Tensor, batch_size: int, context: int,
          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random windows of ``context`` ids, and the same windows one id later."""
    starts = torch.randint(0, len(ids) - context - 1, (batch_size,), generator=generator)
    windows = ids[starts[:, None] + torch.arange(context + 1)]
    return windows[:, :-1], windows[:, 1:]


class Block(nn.Module):
    """Pre-norm block: x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)); with a KV cache."""

    def __init__(self, width: int, heads: int, mlp: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.up = nn.Linear(width, mlp * width, bias=False)
        self.down = nn.Linear(mlp * width, width, bias=False)

    def forward(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """``x`` (batch, T, width); T must be 1 with a ``cache``. Returns x and the keys/values."""
        b, t, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        if cache is not None:
            if t != 1:
                raise ValueError("with a cache, feed one token at a time")
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        x = x + self.down(F.gelu(self.up(self.norm2(x))))
        return x, (k, v)


class GPT(nn.Module):
    """Embeddings, ``layers`` blocks, a LayerNorm, a tied head: (ids, cache) -> logits, cache."""

    def __init__(self, vocab: int = 256, width: int = 128, layers: int = 2, heads: int = 4,
                 mlp: int = 3, context: int = 64):
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, mlp) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, ids: torch.Tensor, cache: Cache | None = None) -> tuple[torch.Tensor, Cache]:
        past = 0 if cache is None else cache[0][0].shape[2]
        positions = torch.arange(past, past + ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        new_cache = []
        for i, block in enumerate(self.blocks):
            x, keys_values = block(x, None if cache is None else cache[i])
            new_cache.append(keys_values)
        return F.linear(self.norm(x), self.tokens.weight), new_cache


def next_token_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the next byte, on float32 logits (``logits.float()``, section 3)."""
    logits, _ = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@torch.no_grad()
def mean_loss(model: nn.Module, ids: torch.Tensor, batches: int = 10, batch_size: int = 32,
              seed: int = 1) -> float:
    """Mean next-byte loss of ``model`` over ``batches`` seeded batches of ``ids``."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    windows = (batch(ids, batch_size, model.context, generator) for _ in range(batches))
    losses = [next_token_loss(model, *(t.to(device) for t in pair)) for pair in windows]
    return torch.stack(losses).mean().item()


def load_gpt(path: str | Path = CHECKPOINT, device: str | torch.device = "cpu") -> GPT:
    """The trained float32 :class:`GPT` in eval mode, loaded with ``weights_only=True``."""
    return load_weights(GPT(), path, device, REGENERATE)


@torch.inference_mode()
def greedy(model: GPT, prompt_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy decoding of ``n`` ids after each prompt of the batch (one prefill, then one cached step
    each); returns the generated ids, (batch, n)."""
    logits, cache = model(prompt_ids)
    out = []
    for _ in range(n):
        ids = logits[:, -1:].argmax(-1)
        out.append(ids)
        logits, cache = model(ids, cache)
    return torch.cat(out, dim=1)


def generate(model: GPT, prompt: str, n: int) -> str:
    """Greedy decoding of ``n`` bytes after ``prompt``: one prefill, then one cached step each."""
    ids = encode(prompt)[None].to(next(model.parameters()).device)
    return decode(greedy(model, ids, n)[0].cpu())


def cache_bytes(cache: Cache) -> int:
    """Bytes held by the keys and values of a KV cache (what section 4's formula predicts)."""
    return sum(t.numel() * t.element_size() for layer in cache for t in layer)


def trace_table(columns: dict[str, dict[str, str]], rows: dict[str, str],
                heads: tuple[str, str] = ("ATen op", "in the model")) -> str:
    """``rows`` (key -> role) against each of ``columns`` (name -> key -> text); absent rows out."""
    shown = {key: role for key, role in rows.items()
             if any(key in column for column in columns.values())}
    w0 = max(len(text) for text in (heads[0], *shown)) + 2
    w1 = max(len(text) for text in (heads[1], *shown.values())) + 2
    width = max(len(text) for name, column in columns.items()
                for text in (name, *column.values())) + 2
    lines = [f"{heads[0]:<{w0}}{heads[1]:<{w1}}" + "".join(f"{name:<{width}}" for name in columns)]
    for key, role in shown.items():
        cells = "".join(f"{column.get(key, '-'):<{width}}" for column in columns.values())
        lines.append(f"{key:<{w0}}{role:<{w1}}{cells}")
    return "\n".join(lines)


def round_seconds(*calls: Callable[[], object], calls_per_round: int = 5, floor: float = 0.05,
                  cap: float = 0.25, device: str | torch.device = "cpu") -> float:
    """A timing round (``helpers.timing.compare``'s ``round_s``) that holds ``calls_per_round``
    calls of the slowest of ``calls``, each timed after a warm-up as the median of 3; between
    ``floor`` and ``cap`` (a stalled machine's slow calls do not stretch the cell: its rounds
    then hold fewer calls, and their spread shows it)."""
    sync = timing.synchronizer(device)
    slowest = 0.0
    for call in calls:
        timing.seconds_per_call(call, 1, sync)  # warm-up
        slowest = max(slowest, statistics.median(timing.seconds_per_call(call, 1, sync)
                                                  for _ in range(3)))
    return min(cap, max(floor, calls_per_round * slowest))
