"""How long the classroom pre-flight (``pytest``) takes, per notebook: ``python -m tools.suite_times``.

Runs the whole suite once (``pytest --junitxml``), adds up the time of every test item per file group (the unit
tests as one group, each notebook as one), and writes ``data/suite_times/suite_<cpu class>.json``. The CPU class
comes from the CPU's flags and the kernels PyTorch may use: "native bf16" where the CPU has bf16 arithmetic
(``avx512_bf16`` or ``amx_bf16``) and neither ``ATEN_CPU_CAPABILITY`` nor ``ONEDNN_MAX_CPU_ISA`` holds the kernels
below AVX-512, else "emulated bf16" (an AVX2-only laptop; imitate one on a newer CPU with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``). ``--readme`` prints the README's table from the recorded
files. A benchmark, not a timed test: nothing fails because a machine is slow.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch

from helpers.device import cpu_flags

ROOT = Path(__file__).resolve().parent.parent
TIMES_DIR = ROOT / "data" / "suite_times"
TARGET_X_REFERENCE = 350  # the whole suite within 350x the reference work on the machine that runs it
# The test that compares the README's tables with the recorded files cannot pass while they are being re-measured:
# it is left out of the measured run (it takes milliseconds) and runs in every ordinary `pytest`.
README_TEST = "tests/test_course_stats.py::test_readme_suite_times_are_the_recorded_ones"


BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # x86 instructions that do bf16 arithmetic (dot products, tiles)
# ONEDNN_MAX_CPU_ISA values that stop oneDNN (PyTorch's CPU matmuls) short of its bf16 kernels
ONEDNN_WITHOUT_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"}


def cpu_class(flags: set[str] | None = None, environ: dict[str, str] | None = None) -> str:
    """'native bf16' or 'emulated bf16', from the CPU's flags (``flags``, default this CPU's) and the kernel
    limits in ``environ`` (default ``os.environ``): no measurement, so one busy moment cannot change the label."""
    flags = cpu_flags() if flags is None else flags
    environ = os.environ if environ is None else environ
    aten_limited = environ.get("ATEN_CPU_CAPABILITY", "").lower() in {"default", "avx2"}
    onednn_limited = environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ONEDNN_WITHOUT_BF16
    if flags & BF16_FLAGS and not aten_limited and not onednn_limited:
        return "native bf16"
    return "emulated bf16"


def machine() -> str:
    """The CPU model and its 16-bit flags, and the kernel restriction if one imitates another CPU class."""
    from tools.bench import machine_info

    flags = sorted(cpu_flags() & ({"avx2", "avx512f", "avx512_fp16", "amx_fp16"} | BF16_FLAGS))
    limits = [f"{name}={os.environ[name]}" for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
              if name in os.environ]
    imitation = f"; imitation: {' '.join(limits)}" if limits else ""
    return f"{machine_info(torch.device('cpu'))['device_name']} ({'+'.join(flags) or 'no AVX flags'}{imitation})"


def group_of(testcase: ElementTree.Element) -> str:
    """The file group of one junit test case: a notebook's file name, or 'unit tests'."""
    classname = testcase.get("classname", "")  # "notebooks.07_name.ipynb" or "tests.test_formats"
    return classname.removeprefix("notebooks.") if classname.endswith(".ipynb") else "unit tests"


def group_seconds(junit_xml: Path) -> dict[str, float]:
    """Seconds per file group in a junit report (setup, call and teardown of every item)."""
    totals: dict[str, float] = {}
    for testcase in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        group = group_of(testcase)
        totals[group] = totals.get(group, 0.0) + float(testcase.get("time", 0.0))
    return dict(sorted(totals.items(), key=lambda item: (item[0] != "unit tests", item[0])))


