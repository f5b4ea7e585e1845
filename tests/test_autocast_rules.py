"""helpers.autocast_rules: the CPU/CUDA op table, CUDA autocast errors, the trace summary; and
helpers.cuda_simulation: CUDA autocast simulated on fake tensors."""
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import helpers
from helpers import autocast_rules, cuda_simulation
from helpers.autocast_rules import OPS, autocast_rule_devices, cuda_autocast_error, op_dtype_table, op_dtypes
from helpers.cuda_simulation import (
    SimulationUnavailable,
    cuda_rules_available,
    cuda_simulation_available,
    simulated_cuda_autocast,
)
from helpers.device import autocast_state
from helpers.dtype_trace import record_ops

CUDA_RULES, WHY_NOT = cuda_rules_available()
needs_cuda_rules = pytest.mark.skipif(not CUDA_RULES, reason=f"CUDA autocast rules unavailable: {WHY_NOT}")
SIMULATION, WHY_NOT_SIMULATED = cuda_simulation_available()
needs_simulation = pytest.mark.skipif(not SIMULATION,
                                      reason=f"simulated CUDA autocast unavailable: {WHY_NOT_SIMULATED}")


def test_cpu_column_follows_the_cpu_lists():
    table = op_dtype_table(torch.bfloat16, torch.float16)
    assert set(table.cpu) == {name.split(" ")[0] for name in OPS}
    for op in ("matmul", "conv2d", "relu", "softmax", "sum", "mean"):
        assert table.kind(op, "cpu") == "low", op
    for op in ("cross_entropy", "mse_loss", "binary_cross_entropy"):
        assert table.kind(op, "cpu") == "float32", op
    assert table.kind("dot", "cpu") == "RuntimeError"
    assert "sum (low)" in repr(table)


def test_cpu_cells_say_whether_a_rule_applied_or_the_dtype_follows_the_inputs():
    table = op_dtype_table(torch.bfloat16, torch.float16)
    for op in ("matmul", "conv2d", "cross_entropy", "binary_cross_entropy"):   # changed by CPU autocast
        assert table.cpu_rule_applied(op), op
    for op in ("relu", "softmax", "sum", "var", "add", "cat", "dot"):           # as without autocast
        assert not table.cpu_rule_applied(op), op
    assert table.cpu_plain["cross_entropy"] == "bfloat16" and table.cpu["cross_entropy"] == "float32"
    lines = {line.split(" (")[0]: line for line in repr(table).splitlines()}
    assert "bfloat16 (rule)" in lines["matmul"] and "bfloat16 (follows inputs)" in lines["relu"]


@needs_cuda_rules
def test_cuda_column_has_the_float32_list_and_refuses_bce():
    table = op_dtype_table(torch.bfloat16, torch.float16)
    for op in ("softmax", "log_softmax", "sum", "cumsum", "exp"):
        assert table.kind(op, "cuda") == "float32", op
    assert table.kind("mean", "cuda") == "low" and table.kind("var", "cuda") == "low"  # not on the list
    assert table.kind("binary_cross_entropy", "cuda") == "RuntimeError"
    assert {"sum", "softmax", "dot"} <= set(table.differs()) and "matmul" not in table.differs()


@needs_cuda_rules
def test_cuda_autocast_error_gives_the_bce_message_and_nothing_for_a_safe_op():
    message = cuda_autocast_error(lambda: nn.BCELoss()(torch.rand(8, device="cuda"), torch.rand(8, device="cuda")))
    assert "BCEWithLogitsLoss" in message
    assert cuda_autocast_error(lambda: torch.rand(4, 4, device="cuda") @ torch.rand(4, 4, device="cuda")) == ""


def test_without_cuda_rules_the_table_says_why(monkeypatch):
    import helpers.autocast_rules as rules
    monkeypatch.setattr(rules, "cuda_rules_available", lambda: (False, "no simulation in this test"))
    table = rules.op_dtype_table()
    assert table.cuda is None and table.kind("sum", "cuda") is None and table.differs() == []
    assert "no simulation in this test" in repr(table)
    assert "no simulation in this test" in rules.cuda_autocast_error(lambda: None)


def test_op_dtypes_summarises_a_trace_without_bookkeeping_ops():
    torch.manual_seed(0)
    model = helpers.ShapesCNN().train()
    x, y = helpers.shapes_dataset("train", n=4).tensors
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        _, records = record_ops(lambda: F.cross_entropy(model(x), y))
    summary = op_dtypes(records)
    assert summary["convolution"] == "bfloat16 x4"
    assert summary["native_batch_norm"] == "bfloat16 x4, float32 x8"
    assert "detach" not in summary and "add_" not in summary


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


def test_simulation_refuses_where_fake_cuda_tensors_would_call_the_cuda_runtime(monkeypatch):
    """Before torch 2.10, indexing or copy_ on a fake CUDA tensor takes a real CUDA device guard: without a GPU the
    simulation must say so up front (notebook 03 then skips its CUDA columns) instead of failing mid-notebook."""
    monkeypatch.setattr(torch, "__version__", "2.9.1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    available, why = cuda_simulation_available()
    assert available is False and "2.10" in why and "device guard" in why
    with pytest.raises(SimulationUnavailable, match="2.10"):
        with simulated_cuda_autocast():
            pass
    assert autocast_state("cuda")[0] is False  # nothing was switched on
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # with a GPU, the guard is harmless
    cuda_simulation._check_fake_cuda_stays_off_the_runtime()


def test_simulation_check_notices_rules_that_are_not_cudas(monkeypatch):
    """A simulation that does not apply CUDA's rules (here: no autocast, no fake CUDA device) is reported."""
    import contextlib

    monkeypatch.setattr(cuda_simulation, "simulated_cuda_autocast", lambda dtype: contextlib.nullcontext())
    available, why = cuda_simulation_available()
    assert available is False and "not CUDA's" in why


def test_simulation_check_prints_nothing(capfd):
    cuda_simulation_available()
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_the_simulation_stays_importable_from_autocast_rules():
    """Notebooks call the simulation as helpers.autocast_rules.*: the same objects as helpers.cuda_simulation's."""
    for name in ("SimulationUnavailable", "simulated_cuda_autocast", "cuda_simulation_available",
                 "cuda_rules_available", "cuda_autocast"):
        assert getattr(autocast_rules, name) is getattr(cuda_simulation, name), name
