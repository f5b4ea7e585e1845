"""Notebook 05's job, whole: DDP with autocast, then FSDP2 with a mixed-precision policy, on every rank.

    torchrun --standalone --nproc_per_node=2 ddp_fsdp_job.py

torchrun starts one process per rank. Each trains the same seeded MLP on batches of its own; rank 0 prints
what every rank saw. CPU: gloo; one GPU per process: NCCL. FSDP2 needs torch 2.6 on a CPU (2.4 and 2.5 assumed
a GPU): on those the job runs its DDP half and says why FSDP2 did not run."""
import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel


def model_and_data(rank, device, steps=8):
    """The same seeded MLP on every rank; this rank's own batches, labelled by one fixed teacher."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8)).to(device)
    teacher = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(100 + rank)
    inputs = [torch.randn(32, 16, generator=generator) for _ in range(steps)]
    return model, [(x.to(device), (x @ teacher).argmax(1).to(device)) for x in inputs]


def train(model, data, device, amp_dtype=None):
    """The recipe (notebooks 03, 04): autocast if ``amp_dtype`` is given, a GradScaler for float16."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    losses = []
    for x, y in data:
        with torch.amp.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()  # DDP averages the gradients of all ranks during backward
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def run_ddp(rank, device, amp_dtype):
    model, data = model_and_data(rank, device)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's weights; hooks the all-reduce
    result = train(ddp, data, device, amp_dtype)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    rank_0 = weights.clone()
    dist.broadcast(rank_0, src=0)
    return f"{result}, weights equal to rank 0's: {torch.equal(weights, rank_0)}"


def run_fsdp(rank, device):
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # torch 2.6 and later
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # 2.4, 2.5
    model, data = model_and_data(rank, device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mp_policy=policy)  # one unit per Linear: gathered in bfloat16 when used
    fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                      reduce_dtype=torch.float32, output_dtype=torch.float32))
    return train(model, data, device)  # the policy sets the dtypes, not autocast


def main(records=None):
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])  # set by torchrun
    gpu = torch.cuda.is_available() and local_rank < torch.cuda.device_count()
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpu else "gloo")
    amp_dtype = torch.float16 if gpu and torch.cuda.get_device_capability(device)[0] < 8 else torch.bfloat16
    lines = [f"rank {rank} ({device}), DDP + autocast {str(amp_dtype)[6:]}: {run_ddp(rank, device, amp_dtype)}"]
    try:
        lines.append(f"rank {rank} ({device}), FSDP2 + policy bfloat16: {run_fsdp(rank, device)}")
    except Exception as error:  # torch 2.4 and 2.5 without a GPU
        why = f"{type(error).__name__}: {error}".splitlines()[0]
        lines.append(f"rank {rank} ({device}): FSDP2 did not run with torch {torch.__version__} ({why})")
    if records:  # notebook 05 measures more in the same processes: instrumented runs, apart
        from helpers import ddp_train
        ddp_train.write_records(records)
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, lines)
    if rank == 0:
        print("\n".join(line for lines in every_rank for line in lines), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", help="notebook 05: also write helpers.ddp_train's records (JSON) here")
    main(parser.parse_args().records)
    os._exit(0)  # skip interpreter teardown: gloo's threads can abort it (pytorch#179291)
