"""Exercises round 6 (issue 48.3): each wrong answer the audit found accepted, or told a wrong cause, is now
rejected with feedback naming its real cause; two more plausible wrong answers per exercise touched; and the
right answers the checks used to refuse (01.5 with the clock imported by name) are accepted."""
import math
import time

import torch

from helpers.device import autocast_dtype
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


# --- 01.5: paired, interleaved timing -----------------------------------------------------------------------------

SPEEDUP = '''
import statistics
import time

import torch
{imports}

def speedup(baseline, candidate, threads, rounds=5{extra}):
    before = {before}
    torch.set_num_threads(threads)
    try:
        ratios, b_times, c_times = [], [], []
        for i in range(rounds):
            times = {{}}
            for side in {order}:
                fn = baseline if side == "b" else candidate
                start = {clock}()
                for _ in range(3):
                    fn()
                times[side] = ({clock}() - start) / 3
            b_times.append(times["b"])
            c_times.append(times["c"])
            ratios.append(times["b"] / times["c"])
    finally:
        torch.set_num_threads(before)
    return {summary}, min(ratios), max(ratios)
'''
RIGHT = {"imports": "", "extra": "", "before": "torch.get_num_threads()", "clock": "time.perf_counter",
         "order": '("b", "c") if i % 2 == 0 else ("c", "b")', "summary": "statistics.median(ratios)"}


def cell(**changes):
    """``speedup`` as a learner's cell defines it: the right answer with ``changes``, run in a fresh namespace."""
    namespace = {}
    exec(SPEEDUP.format(**{**RIGHT, **changes}), namespace)  # noqa: S102 - the test's own text
    return namespace["speedup"]


def test_01_5_the_right_cell_and_every_spelling_of_the_clock_are_accepted():
    spellings = [{}, {"imports": "from time import perf_counter", "clock": "perf_counter"},
                 {"imports": "from time import perf_counter as now", "clock": "now"},
                 {"extra": ", clock=time.perf_counter", "clock": "clock"},
                 {"extra": ", *, clock=time.perf_counter", "clock": "clock"},
                 {"imports": "import timeit", "clock": "timeit.default_timer"},
                 {"summary": "torch.tensor(ratios).median().item()"}]  # the lower middle of 8 rounds
    for changes in spellings:
        assert feedback("01.5", cell(**changes)) is None, changes
    imported = cell(imports="from time import perf_counter", clock="perf_counter")
    assert imported.__globals__["perf_counter"] is time.perf_counter  # the check put the learner's clock back


def test_01_5_orders_that_do_not_alternate_strictly_are_rejected():
    orders = {"switched once halfway": '("b", "c") if i < rounds // 2 else ("c", "b")',
              "only the last round reversed": '("c", "b") if i == rounds - 1 else ("b", "c")',
              "a random order each round": 'random.Random(i * 7 + rounds).sample(("b", "c"), 2)'}
    for name, order in orders.items():
        reason = feedback("01.5", cell(imports="import random", order=order))
        assert reason is not None and "did not alternate strictly" in reason, (name, reason)


def test_01_5_a_thread_count_restored_to_a_typed_or_early_read_value_is_rejected():
    learners = torch.get_num_threads()
    for before in (str(learners), "ORIGINAL"):
        answer = cell(imports=f"ORIGINAL = {learners}", before=before)
        reason = feedback("01.5", answer)
        assert reason is not None and "not put back" in reason and "inside speedup" in reason, reason
    assert torch.get_num_threads() == learners


def test_01_5_a_mean_of_the_round_ratios_is_named():
    reason = feedback("01.5", cell(summary="statistics.mean(ratios)"))
    assert reason is not None and "the mean of the rounds' ratios, not their median" in reason, reason


def test_01_5_a_ratio_of_the_sides_medians_loses_the_pairing():
    reason = feedback("01.5", cell(summary="statistics.median(b_times) / statistics.median(c_times)"))
    assert reason is not None and "loses the pairing" in reason, reason


# --- 06.4: serve in the machine's autocast dtype -----------------------------------------------------------------

def serving(finish):
    """A right repair of 06.4 whose last step, ``finish(logits)``, is the learner's change."""
    def serve(model, request):
        model.eval()
        with torch.inference_mode(), torch.autocast(request.device.type, dtype=autocast_dtype(request.device)):
            return finish(model(request))
    return serve


def test_06_4_probabilities_instead_of_logits_are_named():
    reason = feedback("06.4", serving(lambda logits: logits.float().softmax(-1)))
    assert reason is not None and "returns probabilities" in reason, reason


def test_06_4_the_predicted_class_is_named_not_called_another_class():
    reason = feedback("06.4", serving(lambda logits: logits.argmax(dim=1)))
    assert reason is not None and "returns the predicted class" in reason and "another class" not in reason, reason


def test_06_4_log_probabilities_and_a_numpy_array_are_named():
    reason = feedback("06.4", serving(lambda logits: logits.float().log_softmax(-1)))
    assert reason is not None and "log-probabilities" in reason, reason
    reason = feedback("06.4", serving(lambda logits: logits.float().numpy()))
    assert reason is not None and "returns a ndarray" in reason, reason
