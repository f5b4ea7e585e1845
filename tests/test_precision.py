"""helpers.precision: the documented recipe for each kind of device, from made-up descriptions (no GPU,
no measurement), and describe_device on this machine and on simulated macOS and Windows."""
import ast
import inspect
import subprocess
from pathlib import Path

import pytest
import torch

from helpers import precision
from helpers.precision import Advice, choose_precision, describe_device, native_dtypes

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def cpu(*flags, arch="x86_64", system="Linux", version="2.14.1"):
    return {"device": "cpu", "torch": version, "arch": arch, "system": system, "flags": list(flags),
            "flags from": "made up"}


def cuda(name, capability, hip=None):
    return {"device": "cuda", "torch": "2.14.1", "arch": "x86_64", "name": name,
            "capability": capability, "hip": hip}


def mps(version, macos):
    return {"device": "mps", "torch": version, "arch": "arm64", "macos": macos}


WINDOWS = {**cpu(system="Windows", arch="AMD64", version="2.4.1"), "flags": None,
           "flags from": "no torch.cpu.get_capabilities, /proc/cpuinfo or sysctl"}
FLOAT32 = ((FP32, "float32"), (FP32, "float32"), (None, "measure"))
CPU_BF16 = ((BF16, "autocast"), (BF16, "16-bit weights"), (None, "measure"))
MEASURE = ((None, "measure"),) * 3
TENSOR_CORES_FP16 = ((FP16, "autocast + GradScaler"), (FP16, "autocast"), (FP16, "16-bit weights"))
GPU_BF16 = ((BF16, "autocast"), (BF16, "16-bit weights"), (BF16, "16-bit weights"))
MPS_FP16 = ((FP32, "float32"), (FP16, "autocast"), (None, "measure"))

# (kind, description, (dtype, how) for training, batched inference, chat decoding, words in the reasons)
RECIPES = [
    ("AVX2 laptop", cpu(), FLOAT32, "conversion through float32"),
    ("AVX512 without BF16 (Skylake-SP)", cpu("avx512f"), FLOAT32, "oneDNN's bf16 path too"),
    ("AVX-NE-CONVERT laptop", cpu("avx_ne_convert"), FLOAT32, "conversion through float32"),
    ("AVX512-BF16 (Zen 4, Cooper Lake)", cpu("avx512f", "avx512_bf16"), CPU_BF16, "native bf16"),
    ("AMX-BF16 (Sapphire Rapids)", cpu("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16"), CPU_BF16,
     "native bf16"),
    ("AMX-FP16 (Granite Rapids)", cpu("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"),
     CPU_BF16, "native bf16"),
    ("Arm with BF16 (Graviton 3)", cpu("bf16", arch="aarch64"), CPU_BF16, "native bf16"),
    ("Arm without BF16 (Graviton 2)", cpu(arch="aarch64"), FLOAT32, "conversion through float32"),
    ("Apple CPU", cpu("bf16", arch="arm64", system="Darwin"), MEASURE, "without oneDNN"),
    ("Windows, flags unreadable", WINDOWS, MEASURE, "CPU flags unreadable"),
    ("MPS, torch 2.4", mps("2.4.1", "14.5"), FLOAT32, "no MPS autocast before torch 2.5"),
    ("MPS, torch 2.5, macOS 14", mps("2.5.1", "14.5"), MPS_FP16, "pytorch#142397"),
    ("MPS, torch 2.6, macOS 13", mps("2.6.0", "13.6"), MPS_FP16, "macOS 14"),
    ("MPS, torch 2.6, macOS 14", mps("2.6.0", "14.0"), CPU_BF16, "native bf16"),
    ("MPS, torch 2.14, macOS 15", mps("2.14.1", "15.3"), CPU_BF16, "native bf16"),
    ("P100", cuda("Tesla P100-PCIE-16GB", (6, 0)), FLOAT32, "accumulate in float32"),
    ("GTX 1080 (sm_61)", cuda("NVIDIA GeForce GTX 1080", (6, 1)), FLOAT32, "1/64"),
    ("GTX 16xx", cuda("NVIDIA GeForce GTX 1660 Ti", (7, 5)), FLOAT32, "no tensor cores"),
    ("T1000", cuda("NVIDIA T1000", (7, 5)), FLOAT32, "no tensor cores"),
    ("MX450", cuda("NVIDIA GeForce MX450", (7, 5)), FLOAT32, "no tensor cores"),
    ("T4", cuda("Tesla T4", (7, 5)), TENSOR_CORES_FP16, "GradScaler"),
    ("V100", cuda("Tesla V100-SXM2-32GB", (7, 0)), TENSOR_CORES_FP16, "GradScaler"),
    ("RTX 2080", cuda("NVIDIA GeForce RTX 2080", (7, 5)), TENSOR_CORES_FP16, "fp16 tensor cores"),
    ("A100", cuda("NVIDIA A100-SXM4-80GB", (8, 0)), GPU_BF16, "native bf16"),
    ("H100", cuda("NVIDIA H100 80GB HBM3", (9, 0)), GPU_BF16, "native bf16"),
    ("ROCm (MI300X)", cuda("AMD Instinct MI300X", (9, 4), hip="6.2.41133"), MEASURE, "gfx"),
    ("XPU", {"device": "xpu", "torch": "2.14.1", "arch": "x86_64"}, MEASURE, "unknown here"),
]


