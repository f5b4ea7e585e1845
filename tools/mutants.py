"""Mutation testing by hand: break a helper the way a tired maintainer might, and check that ``tests/`` notices.

    python tools/mutants.py                 # every mutant, with this interpreter
    python tools/mutants.py --only train    # mutants whose name contains "train" (repeatable)
    python tools/mutants.py --list          # the mutants, without running anything

Each mutant is one textual change (a dropped call, a swapped dtype, an off-by-one, a wrong default, ...) to one
file of ``helpers/``. It is applied to a *temporary copy* of ``helpers/``, ``tests/`` and ``data/``, never to the
working tree, and only the test files that cover that helper run against it (``pytest -x``). A mutant is *caught*
when that run fails (or times out). The unmutated copy must pass first, or the table means nothing. Prints a
Markdown table and exits 1 if a mutant survives.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("helpers", "tests", "data", "pyproject.toml")
TIMEOUT_S = 600

TRAIN_TESTS = ("tests/test_recipe_teeth.py", "tests/test_train_and_measure.py")
MODEL_TESTS = ("tests/test_recipe_teeth.py", "tests/test_data_and_model.py")


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    # helpers/training.py: amp_step, the recipe itself
    Mutant("train: loss scaled twice", "helpers/training.py", "scaler.scale(loss).backward()",
           "scaler.scale(scaler.scale(loss)).backward()", TRAIN_TESTS),
    Mutant("train: optimizer.step() instead of scaler.step()", "helpers/training.py", "scaler.step(optimizer)",
           "optimizer.step()", TRAIN_TESTS),
    Mutant("train: zero_grad dropped", "helpers/training.py", "    optimizer.zero_grad(set_to_none=True)\n", "",
           TRAIN_TESTS),
    Mutant("train: scaler.update() dropped", "helpers/training.py", "        scaler.update()\n", "", TRAIN_TESTS),
    Mutant("train: autocast never enabled", "helpers/training.py",
           "enabled=amp_dtype is not None):\n        logits", "enabled=False):\n        logits",
           TRAIN_TESTS),
    Mutant("train: amp_step autocasts to bfloat16 whatever the dtype", "helpers/training.py",
           "dtype=amp_dtype or torch.float32,\n                            enabled=amp_dtype is not None):\n"
           "        logits",
           "dtype=torch.bfloat16,\n                            enabled=amp_dtype is not None):\n        logits",
           TRAIN_TESTS),
    Mutant("train: plain step without optimizer.step()", "helpers/training.py",
           "        loss.backward()\n        optimizer.step()\n", "        loss.backward()\n", TRAIN_TESTS),
    # helpers/training.py: the loop
    Mutant("train: skipped steps never counted", "helpers/training.py", "log.skipped_steps += not stepped",
           "pass", TRAIN_TESTS),
    Mutant("train: a changed scale counts as a skip", "helpers/training.py", "return scale_after < scale_before",
           "return scale_after != scale_before", TRAIN_TESTS),
    Mutant("train: scheduler stepped after skipped steps", "helpers/training.py",
           "if scheduler is not None and stepped:", "if scheduler is not None:", TRAIN_TESTS),
    Mutant("train: scheduler never stepped", "helpers/training.py", "                    scheduler.step()\n",
           "                    pass\n", TRAIN_TESTS),
    Mutant("train: max_steps off by one", "helpers/training.py", "len(log.losses) >= max_steps",
           "len(log.losses) > max_steps",
           TRAIN_TESTS),
    Mutant("train: logs the scale before update()", "helpers/training.py", "log.scales.append(scaler.get_scale())",
           "log.scales.append(scale_before)", TRAIN_TESTS),
    Mutant("train: model left in training mode", "helpers/training.py", "    model.eval()\n    return log",
           "    return log", TRAIN_TESTS),
    Mutant("train: make_scaler accepts float32", "helpers/training.py", "if amp_dtype != torch.float16:",
           "if amp_dtype == torch.bfloat16:", TRAIN_TESTS),
    Mutant("train: evaluate predicts along the batch", "helpers/training.py", "predictions = logits.argmax(dim=1)",
           "predictions = logits.argmax(dim=0)", TRAIN_TESTS),
    Mutant("train: evaluate chunk off by one", "helpers/training.py", "inputs[start : start + batch_size]",
           "inputs[start : start + batch_size - 1]", TRAIN_TESTS),
    Mutant("train: evaluate ignores input_dtype", "helpers/training.py", "x = x.to(input_dtype)", "x = x",
           TRAIN_TESTS),
    Mutant("train: evaluate keeps half logits", "helpers/training.py", "chunks.append(model(x).float().cpu())",
           "chunks.append(model(x).cpu())", TRAIN_TESTS),
    # helpers/model.py
    Mutant("model: checkpoint loaded with weights_only=False", "helpers/model.py", "weights_only=True)",
           "weights_only=False)", MODEL_TESTS),
    Mutant("model: loaded model left in training mode", "helpers/model.py", "return model.to(device).eval()",
           "return model.to(device)", MODEL_TESTS),
    Mutant("model: missing-file message dropped", "helpers/model.py", "    if not path.exists():",
           "    if False:", MODEL_TESTS),
    Mutant("model: a width not a multiple of 8", "helpers/model.py", "(16, 32, 64, 64)", "(16, 32, 64, 60)",
           MODEL_TESTS),
    Mutant("model: ReLU dropped", "helpers/model.py", "nn.BatchNorm2d(width), nn.ReLU()]",
           "nn.BatchNorm2d(width)]", MODEL_TESTS),
    Mutant("model: pooling off by one", "helpers/model.py", "if i < len(widths) - 1", "if i < len(widths) - 2",
           MODEL_TESTS),
)


def copy_tree(destination: Path) -> None:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, destination / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, destination / name)


def run_tests(tree: Path, tests: tuple[str, ...], python: str) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [python, "-m", "pytest", "-x", "-q", "-o", "addopts=-p no:cacheprovider", *tests]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        status = done.returncode
    except subprocess.TimeoutExpired:
        status = -1
    return status, time.perf_counter() - start


def check_isolation(tree: Path, python: str) -> None:
    """The copy's ``helpers`` must be the one imported (not an editable install of the working tree)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    found = subprocess.run([python, "-c", "import helpers; print(helpers.__file__)"], cwd=tree, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(tree.resolve()):
        sys.exit(f"the tests would import {found}, not the mutated copy in {tree}: aborting")


