r"""The take-home recipe: mixed-precision training and inference in plain PyTorch.

Replace ``make_data`` and ``make_model`` with yours; keep the order of the calls. The course's rule
(notebook 07 §1, copied below) picks the precision from what the device reports.

    python take_home_recipe.py                       # this machine's best device
    python take_home_recipe.py --device cpu          # the CPU (as AMP_COURSE_DEVICE=cpu does)
    python take_home_recipe.py --checkpoint run.pt   # saves there; run it again to resume
    python take_home_recipe.py --device-description \
        '{"device": "cuda", "name": "Tesla T4", "capability": [7, 5]}'

A made-up description forces that device's recipe here (how the tests run every branch on a CPU);
``--help`` lists its keys. Apple GPU (MPS) lines are untested here: no Mac ran them.
"""
import argparse
import contextlib
import copy
import json
import os
import platform
import re
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# >>> copy of helpers.precision (python -m tools.copies --write)
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


# <<< end of copy


# Clip the gradients' total norm to this after unscale_ (None: no clipping), so that one bad batch
# cannot throw the weights far; 1.0 is a common start (clip_grad_norm_ returns the norm: print it).
MAX_GRAD_NORM = 1.0
LOG_EVERY = 4  # read the loss every this many steps: each .item() waits for the device (09 §4)
SCALED = "autocast + GradScaler"


