"""helpers.speed: sizes per cache and thread count (simulated), stable rounds, the profile and its cache,
workload, and recommendation() on simulated profiles per machine class (CPU; GPUs: test_simulated_gpus)."""
import itertools
import json
import math
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import helpers
from helpers import speed as speed_module
from helpers.speed import DtypeSpeed, Sizes, recommendation, speed_verdict

TINY = Sizes(32, 1 << 12, 64, 1, True)  # a real measurement in milliseconds


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


def test_the_timed_ops_allocate_nothing():
    x = torch.ones(8)
    assert allocations(lambda: x + x) == 1  # the counter sees a fresh output
    for dtype in speed_module.SPEED_DTYPES:
        for call in speed_module.timed_ops(dtype, torch.device("cpu"), 16, 64):
            assert allocations(call) == 0, dtype


MiB = 1 << 20


@pytest.mark.parametrize("llc, streams", [(8 * MiB, True), (32 * MiB, True), (300 * MiB, False),
                                          (1126 * MiB, False)])  # laptop, Zen 4, Xeon, Genoa-X
def test_sizes_stream_past_the_cache_or_say_they_stayed_inside_it(monkeypatch, llc, streams):
    monkeypatch.setattr(speed_module, "last_level_cache_bytes", lambda: llc)
    sizes = speed_module.default_sizes("cpu")
    sixteen_bit = 2 * sizes.elements  # one 16-bit vector of the add; the stack's weights as many
    assert sizes.layers * 16 * sizes.width**2 >= sixteen_bit
    assert sixteen_bit <= speed_module.STREAM_CAP and 4 * 3 * sizes.elements <= 1536 * MiB  # memory cap
    assert (sixteen_bit >= 2 * llc) is streams and sizes.in_cache is (not streams)


def test_the_last_level_cache_comes_from_sysfs(tmp_path):
    for index, size in enumerate(("48K", "1024K", "96M")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert speed_module.last_level_cache_bytes(root=tmp_path) == 96 * MiB
    assert speed_module.last_level_cache_bytes(root=tmp_path / "missing") == 32 * MiB  # the default


def fake_speed(name: str, pre=2.0, dec=1.9, train=1.5, mm=2.0, add=1.9, lin=1.8,
               rates=(3331.0, 129.7)) -> DtypeSpeed:
    """A DtypeSpeed whose rates follow its ratios (float32's rates: notebook 08 §5 on Zen 4)."""
    s = DtypeSpeed(name, mm, add, "", lin, pre, dec, train, 20e9 * add / 2, 100e9 * pre,
                   rates[0] * pre, rates[1] * dec)
    return s.__class__(**{**s.__dict__, "verdict": speed_verdict(s)})


def fake_profile(bf16: dict, fp16: dict) -> speed_module.SpeedProfile:
    speeds = [fake_speed("float32", 1, 1, 1, 1, 1, 1), fake_speed("bfloat16", **bf16),
              fake_speed("float16", **fp16)]
    return speed_module.SpeedProfile(speeds, stamp="a fake machine", threads=2, measured_at="now",
                                     in_cache=False)


@pytest.mark.parametrize("threads", [1, 2, 64])
def test_the_profile_is_measured_at_the_learners_threads_and_restores_them(monkeypatch, threads):
    seen = []

    def measure(device, sizes):
        seen.append(torch.get_num_threads())
        return list(fake_profile({}, {}).values())

    monkeypatch.setattr(speed_module, "_measure", measure)
    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # the learner's, simulated
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(("set", n)))
    profile = helpers.speed_profile("cpu", sizes=TINY, refresh=True)
    assert profile.threads == threads and ("set", threads) in seen
    assert seen[-1] == ("set", threads)  # put back as found
    one_core = helpers.speed_profile("cpu", threads=1, sizes=TINY, refresh=True)
    assert one_core.threads == 1 and ("set", 1) in seen and seen[-1] == ("set", threads)
    monkeypatch.undo()
    assert torch.get_num_threads() == before


