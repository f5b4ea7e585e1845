"""Dtype leaks: ops that pull a half-precision run back to float32 (not for autocast); 02 §6."""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .dtype_trace import OpRecord, record_ops

CONSTANT_OPS = frozenset({"lift_fresh", "lift_fresh_copy"})  # wrap a torch.tensor(...) constant


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Leak:
    """One operation that leaves the run's dtype: its position in the run, name, kind and dtypes."""

    index: int
    op: str
    kind: str  # "creates", "mixes" or "casts" (see classify)
    input_dtypes: tuple[torch.dtype, ...]
    output_dtype: torch.dtype | None  # None for an op with no floating output (a comparison)

    def describe(self) -> str:
        """One line such as ``#4 add: mixes float16 + float32 -> float32``."""
        output = _name(self.output_dtype) if self.output_dtype is not None else "no floating output"
        if self.kind == "creates":
            origin = "a torch.tensor constant" if self.op in CONSTANT_OPS else "no floating input"
            return f"#{self.index} {self.op}: creates {output} ({origin})"
        inputs = " + ".join(_name(d) for d in sorted(set(self.input_dtypes), key=str))
        return f"#{self.index} {self.op}: {self.kind} {inputs} -> {output}"


def classify(record: OpRecord, dtype: torch.dtype) -> str | None:
    """The kind of leak ``record`` is in a ``dtype`` run, or None: "mixes" (several input dtypes),
    "creates" (no floating input, or a constant), "casts" (inputs ``dtype``, the output not)."""
    inputs = set(record.input_dtypes)
    if len(inputs) > 1:
        return "mixes"
    if not record.output_dtypes or record.output_dtypes[0] == dtype:
        return None
    if not inputs or record.name in CONSTANT_OPS:
        return "creates"
    if inputs == {dtype}:
        return "casts"
    return None


@dataclass
class LeakReport:
    """What :func:`find_dtype_leaks` saw in one run."""

    dtype: torch.dtype
    leaks: list[Leak]
    op_count: int       # operations recorded
    off_dtype_ops: int  # operations whose result is another floating dtype (leaks and their spread)
    error: str | None = None  # "RuntimeError: ..." when the run stopped with an exception
    result: Any = field(default=None, repr=False)

    @property
    def clean(self) -> bool:
        """True when the run finished and every operation computed in ``dtype``."""
        return not self.leaks and self.off_dtype_ops == 0 and self.error is None

    def format(self, error_message: bool = True) -> str:
        """The report as text; ``error_message=False`` names only an error's type."""
        leaks = f"{len(self.leaks)} leak{'' if len(self.leaks) == 1 else 's'}"
        lines = [f"{_name(self.dtype)} run: {self.op_count} ops, {leaks}, "
                 f"{self.off_dtype_ops} returned another floating dtype"]
        lines += ["  " + leak.describe() for leak in self.leaks]
        if self.error is not None:
            error = self.error if error_message else self.error.split(':')[0]
            lines.append(f"  stopped by {error}")
        if self.clean:
            lines.append(f"  clean: every op computed in {_name(self.dtype)}")
        return "\n".join(lines)

    __str__ = format


def find_dtype_leaks(fn: Callable[[], Any], dtype: torch.dtype) -> LeakReport:
    """Run ``fn()`` once, report the ops that leave ``dtype``; an exception is reported."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype such as torch.float16, not "
                        f"{dtype!r}")
    caught: list[str] = []

    def guarded() -> Any:
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 - reported, not hidden: see LeakReport.error
            first_line = str(error).splitlines()[0] if str(error) else ""
            caught.append(f"{type(error).__name__}: {first_line}")
            return None

    result, records = record_ops(guarded)
    leaks, off_dtype = [], 0
    for index, record in enumerate(records):
        kind = classify(record, dtype)
        if kind is not None:
            output = record.output_dtypes[0] if record.output_dtypes else None
            leaks.append(Leak(index, record.name, kind, record.input_dtypes, output))
        if record.output_dtypes and record.output_dtypes[0] != dtype:
            off_dtype += 1
    return LeakReport(dtype, leaks, len(records), off_dtype, caught[0] if caught else None, result)
