"""helpers.inference and helpers.dtype_trace.casts_per_call: the harnesses of notebook 01."""
from __future__ import annotations

import copy
import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from helpers import inference  # noqa: E402
from helpers.dtype_trace import GRAD_MODES, casts_per_call  # noqa: E402
from helpers.peaks import load_peaks  # noqa: E402
from helpers.train import EvalResult  # noqa: E402


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).eval()


def test_dtype_changes_after_half():
    model = small_cnn()
    changes = inference.dtype_changes(model, copy.deepcopy(model).half())
    assert changes["parameter"] == "6 x float32 -> float16"
    assert changes["buffer running_mean"] == "1 x float32 -> float16"
    assert changes["buffer num_batches_tracked"] == "1 x int64 -> int64"


def test_activation_bytes_halve_in_float16():
    model, x = small_cnn(), torch.randn(2, 3, 8, 8)
    written, largest = inference.activation_bytes(model, x)
    # outputs: conv, bn, relu, flatten 2x4x6x6 = 288 elements each, linear 2x2; float32: 4 bytes each
    assert written == 4 * (4 * 288 + 4)
    assert largest == 4 * (288 + 2 * 3 * 8 * 8)  # the conv's output and its input
    half = inference.activation_bytes(copy.deepcopy(model).half(), x.half())
    assert half == (written // 2, largest // 2)


def test_forward_fn_runs_under_inference_mode_and_autocast():
    model, x = small_cnn(), torch.randn(2, 3, 8, 8)
    out = inference.forward_fn(model, x)()
    assert out.dtype == torch.float32 and out.is_inference()
    assert inference.forward_fn(model, x, torch.bfloat16)().dtype == torch.bfloat16


def test_forward_speedups_baseline_is_one():
    model, x = small_cnn(), torch.randn(2, 3, 8, 8)
    speedups = inference.forward_speedups({"a": (model, x), "b": (model, x, torch.bfloat16)}, min_run_time=0.01)
    assert list(speedups) == ["a", "b"] and speedups["a"] == 1.0 and speedups["b"] > 0


def test_compare_runs_aligns_a_shorter_run_with_the_reference():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    reference = EvalResult(accuracy=1.0, logits=logits, predictions=logits.argmax(1))
    short_logits = torch.tensor([[2.0, 0.5], [1.5, 1.0]])  # the second image flips
    short = EvalResult(accuracy=0.5, logits=short_logits, predictions=short_logits.argmax(1))
    labels = torch.tensor([0, 1, 0])
    rows = inference.compare_runs({"ref": reference, "short": short}, reference, labels)
    assert rows["ref"] == {"images": 3, "accuracy": 1.0, "drop": 0.0, "agreement": 1.0, "max_logit_diff": 0.0}
    assert rows["short"]["images"] == 2 and rows["short"]["agreement"] == 0.5
    assert rows["short"]["drop"] == 0.5  # the reference is right on both of those images
    assert rows["short"]["max_logit_diff"] == 1.5
    assert "short" in inference.format_comparison(rows)


def test_subset_is_a_prefix():
    data = torch.utils.data.TensorDataset(torch.arange(10), torch.arange(10) * 2)
    part = inference.subset(data, 3)
    assert part.tensors[0].tolist() == [0, 1, 2] and part.tensors[1].tolist() == [0, 2, 4]


def test_largest_activations_per_leaf_module():
    model = small_cnn()
    x = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    largest = inference.largest_activations(model, x, batch_size=2)
    assert set(largest) == {"0", "1", "2", "3", "4"}
    with torch.no_grad():
        assert math.isclose(largest["0"], model[0](x).abs().max().item(), rel_tol=1e-6)
        assert largest["2"] == largest["3"]  # flatten keeps the values of the ReLU output


def test_gemm_tflops_is_positive_on_cpu():
    assert inference.gemm_tflops(32, torch.float32, "cpu", min_run_time=0.01) > 0


def test_peak_ratios_from_the_datasheets():
    ratios = inference.peak_ratios(load_peaks())
    h100 = ratios["H100 SXM"]
    assert h100["format"] == "bf16" and 14 < h100["vs fp32"] < 15.5 and 1.9 < h100["vs tf32"] < 2.1
    t4 = ratios["T4"]  # no bf16 tensor cores and no TF32 before Ampere: fp16 against fp32 only
    assert t4["format"] == "fp16" and t4["vs tf32"] is None and t4["vs fp32"] > 5


def test_plots_draw_without_a_display():
    ax = inference.plot_peak_ratios(load_peaks())
    assert len(ax.patches) == 2 * len(load_peaks())
    logits = torch.randn(4, 2)
    ref = EvalResult(1.0, logits, logits.argmax(1))
    other = EvalResult(1.0, logits + 1e-3, logits.argmax(1))
    assert inference.plot_logit_errors({"float32": ref, "x": other}, ref).get_legend() is not None


def test_autocast_registrations_differ_between_cpu_and_cuda():
    cpu, cuda = inference.autocast_registrations("CPU"), inference.autocast_registrations("CUDA")
    if cpu is None or cuda is None:
        pytest.skip("the dispatcher's registration list is not available in this PyTorch")
    assert "aten::conv2d" in cpu and "aten::conv2d" in cuda
    assert "aten::softmax.int" in cuda and "aten::softmax.int" not in cpu  # CUDA runs softmax in float32
    assert cpu - cuda and cuda - cpu  # neither list contains the other


def test_casts_per_call_cache_with_no_grad_and_grad_enabled():
    linear = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    for mode in ("no_grad", "grad enabled (training)"):
        # first call: input, weight, bias; second call: the cached weight and bias are reused
        assert casts_per_call(linear, x, torch.bfloat16, mode) == [3, 1], mode
    first, _ = casts_per_call(linear, x, torch.bfloat16, "inference_mode")
    assert first == 3  # whether the second call reuses the copies depends on the version (2.4: 1; 2.14: 3)
    assert set(GRAD_MODES) == {"inference_mode", "no_grad", "grad enabled (training)"}


def test_casts_per_call_no_cache_for_weights_that_do_not_require_grad():
    linear = nn.Linear(8, 8).requires_grad_(False)
    assert casts_per_call(linear, torch.randn(2, 8), torch.bfloat16, "no_grad") == [3, 3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cuda_forward_memory_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        inference.cuda_forward_memory({"float32": (small_cnn(), torch.randn(1, 3, 8, 8))})
