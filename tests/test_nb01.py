"""helpers.nb01 (notebook 01's scaffolding), section 6's CastCounter cell on autocast's weight cache, and the
exercise solutions of notebook 01: they give the right answers, and grade() rejects wrong ones."""
from __future__ import annotations

import copy
import math
import statistics
import time

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import helpers  # noqa: E402
from helpers import nb01  # noqa: E402
from helpers.data import shapes_dataset  # noqa: E402
from helpers.exercises import feedback, grade, solution, tolerance  # noqa: E402
from helpers.measure import saved_activation_bytes_by_dtype  # noqa: E402
from helpers.model import load_reference_model  # noqa: E402
from helpers.peaks import load_peaks  # noqa: E402
from helpers.training import EvalResult  # noqa: E402


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 2)).eval()


def test_dtype_changes_after_half():
    model = small_cnn()
    changes = nb01.dtype_changes(model, copy.deepcopy(model).half())
    assert changes["parameter"] == "6 x float32 -> float16"
    assert changes["buffer running_mean"] == "1 x float32 -> float16"
    assert changes["buffer num_batches_tracked"] == "1 x int64 -> int64"


def test_compare_runs_aligns_a_shorter_run_with_the_reference():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    reference = EvalResult(accuracy=1.0, logits=logits, predictions=logits.argmax(1))
    short_logits = torch.tensor([[2.0, 0.5], [1.5, 1.0]])  # the second image flips
    short = EvalResult(accuracy=0.5, logits=short_logits, predictions=short_logits.argmax(1))
    labels = torch.tensor([0, 1, 0])
    rows = nb01.compare_runs({"ref": reference, "short": short}, reference, labels)
    assert rows["ref"] == {"images": 3, "accuracy": 1.0, "drop": 0.0, "agreement": 1.0,
                           "max_logit_diff": 0.0}
    assert rows["short"]["images"] == 2 and rows["short"]["agreement"] == 0.5
    assert rows["short"]["drop"] == 0.5  # the reference is right on both of those images
    assert rows["short"]["max_logit_diff"] == 1.5
    table = nb01.format_comparison(rows).splitlines()
    assert len(table) == 3 and table[2].split()[:3] == ["short", "2", "50.00%"]


def test_subset_is_a_prefix():
    data = torch.utils.data.TensorDataset(torch.arange(10), torch.arange(10) * 2)
    part = nb01.subset(data, 3)
    assert part.tensors[0].tolist() == [0, 1, 2] and part.tensors[1].tolist() == [0, 2, 4]


def test_plot_peak_ratios_from_the_datasheets():
    peaks = load_peaks()
    ax = nb01.plot_peak_ratios(peaks)
    names = list(peaks)
    vs_fp32, vs_tf32 = ax.patches[:len(names)], ax.patches[len(names):]
    h100, t4 = names.index("H100 SXM"), names.index("T4")
    assert 14 < vs_fp32[h100].get_height() < 15.5 and 1.9 < vs_tf32[h100].get_height() < 2.1
    # no bf16 tensor cores and no TF32 before Ampere: fp16 against fp32, no TF32 bar
    assert vs_fp32[t4].get_height() > 5 and vs_tf32[t4].get_height() == 0
    assert "(fp16)" in ax.get_xticklabels()[t4].get_text()
    assert "(bf16)" in ax.get_xticklabels()[h100].get_text()


def test_plot_logit_errors_draws_every_run_but_the_reference():
    logits = torch.randn(4, 2)
    ref = EvalResult(1.0, logits, logits.argmax(1))
    other = EvalResult(1.0, logits + 1e-3, logits.argmax(1))
    ax = nb01.plot_logit_errors({"float32": ref, "x": other}, ref)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["x"]


