"""Which dtype each op runs in under autocast, on CPU and on CUDA (real, or simulated without a GPU on fake
tensors): notebooks 01, 03 and 08.

:func:`op_dtype_table` runs a fixed set of ops (:data:`OPS`) under CPU autocast and under CUDA autocast and
returns what came out (a dtype name, or the type of the error raised). On a machine with a GPU the CUDA column is
the real thing; without one it comes from :func:`simulated_cuda_autocast` (below) where the installed
PyTorch supports it (:func:`cuda_rules_available` says whether, and why not).
"""
from __future__ import annotations

import contextlib
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from .device import _version_at_least, autocast_state
from .dtype_trace import OpRecord

# Each op gets `a`, a float32 (8, 8) tensor, and `low`, the output of a matmul under the same autocast (so it has
# that device's low dtype, as an activation would). Keys: op name, then what it is given.
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "matmul (float32 inputs)": lambda a, low: a @ a.T,
    "conv2d (float32 inputs)": lambda a, low: F.conv2d(a.view(1, 1, 8, 8), a[:3, :3].reshape(1, 1, 3, 3)),
    "relu (low)": lambda a, low: torch.relu(low),
    "batch_norm (low, float32 weights)": lambda a, low: F.batch_norm(low, None, None, torch.ones(8),
                                                                     torch.zeros(8), training=True),
    "softmax (low)": lambda a, low: torch.softmax(low, dim=1),
    "log_softmax (low)": lambda a, low: torch.log_softmax(low, dim=1),
    "layer_norm (low)": lambda a, low: F.layer_norm(low, (8,)),
    "exp (low)": lambda a, low: low.exp(),
    "sum (low)": lambda a, low: low.sum(),
    "cumsum (low)": lambda a, low: low.cumsum(0),
    "mean (low)": lambda a, low: low.mean(),
    "cross_entropy (low)": lambda a, low: F.cross_entropy(low, torch.zeros(8, dtype=torch.long)),
    "mse_loss (low, float32)": lambda a, low: F.mse_loss(low, a),
    "binary_cross_entropy_with_logits (low, float32)": lambda a, low: F.binary_cross_entropy_with_logits(low, a.sigmoid()),
    "binary_cross_entropy (low, float32)": lambda a, low: F.binary_cross_entropy(low.sigmoid(), a.sigmoid()),
    "add (low + float32)": lambda a, low: low + a,
    "cat (low, float32)": lambda a, low: torch.cat([low, a]),
    "dot (low, float32)": lambda a, low: torch.dot(low[0], a[0]),
    "scatter_add (float32 into, low src)": lambda a, low: a.scatter_add(0, torch.zeros(8, 8, dtype=torch.long),
                                                                         low),
}


def cuda_rules_available() -> tuple[bool, str]:
    """Whether this machine can apply CUDA's autocast rules: ``(True, "")`` on a GPU or where the simulation
    works with the installed PyTorch, else ``(False, why)``."""
    if torch.cuda.is_available():
        return True, ""
    return cuda_simulation_available()


@contextlib.contextmanager
def cuda_autocast(dtype: torch.dtype = torch.float16) -> Iterator[None]:
    """CUDA autocast with ``dtype`` in which new tensors are CUDA tensors: on a GPU the real thing
    (``torch.device("cuda")`` + ``torch.amp.autocast("cuda")``), else :func:`simulated_cuda_autocast` (fake
    tensors: dtypes and errors, no values). Create tensors inside the block."""
    if torch.cuda.is_available():
        with torch.device("cuda"), torch.amp.autocast("cuda", dtype=dtype):
            yield
    else:
        with simulated_cuda_autocast(dtype):
            yield


