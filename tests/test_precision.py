"""helpers.precision: the documented recipe for each kind of device, from made-up descriptions (no GPU,
no measurement), and describe_device on this machine and on simulated macOS and Windows."""
import ast
import copy
import inspect
import json
import subprocess
from pathlib import Path

import pytest
import torch

from helpers import precision
from helpers.precision import Advice, choose_precision, describe_device, native_dtypes
from tests.support import cells, notebook, source
from tools import copies

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def cpu(*flags, arch="x86_64", system="Linux", version="2.14.1"):
    return {"device": "cpu", "torch": version, "arch": arch, "system": system, "flags": list(flags),
            "flags from": "made up"}


def cuda(name, capability, hip=None):
    return {"device": "cuda", "torch": "2.14.1", "arch": "x86_64", "name": name,
            "capability": capability, "hip": hip}


def rocm(name, gfx):  # the capability is AMD's own numbering: the rule must not read it as NVIDIA's
    return {**cuda(name, (9, 4), hip="6.2.41133"), "gfx": gfx}


def mps(version, macos):
    return {"device": "mps", "torch": version, "arch": "arm64", "system": "Darwin", "macos": macos}


WINDOWS = {**cpu(system="Windows", arch="AMD64", version="2.4.1"), "flags": None,
           "flags from": "no torch.cpu.get_capabilities, /proc/cpuinfo or sysctl"}
FLOAT32 = ((FP32, "float32"), (FP32, "float32"), (None, "measure"))
CPU_BF16 = ((BF16, "autocast"), (BF16, "16-bit weights"), (None, "measure"))
MEASURE = ((None, "measure"),) * 3
TENSOR_CORES_FP16 = ((FP16, "autocast + GradScaler"), (FP16, "autocast"), (FP16, "16-bit weights"))
GPU_BF16 = ((BF16, "autocast"), (BF16, "16-bit weights"), (BF16, "16-bit weights"))
MPS_INFERENCE_FP16 = ((FP32, "float32"), (FP16, "autocast"), (None, "measure"))
MPS_UNTESTED = ((None, "measure"), (FP16, "autocast"), (None, "measure"))  # no Mac run recorded

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
    ("AVX512-FP16 without BF16 (made up)", cpu("avx512f", "avx512_fp16"), FLOAT32,
     "AVX512-FP16 computes fp16 natively"),
    ("Arm with BF16 (Graviton 3)", cpu("bf16", arch="aarch64"), CPU_BF16, "native bf16"),
    ("Arm without BF16 (Graviton 2)", cpu(arch="aarch64"), FLOAT32, "conversion through float32"),
    ("Apple CPU with BF16 (M2 on)", cpu("bf16", arch="arm64", system="Darwin"), MEASURE, "without oneDNN"),
    ("Apple CPU without BF16 (M1)", cpu(arch="arm64", system="Darwin"), FLOAT32, "conversion through float32"),
    ("Windows on Arm with BF16", cpu("bf16", arch="ARM64", system="Windows"), MEASURE, "Windows on Arm"),
    ("Windows on Arm without BF16", cpu(arch="ARM64", system="Windows"), FLOAT32, "conversion through"),
    ("Windows, flags unreadable", WINDOWS, MEASURE, "CPU flags unreadable"),
    ("P100", cuda("Tesla P100-PCIE-16GB", (6, 0)), FLOAT32, "cu128 and cu130 wheels lack it"),
    ("GTX 1080 (sm_61)", cuda("NVIDIA GeForce GTX 1080", (6, 1)), FLOAT32, "1/64"),
    ("GTX 16xx", cuda("NVIDIA GeForce GTX 1660 Ti", (7, 5)), FLOAT32, "no tensor cores"),
    ("T1000", cuda("NVIDIA T1000", (7, 5)), FLOAT32, "no tensor cores"),
    ("MX450", cuda("NVIDIA GeForce MX450", (7, 5)), FLOAT32, "no tensor cores"),
    ("T4", cuda("Tesla T4", (7, 5)), TENSOR_CORES_FP16, "GradScaler"),
    ("V100", cuda("Tesla V100-SXM2-32GB", (7, 0)), TENSOR_CORES_FP16, "cu126"),
    ("RTX 2080", cuda("NVIDIA GeForce RTX 2080", (7, 5)), TENSOR_CORES_FP16, "fp16 tensor cores"),
    ("A100", cuda("NVIDIA A100-SXM4-80GB", (8, 0)), GPU_BF16, "native bf16"),
    ("H100", cuda("NVIDIA H100 80GB HBM3", (9, 0)), GPU_BF16, "native bf16"),
    ("ROCm MI250X (gfx90a)", rocm("AMD Instinct MI250X", "gfx90a"), GPU_BF16, "gfx90a, ROCm"),
    ("ROCm MI300X (gfx942)", rocm("AMD Instinct MI300X", "gfx942"), GPU_BF16, "gfx942, ROCm"),
    ("ROCm RX 7900 (gfx1100)", rocm("AMD Radeon RX 7900 XTX", "gfx1100"), MEASURE, "WMMA (RDNA3/4)"),
    ("ROCm RX 9070 (gfx1201)", rocm("AMD Radeon RX 9070 XT", "gfx1201"), MEASURE, "WMMA (RDNA3/4)"),
    ("ROCm MI355X (gfx950)", rocm("AMD Instinct MI355X", "gfx950"), MEASURE, "not checked here"),
    ("ROCm MI100 (gfx908)", rocm("AMD Instinct MI100", "gfx908"), MEASURE, "not checked here"),
    ("ROCm MI50 (gfx906)", rocm("AMD Instinct MI50", "gfx906"), MEASURE, "knows the matrix cores"),
    ("ROCm, no gfx name", rocm("AMD Instinct MI300X", None), MEASURE, "no gfx name"),
    ("XPU", {"device": "xpu", "torch": "2.14.1", "arch": "x86_64"}, MEASURE, "unknown here"),
]

