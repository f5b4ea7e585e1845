"""Notebook 10's scaffolding: 08's GPT and its data, captured tensors, layer swapping, tables,
plots. The techniques themselves (quantisation, MX scales, the fp8 linear layer, the training loop)
are written in the notebook's cells; this module holds only what carries them."""

from collections.abc import Callable

import torch
from torch import nn

from . import peaks
from .nb08 import CHECKPOINT, GPT, batch, corpus_text, encode, load_gpt, mean_loss, next_token_loss, token_splits  # noqa: F401


def capitals_splits() -> tuple[torch.Tensor, torch.Tensor]:
    """Notebook 08 section 6's task: the corpus's sentences in capitals, tuning and held-out ids."""
    capitals = encode(corpus_text(2000, seed=1).upper())
    return capitals[:60_000], capitals[60_000:]


def capture(model: GPT, layer: nn.Linear, inputs: torch.Tensor,
            targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """One forward and backward of the next-byte loss: ``layer``'s input (the activation), weight
    and the gradient reaching its output, each flattened to a matrix (tokens x features)."""
    seen = {}

    def keep_input(module, args):
        seen["activation"] = args[0].detach().flatten(0, -2).clone()

    def keep_output(module, args, output):
        def keep_gradient(grad):
            seen["gradient"] = grad.detach().flatten(0, -2).clone()
        output.register_hook(keep_gradient)

    handles = [layer.register_forward_pre_hook(keep_input),
               layer.register_forward_hook(keep_output)]
    try:
        next_token_loss(model, inputs, targets).backward()
    finally:
        for handle in handles:
            handle.remove()
    model.zero_grad(set_to_none=True)
    seen["weight"] = layer.weight.detach().clone()
    return {name: seen[name] for name in ("weight", "activation", "gradient")}


def divisible_by_16(module: nn.Linear, name: str) -> bool:
    """cuBLAS's fp8 rule for a weight (``torch._scaled_mm``'s ``mat2``): both dimensions are
    multiples of 16. The default filter of :func:`convert_linears`."""
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def tied_parameters(model: nn.Module) -> set[int]:
    """The ids of the parameters more than one module holds (an output head tied to its embedding)."""
    holders = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            holders[id(parameter)] = holders.get(id(parameter), 0) + 1
    return {key for key, count in holders.items() if count > 1}


def convert_linears(model: nn.Module, make: Callable[[nn.Linear], nn.Module],
                    module_filter_fn: Callable[[nn.Module, str], bool] = divisible_by_16
                    ) -> list[str]:
    """Replace each ``nn.Linear`` that passes ``module_filter_fn(module, name)`` (by default: both
    weight dimensions multiples of 16) by ``make(linear)``, the shape of torchao's
    ``convert_to_float8_training``. A Linear whose weight another module holds too (a tied output
    head) is never replaced. Returns the names replaced."""
    tied = tied_parameters(model)
    replaced = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or id(module.weight) in tied:
            continue
        if module_filter_fn(module, name):
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, make(module))
            replaced.append(name)
    return replaced


def final_hidden(model: GPT, ids: torch.Tensor) -> torch.Tensor:
    """The normalised hidden states the tied head multiplies (the forward without the head)."""
    positions = torch.arange(ids.shape[1], device=ids.device)
    x = model.tokens(ids) + model.positions(positions)
    for block in model.blocks:
        x, _ = block(x)
    return model.norm(x)


def error_table(errors: dict[str, dict[str, float]], digits: int = 4) -> str:
    """Rows (tensor) by columns (scaling scheme) of relative errors, as aligned text."""
    columns = list(next(iter(errors.values())))
    first = max(len(name) for name in errors) + 2
    width = max(max(len(c) for c in columns), digits + 6) + 2
    lines = [" " * first + "".join(f"{c:>{width}}" for c in columns)]
    for name, row in errors.items():
        lines.append(f"{name:<{first}}" + "".join(f"{row[c]:>{width}.{digits}f}" for c in columns))
    return "\n".join(lines)


def rates_table(path=peaks.PEAKS_FILE) -> str:
    """Datasheet dense tensor-core rates (TFLOP/s): bf16, fp8, block-scaled formats, per GPU."""
    rows = [f"{'GPU':<18}{'sm':>6}{'bf16':>9}{'fp8':>9}{'MXFP8':>9}{'MXFP4/NVFP4':>13}"]
    for gpu in peaks.load_peaks(path).values():
        block = gpu.block_scaled_tflops

        def cell(value, width):
            return f"{'-' if value is None else f'{value:,.0f}':>{width}}"
        rows.append(f"{gpu.name:<18}{gpu.capability:>6}" + cell(gpu.tflops["bf16"], 9)
                    + cell(gpu.tflops["fp8"], 9) + cell(block.get("mxfp8"), 9)
                    + cell(block.get("mxfp4"), 13))
    return "\n".join(rows)


def plot_losses(curves: dict[str, list[float]], ax=None):
    """The training loss of each recipe against the step, one line each."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(7, 3.5), dpi=80)[1]
    for name, losses in curves.items():
        ax.plot(range(1, len(losses) + 1), losses, label=name, linewidth=1.2)
    ax.set(xlabel="step", ylabel="training loss (nats per byte)",
           title="Fine-tuning 08's GPT on capitals: the same seeds and data per recipe")
    ax.legend(fontsize=8)
    return ax
