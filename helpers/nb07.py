"""Notebook 07's scaffolding: made-up descriptions of devices, and the rule's table of them (§1)."""
from collections.abc import Callable


def cpu(*flags: str, arch: str = "x86_64", system: str = "Linux") -> dict:
    """A CPU as :func:`helpers.precision.describe_device` describes one, with these flags."""
    return {"device": "cpu", "torch": "2.14.1", "arch": arch, "system": system,
            "flags": list(flags), "flags from": "made up"}


def cuda(name: str, capability: tuple[int, int], hip: str | None = None) -> dict:
    return {"device": "cuda", "torch": "2.14.1", "arch": "x86_64", "name": name,
            "capability": capability, "hip": hip}


def mps(torch_version: str, macos: str) -> dict:
    return {"device": "mps", "torch": torch_version, "arch": "arm64", "system": "Darwin",
            "macos": macos}


def rocm(name: str, gfx: str | None) -> dict:
    return {**cuda(name, (9, 4), hip="6.2"), "gfx": gfx}


WINDOWS = {**cpu(system="Windows", arch="AMD64"), "flags": None,
           "flags from": "no torch.cpu.get_capabilities, /proc/cpuinfo or sysctl"}

KINDS = {  # the table's rows: each a made-up description, so every branch of the rule shows
    "x86 AVX2 (most laptops; AMD before Zen 4)": cpu(),
    "x86 AVX512, no BF16 (Skylake-X, Ice Lake)": cpu("avx512f"),
    "x86 AVX-NE-CONVERT, no AVX512": cpu("avx_ne_convert"),
    "x86 AVX512-BF16 (AMD Zen 4 on)": cpu("avx512f", "avx512_bf16"),
    "x86 AMX-BF16 (Sapphire Rapids)": cpu("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16"),
    "x86 AMX-FP16 (Granite Rapids)": cpu("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16",
                                         "amx_fp16"),
    "Arm Linux with BF16 (Graviton 3)": cpu("bf16", arch="aarch64"),
    "Arm Linux, no BF16 (Graviton 2)": cpu(arch="aarch64"),
    "Apple CPU with BF16 (M2 on)": cpu("bf16", arch="arm64", system="Darwin"),
    "Windows on Arm with BF16": cpu("bf16", arch="ARM64", system="Windows"),
    "Windows, flags unreadable": WINDOWS,
    "Apple GPU, torch 2.4 (untested here)": mps("2.4.1", "14.5"),
    "Apple GPU, torch 2.5-2.7 (untested here)": mps("2.6.0", "14.5"),
    "Apple GPU, torch 2.8+ (untested here)": mps("2.8.0", "14.5"),
    "Apple GPU, torch 2.9+, macOS 13 (untested)": mps("2.9.0", "13.6"),
    "P100 (sm_60)": cuda("Tesla P100-PCIE-16GB", (6, 0)),
    "GTX 1080 (sm_61)": cuda("NVIDIA GeForce GTX 1080", (6, 1)),
    "GTX 16xx, MX450, T1000 (sm_75)": cuda("NVIDIA GeForce GTX 1660 Ti", (7, 5)),
    "T4, RTX 20xx (sm_75)": cuda("Tesla T4", (7, 5)),
    "V100 (sm_70)": cuda("Tesla V100-SXM2-32GB", (7, 0)),
    "A100, RTX 30xx (sm_80, sm_86)": cuda("NVIDIA A100-SXM4-80GB", (8, 0)),
    "H100 (sm_90)": cuda("NVIDIA H100 80GB HBM3", (9, 0)),
    "AMD MI200, MI300 (ROCm gfx90a, gfx942)": rocm("AMD Instinct MI300X", "gfx942"),
    "Other AMD GPUs (ROCm, e.g. gfx1100)": rocm("AMD Radeon RX 7900 XTX", "gfx1100"),
}
SHORT = {"torch.float32": "", "torch.bfloat16": "bf16 ", "torch.float16": "fp16 ", "None": ""}


def short(advice) -> str:
    """An :class:`helpers.precision.Advice` in a table cell: "bf16 autocast", "measure"."""
    caveat = ", audit first" if "overflow audit" in advice.reason else ""
    return f"{SHORT[str(advice.dtype)]}{advice.how}{caveat}".replace("16-bit weights", "weights")


def advice_table(choose: Callable[[dict], dict], kinds: dict[str, dict] = KINDS) -> str:
    """One line per device kind: what ``choose`` (the rule) advises per workload."""
    header = ["device (made-up description)", "training", "batched inference",
              "chat decoding"]
    rows = [[name] + [short(a) for a in choose(d).values()] for name, d in kinds.items()]
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in [header] + rows)
