"""Autocast state lives in each thread: observe it, and re-enact on CPU how ``nn.DataParallel`` uses threads.

``nn.DataParallel.forward`` scatters the batch over the GPUs, replicates the module, runs each replica in its
own ``threading.Thread`` (``torch/nn/parallel/parallel_apply.py``) and gathers the outputs. The real thing
needs two GPUs; :func:`replay_data_parallel` takes the same four steps on CPU, with the worker of PyTorch 1.6
(which restored only the grad mode) or of 1.7 and later (which also re-enters autocast with the caller's
*enabled flag*, but not its dtype).
"""
from __future__ import annotations

import copy
import inspect
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from .device import AutocastState, autocast_state  # noqa: F401 (AutocastState re-exported)

BEHAVIOURS = ("1.6", "1.7+")


def run_in_thread(fn: Callable[..., Any], *args: Any, name: str = "worker", **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` in a new ``threading.Thread`` and return its result (or raise its error)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as error:  # handed back to the caller below
            box["error"] = error

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


@dataclass(frozen=True)
class Observation:
    """What a :class:`DtypeProbe` saw during one forward call."""

    thread: str  # the name of the thread that ran forward
    autocast_enabled: bool
    autocast_dtype: torch.dtype
    output_dtype: torch.dtype


class SharedLog(list):
    """A list that ``copy.deepcopy`` shares instead of copying, so every replica of a probe writes to it."""

    def __deepcopy__(self, memo: dict) -> "SharedLog":
        return self


class DtypeProbe(nn.Module):
    """A ``Linear`` layer that logs, at each forward, its thread's autocast state and its output dtype.

    With ``amp_dtype`` set, ``forward`` enters ``torch.amp.autocast(x.device.type, dtype=amp_dtype)``
    itself: autocast inside ``forward``, the fix that works in every PyTorch version.
    """

    def __init__(self, features: int = 8, amp_dtype: torch.dtype | None = None, log: SharedLog | None = None):
        super().__init__()
        self.linear = nn.Linear(features, features)
        self.amp_dtype = amp_dtype
        self.log = SharedLog() if log is None else log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.amp_dtype is None:
            return self.observe(x)
        with torch.amp.autocast(x.device.type, dtype=self.amp_dtype):
            return self.observe(x)

    def observe(self, x: torch.Tensor) -> torch.Tensor:
        """Run the layer and log what this thread's autocast did to it."""
        y = self.linear(x)
        state = autocast_state(x.device.type)
        self.log.append(Observation(threading.current_thread().name, state.enabled, state.dtype, y.dtype))
        return y


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Seen:
    """What every call of a :class:`DtypeProbe` saw during one :func:`observe` (the same in every thread)."""

    outside: torch.dtype  # the dtype of the autocast entered around the call
    threads: tuple[str, ...]  # the threads that ran forward, sorted
    enabled: bool  # autocast on inside forward?
    inside: torch.dtype  # the autocast dtype current inside forward
    output: torch.dtype  # the dtype of the layer's output

    def __repr__(self) -> str:
        inside = f"on, {_short(self.inside)}" if self.enabled else "off"
        return (f"outside: {_short(self.outside):<8}  ran in: {', '.join(self.threads):<20}  "
                f"autocast inside: {inside:<13}  output: {_short(self.output)}")


class Observations(dict):
    """Named :class:`Seen` rows, shown as an aligned table (``Observations(direct=seen, ...)``)."""

    def __repr__(self) -> str:
        width = max((len(name) for name in self), default=0)
        return "\n".join(f"{name:<{width}}  {seen!r}" for name, seen in self.items())


def observe(model: DtypeProbe, outside: torch.dtype, call: Callable[[], Any], device_type: str = "cpu") -> Seen:
    """Run ``call()`` under ``torch.amp.autocast(device_type, dtype=outside)``; return what ``model`` saw inside.

    ``model.log`` is cleared first. Raises ``ValueError`` if its calls (one per replica) saw different states.
    """
    model.log.clear()
    with torch.amp.autocast(device_type, dtype=outside):
        call()
    states = {(o.autocast_enabled, o.autocast_dtype, o.output_dtype) for o in model.log}
    if len(states) != 1:
        raise ValueError(f"expected one state over {len(model.log)} calls, saw {states}")
    enabled, inside, output = states.pop()
    return Seen(outside, tuple(sorted({o.thread for o in model.log})), enabled, inside, output)


def parallel_apply_autocast_calls() -> list[str]:
    """The arguments of every ``autocast(...)`` call in the installed ``torch.nn.parallel.parallel_apply``.

    Since PyTorch 1.7 the replica worker enters ``autocast(device_type, enabled=autocast_enabled)``: the
    caller's flag, and no ``dtype``.
    """
    from torch.nn.parallel import parallel_apply

    source = inspect.getsource(parallel_apply)
    return [" ".join(args.split()) for args in re.findall(r"autocast\(([^()]*)\)", source)]


def replay_parallel_apply(modules: Sequence[nn.Module], inputs: Sequence[torch.Tensor], *,
                          device_type: str = "cpu", behaviour: str = "1.7+") -> list[torch.Tensor]:
    """Run ``modules[i](inputs[i])`` as ``torch.nn.parallel.parallel_apply`` does: one thread per replica.

    ``behaviour="1.6"``: each worker thread restores the caller's grad mode only, so autocast is off there.
    ``behaviour="1.7+"`` (PR 43102, still so today): the worker also enters
    ``torch.amp.autocast(device_type, enabled=<caller's flag>)``; no dtype is passed, so the thread gets
    the device's default autocast dtype. With a single replica the worker runs in the calling thread.
    """
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"behaviour must be one of {BEHAVIOURS}, not {behaviour!r}")
    if len(modules) != len(inputs):
        raise ValueError(f"{len(modules)} modules but {len(inputs)} inputs: give one input per module")
    grad_enabled = torch.is_grad_enabled()
    autocast_enabled = torch.is_autocast_enabled(device_type)
    lock = threading.Lock()
    results: dict[int, Any] = {}

    def worker(i: int, module: nn.Module, x: torch.Tensor) -> None:
        torch.set_grad_enabled(grad_enabled)
        try:
            if behaviour == "1.6":
                output = module(x)
            else:
                with torch.amp.autocast(device_type, enabled=autocast_enabled):
                    output = module(x)
        except Exception as error:  # parallel_apply re-raises a replica's error in the caller
            output = error
        with lock:
            results[i] = output

    if len(modules) > 1:
        threads = [threading.Thread(target=worker, args=(i, m, x), name=f"replica-{i}")
                   for i, (m, x) in enumerate(zip(modules, inputs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        worker(0, modules[0], inputs[0])
    for i in range(len(inputs)):
        if isinstance(results[i], Exception):
            raise results[i]
    return [results[i] for i in range(len(inputs))]


def replay_data_parallel(module: nn.Module, batch: torch.Tensor, *, replicas: int = 2, device_type: str = "cpu",
                         behaviour: str = "1.7+") -> torch.Tensor:
    """``nn.DataParallel.forward`` on CPU: scatter, replicate, run replicas in threads, gather.

    Scatter splits ``batch`` along dim 0; replicate copies ``module`` (DataParallel copies it to each GPU);
    :func:`replay_parallel_apply` runs the copies; gather concatenates the outputs.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, not {replicas}")
    chunks = batch.chunk(replicas)  # scatter
    copies = [copy.deepcopy(module) for _ in chunks]  # replicate
    outputs = replay_parallel_apply(copies, chunks, device_type=device_type, behaviour=behaviour)
    with torch.amp.autocast(device_type, enabled=False):  # gather copies the outputs as they are
        return torch.cat(outputs)


def source_lines(obj: Any, needles: Sequence[str]) -> list[str]:
    """The lines of ``obj``'s source that contain any of ``needles``, as 'line number: code' (no file path)."""
    lines, first = inspect.getsourcelines(obj)
    return [f"{first + k:4d}: {line.rstrip()}" for k, line in enumerate(lines) if any(n in line for n in needles)]


_ROLE = re.compile(r":(?:\w+:)+`(~?)([^`]+)`")  # a Sphinx role: :class:`~torch.nn.X`, :ref:`text <label>`


def _plain_role(match: re.Match) -> str:
    tilde, target = match.groups()
    if "<" in target:  # :ref:`shown text <label>` shows the text
        target = target.split("<")[0].strip()
    elif tilde:  # :class:`~a.b.C` shows only C
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def doc_sentences(obj: Any, keyword: str) -> list[str]:
    """The sentences of ``obj``'s docstring that contain ``keyword``, one line each, Sphinx markup made plain."""
    text = " ".join((inspect.getdoc(obj) or "").split())
    text = _ROLE.sub(_plain_role, re.sub(r"\.\. [\w-]+::\s*", "", text))  # drop directives (.. warning::)
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z`])", text)
    return [sentence for sentence in sentences if keyword in sentence]
