"""Which dtype each op runs in under autocast, on CPU and on CUDA (a GPU, or simulated on fake tensors by
:mod:`helpers.cuda_simulation`); notebook 03 §3 and A.3, used in 01 and 08. :func:`autocast_rule_devices` reads
the dispatcher's private table and gives ``None`` where it lacks."""

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn import functional as F

# The CUDA simulation is helpers.cuda_simulation; its names stay importable from here (notebooks call them so)
from .cuda_simulation import SimulationUnavailable as SimulationUnavailable
from .cuda_simulation import cuda_autocast, cuda_rules_available
from .cuda_simulation import cuda_simulation_available as cuda_simulation_available
from .cuda_simulation import simulated_cuda_autocast as simulated_cuda_autocast
from .dtype_trace import OpRecord

# Each op gets `a`, a float32 (8, 8) tensor, and `low`, a matmul's output under the same autocast
# (so in that device's low dtype, as an activation would be). Keys: op name (what it is given).
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "matmul (float32 inputs)": lambda a, low: a @ a.T,
    "conv2d (float32 inputs)": lambda a, low: F.conv2d(a[None, None], a[None, None, :3, :3]),
    "relu (low)": lambda a, low: torch.relu(low),
    "batch_norm (low, float32 weights)": lambda a, low: F.batch_norm(low, None, None, a[0], a[1],
                                                                     training=True),
    "softmax (low)": lambda a, low: torch.softmax(low, dim=1),
    "log_softmax (low)": lambda a, low: torch.log_softmax(low, dim=1),
    "layer_norm (low)": lambda a, low: F.layer_norm(low, (8,)),
    "exp (low)": lambda a, low: low.exp(),
    "sum (low)": lambda a, low: low.sum(),
    "cumsum (low)": lambda a, low: low.cumsum(0),
    "mean (low)": lambda a, low: low.mean(),
    "var (low)": lambda a, low: low.var(),
    "cross_entropy (low)": lambda a, low: F.cross_entropy(low, torch.zeros(8, dtype=torch.long)),
    "mse_loss (low, float32)": lambda a, low: F.mse_loss(low, a),
    "binary_cross_entropy_with_logits (low, float32)": lambda a, low:
        F.binary_cross_entropy_with_logits(low, a.sigmoid()),
    "binary_cross_entropy (low, float32)": lambda a, low:
        F.binary_cross_entropy(low.sigmoid(), a.sigmoid()),
    "add (low + float32)": lambda a, low: low + a,
    "cat (low, float32)": lambda a, low: torch.cat([low, a]),
    "dot (low, float32)": lambda a, low: torch.dot(low[0], a[0]),
    "scatter_add (float32 into, low src)": lambda a, low: a.scatter_add(
        0, torch.zeros(8, 8, dtype=torch.long), low),
}


def _outcome(op: Callable, low_dtype: torch.dtype | None = None) -> str:
    """The dtype ``op`` returns, or its error type (``low_dtype``: ``low`` cast to it)."""
    a = torch.randn(8, 8)
    low = a @ torch.eye(8) if low_dtype is None else (a @ torch.eye(8)).to(low_dtype)
    try:
        return str(op(a, low).dtype).removeprefix("torch.")
    except RuntimeError as error:
        return type(error).__name__


