"""Simulated NVIDIA GPUs: every CUDA branch of the helpers, on a machine without one.

``torch.cuda``'s availability, capability, name, bf16 support and allocator statistics are monkeypatched, so the
helpers' device logic (device choice, autocast dtype, verdicts, the recorder's plan, absent modes, datasheet
peaks, memory accounting, the DDP launch) runs as it would on a V100, T4, A100, L4, RTX 4090 or H100. No CUDA
kernel runs: the few lines that need real CUDA tensors are covered by the tests at the end, which run only on a
real GPU (``tools/gpu-validate.sh``).
"""
from __future__ import annotations

import contextlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import helpers
from helpers import bench, ddp_train, measure, peaks
from tools import bench as recorder

NATIVE_BF16 = (8, 0)  # Ampere: bf16 (and TF32) tensor cores from here on


@dataclass(frozen=True)
class Gpu:
    name: str  # what torch.cuda.get_device_name() returns
    capability: tuple[int, int]
    datasheet: str | None  # the data/gpu_peaks.json entry it matches

    @property
    def native_bf16(self) -> bool:
        return self.capability >= NATIVE_BF16


GPUS = [Gpu("Tesla V100-SXM2-32GB", (7, 0), "V100 SXM2"), Gpu("Tesla T4", (7, 5), "T4"),
        Gpu("NVIDIA A100-SXM4-80GB", (8, 0), "A100 SXM4 80GB"), Gpu("NVIDIA L4", (8, 9), "L4"),
        Gpu("NVIDIA GeForce RTX 4090", (8, 9), "GeForce RTX 4090"), Gpu("NVIDIA H100 80GB HBM3", (9, 0), "H100 SXM")]


class FakeAllocator:
    """Stands in for the CUDA caching allocator's statistics; ``allocate`` plays a kernel's allocations."""

    def __init__(self):
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0
        self.calls: list[str] = []

    def allocate(self, nbytes: int, free_after: bool = True) -> None:
        """Allocate (reusing cached blocks first: reserved grows only past them), then free unless told not to."""
        self.allocated += nbytes
        self.reserved = max(self.reserved, self.allocated)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        if free_after:
            self.allocated -= nbytes  # freed blocks stay reserved (cached) until empty_cache

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        self.reserved = self.allocated

    def reset_peak_memory_stats(self, device=None) -> None:
        self.calls.append("reset")
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


@pytest.fixture
def fake_cuda(monkeypatch):
    """``fake_cuda(gpu)`` makes torch.cuda report ``gpu`` (one device); returns the fake allocator."""

    def install(gpu: Gpu, devices: int = 1) -> FakeAllocator:
        allocator = FakeAllocator()
        patches = {
            "is_available": lambda: True, "device_count": lambda: devices,
            "get_device_capability": lambda device=None: gpu.capability,
            "get_device_name": lambda device=None: gpu.name,
            # PyTorch's default counts emulation: True on every GPU from sm_53, native or not.
            "is_bf16_supported": lambda including_emulation=True: including_emulation or gpu.native_bf16,
            "synchronize": lambda device=None: allocator.calls.append("sync"),
            "set_device": lambda device: allocator.calls.append(f"set_device {device}"),
            "empty_cache": allocator.empty_cache, "reset_peak_memory_stats": allocator.reset_peak_memory_stats,
            "memory_allocated": lambda device=None: allocator.allocated,
            "memory_reserved": lambda device=None: allocator.reserved,
            "max_memory_allocated": lambda device=None: allocator.peak_allocated,
            "max_memory_reserved": lambda device=None: allocator.peak_reserved,
        }
        for name, fake in patches.items():
            monkeypatch.setattr(torch.cuda, name, fake)
        monkeypatch.setattr(torch.version, "hip", None)  # an NVIDIA (CUDA) build
        if hasattr(torch, "accelerator"):  # torch.utils.benchmark's timer synchronises through it (torch >= 2.6)
            monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: None)
        return allocator

    return install


