"""helpers.ddp_train: launch checks, messages, in-process ranks, run_job; exercise 05.3.

The real two-process run (torchrun, two ranks, exact agreement of the weights) is notebook 05's section 6, which
plain `pytest` executes and asserts; here the script's own agreement check is shown to catch a rank that differs.
"""
from __future__ import annotations

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from helpers import ShapesCNN
from helpers.ddp_train import (EXAMPLE, Launch, LaunchError, choose_backend, launch_from_env, local_launch_env,
                               loopback_interface, main, parse_args, run_job, summary_lines, train_rank)
from helpers.exercises import check, solution
from helpers.solutions.nb05 import _gradients

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_launch_from_env_reads_torchrun_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert launch_from_env(env) == Launch(rank=3, world_size=4, local_rank=1, local_world_size=2)
    assert launch_from_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}).local_world_size == 2


def test_launch_without_torchrun_says_how_to_start_it():
    with pytest.raises(LaunchError, match="not started by torchrun") as caught:
        launch_from_env({})
    assert EXAMPLE in str(caught.value) and "none is set" in str(caught.value)
    with pytest.raises(LaunchError, match="WORLD_SIZE, LOCAL_RANK not set"):
        launch_from_env({"RANK": "0"})


def test_choose_backend():
    assert choose_backend("auto", 2, cuda_devices=0) == "gloo"
    assert choose_backend("auto", 2, cuda_devices=1) == "gloo"  # not a GPU per process
    assert choose_backend("gloo", 2, cuda_devices=8) == "gloo"
    assert choose_backend("nccl", 2, cuda_devices=2) == "nccl"
    if dist.is_nccl_available():
        assert choose_backend("auto", 2, cuda_devices=2) == "nccl"


def test_choose_backend_explains_unsupported_requests():
    with pytest.raises(LaunchError, match="runs on CUDA GPUs only.*--backend gloo"):
        choose_backend("nccl", 2, cuda_devices=0)
    with pytest.raises(LaunchError, match="one GPU per process: 2 processes .* 1 GPU"):
        choose_backend("nccl", 2, cuda_devices=1)
    with pytest.raises(LaunchError, match="unknown backend 'mpi'"):
        choose_backend("mpi", 2, cuda_devices=0)


def test_parse_args_rejects_bad_values(capsys):
    assert parse_args(["--steps", "5"]).steps == 5
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])
    assert "--steps must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--backend", "mpi"])
    assert "invalid choice: 'mpi'" in capsys.readouterr().err


def test_main_without_torchrun_prints_a_clear_message_and_returns_2(monkeypatch, capsys):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert "not started by torchrun" in err and EXAMPLE in err and out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA, so nccl may be valid")
def test_main_with_nccl_on_a_cpu_machine_prints_a_clear_message_and_returns_2(monkeypatch, capsys):
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert main(["--backend", "nccl"]) == 2
    out, err = capsys.readouterr()
    assert "backend 'nccl' runs on CUDA GPUs only" in err and out == ""


def test_loopback_interface_is_a_loopback_name_of_this_machine():
    name = loopback_interface()
    if sys.platform.startswith("linux"):
        assert name == "lo"
    assert name in (None, "lo", "lo0")


def test_local_launch_env_drops_job_variables_and_pins_threads_and_loopback():
    base = {"PATH": "/bin", "RANK": "3", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "OMP_NUM_THREADS": "8"}
    env = local_launch_env(base)
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "1"
    assert not {"RANK", "MASTER_ADDR", "MASTER_PORT"} & set(env)
    assert env.get("GLOO_SOCKET_IFNAME") == loopback_interface()
    assert base["RANK"] == "3"  # the caller's mapping is left alone


