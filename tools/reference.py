"""Train the course's reference models in float32 and save their checkpoints.

``python -m tools.reference``: the CNN of notebooks 01-07 (``data/reference_cnn.pt``).
``python -m tools.reference --gpt``: notebook 08's small GPT (``data/reference_gpt.pt``).
Each also writes a JSON file beside its checkpoint with what the run measured.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from helpers import nb08
from helpers.data import make_loader, shapes_dataset
from helpers.model import CHECKPOINT, ShapesCNN
from helpers.training import evaluate, train

SEED = 0
EPOCHS = 8
MAX_LEARNING_RATE = 1e-2
GPT_STEPS, GPT_BATCH, GPT_LEARNING_RATE = 1500, 32, 3e-3


def train_reference(epochs: int = EPOCHS, seed: int = SEED) -> tuple[ShapesCNN, dict]:
    """Train :class:`ShapesCNN` in fp32 on CPU from ``seed``; return it with a summary dict."""
    torch.manual_seed(seed)
    model = ShapesCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=MAX_LEARNING_RATE, weight_decay=1e-4)
    loader = make_loader(shapes_dataset("train"), batch_size=128, seed=seed)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, MAX_LEARNING_RATE, total_steps=epochs * len(loader))
    log = train(model, loader, optimizer, epochs=epochs, scheduler=scheduler)
    accuracy = evaluate(model, shapes_dataset("test")).accuracy
    summary = {"test_accuracy": accuracy, "train_seconds": round(log.seconds, 1), "epochs": epochs,
               "seed": seed, "final_loss": log.losses[-1], "torch": torch.__version__,
               "threads": torch.get_num_threads()}
    return model, summary


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (else what ``platform`` reports)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def train_gpt(steps: int = GPT_STEPS, seed: int = SEED, batch_size: int = GPT_BATCH,
              validation_batches: int = 20) -> tuple[nb08.GPT, dict]:
    """Train :class:`helpers.nb08.GPT` in float32 on CPU from ``seed`` (AdamW, one-cycle schedule) on the
    generated corpus; return it with a summary dict (losses, time, machine)."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    train_ids, val_ids = nb08.token_splits()
    model = nb08.GPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=GPT_LEARNING_RATE, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, GPT_LEARNING_RATE, total_steps=steps)
    start = time.perf_counter()
    for _ in range(steps):
        loss = nb08.next_token_loss(model, *nb08.batch(train_ids, batch_size, model.context, generator))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    seconds = time.perf_counter() - start
    model.eval()
    summary = {"command": nb08.REGENERATE, "final_train_loss": round(loss.item(), 4),
               "validation_loss": round(nb08.mean_loss(model, val_ids, validation_batches), 4),
               "train_seconds": round(seconds, 1), "steps": steps, "batch": batch_size,
               "context": model.context, "seed": seed, "parameters": sum(p.numel() for p in model.parameters()),
               "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu": cpu_name(),
               "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return model, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpt", action="store_true", help="train notebook 08's GPT instead of the CNN")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="CNN epochs")
    parser.add_argument("--steps", type=int, default=GPT_STEPS, help="GPT steps")
    parser.add_argument("--out", help="checkpoint path (default: the shipped one in data/)")
    args = parser.parse_args()
    model, summary = train_gpt(args.steps) if args.gpt else train_reference(args.epochs)
    out = args.out or str(nb08.CHECKPOINT if args.gpt else CHECKPOINT)
    torch.save(model.state_dict(), out)
    with open(out.removesuffix(".pt") + ".json", "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
