"""Solutions to notebook 08's exercises, computed with PyTorch."""
import math

import torch
from torch.nn import functional as F

from .. import nb08 as lab
from ..debugging import first_nonfinite_op


def exercise_08_1_logits() -> tuple[torch.Tensor, torch.Tensor]:
    """08.1's setup: the checkpoint's bfloat16 logits on a seeded validation batch, and the next
    bytes."""
    with torch.random.fork_rng(devices=[]):  # GPT() draws initial weights: not from the learner's
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
    with torch.random.fork_rng(devices=[]):
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


def attention_weights(scores: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """08.3's fix (notebook 08 section 2): fill, don't add: disallowed scores become
    finfo(dtype).min, then the softmax."""
    return scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min).softmax(-1)


class MaskJudge:
    """08.3's judge: the answer is the learner's ``attention_weights(scores, allowed)``, run on new
    float16 scores with fully masked rows: scores at or below -16 (where finfo.min *added* rounds
    to -inf), then realistic low scores around -300 (a fill of -45, below the first set only, gives
    disallowed keys the largest weights there). No op may make an inf or NaN (nan_to_num on the
    softmax output, a -inf fill and an added mask fail), disallowed keys get weight 0, allowed ones
    a softmax of their scores."""

    def why_not(self, answer: object) -> str | None:
        if not callable(answer):
            return "answer_3 should be your repaired function attention_weights itself"
        low = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(9))
        for top, spread in ((-16, 24), (-280, 40)):
            reason = self._why_not_on(answer, (top - spread * low).half(), top)
            if reason is not None:
                return reason
        return None

    def _why_not_on(self, answer, scores: torch.Tensor, top: int) -> str | None:
        pad = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1, 1]]).bool()
        allowed = pad[:, None, :] & torch.ones(8, 8, dtype=torch.bool).tril()
        try:
            weights, made = first_nonfinite_op(lambda: answer(scores.clone(), allowed))
        except Exception as error:  # noqa: BLE001 - any error of the learner's function is feedback
            return f"attention_weights raised {type(error).__name__}: {str(error).splitlines()[0]}"
        if made is not None:
            return (f"`{made.name}` made {made.kind} from float16 scores at or below {top}: fill "
                    "the disallowed scores (masked_fill) with a value float16 holds, do not add to "
                    "them")
        if not (torch.is_tensor(weights) and weights.shape == scores.shape):
            return "attention_weights should return the softmax weights, shaped like the scores"
        disallowed, real_rows = ~allowed[:, None], pad[:, None, :, None]
        if weights.float().masked_fill(~(disallowed & real_rows), 0).abs().max() > 0:
            return (f"with scores at or below {top}, a real token still gives weight to a "
                    "disallowed key: the fill must lie below any score (finfo(dtype).min)")
        expected = scores.double().masked_fill(disallowed, -math.inf).softmax(-1)
        error = (weights.double() - expected)[real_rows.expand_as(weights)].abs().max()
        if error > 2e-3:  # float16 weights: a few units of its eps
            return "the allowed keys' weights are not a softmax of their scores"
        return None

    def __repr__(self) -> str:
        return "a function filling the disallowed float16 scores before the softmax"


SOLUTIONS = {
    "08.1": _loss_from_upcast_bf16_logits,
    "08.2": _kv_cache_bytes_of_a_small_bf16_model,
    "08.3": MaskJudge,
}
# 08.1: a float64 upcast (or .float() at another place) differs by ~1e-7; the bf16 loss by ~1e-3.
TOLERANCES = {"08.1": 1e-5}