def apply(tree: Path, mutant: Mutant) -> None:
    path = tree / mutant.file
    text = path.read_text()
    if text.count(mutant.old) != 1:
        raise ValueError(f"{mutant.name}: {mutant.old!r} occurs {text.count(mutant.old)} times in {mutant.file}")
    path.write_text(text.replace(mutant.old, mutant.new))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[],
                        help="run the mutants whose name contains this text (repeatable)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs pytest")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    mutants = [m for m in MUTANTS if not args.only or any(text in m.name for text in args.only)]
    if args.list:
        print("\n".join(m.name for m in mutants))
        return 0
    with tempfile.TemporaryDirectory(prefix="mutants-") as folder:
        pristine = Path(folder) / "pristine"
        pristine.mkdir()
        copy_tree(pristine)
        check_isolation(pristine, args.python)
        for mutant in mutants:  # every snippet must still be found: a stale mutant would silently test nothing
            found = (pristine / mutant.file).read_text().count(mutant.old)
            if found != 1:
                sys.exit(f"{mutant.name}: {mutant.old!r} occurs {found} times in {mutant.file}: update the mutant")
        baseline = sorted({t for m in mutants for t in m.tests})
        status, seconds = run_tests(pristine, tuple(baseline), args.python)
        if status != 0:
            print(f"the unmutated tests fail (exit status {status}): fix them first", file=sys.stderr)
            return 2
        print(f"baseline: {' '.join(baseline)} pass ({seconds:.0f} s)\n")
        print("| mutant | file | tests run | result |\n|---|---|---|---|", flush=True)
        survivors = 0
        for mutant in mutants:
            tree = Path(folder) / "mutant"
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(pristine, tree)
            apply(tree, mutant)
            status, seconds = run_tests(tree, mutant.tests, args.python)
            caught = status != 0
            survivors += not caught
            result = ("caught" if status > 0 else "caught (timeout)") if caught else "**SURVIVED**"
            tests = ", ".join(Path(t).stem for t in mutant.tests)
            print(f"| {mutant.name} | {mutant.file} | {tests} | {result} ({seconds:.0f} s) |", flush=True)
        print(f"\ncaught {len(mutants) - survivors} of {len(mutants)} mutants")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
