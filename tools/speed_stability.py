"""Is the setup check's advice stable here? ``python -m tools.speed_stability [--runs 5]``.

Measures :func:`helpers.speed_profile` ``--runs`` times in a row (``refresh=True``: each a fresh measurement at
this session's threads), then prints, as Markdown: each run's deciding ratios (prefill, decoding, autocast
training step per 16-bit dtype, NaN = "noisy") and advice (the dtype picked for a chat, batched inference and
training) with whether it changed from the first run; each ratio's median and largest deviation from it; and,
from the last run and from one measurement on one thread, the profile's rates and roofline figures. Issue 24's
target: the same advice in every run, every deciding ratio within 15 % of its median. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
import time

import torch

from helpers import speed

RATIOS = ("prefill_speedup", "decoding_speedup", "training_speedup")


def picks(profile) -> str:
    """The dtype (or float32 / noisy) each line of the recommendation names first."""
    r = speed.recommendation(profile, "cpu")
    return " / ".join(re.match(r"(noisy|torch\.amp\.autocast\('\w+', dtype=torch\.(\w+)|\w+)", text)
                      .group(2 if text.startswith("torch.amp") else 1) for text in
                      (r.decoding, r.batched, r.training))


def profile_table(profile) -> list[str]:
    rows = [f"Profile at {profile.threads} thread(s) ({profile.stamp}; in cache: {profile.in_cache}):", "",
            "| dtype | prefill tokens/s | decode tokens/s | chat s | bandwidth GB/s | compute GFLOP/s | ridge |"
            " matmul (one core) | add | batch-1 F.linear |", "|---" * 10 + "|"]
    for name, s in profile.items():
        rows.append(f"| {name} | {s.prefill_tokens_s:.0f} | {s.decode_tokens_s:.1f} | {s.chat_seconds:.2f} | "
                    f"{s.bandwidth / 1e9:.1f} | {s.compute / 1e9:.1f} | {s.ridge:.2f} | {s.matmul_speedup:.2f}x"
                    f" | {s.elementwise_speedup:.2f}x | {s.decode_speedup:.2f}x |")
    return rows + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    columns = [(d, r) for d in ("bfloat16", "float16") for r in RATIOS]
    print("| run | seconds | " + " | ".join(f"{d[:4]} {r.split('_')[0]}" for d, r in columns)
          + " | advice (chat / batched / training) | changed |")
    print("|---" * (len(columns) + 4) + "|")
    values, first = {c: [] for c in columns}, None
    for run in range(1, args.runs + 1):
        start = time.perf_counter()
        profile = speed.speed_profile("cpu", refresh=True)
        seconds, advice = time.perf_counter() - start, picks(profile)
        first = first or advice
        for d, r in columns:
            values[d, r].append(getattr(profile[d], r))
        print(f"| {run} | {seconds:.1f} | " + " | ".join(f"{values[c][-1]:.2f}" for c in columns)
              + f" | {advice} | {'no' if advice == first else 'YES'} |")
    stats = []
    for c in columns:
        finite = [v for v in values[c] if not math.isnan(v)]
        median = statistics.median(finite) if finite else math.nan
        worst = max((abs(v / median - 1) for v in finite), default=math.nan)
        stats.append(f"{median:.2f} (±{worst:.0%}, {len(values[c]) - len(finite)} noisy)")
    print("| median (largest deviation) | | " + " | ".join(stats) + " | | |\n")
    print("\n".join(profile_table(profile) + profile_table(speed.speed_profile("cpu", threads=1, refresh=True))))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; advice of the last run:")
    print(speed.recommendation(profile, "cpu"))


if __name__ == "__main__":
    main()
