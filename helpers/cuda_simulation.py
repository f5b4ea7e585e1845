"""CUDA autocast without a GPU: CUDA's autocast rules applied to *fake* CUDA tensors (no data, no device), so
notebooks 03 and 08 can show CUDA's column on a CPU-only machine. Plumbing, not a lesson: it rests on private
PyTorch APIs (``torch._subclasses.fake_tensor``), so :func:`cuda_simulation_available` says whether it works here
and why not, and every caller skips the simulated parts when it does not."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .device import _version_at_least, autocast_state


class SimulationUnavailable(RuntimeError):
    """The installed PyTorch cannot apply its CUDA autocast rules to fake tensors."""


FAKE_CUDA_WITHOUT_GPU = (2, 10)  # first release whose fake CUDA tensors need no GPU (#163016)


def _check_fake_cuda_stays_off_the_runtime() -> None:
    """:class:`SimulationUnavailable` where fake CUDA tensors take a real device guard (< 2.10)."""
    if _version_at_least(torch.__version__, FAKE_CUDA_WITHOUT_GPU) or torch.cuda.is_available():
        return
    raise SimulationUnavailable(
        f"torch {torch.__version__} takes a real CUDA device guard for some operations on fake "
        f"CUDA tensors (indexing, copy_); simulating CUDA autocast without a GPU needs torch >= "
        f"{'.'.join(map(str, FAKE_CUDA_WITHOUT_GPU))}")


@contextmanager
def simulated_cuda_autocast(dtype: torch.dtype = torch.float16) -> Iterator[None]:
    """CUDA autocast rules without a GPU, on *fake* CUDA tensors (made inside; no data). 03 A.3."""
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"CUDA autocast runs in float16 or bfloat16, not {dtype}")
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode  # private: may move
    except ImportError as error:
        raise SimulationUnavailable(f"simulated CUDA autocast needs torch._subclasses.fake_tensor "
                                    f"({error})") from error
    _check_fake_cuda_stays_off_the_runtime()
    enabled, previous_dtype = autocast_state("cuda")
    with FakeTensorMode(), torch.device("cuda"):
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
    """``(True, "")`` where :func:`simulated_cuda_autocast` works (linear fp16, softmax fp32)."""
    try:
        with simulated_cuda_autocast(torch.float16):
            layer = nn.Linear(4, 4)  # weight initialisation goes through copy_
            hidden = layer(torch.ones(3, 4)[1:])  # indexing
            probabilities = torch.softmax(hidden, dim=1)
        got = (hidden.device.type, hidden.dtype, probabilities.dtype)
        if got != ("cuda", torch.float16, torch.float32):
            return False, (f"the simulation gave {got}, not CUDA's float16 on cuda and float32")
    except Exception as error:  # any failure means: skip the simulated CUDA parts
        return False, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return True, ""


def cuda_rules_available() -> tuple[bool, str]:
    """``(True, "")`` where CUDA's autocast rules apply (a GPU, simulated), else (False, why)."""
    return (True, "") if torch.cuda.is_available() else cuda_simulation_available()


@contextmanager
def cuda_autocast(dtype: torch.dtype = torch.float16) -> Iterator[None]:
    """CUDA autocast, new tensors on CUDA: real on a GPU, else :func:`simulated_cuda_autocast`."""
    if torch.cuda.is_available():
        with torch.device("cuda"), torch.amp.autocast("cuda", dtype=dtype):
            yield
    else:
        with simulated_cuda_autocast(dtype):
            yield