def ids(gpus):
    return [gpu.name for gpu in gpus]


# -------------------------------------------------------------------- device choice and autocast dtype

@pytest.mark.parametrize("gpu", GPUS, ids=ids(GPUS))
def test_device_choice_and_autocast_dtype(fake_cuda, gpu):
    fake_cuda(gpu)
    assert helpers.pick_device() == torch.device("cuda") and helpers.pick_device("cuda").type == "cuda"
    expected = torch.bfloat16 if gpu.native_bf16 else torch.float16  # T4/V100: fp16 tensor cores, no bf16 ones
    assert helpers.autocast_dtype("cuda") == expected == helpers.autocast_dtype(torch.device("cuda", 0))
    assert helpers.cuda_native_bf16() is gpu.native_bf16
    assert helpers.needs_grad_scaler(helpers.autocast_dtype("cuda")) is (not gpu.native_bf16)
    # what autocast *accepts*: bf16 too, even where it is emulated (PyTorch's own check counts emulation)
    assert helpers.supported_autocast_dtypes("cuda") == (torch.float16, torch.bfloat16)
    assert helpers.check_autocast_dtype("cuda", torch.bfloat16) == torch.bfloat16
    advice = helpers.precision.choose_precision(helpers.precision.describe_device("cuda"))
    assert advice["training"].dtype == expected
    assert advice["training"].how == ("autocast" if gpu.native_bf16 else "autocast + GradScaler")


def test_cuda_without_emulated_bf16_accepts_float16_only(fake_cuda, monkeypatch):
    fake_cuda(GPUS[1])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert helpers.supported_autocast_dtypes("cuda") == (torch.float16,)
    with pytest.raises(ValueError, match="autocast_dtype"):
        helpers.check_autocast_dtype("cuda", torch.bfloat16)
    assert helpers.autocast_dtype("cuda") == torch.float16


def test_no_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert helpers.cuda_native_bf16() is False
    assert helpers.supported_autocast_dtypes("cuda") == (torch.float16,)
    with pytest.raises(RuntimeError, match="No cuda device"):
        helpers.pick_device("cuda")
    assert helpers.pick_device().type in ("cpu", "mps")


@pytest.mark.parametrize("gcn, amp", [("gfx942:sramecc+:xnack-", torch.bfloat16),
                                      ("gfx90a:sramecc+:xnack-", torch.bfloat16),
                                      ("gfx1100", torch.float16), ("", torch.float16)])
def test_rocm_is_decided_by_its_gfx_name(fake_cuda, monkeypatch, gcn, amp):
    """On AMD GPUs (ROCm builds, also torch.cuda) the compute capability is not NVIDIA's: the rule reads
    gcnArchName (gfx90a and gfx942 have bf16 matrix cores); others get CUDA autocast's default, fp16."""
    fake_cuda(Gpu("AMD Instinct MI300X", (9, 4), None))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    properties = type("Properties", (), {"gcnArchName": gcn})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: properties)
    assert helpers.autocast_dtype("cuda") == amp
    advice = helpers.precision.choose_precision(helpers.precision.describe_device("cuda"))
    assert advice["training"].how == ("autocast" if amp == torch.bfloat16 else "measure")


@pytest.mark.parametrize("rocm_bf16", [True, False])
def test_cuda_native_bf16_asks_pytorch_on_rocm(fake_cuda, monkeypatch, rocm_bf16):
    fake_cuda(Gpu("AMD Instinct MI300X", (9, 4), None))
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: rocm_bf16)
    assert helpers.cuda_native_bf16() is rocm_bf16


# ------------------------------------------------------------------------------------ verdicts

