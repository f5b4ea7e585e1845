"""helpers.scaling (underflow fractions, scaler simulation), helpers.state (bit-exact comparisons) and the simulated
CUDA autocast of helpers.autocast_rules."""
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import helpers
from helpers.dtype_trace import record_ops
from helpers.device import autocast_state
from helpers.autocast_rules import (SimulationUnavailable, autocast_rule_devices, cuda_simulation_available,
                                    simulated_cuda_autocast)
from helpers.scaling import (gradients, injected_inf_steps, overflow_fraction, subnormal_fraction,
                             underflow_fraction)
from helpers.state import bitwise_equal, max_abs_difference, optimizer_snapshot, same_state, snapshot

SIMULATION, WHY_NOT = cuda_simulation_available()
needs_simulation = pytest.mark.skipif(not SIMULATION, reason=f"simulated CUDA autocast unavailable: {WHY_NOT}")


def test_fractions_follow_the_float16_range():
    values = torch.tensor([1e-9, 1e-6, 1e-3, 1.0, 0.0])  # the zero is ignored
    assert underflow_fraction(values) == 0.25               # only 1e-9 rounds to 0
    assert subnormal_fraction(values) == 0.5                    # 1e-9 (rounded to 0) and 1e-6 (subnormal)
    assert overflow_fraction(values) == 0.0
    assert underflow_fraction(values, scale=2.0**16) == 0.0
    assert overflow_fraction(values, scale=2.0**16) == 0.25     # 1.0 * 65536 > 65504
    assert underflow_fraction(values, torch.bfloat16) == 0.0


def test_fractions_reject_bad_arguments():
    with pytest.raises(ValueError, match="positive"):
        underflow_fraction(torch.ones(3), scale=0.0)
    with pytest.raises(ValueError, match="no non-zero"):
        overflow_fraction(torch.zeros(3))
    with pytest.raises(TypeError, match="not a floating-point"):
        subnormal_fraction(torch.ones(3), torch.int32)


def test_gradients_concatenates_and_requires_backward():
    layer = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="backward"):
        gradients(layer)
    layer(torch.ones(1, 3)).sum().backward()
    grads = gradients(layer)
    assert grads.numel() == 3 * 2 + 2 and grads.dtype == torch.float32
    assert torch.equal(grads[-2:], torch.ones(2))


def test_bitwise_equal_is_stricter_than_equal():
    nan = torch.tensor([float("nan")])
    assert bitwise_equal(nan, nan.clone()) and not torch.equal(nan, nan)
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert torch.equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not bitwise_equal(torch.ones(2), torch.ones(2, dtype=torch.float16))
    assert not bitwise_equal(torch.ones(2), torch.ones(3))
    assert bitwise_equal(torch.arange(3), torch.arange(3))
    assert bitwise_equal(torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16))


def test_snapshot_same_state_and_difference():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    before = snapshot(layer)
    assert same_state(before, snapshot(layer))
    with torch.no_grad():
        layer.weight[0, 0] += 1e-3
    after = snapshot(layer)
    assert not same_state(before, after)
    assert max_abs_difference(before, after) == pytest.approx(1e-3, rel=1e-3)
    with pytest.raises(ValueError, match="same names"):
        max_abs_difference(before, {"weight": after["weight"]})


def test_injected_inf_steps_backs_off_and_grows():
    scales = injected_inf_steps([False, True, False, False, True, True], init_scale=8.0, growth_interval=2)
    assert scales == [8.0, 4.0, 4.0, 8.0, 4.0, 2.0]
    assert injected_inf_steps([False] * 3) == [2.0**16] * 3   # default growth_interval is 2000


@needs_simulation
def test_simulated_cuda_autocast_applies_cuda_rules_and_restores_state():
    enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    with simulated_cuda_autocast(torch.float16):
        a = torch.randn(4, 4)
        low = a @ a
        assert a.device.type == "cuda" and low.dtype == torch.float16
        assert torch.softmax(low, dim=1).dtype == torch.float32     # CUDA runs softmax in float32 ...
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.rand(4), torch.rand(4))
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        low = torch.randn(4, 4) @ torch.randn(4, 4)
        assert torch.softmax(low, dim=1).dtype == torch.bfloat16    # ... CPU does not
    assert torch.is_autocast_enabled("cuda") == enabled and torch.get_autocast_dtype("cuda") == dtype
    with simulated_cuda_autocast(torch.bfloat16):
        assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.bfloat16


def test_simulated_cuda_autocast_rejects_float32():
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        with simulated_cuda_autocast(torch.float32):
            pass


