"""Which precision to use, by rule: what the hardware reports decides, a measurement confirms.

Plain PyTorch (torch and the standard library only), so it can be copied into a script.
:func:`describe_device` reads what a device reports; :func:`choose_precision` turns such a
description into advice per workload. Every function takes the description, so a test (or you)
can pass a made-up one: ``choose_precision({"device": "cuda", "name": "Tesla T4", ...})``.

Nothing is called native because of a version number: a version says what PyTorch *offers* (MPS
autocast, GradScaler's MPS kernels, which wheels carry a GPU), the hardware what it computes.
Sources, by number: pytorch#99272 (MPS autocast, fp16, torch 2.5), #142397 (GradScaler raised on
MPS in 2.5), #150255 (GradScaler's MPS kernels, first in 2.8; huggingface/accelerate#3373 gates MPS
scaling on 2.8), #184286 (MPS unscale zeroed fp16/bf16 gradients, May 2026), #186360 (MPS fused
Adam ignored found_inf, June 2026; the first releases with these two fixes are not checked here),
#162921 (MPS from torch 2.9 needs macOS 14), transformers#40458 (bf16 emulated on M1/M2), karpathy/nanochat#685
(a bf16 training step took ~17 % longer than float32 on an M4 Max), transformers#36822 and #5651
(bf16-trained Gemma 3 and T5 overflow in fp16; transformers' remedy, ``_keep_in_fp32_modules``,
#20683, keeps such modules float32 without autocast), pytorch#172352 and #175253 (torch 2.11: Volta
only in the cu126 wheels; Maxwell and Pascal, sm_50-61, are absent from the cu128 and cu130 wheels
too), oneDNN's dispatcher_control.md (ONEDNN_MAX_CPU_ISA levels), PyTorch's ATEN_CPU_CAPABILITY
(ATen's own vectorised kernels), AMD's "AMD matrix cores" lab note (bf16 matrix cores on MI200,
gfx90a) and CDNA3 (MI300, gfx942). No Mac ran any of this: every MPS line is untested here, and
until a Mac run is recorded in data/ (machine, torch, macOS, command) the rule does not train in
16 bits on MPS by itself.
"""
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import NamedTuple

import torch

CPU_FLAGS = ("avx512f", "avx_ne_convert", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16",
             "bf16")  # the last: Arm's BF16
SIXTEEN_BIT_FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "bf16")
LEVEL_FLAGS = ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")
ONEDNN_LEVELS = {  # ONEDNN_MAX_CPU_ISA -> the CPU_FLAGS oneDNN may still use (cumulative levels)
    "SSE41": (), "AVX": (), "AVX2": (), "AVX2_VNNI": (), "AVX2_VNNI_2": ("avx_ne_convert",),
    "AVX512_CORE": LEVEL_FLAGS[:1], "AVX512_CORE_VNNI": LEVEL_FLAGS[:1],
    "AVX512_CORE_BF16": LEVEL_FLAGS[:2],
    "AVX10_1_512": LEVEL_FLAGS[:3], "AVX512_CORE_FP16": LEVEL_FLAGS[:3],
    "AVX10_1_512_AMX": LEVEL_FLAGS[:4], "AVX512_CORE_AMX": LEVEL_FLAGS[:4],
    "AVX10_1_512_AMX_FP16": LEVEL_FLAGS, "AVX512_CORE_AMX_FP16": LEVEL_FLAGS,
}  # oneDNN doc/performance_considerations/dispatcher_control.md; DEFAULT (or unknown): no limit
NO_TENSOR_CORES = r"GTX 16|MX[45]50|\bT(400|500|550|600|1000|1200|2000)\b"  # sm_75: TU116/TU117
ROCM_BF16 = ("gfx90a", "gfx942")  # MI200, MI300: bf16 and fp16 matrix cores (AMD, datasheet)
ROCM_UNCHECKED = r"gfx950|gfx908|gfx11\d\d|gfx12\d\d"  # MI350, MI100, RDNA3/4 (WMMA): not checked
WORKLOADS = ("training", "batched inference", "chat decoding")
DESCRIPTION_KEYS = {"cpu": ("torch", "arch", "system", "flags"),
                    "cuda": ("torch", "name", "capability"),  # ROCm adds "hip" and "gfx"
                    "mps": ("torch", "macos")}
