"""helpers.autocast_rules: the CPU/CUDA op table, CUDA autocast errors and the trace summary."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import helpers
from helpers.autocast_rules import (OPS, cuda_autocast_error, cuda_rules_available, op_dtype_table, op_dtypes)
from helpers.dtype_trace import record_ops

CUDA_RULES, WHY_NOT = cuda_rules_available()
needs_cuda_rules = pytest.mark.skipif(not CUDA_RULES, reason=f"CUDA autocast rules unavailable: {WHY_NOT}")


def test_cpu_column_follows_the_cpu_lists():
    table = op_dtype_table(torch.bfloat16, torch.float16)
    assert set(table.cpu) == {name.split(" ")[0] for name in OPS}
    for op in ("matmul", "conv2d", "relu", "softmax", "sum", "mean"):
        assert table.kind(op, "cpu") == "low", op
    for op in ("cross_entropy", "mse_loss", "binary_cross_entropy"):
        assert table.kind(op, "cpu") == "float32", op
    assert table.kind("dot", "cpu") == "RuntimeError"
    assert "sum (low)" in repr(table)


@needs_cuda_rules
def test_cuda_column_has_the_float32_list_and_refuses_bce():
    table = op_dtype_table(torch.bfloat16, torch.float16)
    for op in ("softmax", "log_softmax", "sum", "cumsum", "exp"):
        assert table.kind(op, "cuda") == "float32", op
    assert table.kind("mean", "cuda") == "low"   # not on CUDA's float32 list: a mean cannot overflow its inputs
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