@dataclass
class OpTable:
    """Each op of :data:`OPS` under CPU and CUDA autocast: the dtype it returned, or its error."""

    cpu: dict[str, str]          # short op name ("sum") -> outcome under CPU autocast
    cpu_plain: dict[str, str]    # the same op on the same dtypes without autocast
    cuda: dict[str, str] | None  # the outcome under CUDA autocast; None where unavailable here
    cpu_dtype: torch.dtype
    cuda_dtype: torch.dtype
    cuda_source: str             # "this GPU", "simulated", or why not available
    inputs: dict[str, str]       # short op name -> what it was given

    def kind(self, op: str, device: str) -> str | None:
        """``"low"`` (the column's autocast dtype), "float32" or an error type; None: no CUDA."""
        cpu = device == "cpu"
        column, low = (self.cpu, self.cpu_dtype) if cpu else (self.cuda, self.cuda_dtype)
        if column is None:
            return None
        return "low" if column[op] == str(low).removeprefix("torch.") else column[op]

    def cpu_rule_applied(self, op: str) -> bool:
        """True where CPU autocast changed the outcome (the op without autocast gives another)."""
        return self.cpu[op] != self.cpu_plain[op]

    def differs(self) -> list[str]:
        """The ops whose rule differs between CPU and CUDA (empty without CUDA rules)."""
        kinds = [(op, self.kind(op, "cpu"), self.kind(op, "cuda")) for op in self.cpu]
        return [op for op, cpu, cuda in kinds if cuda is not None and cpu != cuda]

    def __repr__(self) -> str:
        cpu_head = f"CPU {str(self.cpu_dtype).removeprefix('torch.')}"
        cuda_head = f"CUDA {str(self.cuda_dtype).removeprefix('torch.')}"
        cuda_head += f" ({self.cuda_source})" if self.cuda is not None else ""
        lines = [f"{'op (given)':<48} {cpu_head:<29} {cuda_head}"]
        for op, outcome in self.cpu.items():
            how = "rule" if self.cpu_rule_applied(op) else "follows inputs"
            given = f" ({self.inputs[op]})" if self.inputs[op] else ""
            cuda = "-" if self.cuda is None else self.cuda[op]
            lines.append(f"{op + given:<48} {f'{outcome} ({how})':<29} {cuda}")
        lines.append("CPU (rule): autocast changed the outcome; (follows inputs): the same as "
                     "without autocast")
        if self.cuda is None:
            lines.append(f"CUDA column {self.cuda_source}")
        return "\n".join(lines)


def op_dtype_table(cpu_dtype: torch.dtype = torch.bfloat16,
                   cuda_dtype: torch.dtype = torch.float16) -> OpTable:
    """Every op of :data:`OPS` under CPU autocast, without it, and under CUDA autocast. 03 §3."""
    short = {name: name.split(" ")[0] for name in OPS}
    inputs = {short[name]: name[len(short[name]):].strip(" ()") for name in OPS}
    cpu, plain = {}, {}
    for name, op in OPS.items():
        with torch.amp.autocast("cpu", dtype=cpu_dtype):
            cpu[short[name]] = _outcome(op)
        plain[short[name]] = _outcome(op, cpu_dtype)
    available, why_not = cuda_rules_available()
    cuda = {} if available else None
    for name, op in OPS.items() if available else ():
        with cuda_autocast(cuda_dtype):
            cuda[short[name]] = _outcome(op)
    source = "this GPU" if torch.cuda.is_available() else "simulated"
    return OpTable(cpu, plain, cuda, cpu_dtype, cuda_dtype,
                   source if available else f"unavailable: {why_not}", inputs)


def cuda_autocast_error(fn: Callable[[], object], dtype: torch.dtype = torch.float16) -> str:
    """The RuntimeError message of ``fn()`` under CUDA autocast ("" if none), or why not. 03 §6."""
    available, why_not = cuda_rules_available()
    if not available:
        return f"(CUDA autocast cannot be applied here: {why_not})"
    try:
        with cuda_autocast(dtype):
            fn()
    except RuntimeError as error:
        return str(error)
    return ""


BOOKKEEPING_OPS = ("detach", "empty", "add_", "device")  # autograd, BatchNorm's counter: no math


def op_dtypes(records: list[OpRecord]) -> dict[str, str]:
    """Each op of a :func:`record_ops` trace with its output dtypes ("bfloat16 x4"); 03 §3."""
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        if record.name in BOOKKEEPING_OPS:
            continue
        per_dtype = counts.setdefault(record.name, {})
        for dtype in record.output_dtypes:
            name = str(dtype).removeprefix("torch.")
            per_dtype[name] = per_dtype.get(name, 0) + 1
    return {op: ", ".join(f"{dtype} x{n}" for dtype, n in per_dtype.items())
            for op, per_dtype in counts.items()}


def autocast_rule_devices(op: str) -> list[str] | None:
    """Devices ("CPU", "CUDA") with an autocast kernel for ATen ``op``; None: private API failed."""
    try:
        dump = torch._C._dispatch_dump(f"aten::{op}")
    except Exception:  # private API: absent, renamed, or changed
        return None
    if not isinstance(dump, str):
        return None
    if not dump.strip():
        raise ValueError(f"the dispatcher knows no op aten::{op}")
    return [key for key in ("CPU", "CUDA") if re.search(rf"^Autocast{key}:", dump, re.M)]
