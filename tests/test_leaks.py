"""Notebook 02 §6's LeakFinder (the TorchDispatchMode typed in its cell) finds the operations that leave a
half-precision run's dtype, and nothing in a clean run."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers.dtype_trace import record_ops
from helpers.model import load_reference_model
from tests.support import definitions

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
LeakFinder, _ = definitions("02", "LeakFinder", "float_dtypes", namespace={
    "torch": torch, "TorchDispatchMode": TorchDispatchMode, "tree_leaves": tree_leaves}).values()


class Report:
    """What a LeakFinder saw in one run of ``fn``: its leaks as (op, kind, output dtype), an error if raised."""

    def __init__(self, fn, dtype):
        self.result = self.error = None
        with LeakFinder(dtype) as finder:
            try:
                self.result = fn()
            except Exception as error:  # noqa: BLE001 - kept, and asserted by the tests
                self.error = error
        self.finder = finder
        self.leaks = [(name, kind, output) for _, name, kind, _, output in finder.leaks]
        self.kinds = [(name, kind) for name, kind, _ in self.leaks]
        self.clean = not finder.leaks and finder.off_dtype == 0 and self.error is None


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
        report = Report(lambda: model(X), F16)
    assert report.leaks == [("full", "creates", F32), ("add", "mixes", F32)]
    assert report.finder.leaks[1][3] == ["torch.float16", "torch.float32"]  # the input dtypes of the mix
    assert report.result.dtype == F32  # the run itself was not disturbed
    assert report.error is None and not report.clean
    assert report.finder.off_dtype == 2 and report.finder.leaks[0][0] == 1  # op #1: after the linear's op


def test_fixed_module_is_clean():
    model = half(SilentLeakFixed())
    with torch.inference_mode():
        report = Report(lambda: model(X), F16)
    assert report.clean and report.result.dtype == F16


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad, torch.enable_grad])
def test_loud_leak_lists_the_leaks_before_the_error(grad_mode):
    model = half(LoudLeak())
    with grad_mode():
        report = Report(lambda: model(TOKENS), F16)
    assert report.result is None
    # The wording is the release's (2.4: "input must have the type torch.float16, got type torch.float32";
    # later: "RNN input dtype (torch.float32) does not match weight dtype (torch.float16)..."): assert what
    # every release says, a ValueError naming both dtypes.
    assert isinstance(report.error, ValueError)
    assert "torch.float32" in str(report.error) and "torch.float16" in str(report.error)
    created = [name for name, kind in report.kinds if kind == "creates"]
    assert "zeros" in created and "mul" in created  # the GRU state and the float32 positions
    assert any(kind == "mixes" and output == F32 for _, kind, output in report.leaks)


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad, torch.enable_grad])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_fixed_gru_model_is_clean_in_every_grad_mode(grad_mode, dtype):
    model = half(LoudLeakFixed(), dtype)
    with grad_mode():
        report = Report(lambda: model(TOKENS), dtype)
    assert report.clean, report.leaks
    assert report.result.dtype == dtype


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad])
def test_reference_cnn_in_half_is_clean(grad_mode):
    model = load_reference_model().half()
    images = torch.zeros(2, 3, 32, 32, dtype=F16)
    with grad_mode():
        report = Report(lambda: model(images), F16)
    assert report.clean, report.leaks
    assert report.finder.ops > 10


def test_a_run_in_another_dtype_is_not_clean():
    model = half(SilentLeakFixed(), BF16)
    report = Report(lambda: model(X.to(BF16)), F16)
    assert not report.clean and report.finder.off_dtype > 0


def test_cast_and_zero_dim_mix_are_reported():
    assert Report(lambda: X.float(), F16).leaks == [("_to_copy", "casts", F32)]
    scale = torch.tensor(2.0)  # a 0-dim float32 tensor does not promote, but it is still a mix
    report = Report(lambda: X * scale, F16)
    assert report.leaks == [("mul", "mixes", F16)] and report.finder.off_dtype == 0


def test_ops_without_a_floating_output_and_carriers_are_not_leaks():
    assert Report(lambda: X == X.float(), F16).leaks == [("_to_copy", "casts", F32), ("eq", "mixes", None)]
    outside = torch.ones(3)  # float32 from outside the run: carried, not born here
    report = Report(lambda: outside.sin(), F16)
    assert report.leaks == [] and report.finder.off_dtype == 1 and not report.clean
    norm = nn.LayerNorm(4).half()
    assert Report(lambda: norm(X), F16).clean  # its float32 statistics are not its main result


def test_the_cell_shows_each_leak_on_one_line(capsys):
    report = Report(lambda: torch.zeros(4) + X, F16)
    report.finder.show()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 ops, 2 leaks, 2 returned another dtype"
    assert lines[1:] == ["  #0 zeros: creates no float input -> torch.float32",
                         "  #1 add: mixes torch.float16 + torch.float32 -> torch.float32"]


def sinusoid_positions(length: int, dim: int) -> torch.Tensor:
    """The notebook's position table: int64 positions times float32 frequencies (made from int64 * Python float)."""
    position = torch.arange(length).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2) * (-9.2 / dim))
    return torch.cat([torch.sin(position * frequency), torch.cos(position * frequency)], dim=1)


def test_position_table_leak_is_named_where_float32_is_born_not_where_it_spreads():
    report = Report(lambda: X.new_ones(6, 4) + sinusoid_positions(6, 4), F16)
    assert report.kinds == [("mul", "creates"), ("add", "mixes")]  # the frequencies' mul, then the promotion
    _, records = record_ops(lambda: sinusoid_positions(6, 4))
    muls = [i for i, r in enumerate(records) if r.name == "mul"]
    assert len(muls) == 3 and report.finder.leaks[0][0] == muls[0] + 1  # +1: new_ones runs first
    # positions * frequencies (the later muls) carry float32 on: counted in off_dtype only
    assert report.finder.off_dtype > len(report.leaks)


def test_torch_tensor_constant_is_a_creation():
    with torch.inference_mode():
        report = Report(lambda: X + torch.tensor([0.5, 1.0, 1.5, 2.0]), F16)
    assert report.kinds == [("lift_fresh", "creates"), ("add", "mixes")]
    report = Report(lambda: X + torch.tensor([0.5, 1.0, 1.5, 2.0], dtype=F16), F16)
    assert report.clean, report.leaks


class BranchLeak(nn.Module):
    """Leaks only for long inputs: a float32 offset in a branch that short inputs never take."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] > 4:
            return x + torch.zeros(x.shape[-1])
        return x * 2


def test_only_the_path_that_ran_is_seen():
    model = BranchLeak()
    assert Report(lambda: model(X), F16).clean  # the leaky branch did not run
    long_report = Report(lambda: model(torch.ones(2, 8, dtype=F16)), F16)
    assert long_report.kinds == [("zeros", "creates"), ("add", "mixes")]
