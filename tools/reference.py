"""Train the reference model in fp32 and save its checkpoint: ``python -m tools.reference``."""
from __future__ import annotations

import argparse
import json

import torch

from helpers.data import make_loader, shapes_dataset
from helpers.model import CHECKPOINT, ShapesCNN
from helpers.train import evaluate, train

SEED = 0
EPOCHS = 8
MAX_LEARNING_RATE = 1e-2


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--out", default=str(CHECKPOINT))
    args = parser.parse_args()
    model, summary = train_reference(args.epochs)
    torch.save(model.state_dict(), args.out)
    with open(str(args.out).removesuffix(".pt") + ".json", "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