@needs_simulation
def test_simulated_cuda_autocast_respects_an_explicit_dtype():
    # the fp32_set_opt_dtype policy: log_softmax goes to float32 unless the caller names a dtype (as cross_entropy
    # does internally), so cross_entropy's log_softmax stays float16 and only nll_loss runs in float32
    with simulated_cuda_autocast(torch.float16):
        low = torch.randn(4, 4) @ torch.randn(4, 4)
        assert torch.log_softmax(low, 1).dtype == torch.float32
        assert torch.log_softmax(low, 1, dtype=low.dtype).dtype == torch.float16
        _, records = record_ops(lambda: F.cross_entropy(low, torch.zeros(4, dtype=torch.long)))
    log_softmax = [r for r in records if "log_softmax" in r.name]
    nll = [r for r in records if "nll_loss" in r.name]
    assert log_softmax[0].output_dtypes == (torch.float16,)
    assert nll[0].input_dtypes[0] == torch.float32


@needs_simulation
def test_simulated_cuda_autocast_restores_state_after_an_error():
    enabled = torch.is_autocast_enabled("cuda")
    with pytest.raises(RuntimeError, match="unsafe to autocast"):
        with simulated_cuda_autocast():
            F.binary_cross_entropy(torch.rand(4), torch.rand(4))
    assert torch.is_autocast_enabled("cuda") == enabled
    assert torch.randn(2).device.type == "cpu"  # the fake CUDA default device is gone too


def test_simulation_reports_a_missing_private_api(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch._subclasses.fake_tensor", None)  # makes the import fail
    available, why = cuda_simulation_available()
    assert available is False and "fake_tensor" in why
    with pytest.raises(SimulationUnavailable, match="fake_tensor"):
        with simulated_cuda_autocast():
            pass
    assert autocast_state("cuda")[0] is False  # nothing was switched on


def test_autocast_state_follows_the_context():
    assert autocast_state("cpu")[0] is False
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_state("cpu") == (True, torch.bfloat16)
        with torch.amp.autocast("cpu", enabled=False):
            assert autocast_state("cpu")[0] is False
    assert autocast_state("cpu")[0] is False


def test_autocast_rule_devices_reads_the_dispatcher(monkeypatch):
    rules = autocast_rule_devices("conv2d")
    if rules is None:
        pytest.skip("torch._C._dispatch_dump is not available in this PyTorch")
    assert rules == ["CPU", "CUDA"]                   # conv2d autocasts to the low dtype on both
    assert autocast_rule_devices("relu") == []        # no rule: follows its input
    with pytest.raises(ValueError, match="no op"):
        autocast_rule_devices("no_such_op_anywhere")
    monkeypatch.delattr(torch._C, "_dispatch_dump")
    assert autocast_rule_devices("conv2d") is None    # the private API is gone: no answer, no crash


def test_optimizer_snapshot_sees_adam_steps_but_not_skipped_ones():
    torch.manual_seed(0)
    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([weight], lr=0.1)
    assert optimizer_snapshot(optimizer) == {}        # no state before the first step
    scaler = torch.amp.GradScaler("cpu")
    for bad in (False, True):
        before = optimizer_snapshot(optimizer)
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        if bad:
            weight.grad[0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        assert same_state(before, optimizer_snapshot(optimizer)) == bad
    snap = optimizer_snapshot(optimizer)
    assert {"0.step", "0.exp_avg", "0.exp_avg_sq"} <= snap.keys()
    assert all(isinstance(v, torch.Tensor) for v in snap.values())
    snap["0.exp_avg"] += 1                            # a copy: changing it leaves the optimizer alone
    assert not same_state(snap, optimizer_snapshot(optimizer))


def test_simulation_refuses_where_fake_cuda_tensors_would_call_the_cuda_runtime(monkeypatch):
    """Before torch 2.10, indexing or copy_ on a fake CUDA tensor takes a real CUDA device guard: without a GPU the
    simulation must say so up front (notebook 03 then skips its CUDA columns) instead of failing mid-notebook."""
    import helpers.autocast_rules as scaling

    monkeypatch.setattr(torch, "__version__", "2.9.1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    available, why = cuda_simulation_available()
    assert available is False and "2.10" in why and "device guard" in why
    with pytest.raises(SimulationUnavailable, match="2.10"):
        with simulated_cuda_autocast():
            pass
    assert autocast_state("cuda")[0] is False  # nothing was switched on
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # with a GPU, the guard is harmless
    scaling._check_fake_cuda_stays_off_the_runtime()


def test_simulation_check_notices_rules_that_are_not_cudas(monkeypatch):
    """A simulation that does not apply CUDA's rules (here: no autocast, no fake CUDA device) is reported."""
    import contextlib

    import helpers.autocast_rules as scaling

    monkeypatch.setattr(scaling, "simulated_cuda_autocast", lambda dtype: contextlib.nullcontext())
    available, why = cuda_simulation_available()
    assert available is False and "not CUDA's" in why


def test_simulation_check_prints_nothing(capfd):
    cuda_simulation_available()
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