# MPS (untested here: no Mac ran it): torch x macOS, each line saying so and citing its source
MPS_MATRIX = [
    ("2.4.1", "13.6", FLOAT32, "pytorch#99272"), ("2.4.1", "14.5", FLOAT32, "pytorch#99272"),
    ("2.5.1", "13.6", MPS_INFERENCE_FP16, "pytorch#142397"), ("2.5.1", "14.5", MPS_INFERENCE_FP16, "pytorch#150255"),
    ("2.6.0", "13.6", MPS_INFERENCE_FP16, "pytorch#150255"), ("2.6.0", "14.5", MPS_INFERENCE_FP16, "pytorch#150255"),
    ("2.7.1", "14.5", MPS_INFERENCE_FP16, "pytorch#150255"),
    ("2.8.0", "13.6", MPS_UNTESTED, "#186360"), ("2.8.0", "14.5", MPS_UNTESTED, "pytorch#184286"),
    ("2.9.0", "13.6", MEASURE, "pytorch#162921"), ("2.9.0", "14.5", MPS_UNTESTED, "no Mac run is recorded"),
    ("2.14.1", "13.7", MEASURE, "needs macOS 14"), ("2.14.1", "15.3", MPS_UNTESTED, "release not checked"),
]
RECIPES += [(f"MPS, torch {t}, macOS {m}", mps(t, m), expected, words) for t, m, expected, words in MPS_MATRIX]


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
            assert a.reason and len(a.reason) < 350
            assert ("untested here" in a.reason) == (description["device"] == "mps"), a.reason


def test_no_advice_calls_bf16_native_on_an_apple_gpu():
    """bf16 is emulated on M1/M2 (transformers#40458) and was slower than float32 on an M4 Max
    (nanochat#685): whatever the torch and macOS versions, MPS never gets bf16."""
    for version, macos, _, _ in MPS_MATRIX:
        assert BF16 not in native_dtypes(mps(version, macos))
        assert all(a.dtype != BF16 and "native bf16" not in a.reason
                   for a in choose_precision(mps(version, macos)).values())


def test_chat_decoding_on_a_cpu_points_to_the_cell_that_measures_it():
    for description in (cpu(), cpu("avx512f", "avx512_bf16"), cpu("bf16", arch="aarch64")):
        chat = choose_precision(description)["chat decoding"]
        assert chat.how == "measure" and "memory-bound" in chat.reason and "08 §5" in chat.reason


def test_mps_training_is_never_16_bit_by_rule_until_a_mac_run_is_recorded():
    """Before GradScaler's MPS kernels: float32; from them on, "measure", untested, with its sources."""
    before = choose_precision(mps("2.6.0", "14.5"))["training"]
    assert before.how == "float32" and "pytorch#150255" in before.reason and "pytorch#142397" in before.reason
    for version in ("2.8.0", "2.9.0", "2.14.1", "2.20.0"):
        after = choose_precision(mps(version, "15.3"))["training"]
        assert (after.dtype, after.how) == (None, "measure"), version
        for words in ("untested here", "no Mac run is recorded", "pytorch#150255", "pytorch#184286",
                      "#186360", "found_inf", "release not checked"):
            assert words in after.reason, words