@pytest.mark.parametrize("gpu", GPUS, ids=ids(GPUS))
def test_the_rule_reads_the_simulated_gpu(fake_cuda, gpu):
    fake_cuda(gpu)
    described = helpers.precision.describe_device("cuda")
    assert described["name"] == gpu.name and tuple(described["capability"]) == gpu.capability
    native = helpers.precision.native_dtypes(described)
    assert torch.float16 in native  # every GPU here has fp16 tensor cores
    assert (torch.bfloat16 in native) is gpu.native_bf16
    advice = helpers.precision.choose_precision(described)
    sm = "sm_%d%d" % gpu.capability
    assert all(sm in a.reason for a in advice.values())


@pytest.mark.parametrize("gpu, rate", [(Gpu("Tesla P100-PCIE-16GB", (6, 0), None), "only with fp16 accumulation"),
                                       (Gpu("NVIDIA GeForce GTX 1080", (6, 1), None), "1/64"),
                                       (Gpu("NVIDIA GeForce GTX 1660 SUPER", (7, 5), None), "no tensor cores"),
                                       (Gpu("NVIDIA GeForce MX450", (7, 5), None), "no tensor cores"),
                                       (Gpu("NVIDIA GeForce MX550", (7, 5), None), "no tensor cores"),
                                       (Gpu("NVIDIA T400 4GB", (7, 5), None), "no tensor cores"),
                                       (Gpu("NVIDIA T600", (7, 5), None), "no tensor cores"),
                                       (Gpu("NVIDIA T1000 8GB", (7, 5), None), "no tensor cores")])
def test_gpus_without_tensor_cores_are_not_called_fast(fake_cuda, gpu, rate):
    """GTX 16xx, MX450/MX550 and T400/T600/T1000 (TU116/TU117) are sm_75 like a T4 but have no
    tensor cores; P100 runs fp16 at 2x fp32, GTX 10xx at
    1/64 (datasheets): the rule advises float32 on all three, each with its reason."""
    fake_cuda(gpu)
    advice = helpers.precision.choose_precision(helpers.precision.describe_device("cuda"))
    assert advice["training"].how == "float32" and advice["batched inference"].how == "float32"
    assert rate in advice["training"].reason
    assert (torch.float16 in helpers.precision.native_dtypes(helpers.precision.describe_device("cuda"))) is False
    assert helpers.autocast_dtype("cuda") == torch.float16  # the lessons' fallback: CUDA's default, emulated
    fake_cuda(Gpu("Tesla T4", (7, 5), "T4"))  # the same capability with tensor cores
    assert (torch.float16 in helpers.precision.native_dtypes(helpers.precision.describe_device("cuda"))) is True
    advice = helpers.precision.choose_precision(helpers.precision.describe_device("cuda"))
    assert advice["training"].how == "autocast + GradScaler"
    fake_cuda(Gpu("Quadro RTX 4000", (7, 5), None))  # TU104: tensor cores, a T in no model number
    assert (torch.float16 in helpers.precision.native_dtypes(helpers.precision.describe_device("cuda"))) is True


@pytest.mark.parametrize("gpu", GPUS, ids=ids(GPUS))
def test_environment_report_names_the_gpu(fake_cuda, gpu):
    fake_cuda(gpu)
    report = helpers.environment_report()
    assert report["device"] == "cuda" and report["gpu"] == gpu.name
    assert report["compute capability"] == "%d.%d" % gpu.capability
    assert report["autocast dtype here"] == str(torch.bfloat16 if gpu.native_bf16 else torch.float16)


# ----------------------------------------------------------------------- recorder: plan, absent, peaks

@pytest.mark.parametrize("gpu", GPUS, ids=ids(GPUS))
def test_recorder_plan_and_absent_modes(fake_cuda, gpu):
    fake_cuda(gpu)
    cuda = torch.device("cuda")
    for mode in set(recorder.GEMM_DTYPES + bench.INFERENCE_MODES + recorder.TRAIN_MODES):
        reason = bench.absent_reason(mode, cuda)
        needs_ampere = "tf32" in mode or "bfloat16" in mode
        assert (reason is not None) is (needs_ampere and not gpu.native_bf16), mode
        if reason:
            assert ("Ampere" in reason) and ("sm_80" in reason)
    settings = recorder.plan("cuda")
    counts = recorder.measurement_counts(settings, cuda)
    modes = 6 if gpu.native_bf16 else 3  # float32, float16, autocast_float16 only before Ampere
    assert counts["inference"] == modes * len(settings["inference_batches"]["float32"])
    assert counts["gemm"] == (4 if gpu.native_bf16 else 2) and counts["train"] == (4 if gpu.native_bf16 else 2)
    assert recorder.estimated_seconds(settings, cuda) <= 150


