"""Data-parallel training with DistributedDataParallel (DDP): one process per device, launched by torchrun.

On one machine, two processes (gloo on CPU; NCCL when there is a GPU per process), from the repository root::

    torchrun --standalone --nproc_per_node=2 -m helpers.ddp_train --steps 40

On several machines, run the same command on each one, all pointing at one rendezvous endpoint::

    torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=HOST:29400 --rdzv_id=run1 \\
        -m helpers.ddp_train --backend nccl

Every process trains the reference ``ShapesCNN`` on its own shard of the shapes data under autocast (with a
``GradScaler`` for float16). DDP averages the gradients of all processes during ``backward``, so every rank
takes the same optimizer step and ends with the same weights; rank 0 checks that, prints a summary and, with
``--out FILE``, writes every rank's results as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from .data import shapes_dataset
from .device import autocast_dtype, check_autocast_dtype
from .model import ShapesCNN

BACKENDS = ("auto", "gloo", "nccl")
AMP_DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float16": torch.float16, "none": None}
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # torchrun sets these (and more) for each process
LAUNCH_ENV = (*TORCHRUN_ENV, "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT",
              "TORCHELASTIC_RUN_ID")  # left over from an enclosing job, they would confuse a new launch
EXAMPLE = "torchrun --standalone --nproc_per_node=2 -m helpers.ddp_train"


class LaunchError(RuntimeError):
    """The script was started in a way it cannot run; the message says what to do instead."""


@dataclass(frozen=True)
class Launch:
    """Where this process sits in the job, as torchrun describes it in the environment."""

    rank: int  # 0 .. world_size - 1 over all machines
    world_size: int  # number of processes in the job
    local_rank: int  # index of this process on its machine (picks the GPU)
    local_world_size: int  # processes on this machine


def launch_from_env(env: Mapping[str, str] | None = None) -> Launch:
    """Read rank and world size from the environment torchrun sets; raise ``LaunchError`` without torchrun."""
    env = os.environ if env is None else env
    missing = [name for name in TORCHRUN_ENV if name not in env]
    if missing:
        unset = "none is set" if len(missing) == len(TORCHRUN_ENV) else f"{', '.join(missing)} not set"
        raise LaunchError(
            "not started by torchrun. This script is one process of a distributed job; torchrun starts one "
            f"per device and gives each its {', '.join(TORCHRUN_ENV)} ({unset} here). Run it as: {EXAMPLE}"
        )
    world_size = int(env["WORLD_SIZE"])
    return Launch(rank=int(env["RANK"]), world_size=world_size, local_rank=int(env["LOCAL_RANK"]),
                  local_world_size=int(env.get("LOCAL_WORLD_SIZE", world_size)))


def choose_backend(requested: str, local_world_size: int, cuda_devices: int | None = None) -> str:
    """The process-group backend to use: 'gloo' (CPU) or 'nccl' (one CUDA GPU per local process).

    ``requested`` is 'auto' (NCCL when this machine has a GPU for every local process, else gloo), 'gloo'
    or 'nccl'. Raises ``LaunchError`` naming the fix when NCCL cannot run here or the name is unknown.
    """
    cuda_devices = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if requested == "auto":
        return "nccl" if 0 < local_world_size <= cuda_devices and dist.is_nccl_available() else "gloo"
    if requested == "gloo":
        return "gloo"
    if requested == "nccl":
        if cuda_devices == 0:
            raise LaunchError(
                "backend 'nccl' runs on CUDA GPUs only, and this machine has none (torch.cuda.device_count() "
                "is 0): use --backend gloo, which runs on CPU."
            )
        if cuda_devices < local_world_size:
            raise LaunchError(
                f"backend 'nccl' needs one GPU per process: {local_world_size} processes on this machine but "
                f"{cuda_devices} GPU(s). Start fewer (--nproc_per_node={cuda_devices}) or use --backend gloo."
            )
        return "nccl"
    raise LaunchError(f"unknown backend {requested!r}: use one of {', '.join(BACKENDS)}.")


def loopback_interface() -> str | None:
    """The name of this machine's loopback network interface ('lo' on Linux, 'lo0' on macOS), or None."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):  # not available on every platform
        return None
    return next((name for name in names if name in ("lo", "lo0")), None)


