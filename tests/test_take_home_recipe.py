"""The take-home recipe (notebooks/take_home_recipe.py): it runs where the course's ``helpers`` cannot be imported,
in each branch a CPU can take (forced through its ``--device-description`` override), gives the documented
decisions for simulated CUDA and MPS devices, runs its CUDA branches on a GPU when there is one, and carries the
course's rule as ``python -m tools.copies --write`` writes it from helpers/precision.py (tests/test_copies.py).
Its training, checkpoint and inference code is checked, with mutants, in tests/test_recipe_teeth.py."""
from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
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
MPS_26_MACOS_14 = {"device": "mps", "torch": "2.6.0", "macos": "14.5"}
MPS_25_MACOS_14 = {"device": "mps", "torch": "2.5.1", "macos": "14.5"}
MPS_26_MACOS_13 = {"device": "mps", "torch": "2.6.0", "macos": "13.6"}


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


def run_isolated(script: Path, description: dict | None = None) -> str:
    argv = [script.name]
    if description is not None:
        argv += ["--device-description", json.dumps(description)]
    result = python_without_helpers(argv, script.parent)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout


@pytest.mark.parametrize("description, training, inference", [
    (CPU_FLOAT32, "training:          float32 (torch.float32)", "Inference (float32)"),
    (CPU_BF16, "training:          autocast (torch.bfloat16)", "Inference (16-bit weights)"),
    (T4, "training:          autocast + GradScaler (torch.float16)", "Inference (autocast)"),
], ids=["float32", "bf16-autocast", "fp16-autocast-GradScaler"])
def test_each_cpu_branch_runs_without_helpers(isolated_copy, description, training, inference):
    out = run_isolated(isolated_copy, description)
    assert out.startswith("Running on cpu, with a made-up device's recipe") and training in out
    how = training.split()[1:-1]
    assert f"Trained 8 steps ({' '.join(how)}): loss" in out and f"{inference}: torch.float32 logits" in out
    losses = [float(x) for x in out.split("loss ")[1].splitlines()[0].split(" -> ")]
    assert losses[1] < 0.7 * losses[0]  # it learns: 1.37 -> 0.64 in every branch here
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
    (MPS_26_MACOS_14, ("autocast", torch.bfloat16), ("16-bit weights", torch.bfloat16)),
    (MPS_25_MACOS_14, ("float32", torch.float32), ("autocast", torch.float16)),
    (MPS_26_MACOS_13, ("float32", torch.float32), ("autocast", torch.float16)),
    ({"device": "cpu", "flags": None}, ("measure", None), ("measure", None)),  # Windows: flags unreadable
], ids=["T4", "A100", "GTX1650", "MPS-2.6-macOS14", "MPS-2.5", "MPS-macOS13", "Windows-CPU"])
def test_simulated_cuda_mps_and_windows_decisions(description, training, batched):
    got = decisions(description)
    assert got["training"] == training and got["batched inference"] == batched


def test_a_made_up_device_trains_here_with_its_recipe(capsys):
    """The A100's recipe (bf16 autocast, no scaler) and an MPS one, run in this process on the CPU."""
    recipe = load_recipe()
    for description in (A100, MPS_26_MACOS_14):
        result = recipe.main(["--device-description", json.dumps(description)])
        assert result["advice"]["training"].how == "autocast" and not result["scaler"].is_enabled()
        assert result["logits"].dtype == torch.float32 and not result["model"].training
    assert capsys.readouterr().out.count("training:          autocast (torch.bfloat16)") == 2


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
    assert names <= {"argparse", "copy", "json", "os", "platform", "re", "subprocess", "tempfile", "pathlib", "typing",
                     "torch"}