def casts_per_call(module, inputs, grad_mode, calls=2):
    """Casts section 6's CastCounter counts in each of ``calls`` forwards inside ONE bfloat16 autocast context."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from tests.support import definitions
    (counter_class,) = definitions("01", "CastCounter", namespace={"TorchDispatchMode": TorchDispatchMode}).values()
    counts = []
    with grad_mode(), torch.amp.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(calls):
            with counter_class() as counter:
                module(inputs)
            counts.append(counter.casts)
    return counts


def test_autocast_caches_weight_casts_with_no_grad_and_grad_enabled():
    linear = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    for mode in (torch.no_grad, torch.enable_grad):
        # first call: input, weight, bias; second call: the cached weight and bias are reused
        assert casts_per_call(linear, x, mode) == [3, 1], mode
    first, _ = casts_per_call(linear, x, torch.inference_mode)
    assert first == 3  # whether the second call reuses the copies depends on the version (2.4: 1; 2.14: 3)


def test_autocast_caches_no_cast_of_weights_that_do_not_require_grad():
    linear = nn.Linear(8, 8).requires_grad_(False)
    assert casts_per_call(linear, torch.randn(2, 8), torch.no_grad) == [3, 3]


def _advice(dtype, how):
    from collections import namedtuple

    return namedtuple("Advice", "dtype how reason")(dtype, how, "a reason")


def test_rule_expects_faster_for_its_pick_no_gain_for_another_dtype_and_nothing_else():
    advice = _advice(torch.bfloat16, "16-bit weights")
    assert nb01.rule_expects(advice, torch.bfloat16) == "faster"
    assert nb01.rule_expects(advice, torch.float16) == "no gain"
    assert nb01.rule_expects(advice, torch.bfloat16, autocast=True) is None
    assert nb01.rule_expects(_advice(None, "measure"), torch.bfloat16) is None
    assert nb01.rule_expects(_advice(torch.float32, "float32"), torch.bfloat16) == "no gain"


# --- exercise solutions ---------------------------------------------------------------------------------------

def test_01_1_saved_bytes_of_the_half_model():
    model = load_reference_model()  # float32 run: the floating saved tensors halve in float16, int64 indices do not
    batch = shapes_dataset("test", n=64).tensors[0]
    by_dtype = saved_activation_bytes_by_dtype(lambda: model(batch), exclude=model)
    assert set(by_dtype) == {torch.float32, torch.int64}
    expected = by_dtype[torch.float32] // 2 + by_dtype[torch.int64]
    assert solution("01.1") == expected == 12591808
    assert grade("01.1", expected) is True
    assert grade("01.1", sum(by_dtype.values())) is False  # the float32 figure
    assert grade("01.1", sum(by_dtype.values()) // 2) is False  # halving everything, int64 indices included


def test_01_2_smallest_fp16_whose_square_overflows():
    # float16 numbers just below 256 are 1/8 apart; 255.875 ** 2 = 65472.015625 rounds to 65472 (finite),
    # 256 ** 2 = 65536 is past the rounding boundary of the largest float16.
    below = torch.tensor(255.875, dtype=torch.float16)
    assert torch.nextafter(below, torch.tensor(300.0, dtype=torch.float16)).item() == 256.0
    assert torch.isfinite(below * below) and (torch.tensor(256.0, dtype=torch.float16) ** 2).isinf()
    assert 255.875 ** 2 < torch.finfo(torch.float16).max + 16 < 256.0 ** 2
    assert solution("01.2") == 256.0
    assert grade("01.2", 256.0) is True and grade("01.2", 255.875) is False
    assert grade("01.2", math.sqrt(torch.finfo(torch.float16).max)) is False  # 255.94: not a float16 number


def test_01_2_is_matched_exactly():
    assert tolerance("01.2") == 0.0
    assert grade("01.2", 256.0001) is False  # within the default 1e-6, but not a float16 number


def test_01_3_bytes_of_the_parameter_copies_autocast_makes():
    model = load_reference_model()
    # CPU autocast runs conv2d and linear in bfloat16 and leaves batch_norm's float32 parameters alone
    cast = [p for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)) for p in m.parameters()]
    expected = sum(p.numel() for p in cast) * torch.tensor([], dtype=torch.bfloat16).element_size()
    assert solution("01.3") == expected == 121712
    assert grade("01.3", expected) is True
    all_parameters = sum(p.numel() for p in model.parameters()) * 2  # BatchNorm's weights included: wrong
    assert all_parameters != expected and grade("01.3", all_parameters) is False
    assert grade("01.3", expected + 3 * 32 * 32 * 2) is False  # with the cast of one input image: wrong
    assert grade("01.3", "bfloat16") is False


def _serve(requests, checkpoint, *, eval_mode=True, dtype=torch.float16, cast_inputs=True, autocast=None,
           probabilities=lambda logits: torch.softmax(logits.float(), dim=1)):
    """Notebook 01's exercise 01.4 deployment code, repaired (by default) or with a bug kept."""
    from helpers.model import ShapesCNN

    model = ShapesCNN()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.train(not eval_mode).to(dtype)
    out = []
    with torch.inference_mode(), torch.amp.autocast("cpu", dtype=autocast or torch.float16, enabled=bool(autocast)):
        for request in requests:
            out.append(probabilities(model(request.to(dtype) if cast_inputs else request)).float())
    return torch.cat(out)