def local_launch_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a single-machine launch that talks over the loopback interface only.

    Starts from ``base`` (default ``os.environ``) without the variables of an enclosing torchrun job, sets
    ``OMP_NUM_THREADS=1`` (one CPU thread per rank) and points gloo at the loopback interface
    (``GLOO_SOCKET_IFNAME``) where one is found; otherwise gloo uses the address the host name resolves to.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    interface = loopback_interface()
    if interface is not None:
        env["GLOO_SOCKET_IFNAME"] = interface
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; an empty list elsewhere), children first."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _stop(process: subprocess.Popen) -> str:
    """Kill ``process``, its session and every descendant (a launcher may start ranks in sessions of their own);
    return what it had written to stderr, without waiting for pipes that a surviving process still holds."""
    victims = _descendants(process.pid) if os.name == "posix" else []
    if os.name == "posix":
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the whole session: the launcher and its ranks
        except ProcessLookupError:
            pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    else:
        process.kill()
    try:
        return process.communicate(timeout=10)[1] or ""
    except subprocess.TimeoutExpired:
        return "(its stderr could not be read: a process it started still held the pipe)"


def run_job(command: Sequence[str], *, timeout: float, cwd: str | None = None,
            env: Mapping[str, str] | None = None, attempts: int = 1) -> subprocess.CompletedProcess:
    """Run ``command`` to the end and capture its text output; past ``timeout`` seconds, stop it and its children.

    The command runs in a session of its own, and on timeout every process it started (torchrun's ranks too) is
    killed, not only the first one. With ``attempts`` > 1 a timed-out run is started again (a launcher that hangs
    once in a while should not fail a class); the returned ``CompletedProcess`` has ``attempts_used``. After the
    last attempt ``TimeoutError`` is raised with the end of its stderr.
    """
    posix = os.name == "posix"
    for attempt in range(1, attempts + 1):
        with subprocess.Popen(list(command), cwd=cwd, env=None if env is None else dict(env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=posix) as process:
            try:
                stdout, stderr = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                stderr = _stop(process)
                if attempt < attempts:
                    continue
                raise TimeoutError(f"the job did not finish within {timeout:g} s and was stopped "
                                   f"({attempts} attempt(s)); the end of its messages:\n{stderr[-2000:]}") from None
        completed = subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
        completed.attempts_used = attempt
        return completed
    raise ValueError(f"attempts must be at least 1, not {attempts}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(prog="helpers.ddp_train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="process group backend (default: auto)")
    parser.add_argument("--amp-dtype", choices=tuple(AMP_DTYPES), default="auto",
                        help="autocast dtype; auto = the course default for the device; none = fp32")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps (each rank takes all of them)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    parser.add_argument("--train-images", type=int, default=1024, help="first N images of the training set")
    parser.add_argument("--lr", type=float, default=4e-3, help="AdamW learning rate")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="rank 0 writes every rank's results to this JSON file")
    parser.add_argument("--save-weights", metavar="DIR", help="each rank saves its state_dict as DIR/rank<N>.pt")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "train_images", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """All ``tensors`` as one flat float32 vector (to compare or gather in one call)."""
    return torch.cat([t.detach().float().reshape(-1) for t in tensors])


