"""Solutions of notebook 05 (DataParallel pitfall, DDP and FSDP), each computed with PyTorch in a
clean state: a fresh thread (autocast's state is per thread) and a forked random generator, so the
order in which a learner ran the notebook's cells cannot change an expected answer."""
from __future__ import annotations

import threading

import torch
from torch import nn
from torch.nn import functional as F

from ..data import shapes_dataset
from ..ddp_train import fsdp2
from ..dtype_trace import record_ops
from ..model import ShapesCNN
from ..nb05 import DtypeProbe, SharedLog, replay_data_parallel, run_in_thread

MATMULS = ("mm", "addmm", "bmm", "matmul", "linear")  # the ops whose dtype autocast decides
HALVES = (torch.float16, torch.bfloat16)


def _batch() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(5))


def replica_dtype_after_set_autocast_dtype() -> torch.dtype:
    """05.1: the main thread sets CPU autocast's dtype to float16 (``set_autocast_dtype``), then
    calls the 1.7+ re-enactment under ``autocast("cpu")`` without dtype: the output's dtype."""
    def experiment() -> torch.dtype:
        torch.set_autocast_dtype("cpu", torch.float16)  # this (fresh) thread's state only
        with torch.amp.autocast("cpu"):
            return replay_data_parallel(DtypeProbe(), _batch(), behaviour="1.7+").dtype

    return run_in_thread(experiment, name="clean-state")


def bare_decorator_output_dtype() -> torch.dtype:
    """05.2: a forward decorated with autocast("cpu") without dtype, in a class defined outside any
    autocast (in a fresh thread, so no dtype the learner set leaks in), float16 outside, 1.7+."""
    def experiment() -> torch.dtype:
        class BareDecoratedProbe(DtypeProbe):
            @torch.amp.autocast("cpu")  # no dtype: the one current when this object is created
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.observe(x)

        with torch.amp.autocast("cpu", dtype=torch.float16):
            return replay_data_parallel(BareDecoratedProbe(), _batch(), behaviour="1.7+").dtype

    return run_in_thread(experiment, name="clean-state")


def _gradients(model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(inputs), labels).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def half_batch_average_matches_full_batch() -> bool:
    """05.3: ShapesCNN in train mode: is the mean of two 16-image gradients allclose to the 32-image
    gradient? (The learner's global random generator is left as it was.)"""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = ShapesCNN().train()
    inputs, labels = shapes_dataset("train", n=32).tensors
    full = _gradients(model, inputs, labels)
    halves = (_gradients(model, inputs[:16], labels[:16])
              + _gradients(model, inputs[16:], labels[16:])) / 2
    return torch.allclose(full, halves)


class TinyClassifier(nn.Module):
    """05.4, repaired: ``forward`` enters autocast with the model's own dtype, in every thread."""

    def __init__(self, amp_dtype: torch.dtype):
        super().__init__()
        self.amp_dtype = amp_dtype
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.amp.autocast(x.device.type, dtype=self.amp_dtype):
            return self.body(x)


class _Traced(nn.Module):
    """Runs a model; logs, from the thread that runs it (a replica), its matmuls' output dtypes."""

    def __init__(self, model: nn.Module, log: SharedLog):
        super().__init__()
        self.model, self.log = model, log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, ops = record_ops(lambda: self.model(x))
        self.log.append((threading.current_thread().name,
                         [(op.name, op.output_dtypes[0]) for op in ops if op.name in MATMULS]))
        return out


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


class FollowsItsDtype:
    """05.4's judge: the replicas of the repaired class must run every matmul in the dtype the model
    was built with (a dtype trace inside each replica thread), for float16 and bfloat16 models, with
    either 16-bit dtype outside, under both worker versions; the weights stay float32, and forward
    leaves the calling thread's autocast dtype alone."""

    CASES = [(built, outside, worker) for worker in ("1.7+", "1.6") for outside in HALVES
             for built in HALVES]

    def why_not(self, answer: object) -> str | None:
        if not isinstance(answer, type) or not issubclass(answer, nn.Module):
            return (f"hand the check the repaired class itself (TinyClassifier), not "
                    f"{'an instance' if isinstance(answer, nn.Module) else type(answer).__name__}")
        return run_in_thread(self._judge, answer, name="clean-state")  # no state of the caller's

    def _judge(self, cls: type) -> str | None:
        for built, outside, worker in self.CASES:
            case = f"a {_name(built)} model, {_name(outside)} outside, the PyTorch {worker} worker"
            try:
                model = cls(amp_dtype=built)
            except Exception as error:
                return f"TinyClassifier(amp_dtype=torch.{_name(built)}) raised {_first_line(error)}"
            if any(p.dtype != torch.float32 for p in model.parameters()):
                return "the weights are no longer float32: autocast casts per op, the weights stay"
            log = SharedLog()
            try:
                with torch.amp.autocast("cpu", dtype=outside):
                    replay_data_parallel(_Traced(model, log), _batch(), behaviour=worker)
            except Exception as error:
                return f"the replicas raised {_first_line(error)} ({case})"
            ops = [op for thread, matmuls in log for op in matmuls if thread.startswith("replica")]
            if not ops:
                return f"no matrix multiplication ran inside the replicas ({case})"
            wrong = [(name, dtype) for name, dtype in ops if dtype != built]
            if wrong:
                return f"the replica still ran {wrong[0][0]} in {_name(wrong[0][1])} ({case})"
            before = torch.get_autocast_dtype("cpu")
            model(_batch())  # called directly, outside any autocast
            if torch.get_autocast_dtype("cpu") != before:
                return "forward changed the calling thread's autocast dtype for good"
        return None

    def __repr__(self) -> str:
        return "a classifier class whose replicas compute in the dtype it was built with"


def repaired_classifier() -> FollowsItsDtype:
    """05.4: the repaired classifier class, judged by running it (:class:`FollowsItsDtype`)."""
    return FollowsItsDtype()


class ReducesInFloat32:
    """05.5's judge: the colleague's policy with one change, gradients reduced in float32."""

    def why_not(self, answer: object) -> str | None:
        MixedPrecisionPolicy, _ = fsdp2()
        if not isinstance(answer, MixedPrecisionPolicy):
            return f"hand the check the repaired MixedPrecisionPolicy, not {type(answer).__name__}"
        for field in ("param_dtype", "reduce_dtype", "output_dtype"):
            value = getattr(answer, field)
            if value is not None and not isinstance(value, torch.dtype):
                spelled = str(value).removeprefix("torch.")
                return (f"{field} is {value!r}, a {type(value).__name__}, not a torch.dtype: "
                        f"write torch.{spelled}, not the {type(value).__name__} {value!r}")
        if answer.param_dtype != torch.bfloat16:
            return "the policy no longer computes in bfloat16 (param_dtype)"
        reduced = answer.reduce_dtype or answer.param_dtype  # unset: FSDP2 reduces in param_dtype
        if reduced != torch.float32:
            return f"the gradients would still be averaged in {_name(reduced)}"
        if answer.output_dtype is not None or answer.cast_forward_inputs is not True:
            return "only the reduction should change: output_dtype or cast_forward_inputs differ"
        return None


def float32_reduction_policy() -> ReducesInFloat32:
    """05.5: compute in bfloat16, reduce gradients in float32 (the judge: ReducesInFloat32)."""
    return ReducesInFloat32()


SOLUTIONS = {
    "05.1": replica_dtype_after_set_autocast_dtype,
    "05.2": bare_decorator_output_dtype,
    "05.3": half_batch_average_matches_full_batch,
    "05.4": repaired_classifier,
    "05.5": float32_reduction_policy,
}
