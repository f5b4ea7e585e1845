"""helpers.deploy (notebook 06's harnesses) and exercise 06.4: a broken serving function is rejected, the
repaired one accepted."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import deploy
from helpers import state as state_mod
from helpers.exercises import check, solution


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


def test_load_photo_and_resize():
    image, preprocess, photo = deploy.load_photo()
    assert image.size == (512, 600) and photo.shape == (1, 3, 224, 224) and photo.dtype == torch.float32
    assert photo.is_contiguous()  # NCHW, whatever layout the decoded image had
    assert deploy.resize(photo, 224) is photo
    small = deploy.resize(photo, 64)
    assert small.shape == (1, 3, 64, 64)
    # antialiased downsampling keeps the mean of each channel (to within the resampling error)
    assert torch.allclose(small.mean(dim=(2, 3)), photo.mean(dim=(2, 3)), atol=0.05)


def test_torch_sources_mentioning_finds_a_real_name_and_not_a_made_up_one():
    n_files, hits = deploy.torch_sources_mentioning("class GradScaler")
    assert n_files > 500 and any(h.endswith("grad_scaler.py") for h in hits)
    assert deploy.torch_sources_mentioning("FP16_Optimizer_that_never_existed")[1] == []


def test_snapshot_changed_and_count_changes():
    net = small_net().train()
    before = state_mod.snapshot(net)
    net(torch.randn(4, 3, 8, 8))  # training-mode forward: BatchNorm buffers move, parameters do not
    changed = state_mod.changed(before, state_mod.snapshot(net))
    assert changed == {name for name, _ in net.named_buffers()}
    assert state_mod.count_changes(net, changed) == {"parameters changed": "0 of 6", "buffers changed": "3 of 3"}
    assert state_mod.changed(before, before) == set()
    # a dtype change counts as a change, even where every value survives the cast
    halved = {name: t.half() if t.is_floating_point() else t for name, t in before.items()}
    assert state_mod.changed(before, halved) == {name for name, t in before.items() if t.is_floating_point()}


def test_logits_with_loads_the_state_in_eval_mode():
    net = small_net()
    state = state_mod.snapshot(net)
    x = torch.randn(2, 3, 8, 8)
    logits = deploy.logits_with(net.train(), state, x)
    assert not net.training and torch.is_inference(logits)
    assert state_mod.changed(state, state_mod.snapshot(net)) == set()  # eval mode: the statistics did not move


def test_compare_logits():
    reference = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0]])
    row = deploy.compare_logits(reference.to(torch.bfloat16), reference)
    assert row == {"dtype": "bfloat16", "relative error": 0.0, "top-1 same": True, "top-5 shared": 5}
    moved = reference.clone()
    moved[0, 0] = 11.0  # a new top-1, and class 2 leaves the top 5
    row = deploy.compare_logits(moved, reference)
    assert row["relative error"] == pytest.approx(1.1) and not row["top-1 same"] and row["top-5 shared"] == 4


def test_layout_times_restores_the_model_and_times_both_layouts():
    net = small_net().eval()
    times = deploy.layout_times(net, torch.randn(1, 3, 16, 16), min_run_time=0.01)
    assert set(times) == set(deploy.LAYOUTS) and all(t > 0 for t in times.values())
    assert net[0].weight.is_contiguous()
    assert set(deploy.layout_times(net, torch.randn(1, 3, 16, 16), dtype=torch.bfloat16, min_run_time=0.01))


def test_onednn_conv_kernels_parses_verbose_lines(monkeypatch):
    logs = iter([
        "\n".join([
            "onednn_verbose,v1,primitive,info,template:operation,engine,primitive,implementation",
            "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:blk,undef,src:f32::blocked:abcd::f0,,1x64x56x56,0.3",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32,alg,0.5"]),
        "onednn_verbose,primitive,exec,cpu,convolution,brg_conv_fwd:avx2,forward_training,src:f32,alg,0.4",
    ])
    monkeypatch.setattr(deploy, "_c_stdout_of", lambda fn: next(logs))
    assert deploy.onednn_conv_kernels() == {
        "contiguous (NCHW)": ["reorder jit:blk", "convolution jit:avx512_core"],
        "channels_last (NHWC)": ["convolution brg_conv_fwd:avx2"]}


def test_c_stdout_of_captures_what_c_code_prints_below_sys_stdout():
    import ctypes

    libc = ctypes.CDLL(None)
    text = deploy._c_stdout_of(lambda: (libc.printf(b"from C %d\n", 42), libc.fflush(None)))
    assert text == "from C 42\n"


def test_onednn_conv_kernels_names_a_convolution_where_onednn_runs():
    kernels = deploy.onednn_conv_kernels()
    assert set(kernels) == set(deploy.LAYOUTS)
    if torch.backends.mkldnn.is_available() and any(kernels.values()):
        assert all(any(k.startswith("convolution ") for k in found) for found in kernels.values())


def test_mode_dtype():
    assert deploy.mode_dtype("autocast_bfloat16") == torch.bfloat16
    assert deploy.mode_dtype("float16") == torch.float16
    assert deploy.mode_dtype("tf32") == torch.float32


def test_sweep_plan_shrinks_when_a_dtype_is_emulated(monkeypatch):
    monkeypatch.setattr(deploy, "workload", lambda dtype, full, reduced, device: full)
    plan = deploy.sweep_plan("cpu", torch.bfloat16)
    assert plan == {"image_size": 128, "batches": {m: [1, 4] for m in
                                                   ("float32", "autocast_bfloat16", "bfloat16", "float16")}}
    monkeypatch.setattr(deploy, "workload",
                        lambda dtype, full, reduced, device: full if dtype == torch.float32 else reduced)
    plan = deploy.sweep_plan("cpu", torch.bfloat16)
    assert plan["image_size"] == 64 and plan["batches"]["float32"] == [1, 4]
    assert plan["batches"]["float16"] == plan["batches"]["autocast_bfloat16"] == [1]


def test_inference_sweep_table_concurrency_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    plan = {"image_size": 16, "batches": {"float32": [1, 2], "bfloat16": [1]}}
    entries, weights = deploy.inference_sweep(small_net(), plan, "cpu", min_run_time=0.01)
    assert [(e["dtype"], e["batch"]) for e in entries] == [("float32", 1), ("float32", 2), ("bfloat16", 1)]
    assert weights["float32"] > weights["bfloat16"]
    table = deploy.sweep_table(entries)
    assert table.splitlines()[0].split()[:3] == ["mode", "batch", "images/s"] and len(table.splitlines()) == 4
    answer = deploy.concurrency(entries, weights, "bfloat16")
    assert 1.5 < answer["weights, fp32 / 16-bit"] <= 2  # the int64 BatchNorm counter does not halve
    assert 1.8 < answer["activation memory per request, fp32 / 16-bit"] < 2.2  # tensor bytes halve
    assert answer["images/s, 16-bit / fp32"] > 0
    fig = deploy.plot_sweep(entries)
    assert len(fig.axes) == 2


def test_gemm_vs_peak_uses_the_datasheet_for_gpu_records_only():
    gpu = {"machine": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
           "gemm": [{"dtype": "bfloat16", "n": 8192, "tflops": 700.0},
                    {"dtype": "tf32", "n": 8192, "tflops": None}]}
    cpu = {"machine": {"device": "cpu", "device_name": "AMD EPYC"},
           "gemm": [{"dtype": "float32", "n": 1024, "tflops": 0.2}]}
    rows = deploy.gemm_vs_peak([gpu, cpu], fraction=lambda tflops, name, dtype: tflops / 1000.0)
    assert rows == [{"device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16", "n": 8192, "TFLOP/s": 700.0,
                     "fraction of peak": 0.7}]
    assert deploy.gemm_vs_peak([cpu]) == []


def test_gemm_vs_peak_with_the_real_peaks_file():
    pytest.importorskip("helpers.peaks")
    gpu = {"machine": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
           "gemm": [{"dtype": "bfloat16", "n": 8192, "tflops": 791.2}]}
    (row,) = deploy.gemm_vs_peak([gpu])
    assert row["fraction of peak"] is not None and 0.5 < row["fraction of peak"] < 1


# --- exercise 06.4 ------------------------------------------------------------------------------------------------

def broken_serve(model: nn.Module, request: torch.Tensor) -> torch.Tensor:
    """The article's recipe, as the notebook gives it (on CPU: bf16 autocast, no scaler)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        output = model(request)
    loss = nn.functional.cross_entropy(output, output.argmax(dim=1))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return output


def eval_only(model: nn.Module, request: torch.Tensor) -> torch.Tensor:
    """Half a repair: eval mode and no training step, but autograd still on."""
    model.eval()
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        return model(request)


def no_eval(model: nn.Module, request: torch.Tensor) -> torch.Tensor:
    """The other half: inference mode, but training mode left on (BatchNorm statistics move)."""
    with torch.inference_mode(), torch.amp.autocast("cpu", dtype=torch.bfloat16):
        return model(request)


def fp32_repair(model: nn.Module, request: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.inference_mode():
        return model(request)


def test_06_4_solution_serves_correctly():
    unchanged, inference, predictions = solution("06.4")
    assert unchanged and inference and len(predictions) == 16
    from helpers.data import shapes_dataset

    assert predictions == shapes_dataset("test", n=16).tensors[1].tolist()  # the trained model is right on all 16


@pytest.mark.parametrize("serve", [broken_serve, eval_only, no_eval], ids=lambda f: f.__name__)
def test_06_4_broken_serving_is_rejected(serve):
    assert check("06.4", deploy.serving_result(serve)) is False


def test_06_4_a_correct_fp32_repair_is_accepted_too():
    assert check("06.4", deploy.serving_result(fp32_repair)) is True
