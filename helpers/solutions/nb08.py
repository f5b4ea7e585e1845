"""Solutions to notebook 08's exercises, computed with PyTorch."""
import torch
from torch.nn import functional as F

from .. import nb08 as lab


def exercise_08_1_logits() -> tuple[torch.Tensor, torch.Tensor]:
    """08.1's setup: the checkpoint's bfloat16 logits on a seeded validation batch, and the next
    bytes."""
    model = lab.load_gpt().bfloat16()
    inputs, next_bytes = lab.batch(lab.token_splits()[1], 16, 64, torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, _ = model(inputs)
    return logits, next_bytes


def _loss_from_upcast_bf16_logits() -> float:
    logits, next_bytes = exercise_08_1_logits()
    return F.cross_entropy(logits.flatten(0, 1).float(), next_bytes.flatten()).item()


def _kv_cache_bytes_of_a_small_bf16_model() -> int:
    """08.2: measured on the real cache, not from the formula."""
    model = lab.GPT(width=64, layers=3, heads=2, context=128).bfloat16()
    with torch.inference_mode():
        _, cache = model(torch.zeros(4, 100, dtype=torch.long))
    return lab.cache_bytes(cache)


def exercise_08_3_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """08.3's setup: which positions are real tokens (2 left-padded rows of 8), the allowed
    (query, key) pairs (causal, real keys only), and the float16 hidden states."""
    pad = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1, 1, 1]]).bool()
    allowed = pad[:, None, :] & torch.ones(8, 8, dtype=torch.bool).tril()
    hidden = torch.randn(2, 1, 8, 16, generator=torch.Generator().manual_seed(8)).half()
    return pad, allowed, hidden


def two_attention_layers(mask_scores) -> float:
    """08.3's computation: two layers of float16 self-attention whose (batch, 1, query, key) scores
    go through ``mask_scores(scores, allowed)``; the sum of |output| at the real tokens."""
    pad, allowed, hidden = exercise_08_3_inputs()
    for _ in range(2):
        scores = hidden @ hidden.transpose(-2, -1) * hidden.shape[-1] ** -0.5
        hidden = mask_scores(scores, allowed[:, None]).softmax(-1) @ hidden
    return hidden.float().squeeze(1)[pad].abs().sum().item()


def fill_the_scores(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Notebook 08 section 2: fill, don't add: disallowed scores become finfo(dtype).min."""
    return scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)


def _attention_output_with_filled_scores() -> float:
    return two_attention_layers(fill_the_scores)


SOLUTIONS = {
    "08.1": _loss_from_upcast_bf16_logits,
    "08.2": _kv_cache_bytes_of_a_small_bf16_model,
    "08.3": _attention_output_with_filled_scores,
}
# 08.1: a float64 upcast (or .float() at another place) differs by ~1e-7; the bf16 loss by ~1e-3.
# 08.3: another finite fill value (-1e4) rounds differently in float16; the wrong answers are NaN.
TOLERANCES = {"08.1": 1e-5, "08.3": 1e-2}
