import time

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import helpers
from helpers.autocast_rules import op_dtypes
from helpers.dtype_trace import record_ops


def tiny_setup(seed=0):
    torch.manual_seed(seed)
    model = helpers.ShapesCNN(widths=(8, 8, 8, 8))
    loader = helpers.make_loader(helpers.shapes_dataset("train", n=64), batch_size=32, seed=seed)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), loader


def test_fp32_training_lowers_the_loss_and_logs_every_step():
    model, optimizer, loader = tiny_setup()
    log = helpers.train(model, loader, optimizer, epochs=6)
    assert len(log.losses) == 12 and log.seconds > 0 and log.scales == []
    assert log.losses[-1] < log.losses[0]
    assert not model.training


def test_autocast_training_runs_forward_in_bf16():
    model, optimizer, loader = tiny_setup()
    seen = []
    model.features[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    helpers.train(model, loader, optimizer, amp_dtype=torch.bfloat16, max_steps=1)
    assert seen == [torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32


def test_max_steps_and_scheduler():
    model, optimizer, loader = tiny_setup()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    log = helpers.train(model, loader, optimizer, epochs=5, scheduler=scheduler, max_steps=3)
    assert len(log.losses) == 3
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)


def test_scaler_with_fp16_records_the_scale():
    model, optimizer, loader = tiny_setup()
    scaler = helpers.make_scaler("cpu", torch.float16, init_scale=2.0**10)
    log = helpers.train(model, loader, optimizer, amp_dtype=torch.float16, scaler=scaler, max_steps=2)
    assert len(log.scales) == 2 and log.scales[0] <= 2.0**10


def test_a_step_of_its_own_and_the_scheduler_only_after_real_steps():
    """The loop notebook 03 §4 runs with its own typed step: a step the scaler skipped leaves the scheduler."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    scaler = torch.amp.GradScaler("cpu")
    batches = [(torch.randn(8, 4), torch.randint(2, (8,))) for _ in range(3)]
    seen = []

    def step_with_inf_at_the_second(model, optimizer, scaler, inputs, labels, amp):
        optimizer.zero_grad(set_to_none=True)
        with torch.amp.autocast("cpu", dtype=amp):
            loss = F.cross_entropy(model(inputs), labels)
        scaler.scale(loss).backward()
        if len(seen) == 1:
            model.bias.grad[0] = float("inf")
        seen.append(1)
        scaler.step(optimizer)
        scaler.update()
        return loss

    log = helpers.train(model, batches, optimizer, amp_dtype=torch.float16, scaler=scaler,
                        scheduler=scheduler, step=step_with_inf_at_the_second)
    assert log.skipped_steps == 1 and log.scheduler_steps == 2 and len(log.losses) == 3
    assert log.scales == [65536.0, 32768.0, 32768.0]


def test_helpers_train_is_the_loop_and_helpers_training_its_module():
    """No attribute of the package shadows a submodule (``helpers.train`` used to be both)."""
    import importlib
    import pkgutil

    import helpers.training
    assert callable(helpers.train) and helpers.train is helpers.training.train
    assert helpers.training.amp_step is helpers.amp_step
    for module in pkgutil.iter_modules(helpers.__path__):
        imported = importlib.import_module(f"helpers.{module.name}")
        assert getattr(helpers, module.name, imported) is imported, f"helpers.{module.name} is not the module"


def test_scaler_with_bf16_is_refused_with_an_explanation():
    with pytest.raises(ValueError, match="No GradScaler is needed with torch.bfloat16"):
        helpers.make_scaler("cpu", torch.bfloat16)
    model, optimizer, loader = tiny_setup()
    with pytest.raises(ValueError, match="exponent range"):
        helpers.train(model, loader, optimizer, amp_dtype=torch.bfloat16,
                      scaler=torch.amp.GradScaler("cpu"), max_steps=1)


def test_unsupported_autocast_dtype_is_refused():
    model, optimizer, loader = tiny_setup()
    with pytest.raises(ValueError, match="cannot use torch.float64"):
        helpers.train(model, loader, optimizer, amp_dtype=torch.float64, max_steps=1)
    with pytest.raises(ValueError, match="cannot use torch.float64"):
        helpers.evaluate(model, helpers.shapes_dataset("test", n=8), amp_dtype=torch.float64)


def test_evaluate_casts_inputs_and_returns_float_logits():
    model = helpers.load_reference_model().bfloat16()
    result = helpers.evaluate(model, helpers.shapes_dataset("test", n=100), input_dtype=torch.bfloat16)
    assert result.logits.dtype == torch.float32 and result.logits.shape == (100, 8)
    assert result.accuracy > 0.9


def test_parameter_bytes_halve_with_half():
    model = helpers.ShapesCNN()
    full = helpers.parameter_bytes(model, include_buffers=False)
    assert full == 4 * sum(p.numel() for p in model.parameters())
    assert helpers.parameter_bytes(model.half(), include_buffers=False) * 2 == full


def test_saved_activation_bytes_counts_what_backward_needs():
    lin = nn.Linear(100, 100)
    x = torch.randn(64, 100)
    fp32 = helpers.saved_activation_bytes(lambda: torch.relu(lin(x)).sum(), exclude=lin)
    # Linear saves its input (64x100 float32) and ReLU saves its output (64x100 float32).
    assert fp32 == 2 * 64 * 100 * 4
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        bf16 = helpers.saved_activation_bytes(lambda: torch.relu(lin(x)).sum(), exclude=lin)
    assert bf16 < fp32
    with torch.no_grad():
        assert helpers.saved_activation_bytes(lambda: lin(x), exclude=lin) == 0
    dataset = torch.randn(1000, 100)
    batch = dataset[:64]  # a view: only its own 64 rows are held for backward, not the dataset
    assert helpers.saved_activation_bytes(lambda: torch.relu(lin(batch)).sum(), exclude=lin) == fp32


def test_saved_bytes_by_dtype_add_up_and_show_what_autocast_keeps():
    torch.manual_seed(0)
    model = helpers.ShapesCNN().train()
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 8, (4,))

    def step():
        with torch.amp.autocast("cpu", dtype=torch.bfloat16):
            return F.cross_entropy(model(x), y)

    split = helpers.saved_activation_bytes_by_dtype(step, exclude=model)
    assert sum(split.values()) == helpers.saved_activation_bytes(step, exclude=model)
    assert torch.int64 in split            # max-pooling indices
    assert max(split, key=split.get) == torch.bfloat16


def test_time_it_measures_with_all_threads():
    measurement = helpers.time_it(lambda: torch.ones(10).sum(), min_run_time=0.05)
    assert measurement.median > 0
    assert measurement.task_spec.num_threads == torch.get_num_threads()


def test_time_it_spends_about_min_run_time_in_blocks_of_calls():
    """A 2 ms call and min_run_time 0.1 s: one warm-up and one sizing call, then 2 blocks of about 25 calls (and
    perhaps a third, where sleeping ran short), each after timeit's 2 warm-up calls: well under 120 calls in all.
    (Timer.blocked_autorange would grow its block to 100 calls and make about 211.)"""
    calls = []

    def two_ms():
        calls.append(1)
        time.sleep(0.002)

    measurement = helpers.time_it(two_ms, min_run_time=0.1)
    assert 2 <= len(measurement.times) <= 3
    assert all(0.002 <= t < 0.05 for t in measurement.times)  # seconds per call, one entry per block
    assert 45 <= len(calls) < 120


def test_time_it_times_a_slow_call_twice_and_keeps_the_faster():
    """A call over half of min_run_time is timed twice, each after a warm-up call, and the faster kept: a single
    cold call (a busy core, a cold cache) must not stand for the call's time."""
    calls = []

    def slow_then_fast():
        calls.append(1)
        time.sleep(0.2 if len(calls) == 2 else 0.03)  # the first timed call is cold

    measurement = helpers.time_it(slow_then_fast, min_run_time=0.05)
    assert len(calls) == 4 and len(measurement.times) == 1
    assert 0.03 <= measurement.times[0] < 0.2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_memory_needs_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        helpers.measure.cuda_memory(lambda: None)


def test_record_ops_sees_autocast_casts_and_promotion():
    lin = nn.Linear(4, 4)
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        out, records = record_ops(lambda: lin(torch.randn(2, 4)))
    assert out.dtype == torch.bfloat16
    summary = op_dtypes(records)
    assert summary["addmm"] == "bfloat16 x1" and summary["_to_copy"] == "bfloat16 x3"  # input, weight, bias
    _, records = record_ops(lambda: torch.ones(2, dtype=torch.float16) + torch.ones(2))
    mixed = [r for r in records if len(set(r.input_dtypes)) > 1]
    assert [(r.name, r.output_dtypes) for r in mixed] == [("add", (torch.float32,))]


def test_amp_step_updates_weights_in_fp32_and_returns_low_precision_logits():
    model, optimizer, loader = tiny_setup()
    inputs, labels = next(iter(loader))
    before = [p.detach().clone() for p in model.parameters()]
    loss, logits = helpers.amp_step(model, inputs, labels, optimizer, amp_dtype=torch.bfloat16)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def notebook_03_train_step():
    """``train_step`` exactly as notebook 03 section 4 types it (the recipe, taught there)."""
    from tests.support import definitions

    namespace = {"torch": torch, "F": F, "device": torch.device("cpu")}
    return definitions("03", "train_step", namespace=namespace)["train_step"]


@pytest.mark.parametrize("amp_dtype", [None, torch.bfloat16, torch.float16])
def test_amp_step_is_the_step_notebook_03_teaches(amp_dtype):
    """helpers.amp_step (used by notebook 07 and tools/bench.py) does what 03 §4's cell does, bit for bit."""
    train_step = notebook_03_train_step()
    weights = []
    for step in ("notebook", "helpers"):
        model, optimizer, loader = tiny_setup()
        scaler = torch.amp.GradScaler("cpu") if amp_dtype == torch.float16 else None
        for inputs, labels in loader:
            if step == "notebook":
                train_step(model, optimizer, scaler, inputs, labels, amp_dtype)
            else:
                helpers.amp_step(model, inputs, labels, optimizer, amp_dtype=amp_dtype, scaler=scaler)
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights))