def test_run_job_captures_output_and_exit_status():
    done = run_job([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                   timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has ended within ``seconds`` (killed processes may take a moment to go)."""
    deadline = time.perf_counter() + seconds
    while alive(pid) and time.perf_counter() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = f"/proc/{pid}/stat"
    return not (os.path.exists(stat) and open(stat).read().rsplit(") ", 1)[-1].startswith("Z"))


@pytest.mark.skipif(os.name != "posix", reason="stops a process group: POSIX only")
def test_run_job_timeout_stops_the_command_and_its_children(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); "
              "print('grandchild started', file=sys.stderr, flush=True); time.sleep(120)")
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"within 1 s(.|\n)*1 attempt(.|\n)*grandchild started"):
        run_job([sys.executable, "-c", script], timeout=1)
    assert time.perf_counter() - started < 60
    assert gone_within(int(pid_file.read_text()), 10), "the job's child process outlived the timeout"


@pytest.fixture
def single_rank_group():
    """A one-process gloo group in this process (no torchrun, no network)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Launch(rank=0, world_size=1, local_rank=0, local_world_size=1)
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def test_one_rank_float16_uses_a_grad_scaler(single_rank_group):
    args = parse_args(["--steps", "3", "--batch-size", "8", "--train-images", "64", "--amp-dtype", "float16"])
    report = train_rank(args, single_rank_group, "gloo")
    rank = report["ranks"][0]
    assert rank["grad_scaler"] is True and rank["logits_dtype"] == "float16" and rank["steps"] == 3
    assert all(torch.isfinite(torch.tensor(rank["losses"])))
    assert report["parameters_identical"] and report["world_size"] == 1
    lines = summary_lines(report)
    assert "autocast float16 + GradScaler, 8 images per step" in lines[0] and "3 steps" in lines[1]


def test_one_rank_rejects_too_few_images(single_rank_group):
    args = parse_args(["--steps", "3", "--batch-size", "64", "--train-images", "32"])
    with pytest.raises(LaunchError, match="too few"):
        train_rank(args, single_rank_group, "gloo")


def test_weight_check_compares_every_rank_with_rank_0(single_rank_group, monkeypatch, tmp_path):
    """One real process stands in for rank 0 of two: the gathers hand it a "rank 1" whose first parameter is off
    by 1. The script's exact check must see that (and only that), and the summary must say so."""
    launch = Launch(rank=0, world_size=2, local_rank=0, local_world_size=2)
    gathered_sizes = []

    def all_gather_object(out: list, obj: dict) -> None:
        out[:] = [{**obj, "rank": rank} for rank in range(len(out))]

    def all_gather(out: list, tensor: torch.Tensor) -> None:
        for slot in out:
            slot.copy_(tensor)
        if not gathered_sizes:  # the first gather is the parameters', the second the buffers'
            out[1][0] += 1.0
        gathered_sizes.append(tensor.numel())

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    args = parse_args(["--steps", "2", "--batch-size", "8", "--train-images", "32", f"--save-weights={tmp_path}"])
    report = train_rank(args, launch, "gloo")
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert len(gathered_sizes) == 2 and report["parameter_count"] == gathered_sizes[0]
    assert report["parameters_identical"] is False
    assert report["parameters_max_difference"] == pytest.approx(1.0, rel=1e-3)
    assert report["buffers_identical"] is True and report["buffers_max_difference"] == 0.0
    assert "parameters identical on every rank: False" in summary_lines(report)[-1]

    # --save-weights: this rank's trained state_dict, loadable with weights_only
    saved = torch.load(tmp_path / "rank0.pt", weights_only=True)
    torch.manual_seed(0)
    initial = ShapesCNN().state_dict()
    assert saved.keys() == initial.keys()
    assert not torch.equal(saved["classifier.weight"], initial["classifier.weight"])  # it trained


def test_solution_05_3_batchnorm_breaks_gradient_averaging():
    assert solution("05.3") is False
    assert check("05.3", False) is True and check("05.3", True) is False
    # Without BatchNorm, the mean of two half-batch gradients is the full-batch gradient (what DDP relies on).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 8))
    inputs, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 8, (32,))
    halves = (_gradients(model, inputs[:16], labels[:16]) + _gradients(model, inputs[16:], labels[16:])) / 2
    full = _gradients(model, inputs, labels)
    # Equal up to rounding: each weight's gradient sums 32 per-image terms, in another order here (measured:
    # 1.8 float32 eps of the largest gradient, on AVX512 and AVX2 kernels). allclose's default atol=1e-8 is not
    # a float32 tolerance for entries near 0.
    tolerance = 32 * torch.finfo(torch.float32).eps * full.abs().max().item()
    torch.testing.assert_close(full, halves, rtol=0, atol=tolerance)


def test_run_job_stops_a_child_in_a_session_of_its_own_and_tries_again(tmp_path):
    """A launcher's ranks may live in sessions of their own (holding the output pipes): a timeout must still
    return promptly, kill them, and a second attempt may succeed."""
    marker, pid_file = tmp_path / "tried", tmp_path / "detached.pid"
    script = ("import pathlib, subprocess, sys, time; "
              f"m = pathlib.Path({str(marker)!r}); "
              "sys.exit(0) if m.exists() else m.write_text('1'); "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    started = time.perf_counter()
    run = run_job([sys.executable, "-c", script], timeout=1, attempts=2)
    assert run.returncode == 0 and run.attempts_used == 2
    assert time.perf_counter() - started < 30
    assert gone_within(int(pid_file.read_text()), 10), "a process in its own session outlived the timeout"
