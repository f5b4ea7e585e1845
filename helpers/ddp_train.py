"""One rank of notebook 05's job: ``torchrun --standalone --nproc_per_node=2 -m helpers.ddp_train``.

A seeded MLP trained on this rank's batches under DDP and autocast; every rank must end with rank
0's weights, exactly. ``--fsdp``: also DDP's buckets, 16-bit gradient averages, FSDP2's policy."""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel

from .device import autocast_dtype

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # torchrun sets these (and more) per process
EXAMPLE = "torchrun --standalone --nproc_per_node=2 -m helpers.ddp_train"
HOOKS = {"float32": None, "bfloat16": default_hooks.bf16_compress_hook,  # DDP's 16-bit averages
         "float16": default_hooks.fp16_compress_hook}


class LaunchError(RuntimeError):
    """Started in a way it cannot run; the message says what to do instead."""


@dataclass(frozen=True)
class Launch:
    """Where this process sits in the job, as torchrun describes it in the environment."""

    rank: int  # 0 .. world_size - 1 over all machines
    world_size: int
    local_rank: int  # index of this process on its machine (picks the GPU)
    local_world_size: int  # processes on this machine
    node: int = 0  # torchrun's GROUP_RANK: which machine (agent) runs this process


def launch_from_env(env: Mapping[str, str] | None = None) -> Launch:
    """Rank and world size from the variables torchrun sets; ``LaunchError`` without torchrun."""
    env = os.environ if env is None else env
    missing = [name for name in TORCHRUN_ENV if name not in env]
    if missing:
        unset = "none is set" if len(missing) == 3 else f"{', '.join(missing)} not set"
        raise LaunchError(f"not started by torchrun. This script is one process of a distributed "
                          f"job; torchrun starts one per device and gives each its "
                          f"{', '.join(TORCHRUN_ENV)} ({unset} here). Run it as: {EXAMPLE}")
    size = int(env["WORLD_SIZE"])
    return Launch(int(env["RANK"]), size, int(env["LOCAL_RANK"]),
                  int(env.get("LOCAL_WORLD_SIZE", size)), int(env.get("GROUP_RANK", 0)))


def choose_backend(requested: str, local_world_size: int, cuda_devices: int | None = None) -> str:
    """``requested`` ('gloo': CPU, 'nccl': GPUs), or for 'auto' NCCL if each process has a GPU."""
    cuda_devices = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if requested != "auto":
        return requested
    return "nccl" if 0 < local_world_size <= cuda_devices and dist.is_nccl_available() else "gloo"


def fsdp2() -> tuple:
    """``(MixedPrecisionPolicy, fully_shard)``: public in ``torch.distributed.fsdp`` since 2.6."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4 and 2.5: a private module
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return MixedPrecisionPolicy, fully_shard


def tiny_model(device: torch.device) -> nn.Sequential:
    """The same seeded MLP on every rank; dim-0 sizes are multiples of 8 (even shards, 8 ranks)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.LayerNorm(64), nn.ReLU(), nn.Linear(64, 64),
                         nn.ReLU(), nn.Linear(64, 8)).to(device)


def batches(rank: int, steps: int, device: torch.device) -> list[tuple]:
    """This rank's own batches of 32, seeded by rank, labelled by one fixed linear teacher."""
    teacher = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(100 + rank)
    inputs = [torch.randn(32, 16, generator=g) for _ in range(steps)]
    return [(x.to(device), (x @ teacher).argmax(1).to(device)) for x in inputs]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an FSDP DTensor's shard on this rank


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().reshape(-1) for t in tensors])


def _describe(t: torch.Tensor) -> str:
    return f"{type(t).__name__} {_name(t.dtype)} {list(_local(t).shape)}"


