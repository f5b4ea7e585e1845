import os
import re

import pytest
import torch

import helpers
from helpers import device as device_module
from helpers import precision as precision_module
from tests.support import fresh_part


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
    with pytest.raises(ValueError, match="no autocast for 'mps'.*AMP_COURSE_DEVICE=cpu"):
        helpers.autocast_dtype("mps")
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda device_type: True)
    for version, expected in (("2.5.1", (torch.float16,)), ("2.6.0", (torch.float16, torch.bfloat16)),
                              ("2.14.1+cpu", (torch.float16, torch.bfloat16))):  # bf16: pytorch#139390
        monkeypatch.setattr(torch, "__version__", version)
        assert helpers.supported_autocast_dtypes("mps") == expected  # what autocast accepts, not the rule


def a_mac(monkeypatch, version: str, macos: str) -> None:
    """This process as a Mac (untested here: no Mac ran it): torch ``version``, macOS ``macos``, MPS on."""
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(precision_module.platform, "mac_ver", lambda: (macos, ("", "", ""), "arm64"))
    monkeypatch.setattr(torch.amp.autocast_mode, "is_autocast_available", lambda device_type: True)
    monkeypatch.setattr(device_module, "_device_available", lambda kind: kind in ("cpu", "mps"))
    monkeypatch.delenv("AMP_COURSE_DEVICE", raising=False)


@pytest.mark.parametrize("version, macos, dtype", [
    ("2.5.1", "14.5", None), ("2.7.1", "14.5", None),  # no GradScaler on MPS (pytorch#150255)
    ("2.8.0", "13.6", torch.float16), ("2.8.0", "14.5", torch.float16), ("2.14.1", "15.3", torch.float16)])
def test_a_mac_trains_on_the_cpu_unless_the_learner_asks_for_mps_and_then_hears_it_is_untested(
        monkeypatch, version, macos, dtype):
    """No Mac run is recorded: the course never picks MPS by itself (the rule says measure there, 48.1);
    AMP_COURSE_DEVICE=mps opts in, the machine line says untested, and the lessons show fp16 + GradScaler
    from torch 2.8 (never bf16: emulated on M1/M2)."""
    a_mac(monkeypatch, version, macos)
    assert helpers.pick_device().type == "cpu"
    assert helpers.choose_precision(helpers.describe_device("mps"))["training"].dtype is not torch.float16
    assert helpers.autocast_dtype(helpers.pick_device()) is torch.bfloat16  # the CPU's, with the CPU
    monkeypatch.setenv("AMP_COURSE_DEVICE", "mps")
    device = helpers.pick_device()
    assert device == torch.device("mps")
    assert "untested here" in helpers.machine_stamp(device) and "AMP_COURSE_DEVICE=mps" in helpers.machine_stamp(device)
    if dtype is None:
        with pytest.raises(ValueError, match=r"cannot train in 16 bits on MPS.*pytorch#150255.*=cpu"):
            helpers.autocast_dtype("mps")
    else:
        assert helpers.autocast_dtype("mps") is dtype and helpers.needs_grad_scaler(dtype)


def test_one_cpu_switch_moves_the_device_and_its_autocast_dtype(monkeypatch):
    """AMP_COURSE_DEVICE=cpu on a Mac with torch 2.8: the device *and* the amp dtype are the CPU's."""
    a_mac(monkeypatch, "2.8.0", "14.5")
    monkeypatch.setenv("AMP_COURSE_DEVICE", "mps")
    assert helpers.pick_device() == torch.device("mps")
    assert helpers.autocast_dtype(helpers.pick_device()) is torch.float16
    monkeypatch.setenv("AMP_COURSE_DEVICE", "cpu")
    device = helpers.pick_device()
    assert device == torch.device("cpu") and helpers.autocast_dtype(device) is torch.bfloat16
    assert "chosen by AMP_COURSE_DEVICE=cpu" in helpers.machine_stamp(device)
    assert helpers.pick_device("mps") == torch.device("mps")  # an explicit choice still wins
    monkeypatch.setenv("AMP_COURSE_DEVICE", "tpu")
    with pytest.raises(ValueError, match="cpu, cuda, mps"):
        helpers.pick_device()


@pytest.mark.parametrize("flags", [[], ["avx512f"], ["avx_ne_convert"], None],
                         ids=["AVX2", "AVX512F", "AVX-NE-CONVERT", "unreadable"])