@pytest.mark.parametrize("name, capability", [("Tesla T4", (7, 5)), ("Tesla V100-SXM2-32GB", (7, 0))])
def test_fp16_decoding_on_a_t4_or_v100_carries_the_overflow_caveat_and_its_two_ways(name, capability):
    chat = choose_precision(cuda(name, capability))["chat decoding"]
    assert (chat.dtype, chat.how) == (FP16, "16-bit weights")
    for words in ("overflow", "transformers#36822", "#5651", "08's overflow audit, then keep",
                  "in float32 (autocast off around them", ".float()", "or serve in float32"):
        assert words in chat.reason, words
    assert "float32 weights" not in chat.reason  # under autocast they protect nothing (47.1)
    assert ("cu126" in chat.reason) == (capability == (7, 0))  # the V100 wheel note
    bf16_gpu = choose_precision(cuda("NVIDIA A100-SXM4-80GB", (8, 0)))["chat decoding"]
    assert "overflow" not in bf16_gpu.reason  # bf16 has float32's range


def test_rocm_gfx_names_never_reach_the_cuda_branch():
    """An MI300X reports (9, 4), a gfx1100 (11, 0): read as NVIDIA's numbers both would be "native bf16"."""
    for gfx in ("gfx1100", "gfx906", None):
        assert native_dtypes(rocm("AMD GPU", gfx)) == ()
    assert native_dtypes({**rocm("AMD Instinct MI300X", "gfx942"), "capability": (1, 0)}) == (BF16, FP16)


def test_an_incomplete_description_is_a_value_error_naming_the_keys():
    with pytest.raises(ValueError, match="'mps' description needs macos"):
        choose_precision({"device": "mps", "torch": "2.8.0"})
    with pytest.raises(ValueError, match="needs capability"):
        choose_precision({"device": "cuda", "torch": "2.14.1", "name": "Tesla T4"})
    assert precision.missing_keys({"device": "xpu"}) == []  # unknown kinds: "measure"


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


@pytest.mark.parametrize("name, capability, hip, gcn, training", [
    ("Tesla T4", (7, 5), None, None, FP16), ("NVIDIA H100 80GB HBM3", (9, 0), None, None, BF16),
    ("AMD Instinct MI300X", (9, 4), "6.2.41133", "gfx942:sramecc+:xnack-", BF16),
    ("AMD Instinct MI250X", (9, 0), "6.2.41133", "gfx90a:sramecc+:xnack-", BF16),
    ("AMD Radeon RX 7900 XTX", (11, 0), "6.2.41133", "gfx1100", None)])
def test_describe_device_reads_a_gpu(monkeypatch, name, capability, hip, gcn, training):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    properties = type("Properties", (), {"gcnArchName": gcn})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    monkeypatch.setattr(torch.version, "hip", hip)
    d = describe_device("cuda")
    assert (d["device"], d["name"], d["capability"], d["hip"]) == ("cuda", name, capability, hip)
    assert d.get("gfx") == (gcn.split(":")[0] if gcn else None)  # the feature suffix stripped
    assert choose_precision(d)["training"].dtype == training