def test_verdict_words_flag_noise_and_ratios_the_bytes_cannot_give():
    s = fake_speed("float16", pre=0.24, dec=3.52, mm=0.03, lin=math.nan)
    text = speed_verdict(s)
    assert "prefill 0.24x" in text and "emulated (256x256 matmul, one core, 0.03x)" in text
    assert "decoding 3.52x (more than half the bytes allow" in text
    assert "batch-1 F.linear: noisy: measure again" in text
    assert "more than half" not in speed_verdict(fake_speed("bfloat16", pre=4.0))  # compute-bound


def rounds(monkeypatch, times) -> None:
    """fastest_of returns float32's time 1.0, then the next of ``times`` for the 16-bit call."""
    calls = iter(x for t in times for x in (1.0, t))
    monkeypatch.setattr(speed_module, "fastest_of", lambda fn, calls_=3: next(calls))


def test_a_ratio_counts_only_once_two_rounds_in_a_row_agree(monkeypatch):
    rounds(monkeypatch, [0.5, 0.25, 0.26])  # 2x, 4x, 3.85x: the last two agree
    assert speed_module.stable_ratio(None, None) == pytest.approx(math.sqrt(4 * 1 / 0.26))
    rounds(monkeypatch, itertools.cycle([0.3, 0.6]))  # never agree: noisy, within the time bound
    monkeypatch.setattr(speed_module, "ROUND_SECONDS", 0.05)
    assert math.isnan(speed_module.stable_ratio(None, None))


def test_an_implausible_memory_bound_ratio_needs_a_third_round(monkeypatch):
    rounds(monkeypatch, [0.2, 0.2, 0.2])  # 5x for half the bytes: believed after three rounds
    assert speed_module.stable_ratio(None, None, speed_module.MEMORY_BOUNDS) == pytest.approx(5.0)
    rounds(monkeypatch, itertools.chain([0.2, 0.2], itertools.cycle([0.3, 0.6])))
    monkeypatch.setattr(speed_module, "ROUND_SECONDS", 0.05)
    assert math.isnan(speed_module.stable_ratio(None, None, speed_module.MEMORY_BOUNDS))
    rounds(monkeypatch, [0.55, 0.5])  # 1.8x and 2x: plausible, two rounds do
    assert speed_module.stable_ratio(None, None, speed_module.MEMORY_BOUNDS) == pytest.approx(
        math.sqrt(1.8 * 2 / 0.99), rel=0.01)


def test_speed_profile_measures_every_dtype_and_workload(monkeypatch):
    monkeypatch.setattr(speed_module, "ROUND_SECONDS", 0.0)  # two rounds (three): a quick test
    profile = helpers.speed_profile("cpu", sizes=TINY, refresh=True)
    assert list(profile) == ["float32", "bfloat16", "float16"]
    assert profile.threads == torch.get_num_threads() and profile.in_cache is True
    assert profile.stamp.startswith("Outputs made on: ") and profile.measured_at[:2] == "20"
    base = profile["float32"]
    assert base.prefill_speedup == base.decoding_speedup == base.training_speedup == 1.0
    assert base.bandwidth > 0 and base.compute > 0 and base.ridge == base.compute / base.bandwidth
    for name in ("bfloat16", "float16"):
        s = profile[name]
        assert not s.matmul_speedup <= 0 and s.verdict == speed_verdict(s)  # NaN: noisy
        for ratio in (s.prefill_speedup, s.decoding_speedup, s.training_speedup):
            assert math.isnan(ratio) or ratio > 0  # NaN: noisy, decides nothing
        assert math.isnan(s.decode_tokens_s) or s.decode_tokens_s == pytest.approx(
            base.decode_tokens_s * s.decoding_speedup)
    assert torch.get_float32_matmul_precision() == "highest"


