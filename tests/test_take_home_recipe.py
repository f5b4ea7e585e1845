"""The take-home recipe (notebooks/take_home_recipe.py): it runs where the course's ``helpers`` cannot be imported,
in each branch a CPU can take (forced through its ``--device-description`` override), gives the documented
decisions for simulated CUDA and MPS devices, runs its CUDA branches on a GPU when there is one, and carries the
course's rule as ``python -m tools.copies --write`` writes it from helpers/precision.py (tests/test_copies.py).
Its training, checkpoint and inference code is checked, with mutants, in tests/test_recipe_teeth.py."""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "notebooks" / "take_home_recipe.py"
RULE = ROOT / "helpers" / "precision.py"
CPU_FLOAT32 = {"device": "cpu", "system": "Linux", "arch": "x86_64", "flags": ["avx2"]}  # an AVX2 laptop
CPU_BF16 = {"device": "cpu", "system": "Linux", "arch": "x86_64", "flags": ["avx512f", "avx512_bf16"]}
T4 = {"device": "cuda", "name": "Tesla T4", "capability": [7, 5]}
A100 = {"device": "cuda", "name": "NVIDIA A100-SXM4-80GB", "capability": [8, 0]}
GTX_1650 = {"device": "cuda", "name": "NVIDIA GeForce GTX 1650", "capability": [7, 5]}
MPS_24 = {"device": "mps", "torch": "2.4.1", "macos": "14.5"}  # MPS: untested here (no Mac), simulated
MPS_25_MACOS_14 = {"device": "mps", "torch": "2.5.1", "macos": "14.5"}
MPS_26_MACOS_13 = {"device": "mps", "torch": "2.6.0", "macos": "13.6"}
MPS_28 = {"device": "mps", "torch": "2.8.0", "macos": "14.5"}
MPS_29_MACOS_13 = {"device": "mps", "torch": "2.9.0", "macos": "13.6"}
MPS_NEWEST = {"device": "mps", "torch": "2.14.1", "macos": "15.3"}


