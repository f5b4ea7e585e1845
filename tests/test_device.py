import pytest
import torch

import helpers
from helpers import device as device_module
from helpers import speed as speed_module


def test_pick_device_defaults_to_an_available_device():
    device = helpers.pick_device()
    assert device.type in ("cpu", "cuda", "mps")
    if torch.cuda.is_available():
        assert device.type == "cuda"


def test_pick_device_accepts_cpu():
    assert helpers.pick_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["tpu", "gpu", "not-a-device"])
def test_unknown_device_is_a_value_error_naming_the_choices(name):
    with pytest.raises(ValueError, match="cpu, cuda, mps"):
        helpers.pick_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_missing_cuda_is_a_runtime_error_naming_the_fix():
    with pytest.raises(RuntimeError, match="No cuda device.*use 'cpu'"):
        helpers.pick_device("cuda")


def test_cpu_autocast_dtypes_follow_the_torch_version(monkeypatch):
    assert torch.bfloat16 in helpers.supported_autocast_dtypes("cpu")
    monkeypatch.setattr(device_module.torch, "__version__", "2.1.2")
    assert helpers.supported_autocast_dtypes("cpu") == (torch.bfloat16,)
    monkeypatch.setattr(device_module.torch, "__version__", "2.2.0+cpu")
    assert torch.float16 in helpers.supported_autocast_dtypes("cpu")


def test_check_autocast_dtype_rejects_what_autocast_would_silently_disable():
    assert helpers.check_autocast_dtype("cpu", torch.bfloat16) is torch.bfloat16
    with pytest.raises(ValueError, match="cannot use torch.float64.*autocast_dtype"):
        helpers.check_autocast_dtype("cpu", torch.float64)
    with pytest.raises(ValueError, match="Unknown device type"):
        helpers.check_autocast_dtype("tpu", torch.bfloat16)


def test_autocast_dtype_is_bf16_on_cpu():
    assert helpers.autocast_dtype("cpu") is torch.bfloat16


def test_mps_autocast_depends_on_what_this_torch_offers(monkeypatch):
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda device_type: False)
    assert helpers.supported_autocast_dtypes("mps") == ()
    with pytest.raises(ValueError, match="no autocast for 'mps'"):
        helpers.autocast_dtype("mps")
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda device_type: True)
    assert helpers.autocast_dtype("mps") is torch.float16


def test_fast_dtypes_reads_cpu_flags(monkeypatch):
    monkeypatch.setattr(device_module.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(device_module, "cpu_flags", lambda: {"avx512_bf16"})
    report = helpers.fast_dtypes("cpu")
    assert "reports bf16 instructions (avx512_bf16)" in report["bfloat16"] and "emulated" in report["float16"]
    monkeypatch.setattr(device_module, "cpu_flags", lambda: set())
    assert "no avx512_bf16/amx_bf16" in helpers.fast_dtypes("cpu")["bfloat16"]
    assert "memory-bound ops still gain" in helpers.fast_dtypes("cpu")["bfloat16"]
    monkeypatch.setattr(device_module, "cpu_flags", lambda: {"avx512_bf16", "avx512_fp16"})
    assert "reports fp16 instructions (avx512_fp16)" in helpers.fast_dtypes("cpu")["float16"]


@pytest.mark.parametrize("matmul, elementwise, words", [
    (2.5, 1.8, "native 16-bit math: matmul 2.5x faster"),
    (1.0, 1.6, "about as fast as float32"),
    (0.5, 1.5, "matmul 2.0x slower"),
    (0.01, 1.6, "emulated: matmul 100x slower"),
])
def test_speed_verdict_reads_both_ratios(matmul, elementwise, words):
    verdict = speed_module.speed_verdict(matmul, elementwise)
    assert words in verdict
    assert "memory-bound ops 1.5x faster" in speed_module.speed_verdict(0.01, 1.5)
    assert "memory-bound ops 0.90x float32" in speed_module.speed_verdict(0.01, 0.9)


def test_speed_profile_measures_every_dtype_against_float32():
    profile = helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12, min_run_time=0.001)
    assert list(profile) == ["float32", "bfloat16", "float16"]
    assert profile["float32"].matmul_speedup == profile["float32"].elementwise_speedup == 1.0
    for name in ("bfloat16", "float16"):
        speed = profile[name]
        assert speed.matmul_speedup > 0 and speed.elementwise_speedup > 0
        assert speed.verdict == speed_module.speed_verdict(speed.matmul_speedup, speed.elementwise_speedup)
        assert speed.emulated == (speed.matmul_speedup < speed_module.EMULATED_RATIO)


