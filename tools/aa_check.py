"""How often does ``helpers.timing.compare`` call a workload faster or slower than itself, here?

``python -m tools.aa_check --comparisons 200 [--round-s 0.02] [--batch 16] [--max-seconds S] [--record]``

Runs A/A comparisons (the float32 ShapesCNN forward of notebook 01 §4, at ``--batch`` images, against
itself) with the course's compare at the notebooks' settings, and prints the count of directional verdicts
("faster" or "slower": each one false, as there is no true difference), the other verdicts, the spread
(sigma) of the rounds, and the load average before and after. ``--record`` writes the result to
data/benchmarks/aa/ (machine, command, date, real measurement).
"""

import argparse
import collections
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import helpers
from helpers import timing

RECORD_DIR = Path(__file__).resolve().parent.parent / "data" / "benchmarks" / "aa"


def workload(batch: int):
    """The float32 ShapesCNN forward on ``batch`` test images (random weights: speed needs no training)."""
    torch.manual_seed(0)
    model = helpers.ShapesCNN().eval()
    images = helpers.shapes_dataset("test", n=batch).tensors[0]

    def forward():
        with torch.inference_mode():
            model(images)
    return forward


def run(comparisons: int, round_s: float, batch: int, max_seconds: float) -> dict:
    """``comparisons`` A/A comparisons, or as many as ``max_seconds`` allow (at least one)."""
    forward = workload(batch)
    load_before = timing.load_average()
    start = time.perf_counter()
    results = []
    while len(results) < comparisons and (not results or time.perf_counter() - start < max_seconds):
        results.append(timing.compare(forward, forward, round_s=round_s))
    verdicts = collections.Counter(result.verdict for result in results)
    sigmas = sorted(result.sigma for result in results)
    return {"comparisons": len(results), "asked": comparisons, "directional": verdicts["faster"] + verdicts["slower"],
            "verdicts": dict(verdicts), "round_s": round_s, "batch": batch,
            "rounds": dict(collections.Counter(result.rounds for result in results)),
            "sigma_median": statistics.median(sigmas), "sigma_max": sigmas[-1],
            "load_before": load_before, "load_after": timing.load_average(),
            "load_during": [round(result.load, 2) for result in results if result.load is not None],
            "seconds": time.perf_counter() - start}


def report(result: dict) -> str:
    loads = result["load_during"]
    load = f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})" if loads else "n/a"
    return (f"{result['directional']} of {result['comparisons']} A/A comparisons called faster or slower "
            f"(target: at most {timing.ERROR:.0%}); verdicts {result['verdicts']}; rounds "
            f"{result['rounds']}; sigma median {result['sigma_median']:.3f}, max "
            f"{result['sigma_max']:.3f}; load average during {load}; {result['seconds']:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--comparisons", type=int, default=200)
    parser.add_argument("--round-s", type=float, default=0.02, help="the notebooks pass 0.01-0.02")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-seconds", type=float, default=float("inf"),
                        help="stop after this long (a busy machine); the count covers those run")
    parser.add_argument("--record", action="store_true", help="write data/benchmarks/aa/<date>.json")
    args = parser.parse_args(argv)
    result = run(args.comparisons, args.round_s, args.batch, args.max_seconds)
    print(report(result))
    if args.record:
        now = datetime.datetime.now(datetime.timezone.utc)
        record = {"schema": 1, "created": now.isoformat(timespec="seconds"), "real": True,
                  "command": "python -m tools.aa_check " + " ".join(sys.argv[1:] if argv is None else argv),
                  "machine": helpers.machine_stamp("cpu").removeprefix("Outputs made on: "),
                  "torch": torch.__version__, **result}
        RECORD_DIR.mkdir(parents=True, exist_ok=True)
        path = RECORD_DIR / f"aa_check_{now:%Y-%m-%dT%H%M}.json"
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"recorded in {path.relative_to(RECORD_DIR.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
