"""16-bit speed from workloads (:func:`speed_profile`); what to use (:func:`recommendation`)."""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import datetime
import json
import math
import os
import platform
import time
from pathlib import Path

import torch
from torch import nn

from .device import autocast_dtype, cuda_native_bf16, last_level_cache_bytes, machine_stamp, \
    strict_fp32, supported_autocast_dtypes

CACHE_VERSION = 4  # v4: workloads (prefill, decode, training step) in stable rounds
SPEED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FAST_RATIO = 0.9  # within ~10 % of float32 or better: "fast"
EMULATED_RATIO = 0.33  # 3x slower than float32 or worse: no 16-bit units for this dtype here
MEMORY_BOUNDS = (0.7, 2.5)  # a memory-bound 16/32 ratio outside: one more round before believed
BYTES_ALLOW = 2.2  # half the bytes allow about 2x: above, float32's kernel is below memory speed
AGREE, ROUND_SECONDS = 0.15, 0.8  # two rounds in a row within 15 %, else NaN after ~0.8 s
STREAM_CAP, FLOP_BUDGET = 128 << 20, 1e9  # memory cap: one 16-bit tensor's bytes; FLOPs a call
CHAT = (1000, 200)  # the chat shape advice is for: prompt tokens, generated tokens


@dataclasses.dataclass(frozen=True)
class DtypeSpeed:
    """One dtype's speed relative to float32 (above 1: faster) and its roofline figures."""
    dtype: str
    matmul_speedup: float  # 256 x 256 matmul (compute-bound): the emulation probe
    elementwise_speedup: float  # add of two long vectors (memory-bound); NaN: noisy
    verdict: str
    decode_speedup: float = math.nan  # batch-1 F.linear (memory-bound): explains
    prefill_speedup: float = math.nan  # the decoder stack's prompt tokens/s: decides
    decoding_speedup: float = math.nan  # its generated tokens/s (batch 1, one by one): decides
    training_speedup: float = math.nan  # autocast training step (float32 weights): decides
    bandwidth: float = math.nan  # bytes/s of the add (3 streams)
    compute: float = math.nan  # FLOP/s of the prefill
    prefill_tokens_s: float = math.nan
    decode_tokens_s: float = math.nan

    @property
    def ridge(self) -> float:  # FLOP per byte where the roofline's slope meets its roof
        return self.compute / self.bandwidth

    @property
    def chat_seconds(self) -> float:  # CHAT: the prompt at the prefill rate, then token by token
        return CHAT[0] / self.prefill_tokens_s + CHAT[1] / self.decode_tokens_s

    @property
    def compute_is_fast(self) -> bool:
        return self.matmul_speedup >= FAST_RATIO

    @property
    def emulated(self) -> bool:  # or unknown (NaN): work sized for emulation is safe
        return not self.matmul_speedup >= EMULATED_RATIO


class SpeedProfile(dict):
    """dtype name -> :class:`DtypeSpeed`, with the machine line, threads, time and cache honesty."""

    def __init__(self, speeds, **attributes):  # stamp, threads, measured_at, in_cache
        super().__init__((s.dtype, s) for s in speeds)
        vars(self).update(attributes)


def speed_verdict(s: DtypeSpeed) -> str:
    """A dtype's ratios in words (workloads, then the ops that explain them; NaN: "noisy")."""
    def x(what: str, ratio: float, memory: bool = False) -> str:
        flag = " (more than half the bytes allow: float32's kernel below memory speed)"
        return f"{what}: noisy: measure again" if math.isnan(ratio) else \
            f"{what} {ratio:.2f}x" + flag * (memory and ratio > BYTES_ALLOW)
    units = "256x256 matmul: noisy" if math.isnan(s.matmul_speedup) else ("emulated" if s.emulated
        else "16-bit units") + f" (256x256 matmul, one core, {s.matmul_speedup:.2f}x)"
    return "; ".join([x("prefill", s.prefill_speedup), x("decoding", s.decoding_speedup, True),
                      x("autocast training step", s.training_speedup), units,
                      x("add (memory-bound)", s.elementwise_speedup, True),
                      x("batch-1 F.linear", s.decode_speedup, True)])


Sizes = collections.namedtuple("Sizes", "matmul_n elements width layers in_cache flops",
                               defaults=(FLOP_BUDGET,))  # flops: one prefill or training call's


