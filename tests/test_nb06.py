"""helpers.nb06 (notebook 06's scaffolding) and notebook 06's exercise solutions: 06.4's broken serving
functions are rejected, the repaired ones accepted."""
from __future__ import annotations

import matplotlib
import pytest
import torch
from torch import nn

import helpers
from helpers import bench, nb06
from helpers import state as state_mod
from helpers.exercises import feedback, grade, solution
from helpers.solutions import nb06 as solutions_06

matplotlib.use("Agg")


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))


def test_load_photo_and_resize():
    image, preprocess, photo = nb06.load_photo()
    assert image.size == (512, 600) and photo.shape == (1, 3, 224, 224) and photo.dtype == torch.float32
    assert photo.is_contiguous()  # NCHW, whatever layout the decoded image had
    assert nb06.resize(photo, 224) is photo
    small = nb06.resize(photo, 64)
    assert small.shape == (1, 3, 64, 64)
    # antialiased downsampling keeps the mean of each channel (to within the resampling error)
    assert torch.allclose(small.mean(dim=(2, 3)), photo.mean(dim=(2, 3)), atol=0.05)


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


def test_compare_logits():
    reference = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0]])
    row = nb06.compare_logits(reference.to(torch.bfloat16), reference)
    assert row == {"dtype": "bfloat16", "relative error": 0.0, "top-1 same": True, "top-5 shared": 5}
    moved = reference.clone()
    moved[0, 0] = 11.0  # a new top-1, and class 2 leaves the top 5
    row = nb06.compare_logits(moved, reference)
    assert row["relative error"] == pytest.approx(1.1) and not row["top-1 same"] and row["top-5 shared"] == 4