def test_the_notebooks_fallback_dtype_runs_where_the_rule_says_float32_or_measure(monkeypatch, flags):
    """On a CPU whose rule trains in bf16 the fallback never runs: here a simulated CPU without native
    16-bit arithmetic, where the lessons autocast to emulated bf16 and size their work as emulated."""
    monkeypatch.setattr(precision_module, "_reported_cpu_flags", lambda: (flags, "a simulated description"))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    training = helpers.choose_precision(helpers.describe_device("cpu"))["training"]
    assert training.how == ("measure" if flags is None else "float32")
    dtype = helpers.autocast_dtype("cpu")
    assert dtype is torch.bfloat16 and not helpers.needs_grad_scaler(dtype)
    assert helpers.workload(dtype, 1024, 64) == 64  # emulated: the reduced size
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    batches = [(torch.randn(16, 8), torch.randint(0, 4, (16,)))] * 2
    log = helpers.train(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), amp_dtype=dtype)
    assert len(log.losses) == 2 and all(torch.tensor(log.losses).isfinite())
    with torch.amp.autocast("cpu", dtype=dtype):
        assert model(batches[0][0]).dtype is torch.bfloat16  # the fallback really autocasts


def test_every_notebook_takes_its_device_from_pick_device_or_runs_on_the_cpu():
    """So that the one CPU switch (AMP_COURSE_DEVICE=cpu, read by pick_device) reaches every notebook."""
    from pathlib import Path

    from tests.support import cells, source

    for path in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        code = "\n".join(source(c) for c in cells(path) if c["cell_type"] == "code")
        setup = "device = helpers.pick_device()" in code or 'device = torch.device("cpu")' in code
        assert setup and not re.search(r'torch\.device\("(cuda|mps)"\)|\.cuda\(\)', code), path.name


@pytest.mark.parametrize("native, expected", [((), (64, 4, 4)), ((torch.bfloat16,), (64, 64, 4)),
                                             ((torch.bfloat16, torch.float16), (64, 64, 64))])
def test_workload_sizes_by_rule_and_never_measures(monkeypatch, native, expected):
    """Full size where the dtype is float32 or native on the device (the rule), reduced elsewhere."""
    monkeypatch.setattr(device_module, "native_dtypes", lambda description: native)
    monkeypatch.setattr(helpers.timing, "seconds_per_call", None)  # a measurement would raise
    sizes = tuple(helpers.workload(d, 64, 4, "cpu") for d in (torch.float32, torch.bfloat16, torch.float16))
    assert sizes == expected
    assert helpers.workload("bfloat16", 64, 4) == expected[1]  # names as well as dtypes


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or os.uname().machine != "x86_64",
                    reason="reads the x86 flags from Linux's /proc/cpuinfo")
def test_workload_on_this_machine_follows_the_flags_linux_reports():
    with open("/proc/cpuinfo") as cpuinfo:
        words = set(cpuinfo.read().split())
    native_bf16 = bool({"avx512_bf16", "amx_bf16"} & words)
    assert (helpers.workload(torch.bfloat16, 10, 1) == 10) is native_bf16
    assert (helpers.workload(torch.float16, 10, 1) == 10) is ("amx_fp16" in words)


def test_environment_report_names_versions_and_device():
    report = helpers.environment_report("cpu")
    assert report["torch"] == torch.__version__
    assert report["device"] == "cpu"
    assert report["autocast dtype here"] == "torch.bfloat16"


IMPORT_PART = fresh_part("import the helpers", "import helpers, helpers.measure, torch.utils.benchmark\n"
                         "print('imported')", order=0)


def test_importing_the_helpers_prints_nothing_where_a_cuda_toolkit_has_no_gpu(fresh_interpreter):
    """torch 2.4 prints "No CUDA runtime is found" when torch.utils.benchmark loads with CUDA_HOME set and no GPU
    (the shared fresh interpreter runs this part first, with CUDA_HOME set to an empty folder)."""
    assert fresh_interpreter.returncode == 0 and fresh_interpreter.parts[IMPORT_PART] == "imported\n"
    assert fresh_interpreter.stderr == ""


# ------------------------------------------------------------------ TF32: two APIs, two variables

NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")  # torch >= 2.9
needs_new_api = pytest.mark.skipif(not NEW_API, reason="this torch has only the legacy TF32 flags")