def make_data(n: int = 512, features: int = 16, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Replace with your data. Toy task: which of the first ``classes`` features is largest."""
    inputs = torch.randn(n, features, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(inputs, inputs[:, :classes].argmax(dim=1))


def make_model(features: int = 16, classes: int = 4) -> nn.Module:
    """Replace with your model. Its weights stay float32: autocast computes in 16 bits from them."""
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, classes))


def autocast(advice: Advice, device: torch.device):
    """Autocast where the advice says so, else no context at all: torch 2.4 raises on
    ``torch.amp.autocast("mps", enabled=False)`` before it reads ``enabled``."""
    if advice.how.startswith("autocast"):
        return torch.amp.autocast(device.type, dtype=advice.dtype)
    return contextlib.nullcontext()


def make_scaler(how: str, device: torch.device) -> torch.amp.GradScaler:
    """A GradScaler, on only for fp16 training (a disabled one passes everything through)."""
    return torch.amp.GradScaler(device.type, enabled=how == SCALED)


def train_one_epoch(model, loader, optimizer, scaler, advice: Advice, device, scheduler=None,
                    max_grad_norm: float | None = MAX_GRAD_NORM, log_every: int = LOG_EVERY):
    """The recipe: autocast around forward and loss only; the scaler around backward and step."""
    model.train()
    losses = []
    for step, (inputs, labels) in enumerate(loader):
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        with autocast(advice, device):
            loss = nn.functional.cross_entropy(model(inputs), labels)
        scaler.scale(loss).backward()  # outside autocast; a disabled scaler passes the loss through
        scaler.unscale_(optimizer)  # the true gradients, before clipping looks at them
        if max_grad_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
        scale = scaler.get_scale()  # 1.0 when disabled; when on, step() waits for found_inf anyway
        scaler.step(optimizer)  # skipped when a gradient is inf or NaN
        scaler.update()  # halves the scale after a skipped step
        if scheduler is not None and scaler.get_scale() >= scale:  # only after a real step (04)
            scheduler.step()
        if step % log_every == 0:
            losses.append(loss.item())  # .item() waits for the device: only every log_every steps
    return losses


def precision_record(advice: Advice) -> dict[str, str]:  # what a checkpoint stores of it
    return {"how": advice.how, "dtype": str(advice.dtype)}


def save_checkpoint(path: Path, model, optimizer, scaler, training: Advice, scheduler=None) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),  # the scale is training state
                "scheduler": scheduler.state_dict() if scheduler is not None else {},
                "precision": precision_record(training)}, path)  # the choice it trained in


def load_checkpoint(path: Path, model, optimizer, training: Advice, device: torch.device,
                    scheduler=None, allow_change: bool = False) -> torch.amp.GradScaler:
    """Restore the run saved at ``path``; return its GradScaler, built from the stored choice so
    that its state loads. Refuses a run whose rule now says otherwise, unless ``allow_change``."""
    checkpoint = torch.load(path, map_location=device, weights_only=True)  # runs no code
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if scheduler is not None:
        scheduler.load_state_dict(checkpoint["scheduler"])
    stored = checkpoint["precision"]
    scaler = make_scaler(stored["how"], device)
    scaler.load_state_dict(checkpoint["scaler"])
    if stored == precision_record(training):
        return scaler
    change = (f"{Path(path).name} trained with {stored['how']} ({stored['dtype']}), this "
              f"device's rule says {training.how} ({training.dtype})")
    if not allow_change:
        raise ValueError(f"{change}: resume where the rule agrees, or pass "
                         "--allow-precision-change")
    warnings.warn(f"{change}: continuing with the rule's choice (--allow-precision-change)",
                  stacklevel=2)
    if scaler.is_enabled() == (training.how == SCALED):
        return scaler
    return make_scaler(training.how, device)  # a fresh scaler (scale 2**16), or none


def deployed(model: nn.Module, advice: Advice) -> nn.Module:
    """The model to serve, in eval mode: a copy with its weights cast once where the advice says."""
    model.eval()
    if advice.how == "16-bit weights":
        return copy.deepcopy(model).to(advice.dtype)  # cast once here, not at every request
    return model


def predict(model: nn.Module, inputs: torch.Tensor, advice: Advice,
            device: torch.device) -> torch.Tensor:
    """Batched inference with a ``deployed`` model; float32 logits out, for metrics."""
    inputs = inputs.to(device)
    if advice.how == "16-bit weights" and inputs.is_floating_point():  # token ids stay integers
        inputs = inputs.to(advice.dtype)
    with torch.inference_mode(), autocast(advice, device):
        return model(inputs).float()


# >>> read at home: the command line and the demonstration run (class time reads the recipe above)
def pick_device(choice: str | None = None) -> torch.device:
    """``--device``, else AMP_COURSE_DEVICE, else CUDA, then MPS where the rule trains in 16 bits
    there (on no torch until a Mac run is recorded: it says measure), then the CPU."""
    found = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(),
             "cpu": True}
    available = [kind for kind in found if found[kind]]
    mps_16_bit = found["mps"] and choose_precision(describe_device("mps"))["training"].dtype in (
        torch.float16, torch.bfloat16)
    best = "cuda" if found["cuda"] else "mps" if mps_16_bit else "cpu"
    choice = choice or os.environ.get("AMP_COURSE_DEVICE") or best
    if choice not in available:
        raise ValueError(f"no {choice!r} device here: use one of {', '.join(available)}")
    return torch.device(choice)


def read_description(text: str | None, device: torch.device) -> dict:
    """This device's description, or a made-up one (JSON) completed by this CPU's."""
    if text is None:
        return describe_device(device)
    try:
        made_up = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--device-description is not JSON ({error})") from None
    if "capability" in made_up:  # JSON has no tuples
        made_up["capability"] = tuple(made_up["capability"])
    description = {**describe_device("cpu"), "flags from": "a made-up description", **made_up}
    if missing_keys(description):
        raise ValueError(f"a {description['device']!r} description needs "
                         f"{', '.join(missing_keys(description))} (see --help)")
    if "capability" in description and len(description["capability"]) != 2:
        raise ValueError("capability is two numbers, major and minor: [7, 5] for sm_75")
    return description


KEYS = "\n".join(f"  {kind:<5} {', '.join(keys)}" for kind, keys in DESCRIPTION_KEYS.items())
EPILOG = f"""description keys (JSON; what is missing is taken from this machine's CPU):
{KEYS}
  ROCm GPUs add "hip" (its version) and "gfx" (e.g. "gfx942"); a CPU may add "flags from".
examples:
  --device-description '{{"device": "cuda", "name": "Tesla T4", "capability": [7, 5]}}'
  --device-description '{{"device": "mps", "torch": "2.8.0", "macos": "14.5"}}'"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Mixed-precision training and inference, by rule.",
                                     epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda", "mps"),
                        help="run here (default: AMP_COURSE_DEVICE, else CUDA, the CPU; mps: untested here)")
    parser.add_argument("--device-description", help="JSON: force this made-up device's recipe")
    parser.add_argument("--checkpoint", help="save the run here; if it exists, resume from it")
    parser.add_argument("--allow-precision-change", action="store_true",
                        help="resume a checkpoint trained in another precision (warns)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        device = pick_device(args.device)
        advice = choose_precision(read_description(args.device_description, device))
    except ValueError as error:  # a wrong switch or description: one line, no traceback
        raise SystemExit(f"take_home_recipe.py: error: {error}") from None
    return run(args, device, advice)


def run(args: argparse.Namespace, device: torch.device, advice: dict[str, Advice]) -> dict:
    made_up = ", with a made-up device's recipe" if args.device_description else ""
    untested = " (your choice, untested here: no Mac run is recorded)" if device.type == "mps" else ""
    print(f"Running on {device.type}{untested}{made_up}")
    for workload, item in advice.items():
        dtype = item.dtype or "float32 until you measure"
        print(f"  {workload + ':':<18} {item.how} ({dtype}) - {item.reason}")
    training, inference = advice["training"], advice["batched inference"]  # "measure": float32

    torch.manual_seed(0)
    model = make_model().to(device)  # float32 master weights
    # not fused: MPS's fused Adam ignored the scaler's found_inf until pytorch#186360
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, fused=False)
    loader = DataLoader(make_data(), 64, shuffle=True, generator=torch.Generator().manual_seed(0))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4 * len(loader))
    checkpoint = Path(args.checkpoint) if args.checkpoint else None
    scaler = make_scaler(training.how, device)
    if checkpoint is not None and checkpoint.exists():
        try:
            scaler = load_checkpoint(checkpoint, model, optimizer, training, device, scheduler,
                                     args.allow_precision_change)
        except ValueError as error:  # trained in another precision: one line
            raise SystemExit(f"take_home_recipe.py: error: {error}") from None
        print(f"Resumed from {checkpoint.name} at learning rate {scheduler.get_last_lr()[0]:.4f}")
    losses = train_one_epoch(model, loader, optimizer, scaler, training, device, scheduler)
    print(f"Trained {len(loader)} steps ({training.how}): loss {losses[0]:.2f} -> {losses[-1]:.2f}"
          f" (read every {LOG_EVERY} steps)")

    restored = make_model().to(device)
    restored_optimizer = torch.optim.AdamW(restored.parameters(), fused=False)
    with tempfile.TemporaryDirectory() as folder:
        path = checkpoint or Path(folder) / "checkpoint.pt"
        save_checkpoint(path, model, optimizer, scaler, training, scheduler)
        restored_scaler = load_checkpoint(path, restored, restored_optimizer, training, device)
    print(f"Checkpoint restored; GradScaler state: {restored_scaler.state_dict() or 'none (off)'}")

    test_inputs, test_labels = make_data(n=256, seed=1).tensors
    server = deployed(restored, inference)
    logits = predict(server, test_inputs, inference, device)
    accuracy = (logits.argmax(dim=1).cpu() == test_labels).float().mean().item()
    print(f"Inference ({inference.how}): {logits.dtype} logits, held-out accuracy {accuracy:.2f}")
    return dict(advice=advice, model=restored, scaler=restored_scaler, losses=losses, logits=logits)
# <<< end of read at home


if __name__ == "__main__":
    result = main()
