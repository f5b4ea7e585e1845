"""helpers.training_lab: float32 vs autocast comparisons used by notebook 03 (small sizes: these are unit tests)."""
import torch

from helpers.training_lab import (ActivationMemory, StepTimes, activation_memory, compare_training,
                                  time_training_step)

CPU = torch.device("cpu")


def test_compare_training_starts_from_the_same_loss_and_reports_both_runs():
    runs = compare_training(CPU, torch.bfloat16, examples=64, test_examples=64, epochs=1)
    assert list(runs.logs) == ["float32", "autocast bfloat16"]
    assert all(len(log.losses) == 2 for log in runs.logs.values())          # 64 images, batch 32
    assert runs.first_loss_gap() < torch.finfo(torch.bfloat16).eps          # same weights and batch: rounding only
    assert 0 <= runs.accuracy_gap() <= 1 and runs.final_loss_gap() >= 0
    assert "test accuracy" in repr(runs)


def test_step_times_speedup_is_the_ratio_of_the_two_times():
    times = StepTimes({"float32": 0.02, "autocast bfloat16": 0.01}, batch_size=32)
    assert times.speedup == 2.0 and "was faster" in repr(times)
    measured = time_training_step(CPU, torch.bfloat16, batch_size=4, rounds=1, min_run_time=0.01)
    assert set(measured.seconds) == {"float32", "autocast bfloat16"}
    assert all(0 < s < 10 for s in measured.seconds.values())


def test_activation_memory_counts_half_the_float_bytes_but_not_the_int64_indices():
    memory = activation_memory(CPU, torch.bfloat16, batches=(8,))
    fp32, amp = memory.saved[8]["float32"], memory.saved[8]["autocast bfloat16"]
    assert fp32[torch.int64] == amp[torch.int64] > 0                         # max-pooling indices do not shrink
    assert amp[torch.bfloat16] < 0.6 * fp32[torch.float32]   # 16-bit activations (plus some casts saved)
    assert 1 / 3 < memory.saving(8) < 0.5
    assert memory.saving(8, with_state=True) < memory.saving(8)


def test_activation_memory_saving_formula():
    memory = ActivationMemory({8: {"float32": {torch.float32: 100}, "autocast": {torch.bfloat16: 50}}}, 100)
    assert memory.saving(8) == 0.5 and memory.saving(8, with_state=True) == 0.25