@pytest.mark.parametrize("kind, description, expected, words", RECIPES, ids=[r[0] for r in RECIPES])
def test_the_documented_recipe_for_each_kind_of_device(kind, description, expected, words):
    advice = choose_precision(description)
    assert list(advice) == ["training", "batched inference", "chat decoding"]
    assert all(isinstance(a, Advice) for a in advice.values())
    assert [(a.dtype, a.how) for a in advice.values()] == list(expected), kind
    assert any(words in a.reason for a in advice.values()), [a.reason for a in advice.values()]
    assert choose_precision(description) == advice  # the same description, the same advice: no timing


def test_each_advice_is_consistent_with_its_how():
    for _, description, _, _ in RECIPES:
        for workload, a in choose_precision(description).items():
            assert (a.dtype is None) == (a.how == "measure"), (description, workload)
            assert (a.dtype == FP32) == (a.how == "float32"), (description, workload)
            assert (a.how == "autocast + GradScaler") == (a.dtype == FP16 and workload == "training")
            assert a.reason and len(a.reason) < 250


def test_chat_decoding_on_a_cpu_points_to_the_cell_that_measures_it():
    for description in (cpu(), cpu("avx512f", "avx512_bf16"), cpu("bf16", arch="aarch64")):
        chat = choose_precision(description)["chat decoding"]
        assert chat.how == "measure" and "memory-bound" in chat.reason and "08 §5" in chat.reason


def test_the_mps_training_reason_names_the_grad_scaler_history():
    reason = choose_precision(mps("2.6.0", "13.6"))["training"].reason
    assert "pytorch#142397" in reason and "found_inf" in reason and "pytorch#186360" in reason


@pytest.mark.parametrize("description, native", [
    (cpu(), ()), (cpu("avx512f"), ()), (cpu("avx_ne_convert"), ()), (cpu("avx512f", "avx512_fp16"), ()),
    (cpu("avx512f", "avx512_bf16"), (BF16,)), (cpu("amx_bf16"), (BF16,)),
    (cpu("avx512_bf16", "amx_bf16", "amx_fp16"), (BF16, FP16)),
    (cpu("bf16", arch="aarch64"), (BF16,)), (cpu("avx512_bf16", arch="aarch64"), ()),  # Arm: its own flag
    (cpu("bf16", arch="arm64", system="Darwin"), ()), (WINDOWS, ()),
    (cuda("Tesla P100-PCIE-16GB", (6, 0)), ()), (cuda("NVIDIA GeForce GTX 1650", (7, 5)), ()),
    (cuda("NVIDIA T400 4GB", (7, 5)), ()), (cuda("Tesla T4", (7, 5)), (FP16,)),
    (cuda("NVIDIA A100-SXM4-80GB", (8, 0)), (BF16, FP16)), (cuda("AMD Instinct MI250X", (9, 0), "6.0"), ()),
    (mps("2.4.1", "14.5"), ()), (mps("2.5.1", "14.5"), (FP16,)), (mps("2.6.0", "13.6"), (FP16,)),
    (mps("2.6.0", "14.0"), (BF16, FP16)),
])
def test_native_dtypes_come_from_flags_and_capability_not_from_onednns_broader_check(description, native):
    assert native_dtypes(description) == native


def test_describe_device_on_this_machine():
    d = describe_device("cpu")
    assert d["device"] == "cpu" and d["torch"] == torch.__version__.split("+")[0]
    assert d["flags"] is None or set(d["flags"]) <= set(precision.CPU_FLAGS)
    advice = choose_precision(d)
    assert set(advice) == set(precision.WORKLOADS)
    if Path("/proc/cpuinfo").exists():  # Linux: the flags agree with the kernel's list
        words = set(Path("/proc/cpuinfo").read_text().split())
        assert ("avx512_bf16" in d["flags"]) == ("avx512_bf16" in words)
        assert (advice["training"].dtype == BF16) == bool({"avx512_bf16", "amx_bf16", "bf16"} & words)