def test_onednn_conv_kernels_parses_verbose_lines(monkeypatch):
    logs = iter([
        "\n".join([
            "onednn_verbose,v1,primitive,info,template:operation,engine,primitive,implementation",
            "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:blk,undef,src:f32::blocked:abcd::f0,,1x64x56x56,0.3",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32,alg,0.5"]),
        "onednn_verbose,primitive,exec,cpu,convolution,brg_conv_fwd:avx2,forward_training,src:f32,alg,0.4",
    ])
    monkeypatch.setattr(nb06, "_c_stdout_of", lambda fn: next(logs))
    assert nb06.onednn_conv_kernels() == {
        "contiguous (NCHW)": ["reorder jit:blk", "convolution jit:avx512_core"],
        "channels_last (NHWC)": ["convolution brg_conv_fwd:avx2"]}


def test_c_stdout_of_captures_what_c_code_prints_below_sys_stdout():
    import ctypes

    libc = ctypes.CDLL(None)
    text = nb06._c_stdout_of(lambda: (libc.printf(b"from C %d\n", 42), libc.fflush(None)))
    assert text == "from C 42\n"


def test_onednn_conv_kernels_names_a_convolution_where_onednn_runs():
    kernels = nb06.onednn_conv_kernels()
    assert set(kernels) == set(nb06.LAYOUTS)
    if torch.backends.mkldnn.is_available() and any(kernels.values()):
        assert all(any(k.startswith("convolution ") for k in found) for found in kernels.values())


def test_memory_table_gives_mib_per_request():
    entries = [{"dtype": "float32", "batch": 4, "peak_memory_bytes": 8 * 2**20, "peak_reserved_bytes": None},
               {"dtype": "autocast_bfloat16", "batch": 1, "peak_memory_bytes": 2**20, "peak_reserved_bytes": 3 * 2**20}]
    table = nb06.memory_table(entries).splitlines()
    assert table[0].split() == ["mode", "batch", "MiB/request", "reserved", "MiB"]
    assert table[1].split() == ["float32", "4", "2.00", "-"]
    assert table[2].split() == ["autocast_bfloat16", "1", "1.00", "3.0"]


def test_photo_batch_copies_the_photo_channels_last():
    photo = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    batch = nb06.photo_batch(photo, 3, 16)
    assert batch.shape == (3, 3, 16, 16) and batch.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch[0], batch[2]) and torch.equal(batch[:1], nb06.resize(photo, 16))


def test_section_7_prints_a_reason_and_a_claim_only_through_the_shared_helpers():
    """06 §7 reads its verdicts with helpers.timing.against_rule and its reasons with helpers.roofs;
    the old per-notebook reasons (a cause chosen by branch) are gone."""
    sources = "\n".join(support_cell_sources())
    assert "helpers.timing.against_rule(c, expected, verdicts=verdicts)" in sources
    assert "roof.reason(c, *kernels, measured)" in sources
    assert "error=helpers.timing.shared_error(verdicts)" in sources
    assert not hasattr(nb06, "against_rule") and not hasattr(nb06, "advised_not_faster")


def support_cell_sources() -> list[str]:
    from tests.support import code_cells
    return code_cells("06")


# --- exercises 06.1-06.3 -----------------------------------------------------------------------------------

def test_solution_06_1_half_resnet50_bytes():
    from torchvision import models

    model = models.resnet50(weights=None)
    floats = sum(t.numel() for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point())
    counters = sum(t.numel() for t in model.buffers() if not t.is_floating_point())
    assert solution("06.1") == 2 * floats + 8 * counters
    assert grade("06.1", 4 * floats + 8 * counters) is False


def test_solution_06_2_reads_the_best_speeds_of_the_first_cpu_record(monkeypatch):
    from helpers.solutions import nb06 as solutions_nb06

    inference = [{"dtype": mode, "batch": batch, "images_per_s": speed} for mode, batch, speed in
                 (("float32", 1, 15.0), ("float32", 8, 20.0), ("bfloat16", 1, 30.0), ("bfloat16", 8, 45.0),
                  ("float16", 1, 99.0))]
    monkeypatch.setattr(solutions_nb06, "load_records",
                        lambda device=None: [{"inference": inference}, {"inference": []}])
    assert solution("06.2") == pytest.approx(45.0 / 20.0)
    assert grade("06.2", 2.25) is True and grade("06.2", 30.0 / 15.0) is False  # batch 1 is not the best


def test_solution_06_2_on_the_recorded_file():
    inference = bench.load_records(device="cpu")[0]["inference"]
    speeds = sorted((e["images_per_s"], e["dtype"]) for e in inference if e["dtype"] in ("float32", "bfloat16"))
    best_bf16 = next(v for v, mode in reversed(speeds) if mode == "bfloat16")
    best_fp32 = next(v for v, mode in reversed(speeds) if mode == "float32")
    assert solution("06.2") == pytest.approx(best_bf16 / best_fp32)


@pytest.mark.parametrize("key", ["06.1", "06.3"])
def test_checks_06_1_and_06_3_leave_the_learner_s_global_generator_alone(key):
    solutions_06.SOLUTIONS[key].cache_clear()  # the check must compute its answer now, not reuse it
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert grade(key, 1.0) is False  # the check builds a ResNet-50 to compute the right answer
    assert torch.equal(torch.rand(3), expected)


def test_solution_06_3_fp16_headroom_on_the_photo():
    from torchvision import models

    from helpers.solutions.nb06 import photo_batch

    torch.manual_seed(0)
    model = models.resnet50(weights=None).eval()
    largest = []
    hook = nn.modules.module.register_module_forward_hook(  # every module's call, a different mechanism
        lambda module, inputs, output: largest.append(output.abs().max().item()))
    try:
        with torch.inference_mode():
            logits = model(photo_batch())
    finally:
        hook.remove()
    assert solution("06.3") == pytest.approx(65504 / max(largest), rel=1e-4)
    assert 1 < solution("06.3") < 65504 / logits.abs().max().item()  # some layer's output beats the logits
    assert grade("06.3", 65504 / logits.abs().max().item()) is False


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


def _serve(model, request, *, eval_mode=True, grad_mode=torch.inference_mode, dtype=torch.bfloat16,
           enabled=True, convert=None, loss=False, cast=None):
    if eval_mode:
        model.eval()
    if convert:
        model.to(convert)
        request = request.to(convert)
    with grad_mode(), torch.amp.autocast("cpu", dtype=dtype, enabled=enabled):
        output = model(request)
        if loss:
            nn.functional.cross_entropy(output, output.argmax(dim=1))
        return output.to(cast) if cast else output


def step_swallowed(model: nn.Module, request: torch.Tensor) -> torch.Tensor:
    """eval() and inference_mode added, the training step kept, its error hidden by try/except."""
    model.eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    with torch.inference_mode(), torch.amp.autocast("cpu", dtype=torch.bfloat16):
        output = model(request)
        try:
            nn.functional.cross_entropy(output, output.argmax(dim=1)).backward()
            optimizer.step()
        except RuntimeError:
            pass
    return output


def step_kept(model: nn.Module, request: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.inference_mode(), torch.amp.autocast("cpu", dtype=torch.bfloat16):
        output = model(request)
        nn.functional.cross_entropy(output, output.argmax(dim=1)).backward()
    return output


WRONG_06_4 = {  # name: (answer, the feedback line must contain)
    "as given": (broken_serve, "changed the model's weights (an optimizer step)"),
    "the printed (unchanged, inference, predictions) tuple": (
        (True, True, list(range(16))), "repaired function itself"),
    "a float32 server": (lambda m, r: _serve(m, r, enabled=False), "ran in float32, not in bfloat16"),
    "a float32 server, result cast": (lambda m, r: _serve(m, r, enabled=False, cast=torch.bfloat16),
                                     "ran in float32"),
    "autocast float16 on a bfloat16 machine": (lambda m, r: _serve(m, r, dtype=torch.float16),
                                               "ran in float16, not in bfloat16"),
    "the step under inference_mode, error swallowed": (step_swallowed, "caught a RuntimeError with try/except"),
    "the step under inference_mode": (step_kept, "serve raised RuntimeError"),
    "no eval()": (lambda m, r: _serve(m, r, eval_mode=False), "BatchNorm's running statistics"),
    "autograd left on": (lambda m, r: _serve(m, r, grad_mode=torch.enable_grad), "not inference tensors"),
    "no_grad for inference_mode": (lambda m, r: _serve(m, r, grad_mode=torch.no_grad), "not inference tensors"),
    "weights converted with .bfloat16()": (lambda m, r: _serve(m, r, convert=torch.bfloat16),
                                           "converted the model's weights"),
    "a loss still computed": (lambda m, r: _serve(m, r, loss=True), "still computes a loss"),
}


@pytest.mark.parametrize("name", WRONG_06_4)
def test_06_4_wrong_repairs_are_rejected_with_what_failed(name):
    answer, words = WRONG_06_4[name]
    reason = feedback("06.4", answer)
    assert reason is not None and words in reason, reason


@torch.inference_mode()
def decorated_serve(model: nn.Module, request: torch.Tensor) -> torch.Tensor:
    """A right repair written differently: decorator, train(False), torch.autocast, the dtype asked."""
    model.train(False)
    with torch.autocast(device_type=request.device.type, dtype=helpers.autocast_dtype(request.device)):
        return model(request).float()


def test_06_4_the_solution_and_a_repair_written_differently_are_accepted():
    assert feedback("06.4", solutions_06.serve) is None
    assert feedback("06.4", decorated_serve) is None


def test_06_4_a_hard_coded_dtype_fails_where_the_machine_s_autocast_dtype_differs(monkeypatch):
    monkeypatch.setattr(solutions_06, "autocast_dtype", lambda device: torch.float16)  # a T4-like machine
    assert "ran in bfloat16, not in float16" in feedback("06.4", lambda m, r: _serve(m, r))
    assert feedback("06.4", lambda m, r: _serve(m, r, dtype=torch.float16)) is None


def test_06_4_serving_result_shows_the_broken_recipe_s_symptoms():
    unchanged, inference, predictions = nb06.serving_result(broken_serve)
    assert not unchanged and not inference and len(predictions) == 16