def train(model: nn.Module, data: list, amp: torch.dtype | None, record: dict):
    """AdamW on ``data``, under autocast(``amp``) if given (float16: a GradScaler); losses; step 1:
    the logits' dtype, each saved tensor's dtype, shape, storage bytes after forward, address."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # FSDP: after fully_shard
    device = data[0][0].device
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
    record["losses"] = []
    for x, y in data:
        saved: list[torch.Tensor] = []

        def pack(t: torch.Tensor) -> torch.Tensor:  # autograd saves t for backward: note it, keep it
            saved.append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.amp.autocast(device.type, dtype=amp or torch.float32, enabled=bool(amp)):
                logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
        if not record["losses"]:
            record.update(logits=_name(logits.dtype), saved=[
                (_name(t.dtype), list(t.shape), t.untyped_storage().nbytes(),
                 t.untyped_storage().data_ptr()) for t in saved])
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()  # DDP all-reduces the gradients here, FSDP reduce-scatters them
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        record["losses"].append(loss.item())
    moments = [_local(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")]
    record.update(grad_scaler=scaler is not None, bytes={
        "parameters": sum(_local(p).nbytes for p in model.parameters()),
        "gradients": sum(_local(p.grad).nbytes for p in model.parameters()),
        "optimizer": sum(m.nbytes for m in moments)})
    return optimizer


def run_ddp(data: list, amp: torch.dtype, world_size: int, bucket_view: bool = False) -> dict:
    """DDP + autocast; whether every rank ends with rank 0's weights, exactly; the bytes of DDP's
    all-reduce buckets, and whether the gradients are views into them (``bucket_view``)."""
    model = tiny_model(data[0][0].device)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=bucket_view)  # rank 0's weights
    record = {"amp_dtype": _name(amp), "parameters": _name(next(model.parameters()).dtype)}
    buckets: dict = {}  # the latest flat buffer of each bucket: (address, bytes)

    def allreduce(state, bucket):  # the default all-reduce, recording the bucket it reduces
        buckets[bucket.index()] = (bucket.buffer().data_ptr(), bucket.buffer().nbytes)
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, allreduce)
    train(ddp, data, amp, record)
    grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    record["bytes"]["buckets"] = sum(n for _, n in buckets.values())
    record["grads_in_buckets"] = grads <= {address for address, _ in buckets.values()}
    record["gradients"] = _name(next(model.parameters()).grad.dtype)
    mine = _flat(model.parameters())
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)
    record["identical"] = all(torch.equal(gathered[0], other) for other in gathered)
    record["max_difference"] = max((gathered[0] - other).abs().max().item() for other in gathered)
    return record


def run_fsdp(data: list, param_dtype: torch.dtype, reduce_dtype: torch.dtype) -> dict:
    """FSDP2, ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` on each Linear and on the root,
    there with ``output_dtype=torch.float32`` (float32 logits): each stage's dtype, bytes."""
    MixedPrecisionPolicy, fully_shard = fsdp2()
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    model = tiny_model(data[0][0].device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype, reduce_dtype, torch.float32))
    middle, seen = model[3], {}

    def before_forward(module: nn.Module, args: tuple) -> None:
        if "unsharded" not in seen:  # the weight FSDP all-gathered; its gradient before reduction
            seen["unsharded"] = _describe(module.weight)
            module.weight.register_hook(lambda grad: seen.update(grad_before=_name(grad.dtype)))

    middle.register_forward_pre_hook(before_forward)
    middle.register_forward_hook(lambda m, args, out: seen.update(activation=_name(out.dtype)))
    model[0].register_forward_pre_hook(lambda m, args: seen.update(input=_name(args[0].dtype)))
    record = {"sharded": f"{_describe(middle.weight)} of {list(middle.weight.shape)}"}
    optimizer = train(model, data, None, record)
    logits = model(data[0][0])  # one more forward: which parameters stay gathered until backward
    seen["after_forward"] = {"root": _describe(model[1].weight), "middle": _describe(middle.weight)}
    logits.sum().backward()
    record.update(seen, grad_after=_describe(middle.weight.grad),
                  optimizer_state=_describe(optimizer.state[middle.weight]["exp_avg"]))
    return record


def reduction_errors(x: torch.Tensor, y: torch.Tensor) -> dict:
    """One gradient averaged in each dtype of ``HOOKS``: bytes sent, error against float64."""
    base = tiny_model(x.device)
    F.cross_entropy(base(x), y).backward()  # this rank's own float32 gradient
    mine = _flat(p.grad for p in base.parameters())
    reference = mine.clone()
    dist.all_reduce(reference)
    reference /= dist.get_world_size()
    out = {"elements": mine.numel(), "noise": ((mine - reference).norm() / reference.norm()).item()}
    for name, hook in HOOKS.items():
        model = copy.deepcopy(base)
        model.zero_grad(set_to_none=True)
        ddp = DistributedDataParallel(model)
        if hook is not None:  # the hook casts to 16 bits, divides, all-reduces, casts back
            ddp.register_comm_hook(None, hook)  # e.g. default_hooks.bf16_compress_hook
        F.cross_entropy(ddp(x), y).backward()
        error = (_flat(p.grad for p in model.parameters()) - reference).norm() / reference.norm()
        size = torch.finfo(getattr(torch, name)).bits // 8
        out[name] = {"bytes": mine.numel() * size, "error": error.item()}
    return out


def train_rank(args: argparse.Namespace, launch: Launch, backend: str) -> dict:
    """Every rank's records, in an initialised process group."""
    device = torch.device("cuda", launch.local_rank) if backend == "nccl" else torch.device("cpu")
    data = batches(launch.rank, args.steps, device)
    amp = autocast_dtype(device)
    record = {"rank": launch.rank, "node": launch.node, "device": str(device), "backend": backend,
              "torch": torch.__version__, "ddp": run_ddp(data, amp, launch.world_size)}
    if args.fsdp:
        record["ddp_view"] = run_ddp(data, amp, launch.world_size, bucket_view=True)
        record["reduction"] = reduction_errors(*data[0])
        try:
            record["fsdp"] = run_fsdp(data, torch.bfloat16, torch.float32)
        except Exception as error:  # torch 2.4.1 without CUDA (2.5-2.13 not tested here)
            record["fsdp_error"] = f"{type(error).__name__}: {error}".splitlines()[0]
    records: list = [None] * launch.world_size
    dist.all_gather_object(records, record)
    return {"world_size": launch.world_size, "ranks": records}


def write_records(path: str) -> None:
    """Every rank's records (``--fsdp``), from inside a job that is already running: notebook 05's
    ``ddp_fsdp_job.py --records=PATH`` calls this on each rank; rank 0 writes them to ``path``."""
    launch = launch_from_env()
    report = train_rank(parse_args(["--fsdp"]), launch, dist.get_backend())
    if launch.rank == 0:
        Path(path).write_text(json.dumps(report, indent=1))


def summary_lines(report: dict) -> list[str]:
    """Human-readable lines for a report of :func:`train_rank`."""
    lines = [f"rank {r['rank']} (node {r['node']}, {r['device']}, {r['backend']}): DDP + autocast "
             f"{r['ddp']['amp_dtype']}, loss {r['ddp']['losses'][0]:.3f} -> "
             f"{r['ddp']['losses'][-1]:.3f}" for r in report["ranks"]]
    return lines + [f"parameters identical on every rank: {report['ranks'][0]['ddp']['identical']}"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (``--help`` lists them)."""
    parser = argparse.ArgumentParser(prog="helpers.ddp_train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps")
    parser.add_argument("--fsdp", action="store_true", help="also FSDP2 and reduction dtypes")
    parser.add_argument("--out", help="rank 0 writes every rank's records to this JSON file")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """One torchrun process; returns the exit status (messages go to stderr)."""
    args = parse_args(argv)
    try:
        launch = launch_from_env()
        backend = choose_backend(args.backend, launch.local_world_size)
    except LaunchError as error:
        print(f"helpers.ddp_train: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(launch.local_rank)
    dist.init_process_group(backend)
    try:
        report = train_rank(args, launch, backend)
        if launch.rank == 0:
            print("\n".join(summary_lines(report)), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(report, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: gloo's threads, still freeing tensors then, abort it (pytorch#179291)
    os._exit(status)
