"""The benchmark measurements and readers (helpers.bench) and the recorder (tools.bench), on tiny sizes and a
tiny model, plus the recorded files and README."""
from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import matplotlib
import pytest
import torch
from torch import nn

import helpers
from helpers import bench
from tools import bench as recorder

matplotlib.use("Agg")
README = Path(__file__).resolve().parent.parent / "docs" / "results.md"  # the recorded results page


def tiny_model(num_classes: int = 10) -> nn.Module:
    """Conv-BN-ReLU-pool-linear: the layer types of a ResNet, small enough for unit tests."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))


def record_with(**changes) -> dict:
    """A minimal valid CPU record, with ``changes`` applied on top."""
    record = {"schema": 1, "created": "2025-01-01T00:00:00+00:00", "command": bench.REPRODUCE,
              "machine": {"device": "cpu", "device_name": "Test CPU", "threads": 2, "gpu_capability": None},
              "versions": {"torch": "2.0", "torchvision": "0.15", "python": "3.11", "cuda": None},
              "settings": {"model": "resnet50", "note": ""},
              "gemm": [{"dtype": "float32", "n": 64, "tflops": 0.5, "seconds": 1e-6},
                       {"dtype": "tf32", "n": 64, "tflops": None, "seconds": None, "absent": "no TF32 on cpu"}],
              "inference": [{"model": "resnet50", "dtype": "float32", "batch": 1, "images_per_s": 10.0,
                             "latency_ms": 100.0, "peak_memory_bytes": 1_000_000}],
              "train_step": [{"model": "resnet50", "mode": "float32", "batch": 2, "step_ms": 50.0,
                              "peak_memory_bytes": 1_500_000}]}
    record.update(changes)
    return record


def assert_documented_fields(record: dict) -> None:
    """The fields of the format in helpers/bench.py that notebooks 01, 03 and 06 and the README read."""
    assert record["schema"] == 1 and {"created", "command", "settings"} <= set(record)
    assert record["machine"]["device"] in ("cpu", "cuda")
    assert {"device_name", "threads", "gpu_capability"} <= set(record["machine"])
    assert {"torch", "torchvision", "cuda"} <= set(record["versions"])
    for entry in record["gemm"]:
        assert {"dtype", "n", "tflops"} <= set(entry) and entry["dtype"] in recorder.GEMM_DTYPES
        assert entry.get("absent") if entry["tflops"] is None else entry["tflops"] > 0  # a missing number says why
    for entry in record["inference"]:
        assert {"model", "dtype", "batch", "images_per_s", "latency_ms", "peak_memory_bytes"} <= set(entry)
    for entry in record["train_step"]:
        assert {"model", "mode", "batch", "step_ms", "peak_memory_bytes"} <= set(entry)


def test_assert_documented_fields_catches_a_number_missing_without_reason():
    assert_documented_fields(record_with())
    with pytest.raises(AssertionError):
        assert_documented_fields(record_with(gemm=[{"dtype": "float16", "n": 64, "tflops": None, "seconds": None}]))
    with pytest.raises(KeyError):
        assert_documented_fields({k: v for k, v in record_with().items() if k != "gemm"})


# ------------------------------------------------------------------------------------------------ plan

def test_plan_cpu_measures_every_gemm_at_one_size_and_keeps_fp16_small():
    settings = recorder.plan("cpu")
    assert isinstance(settings["gemm_n"], int) and settings["gemm_n"] >= 1024
    assert settings["inference_batches"]["float16"] == settings["inference_batches"]["float32"][:2]
    assert settings["inference_batches"]["autocast_float16"] == settings["inference_batches"]["float32"][:2]
    assert max(settings["inference_batches"]["float32"]) > max(settings["inference_batches"]["float16"])
    assert "autocast_float16" not in settings["train_modes"] and "train autocast_float16" in settings["left_out"]
    assert "strict" in settings["float32"] and not settings["cudnn_benchmark"]


def test_plan_cuda_uses_large_sizes_and_every_mode():
    settings = recorder.plan("cuda")
    assert settings["gemm_n"] == 8192 and settings["cudnn_benchmark"]
    assert set(settings["inference_batches"]) == set(bench.INFERENCE_MODES)
    assert all(max(b) >= 128 for b in settings["inference_batches"].values())
    assert settings["train_modes"] == list(recorder.TRAIN_MODES) and "tf32" in settings["train_modes"]
    assert settings["left_out"] == {}
    # ResNet-50 fp32 training at this batch fits a 16 GB GPU (T4, V100 16GB): ~0.2 GB of activations per image
    assert settings["train_batch"] <= 32


def test_cuda_plan_finishes_within_three_minutes_on_an_h100(monkeypatch):
    """The recorder's budget in tools/gpu-validate.sh (BENCH_S) is 180 s: the plan's estimate leaves a margin."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    settings = recorder.plan("cuda")
    counts = recorder.measurement_counts(settings, "cuda")
    assert counts == {"gemm": 4, "inference": 6 * len(settings["inference_batches"]["float32"]), "train": 4}
    estimate = recorder.estimated_seconds(settings, "cuda")
    assert estimate <= 150, f"{estimate:.0f} s: shrink the CUDA plan (batches, min_run_time)"
    # the estimate is the sum of its parts: measurements, autotuning and start-up
    costs = recorder.CUDA_COSTS
    assert estimate == pytest.approx(costs["startup"] + 32 * (settings["min_run_time_s"] + costs["per_measurement"])
                                     + 24 * costs["autotune_inference"] + 4 * costs["autotune_train"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # a T4: fewer modes
    assert recorder.estimated_seconds(settings, "cuda") < estimate


def test_plan_quick_is_tiny_and_unknown_device_is_rejected():
    quick = recorder.plan("cpu", quick=True)
    assert quick["quick"] and quick["image_size"] <= 64 and quick["gemm_n"] <= 128
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        recorder.plan("mps")


# ----------------------------------------------------------------------------------- absent, flags, modes

def test_absent_reason_is_the_one_place_that_knows_what_exists(monkeypatch):
    cpu = torch.device("cpu")
    assert "TF32" in bench.absent_reason("tf32", cpu) and bench.absent_reason("bfloat16", cpu) is None
    assert bench.absent_reason("float16", cpu) is None and bench.absent_reason("autocast_bfloat16", cpu) is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))  # a Volta GPU
    assert "Ampere" in bench.absent_reason("tf32", "cuda")
    assert "bf16" in bench.absent_reason("autocast_bfloat16", "cuda") and bench.absent_reason("float16", "cuda") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # a Hopper GPU
    assert all(bench.absent_reason(mode, "cuda") is None for mode in bench.INFERENCE_MODES + recorder.TRAIN_MODES)