def _by_hand(logits):
    e = logits.exp()
    return e / e.sum(dim=1, keepdim=True)


def _try_the_half_then_float32(requests, checkpoint):
    """A symptom-hiding repair: the dtype error caught and the model run in float32 instead."""
    try:
        return _serve(requests, checkpoint, cast_inputs=False)
    except RuntimeError:
        return _serve(requests, checkpoint, dtype=torch.float32)


WRONG_01_4 = {  # name: (answer, the feedback line must contain)
    "as given": (lambda r, c: _serve(r, c, eval_mode=False, cast_inputs=False, probabilities=_by_hand),
                 "serve raised RuntimeError"),
    "the number from section 6's predict()": (0.99, "repaired function itself"),
    "a float32 model": (lambda r, c: _serve(r, c, dtype=torch.float32), "float16 weights"),
    "a bfloat16 model": (lambda r, c: _serve(r, c, dtype=torch.bfloat16), "float16 weights"),
    "autocast float16 on the float32 model": (
        lambda r, c: _serve(r, c, dtype=torch.float32, autocast=torch.float16), "float16 weights"),
    "try/except, then float32": (_try_the_half_then_float32, "float16 weights"),
    "no eval()": (lambda r, c: _serve(r, c, eval_mode=False), "BatchNorm ran in training mode"),
    "train mode, every request in one torch.cat batch": (
        lambda r, c: _serve([torch.cat(r)], c, eval_mode=False), "BatchNorm ran in training mode"),
    "exp by hand": (lambda r, c: _serve(r, c, probabilities=_by_hand), "NaN or inf"),
    "a fixed shift, logits - 10": (lambda r, c: _serve(r, c, probabilities=lambda x: _by_hand(x - 10)),
                                   "NaN or inf"),
    "a fixed shift, logits - 30": (lambda r, c: _serve(r, c, probabilities=lambda x: _by_hand(x - 30)),
                                   "NaN or inf"),
    "nan_to_num": (lambda r, c: _serve(r, c, probabilities=lambda x: _by_hand(x).nan_to_num()),
                   "do not sum to 1"),
    "logits clamped": (lambda r, c: _serve(r, c, probabilities=lambda x: _by_hand(x.clamp(max=8))),
                       "differ from float32"),
    "one request only": (lambda r, c: _serve(r[:1], c), "one row of 8 probabilities per image"),
}


@pytest.mark.parametrize("name", WRONG_01_4)
def test_01_4_wrong_repairs_are_rejected_with_what_failed(name):
    answer, words = WRONG_01_4[name]
    reason = feedback("01.4", answer)
    assert reason is not None and words in reason, reason


RIGHT_01_4 = {
    "the solution's softmax": lambda r, c: _serve(r, c),
    "a float32 island by hand": lambda r, c: _serve(r, c, probabilities=lambda x: _by_hand(x.float())),
    "the maximum subtracted, in float16": lambda r, c: _serve(
        r, c, probabilities=lambda x: _by_hand(x - x.amax(dim=1, keepdim=True))),
    "log_softmax(...).exp()": lambda r, c: _serve(r, c, probabilities=lambda x: x.log_softmax(1).exp()),
}


@pytest.mark.parametrize("name", RIGHT_01_4)
def test_01_4_right_repairs_are_accepted(name):
    assert feedback("01.4", RIGHT_01_4[name]) is None


def test_01_4_one_batch_in_train_mode_escapes_an_output_check():
    """Why the judge watches BatchNorm's mode: one torch.cat batch of the same 64 images, regrouped or not, gives
    the same batch statistics, so only the mode itself shows the missing eval()."""
    from helpers.model import CHECKPOINT

    images = shapes_dataset("test", n=128).tensors[0][64:]
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    one_batch = _serve([torch.cat(list(images.split(4)))], CHECKPOINT, eval_mode=False)
    regrouped = _serve([torch.cat(list(images[order].split(4)))], CHECKPOINT, eval_mode=False)
    assert (regrouped[order.argsort()] - one_batch).abs().max() < 0.02


@pytest.mark.parametrize("key, answer", [("01.1", 0), ("01.3", 0), ("01.4", lambda r, c: _serve(r, c))])
def test_checks_leave_the_learner_s_random_generator_alone(key, answer):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    grade(key, answer)
    assert torch.equal(torch.rand(3), expected)


