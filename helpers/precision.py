"""Which precision to use, by rule: what the hardware reports decides, a measurement confirms.

Plain PyTorch (torch and the standard library only), so it can be copied into a script.
:func:`describe_device` reads what a device reports; :func:`choose_precision` turns such a
description into advice per workload. Every function takes the description, so a test (or you)
can pass a made-up one: ``choose_precision({"device": "cuda", "name": "Tesla T4", ...})``.
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
NO_TENSOR_CORES = r"GTX 16|MX[45]50|\bT(400|500|550|600|1000|1200|2000)\b"  # sm_75: TU116/TU117
WORKLOADS = ("training", "batched inference", "chat decoding")
CPUINFO = Path("/proc/cpuinfo")  # Linux only


def version_tuple(text: str) -> tuple[int, ...]:
    """"2.5.1+cpu" -> (2, 5); "14.5" -> (14, 5); "" -> ()."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:2])


def _onednn_limit(flags: list[str], isa: str) -> list[str]:
    """The flags oneDNN may still use under ``ONEDNN_MAX_CPU_ISA=isa`` (set to imitate a CPU)."""
    allowed = {"avx512f": "AVX512" in isa or "AVX10" in isa, "avx_ne_convert": "VNNI_2" in isa,
               "avx512_bf16": any(word in isa for word in ("BF16", "AMX", "AVX10")),
               "avx512_fp16": "FP16" in isa or "AVX10" in isa, "amx_bf16": "AMX" in isa,
               "amx_fp16": "AMX_FP16" in isa}
    return [f for f in flags if isa == "ALL" or allowed.get(f, True)]


def _cpu_flags() -> tuple[list[str] | None, str]:
    """The :data:`CPU_FLAGS` this CPU reports (None: unreadable), and where they were read."""
    flags, source = _reported_cpu_flags()
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if flags is None or not isa:
        return flags, source
    return _onednn_limit(flags, isa), f"{source}, limited by ONEDNN_MAX_CPU_ISA={isa}"


def _reported_cpu_flags() -> tuple[list[str] | None, str]:
    """What the CPU reports, before any oneDNN limit."""
    if hasattr(torch.cpu, "get_capabilities"):  # torch 2.14.1 has it, 2.4.1 lacks it
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
                   "arch": platform.machine()}
    if kind == "cuda":
        description["name"] = torch.cuda.get_device_name(device)
        description["capability"] = torch.cuda.get_device_capability(device)
        description["hip"] = torch.version.hip  # ROCm: the capability is a gfx version
    if kind == "cpu":
        description["system"] = platform.system()
        description["flags"], description["flags from"] = _cpu_flags()
    if kind == "mps":
        description["macos"] = platform.mac_ver()[0]
    return description


def native_dtypes(d: dict) -> tuple[torch.dtype, ...]:
    """The 16-bit dtypes the described device computes natively and autocast can use there
    (empty: emulated, or unknown). CPU: the flags, not oneDNN's broader bf16 check (amp-facts)."""
    native = []
    if d["device"] == "cuda" and not d.get("hip"):
        capability = tuple(d["capability"])  # (7, 5), or [7, 5] from JSON
        if capability >= (8, 0):
            native.append(torch.bfloat16)
        if capability >= (7, 0) and not re.search(NO_TENSOR_CORES, d["name"]):
            native.append(torch.float16)  # tensor cores
    elif d["device"] == "mps":  # MPS autocast: fp16 from torch 2.5; bf16 from 2.6, on macOS 14+
        if version_tuple(d["torch"]) >= (2, 6) and version_tuple(d["macos"]) >= (14,):
            native.append(torch.bfloat16)
        if version_tuple(d["torch"]) >= (2, 5):
            native.append(torch.float16)
    elif d["device"] == "cpu" and not unknown_reason(d):  # else unknown: ROCm, XPU, no flags, Apple
        flags = set(d["flags"])
        if d["arch"] in ("aarch64", "arm64"):
            bf16_flags = {"bf16"}  # Arm's BF16
        else:
            bf16_flags = {"avx512_bf16", "amx_bf16"}
        if bf16_flags & flags:
            native.append(torch.bfloat16)
        if "amx_fp16" in flags:
            native.append(torch.float16)
    return tuple(native)


class Advice(NamedTuple):
    dtype: torch.dtype | None  # None: measure
    how: str  # "float32", "autocast", "autocast + GradScaler", "16-bit weights" or "measure"
    reason: str  # why, and where that comes from


def unknown_reason(d: dict) -> str | None:
    """Why the rule cannot tell for the described device (then: measure), or None."""
    if d["device"] == "cuda" and d.get("hip"):
        return "ROCm GPU: its capability numbers are gfx versions, unknown here"
    if d["device"] not in ("cpu", "cuda", "mps"):
        return f"{d['device']}: unknown here"
    if d["device"] == "cpu" and d["flags"] is None:
        return f"CPU flags unreadable here ({d['flags from']})"
    if d["device"] == "cpu" and d["system"] == "Darwin" and d["arch"] == "arm64":
        return "Apple CPU: macOS arm64 wheels may be built without oneDNN"
    return None


def label(d: dict) -> str:
    """The device in a few words, to start each reason."""
    if d["device"] == "cuda":
        return "%s (sm_%d%d)" % (d["name"], *d["capability"])
    if d["device"] == "mps":
        return f"Apple GPU, torch {d['torch']}, macOS {d['macos']}"
    return "CPU (" + (", ".join(d["flags"]) or "no AVX512 or 16-bit flags") + ")"


def why_float32(d: dict) -> str:
    """Why 16-bit work will not pay on a device without native 16-bit arithmetic."""
    if d["device"] == "mps":
        return "no MPS autocast before torch 2.5"
    if d["device"] == "cpu":
        return ("no native 16-bit arithmetic: 16-bit matmuls run by conversion through float32 "
                "(oneDNN's bf16 path too), slower where compute-bound (00 §2)")
    if tuple(d["capability"]) == (6, 0):
        return ("fp16 at 2x float32 only with fp16 accumulation; PyTorch's fp16 GEMMs "
                "accumulate in float32")
    if tuple(d["capability"]) == (6, 1):
        return "fp16 runs at 1/64 of float32's rate"
    return "no tensor cores (datasheet)"


def choose_precision(d: dict) -> dict[str, Advice]:
    """Per workload (:data:`WORKLOADS`), the precision to use on the device ``d`` describes."""
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
        training = Advice(torch.float16, "autocast + GradScaler", f"{where}: fp16 tensor cores; "
                          "fp16 gradients underflow without a GradScaler (04)")
        batched = Advice(torch.float16, "autocast", f"{where}: autocast keeps the ops on its "
                         "float32 list in float32, where fp16 could overflow past 65504 (06)")
    if d["device"] == "mps" and training.how == "autocast + GradScaler":
        training = Advice(torch.float32, "float32", f"{where}: bf16 autocast needs torch 2.6 and "
                          "macOS 14; GradScaler raised on MPS in torch 2.5 (pytorch#142397) and "
                          "fused Adam there ignored its found_inf until PR pytorch#186360: measure")
    if d["device"] == "cuda" and native:
        chat = Advice(native[0], "16-bit weights", f"{where}: decoding reads every weight per "
                      "token; 16-bit weights halve the bytes")
    return {"training": training, "batched inference": batched, "chat decoding": chat}