@pytest.mark.parametrize("gpu", GPUS, ids=ids(GPUS))
def test_machine_info_and_datasheet_peaks(fake_cuda, gpu):
    fake_cuda(gpu)
    info = recorder.machine_info(torch.device("cuda"))
    assert info["device"] == "cuda" and info["device_name"] == gpu.name
    assert info["gpu_capability"] == "%d.%d" % gpu.capability
    assert info["datasheet"]["name"] == gpu.datasheet and "nvidia.com" in info["datasheet"]["source"]
    entry = peaks.peak_for(gpu.name)
    assert entry.capability == info["gpu_capability"]  # the file's capability agrees with what torch reports
    for dtype in ("tf32", "bfloat16") if not gpu.native_bf16 else ():  # absent: no peak, no fraction, no run
        absent = recorder.gemm(dtype, 64, "cuda")
        assert absent["tflops"] is None and absent["peak_tflops"] is None and absent["fraction_of_peak"] is None
    assert peaks.peak_tflops(gpu.name, "float16") == entry.tflops["fp16"]
    assert peaks.fraction_of_peak(0.8 * entry.tflops["fp16"], gpu.name, "float16") == pytest.approx(0.8)


def test_an_unknown_gpu_has_no_fraction_of_peak(fake_cuda):
    fake_cuda(Gpu("NVIDIA RTX A6000", (8, 6), None))
    assert recorder.machine_info(torch.device("cuda"))["datasheet"] is None
    assert peaks.peak_tflops("NVIDIA RTX A6000", "bfloat16") is None
    assert peaks.fraction_of_peak(100.0, "NVIDIA RTX A6000", "bfloat16") is None


# ------------------------------------------------------------------------------- memory accounting

def test_cuda_memory_separates_allocated_and_reserved(fake_cuda):
    allocator = fake_cuda(GPUS[-1])
    allocator.allocate(1000, free_after=False)  # weights already on the GPU
    allocator.allocate(3000)  # an earlier call: 3000 bytes stay cached (reserved, not allocated)
    memory = measure.cuda_memory(lambda: allocator.allocate(500))
    # its cache was emptied first: the call had to reserve what it allocated (the weights do not count)
    assert memory == (500, 500) and memory.call_allocated == 500 and memory.call_reserved == 500
    assert allocator.calls[:3] == ["sync", "empty_cache", "reset"] and allocator.calls[-1] == "sync"
    allocator.allocate(3000)  # cache it again; without empty_cache, the cached blocks serve the call
    kept = measure.cuda_memory(lambda: allocator.allocate(500), empty_cache=False)
    assert kept.call_allocated == 500 and kept.call_reserved == 0
    assert measure.cuda_memory(lambda: allocator.allocate(700), empty_cache=False).call_allocated == 700


def test_recorder_measure_on_cuda_synchronises_and_records_both_memories(fake_cuda):
    allocator = fake_cuda(GPUS[-1])
    allocator.allocate(10_000, free_after=False)  # the model
    flags = []

    def fn():
        flags.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        allocator.allocate(2_000)

    seconds, (memory, reserved) = recorder._measure(fn, torch.device("cuda"), "test", "tf32", 0.01)
    assert seconds > 0 and memory == 2_000 and reserved == 2_000
    assert allocator.calls[:2] == ["sync", "sync"]  # after the warm-up (cuDNN autotuning), before memory
    assert set(flags) == {(True, True)}
    flags.clear()
    recorder._measure(fn, torch.device("cuda"), "test", "float32", 0.01)
    assert set(flags) == {(False, False)}  # strict fp32