CPUINFO = Path("/proc/cpuinfo")  # Linux only


def version_tuple(text: str) -> tuple[int, ...]:
    """"2.5.1+cpu" -> (2, 5); "14.5" -> (14, 5); "" -> ()."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:2])


def cpu_flags() -> tuple[list[str] | None, str]:
    """The :data:`CPU_FLAGS` this CPU reports (None: unreadable) and where they were read, less
    those oneDNN may not use under ``ONEDNN_MAX_CPU_ISA``. That variable limits oneDNN only; ATen's
    own kernels follow ``ATEN_CPU_CAPABILITY`` (e.g. avx2): an older CPU is imitated with both. The
    one reader: the rule and the machine line (``helpers.device.machine_stamp``) both call it."""
    flags, source = _reported_cpu_flags()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if flags is None or isa not in ONEDNN_LEVELS:
        return flags, source
    allowed = ONEDNN_LEVELS[isa] + ("bf16",)  # x86 levels do not limit Arm's flag
    return [f for f in flags if f in allowed], f"{source}, limited by ONEDNN_MAX_CPU_ISA={isa}"


def _reported_cpu_flags() -> tuple[list[str] | None, str]:
    """What the CPU reports, before any oneDNN limit."""
    if hasattr(torch.cpu, "get_capabilities"):  # torch 2.14.1 has it (any OS), 2.4.1 lacks it
        capabilities = dict(torch.cpu.get_capabilities())
        capabilities["avx512f"] = capabilities.get("avx512_f", False)
        return [f for f in CPU_FLAGS if capabilities.get(f) is True], "torch.cpu.get_capabilities()"
    if CPUINFO.exists():  # Linux: "flags" (x86) or "Features" (Arm) lines
        words = set(CPUINFO.read_text().split())
        return [f for f in CPU_FLAGS if f in words], "/proc/cpuinfo"
    if platform.system() == "Darwin":  # "hw.optional.arm.FEAT_BF16: 1", "hw.optional.avx512f: 1"
        result = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, check=False)
        found = re.findall(r"^hw\.optional\.(?:arm\.FEAT_)?(\w+): 1$", result.stdout, re.MULTILINE)
        found = {name.lower() for name in found}
        return [f for f in CPU_FLAGS if f in found], "sysctl hw.optional"
    return None, "no torch.cpu.get_capabilities, /proc/cpuinfo or sysctl"  # e.g. Windows, old torch


def describe_device(device: str | torch.device = "cpu") -> dict:
    """What ``device`` reports that decides its precision: a plain dict, to print or to make up."""
    kind = torch.device(device).type
    description = {"device": kind, "torch": torch.__version__.split("+")[0],
                   "arch": platform.machine(), "system": platform.system()}
    if kind == "cuda":
        description["name"] = torch.cuda.get_device_name(device)
        description["capability"] = torch.cuda.get_device_capability(device)
        description["hip"] = torch.version.hip  # ROCm: the capability is not NVIDIA's
    if kind == "cuda" and torch.version.hip:  # "gfx90a:sramecc+:xnack-" -> "gfx90a"
        properties = torch.cuda.get_device_properties(device)
        description["gfx"] = getattr(properties, "gcnArchName", "").split(":")[0] or None
    if kind == "cpu":
        description["flags"], description["flags from"] = cpu_flags()
    if kind == "mps":
        description["macos"] = platform.mac_ver()[0]
    return description


class Advice(NamedTuple):
    dtype: torch.dtype | None  # None: measure
    how: str  # "float32", "autocast", "autocast + GradScaler", "16-bit weights" or "measure"
    reason: str  # why, and where that comes from


def missing_keys(d: dict) -> list[str]:
    """The keys :func:`choose_precision` needs that ``d`` lacks (:data:`DESCRIPTION_KEYS`)."""
    return [key for key in ("device",) + DESCRIPTION_KEYS.get(d.get("device"), ()) if key not in d]


def is_arm(d: dict) -> bool:
    """An Arm CPU: Linux says "aarch64", macOS "arm64", Windows on Arm "ARM64"."""
    return d["arch"].lower() in ("aarch64", "arm64")


def native_dtypes(d: dict) -> tuple[torch.dtype, ...]:
    """The 16-bit dtypes the described device computes natively and autocast can use there
    (empty: emulated, or unknown). CPU: the flags, not oneDNN's broader bf16 check (amp-facts);
    fp16 with AMX-FP16 only: AVX512-FP16 is native fp16 arithmetic, but with it alone PyTorch's fp16
    matmuls ran at float32's speed (an Emerald Rapids Xeon). Apple GPUs: fp16 only; bf16 is
    emulated on M1/M2 (transformers#40458). Untested here."""
    native = []
    if unknown_reason(d):
        return ()
    if d["device"] == "cuda" and d.get("hip"):  # ROCm: by gfx name, never NVIDIA's numbers
        native += [torch.bfloat16, torch.float16]  # only ROCM_BF16 get here
    elif d["device"] == "cuda":
        capability = tuple(d["capability"])  # (7, 5), or [7, 5] from JSON
        if capability >= (8, 0):
            native.append(torch.bfloat16)
        if capability >= (7, 0) and not re.search(NO_TENSOR_CORES, d["name"]):
            native.append(torch.float16)  # tensor cores
    elif d["device"] == "mps" and version_tuple(d["torch"]) >= (2, 5):  # MPS autocast: 2.5 on
        native.append(torch.float16)
    elif d["device"] == "cpu":
        bf16_flags = {"bf16"} if is_arm(d) else {"avx512_bf16", "amx_bf16"}
        if bf16_flags & set(d["flags"]):
            native.append(torch.bfloat16)
        if "amx_fp16" in d["flags"]:
            native.append(torch.float16)
    return tuple(native)


def unknown_reason(d: dict) -> str | None:
    """Why the rule cannot tell for the described device (then: measure), or None."""
    if d["device"] not in ("cpu", "cuda", "mps"):
        return f"{d['device']}: unknown here"
    if d["device"] == "cuda" and d.get("hip") and re.fullmatch(ROCM_UNCHECKED, d.get("gfx") or ""):
        return (f"ROCm GPU {d['gfx']}: 16-bit matrix cores (MI350, MI100) or WMMA (RDNA3/4), but "
                "which dtypes PyTorch's ROCm kernels run fast there is not checked here: measure")
    if d["device"] == "cuda" and d.get("hip") and d.get("gfx") not in ROCM_BF16:
        return (f"ROCm GPU {d.get('gfx') or '(no gfx name)'}: the rule knows the matrix cores of "
                f"{' and '.join(ROCM_BF16)} only")
    if d["device"] == "mps" and version_tuple(d["torch"]) >= (2, 9):
        if version_tuple(d["macos"]) < (14,):
            return (f"Apple GPU, torch {d['torch']}, macOS {d['macos']} (untested here): MPS from "
                    "torch 2.9 needs macOS 14 (pytorch#162921): the Apple CPU computes: measure")
    if d["device"] == "cpu" and d["flags"] is None:
        return f"CPU flags unreadable here ({d.get('flags from')})"
    if d["device"] == "cpu" and is_arm(d) and "bf16" in d["flags"] and d["system"] == "Darwin":
        return "Apple CPU with BF16: macOS arm64 wheels were built without oneDNN"
    if d["device"] == "cpu" and is_arm(d) and "bf16" in d["flags"] and d["system"] == "Windows":
        return "Windows on Arm with BF16: whether its wheels' CPU kernels use BF16 is unknown here"
    return None


def label(d: dict) -> str:
    """The device in a few words, to start each reason."""
    if d["device"] == "cuda" and d.get("hip"):
        return f"{d['name']} ({d['gfx']}, ROCm)"
    if d["device"] == "cuda" and tuple(d["capability"]) == (7, 0):
        return f"{d['name']} (sm_70; torch 2.11+ has it in the cu126 wheels only)"
    if d["device"] == "cuda" and tuple(d["capability"]) < (7, 0):  # sm_50-61: Maxwell, Pascal
        major, minor = d["capability"]
        return f"{d['name']} (sm_{major}{minor}; the cu128 and cu130 wheels lack it: cu126 ones)"
    if d["device"] == "cuda":
        return "%s (sm_%d%d)" % (d["name"], *d["capability"])
    if d["device"] == "mps":
        return f"Apple GPU, torch {d['torch']}, macOS {d['macos']} (untested here)"
    return "CPU (" + (", ".join(d["flags"]) or "no AVX512 or 16-bit flags") + ")"


def why_float32(d: dict) -> str:
    """Why 16-bit work will not pay on a device without native 16-bit arithmetic."""
    if d["device"] == "mps":
        return "no MPS autocast before torch 2.5 (pytorch#99272)"
    if d["device"] == "cpu" and "avx512_fp16" in d["flags"]:
        return ("AVX512-FP16 computes fp16 natively, but without AMX-FP16 PyTorch's fp16 matmuls "
                "ran at float32's speed (an Emerald Rapids Xeon, measured for this course)")
    if d["device"] == "cpu":
        return ("no native 16-bit arithmetic: 16-bit matmuls run by conversion through float32 "
                "(oneDNN's bf16 path too), slower where compute-bound (00 §2)")
    if tuple(d["capability"]) == (6, 0):
        return ("fp16 at 2x float32 only with fp16 accumulation; PyTorch's fp16 GEMMs "
                "accumulate in float32")
    if tuple(d["capability"]) == (6, 1):
        return "fp16 runs at 1/64 of float32's rate"
    return "no tensor cores (datasheet)"


def why_fp16(d: dict, workload: str) -> str:
    """The reason, and its caveats, for float16 on a device whose native 16-bit type it is."""
    if workload == "chat decoding":
        return ("fp16 weights halve the bytes per token, but bf16-trained checkpoints can "
                "overflow (transformers#36822, #5651): run 08's overflow audit, then keep the "
                "modules it names in float32 (autocast off around them, inputs cast with "
                ".float(): 08 §7), or serve in float32")
    if workload == "batched inference":
        return ("autocast keeps the ops on its float32 list in float32, where fp16 could "
                "overflow past 65504 (06)")
    return "fp16 tensor cores; fp16 gradients underflow without a GradScaler (04)"


def mps_training(d: dict) -> Advice:
    """Training on an Apple GPU: float32 before GradScaler's MPS kernels, then "measure": no Mac run
    is recorded in this course's data/, so the rule does not train in 16 bits there by itself."""
    if version_tuple(d["torch"]) < (2, 8):
        return Advice(torch.float32, "float32", f"{label(d)}: GradScaler has MPS kernels from "
                      "torch 2.8 (pytorch#150255; it raised in 2.5: pytorch#142397)")
    return Advice(None, "measure", f"{label(d)}: no Mac run is recorded here: measure fp16 + "
                  "GradScaler (MPS kernels from torch 2.8, pytorch#150255) against float32; fixes "
                  "for zeroed MPS unscale (pytorch#184286), fused Adam ignoring found_inf "
                  "(#186360): release not checked")


def choose_precision(d: dict) -> dict[str, Advice]:
    """Per workload (:data:`WORKLOADS`), the precision to use on the device ``d`` describes."""
    if missing_keys(d):
        raise ValueError(f"a {d.get('device')!r} description needs {', '.join(missing_keys(d))}")
    if unknown_reason(d):
        return dict.fromkeys(WORKLOADS, Advice(None, "measure", unknown_reason(d)))
    native, where = native_dtypes(d), label(d)
    training = batched = Advice(torch.float32, "float32", f"{where}: {why_float32(d)}")
    chat = Advice(None, "measure", f"{where}: decoding is memory-bound, kernels decide (08 §5)")
    if torch.bfloat16 in native:  # before fp16: float32's range; CPU fp16 autocast keeps much fp16
        training = Advice(torch.bfloat16, "autocast", f"{where}: native bf16, float32's "
                          "range: no GradScaler (03)")
        batched = Advice(torch.bfloat16, "16-bit weights", f"{where}: bf16 weights are cast once "
                         "and halve the bytes; autocast casts them again every call (06)")
    elif torch.float16 in native:
        training = Advice(torch.float16, "autocast + GradScaler",
                          f"{where}: {why_fp16(d, 'training')}")
        batched = Advice(torch.float16, "autocast", f"{where}: {why_fp16(d, 'batched inference')}")
    if native and d["device"] == "mps":
        training = mps_training(d)
    if d["device"] == "cuda" and native == (torch.float16,):
        chat = Advice(torch.float16, "16-bit weights", f"{where}: {why_fp16(d, 'chat decoding')}")
    elif d["device"] == "cuda" and native:
        chat = Advice(torch.bfloat16, "16-bit weights", f"{where}: decoding reads every weight "
                      "per token; 16-bit weights halve the bytes")
    return {"training": training, "batched inference": batched, "chat decoding": chat}
