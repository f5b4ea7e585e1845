"""Running a multi-process job from a notebook, bounded in time (plumbing for notebook 05's ``torchrun`` cell).

``run_job`` starts one command, or several at once (``torchrun`` agents that meet on a free port), captures
their output, and if they run past a timeout kills them with every process they started, then tries again.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
              "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")  # the variables of an enclosing job


def local_launch_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) without a job's variables, 1 thread per rank, gloo on loopback."""
    if base is None:
        base = os.environ
    env = {key: value for key, value in base.items() if key not in LAUNCH_ENV}
    env["OMP_NUM_THREADS"] = "1"
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    if loopback:
        env["GLOO_SOCKET_IFNAME"] = loopback
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the system picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parent_of(stat_text: str) -> int:
    """The parent's process id in the text of a Linux ``/proc/PID/stat`` file."""
    after_name = stat_text.rsplit(")", 1)[1]  # the name, in parentheses, may hold spaces
    return int(after_name.split()[1])


def children_by_parent() -> dict[int, list[int]]:
    """Every running process, grouped by its parent's id (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # a process may end while we read
            parent = parent_of(stat.read_text())
            children.setdefault(parent, []).append(int(stat.parent.name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: its children, their children, and so on."""
    children = children_by_parent()
    found = []
    to_visit = [pid]
    while to_visit:
        below = children.get(to_visit.pop(), [])
        found.extend(below)
        to_visit.extend(below)
    return found


def stop(process: subprocess.Popen) -> str:
    """Kill ``process``, its session and every descendant; return its stderr (no wait on held pipes)."""
    if os.name != "posix":
        process.kill()
    victims = [(os.killpg, process.pid)]  # its session (started with start_new_session)
    for pid in descendants(process.pid):  # and those that started a session of their own
        victims.append((os.kill, pid))
    for kill, pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError, AttributeError):
            kill(pid, signal.SIGKILL)
    try:
        stderr = process.communicate(timeout=10)[1]
    except subprocess.TimeoutExpired:
        return "(no stderr: a process it started still held the pipe)"
    return stderr or ""


def run_once(command: Sequence[str], timeout: float, **popen: Any) -> tuple:
    """(CompletedProcess, its stderr), or (None, its stderr) if it ran past ``timeout`` s and was killed."""
    command = list(command)
    with subprocess.Popen(command, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          start_new_session=os.name == "posix", **popen) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, stop(process)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), stderr


def run_job(command: Sequence[str] | Callable[[int], Sequence[Sequence[str]]], *, timeout: float,
            cwd: str | None = None, env: Mapping[str, str] | None = None, attempts: int = 1) -> Any:
    """Run ``command``, or all of ``command(free_port())`` at once (agents), capturing their output.

    Past ``timeout`` s, kill everything and try again on a new port, ``attempts`` in all, then raise
    ``TimeoutError``. Returns the CompletedProcess (a list of them for agents), with ``attempts_used``.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    if env is not None:
        env = dict(env)
    for attempt in range(1, attempts + 1):
        if callable(command):
            commands = command(free_port())
        else:
            commands = [command]
        with ThreadPoolExecutor(len(commands)) as pool:
            runs = list(pool.map(lambda c: run_once(c, timeout, cwd=cwd, env=env), commands))
        finished = [done for done, _ in runs]
        if all(finished):
            for done in finished:
                done.attempts_used = attempt
            if callable(command):
                return finished
            return finished[0]
    messages = "\n".join(stderr[-2000:] for _, stderr in runs)
    raise TimeoutError(f"the job did not finish within {timeout:g} s and was stopped ({attempts} attempt(s)); "
                       f"the end of its messages (each command's):\n{messages}")
