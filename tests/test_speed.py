"""helpers.speed: the measured profile (no allocation when timed, sizes past the cache, noise kept out of
the verdicts, the versioned cache), workload, and recommendation() on simulated profiles per machine."""
import json
import math
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import helpers
from helpers import speed as speed_module
from helpers.speed import DtypeSpeed, recommendation, speed_verdict


class NewStorages(TorchDispatchMode):
    """Counts the op outputs whose storage is not one of the op's inputs (or ``out=``): allocations."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs or {}))
                 if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        self.count += sum(t.untyped_storage().data_ptr() not in given for t in tree_leaves(out)
                          if isinstance(t, torch.Tensor))
        return out


def allocations(fn) -> int:
    with NewStorages() as counter:
        fn()
    return counter.count


def test_the_timed_region_allocates_nothing():
    x = torch.ones(8)
    assert allocations(lambda: x + x) == 1  # the counter sees a fresh output
    for dtype in speed_module.SPEED_DTYPES:
        for call in speed_module.timed_ops(dtype, torch.device("cpu"), 16, 64):
            assert allocations(call) == 0, dtype


def test_the_memory_bound_size_streams_past_the_last_level_cache(tmp_path):
    llc = speed_module.last_level_cache_bytes()
    assert llc >= 1 << 20
    n = speed_module.default_sizes("cpu")[1]
    assert n * 2 >= 2 * llc or n == 1 << 27  # one 16-bit vector of the add: twice the cache
    assert speed_module.decode_side(n) ** 2 >= n  # the batch-1 weight: as far past it
    for index, size in enumerate(("48K", "1024K", "96M")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert speed_module.last_level_cache_bytes(root=tmp_path) == 96 << 20
    assert speed_module.last_level_cache_bytes(root=tmp_path / "missing") == 32 << 20  # the default


def test_the_memory_bound_sizes_are_capped_for_memory(monkeypatch):
    monkeypatch.setattr(speed_module, "last_level_cache_bytes", lambda: 504 << 20)  # Granite Rapids
    assert speed_module.default_sizes("cpu") == (256, 1 << 27)  # 1.5 GB for float32's three vectors
    monkeypatch.setattr(speed_module, "last_level_cache_bytes", lambda: 8 << 20)  # a laptop
    assert speed_module.default_sizes("cpu") == (256, 1 << 23)


@pytest.mark.parametrize("matmul, elementwise, words", [
    (2.5, 1.8, "native 16-bit math: 256x256 matmul (compute-bound) 2.5x faster"),
    (1.0, 1.6, "about as fast as float32"),
    (0.5, 1.5, "matmul (compute-bound) 2.0x slower"),
    (0.01, 1.6, "emulated: 256x256 matmul (compute-bound) 100x slower"),
])
def test_speed_verdict_reads_both_ratios(matmul, elementwise, words):
    assert words in speed_verdict(matmul, elementwise)
    assert "memory-bound ops 1.5x faster" in speed_verdict(0.01, 1.5)
    assert "memory-bound ops 0.90x float32" in speed_verdict(0.01, 0.9)
    assert "noise" in speed_verdict(0.01, math.nan)


def test_speed_profile_measures_every_dtype_against_float32():
    profile = helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 16, min_run_time=0.001)
    assert list(profile) == ["float32", "bfloat16", "float16"]
    assert profile["float32"].matmul_speedup == profile["float32"].elementwise_speedup == 1.0
    assert profile["float32"].decode_speedup == 1.0
    for name in ("bfloat16", "float16"):
        speed = profile[name]
        assert speed.matmul_speedup > 0 and not speed.elementwise_speedup <= 0
        assert not speed.decode_speedup <= 0
        assert speed.verdict == speed_verdict(speed.matmul_speedup, speed.elementwise_speedup, 32,
                                              speed.decode_speedup)
        assert speed.emulated == (speed.matmul_speedup < speed_module.EMULATED_RATIO)
    assert torch.get_float32_matmul_precision() == "highest"


def _fake_times(monkeypatch, add_ratio: float, decode_ratio: float) -> list[str]:
    """Timings making 16-bit matmuls 2x, adds ``add_ratio`` x and batch-1 F.linear ``decode_ratio`` x
    faster than float32's; returns the ops timed, in order."""
    calls = []

    def fake(op, min_run_time=0.0):
        calls.append(op[0])
        ratio = {"matmul": 2.0, "add": add_ratio, "decode": decode_ratio}[op[0]]
        return 1.0 if op[1] == torch.float32 else 1.0 / ratio

    monkeypatch.setattr(speed_module, "timed_ops", lambda dtype, device, matmul_n, elementwise_n:
                        [(op, dtype) for op in ("matmul", "add", "decode")])
    monkeypatch.setattr(speed_module, "fastest_of", fake)
    return calls


