"""Benchmark recorder: ``python -m helpers.bench`` measures this machine and writes data/benchmarks/*.json.

Record format (one JSON file per machine and device; "schema": 1):

    {"schema": 1, "created": ISO time, "command": the command line that produced it,
     "machine": {"device": "cpu" | "cuda", "device_name": str, "threads": int, "gpu_capability": "9.0" | null},
     "versions": {"torch": str, "torchvision": str, "python": str, "cuda": str | null},
     "settings": {...: what was measured and how},
     "gemm": [{"dtype": "float32" | "tf32" | "float16" | "bfloat16", "n": int, "tflops": float, "seconds": float}],
     "inference": [{"model": "resnet50", "dtype": "float32" | "float16" | "bfloat16" | "autocast_bfloat16" | ...,
                    "batch": int, "images_per_s": float, "latency_ms": float, "peak_memory_bytes": int | null}],
     "train_step": [{"model": str, "mode": "float32" | "autocast_float16" | "autocast_bfloat16", "batch": int,
                     "step_ms": float, "peak_memory_bytes": int | null}]}
"""
from __future__ import annotations

import json
from pathlib import Path

from .model import DATA_DIR

BENCH_DIR = DATA_DIR / "benchmarks"
REPRODUCE = "python -m helpers.bench"


def load_records(directory: str | Path = BENCH_DIR, device: str | None = None) -> list[dict]:
    """All recorded benchmark files (sorted by name), optionally only those of one device type."""
    records = [json.loads(path.read_text()) for path in sorted(Path(directory).glob("*.json"))]
    return [r for r in records if device is None or r["machine"]["device"] == device]
