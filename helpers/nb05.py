"""Notebook 05's scaffolding: autocast's per-thread state, DataParallel re-enacted, launches."""

import contextlib
import copy
import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import torch
from torch import nn

from . import ddp_train  # noqa: F401 (the job's script: notebook 05 reads its source)
from .device import autocast_state

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # an enclosing job's


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


def local_launch_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (``os.environ``) without a job's variables, 1 thread per rank, gloo on loopback."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    return {**env, "GLOO_SOCKET_IFNAME": loopback} if loopback else env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the system picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``; none elsewhere)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            parents.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _stop(process: subprocess.Popen) -> str:
    """Kill ``process``, its session and every descendant; its stderr (no wait on held pipes)."""
    if os.name != "posix":
        process.kill()
    victims = [(os.killpg, process.pid)] + [(os.kill, pid) for pid in _descendants(process.pid)]
    for kill, pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError, AttributeError):
            kill(pid, signal.SIGKILL)
    try:
        return process.communicate(timeout=10)[1] or ""
    except subprocess.TimeoutExpired:
        return "(no stderr: a process it started still held the pipe)"


def _run(command: Sequence[str], timeout: float, **popen: Any) -> tuple:
    """(CompletedProcess or None if it ran past ``timeout`` s and was killed, its stderr)."""
    with subprocess.Popen(list(command), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=os.name == "posix", **popen) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, _stop(process)
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr), stderr


def run_job(command: Sequence[str] | Callable[[int], Sequence[Sequence[str]]], *, timeout: float,
            cwd: str | None = None, env: Mapping[str, str] | None = None, attempts: int = 1) -> Any:
    """Run ``command`` (or all of ``command(free_port())`` at once: agents), capturing output; past
    ``timeout`` s kill it all, retry on a new port, ``attempts`` in all, then ``TimeoutError``."""
    for attempt in range(1, attempts + 1):
        commands = command(free_port()) if callable(command) else [command]
        with ThreadPoolExecutor(len(commands)) as pool:
            runs = list(pool.map(lambda c: _run(c, timeout, cwd=cwd, env=env and dict(env)),
                                 commands))
        if all(done for done, _ in runs):
            for done, _ in runs:
                done.attempts_used = attempt
            return [done for done, _ in runs] if callable(command) else runs[0][0]
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    raise TimeoutError(f"the job did not finish within {timeout:g} s and was stopped ({attempts} "
                       f"attempt(s)); the end of its messages (each command's):\n"
                       + "\n".join(err[-2000:] for _, err in runs))