@pytest.mark.parametrize("add, decode, adds, decodes, expected_add, expected_decode", [
    (1.9, 1.8, 3, 3, 1.9, 1.8),  # plausible: measured once per dtype
    (57.9, 0.5, 7, 3, math.nan, 0.5),  # beyond physics: again, then noise; an emulated batch-1: slow
    (0.5, 5.0, 7, 7, math.nan, math.nan),  # an add of half the bytes 2x slower: noise too
])
def test_an_implausible_memory_bound_ratio_is_measured_again_then_called_noise(
        monkeypatch, add, decode, adds, decodes, expected_add, expected_decode):
    calls = _fake_times(monkeypatch, add, decode)
    profile = speed_module._speed_profile.__wrapped__("cpu", 1, 8, 64, 0.001)
    assert calls.count("add") == adds and calls.count("decode") == decodes
    assert calls.count("matmul") == 3
    same = lambda a, b: math.isclose(a, b) or (math.isnan(a) and math.isnan(b))  # noqa: E731
    for speed in profile[1:]:
        assert same(speed.elementwise_speedup, expected_add), speed
        assert same(speed.decode_speedup, expected_decode), speed
    assert ("memory-bound ops: timings disagreed" in profile[1].verdict) is math.isnan(expected_add)
    assert ("F.linear: timings disagreed" in profile[1].verdict) is math.isnan(expected_decode)


def test_workload_shrinks_only_for_an_emulated_dtype(monkeypatch):
    fake = {"float32": DtypeSpeed("float32", 1.0, 1.0, ""), "bfloat16": DtypeSpeed("bfloat16", 2.5, 1.8, ""),
            "float16": DtypeSpeed("float16", 0.01, 1.6, "")}
    monkeypatch.setattr(speed_module, "speed_profile", lambda device="cpu": fake)
    assert helpers.workload(torch.float32, 100, 10) == 100
    assert helpers.workload(torch.bfloat16, 100, 10) == 100
    assert helpers.workload("float16", 100, 10) == 10
    for ratio, expected in ((0.85, 100), (0.5, 100), (0.2, 10)):  # about as fast, 2x slower, 5x slower
        fake["float16"] = DtypeSpeed("float16", ratio, 1.6, "")
        assert helpers.workload("float16", 100, 10) == expected


def test_speed_profile_is_cached_per_version_machine_and_kernel_choice(monkeypatch):
    first = helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12, min_run_time=0.001)
    path = speed_module.speed_cache_path()
    assert path.exists()
    speed_module._speed_profile.cache_clear()

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again although the profile was cached")

    must_not_measure.cache_clear = lambda: None
    monkeypatch.setattr(speed_module, "_speed_profile", must_not_measure)
    again = helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12)
    assert {k: (v.matmul_speedup, v.elementwise_speedup, v.decode_speedup) for k, v in again.items()} == \
        {k: (v.matmul_speedup, v.elementwise_speedup, v.decode_speedup) for k, v in first.items()}
    assert again["bfloat16"].verdict == first["bfloat16"].verdict
    # a profile cached by an older benchmark (another version in its key) is not reused
    monkeypatch.setattr(speed_module, "CACHE_VERSION", speed_module.CACHE_VERSION + 1)
    with pytest.raises(AssertionError, match="measured again"):
        helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12)
    monkeypatch.undo()
    monkeypatch.setattr(speed_module, "_speed_profile", must_not_measure)
    assert all(key.startswith(f"v{speed_module.CACHE_VERSION}|") for key in json.loads(path.read_text()))
    other_isa = "AVX2" if os.environ.get("ONEDNN_MAX_CPU_ISA") != "AVX2" else "SSE41"
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", other_isa)  # other kernels: another measurement
    with pytest.raises(AssertionError, match="measured again"):
        helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12)
    with pytest.raises(AssertionError, match="measured again"):
        helpers.speed_profile("cpu", matmul_n=32, elementwise_n=1 << 12, refresh=True)