def test_speed_profile_is_cached_per_version_machine_kernels_and_threads(monkeypatch):
    monkeypatch.setattr(speed_module, "ROUND_SECONDS", 0.0)
    first = helpers.speed_profile("cpu", sizes=TINY, refresh=True)
    path = speed_module.speed_cache_path()
    assert path.exists()

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again although the profile was cached")

    monkeypatch.setattr(speed_module, "_measure", must_not_measure)
    again = helpers.speed_profile("cpu", sizes=TINY)
    assert {k: v.__dict__ for k, v in again.items()} == {k: v.__dict__ for k, v in first.items()} \
        or any(math.isnan(x) for v in first.values() for x in v.__dict__.values() if isinstance(x, float))
    assert (again.stamp, again.measured_at, again.in_cache) == (first.stamp, first.measured_at, True)
    assert all(key.startswith(f"v{speed_module.CACHE_VERSION}|") for key in json.loads(path.read_text()))
    for change in (lambda: monkeypatch.setattr(speed_module, "CACHE_VERSION", 99),
                   lambda: monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "SSE41"
                                              if os.environ.get("ONEDNN_MAX_CPU_ISA") == "AVX2" else "AVX2")):
        change()
        with pytest.raises(AssertionError, match="measured again"):
            helpers.speed_profile("cpu", sizes=TINY)
        monkeypatch.undo()
        monkeypatch.setattr(speed_module, "_measure", must_not_measure)
        monkeypatch.setattr(speed_module, "ROUND_SECONDS", 0.0)
    with pytest.raises(AssertionError, match="measured again"):
        helpers.speed_profile("cpu", sizes=TINY, threads=torch.get_num_threads() + 1)
    with pytest.raises(AssertionError, match="measured again"):
        helpers.speed_profile("cpu", sizes=TINY, refresh=True)


def test_workload_shrinks_only_for_an_emulated_dtype(monkeypatch):
    fake = fake_profile({}, {"mm": 0.01})
    monkeypatch.setattr(speed_module, "speed_profile", lambda device="cpu": fake)
    assert helpers.workload(torch.float32, 100, 10) == helpers.workload(torch.bfloat16, 100, 10) == 100
    assert helpers.workload("float16", 100, 10) == 10


# ------------------------------------------------- recommendation(): simulated profiles per machine class

ZEN4 = fake_profile(dict(pre=1.99, dec=1.96, train=1.6), dict(pre=0.24, dec=3.52, train=0.05, mm=0.03))
XEON = fake_profile(dict(pre=2.60, dec=0.56, train=2.0, mm=4.7), dict(pre=1.02, dec=0.88, train=0.9))
AVX2 = fake_profile(dict(pre=0.05, dec=1.76, train=0.05, mm=0.01), dict(pre=0.05, dec=1.8, train=0.04,
                                                                        mm=0.01))
AMX_FP16 = fake_profile(dict(pre=2.0, dec=1.9, train=2.0), dict(pre=2.6, dec=2.2, train=2.6))
NOISY = fake_profile(dict(pre=math.nan, dec=math.nan, train=math.nan),
                     dict(pre=math.nan, dec=math.nan, train=math.nan))


def test_zen4_serves_a_chat_in_bf16_although_fp16_decodes_faster():
    """Issue 24's figures: fp16 prefill 0.24x costs more than its decoding wins (1.7 s against 0.9 s)."""
    r = recommendation(ZEN4, "cpu")
    assert r.decoding.startswith("bfloat16 weights") and "0.94 s against float32's 1.84 s" in r.decoding
    assert "float16 chat 1.69 s" in r.reason and "batch-1 F.linear" in r.reason
    assert r.batched.startswith("torch.amp.autocast('cpu', dtype=torch.bfloat16)")
    assert r.training.startswith("torch.amp.autocast('cpu', dtype=torch.bfloat16), float32 weights, "
                                 "no GradScaler")
    assert "chat, 1,000-token prompt + 200 tokens" in str(r)


