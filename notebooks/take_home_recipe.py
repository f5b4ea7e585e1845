r"""The take-home recipe: mixed-precision training and inference in plain PyTorch.

Replace ``make_data`` and ``make_model`` with yours; keep the order of the calls. The course's rule
(notebook 07 §1) picks the precision from what the device reports.

    python take_home_recipe.py
    python take_home_recipe.py --device-description \
        '{"device": "cuda", "name": "Tesla T4", "capability": [7, 5]}'

A made-up description forces that device's recipe here (how the tests run every branch on a CPU).
"""
import argparse
import copy
import json
import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# >>> copy of helpers.precision (python -m tools.copies --write)
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


# <<< end of copy


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("mps" if torch.backends.mps.is_available() else "cpu")


def make_data(n: int = 512, features: int = 16, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Replace with your data. Toy task: which of the first ``classes`` features is largest."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, features, generator=generator)
    return TensorDataset(inputs, inputs[:, :classes].argmax(dim=1))


def make_model(features: int = 16, classes: int = 4) -> nn.Module:
    """Replace with your model. Its weights stay float32: autocast computes in 16 bits from them."""
    hidden = nn.Linear(features, 64)
    return nn.Sequential(hidden, nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, classes))


def train_one_epoch(model, loader, optimizer, scaler, advice: Advice, device) -> list[float]:
    """The recipe: autocast around forward and loss only; the scaler around backward and step."""
    model.train()
    losses = []
    for inputs, labels in loader:
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        use_autocast = advice.how.startswith("autocast")
        with torch.amp.autocast(device.type, dtype=advice.dtype, enabled=use_autocast):
            loss = nn.functional.cross_entropy(model(inputs), labels)
        scaler.scale(loss).backward()  # outside autocast; a disabled scaler passes the loss through
        scaler.unscale_(optimizer)  # the true gradients, before clipping looks at them
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        scaler.step(optimizer)  # skipped when a gradient is inf or NaN
        scaler.update()
        losses.append(loss.item())
    return losses


def save_checkpoint(path: Path, model, optimizer, scaler) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, path)  # the scale is training state


def load_checkpoint(path: Path, model, optimizer, scaler, device: torch.device) -> None:
    checkpoint = torch.load(path, map_location=device, weights_only=True)  # runs no code
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])


def deployed(model: nn.Module, advice: Advice) -> nn.Module:
    """The model to serve, in eval mode: a copy with its weights cast once where the advice says so."""
    model.eval()
    if advice.how == "16-bit weights":
        return copy.deepcopy(model).to(advice.dtype)  # cast once here, not at every request
    return model


def predict(model: nn.Module, inputs: torch.Tensor, advice: Advice, device: torch.device) -> torch.Tensor:
    """Batched inference with a ``deployed`` model; float32 logits out, for metrics."""
    inputs = inputs.to(device)
    if advice.how == "16-bit weights" and inputs.is_floating_point():  # token ids stay integers
        inputs = inputs.to(advice.dtype)
    with torch.inference_mode(), torch.amp.autocast(device.type, dtype=advice.dtype,
                                                    enabled=advice.how == "autocast"):
        return model(inputs).float()


def read_description(text: str | None, device: torch.device) -> dict:
    """This device's description, or a made-up one (JSON) completed by this CPU's."""
    if text is None:
        return describe_device(device)
    made_up = json.loads(text)
    made_up["capability"] = tuple(made_up.get("capability", ()))  # JSON has no tuples
    return {**describe_device("cpu"), "flags from": "a made-up description", **made_up}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="Mixed-precision training and inference, by rule.")
    parser.add_argument("--device-description", help="JSON: force this made-up device's recipe")
    args = parser.parse_args(argv)
    device = pick_device()
    advice = choose_precision(read_description(args.device_description, device))
    made_up = ", with a made-up device's recipe" if args.device_description else ""
    print(f"Running on {device.type}{made_up}")
    for workload, item in advice.items():
        dtype = item.dtype or "float32 until you measure"
        print(f"  {workload + ':':<18} {item.how} ({dtype}) - {item.reason}")
    training, inference = advice["training"], advice["batched inference"]  # "measure": float32

    torch.manual_seed(0)
    model = make_model().to(device)  # float32 master weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    scaler = torch.amp.GradScaler(device.type, enabled=training.how == "autocast + GradScaler")
    loader = DataLoader(make_data(), 64, shuffle=True, generator=torch.Generator().manual_seed(0))
    losses = train_one_epoch(model, loader, optimizer, scaler, training, device)
    print(f"Trained {len(losses)} steps ({training.how}): loss {losses[0]:.2f} -> {losses[-1]:.2f}")

    restored = make_model().to(device)
    restored_optimizer = torch.optim.AdamW(restored.parameters())
    restored_scaler = torch.amp.GradScaler(device.type, enabled=scaler.is_enabled())
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "checkpoint.pt"
        save_checkpoint(path, model, optimizer, scaler)
        load_checkpoint(path, restored, restored_optimizer, restored_scaler, device)
    print(f"Checkpoint restored; GradScaler state: {restored_scaler.state_dict() or 'none (off)'}")

    test_inputs, test_labels = make_data(n=256, seed=1).tensors
    server = deployed(restored, inference)
    logits = predict(server, test_inputs, inference, device)
    accuracy = (logits.argmax(dim=1).cpu() == test_labels).float().mean().item()
    print(f"Inference ({inference.how}): {logits.dtype} logits, held-out accuracy {accuracy:.2f}")
    return dict(advice=advice, model=restored, scaler=restored_scaler, losses=losses, logits=logits)


if __name__ == "__main__":
    result = main()