# ------------------------------------------------- recommendation(): simulated profiles per machine class

def profile(bf16: tuple[float, float, float], fp16: tuple[float, float, float]) -> dict[str, DtypeSpeed]:
    """(matmul, add, batch-1 F.linear) ratios to float32 per 16-bit dtype."""
    return {"float32": DtypeSpeed("float32", 1.0, 1.0, "the baseline", 1.0),
            "bfloat16": DtypeSpeed("bfloat16", *bf16[:2], speed_verdict(*bf16[:2]), bf16[2]),
            "float16": DtypeSpeed("float16", *fp16[:2], speed_verdict(*fp16[:2]), fp16[2])}


AVX2_LAPTOP = profile(bf16=(0.01, 1.5, 1.76), fp16=(0.01, 1.9, 1.8))  # fp16's add faster: irrelevant
AVX2_ONE_THREAD = profile(bf16=(0.01, 1.0, 0.87), fp16=(0.01, 1.0, 0.9))  # real AVX2 EPYC (issue 17)
AVX512_BF16_CPU = profile(bf16=(2.0, 1.9, 1.0), fp16=(0.03, 2.2, 1.8))  # Zen 4 measured here
AMX_FP16_CPU = profile(bf16=(2.0, 1.9, 1.9), fp16=(2.6, 1.9, 1.9))  # fp16 more than 10 % faster
NOISY_LAPTOP = profile(bf16=(0.01, math.nan, math.nan), fp16=(0.01, math.nan, math.nan))


def test_avx2_laptop_keeps_float32_for_batched_work_and_decodes_as_its_batch_1_layer_measured():
    r = recommendation(AVX2_LAPTOP, "cpu")
    assert r.batched.startswith("float32") and r.training == "float32"
    assert r.decoding.startswith("bfloat16 weights")  # bf16 unless fp16 >10 % faster, as batched
    assert "batch-1 F.linear 1.76x" in r.decoding and "fp16 1.80x" in r.reason
    assert "bf16 0.01x" in r.reason and "fp16 0.01x" in r.reason
    assert recommendation(AVX2_ONE_THREAD, "cpu").decoding.startswith("float32 (16-bit weights "
                                                                      "measured no faster")
    noisy = recommendation(NOISY_LAPTOP, "cpu").decoding
    assert noisy.startswith("timings disagreed: measure again")  # noise is no finding either way


def test_bf16_cpu_gets_bf16_autocast_and_compares_bf16_with_fp16():
    r = recommendation(AVX512_BF16_CPU, "cpu")
    assert r.batched == "torch.amp.autocast('cpu', dtype=torch.bfloat16)"
    assert "no GradScaler" in r.training
    assert r.decoding.startswith("float16 weights")  # what its batch-1 layer measured, not the add
    assert "training" in str(r) and "batch-1 / decoding (memory-bound)" in str(r)
    amx = recommendation(AMX_FP16_CPU, "cpu")
    assert amx.batched == "torch.amp.autocast('cpu', dtype=torch.float16)"
    assert "GradScaler('cpu')" in amx.training and amx.decoding.startswith("bfloat16")
    near = profile(bf16=(2.0, 1.9, 1.9), fp16=(2.1, 1.9, 2.0))  # fp16 only 5 % faster: bf16
    assert "bfloat16" in recommendation(near, "cpu").batched
    assert recommendation(near, "cpu").decoding.startswith("bfloat16")
@pytest.mark.parametrize("accepted", [(), (torch.float16,)])
def test_mps_never_gets_a_dtype_its_autocast_rejects(monkeypatch, accepted):
    monkeypatch.setattr(speed_module, "supported_autocast_dtypes", lambda device_type: accepted)
    r = recommendation(AMX_FP16_CPU, "mps")  # bf16 and fp16 both measured fast
    assert "bfloat16" not in r.decoding + r.batched + r.training
    if accepted:
        assert r.batched == "torch.amp.autocast('mps', dtype=torch.float16)"
        assert r.decoding.startswith("float16") and "GradScaler('mps')" in r.training
    else:
        assert r.batched.startswith("float32") and r.decoding.startswith("float32")