def new_api_state() -> dict[str, str]:
    return {name: holder.fp32_precision for name, holder in device_module._new_tf32_api()}


def test_tf32_settings_report_the_defaults_this_environment_gives():
    settings = helpers.device.tf32_settings()
    assert settings["TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
                                                                           "unset")
    overridden = os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1"
    assert settings["torch.backends.cuda.matmul.allow_tf32"] is overridden
    assert settings["torch.get_float32_matmul_precision()"] == ("high" if overridden else "highest")
    assert settings["torch.backends.cudnn.allow_tf32"] is True


NGC_PART = fresh_part("NGC's variable and strict_fp32", (
    "import torch, helpers\n"
    "before = helpers.device.tf32_settings()\n"
    "with helpers.strict_fp32():  # a learner's new-API setting inside a block\n"
    "    if hasattr(torch.backends.cuda.matmul, 'fp32_precision'):\n"
    "        torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
    "with helpers.strict_fp32():\n"
    "    inside = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())\n"
    "print(before['torch.backends.cuda.matmul.allow_tf32'], before['torch.get_float32_matmul_precision()'],"
    " inside, helpers.device.tf32_settings() == before)"), order=10)


def test_the_ngc_variable_turns_tf32_on_at_startup_and_strict_fp32_still_turns_it_off(fresh_interpreter):
    """In the shared fresh interpreter, started with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (TF32 state is
    process-wide)."""
    assert fresh_interpreter.parts[NGC_PART].split() == ["True", "high", "(False,", "'highest')", "True"]


ORDERS = {  # how a learner or library may have set TF32 before calling the course's helpers
    "new API first": "torch.backends.cuda.matmul.fp32_precision = 'tf32'",
    "new API, generic": "torch.backends.fp32_precision = 'ieee'",
    "legacy first": "torch.backends.cuda.matmul.allow_tf32 = True",
    "legacy precision": "torch.set_float32_matmul_precision('high')",
    "legacy, then new": "torch.backends.cuda.matmul.allow_tf32 = True; "
                        "torch.backends.cuda.matmul.fp32_precision = 'ieee'",
}


def _apply_order_then_check(order: str) -> tuple[bool, object]:
    """In a forked child (TF32 state is process-wide): set TF32 the learner's way, then use tf32_flags."""
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True  # the defaults
    exec(ORDERS[order])
    before, legacy = device_module.tf32_settings(), device_module._legacy_tf32()
    for enabled in (True, False):
        with device_module.tf32_flags(enabled):
            assert torch.backends.cuda.matmul.fp32_precision == ("tf32" if enabled else "ieee")
            assert torch.backends.cuda.matmul.allow_tf32 is enabled  # legacy readers inside work too
        after = device_module.tf32_settings()
        news = [name for name in before if name.endswith("fp32_precision")]
        assert [after[n] for n in news] == [before[n] for n in news], (before, after)
        assert legacy is None or device_module._legacy_tf32() == legacy
    return legacy is None, before["torch.backends.cuda.matmul.allow_tf32"]


@needs_new_api
def test_tf32_flags_never_raise_and_restore_whatever_api_set_them():
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(1, maxtasksperchild=1) as pool:  # a fresh child each
        results = dict(zip(ORDERS, pool.map(_apply_order_then_check, ORDERS, chunksize=1)))
    # the case of issue 20: after the new API, torch refuses the legacy read; the helpers do not crash
    assert results["new API first"] == (True, "unreadable (fp32_precision set: mixing APIs raises)")
    assert results["legacy first"] == (False, True)


def test_tf32_flags_restore_after_an_error():
    before = helpers.device.tf32_settings()
    with pytest.raises(RuntimeError, match="boom"):
        with helpers.device.tf32_flags(True):
            assert torch.backends.cuda.matmul.allow_tf32 is True
            raise RuntimeError("boom")
    assert helpers.device.tf32_settings() == before


def test_quiet_native_stderr_drops_what_c_code_writes_and_restores_fd_2(capfd):
    with helpers.device.quiet_native_stderr():
        os.write(2, b"profiler noise\n")  # what C++ code does: a write to file descriptor 2
    os.write(2, b"after the block\n")
    err = capfd.readouterr().err
    assert "profiler noise" not in err and "after the block" in err