def test_01_4_the_notebook_s_own_images_would_not_catch_a_fixed_shift():
    """Why the judge sharpens the checkpoint: on the plain one a shift by 10 survives some images' check."""
    from helpers.model import CHECKPOINT

    images = shapes_dataset("test", n=64).tensors[0]
    shifted = _serve(list(images.split(4)), CHECKPOINT, probabilities=lambda x: _by_hand(x - 10))
    assert shifted.isfinite().all()  # no overflow here: only the judge's larger logits expose it


@pytest.mark.parametrize("key", ["01.1", "01.2", "01.3", "01.4", "01.5"])
def test_unanswered(key, capsys):
    assert helpers.check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out


def test_unknown_exercise():
    with pytest.raises(KeyError, match="Unknown exercise"):
        solution("01.9")


# --- 01.5: time two variants with the paired method ---------------------------------------------------------------

def _rounds(baseline, candidate, rounds, calls=3, alternate=True, clock="perf_counter"):
    """Paired rounds of ``calls`` calls each, the order alternating: (baseline s, candidate s) per round. ``clock``:
    the ``time`` function read (looked up at each call, as ``time.perf_counter()`` in a learner's cell is)."""
    def seconds(fn):
        start = getattr(time, clock)()
        for _ in range(calls):
            fn()
        return getattr(time, clock)() - start

    times = []
    for i in range(rounds):
        if i % 2 == 0 or not alternate:
            a = seconds(baseline)
            b = seconds(candidate)
        else:
            b = seconds(candidate)
            a = seconds(baseline)
        times.append((a, b))
    return times


def _at_threads(threads, work, restore=True):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return work()
    finally:
        if restore:
            torch.set_num_threads(before)


def _summary(ratios):
    return statistics.median(ratios), min(ratios), max(ratios)


def by_hand(baseline, candidate, threads, rounds=5):
    """A right answer written without compare."""
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds))
    return _summary([a / b for a, b in times])


def unpaired(baseline, candidate, threads, rounds=5):
    """All the baseline's rounds, then all the candidate's."""
    def work():
        a = [_rounds(baseline, lambda: None, 1)[0][0] for _ in range(rounds)]
        b = [_rounds(lambda: None, candidate, 1)[0][1] for _ in range(rounds)]
        return [x / y for x, y in zip(a, b)]
    return _summary(_at_threads(threads, work))


def single_call(baseline, candidate, threads, rounds=5):
    """One call of each, once: no rounds."""
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, 1, calls=1))
    return _summary([a / b for a, b in times])


def ignores_threads(baseline, candidate, threads, rounds=5):
    return _summary([a / b for a, b in _rounds(baseline, candidate, rounds)])


def threads_not_restored(baseline, candidate, threads, rounds=5):
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds), restore=False)
    return _summary([a / b for a, b in times])


def mean_of_one_side(baseline, candidate, threads, rounds=5):
    """The candidate's mean seconds per call reported instead of a ratio."""
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds))
    per_call = [b / 3 for _, b in times]
    return statistics.mean(per_call), min(per_call), max(per_call)


def inverted(baseline, candidate, threads, rounds=5):
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds))
    return _summary([b / a for a, b in times])


def one_number(baseline, candidate, threads, rounds=5):
    return by_hand(baseline, candidate, threads, rounds)[0]


def one_call_per_round(baseline, candidate, threads, rounds=5):
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds, calls=1))
    return _summary([a / b for a, b in times])


def never_alternates(baseline, candidate, threads, rounds=5):
    """The baseline first in every round."""
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds, alternate=False))
    return _summary([a / b for a, b in times])


def pooled(baseline, candidate, threads, rounds=5):
    """One ratio of the summed times, returned three times."""
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds))
    ratio = sum(a for a, _ in times) / sum(b for _, b in times)
    return ratio, ratio, ratio


def names_swapped(baseline, candidate, threads, rounds=5):
    """An "alternation" that swaps the names: every other round's ratio is candidate / baseline."""
    def work():
        ratios = []
        for i in range(rounds):
            first, second = (baseline, candidate) if i % 2 == 0 else (candidate, baseline)
            a, b = _rounds(first, second, 1, alternate=False)[0]
            ratios.append(a / b)
        return ratios
    return _summary(_at_threads(threads, work))