def test_workload_shrinks_only_for_an_emulated_dtype(monkeypatch):
    fake = {"float32": helpers.DtypeSpeed("float32", 1.0, 1.0, ""),
            "bfloat16": helpers.DtypeSpeed("bfloat16", 2.5, 1.8, ""),
            "float16": helpers.DtypeSpeed("float16", 0.01, 1.6, "")}
    monkeypatch.setattr(speed_module, "speed_profile", lambda device="cpu": fake)
    assert helpers.workload(torch.float32, 100, 10) == 100
    assert helpers.workload(torch.bfloat16, 100, 10) == 100
    assert helpers.workload("float16", 100, 10) == 10
    for ratio, expected in ((0.85, 100), (0.5, 100), (0.2, 10)):  # about as fast, 2x slower, 5x slower
        fake["float16"] = helpers.DtypeSpeed("float16", ratio, 1.6, "")
        assert helpers.workload("float16", 100, 10) == expected


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le", ""])
def test_fast_dtypes_does_not_guess_on_other_cpu_architectures(monkeypatch, machine):
    monkeypatch.setattr(device_module.platform, "machine", lambda: machine)
    monkeypatch.setattr(device_module, "cpu_flags", lambda: {"avx512_bf16"})  # ignored off x86
    report = helpers.fast_dtypes("cpu")
    for dtype in ("bfloat16", "float16"):
        assert "unknown on this architecture: measure" in report[dtype]
        assert "native" not in report[dtype] and "SLOWER" not in report[dtype]
    assert "baseline" in report["float32"]


def test_environment_report_names_versions_and_device():
    report = helpers.environment_report("cpu")
    assert report["torch"] == torch.__version__
    assert report["device"] == "cpu"
    assert report["autocast dtype here"] == "torch.bfloat16"


def test_importing_the_helpers_prints_nothing_where_a_cuda_toolkit_has_no_gpu(tmp_path):
    """torch 2.4 prints "No CUDA runtime is found" when torch.utils.benchmark loads with CUDA_HOME set and no GPU."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "CUDA_HOME": str(tmp_path), "PYTHONPATH": str(root)}
    code = "import helpers, helpers.measure, torch.utils.benchmark; print('imported')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "imported\n"
    assert done.stderr == ""


def test_speed_profile_is_cached_per_machine_and_kernel_choice(monkeypatch):
    first = helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12, min_run_time=0.001)
    assert speed_module.speed_cache_path().exists()
    speed_module._speed_profile.cache_clear()

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again although the profile was cached")

    must_not_measure.cache_clear = lambda: None
    monkeypatch.setattr(speed_module, "_speed_profile", must_not_measure)
    again = helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12)
    assert {k: (v.matmul_speedup, v.elementwise_speedup) for k, v in again.items()} == \
        {k: (v.matmul_speedup, v.elementwise_speedup) for k, v in first.items()}
    assert again["bfloat16"].verdict == first["bfloat16"].verdict
    import os

    other_isa = "AVX2" if os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2" else "SSE41"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", other_isa)  # other kernels: another measurement
    with pytest.raises(AssertionError, match="measured again"):
        helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12)
    with pytest.raises(AssertionError, match="measured again"):
        helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12, refresh=True)
