"""helpers.leaks finds the operations that leave a half-precision run's dtype, and nothing in a clean run."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.dtype_trace import OpRecord, record_ops
from helpers.leaks import CONSTANT_OPS, Leak, classify, find_dtype_leaks
from helpers.model import load_reference_model

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


class SilentLeak(nn.Module):
    """A float32 offset from torch.full, added after the last matrix product: promotes the output silently."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.full((4,), 0.5)


class SilentLeakFixed(SilentLeak):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y + y.new_full((4,), 0.5)


class LoudLeak(nn.Module):
    """Positions from torch.arange and a torch.zeros GRU state: in half precision the GRU raises."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.gru = nn.GRU(4, 4, batch_first=True)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + torch.arange(tokens.shape[1]).unsqueeze(1) * 0.1
        return self.gru(x, torch.zeros(1, tokens.shape[0], 4))[0]


class LoudLeakFixed(LoudLeak):
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + torch.arange(tokens.shape[1], dtype=x.dtype, device=x.device).unsqueeze(1) * 0.1
        return self.gru(x, x.new_zeros(1, tokens.shape[0], 4))[0]


def half(module: nn.Module, dtype: torch.dtype = F16) -> nn.Module:
    torch.manual_seed(0)
    return module.to(dtype).eval()


X = torch.ones(2, 4, dtype=F16)
TOKENS = torch.tensor([[1, 2, 3], [4, 5, 0]])


def test_silent_leak_is_found_with_its_creation_and_its_mix():
    model = half(SilentLeak())
    with torch.inference_mode():
        report = find_dtype_leaks(lambda: model(X), F16)
    assert [(leak.op, leak.kind) for leak in report.leaks] == [("full", "creates"), ("add", "mixes")]
    assert report.leaks[1].output_dtype == F32 and set(report.leaks[1].input_dtypes) == {F16, F32}
    assert report.result.dtype == F32  # the run itself was not disturbed
    assert report.error is None and not report.clean
    assert report.off_dtype_ops == 2
    assert "#1 full: creates float32" in str(report) and "mixes float16 + float32 -> float32" in str(report)


def test_fixed_module_is_clean():
    model = half(SilentLeakFixed())
    with torch.inference_mode():
        report = find_dtype_leaks(lambda: model(X), F16)
    assert report.clean and report.leaks == [] and report.off_dtype_ops == 0
    assert report.result.dtype == F16
    assert "clean: every op computed in float16" in str(report)


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad, torch.enable_grad])
def test_loud_leak_reports_the_error_and_the_leaks_before_it(grad_mode):
    model = half(LoudLeak())
    with grad_mode():
        report = find_dtype_leaks(lambda: model(TOKENS), F16)
    assert report.result is None
    # The wording is the release's (2.4: "input must have the type torch.float16, got type torch.float32";
    # later: "RNN input dtype (torch.float32) does not match weight dtype (torch.float16)..."): assert what
    # every release says, a ValueError naming both dtypes.
    assert report.error is not None and report.error.startswith("ValueError: ")
    assert "torch.float32" in report.error and "torch.float16" in report.error
    created = [leak.op for leak in report.leaks if leak.kind == "creates"]
    assert "zeros" in created and "mul" in created  # the GRU state and the float32 positions
    assert any(leak.kind == "mixes" and leak.output_dtype == F32 for leak in report.leaks)
    assert f"stopped by {report.error}" in str(report)
    short = report.format(error_message=False)  # for outputs that must not depend on the PyTorch version
    assert short.endswith("stopped by ValueError") and report.error.split(": ", 1)[1] not in short
    assert short.splitlines()[:-1] == str(report).splitlines()[:-1]


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad, torch.enable_grad])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_fixed_gru_model_is_clean_in_every_grad_mode(grad_mode, dtype):
    model = half(LoudLeakFixed(), dtype)
    with grad_mode():
        report = find_dtype_leaks(lambda: model(TOKENS), dtype)
    assert report.clean, str(report)
    assert report.result.dtype == dtype


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad])
def test_reference_cnn_in_half_is_clean(grad_mode):
    model = load_reference_model().half()
    images = torch.zeros(2, 3, 32, 32, dtype=F16)
    with grad_mode():
        report = find_dtype_leaks(lambda: model(images), F16)
    assert report.clean, str(report)
    assert report.op_count > 10


def test_a_run_in_another_dtype_is_not_clean():
    model = half(SilentLeakFixed(), BF16)
    report = find_dtype_leaks(lambda: model(X.to(BF16)), F16)
    assert not report.clean and report.off_dtype_ops > 0


def test_cast_and_zero_dim_mix_are_reported():
    report = find_dtype_leaks(lambda: X.float(), F16)
    assert [(leak.op, leak.kind, leak.output_dtype) for leak in report.leaks] == [("_to_copy", "casts", F32)]
    scale = torch.tensor(2.0)  # a 0-dim float32 tensor does not promote, but it is still a mix
    report = find_dtype_leaks(lambda: X * scale, F16)
    assert [(leak.op, leak.kind, leak.output_dtype) for leak in report.leaks] == [("mul", "mixes", F16)]
    assert report.off_dtype_ops == 0


@pytest.mark.parametrize("record, kind", [
    (OpRecord("zeros", (), (F32,)), "creates"),
    (OpRecord("zeros", (), (F16,)), None),
    (OpRecord("add", (F16, F32), (F32,)), "mixes"),
    (OpRecord("eq", (F16, F32), ()), "mixes"),
    (OpRecord("_to_copy", (F16,), (F32,)), "casts"),
    (OpRecord("sin", (F32,), (F32,)), None),  # carries an earlier leak forward: not a cause itself
    (OpRecord("relu", (F16,), (F16,)), None),
    (OpRecord("native_layer_norm", (F16, F16, F16), (F16, F32, F32)), None),  # only the first output counts
    (OpRecord("mul", (F32,), (F32,)), None),  # int64 positions * float32 frequencies: a carrier
    (OpRecord("lift_fresh", (F32,), (F32,)), "creates"),  # torch.tensor([...]) made inside the run
    (OpRecord("lift_fresh", (F16,), (F16,)), None),
])
def test_classify(record, kind):
    assert classify(record, F16) == kind


def test_describe():
    assert Leak(3, "zeros", "creates", (), F32).describe() == "#3 zeros: creates float32 (no floating input)"
    constant = Leak(0, "lift_fresh", "creates", (F32,), F32)
    assert constant.describe() == "#0 lift_fresh: creates float32 (a torch.tensor constant)"
    assert Leak(5, "add", "mixes", (F32, F16), F32).describe() == "#5 add: mixes float16 + float32 -> float32"
    assert Leak(1, "eq", "mixes", (F16, F32), None).describe() == "#1 eq: mixes float16 + float32 -> no floating output"


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float16", None])
def test_rejects_a_dtype_that_is_not_floating(dtype):
    with pytest.raises(TypeError, match="floating-point torch.dtype"):
        find_dtype_leaks(lambda: X + 1, dtype)


def test_interrupts_are_not_swallowed():
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        find_dtype_leaks(interrupted, F16)


def sinusoid_positions(length: int, dim: int) -> torch.Tensor:
    """The notebook's position table: int64 positions times float32 frequencies (made from int64 * Python float)."""
    position = torch.arange(length).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2) * (-9.2 / dim))
    return torch.cat([torch.sin(position * frequency), torch.cos(position * frequency)], dim=1)