def _outcome(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    a = torch.randn(8, 8)
    low = a @ torch.eye(8)
    try:
        return str(op(a, low).dtype).removeprefix("torch.")
    except RuntimeError as error:
        return type(error).__name__


@dataclass
class OpTable:
    """The outcome of each op of :data:`OPS` under CPU and CUDA autocast: a dtype name or an error type."""

    cpu: dict[str, str]            # short op name ("sum") -> outcome under CPU autocast
    cuda: dict[str, str] | None    # the same under CUDA autocast; None where CUDA rules are unavailable here
    cpu_dtype: torch.dtype
    cuda_dtype: torch.dtype
    cuda_source: str               # "this GPU", "simulated", or why not available
    inputs: dict[str, str]         # short op name -> what it was given

    def kind(self, op: str, device: str) -> str | None:
        """``"low"`` (the autocast dtype of that column), ``"float32"`` or an error type, for ``device`` "cpu" or
        "cuda"; None where the CUDA column is unavailable."""
        column, low = (self.cpu, self.cpu_dtype) if device == "cpu" else (self.cuda, self.cuda_dtype)
        if column is None:
            return None
        return "low" if column[op] == str(low).removeprefix("torch.") else column[op]

    def differs(self) -> list[str]:
        """The ops whose rule differs between CPU and CUDA autocast (low dtype vs float32 vs error); empty
        without CUDA rules."""
        return [op for op in self.cpu if self.cuda is not None and self.kind(op, "cpu") != self.kind(op, "cuda")]

    def __repr__(self) -> str:
        cpu_head = f"CPU {str(self.cpu_dtype).removeprefix('torch.')}"
        cuda_head = f"CUDA {str(self.cuda_dtype).removeprefix('torch.')}"
        cuda_head += f" ({self.cuda_source})" if self.cuda is not None else ""
        lines = [f"{'op (given)':<48} {cpu_head:<14} {cuda_head}"]
        for op, outcome in self.cpu.items():
            cuda = "-" if self.cuda is None else self.cuda[op]
            given = f" ({self.inputs[op]})" if self.inputs[op] else ""
            lines.append(f"{op + given:<48} {outcome:<14} {cuda}")
        if self.cuda is None:
            lines.append(f"CUDA column {self.cuda_source}")
        return "\n".join(lines)


def op_dtype_table(cpu_dtype: torch.dtype = torch.bfloat16, cuda_dtype: torch.dtype = torch.float16) -> OpTable:
    """Run every op of :data:`OPS` under CPU autocast (``cpu_dtype``) and CUDA autocast (``cuda_dtype``, on a GPU
    or simulated; skipped where neither works) and return the dtypes that came out (:class:`OpTable`)."""
    names = {name: name.split(" ")[0] for name in OPS}
    inputs = {short: name[len(short):].strip(" ()") for name, short in names.items()}
    cpu = {}
    for name, op in OPS.items():
        with torch.amp.autocast("cpu", dtype=cpu_dtype):
            cpu[names[name]] = _outcome(op)
    available, why_not = cuda_rules_available()
    cuda = None
    if available:
        cuda = {}
        for name, op in OPS.items():
            with cuda_autocast(cuda_dtype):
                cuda[names[name]] = _outcome(op)
    source = ("this GPU" if torch.cuda.is_available() else "simulated") if available else f"unavailable: {why_not}"
    return OpTable(cpu, cuda, cpu_dtype, cuda_dtype, source, inputs)


def cuda_autocast_error(fn: Callable[[], object], dtype: torch.dtype = torch.float16) -> str:
    """The message of the RuntimeError that ``fn()`` raises under CUDA autocast ("" if it runs), or a line
    saying why CUDA rules cannot be applied here. Create tensors inside ``fn`` (they become CUDA tensors)."""
    available, why_not = cuda_rules_available()
    if not available:
        return f"(CUDA autocast cannot be applied here: {why_not})"
    try:
        with cuda_autocast(dtype):
            fn()
    except RuntimeError as error:
        return str(error)
    return ""


BOOKKEEPING_OPS = ("detach", "empty", "add_", "device")  # autograd and BatchNorm's step counter: not arithmetic


def op_dtypes(records: list[OpRecord]) -> dict[str, str]:
    """Each op of a trace (from :func:`helpers.dtype_trace.record_ops`) with the dtypes it produced, in order of
    first appearance: ``{"convolution": "bfloat16 x4", "native_batch_norm": "bfloat16 x4, float32 x8", ...}``.
    Bookkeeping ops (:data:`BOOKKEEPING_OPS`) are left out; an op with several outputs counts each output."""
    counts: dict[str, dict[str, int]] = {}
    for record in records:
        if record.name in BOOKKEEPING_OPS:
            continue
        per_dtype = counts.setdefault(record.name, {})
        for dtype in record.output_dtypes:
            name = str(dtype).removeprefix("torch.")
            per_dtype[name] = per_dtype.get(name, 0) + 1
    return {op: ", ".join(f"{dtype} x{n}" for dtype, n in per_dtype.items()) for op, per_dtype in counts.items()}


class SimulationUnavailable(RuntimeError):
    """The installed PyTorch cannot apply its CUDA autocast rules to fake tensors (see :func:`cuda_simulation_available`)."""


def _fake_tensor_mode() -> type:
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode  # private API: may move between releases
    except ImportError as error:
        raise SimulationUnavailable(f"simulated CUDA autocast needs torch._subclasses.fake_tensor ({error})") from error
    return FakeTensorMode


FAKE_CUDA_WITHOUT_GPU = (2, 10)  # first release whose fake CUDA tensors need no GPU (pytorch/pytorch#163016)


def _check_fake_cuda_stays_off_the_runtime() -> None:
    """Raise :class:`SimulationUnavailable` where fake CUDA tensors would call the real CUDA runtime.

    Before torch 2.10, the Python bindings of indexing (``t[0]``), ``copy_`` (used by every module's weight
    initialisation) and a few other methods take a real CUDA *device guard*, even on a fake tensor: on a machine
    without a usable GPU that fails ("CUDA driver version is insufficient", or "not linked with support for cuda
    devices" on a CPU-only build). From 2.10 the guard is a no-op there. With a GPU, any release works.
    """
    if _version_at_least(torch.__version__, FAKE_CUDA_WITHOUT_GPU) or torch.cuda.is_available():
        return
    raise SimulationUnavailable(
        f"torch {torch.__version__} takes a real CUDA device guard for some operations on fake CUDA tensors "
        f"(indexing, copy_); simulating CUDA autocast without a GPU needs torch >= "
        f"{'.'.join(map(str, FAKE_CUDA_WITHOUT_GPU))}"
    )


@contextmanager
def simulated_cuda_autocast(dtype: torch.dtype = torch.float16) -> Iterator[None]:
    """Apply PyTorch's *CUDA* autocast rules on a machine without a GPU.

    Inside the block, new tensors are *fake* CUDA tensors (``FakeTensorMode`` with default device "cuda"): they
    carry a dtype, shape and device but no data, and no GPU kernel runs. Autocast for "cuda" is switched on
    directly (``torch.amp.autocast("cuda")`` disables itself when no GPU is present), so every op goes through
    the CUDA autocast dispatch rules of the installed PyTorch: you can read the resulting dtypes, and ops that
    CUDA autocast refuses raise their real error. Nothing about speed or memory can be learned this way.

    Create the model and inputs inside the block; results are fake tensors (use ``.dtype``, ``.shape``).
    Raises :class:`SimulationUnavailable` where the private fake-tensor API is missing, and on a machine without a
    GPU under torch < 2.10, where some operations on fake CUDA tensors would call the real CUDA runtime.
    """
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"CUDA autocast runs in float16 or bfloat16, not {dtype}")
    fake_tensor_mode = _fake_tensor_mode()
    _check_fake_cuda_stays_off_the_runtime()
    enabled, previous_dtype = autocast_state("cuda")
    with fake_tensor_mode(), torch.device("cuda"):
        torch.set_autocast_dtype("cuda", dtype)
        torch.set_autocast_enabled("cuda", True)
        torch.autocast_increment_nesting()
        try:
            yield
        finally:
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            torch.set_autocast_enabled("cuda", enabled)
            torch.set_autocast_dtype("cuda", previous_dtype)