def test_recorder_measure_flow_on_a_t4(fake_cuda, monkeypatch):
    """measure('cuda') on a T4: absent modes skipped, cudnn.benchmark on while measuring, estimate recorded."""
    import torchvision

    fake_cuda(GPUS[1])
    benchmark_during = []
    monkeypatch.setattr(torchvision.models, "get_model", lambda name, weights=None: torch.nn.Linear(2, 2))
    monkeypatch.setattr(recorder, "prepare_model", lambda model, mode, device: model)
    monkeypatch.setattr(recorder, "gemm", lambda dtype, n, device, run_time: {"dtype": dtype, "tflops": None})

    def fake_inference(net, mode, batch, **kwargs):
        benchmark_during.append(torch.backends.cudnn.benchmark)
        return {"dtype": mode, "batch": batch}

    monkeypatch.setattr(recorder, "inference", fake_inference)
    monkeypatch.setattr(recorder, "train_step", lambda model, mode, batch, **kwargs: {"mode": mode, "batch": batch})
    saved = torch.backends.cudnn.benchmark
    record = recorder.measure("cuda", progress=lambda line: None)
    assert torch.backends.cudnn.benchmark == saved and set(benchmark_during) == {True}
    assert {e["dtype"] for e in record["inference"]} == {"float32", "float16", "autocast_float16"}
    assert {e["mode"] for e in record["train_step"]} == {"float32", "autocast_float16"}
    assert set(record["settings"]["absent"]) == {"tf32", "bfloat16", "autocast_bfloat16"}
    assert record["settings"]["estimated_seconds"] <= 150 and record["machine"]["datasheet"]["name"] == "T4"
    assert record["versions"]["cuda"] == torch.version.cuda


# ----------------------------------------------------------------------------------- DDP over NCCL

def test_ddp_chooses_nccl_with_a_gpu_per_process(fake_cuda):
    fake_cuda(GPUS[-1], devices=2)
    expected = "nccl" if dist.is_nccl_available() else "gloo"
    assert ddp_train.choose_backend("auto", 2) == expected
    assert ddp_train.choose_backend("auto", 4) == "gloo"  # fewer GPUs than processes
    assert ddp_train.choose_backend("nccl", 2) == "nccl"


def test_ddp_main_pins_each_rank_to_its_gpu_before_the_process_group(fake_cuda, monkeypatch):
    allocator = fake_cuda(GPUS[-1], devices=2)
    events = []
    monkeypatch.setenv("RANK", "1"), monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1"), monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "init_process_group", lambda backend: events.append(("init", backend,
                                                                                     list(allocator.calls))))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: events.append(("destroy",)))
    monkeypatch.setattr(ddp_train, "train_rank", lambda args, launch, backend: events.append(
        ("train", backend, launch.local_rank)) or {})
    assert ddp_train.main(["--backend", "nccl"]) == 0
    assert events == [("init", "nccl", ["set_device 1"]), ("train", "nccl", 1), ("destroy",)]


# ------------------------------------------------------------------ real GPU only (tools/gpu-validate.sh)

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
def test_real_gpu_cuda_memory_sees_a_tensor():
    memory = measure.cuda_memory(lambda: torch.empty(1 << 20, device="cuda"))  # 4 MiB, freed at once
    assert memory.call_allocated >= 4 << 20 and memory.call_reserved >= 4 << 20


@needs_gpu
def test_real_gpu_datasheet_and_autocast_agree():
    name, capability = torch.cuda.get_device_name(), "%d.%d" % torch.cuda.get_device_capability()
    entry = peaks.peak_for(name)
    if entry is not None:
        assert entry.capability == capability, f"{name}: data/gpu_peaks.json says sm {entry.capability}"
    native = torch.cuda.get_device_capability()[0] >= 8
    assert helpers.autocast_dtype("cuda") == (torch.bfloat16 if native else torch.float16)
    if hasattr(torch.cuda, "is_bf16_supported"):  # PyTorch's own answer without emulation agrees
        with contextlib.suppress(TypeError):  # older releases have no including_emulation argument
            assert torch.cuda.is_bf16_supported(including_emulation=False) is native