def test_the_rule_is_plain_pytorch_and_short():
    """Copyable into a script: imports only torch and the standard library; the decision fits a screen."""
    tree = ast.parse(Path(precision.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"os", "platform", "re", "subprocess", "pathlib", "typing", "torch"}, imported
    decision = [precision.choose_precision, precision.native_dtypes, precision.why_float32,
                precision.why_fp16, precision.unknown_reason, precision.label, precision.is_arm,
                precision.missing_keys, precision.mps_training]
    lines = sum(len(inspect.getsource(f).splitlines()) for f in decision)
    assert 40 <= lines <= 150, lines
    assert len(inspect.getsource(precision.choose_precision).splitlines()) <= 30  # one notebook cell


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


SAPPHIRE_RAPIDS = ["avx512f", "avx_ne_convert", "avx512_bf16", "amx_bf16", "avx512_fp16"]


@pytest.mark.parametrize("isa, flags", [
    ("AVX2", []), ("avx2_vnni_2", ["avx_ne_convert"]), ("avx512_core", ["avx512f"]),
    ("AVX512_CORE_BF16", ["avx512f", "avx512_bf16"]),
    ("AVX512_CORE_FP16", ["avx512f", "avx512_bf16", "avx512_fp16"]),  # cumulative: bf16 stays
    ("AVX10_1_512", ["avx512f", "avx512_bf16", "avx512_fp16"]),
    ("AVX512_CORE_AMX", ["avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16"]),
    ("DEFAULT", SAPPHIRE_RAPIDS), ("ALL", SAPPHIRE_RAPIDS)])
def test_an_imitation_by_onednn_max_cpu_isa_is_described_as_the_cpu_it_imitates(monkeypatch, isa, flags):
    """ONEDNN_MAX_CPU_ISA=AVX2 on an AVX512-BF16 machine runs bf16 matmuls emulated: the rule must say so.
    oneDNN's levels are cumulative (dispatcher_control.md): AVX512_CORE_FP16 keeps bf16."""
    monkeypatch.setattr(precision, "_reported_cpu_flags", lambda: (SAPPHIRE_RAPIDS, "made up"))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    d = describe_device()
    assert d["flags"] == flags
    assert (f"ONEDNN_MAX_CPU_ISA={isa.upper()}" in d["flags from"]) == (isa not in ("DEFAULT", "ALL"))
    assert (choose_precision(d)["training"].dtype == BF16) == ("avx512_bf16" in flags)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert describe_device()["flags"] == SAPPHIRE_RAPIDS


@pytest.mark.parametrize("isa, stamp, training", [
    ("AVX2", "no 16-bit CPU flags under ONEDNN_MAX_CPU_ISA=AVX2", FP32),
    ("AVX512_CORE_FP16", "avx512_bf16, avx512_fp16 under ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16", BF16),
    (None, "avx512_bf16, amx_bf16, avx512_fp16", BF16)])
def test_the_machine_line_and_the_rule_read_one_set_of_flags(monkeypatch, isa, stamp, training):
    """One reader (precision.cpu_flags) for the machine line, the environment report and the rule."""
    import helpers

    monkeypatch.setattr(precision, "_reported_cpu_flags", lambda: (SAPPHIRE_RAPIDS, "made up"))
    monkeypatch.delenv("AMP_COURSE_DEVICE", raising=False)
    if isa:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    else:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    assert f"({stamp}, " in helpers.machine_stamp("cpu")
    assert helpers.environment_report("cpu")["cpu 16-bit flags (the rule's)"] == stamp
    assert choose_precision(describe_device("cpu"))["training"].dtype == training


@pytest.mark.parametrize("system", ["Windows", "Darwin"])
def test_the_machine_line_never_says_no_16_bit_flags_where_it_cannot_read_them(monkeypatch, system):
    import helpers

    monkeypatch.setattr(precision, "_reported_cpu_flags", lambda: (None, "no torch.cpu.get_capabilities"))
    monkeypatch.setattr(precision.platform, "system", lambda: system)
    line = helpers.machine_stamp("cpu")
    assert "CPU flags unreadable" in line and "no 16-bit CPU flags" not in line
    monkeypatch.setattr(precision, "_reported_cpu_flags", lambda: (["bf16"], "sysctl hw.optional"))
    assert "(bf16, " in helpers.machine_stamp("cpu")  # an M2's BF16, as the rule reads it


def test_a_description_read_from_json_works_too():
    """A capability given as a JSON list ([7, 5]) decides like the tuple torch returns."""

    for name, capability in (("Tesla T4", (7, 5)), ("Tesla P100-PCIE-16GB", (6, 0)), ("NVIDIA H100", (9, 0))):
        made_up = json.loads(json.dumps(cuda(name, capability)))
        assert made_up["capability"] == list(capability)
        assert choose_precision(made_up) == choose_precision(cuda(name, capability))


NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def notebook_definition(prefix: str, name: str):
    """The class or function ``name`` exactly as notebook ``prefix`` defines it, run alone."""
    path = next(NOTEBOOKS.glob(f"{prefix}_*.ipynb"))
    nodes = [copies.top_level(text).get(name) for text in copies.code_cells(path)]
    node = next(node for node in nodes if node is not None)
    namespace = {"torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path.name, "exec"), namespace)
    return namespace[name]


def test_08s_float32_island_runs_its_matmul_in_float32_under_fp16_autocast():
    """Autocast runs a Linear in float16 whatever its weights' dtype: the island turns it off."""
    island_class = notebook_definition("08", "Float32")
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 32)
    x = 300 * torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    reference = linear(x)  # float32, no autocast
    island = island_class(copy.deepcopy(linear))
    seen = []
    island.inner.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    with torch.no_grad(), torch.amp.autocast("cpu", dtype=FP16):  # CPU fp16 autocast: torch 2.2 on
        assert linear(x).dtype == FP16  # autocast is on: a bare float32 Linear computes in float16
        kept = island(x)
        cast_back = island(x.half())
    assert seen == [FP32, FP32]
    assert kept.dtype == FP32 and torch.equal(kept, reference)  # the float32 matmul, bit for bit
    assert cast_back.dtype == FP16


def test_the_decoding_caveat_says_float32_islands_in_the_rule_its_copies_and_07s_prose():
    recipe = (NOTEBOOKS / "take_home_recipe.py").read_text()
    prose = "\n".join(source(c) for c in cells(notebook("07")) if c["cell_type"] == "markdown")
    code = "\n".join(copies.code_cells(next(NOTEBOOKS.glob("07_*.ipynb"))))
    for text in (Path(precision.__file__).read_text(), recipe, code):
        assert "in float32 (autocast off around them" in text and "or serve in float32" in text
        assert "keep float32 weights under fp16 autocast" not in text
    assert "in float32 (autocast off around them" in prose and "or serve in float32" in prose
    assert "or keep float32 weights" not in prose
