"""Notebook 05's scaffolding: autocast's per-thread state, DataParallel re-enacted (launches: ``helpers.jobs``)."""

import copy
import inspect
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import torch
from torch import nn

from . import ddp_train  # noqa: F401 (the job's script: notebook 05 reads its source)
from .device import autocast_state
from .jobs import free_port, local_launch_env, run_job  # noqa: F401 (the notebook calls lab.run_job)


def run_in_thread(fn: Callable[..., Any], *args: Any, name: str = "worker", **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` in a new thread, ``name``_0; return its result (or raise)."""
    with ThreadPoolExecutor(1, thread_name_prefix=name) as pool:
        return pool.submit(fn, *args, **kwargs).result()


class SharedLog(list):
    """A list that ``copy.deepcopy`` shares, not copies: every replica of a probe writes to it."""

    def __deepcopy__(self, memo: dict) -> "SharedLog":
        return self


class DtypeProbe(nn.Module):
    """A ``Linear`` logging (thread, autocast on?, dtype, output dtype); amp_dtype: own autocast."""

    def __init__(self, amp_dtype: torch.dtype | None = None):
        super().__init__()
        self.linear, self.amp_dtype, self.log = nn.Linear(8, 8), amp_dtype, SharedLog()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.amp_dtype is None:
            return self.observe(x)
        with torch.amp.autocast(x.device.type, dtype=self.amp_dtype):
            return self.observe(x)

    def observe(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        state = autocast_state(x.device.type)
        self.log.append((threading.current_thread().name, *state, y.dtype))
        return y


class Seen(NamedTuple):
    """What every call of a :class:`DtypeProbe` saw during one :func:`observe`."""

    outside: torch.dtype  # the dtype of the autocast entered around the call
    threads: tuple[str, ...]  # the threads that ran forward, sorted
    enabled: bool  # autocast on inside forward?
    inside: torch.dtype  # the autocast dtype current inside forward
    output: torch.dtype  # the dtype of the layer's output

    def __repr__(self) -> str:
        outside, inside, output = (str(d)[6:] for d in (self.outside, self.inside, self.output))
        inside = f"on, {inside}" if self.enabled else "off"
        return (f"outside: {outside:<8}  ran in: {', '.join(self.threads):<20}  "
                f"autocast inside: {inside:<13}  output: {output}")


def observe(model: DtypeProbe, outside: torch.dtype, call: Callable[[], Any],
            device_type: str = "cpu") -> Seen:
    """What ``model`` saw (log cleared first) in ``call()`` under autocast(device_type, outside)."""
    model.log.clear()
    with torch.amp.autocast(device_type, dtype=outside):
        call()
    states = {entry[1:] for entry in model.log}
    if len(states) != 1:
        raise ValueError(f"expected one state over {len(model.log)} calls, saw {states}")
    return Seen(outside, tuple(sorted({entry[0] for entry in model.log})), *states.pop())


def replay_data_parallel(module: nn.Module, batch: torch.Tensor, *, replicas: int = 2,
                         device_type: str = "cpu", behaviour: str = "1.7+") -> torch.Tensor:
    """``nn.DataParallel.forward`` on CPU (scatter, replicate, a thread per replica, gather); the
    worker as parallel_apply's: "1.6": grad mode; "1.7+" autocast(enabled=caller's), no dtype."""
    if behaviour not in ("1.6", "1.7+") or replicas < 1:
        raise ValueError(f"behaviour '1.6' or '1.7+', replicas >= 1, not {behaviour!r}, {replicas}")
    chunks = batch.chunk(replicas)  # scatter
    copies = [copy.deepcopy(module) for _ in chunks]  # replicate
    grad_enabled, autocast_on = torch.is_grad_enabled(), torch.is_autocast_enabled(device_type)
    results: dict[int, Any] = {}

    def worker(i: int, replica: nn.Module, x: torch.Tensor) -> None:
        torch.set_grad_enabled(grad_enabled)
        try:
            if behaviour == "1.6":
                results[i] = replica(x)
            else:
                with torch.amp.autocast(device_type, enabled=autocast_on):
                    results[i] = replica(x)
        except Exception as error:  # parallel_apply re-raises a replica's error in the caller
            results[i] = error

    threads = [threading.Thread(target=worker, args=(i, m, x), name=f"replica-{i}")
               for i, (m, x) in enumerate(zip(copies, chunks))]
    if len(threads) == 1:
        worker(0, copies[0], chunks[0])
    else:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    outputs = [results[i] for i in range(len(chunks))]
    if errors := [output for output in outputs if isinstance(output, Exception)]:
        raise errors[0]
    with torch.amp.autocast(device_type, enabled=False):  # gather copies the outputs as they are
        return torch.cat(outputs)


def source_lines(obj: Any, needles: Sequence[str]) -> list[str]:
    """The lines of ``obj``'s source that contain any of ``needles``, as 'line number: code'."""
    lines, first = inspect.getsourcelines(obj)
    return [f"{first + k:4d}: {line.rstrip()}" for k, line in enumerate(lines)
            if any(n in line for n in needles)]


def source_block(obj: Any, first: str, last: str) -> list[str]:
    """The lines of ``obj``'s source from the first that contains ``first`` to the next that contains
    ``last``, as 'line number: code'; ``ValueError`` if either is missing (the source changed)."""
    lines, start = inspect.getsourcelines(obj)
    begin = next((k for k, line in enumerate(lines) if first in line), None)
    if begin is None:
        raise ValueError(f"{obj.__qualname__} has no line containing {first!r}")
    end = next((k for k in range(begin, len(lines)) if last in lines[k]), None)
    if end is None:
        raise ValueError(f"{obj.__qualname__} has no line containing {last!r} after {first!r}")
    return [f"{start + k:4d}: {lines[k].rstrip()}" for k in range(begin, end + 1)]