def cuda_simulation_available() -> tuple[bool, str]:
    """Whether :func:`simulated_cuda_autocast` works with the installed PyTorch: ``(True, "")``, or ``(False, why)``.

    Runs what the notebooks do in the simulation (build a layer, index a tensor, a linear layer, a softmax) and
    checks CUDA's rules: the layer's output is float16 on a (fake) CUDA device, the softmax float32.
    """
    try:
        with simulated_cuda_autocast(torch.float16):
            layer = nn.Linear(4, 4)  # weight initialisation goes through copy_
            hidden = layer(torch.ones(3, 4)[1:])  # indexing
            probabilities = torch.softmax(hidden, dim=1)
        got = (hidden.device.type, hidden.dtype, probabilities.dtype)
        if got != ("cuda", torch.float16, torch.float32):
            return False, (f"the simulation gave linear -> {hidden.dtype} on {hidden.device.type} and softmax -> "
                           f"{probabilities.dtype}, not CUDA's float16 on cuda and float32")
    except Exception as error:  # noqa: BLE001 - any failure means: skip the simulated CUDA parts
        return False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return True, ""


def autocast_rule_devices(op: str) -> list[str] | None:
    """Devices ("CPU", "CUDA") for which the installed PyTorch registers an autocast kernel for ATen op ``op``
    (e.g. ``"conv2d"``, ``"softmax.int"``), read from the dispatcher; ``None`` where that private API
    (``torch._C._dispatch_dump``) is missing or fails. Raises ``ValueError`` for an op the dispatcher does not know."""
    try:
        dump = torch._C._dispatch_dump(f"aten::{op}")
    except Exception:  # noqa: BLE001 - private API: absent, renamed, or changed
        return None
    if not isinstance(dump, str):
        return None
    if not dump.strip():
        raise ValueError(f"the dispatcher knows no op aten::{op}")
    return [key for key in ("CPU", "CUDA") if re.search(rf"^Autocast{key}:", dump, re.M)]