def test_tf32_flags_set_both_and_restore_even_after_an_error():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError):
        with bench.tf32_flags(not saved[0]):
            assert torch.backends.cuda.matmul.allow_tf32 is (not saved[0])
            assert torch.backends.cudnn.allow_tf32 is (not saved[0])
            raise RuntimeError("boom")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved


def test_mode_dtypes_is_the_one_map_of_modes_to_dtypes():
    assert bench.mode_dtypes("float16") == (torch.float16, None)
    assert bench.mode_dtypes("bfloat16") == (torch.bfloat16, None)
    assert bench.mode_dtypes("autocast_float16") == (torch.float32, torch.float16)
    assert bench.mode_dtypes("tf32") == bench.mode_dtypes("float32") == (torch.float32, None)
    assert bench.INFERENCE_MODES == tuple(bench.MODES) and set(recorder.GEMM_DTYPES) < set(bench.MODES)
    with pytest.raises(ValueError, match="Unknown mode"):
        bench.mode_dtypes("int8")


@pytest.mark.parametrize("mode", ["float32", "tf32", "autocast_bfloat16", "bfloat16"])
def test_forward_fn_opens_inference_mode_autocast_and_tf32_as_its_mode_says(mode):
    seen = []

    class Probe(nn.Module):
        def forward(self, x):
            seen.append((torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu"),
                         torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
            return x * 2

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    out = bench.forward_fn(Probe(), torch.ones(2), mode)()
    assert seen == [(True, mode.startswith("autocast"), mode == "tf32", mode == "tf32")]
    assert out.is_inference() and (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved
    if mode.startswith("autocast"):
        linear = nn.Linear(2, 2)
        assert bench.forward_fn(linear, torch.ones(1, 2), mode)().dtype == torch.bfloat16


def test_speedups_against_each_float32_baseline():
    assert recorder.speedups({"float32": 10.0, "tf32": 20.0, "bfloat16": 40.0}) == {
        "bfloat16": {"float32": 4.0, "tf32": 2.0}}
    assert recorder.speedups({"float32": 4.0, "float16": 2.0}, lower_is_faster=True) == {"float16": {"float32": 2.0}}


def test_only_tf32_modes_run_with_tf32_on_and_every_measurement_warms_up_first(monkeypatch):
    """The GPU path's flag handling and warm-up, exercised on CPU (the flags are plain settings there)."""
    seen, calls = [], []
    real_time_it = recorder.time_it

    def spy(fn, **kwargs):
        seen.append((kwargs["sub_label"], torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                     len(calls)))
        return real_time_it(fn, **kwargs)

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = tiny_model()

        def forward(self, x):
            calls.append(1)
            return self.net(x)

    monkeypatch.setattr(recorder, "time_it", spy)
    monkeypatch.setattr(recorder, "absent_reason", lambda mode, device: None)  # pretend TF32 exists here
    recorder.gemm("tf32", 32, "cpu", min_run_time=0.01)
    recorder.gemm("float32", 32, "cpu", min_run_time=0.01)
    assert seen == [("tf32", True, True, 0), ("float32", False, False, 0)]
    for mode in ("tf32", "float32", "autocast_bfloat16"):
        seen.clear(), calls.clear()
        recorder.inference(bench.prepare_model(Counting(), mode), mode, 1, image_size=16, min_run_time=0.01)
        assert seen == [(mode, mode == "tf32", mode == "tf32", 2)]  # warm-up and memory calls before timing
    for mode in ("tf32", "float32"):
        seen.clear(), calls.clear()
        recorder.train_step(Counting(), mode, 2, image_size=16, min_run_time=0.01, num_classes=10)
        assert seen == [(mode, mode == "tf32", mode == "tf32", 2)]


def test_measure_refuses_cuda_where_there_is_none(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="--device cpu"):
        recorder.measure("cuda")
    with pytest.raises(SystemExit) as stopped:  # the command line says so in one line, without a traceback
        recorder.main(["--device", "cuda", "--out", "unused"])
    assert stopped.value.code == 1 and capsys.readouterr().err.startswith("No CUDA device is available here")


# ---------------------------------------------------------------------------------------------- memory

def test_peak_tensor_bytes_counts_live_storage_only():
    def held_together():
        a, b = torch.empty(1000), torch.empty(1000)  # 4000 bytes each, alive at the same time
        return a, b

    def one_after_another():
        for _ in range(3):
            torch.empty(1000)  # freed before the next one
        return None

    assert bench.peak_tensor_bytes(held_together)[1] == 8000
    assert bench.peak_tensor_bytes(one_after_another)[1] == 4000


def test_peak_tensor_bytes_ignores_views_inplace_and_existing_tensors():
    weight = torch.ones(100, 100)

    def fn():
        transposed = weight.t()  # a view of a tensor made before: no new memory
        weight.mul_(1.0)  # in place: no new memory
        return transposed, weight.view(-1)

    (transposed, flat), peak = bench.peak_tensor_bytes(fn)
    assert peak == 0 and flat.numel() == 10_000
    assert bench.peak_tensor_bytes(lambda: weight + 1)[1] == 40_000


def test_peak_tensor_bytes_halves_in_bfloat16():
    model = tiny_model()
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        fp32 = bench.peak_tensor_bytes(lambda: model(x))[1]
        bf16_model, x_bf16 = copy.deepcopy(model).bfloat16(), x.bfloat16()
        bf16 = bench.peak_tensor_bytes(lambda: bf16_model(x_bf16))[1]
    assert fp32 > 0 and fp32 == 2 * bf16


def test_measure_on_cpu_counts_the_tensors_one_call_creates():
    seconds, memory = recorder._measure(lambda: torch.empty(10), torch.device("cpu"), "test", "float32", 0.01)
    assert seconds > 0 and memory == (40, None)  # 10 float32 elements; no reserved memory on a CPU
    assert recorder._measure(lambda: None, torch.device("cpu"), "test", "float32", 0.01, with_memory=False)[1] is None


# ---------------------------------------------------------------------------------------- measurements

def test_gemm_measures_and_tf32_is_absent_on_cpu():
    entry = recorder.gemm("float32", 64, "cpu", min_run_time=0.01)
    assert entry["tflops"] > 0
    assert math.isclose(entry["tflops"], 2 * 64**3 / entry["seconds"] / 1e12)
    assert entry["peak_tflops"] is None and entry["fraction_of_peak"] is None  # no datasheet peak for a CPU
    absent = recorder.gemm("tf32", 64, "cpu")
    assert absent["tflops"] is None and absent["seconds"] is None and "TF32" in absent["absent"]
    assert recorder.gemm("bfloat16", 32, "cpu", min_run_time=0.01)["tflops"] > 0
    with pytest.raises(ValueError, match="Unknown GEMM dtype"):
        recorder.gemm("int8", 64)


def test_prepare_model_converts_a_copy():
    model = tiny_model().train()
    net = bench.prepare_model(model, "bfloat16")
    assert not net.training and next(net.parameters()).dtype == torch.bfloat16
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model.training and next(model.parameters()).dtype == torch.float32
    assert next(bench.prepare_model(model, "autocast_float16").parameters()).dtype == torch.float32


@pytest.mark.parametrize("mode", ["float32", "bfloat16", "autocast_bfloat16", "float16"])
def test_inference_entry(mode):
    net = bench.prepare_model(tiny_model(), mode)
    entry = recorder.inference(net, mode, 2, image_size=16, min_run_time=0.01, model_name="tiny")
    assert entry["model"] == "tiny" and entry["dtype"] == mode and entry["batch"] == 2
    assert math.isclose(entry["images_per_s"], 2 / (entry["latency_ms"] / 1e3))
    # the conv's output alone: 2 images x 8 channels x 16 x 16, in the dtype the conv computes in
    assert entry["peak_memory_bytes"] >= 2 * 8 * 16 * 16 * (4 if mode == "float32" else 2)


def test_inference_memory_counts_the_tensors_one_call_makes_and_autocast_s_weight_copies():
    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.Conv2d(64, 8, 3, padding=1))  # 1.8k + 4.6k weights
    entries = {mode: bench.inference_memory(bench.prepare_model(net, mode), mode, 1, image_size=4)
               for mode in ("float32", "bfloat16", "autocast_bfloat16")}
    assert {e["dtype"] for e in entries.values()} == set(entries) and all(e["batch"] == 1 for e in entries.values())
    assert all(e["peak_reserved_bytes"] is None for e in entries.values())  # a CPU: no allocator figure
    memory = {mode: e["peak_memory_bytes"] for mode, e in entries.items()}
    assert memory["float32"] == 2 * memory["bfloat16"]  # the same activations, half the bytes
    assert memory["autocast_bfloat16"] > memory["float32"]  # per call: the weights cast again, on top


@pytest.mark.parametrize("mode", recorder.TRAIN_MODES)
def test_train_step_leaves_the_model_alone_and_counts_gradients(mode):
    model = tiny_model()
    before = copy.deepcopy(model.state_dict())
    entry = recorder.train_step(model, mode, 2, image_size=16, min_run_time=0.01, num_classes=10)
    assert entry["mode"] == mode and entry["step_ms"] > 0
    # new gradients every step (zero_grad sets them to None); the momentum buffers exist since the warm-up
    assert entry["peak_memory_bytes"] >= helpers.parameter_bytes(model, include_buffers=False)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert entry["peak_reserved_bytes"] is None  # reserved memory: CUDA only
    if mode == "autocast_float16":
        scaler = entry["scaler"]
        assert scaler["init_scale"] == 2.0**16 and scaler["steps"] >= 3  # warm-up, memory call, timed steps
        assert 0 <= scaler["skipped_steps"] <= scaler["steps"]
        assert scaler["final_scale"] == scaler["init_scale"] / 2 ** scaler["skipped_steps"]  # no growth this soon
    else:
        assert entry["scaler"] is None
    with pytest.raises(ValueError, match="Unknown training mode"):
        recorder.train_step(model, "float16", 2)


def test_train_step_records_the_steps_a_grad_scaler_skips(monkeypatch):
    """At a huge initial scale the fp16 backward overflows: the skipped steps and the halved scale are recorded."""
    monkeypatch.setattr(recorder, "INIT_SCALE", 2.0**100)
    entry = recorder.train_step(tiny_model(), "autocast_float16", 2, image_size=16, min_run_time=0.01, num_classes=10)
    scaler = entry["scaler"]
    assert scaler["init_scale"] == 2.0**100 and scaler["skipped_steps"] >= 1
    assert scaler["final_scale"] == 2.0**100 / 2 ** scaler["skipped_steps"]
    text = recorder.results_markdown([record_with(train_step=[entry])])
    assert f"skipped {scaler['skipped_steps']} of {scaler['steps']} steps" in text


# ------------------------------------------------------------------------------- whole record and CLI

@pytest.fixture
def tiny_bench(monkeypatch):
    """Make the recorder measure the tiny model (the CLI and file handling are what is tested)."""
    import torchvision

    monkeypatch.setattr(torchvision.models, "get_model", lambda name, weights=None: tiny_model(1000))


def test_main_quick_records_a_valid_file(tiny_bench, tmp_path, capsys):
    record = recorder.main(["--quick", "--device", "cpu", "--out", str(tmp_path), "--note", "unit test"])
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and files[0].name.startswith("cpu_")
    saved = json.loads(files[0].read_text())
    assert_documented_fields(saved)
    assert saved == json.loads(json.dumps(record))
    assert saved["command"].endswith("--note 'unit test'") and saved["command"].startswith(bench.REPRODUCE)
    assert saved["settings"]["note"] == "unit test" and saved["settings"]["quick"] is True
    assert [e["dtype"] for e in saved["gemm"]] == list(recorder.GEMM_DTYPES)
    assert next(e for e in saved["gemm"] if e["dtype"] == "tf32")["tflops"] is None
    assert {e["dtype"] for e in saved["inference"]} == set(bench.INFERENCE_MODES) - {"tf32"}
    assert {e["mode"] for e in saved["train_step"]} == {"float32", "autocast_bfloat16"}
    assert "tf32" in saved["settings"]["absent"] and isinstance(saved["settings"]["cpu_16bit_flags"], list)
    assert all(e["peak_memory_bytes"] > 0 for e in saved["inference"] + saved["train_step"])
    assert bench.load_records(tmp_path, device="cpu") == [saved] and bench.load_records(tmp_path, "cuda") == []
    out = capsys.readouterr().out
    assert "wrote" in out and "inference, images/s by batch size" in out  # the summary after the run


def test_main_quick_needs_out_and_saves_nothing_without_it(tiny_bench, monkeypatch, tmp_path):
    monkeypatch.setattr(recorder, "BENCH_DIR", tmp_path)
    with pytest.raises(SystemExit):
        recorder.main(["--quick", "--device", "cpu"])
    assert list(tmp_path.iterdir()) == []


def test_main_readme_prints_the_section(tmp_path, capsys):
    recorder.save_record(record_with(), tmp_path)
    recorder.main(["--readme", "--out", str(tmp_path)])
    assert capsys.readouterr().out == recorder.results_markdown(bench.load_records(tmp_path))


def test_save_record_writes_one_file_per_machine_and_device(tmp_path):
    record = record_with(machine={"device": "cuda", "device_name": "NVIDIA H200", "threads": 16,
                                  "gpu_capability": "9.0"})
    assert recorder.save_record(record, tmp_path) == tmp_path / "cuda_nvidia-h200.json"
    assert recorder.save_record(record, tmp_path) == tmp_path / "cuda_nvidia-h200.json"
    assert len(list(tmp_path.iterdir())) == 1


def test_results_markdown_says_when_gpu_results_are_missing_and_what_memory_means():
    cpu_only = recorder.results_markdown([record_with()])
    assert cpu_only.startswith("## Results\n") and "No GPU results are recorded yet" in cpu_only
    assert "| tf32 | 64 | absent |" in cpu_only and "| float32 | 10 |" in cpu_only
    assert "strict fp32" in cpu_only and "on top of the weights" in cpu_only
    assert "| float32 | 2 | 50 | 1.5 |" in cpu_only  # 1.5e6 bytes
    older = record_with(train_step=[{"model": "resnet50", "mode": "float32", "batch": 2, "step_ms": 50.0,
                                     "peak_memory_bytes": None, "peak_tensor_bytes": 2_000_000}])
    assert "| float32 | 2 | 50 | 2 |" in recorder.results_markdown([older])  # older CPU records kept it there
    gpu = record_with(machine={"device": "cuda", "device_name": "GPU", "threads": 1, "gpu_capability": "9.0"})
    assert "No GPU results" not in recorder.results_markdown([record_with(), gpu])
    assert "fraction of peak" not in recorder.results_markdown([gpu])  # an unknown GPU: no datasheet


def test_results_markdown_reports_gemms_as_a_fraction_of_the_datasheet_peak():
    h100 = record_with(machine={"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "threads": 16,
                                "gpu_capability": "9.0"},
                       gemm=[{"dtype": "float32", "n": 8192, "tflops": 50.25, "seconds": 0.02},
                             {"dtype": "bfloat16", "n": 8192, "tflops": 742.1, "seconds": 0.002}])
    text = recorder.results_markdown([h100])
    assert "fraction of the H100 SXM's dense datasheet peak" in text and "about 80%" in text
    assert "| float32 | 8192 | 50.2 | 67 | 0.75 |" in text
    assert "| bfloat16 | 8192 | 742 | 989.5 | 0.75 |" in text


def test_results_markdown_names_both_float32_baselines_where_tf32_was_measured():
    def entries(key, values):
        return [{"model": "resnet50", key: m, "batch": 32, "images_per_s": v, "step_ms": v, "latency_ms": 1.0,
                 "peak_memory_bytes": 1} for m, v in values]

    gpu = record_with(machine={"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "threads": 16,
                               "gpu_capability": "9.0"},
                      inference=entries("dtype", (("float32", 100.0), ("tf32", 250.0), ("autocast_bfloat16", 500.0))),
                      train_step=entries("mode", (("float32", 300.0), ("tf32", 150.0), ("autocast_bfloat16", 100.0))))
    text = recorder.results_markdown([gpu])
    assert ("Inference at batch 32, speed-up over each float32 baseline: autocast_bfloat16 5.00x strict fp32, "
            "2.00x TF32.") in text
    assert ("Training step, speed-up over each float32 baseline: autocast_bfloat16 3.00x strict fp32, "
            "1.50x TF32.") in text
    assert "speed-up" not in recorder.results_markdown([record_with()])  # a CPU: strict fp32 is its only float32


def test_plot_inference_draws_what_is_recorded():
    records = [record_with(inference=[{"dtype": m, "batch": b, "images_per_s": float(b), "latency_ms": 1.0}
                                      for m in ("float32", "bfloat16") for b in (1, 8)])]
    ax = bench.plot_inference(records)
    assert len(ax.lines) == 2 and list(ax.lines[0].get_xdata()) == [1, 8]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8"]
    assert len(bench.plot_inference(records, metric="peak_memory_bytes").lines) == 0  # nothing recorded: no line


# ------------------------------------------------------------------------- recorded files and README

def test_recorded_files_are_valid_and_honest():
    records = bench.load_records()
    assert any(r["machine"]["device"] == "cpu" for r in records), f"record this CPU with {bench.REPRODUCE}"
    for record in records:
        assert_documented_fields(record)
        assert not record["settings"]["quick"], "quick (smoke-test) results must not be committed"
        for entry in record["inference"] + record["train_step"]:  # older CPU records: peak_tensor_bytes
            assert (entry.get("peak_memory_bytes") or entry.get("peak_tensor_bytes") or 0) > 0
        if record["machine"]["device"] == "cpu":
            assert record["machine"]["gpu_capability"] is None
            assert all(e["tflops"] is None for e in record["gemm"] if e["dtype"] == "tf32")


def test_readme_results_section_matches_the_recorded_files():
    text = README.read_text()
    match = re.search(r"^## Results\n.*?(?=^## )", text, flags=re.M | re.S)
    assert match, "README.md needs a '## Results' section before the next '## ' heading"
    assert match.group(0).rstrip("\n") == recorder.results_markdown(bench.load_records()).rstrip("\n"), (
        f"regenerate it: {bench.REPRODUCE} --readme")