def default_sizes(device: str | torch.device) -> Sizes:
    """CPU: each 16-bit tensor 2x the last-level cache, at most :data:`STREAM_CAP`."""
    if torch.device(device).type in ("cuda", "mps"):
        return Sizes(4096, 1 << 26, 2048, 8, False, 1e3 * FLOP_BUDGET)
    llc = last_level_cache_bytes()
    stream = max(8 << 20, min(2 * llc, STREAM_CAP))  # bytes of one 16-bit tensor
    layers = math.ceil(stream / (16 << 20))  # a layer: 8 x 1024^2 weights, 16 MiB in 16 bits
    return Sizes(256, stream // 2, 1024, layers, stream < 2 * llc)


def timed_ops(dtype: torch.dtype, device: torch.device, matmul_n: int, elementwise_n: int):
    """Matmul, add, batch-1 F.linear (k x k >= the add), into outputs made here (no allocation)."""
    generator, k = torch.Generator(device).manual_seed(0), 64 * math.ceil(elementwise_n**0.5 / 64)
    a = torch.randn(matmul_n, matmul_n, device=device, generator=generator).to(dtype)
    x, y = torch.ones(2, elementwise_n, device=device, dtype=dtype)  # values: no matter to an add
    w, v = torch.full((k, k), 0.01, device=device, dtype=dtype), x[:k].view(1, k)
    c, z, out = torch.empty_like(a), torch.empty_like(x), torch.empty_like(v)
    return (lambda: torch.mm(a, a, out=c)), (lambda: torch.add(x, y, out=z)), \
        (lambda: torch.mm(v, w.t(), out=out))


def decoder_stack(width: int, layers: int, device: torch.device, seed: int = 0) -> nn.Sequential:
    """Random-weight decoder-like MLP blocks (LayerNorm, Linear d -> 4d, GELU, Linear 4d -> d)."""
    with torch.device("meta"):  # no default initialisation: the weights come from the generator
        net = nn.Sequential(*[m for _ in range(layers) for m in (nn.LayerNorm(width), nn.Linear(
            width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))]).to_empty(device=device)
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.uniform_(-1, 1, generator=generator).div_(p.shape[-1] ** 0.5) if p.dim() > 1 else \
                p.fill_(1)
    return net


def fastest_of(fn, calls: int = 5, min_run_time: float = 0.01) -> float:
    """Fastest of >= ``calls`` timed calls after a warm-up (``torch.utils.benchmark``); 00 §1-2."""
    from .measure import benchmark  # loads torch.utils.benchmark: only when measuring
    timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    times = list(timer.blocked_autorange(min_run_time=0).times)  # one warm-up, one timed call
    if times[0] < min_run_time / 20:  # quick: blocks of calls, or the timer times itself
        times += timer.blocked_autorange(min_run_time=min_run_time).times
    while len(times) < calls:
        times += timer.blocked_autorange(min_run_time=0).times  # one warm-up, one timed call
    return min(times)


def stable_ratio(base, fn, bounds=(0.0, math.inf), scale: float = 1.0, calls: int = 3) -> float:
    """float32's time / ``fn``'s, in rounds until two in a row agree within :data:`AGREE` (three
    where outside ``bounds``); NaN ("noisy") when none do in :data:`ROUND_SECONDS` (<= 5 rounds)."""
    start, ratios = time.perf_counter(), []
    while len(ratios) < 2 or time.perf_counter() - start < ROUND_SECONDS and len(ratios) < 5:
        ratios.append(scale * fastest_of(base, calls) / fastest_of(fn, calls))
        need = 2 if bounds[0] <= ratios[-1] <= bounds[1] else 3
        last = ratios[-need:]
        if len(last) == need and max(last) <= (1 + AGREE) * min(last):
            return math.exp(sum(map(math.log, last)) / need)
    return math.nan


def _workloads(dtype: torch.dtype, net: nn.Sequential, sizes: Sizes, emulated: bool):
    """(call, tokens) of prefill and training (the first block: all cost alike) and decode."""
    device, layers, width = net[1].weight.device, len(net) // 4, sizes.width
    half = net.requires_grad_(False) if dtype == torch.float32 else copy.deepcopy(net).to(dtype)
    n, m = (max(2, int(min(256, max(16, sizes.flops / (k * width**2)))) // (8 if emulated else 1))
            for k in (16, 48))  # tokens per call within the FLOP budget; emulated: 1/8
    prompt, one = (torch.ones(k, width, device=device, dtype=dtype) for k in (n, 1))
    batch = torch.ones(m, width, device=device)
    block = copy.deepcopy(net[:4]).requires_grad_(True)  # float32 weights: autocast's

    def step():
        with torch.amp.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = block(batch).float().square().mean()
        loss.backward()  # then plain SGD (torch.optim's first step imports seconds of code)
        for p in block.parameters():
            p.data.sub_(p.grad, alpha=1e-9), p.grad.zero_()  # gradients kept: no allocation
    step(), step()  # warm-up: gradients allocated, kernels chosen before any timing
    return ((lambda: half[:4](prompt), n / layers), (lambda: half(one), 1), (step, m)), \
        2 * n * 8 * width**2


def _measure(device: torch.device, sizes: Sizes) -> list[DtypeSpeed]:
    """Every dtype against float32: the ops that explain once, the workloads in stable rounds."""
    base = timed_ops(torch.float32, device, sizes.matmul_n, sizes.elements)
    net = decoder_stack(sizes.width, sizes.layers, device)
    work, flops = _workloads(torch.float32, net, sizes, False)
    t32, w32 = [fastest_of(f, 3) for f in base[1:]], [fastest_of(f, 3) for f, _ in work]
    rates = [n / t for (_, n), t in zip(work, w32)]
    speeds = [DtypeSpeed("float32", 1.0, 1.0, "the baseline", 1.0, 1.0, 1.0, 1.0,
                         12 * sizes.elements / t32[0], flops / w32[0], rates[0], rates[1])]
    for dtype in SPEED_DTYPES[1:]:
        ops = timed_ops(dtype, device, sizes.matmul_n, sizes.elements)
        ew, dec = (t / fastest_of(f, 3) for t, f in zip(t32, ops[1:]))  # they explain
        threads, _ = torch.get_num_threads(), torch.set_num_threads(1)  # the probe: one core,
        mm, _ = stable_ratio(base[0], ops[0]), torch.set_num_threads(threads)  # robust when busy
        mine, _ = _workloads(dtype, net, sizes, not mm >= EMULATED_RATIO)  # NaN: small
        fast = (0, math.inf) if mm >= EMULATED_RATIO else (0, 1.0)  # emulated yet faster: doubt
        pre, dec1, train = (stable_ratio(b, f, bound, n / m) for (b, m), (f, n), bound
                            in zip(work, mine, [fast, MEMORY_BOUNDS, fast]))
        s = DtypeSpeed(str(dtype)[6:], mm, ew, "", dec, pre, dec1, train, speeds[0].bandwidth * ew
                       / 2, speeds[0].compute * pre, rates[0] * pre, rates[1] * dec1)
        speeds.append(dataclasses.replace(s, verdict=speed_verdict(s)))
    return speeds


def _machine_key(device: torch.device, sizes: Sizes, threads: int) -> str:
    """What a cached profile is valid for: version, machine, kernel limits, threads, sizes."""
    limits = [f"{v}={os.environ.get(v)}" for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")]
    return f"v{CACHE_VERSION}|{machine_stamp(device)}|{platform.processor()}|{limits}|" \
        f"{threads}|{sizes}"


def speed_cache_path() -> Path:
    """Where profiles are kept: ``$AMP_COURSE_CACHE`` or ``~/.cache/amp-course``."""
    root = os.environ.get("AMP_COURSE_CACHE") or Path.home() / ".cache" / "amp-course"
    return Path(root) / "speed_profile.json"


def speed_profile(device: str | torch.device = "cpu", *, threads: int | None = None,
                  refresh: bool = False, sizes: Sizes | None = None) -> SpeedProfile:
    """Each dtype's :class:`DtypeSpeed` at ``threads`` (default: the learner's, all of them),
    cached per machine (:func:`_machine_key`) with when and where it was measured; 00 §1."""
    device, threads = torch.device(device), threads or torch.get_num_threads()
    sizes = sizes or default_sizes(device)
    key, path, cache = _machine_key(device, sizes, threads), speed_cache_path(), {}
    with contextlib.suppress(OSError, ValueError):  # none yet, or unreadable: measure
        cache = json.loads(path.read_text())
    if key not in cache or refresh:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with strict_fp32():
                speeds, stamp = _measure(device, sizes), machine_stamp(device)
        finally:
            torch.set_num_threads(previous)
        cache[key] = {"stamp": stamp, "in_cache": sizes.in_cache, "speeds": [
            s.__dict__ for s in speeds], "measured_at": datetime.datetime.now().astimezone(
            ).isoformat("T", "seconds")}
        with contextlib.suppress(OSError):  # a read-only home: measure again next time
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, indent=1))
    entry = dict(cache[key], threads=threads)
    return SpeedProfile([DtypeSpeed(**s) for s in entry.pop("speeds")], **entry)


def workload(dtype: torch.dtype | str, full: int, reduced: int,
             device: str | torch.device = "cpu") -> int:
    """``reduced`` where ``dtype``'s matmuls are emulated on ``device``, else ``full``; 00 §2."""
    name = str(dtype).removeprefix("torch.")
    return reduced if name != "float32" and speed_profile(device)[name].emulated else full


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """What to use on one device per workload shape (:func:`recommendation`), printable."""
    decoding: str  # serving a chat: one weight dtype for prefill and decode together
    batched: str
    training: str
    reason: str

    def __str__(self) -> str:
        return "\n".join(f"{label:>37}: {text}" for label, text in zip((
            f"chat, {CHAT[0]:,}-token prompt + {CHAT[1]} tokens", "batched inference", "training",
            "because"), (self.decoding, self.batched, self.training, self.reason)))


def _best(profile, names, key, floor: float):
    """Best of ``names`` by ``key`` >= ``floor`` (bf16 unless fp16 >10 % faster); NaN: no say."""
    fine = [n for n in names if key(profile[n]) >= floor]  # NaN never qualifies
    noisy = not fine and any(math.isnan(key(profile[n])) for n in names)  # it might have won
    return "noisy" if noisy else max(fine, default=None, key=lambda n: key(profile[n]) * (
        1.1 if n == "bfloat16" else 1))


def recommendation(profile: dict[str, DtypeSpeed], device: str | torch.device) -> Recommendation:
    """From ``profile``'s workloads: one weight dtype for a chat (prefill + decode), autocast for
    batched work and training where it measured fast; the micro-ops explain. 00 §1, 07 §1."""
    device, x = torch.device(device), lambda v: "noisy" if math.isnan(v) else f"{v:.2f}x"
    allowed = [str(d)[6:] for d in supported_autocast_dtypes(device.type)]
    if device.type == "cuda":  # native only: bf16 on a V100/T4 is emulated
        allowed = [n for n in allowed if n != "bfloat16" or cuda_native_bf16(device)]
    native = [str(autocast_dtype(device))[6:]] if device.type == "cuda" else allowed
    t32, again = profile["float32"].chat_seconds, "noisy: measure again (`refresh=True`)"
    picks = [_best(profile, allowed, lambda s: t32 / s.chat_seconds, 1.1),  # a clear gain
             _best(profile, native, lambda s: s.prefill_speedup, FAST_RATIO),
             _best(profile, ["bfloat16"] if device.type == "mps" and "bfloat16" in native
                   else native, lambda s: s.training_speedup, FAST_RATIO)]  # MPS: no fp16 scaler
    chat, pick, step = picks
    text = [again if p == "noisy" else f"float32 (16-bit {w} here)" if p is None else "" for p, w in
            zip(picks, ("weights: under 10 % faster", "forward: slower", "step: slower"))]
    text[0] = text[0] or (f"{chat} weights (`model.to(torch.{chat})`): "
                          f"{profile[chat].chat_seconds:.2f} s against float32's {t32:.2f} s here")
    text[0] += "; float16 activations overflow past 65504: check first (01 §5, 08 §2)" * (
        chat == "float16")
    autocast = f"torch.amp.autocast({device.type!r}, dtype=torch."
    text[1] = text[1] or (f"{autocast}{pick}) or {pick} weights (a batched forward, the prefill: "
                          f"{x(profile[pick].prefill_speedup)} float32)")
    scaler = f"torch.amp.GradScaler({device.type!r})" if step == "float16" else "no GradScaler"
    text[2] = text[2] or (f"{autocast}{step}), float32 weights, {scaler} (a training step: "
                          f"{x(profile[step].training_speedup)} float32)")
    text[2] += ("; CPU autocast keeps no op in float32 for float16 (a sum overflows to inf, "
                "softmax and layer_norm stay float16): prefer bfloat16 where close") * (
        step == "float16" and device.type == "cpu") + (
        "; GradScaler on MPS failed in torch 2.5 (pytorch#142397): watch for skipped steps") * (
        step == "float16" and device.type == "mps")
    chats = [f"{n} chat " + ("noisy" if math.isnan(s.chat_seconds) else f"{s.chat_seconds:.2f} s")
             for n, s in profile.items()]
    reason = "; ".join(chats + ["batch-1 F.linear (explains, 00 §2): " + ", ".join(
        f"{n} {x(profile[n].decode_speedup)}" for n in ("bfloat16", "float16"))])
    return Recommendation(*text, reason)