def test_describe_device_reads_proc_cpuinfo_where_torch_cannot_tell(monkeypatch, tmp_path):
    """torch 2.4.1 has no torch.cpu.get_capabilities: the flags come from /proc/cpuinfo."""
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512_bf16\n")
    monkeypatch.setattr(precision, "CPUINFO", cpuinfo)
    d = describe_device()
    assert d["flags"] == ["avx512f", "avx512_bf16"] and d["flags from"] == "/proc/cpuinfo"
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")  # Graviton 3
    assert describe_device()["flags"] == ["bf16"]


def test_describe_device_reads_sysctl_on_macos(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    monkeypatch.setattr(precision, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(precision.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(precision.platform, "machine", lambda: "arm64")
    out = "hw.optional.arm.FEAT_BF16: 1\nhw.optional.arm.FEAT_FP16: 1\nhw.optional.arm.FEAT_SME: 0\n"
    monkeypatch.setattr(precision.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, out, ""))
    d = describe_device()
    assert d["flags"] == ["bf16"] and d["flags from"] == "sysctl hw.optional"
    assert [a.how for a in choose_precision(d).values()] == ["measure"] * 3  # Apple CPU: measure


def test_describe_device_on_windows_without_readable_flags_says_measure(monkeypatch, tmp_path):
    monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
    monkeypatch.setattr(precision, "CPUINFO", tmp_path / "absent")
    monkeypatch.setattr(precision.platform, "system", lambda: "Windows")
    d = describe_device()
    assert d["flags"] is None
    assert {a.how for a in choose_precision(d).values()} == {"measure"}
    assert "unreadable" in choose_precision(d)["training"].reason


@pytest.mark.parametrize("name, capability, hip, training", [
    ("Tesla T4", (7, 5), None, FP16), ("NVIDIA H100 80GB HBM3", (9, 0), None, BF16),
    ("AMD Instinct MI300X", (9, 4), "6.2.41133", None)])
def test_describe_device_reads_a_gpu(monkeypatch, name, capability, hip, training):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    d = describe_device("cuda")
    assert (d["device"], d["name"], d["capability"], d["hip"]) == ("cuda", name, capability, hip)
    assert choose_precision(d)["training"].dtype == training


def test_the_rule_is_plain_pytorch_and_short():
    """Copyable into a script: imports only torch and the standard library; the decision fits a screen."""
    tree = ast.parse(Path(precision.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"os", "platform", "re", "subprocess", "pathlib", "typing", "torch"}, imported
    decision = [precision.choose_precision, precision.native_dtypes, precision.why_float32,
                precision.unknown_reason, precision.label]
    lines = sum(len(inspect.getsource(f).splitlines()) for f in decision)
    assert 40 <= lines <= 100, lines
    assert len(inspect.getsource(precision.choose_precision).splitlines()) <= 25  # one notebook cell


def test_the_preflight_report_prints_the_rules_advice_and_measures_nothing(monkeypatch):
    import helpers
    from tools import preflight

    def no_timing(*args, **kwargs):
        raise AssertionError("the pre-flight report measured something")

    monkeypatch.setattr(helpers.timing, "seconds_per_call", no_timing)
    monkeypatch.setattr(helpers.timing, "compare", no_timing)
    lines = preflight.machine_lines()
    advice = choose_precision(describe_device(helpers.pick_device()))
    assert lines[0].startswith("Machine: ") and "Advice by rule" in lines[1]
    for line, (workload, a) in zip(lines[2:5], advice.items()):
        assert line.strip().startswith(f"{workload}: {a.how}") and a.reason in line


@pytest.mark.parametrize("isa, flags", [
    ("AVX2", []), ("avx512_core", ["avx512f"]), ("AVX512_CORE_BF16", ["avx512f", "avx512_bf16"]),
    ("ALL", ["avx512f", "avx512_bf16", "amx_bf16"])])
def test_an_imitation_by_onednn_max_cpu_isa_is_described_as_the_cpu_it_imitates(monkeypatch, isa, flags):
    """ONEDNN_MAX_CPU_ISA=AVX2 on an AVX512-BF16 machine runs bf16 matmuls emulated: the rule must say so."""
    monkeypatch.setattr(precision, "_reported_cpu_flags", lambda: (["avx512f", "avx512_bf16", "amx_bf16"], "made up"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    d = describe_device()
    assert d["flags"] == flags and f"ONEDNN_MAX_CPU_ISA={isa.upper()}" in d["flags from"]
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert describe_device()["flags"] == ["avx512f", "avx512_bf16", "amx_bf16"]


def test_a_description_read_from_json_works_too():
    """A capability given as a JSON list ([7, 5]) decides like the tuple torch returns."""
    import json

    for name, capability in (("Tesla T4", (7, 5)), ("Tesla P100-PCIE-16GB", (6, 0)), ("NVIDIA H100", (9, 0))):
        made_up = json.loads(json.dumps(cuda(name, capability)))
        assert made_up["capability"] == list(capability)
        assert choose_precision(made_up) == choose_precision(cuda(name, capability))
