"""Exercises round 6 (issue 48.3): each wrong answer the audit found accepted, or told a wrong cause, is now
rejected with feedback naming its real cause; two more plausible wrong answers per exercise touched; and the
right answers the checks used to refuse (01.5 with the clock imported by name) are accepted."""
import math

import torch

from helpers.exercises import feedback
from helpers.solutions import nb00 as sol00

# --- 00.4: a float16 running mean --------------------------------------------------------------------------------

def chunk_means(chunk):
    def mean_of(losses):
        return torch.stack([part.float().mean() for part in losses.split(chunk)]).mean().item()
    return mean_of


def test_00_4_a_mean_of_chunk_means_is_rejected_and_named():
    for chunk in (10, 100, 1000, 1024):
        reason = feedback("00.4", chunk_means(chunk))
        assert reason is not None and "a mean of chunk means" in reason and "falling" in reason, (chunk, reason)


def test_00_4_the_falling_inputs_catch_every_small_or_round_chunk_size():
    inputs = [sol00.falling_losses(n, seed) for n, seed in ((101, 3), (1009, 4), (10_007, 2))]
    round_sizes = (2048, 2500, 4096, 5000)
    for chunk in (*range(2, 1112), *round_sizes):
        assert any(not math.isclose(sol00.mean_of_chunk_means(x, chunk), x.double().mean().item(), rel_tol=2**-9)
                   for x in inputs), chunk


def test_00_4_a_running_mean_updated_in_float16_is_named():
    def mean_of(losses):
        mean = torch.zeros((), dtype=torch.float16)
        for i, loss in enumerate(losses, start=1):
            mean = mean + (loss - mean) / i
        return mean.item()
    reason = feedback("00.4", mean_of)
    assert reason is not None and "running mean kept in float16 stops moving" in reason, reason


def test_00_4_dividing_each_loss_first_still_stalls_and_is_named():
    def mean_of(losses):
        total = torch.zeros((), dtype=torch.float16)
        for loss in losses:
            total = total + loss / len(losses)
        return total.item()
    reason = feedback("00.4", mean_of)
    assert reason is not None and "dividing each loss first does not help" in reason, reason