def test_a_xeon_whose_16_bit_decoding_is_slow_keeps_float32_weights_for_a_chat():
    r = recommendation(XEON, "cpu")
    assert r.decoding.startswith("float32") and "bfloat16" in r.batched and "bfloat16" in r.training
    tie = fake_profile(dict(pre=1.0, dec=1.05), dict(pre=0.3, dec=1.05, mm=0.03))  # AVX2-like, 2 threads
    assert recommendation(tie, "cpu").decoding == "float32 (16-bit weights: under 10 % faster here)"


def test_avx2_laptop_and_noise():
    r = recommendation(AVX2, "cpu")  # prefill 20x slower outweighs decoding 1.8x for this chat
    assert r.decoding.startswith("float32") and r.batched.startswith("float32")
    assert r.training.startswith("float32")
    half = fake_profile(dict(pre=math.nan, dec=1.9, train=math.nan), dict(pre=0.2, dec=1.8, train=0.1))
    r = recommendation(half, "cpu")  # the noisy bf16 might have won: no verdict from fp16's loss alone
    assert r.batched.startswith("noisy") and r.training.startswith("noisy")
    steady = fake_profile(dict(pre=4.0, dec=2.0, train=1.5), dict(pre=math.nan, dec=math.nan, mm=0.03))
    r = recommendation(steady, "cpu")  # a noisy fp16 decides nothing: bf16 measured fast stands
    assert r.decoding.startswith("bfloat16") and "bfloat16" in r.batched and "bfloat16" in r.training
    noisy = recommendation(NOISY, "cpu")
    assert all(text.startswith("noisy: measure again") for text in (noisy.decoding, noisy.batched,
                                                                     noisy.training))


def test_float16_comes_with_its_caveats():
    r = recommendation(AMX_FP16, "cpu")  # fp16 >10 % faster than bf16 everywhere
    assert r.decoding.startswith("float16 weights") and "overflow past 65504" in r.decoding
    assert "01 §5, 08 §2" in r.decoding and "GradScaler('cpu')" in r.training
    assert "CPU autocast keeps no op in float32 for float16" in r.training
    near = fake_profile(dict(pre=2.0, dec=1.9, train=2.0), dict(pre=2.1, dec=1.95, train=2.1))
    assert "bfloat16" in recommendation(near, "cpu").batched  # fp16 only 5 % faster: bf16
    assert recommendation(near, "cpu").decoding.startswith("bfloat16")


def test_cpu_autocast_float16_really_has_no_float32_rules():
    """What the caveat says, on the installed torch: a sum overflows, softmax and layer_norm stay fp16."""
    x = torch.full((4, 64), 300.0)
    with torch.amp.autocast("cpu", dtype=torch.float16):
        total = (x @ x.t()).sum()
        soft = torch.softmax(x.half(), dim=-1)
        norm = torch.nn.functional.layer_norm(x.half(), (64,))
    assert total.dtype == soft.dtype == norm.dtype == torch.float16 and total.isinf()


@pytest.mark.parametrize("accepted", [(), (torch.float16,), (torch.float16, torch.bfloat16)])
def test_mps_gets_what_its_autocast_accepts_and_bf16_for_training(monkeypatch, accepted):
    monkeypatch.setattr(speed_module, "supported_autocast_dtypes", lambda device_type: accepted)
    r = recommendation(AMX_FP16, "mps")  # bf16 and fp16 both measured fast
    if not accepted:
        assert r.batched.startswith("float32") and r.decoding.startswith("float32")
    elif torch.bfloat16 in accepted:
        assert "dtype=torch.bfloat16), float32 weights, no GradScaler" in r.training
    else:
        assert "bfloat16" not in r.decoding + r.batched + r.training
        assert "GradScaler('mps')" in r.training and "pytorch#142397" in r.training