def test_position_table_leak_is_named_where_float32_is_born_not_where_it_spreads():
    report = find_dtype_leaks(lambda: X.new_ones(6, 4) + sinusoid_positions(6, 4), F16)
    names = [(leak.op, leak.kind) for leak in report.leaks]
    assert names == [("mul", "creates"), ("add", "mixes")]  # the frequencies' mul, then the promotion
    _, records = record_ops(lambda: sinusoid_positions(6, 4))
    muls = [i for i, r in enumerate(records) if r.name == "mul"]
    assert len(muls) == 3 and report.leaks[0].index == muls[0] + 1  # +1: new_ones runs first
    # positions * frequencies (the later muls) carry float32 on: reported only in off_dtype_ops
    assert report.off_dtype_ops > len(report.leaks)


def test_torch_tensor_constant_is_a_creation():
    with torch.inference_mode():
        report = find_dtype_leaks(lambda: X + torch.tensor([0.5, 1.0, 1.5, 2.0]), F16)
    assert [(leak.op, leak.kind) for leak in report.leaks] == [("lift_fresh", "creates"), ("add", "mixes")]
    assert "lift_fresh" in CONSTANT_OPS
    report = find_dtype_leaks(lambda: X + torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=F16), F16)
    assert report.clean, str(report)


class BranchLeak(nn.Module):
    """Leaks only for long inputs: a float32 offset in a branch that short inputs never take."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 4:
            return x + torch.zeros(x.shape[-1])
        return x * 2


def test_only_the_path_that_ran_is_seen():
    model = BranchLeak()
    assert find_dtype_leaks(lambda: model(X), F16).clean  # the leaky branch did not run
    long_report = find_dtype_leaks(lambda: model(torch.ones(2, 8, dtype=F16)), F16)
    assert [(leak.op, leak.kind) for leak in long_report.leaks] == [("zeros", "creates"), ("add", "mixes")]


def test_a_run_that_only_carries_another_dtype_is_not_clean():
    """No op leaks (the float32 came in from outside the run), but the run did not compute in float16."""
    outside = torch.ones(3)
    report = find_dtype_leaks(lambda: outside * 2, F16)
    assert report.leaks == [] and report.off_dtype_ops == 1 and report.error is None
    assert not report.clean and "clean" not in str(report)