def cpu_clock(baseline, candidate, threads, rounds=5):
    """By hand, but timed with time.process_time: right by chance where the variants keep the CPU busy."""
    times = _at_threads(threads, lambda: _rounds(baseline, candidate, rounds, clock="process_time"))
    return _summary([a / max(b, 1e-9) for a, b in times])


def never_runs(baseline, candidate, threads, rounds=5):
    return 1.96, 1.9, 2.0


def three_rounds(baseline, candidate, threads, rounds=5):
    return by_hand(baseline, candidate, threads, rounds=3)


WRONG_01_5 = {  # name: (answer, the feedback must contain)
    "as given": (None, "requested thread count"),  # the notebook's cell, loaded below
    "unpaired: all baseline rounds, then all candidate rounds": (unpaired, "pair them"),
    "a single call of each": (single_call, "timed 1 call"),
    "one call per side per round": (one_call_per_round, "timed 1 call"),
    "rounds that never alternate": (never_alternates, "baseline went first in every round"),
    "one pooled ratio returned three times": (pooled, "one ratio three times"),
    "names swapped every other round": (names_swapped, "the baseline's time per call is still the numerator"),
    "time.process_time": (cpu_clock, "CPU-time clock"),
    "never runs the variants": (never_runs, "never called both"),
    "three rounds, hard-coded": (three_rounds, "3 paired rounds, not the 5"),
    "threads ignored": (ignores_threads, "requested thread count"),
    "threads set, never restored": (threads_not_restored, "put back"),
    "the mean of one side": (mean_of_one_side, "seconds of one side"),
    "ratio inverted": (inverted, "inverted"),
    "one number instead of three": (one_number, "three numbers"),
    "not a function": (1.9, "repaired function itself"),
}


def given_speedup():
    """The ``speedup`` of notebook 01's exercise cell, as the learner finds it."""
    from tests.support import definitions

    return definitions("01", "speedup", namespace={"time": time})["speedup"]


@pytest.mark.parametrize("name", WRONG_01_5)
def test_01_5_wrong_timings_are_rejected_with_what_is_wrong(name):
    answer, words = WRONG_01_5[name]
    before = torch.get_num_threads()
    reason = feedback("01.5", given_speedup() if answer is None else answer)
    assert reason is not None and words in reason, reason
    assert torch.get_num_threads() == before  # the check puts the learner's thread count back


def test_01_5_swapped_names_give_the_issue_s_numbers_and_are_told_which_round_is_inverted():
    """The swapped "alternation" returns a plausible median (about 2) with a lowest ratio near 0.5 (timed on the
    judge's clock, as the check times it)."""
    from helpers.solutions.nb01 import VirtualClock

    with VirtualClock() as clock:
        ratio, low, high = names_swapped(lambda: clock.call("baseline", 0.004), lambda: clock.call("candidate", 0.002),
                                         torch.get_num_threads())
    assert 1.8 < ratio < 2.2 and 0.45 < low < 0.55 and 1.8 < high < 2.2


def test_01_5_the_judge_reads_each_timing_between_two_clock_readings():
    from helpers.solutions import nb01 as sol

    events = [("call", "baseline", 1), ("clock", "perf_counter", 1.0), ("call", "baseline", 1),
              ("call", "baseline", 1), ("clock", "perf_counter", 1.5), ("clock", "time", 1.6),
              ("call", "candidate", 1), ("clock", "perf_counter", 1.85), ("call", "candidate", 1)]
    found = sol.timings(events)
    assert found == [sol.Timing(frozenset({"baseline"}), 2, 0.5), sol.Timing(frozenset({"candidate"}), 1, 0.25)]
    (pair,) = sol.paired_rounds(found)
    assert sol.round_ratio(pair) == 0.25 / 0.25 and sol.round_ratio(pair[::-1]) == 1.0


def test_01_5_a_timing_written_by_hand_is_accepted():
    assert feedback("01.5", by_hand) is None


def test_01_5_the_solution_with_compare_is_accepted():
    from helpers.solutions.nb01 import paired_speedup

    assert feedback("01.5", paired_speedup) is None


def test_01_5_a_raising_answer_leaves_the_threads_alone():
    before = torch.get_num_threads()

    def sets_then_raises(baseline, candidate, threads, rounds=5):
        torch.set_num_threads(threads)
        raise RuntimeError("oops")

    assert "raised RuntimeError" in feedback("01.5", sets_then_raises)
    assert torch.get_num_threads() == before
