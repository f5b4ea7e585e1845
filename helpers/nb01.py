"""Notebook 01's scaffolding: dtype tables, run comparisons, the logit-error and peak plots."""

import torch
from torch import nn

from .peaks import GpuPeak
from .training import EvalResult


def dtype_changes(before: nn.Module, after: nn.Module) -> dict[str, str]:
    """``{kind: "count x dtype -> dtype"}`` per parameter/buffer kind: what ``.half()`` changed."""
    def kinds(module: nn.Module) -> dict[str, list[str]]:
        table: dict[str, list[str]] = {}
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            kind = "parameter" if isinstance(t, nn.Parameter) else "buffer " + name.split(".")[-1]
            table.setdefault(kind, []).append(str(t.dtype).removeprefix("torch."))
        return table

    old, new = kinds(before), kinds(after)
    return {k: f"{len(d)} x {', '.join(sorted(set(d)))} -> {', '.join(sorted(set(new[k])))}"
            for k, d in old.items()}


def subset(dataset: torch.utils.data.TensorDataset, n: int) -> torch.utils.data.TensorDataset:
    """The first ``n`` examples of a ``TensorDataset`` (all of it if it is shorter)."""
    return torch.utils.data.TensorDataset(*(t[:n] for t in dataset.tensors))


def compare_runs(runs: dict[str, EvalResult], reference: EvalResult,
                 labels: torch.Tensor) -> dict[str, dict[str, float]]:
    """Each run against ``reference`` on the images both saw: accuracy, drop, agreement, ..."""
    rows = {}
    for name, run in runs.items():
        n = len(run.predictions)
        reference_accuracy = (reference.predictions[:n] == labels[:n]).float().mean().item()
        agreement = (run.predictions == reference.predictions[:n]).float().mean().item()
        rows[name] = {"images": n, "accuracy": run.accuracy, "agreement": agreement,
                      "drop": reference_accuracy - run.accuracy,
                      "max_logit_diff": (run.logits - reference.logits[:n]).abs().max().item()}
    return rows


def format_comparison(rows: dict[str, dict[str, float]]) -> str:
    """A fixed-width text table of :func:`compare_runs`' rows."""
    lines = [f"{'run':<24}{'images':>7}{'accuracy':>10}{'drop':>8}{'agreement':>11}"
             f"{'max |logit diff|':>18}"]
    for name, r in rows.items():
        lines.append(f"{name:<24}{r['images']:>7}{r['accuracy']:>10.2%}{r['drop']:>8.2%}"
                     f"{r['agreement']:>11.2%}{r['max_logit_diff']:>18.4f}")
    return "\n".join(lines)


def plot_logit_errors(runs: dict[str, EvalResult], reference: EvalResult, ax=None):
    """Histogram (log x axis) of |logit - float32 logit| for every run but the reference."""
    import matplotlib.pyplot as plt
    ax = ax or plt.subplots(figsize=(6, 3.5), dpi=80)[1]
    bins = torch.logspace(-6, 0, 40)
    for name, run in runs.items():
        if run is not reference:
            diff = (run.logits - reference.logits[: len(run.logits)]).abs().clamp(min=1e-6)
            ax.hist(diff.flatten().numpy(), bins=bins.numpy(), histtype="step", label=name)
    ax.set(xscale="log", xlabel="|logit - float32 logit|", ylabel="count of logits",
           title="Logit error of each low-precision run")
    ax.legend(fontsize=8)
    return ax


def plot_peak_ratios(peaks: dict[str, GpuPeak], low: str = "bf16", ax=None):
    """Bars per GPU: dense 16-bit peak (``low``, else fp16) over its fp32 and TF32 peaks."""
    import matplotlib.pyplot as plt
    fmts = {name: low if gpu.tflops.get(low) else "fp16" for name, gpu in peaks.items()}
    ratios = {name: [gpu.tflops[fmts[name]] / (gpu.tflops[base] or float("inf"))
                     for base in ("fp32", "tf32")] for name, gpu in peaks.items()}
    ax = ax or plt.subplots(figsize=(8, 3.5), dpi=80)[1]
    x = torch.arange(len(ratios)).numpy()
    for shift, (i, label) in zip((-0.2, 0.2), enumerate(("fp32", "TF32"))):
        ax.bar(x + shift, [r[i] for r in ratios.values()], width=0.4,
               label=f"16-bit peak / {label} peak")
    ax.set_xticks(x, [f"{n}\n({fmts[n]})" for n in ratios], fontsize=7)
    ax.set(ylabel="ratio of datasheet peaks",
           title="Dense tensor-core 16-bit peak vs fp32 and TF32 (datasheets, data/gpu_peaks.json)")
    ax.legend(fontsize=8)
    return ax


def rule_expects(advice, dtype: torch.dtype, autocast: bool = False) -> str | None:
    """What the rule's ``advice`` expects of a candidate computing in ``dtype``, timed against float32, in the
    words of :func:`helpers.timing.against_rule`: "faster" for the dtype it picks, "no gain" for another one.
    None where it predicts nothing: it says measure, or the candidate is autocast, which it ranks only against
    16-bit weights (section 6), not against float32."""
    if advice.dtype is None or autocast:
        return None
    if advice.dtype == dtype:
        return "faster"
    return "no gain"
