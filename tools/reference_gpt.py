"""Train notebook 08's small GPT in float32 and save its checkpoint: ``python -m tools.reference_gpt``.

Writes ``data/reference_gpt.pt`` (the state dict, float32, loaded with ``weights_only=True``) and
``data/reference_gpt.json`` (what this run measured: losses, training time, the machine).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from helpers.nb08 import CHECKPOINT, GPT, batch, mean_loss, next_token_loss, token_splits

SEED = 0
STEPS = 1500
BATCH = 32
LEARNING_RATE = 3e-3


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (else what ``platform`` reports)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def train_reference(steps: int = STEPS, seed: int = SEED, batch_size: int = BATCH,
                    validation_batches: int = 20) -> tuple[GPT, dict]:
    """Train :class:`helpers.nb08.GPT` in float32 on CPU from ``seed``; return it with a summary dict."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    train_ids, val_ids = token_splits()
    model = GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, LEARNING_RATE, total_steps=steps)
    start = time.perf_counter()
    for _ in range(steps):
        loss = next_token_loss(model, *batch(train_ids, batch_size, model.context, generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    seconds = time.perf_counter() - start
    model.eval()
    summary = {"command": "python -m tools.reference_gpt", "final_train_loss": round(loss.item(), 4),
               "validation_loss": round(mean_loss(model, val_ids, validation_batches), 4),
               "train_seconds": round(seconds, 1), "steps": steps, "batch": batch_size, "context": model.context, "seed": seed,
               "parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "cpu": cpu_name(),
               "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return model, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--out", default=str(CHECKPOINT))
    args = parser.parse_args()
    model, summary = train_reference(args.steps)
    torch.save(model.state_dict(), args.out)
    Path(str(args.out).removesuffix(".pt") + ".json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