def load_recipe(path: Path = SCRIPT):
    spec = importlib.util.spec_from_file_location("take_home_recipe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SITE_PACKAGES = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
# Python without its site module (-S: no .pth files, so no editable install of the course) and isolated (-I: no
# PYTHONPATH, no user site, not the script's folder), with torch's site-packages put back by hand
BOOTSTRAP = ("import runpy, sys; sys.path[:0] = {paths!r}; sys.argv = {argv!r}; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")


def python_without_helpers(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = BOOTSTRAP.format(paths=SITE_PACKAGES, argv=argv)
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def isolated_copy(tmp_path_factory) -> Path:
    """The script alone in an empty folder, run where ``helpers`` cannot be imported (checked first) and torch
    can."""
    folder = tmp_path_factory.mktemp("monday")
    shutil.copy(SCRIPT, folder / SCRIPT.name)
    (folder / "probe.py").write_text("import torch\nimport helpers\n")
    probe = python_without_helpers(["probe.py"], folder)
    assert probe.returncode != 0 and "No module named 'helpers'" in probe.stderr, probe.stderr
    return folder / SCRIPT.name


BRANCHES = {"float32": CPU_FLOAT32, "bf16-autocast": CPU_BF16, "fp16-autocast-GradScaler": T4}


@pytest.fixture(scope="module")
def branch_outputs(isolated_copy) -> dict[str, str]:
    """Each CPU branch's output, the three run one after another in one interpreter without ``helpers`` (one
    torch import, not three)."""
    runs = [[isolated_copy.name, "--device", "cpu", "--device-description", json.dumps(description)]
            for description in BRANCHES.values()]
    code = (f"import runpy, sys; sys.path[:0] = {SITE_PACKAGES!r}\n"
            f"for sys.argv in {runs!r}:\n"
            "    print('=== next run ===', flush=True)\n"
            "    runpy.run_path(sys.argv[0], run_name='__main__')\n")
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=isolated_copy.parent,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    outputs = result.stdout.split("=== next run ===\n")[1:]
    return dict(zip(BRANCHES, outputs, strict=True))


def run_isolated(script: Path, description: dict | None = None, *more: str) -> str:
    argv = [script.name, *more]
    if description is not None:
        argv += ["--device-description", json.dumps(description)]
    result = python_without_helpers(argv, script.parent)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


def logged_losses(out: str) -> list[float]:
    """The first and last logged losses (the loss of every LOG_EVERY-th step) of a run's output."""
    first, last = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+) \(read every 4 steps\)", out).groups()
    return [float(first), float(last)]


@pytest.mark.parametrize("branch, training, inference", [
    ("float32", "training:          float32 (torch.float32)", "Inference (float32)"),
    ("bf16-autocast", "training:          autocast (torch.bfloat16)", "Inference (16-bit weights)"),
    ("fp16-autocast-GradScaler", "training:          autocast + GradScaler (torch.float16)", "Inference (autocast)"),
], ids=list(BRANCHES))
def test_each_cpu_branch_runs_without_helpers(branch_outputs, branch, training, inference):
    out = branch_outputs[branch]
    description = BRANCHES[branch]
    assert out.startswith("Running on cpu, with a made-up device's recipe") and training in out
    how = training.split()[1:-1]
    assert f"Trained 8 steps ({' '.join(how)}): loss" in out and f"{inference}: torch.float32 logits" in out
    losses = logged_losses(out)
    assert losses[1] < 0.8 * losses[0]  # it learns: step 1 against step 5 (each branch)
    accuracy = float(out.split("held-out accuracy ")[1].split()[0])
    assert accuracy > 0.6  # four classes: chance is 0.25
    scaler_back = "GradScaler state: {'scale': 65536.0" in out and "'_growth_tracker': 8}" in out  # 8 clean steps
    assert scaler_back == (description is T4) and ("GradScaler state: none (off)" in out) == (description is not T4)


def test_the_default_run_decides_for_this_machine_and_trains_in_seconds(isolated_copy):
    resource = pytest.importorskip("resource", reason="CPU time of a child process: Unix only")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run_isolated(isolated_copy)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # not wall: shared cores
    assert out.startswith("Running on ") and "made-up" not in out.splitlines()[0]
    assert "training:" in out and "Trained 8 steps" in out and "Inference (" in out
    assert out.startswith("Running on cpu") == (not torch.cuda.is_available())
    # measured: 4.6 CPU seconds (about 2.5 s of wall time on 2 quiet cores), most of it importing torch and the
    # torch._dynamo that any optimizer pulls in; a bound that catches a model or dataset grown tenfold
    assert cpu_seconds < 15


def decisions(description: dict) -> dict[str, tuple[str, torch.dtype | None]]:
    recipe = load_recipe()
    made_up = recipe.read_description(json.dumps(description), torch.device("cpu"))
    return {workload: (advice.how, advice.dtype) for workload, advice in recipe.choose_precision(made_up).items()}


@pytest.mark.parametrize("description, training, batched", [
    (T4, ("autocast + GradScaler", torch.float16), ("autocast", torch.float16)),
    (A100, ("autocast", torch.bfloat16), ("16-bit weights", torch.bfloat16)),
    (GTX_1650, ("float32", torch.float32), ("float32", torch.float32)),
    (MPS_24, ("float32", torch.float32), ("float32", torch.float32)),
    (MPS_25_MACOS_14, ("float32", torch.float32), ("autocast", torch.float16)),
    (MPS_26_MACOS_13, ("float32", torch.float32), ("autocast", torch.float16)),
    (MPS_28, ("measure", None), ("autocast", torch.float16)),  # no Mac run recorded: untested, measure
    (MPS_NEWEST, ("measure", None), ("autocast", torch.float16)),
    (MPS_29_MACOS_13, ("measure", None), ("measure", None)),  # no MPS there: the Apple CPU computes
    ({"device": "cpu", "flags": None}, ("measure", None), ("measure", None)),  # Windows: flags unreadable
], ids=["T4", "A100", "GTX1650", "MPS-2.4", "MPS-2.5", "MPS-2.6-macOS13", "MPS-2.8", "MPS-newest",
        "MPS-2.9-macOS13", "Windows-CPU"])
def test_simulated_cuda_mps_and_windows_decisions(description, training, batched):
    got = decisions(description)
    assert got["training"] == training and got["batched inference"] == batched


@pytest.mark.parametrize("description, how, scaled", [
    (A100, "autocast (torch.bfloat16)", False), (MPS_24, "float32 (torch.float32)", False),
    (MPS_25_MACOS_14, "float32 (torch.float32)", False), (MPS_28, "measure (float32 until you measure)", False),
    (T4, "autocast + GradScaler (torch.float16)", True)],
    ids=["A100", "MPS-2.4", "MPS-2.5", "MPS-2.8", "T4"])
def test_a_made_up_device_trains_here_with_its_recipe(capsys, description, how, scaled):
    """Each recipe run in this process on the CPU (``--device cpu``): MPS by simulation, untested on a Mac."""
    recipe = load_recipe()
    result = recipe.main(["--device", "cpu", "--device-description", json.dumps(description)])
    assert result["scaler"].is_enabled() is scaled
    assert result["logits"].dtype == torch.float32 and not result["model"].training
    out = capsys.readouterr().out
    assert f"training:          {how}" in out
    assert ("untested here" in out) == (description["device"] == "mps")


class Stopped(Exception):
    """Raised where a test stops the recipe after its first lines (no Mac here to train on MPS)."""


def test_the_recipe_picks_mps_only_when_asked_and_then_says_it_is_untested(monkeypatch, capsys):
    """A simulated Mac on the newest torch: the recipe's own choice is the CPU (the rule says measure on MPS
    until a Mac run is recorded); AMP_COURSE_DEVICE=mps opts in, and the output says untested (48.1)."""
    recipe = load_recipe()
    monkeypatch.setattr(torch, "__version__", MPS_NEWEST["torch"])
    monkeypatch.setattr(recipe.platform, "mac_ver", lambda: (MPS_NEWEST["macos"], ("", "", ""), "arm64"))
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("AMP_COURSE_DEVICE", raising=False)
    assert recipe.pick_device() == torch.device("cpu")
    assert recipe.choose_precision(recipe.describe_device("mps"))["training"].how == "measure"
    monkeypatch.setenv("AMP_COURSE_DEVICE", "mps")
    assert recipe.pick_device() == torch.device("mps")

    def stop(*args, **kwargs):
        raise Stopped

    monkeypatch.setattr(recipe, "make_model", stop)
    with pytest.raises(Stopped):
        recipe.main([])
    out = capsys.readouterr().out
    assert out.startswith("Running on mps (your choice, untested here: no Mac run is recorded)")
    assert "training:          measure (float32 until you measure)" in out and "no Mac run is recorded" in out


def test_the_mps_on_torch_24_autocast_line_runs_where_the_old_one_raised():
    """torch 2.4's ``torch.amp.autocast("mps", enabled=False)`` raises before it reads ``enabled``
    (run this on the oldest venv, torch 2.4.1, to see it for real); the recipe opens no context."""
    recipe = load_recipe()
    training = recipe.choose_precision(recipe.read_description(json.dumps(MPS_24), torch.device("cpu")))["training"]
    assert training.how == "float32"
    with recipe.autocast(training, torch.device("mps")) as context:  # the recipe's line, device type "mps"
        assert context is None and not torch.is_autocast_enabled()
    try:
        torch.amp.autocast("mps", enabled=False)
        old_line_raised = False
    except RuntimeError:
        old_line_raised = True
    assert old_line_raised == (recipe.version_tuple(torch.__version__) < (2, 5))  # 2.4.1: raises


def run_recipe(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """``python take_home_recipe.py --device cpu ARGV`` in ``tmp_path``, run in this process (torch is imported
    once: a second interpreter per call cost seconds): its exit status, standard output and standard error,
    where a ``SystemExit`` with a message and each warning are written as the interpreter would write them."""
    recipe = load_recipe()
    out = io.StringIO()
    err = io.StringIO()
    returncode = 0
    folder = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
                warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                recipe.main(["--device", "cpu", *argv])
            except SystemExit as exit_:
                returncode = exit_.code if isinstance(exit_.code, int) else 1
                if isinstance(exit_.code, str):
                    err.write(exit_.code + "\n")
    finally:
        os.chdir(folder)
    for warning in caught:
        err.write(f"{warning.category.__name__}: {warning.message}\n")
    return subprocess.CompletedProcess(argv, returncode, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("description, message", [
    ({"device": "mps"}, "a 'mps' description needs macos (see --help)"),
    ({"device": "cuda", "name": "Tesla T4"}, "a 'cuda' description needs capability (see --help)"),
    ({"device": "cuda", "name": "Tesla T4", "capability": [7]},
     "capability is two numbers, major and minor: [7, 5] for sm_75"),
], ids=["mps-without-macos", "T4-without-capability", "capability-one-number"])
def test_an_incomplete_description_gets_a_one_line_error(tmp_path, description, message):
    done = run_recipe(tmp_path, "--device-description", json.dumps(description))
    assert done.returncode == 1 and done.stderr.splitlines() == [f"take_home_recipe.py: error: {message}"]


def test_help_lists_the_description_keys_and_the_switches(tmp_path):
    done = run_recipe(tmp_path, "--help")
    assert done.returncode == 0
    for words in ("--device {cpu,cuda,mps}", "AMP_COURSE_DEVICE", "--checkpoint", "--allow-precision-change",
                  "cpu   torch, arch, system, flags", "cuda  torch, name, capability", "mps   torch, macos",
                  '"gfx"'):
        assert words in done.stdout, words


def test_the_cpu_switch_is_honoured_by_the_recipe(tmp_path, monkeypatch):
    recipe = load_recipe()
    monkeypatch.setenv("AMP_COURSE_DEVICE", "cpu")
    assert recipe.pick_device() == torch.device("cpu") == recipe.pick_device("cpu")
    monkeypatch.setenv("AMP_COURSE_DEVICE", "mps")
    if not torch.backends.mps.is_available():
        with pytest.raises(ValueError, match="no 'mps' device here"):
            recipe.pick_device()


def test_a_checkpoint_saved_under_bf16_is_refused_under_fp16_unless_overridden(tmp_path):
    """Saved under a bf16 description (scaler off), resumed under a T4's (fp16 + GradScaler): refused with one
    line; with --allow-precision-change it warns, loads the stored (disabled) scaler's state, then scales fp16
    with a fresh GradScaler, and the checkpoint records the new choice."""
    checkpoint = ["--checkpoint", "run.pt"]
    saved = run_recipe(tmp_path, "--device-description", json.dumps(CPU_BF16), *checkpoint)
    assert saved.returncode == 0 and (tmp_path / "run.pt").exists(), saved.stderr
    stored = torch.load(tmp_path / "run.pt", weights_only=True)["precision"]
    assert stored == {"how": "autocast", "dtype": "torch.bfloat16"}
    refused = run_recipe(tmp_path, "--device-description", json.dumps(T4), *checkpoint)
    assert refused.returncode == 1 and refused.stderr.splitlines() == [
        "take_home_recipe.py: error: run.pt trained with autocast (torch.bfloat16), this device's rule says "
        "autocast + GradScaler (torch.float16): resume where the rule agrees, or pass --allow-precision-change"]
    assert "Trained" not in refused.stdout
    allowed = run_recipe(tmp_path, "--device-description", json.dumps(T4), *checkpoint, "--allow-precision-change")
    assert allowed.returncode == 0 and "UserWarning: run.pt trained with autocast" in allowed.stderr
    assert "Resumed from run.pt" in allowed.stdout and "GradScaler state: {'scale': 65536.0" in allowed.stdout
    assert torch.load(tmp_path / "run.pt", weights_only=True)["precision"]["how"] == "autocast + GradScaler"
    again = run_recipe(tmp_path, "--device-description", json.dumps(T4), *checkpoint)  # the rule agrees now
    assert again.returncode == 0 and again.stderr == "" and "Resumed from run.pt" in again.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (tools/gpu-validate.sh runs it)")
@pytest.mark.parametrize("description", [None, T4, A100], ids=["this-gpu", "as-T4", "as-A100"])
def test_cuda_branches_on_a_gpu(description):
    """On a real GPU: its own recipe, and the fp16 + GradScaler and bf16 branches forced (both run on sm_80+)."""
    recipe = load_recipe()
    argv = [] if description is None else ["--device-description", json.dumps(description)]
    if description is A100 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("this GPU has no native bf16")
    result = recipe.main(argv)
    assert result["logits"].device.type == "cuda" and result["logits"].dtype == torch.float32
    assert all(torch.isfinite(torch.tensor(result["losses"])))
    assert result["losses"][-1] < result["losses"][0]
    assert result["scaler"].is_enabled() == (result["advice"]["training"].how == "autocast + GradScaler")


def test_the_script_imports_nothing_of_the_course():
    tree = ast.parse(SCRIPT.read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert names <= {"argparse", "contextlib", "copy", "json", "os", "platform", "re", "subprocess", "tempfile",
                     "warnings", "pathlib", "typing", "torch"}