@needs_gpu
def test_real_gpu_ddp_rank_over_nccl():
    """One in-process NCCL rank: the CUDA lines of train_rank (device, DDP, the reduction hooks, FSDP2)."""
    if not dist.is_nccl_available():
        pytest.skip("this PyTorch build has no NCCL")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        args = ddp_train.parse_args(["--steps", "3", "--fsdp"])
        report = ddp_train.train_rank(args, ddp_train.Launch(0, 1, 0, 1), "nccl")
    finally:
        dist.destroy_process_group()
    rank = report["ranks"][0]
    ddp = rank["ddp"]
    assert rank["device"] == "cuda:0" and rank["backend"] == "nccl" and len(ddp["losses"]) == 3
    assert ddp["amp_dtype"] == ddp["logits"] == str(helpers.autocast_dtype("cuda")).removeprefix("torch.")
    assert ddp["grad_scaler"] is helpers.needs_grad_scaler(helpers.autocast_dtype("cuda"))
    assert ddp["identical"] and rank["reduction"]["float32"]["error"] == 0
    fsdp = rank["fsdp"]  # FSDP2 has run on CUDA since it appeared (torch 2.4)
    assert fsdp["sharded"].startswith("DTensor float32") and fsdp["grad_before"] == "bfloat16"
    assert fsdp["unsharded"] == "Parameter bfloat16 [64, 64]" and fsdp["logits"] == "float32"  # output_dtype


# ------------------------------------------------------------------------- the GPU validation command

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "gpu-validate.sh"
SHARED_KIT = ROOT.parent / "shared" / "gpu"  # the authoring kit beside the project (absent in a learner's clone)


def script_parts(text: str) -> dict[str, set[str]]:
    """The options, python modules and $OUT files a validation script uses (comments left out)."""
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return {"options": set(re.findall(r"(?<![\w$-])--?[A-Za-z][\w-]*", code)),
            "modules": set(re.findall(r"-m ([\w.]+)", code)), "outputs": set(re.findall(r"\$OUT/([\w.]+)", code))}


def limit(text: str, name: str) -> int:
    return int(re.search(rf"{name}=\${{{name}:-(\d+)}}", text).group(1))


def test_gpu_validation_script_is_sized_and_complete():
    text = SCRIPT.read_text()
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0  # it parses
    assert limit(text, "BENCH_S") <= 180  # the recorder's budget; tests/test_bench.py bounds the plan's estimate
    assert limit(text, "BENCH_S") + limit(text, "PYTEST_S") <= 450  # + wheel install: under 8 minutes
    assert "-m tools.bench --device cuda --out \"$OUT\"" in text and "-m pytest" in text and '"$@"' in text
    assert {"gpu.txt", "bench.log", "pytest.log", "junit.xml"} <= script_parts(text)["outputs"]


@pytest.mark.skipif(not (SHARED_KIT / "gpu-validate.sh").exists(), reason="no shared GPU kit beside the project")
def test_gpu_validation_script_keeps_in_step_with_the_shared_kit():
    """The project's script does everything the kit's script does (same options, modules, outputs), and more."""
    ours, kit = script_parts(SCRIPT.read_text()), script_parts((SHARED_KIT / "gpu-validate.sh").read_text())
    for part in ("options", "modules", "outputs"):
        assert kit[part] <= ours[part], f"{part} of the shared script missing here: {kit[part] - ours[part]}"
    fetch = (SHARED_KIT / "fetch-wheels.sh").read_text()
    assert "-d .whl" in fetch and ".whl/*.whl" in SCRIPT.read_text()  # installs what fetch-wheels.sh downloads