def reference_seconds() -> float:
    """Seconds for a fixed piece of pure-Python work (the best of three): how fast this machine is right now.

    The same suite takes longer when the machine is slower, and a shared virtual machine's speed drifts. Recorded
    before and after each run, it tells a slow run on a busy host from a slower suite.
    """
    return round(min(timeit.repeat("sum(range(10_000_000))", number=1, repeat=3)), 3)


def measure(pytest_args: list[str] | None = None) -> dict:
    """Run the suite once and return the record (written by :func:`main`)."""
    reference_before = reference_seconds()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        completed = subprocess.run([sys.executable, "-m", "pytest", "-q", f"--junitxml={report}",
                                    f"--deselect={README_TEST}", *(pytest_args or [])], cwd=ROOT)
        wall = time.perf_counter() - start
        groups = group_seconds(report)
    label = machine()
    return {"cpu_class": cpu_class(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": label, "command": " ".join(["python -m tools.suite_times", *(pytest_args or [])]),
            "real_or_imitation": "imitation" if "imitation:" in label else "real",
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "created": datetime.date.today().isoformat(), "exit_status": completed.returncode,
            "deselected": [README_TEST],
            "reference_seconds": {"before": reference_before, "after": reference_seconds()},
            "wall_seconds": round(wall, 1), "groups": {k: round(v, 1) for k, v in groups.items()}}


def _records(directory: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(directory.glob("suite_*.json"))]


def readme_table(directory: Path = TIMES_DIR) -> str:
    """The pre-flight's time per group for each recorded run, with the machine that ran it (an imitation of
    another CPU class is labelled so) and its reference work, so a reader can scale the figures to theirs."""
    records = _records(directory)
    if not records:
        return "(no suite timing recorded yet: run `python -m tools.suite_times`)"
    groups = list(dict.fromkeys(g for r in records for g in r["groups"]))
    header = "| | " + " | ".join(f"{r['cpu_class']} ({r['cpu_capability']}, torch {r['torch']})" for r in records)
    rows = [header + " |", "|---" * (len(records) + 1) + "|",
            "| machine | " + " | ".join(
                ("an **imitation** on " if "imitation" in r.get("machine", "") else "real: ")
                + r.get("machine", "not recorded") for r in records) + " |"]
    for group in groups:
        rows.append(f"| {group} | " + " | ".join(
            f"{r['groups'][group]:.0f} s" if group in r["groups"] else "not in this run" for r in records) + " |")
    rows.append("| **whole `pytest` run (wall)** | " + " | ".join(wall_cell(r, groups) for r in records) + " |")
    rows.append("| reference work, before the run (`python -m tools.suite_times --reference`) | " + " | ".join(
        f"{r['reference_seconds']['before']:.2f} s" if "reference_seconds" in r else "not recorded"
        for r in records) + " |")
    return "\n".join(rows)


def wall_cell(record: dict, groups: list[str]) -> str:
    """A run's wall time; where it left out groups that another run has, it says so: not comparable."""
    missing = [g.split("_")[0] for g in groups if g not in record["groups"]]
    cell = f"**{record['wall_seconds']:.0f} s**"
    if missing:
        return cell + f" (without {', '.join(missing)}: not comparable with a run that has them)"
    if "reference_seconds" in record:
        ratio = record["wall_seconds"] / record["reference_seconds"]["before"]
        cell += f" ({ratio:.0f}x the reference work; target {TARGET_X_REFERENCE}x)"
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", action="store_true", help="print the README table from the recorded files")
    parser.add_argument("--reference", action="store_true",
                        help="time only the reference work (compare this machine's speed with the recorded runs)")
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest")
    args = parser.parse_args(argv)
    if args.readme:
        print(readme_table())
        return 0
    if args.reference:
        print(f"reference work: {reference_seconds():.2f} s on this machine now")
        return 0
    record = measure(args.pytest_args)
    TIMES_DIR.mkdir(exist_ok=True)
    path = TIMES_DIR / f"suite_{record['cpu_class'].replace(' ', '_')}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    print(f"written: {path.relative_to(ROOT)}")
    return record["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