def train_rank(args: argparse.Namespace, launch: Launch, backend: str) -> dict:
    """Train this rank's DDP replica in an initialised process group; return its results (rank 0: all ranks')."""
    device = torch.device("cuda", launch.local_rank) if backend == "nccl" else torch.device("cpu")
    amp_dtype = AMP_DTYPES[args.amp_dtype] if args.amp_dtype != "auto" else autocast_dtype(device)
    if amp_dtype is not None:
        check_autocast_dtype(device.type, amp_dtype)
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = ShapesCNN().to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    dataset = shapes_dataset("train", n=args.train_images)
    sampler = DistributedSampler(dataset, num_replicas=launch.world_size, rank=launch.rank, shuffle=True,
                                 seed=args.seed, drop_last=True)  # each rank sees its own part of every epoch
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise LaunchError(f"--train-images {args.train_images} is too few for {launch.world_size} ranks "
                          f"of --batch-size {args.batch_size}: no full batch per rank.")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None  # fp16 only
    losses: list[float] = []
    logits_dtype = None
    start = time.perf_counter()
    ddp_model.train()
    epoch = 0
    while len(losses) < args.steps:
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        for inputs, labels in loader:
            if len(losses) == args.steps:
                break
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            # Autocast in this process's own thread: DDP has no worker threads, so nothing is lost.
            with torch.amp.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                logits = ddp_model(inputs)
                loss = F.cross_entropy(logits, labels)
            logits_dtype = str(logits.dtype).removeprefix("torch.")
            if scaler is None:
                loss.backward()  # DDP all-reduces (averages) the gradients here
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            losses.append(loss.item())
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start

    result = {"rank": launch.rank, "device": str(device), "backend": backend,
              "amp_dtype": str(amp_dtype).removeprefix("torch.") if amp_dtype else "none",
              "logits_dtype": logits_dtype, "grad_scaler": scaler is not None, "steps": len(losses),
              "images_per_step": args.batch_size * launch.world_size, "losses": losses,
              "seconds": seconds, "threads": torch.get_num_threads()}
    results: list = [None] * launch.world_size
    dist.all_gather_object(results, result)
    # Compare every rank's weights (and BatchNorm statistics) with rank 0's, exactly.
    comparison = {}
    for name, tensors in (("parameters", list(model.parameters())), ("buffers", [
            b for b in model.buffers() if b.is_floating_point()])):
        mine = _flat(tensors)
        gathered = [torch.empty_like(mine) for _ in range(launch.world_size)]
        dist.all_gather(gathered, mine)
        comparison[f"{name}_identical"] = all(torch.equal(gathered[0], other) for other in gathered)
        comparison[f"{name}_max_difference"] = max((gathered[0] - other).abs().max().item() for other in gathered)
    comparison["parameter_count"] = sum(p.numel() for p in model.parameters())
    if args.save_weights:
        os.makedirs(args.save_weights, exist_ok=True)
        state = {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}  # loads anywhere
        torch.save(state, os.path.join(args.save_weights, f"rank{launch.rank}.pt"))
    return {"world_size": launch.world_size, "ranks": results, **comparison}


def summary_lines(report: dict) -> list[str]:
    """Human-readable lines for a report of :func:`train_rank`."""
    first = report["ranks"][0]
    lines = [f"{report['world_size']} ranks, backend {first['backend']}, autocast {first['amp_dtype']}"
             f"{' + GradScaler' if first['grad_scaler'] else ''}, {first['images_per_step']} images per step"]
    for r in report["ranks"]:
        losses = r["losses"]
        k = max(1, min(5, len(losses) // 2))  # first and last windows never overlap
        lines.append(f"rank {r['rank']} ({r['device']}): {r['steps']} steps in {r['seconds']:.1f} s, loss (mean of "
                     f"{k} steps) {sum(losses[:k]) / k:.2f} -> {sum(losses[-k:]) / k:.2f}, logits {r['logits_dtype']}")
    lines.append(f"parameters identical on every rank: {report['parameters_identical']} "
                 f"(max difference {report['parameters_max_difference']:.1e})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one torchrun process; returns the exit status (messages go to stderr)."""
    args = parse_args(argv)
    try:
        launch = launch_from_env()
        backend = choose_backend(args.backend, launch.local_world_size)
    except LaunchError as error:
        print(f"helpers.ddp_train: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if backend == "nccl":
        torch.cuda.set_device(launch.local_rank)
    dist.init_process_group(backend)
    try:
        report = train_rank(args, launch, backend)
        if launch.rank == 0:
            print("\n".join(summary_lines(report)), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(report, f, indent=2)
    except LaunchError as error:
        print(f"helpers.ddp_train: {error}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without tearing the interpreter down: a DDP model keeps its gloo process group (and its worker
    # threads) alive after destroy_process_group(), and a worker still releasing the last collective's tensors
    # while Python finalizes aborts the process now and then ("terminate called without an active exception";
    # compare pytorch/pytorch#179291). Everything worth keeping is written and flushed by now.
    os._exit(status)
