"""Solutions to notebook 04's exercises, computed with PyTorch; the fix-the-code exercises (04.3-5)
are judged by running the learner's functions on runs of the judge's own (see ``Judge``)."""
import io
import math
import pickle
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from .. import nb04 as lab
from ..state import optimizer_snapshot, same_state, snapshot
from .nb03 import Judge


def injected_inf_steps(steps: list[bool], *, init_scale: float = 2.0**16,
                       growth_interval: int = 2000) -> list[float]:
    """The scale of a real ``GradScaler("cpu")`` after each ``update()``, for a sequence of steps
    (True: an inf gradient, injected into a single float32 weight)."""
    weight = nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    scales = []
    for bad in steps:
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        if bad:
            weight.grad.fill_(float("inf"))
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def unscale_then_clip(model: nn.Module, optimizer: torch.optim.Optimizer,
                      scaler: torch.amp.GradScaler, loss: torch.Tensor, max_norm: float) -> None:
    """04.3 repaired: scale and backward, ``unscale_``, clip the true gradients, step, update."""
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()


def save_with_scaler(model: nn.Module, optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler) -> dict:
    """04.4 repaired, saving: the scaler's state beside the model's and the optimizer's."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict()}


def load_with_scaler(checkpoint: dict, model: nn.Module, optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler) -> None:
    """04.4 repaired, loading: all three states, the scaler's whole state_dict included."""
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scaler.load_state_dict(checkpoint["scaler"])


def make_run(device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    """04.5 repaired: float32 parameters (autocast does the float16 math), an enabled scaler."""
    net = lab.faint_net(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    return net, optimizer, torch.amp.GradScaler(device.type)


def _scale_after_sequence() -> float:
    clean, bad = False, True
    steps = [clean, clean, clean, bad, clean, clean, clean, clean, bad, bad, clean]
    return injected_inf_steps(steps, init_scale=2.0**16, growth_interval=3)[-1]


def _smallest_scale_keeping_1e9() -> float:
    gradient = torch.tensor(1e-9, dtype=torch.float64)
    k = 0
    while (gradient * 2.0**k).to(torch.float16) == 0:
        k += 1
    return 2.0**k


def _steps_applied_with_accumulation() -> int:
    weight = nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    applied = 0
    for micro_batch in range(1, 13):
        scaler.scale(weight.sum() / 4).backward()
        if micro_batch == 6:
            weight.grad.fill_(float("inf"))
        if micro_batch % 4 == 0:
            before = weight.detach().clone()
            scaler.step(optimizer)
            scaler.update()
            applied += int(not torch.equal(before, weight.detach()))
            optimizer.zero_grad()
    return applied


class _WatchedScaler(torch.amp.GradScaler):
    """A GradScaler that counts its calls, and knows when ``step`` is running."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"scale": 0, "unscale_": 0, "step": 0, "update": 0}
        self.stepping = False

    def scale(self, outputs):
        self.calls["scale"] += 1
        return super().scale(outputs)

    def unscale_(self, optimizer):
        self.calls["unscale_"] += 1
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        self.calls["step"], self.stepping = self.calls["step"] + 1, True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self.stepping = False

    def update(self, new_scale=None):
        self.calls["update"] += 1
        return super().update(new_scale)


def _faint_problem(seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A faint-task network with a non-zero last layer, and data of another seed than the
    notebook's."""
    net = lab.clipping_net()
    inputs = torch.randn(48, 64, generator=torch.Generator().manual_seed(seed))
    return net, inputs, lab.FAINT_FACTOR * inputs


def _fp16_loss(net: nn.Module, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    with torch.amp.autocast("cpu", dtype=torch.float16):
        return F.mse_loss(net(inputs), target)


class _WatchedClipping:
    """Inside it, ``torch.nn.utils.clip_grad_norm_`` records the ``max_norm`` it was given and the
    total norm of the gradients it saw (a learner's ``nn.utils.clip_grad_norm_(...)`` calls it)."""

    def __init__(self):
        self.calls: list[tuple[float, float]] = []  # (max_norm given, gradient norm seen)
        self.original = nn.utils.clip_grad_norm_

    def clip(self, parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        norm = self.original(parameters, max_norm, *args, **kwargs)
        self.calls.append((float(max_norm), float(norm)))
        return norm

    def __enter__(self):
        nn.utils.clip_grad_norm_ = self.clip
        return self

    def __exit__(self, *exc):
        nn.utils.clip_grad_norm_ = self.original


def _run_04_3(step_fn: Callable, inject: bool, max_norm: float, init_scale: float) -> dict:
    """Run the learner's step once on the judge's problem; what happened."""
    net, inputs, target = _faint_problem(seed=11)
    optimizer = torch.optim.SGD(net.parameters(), lr=1.0)
    scaler = _WatchedScaler("cpu", init_scale=init_scale)
    outside = []
    optimizer.register_step_pre_hook(lambda *args: outside.append(not scaler.stepping))
    if inject:
        net[0].bias.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    before = [p.detach().clone() for p in net.parameters()]
    raised = None
    with _WatchedClipping() as clipping:
        try:
            step_fn(net, optimizer, scaler, _fp16_loss(net, inputs, target), max_norm)
        except RuntimeError as error:
            raised = error
    change = torch.cat([(b - p.detach()).flatten() for b, p in zip(before, net.parameters())])
    return {"outside": any(outside), "calls": scaler.calls, "clips": clipping.calls,
            "raised": raised, "update": change.norm().item(),
            "changed": bool(change.abs().sum() != 0)}


def _true_gradient_norm() -> float:
    """The norm of the judge problem's float16-autocast gradients, unscaled."""
    net, inputs, target = _faint_problem(seed=11)
    _fp16_loss(net, inputs, target).backward()
    return torch.cat([p.grad.flatten() for p in net.parameters()]).norm().item()


def _wrong_length(run: dict, max_norm: float, scale: float) -> str:
    """What made a clean step's update another length than ``max_norm``, as the spies tell."""
    kind = "shorter" if run["update"] < max_norm else "longer"
    if not run["clips"]:
        return (f"the update is {kind} than max_norm: the gradients were not clipped "
                "(clip_grad_norm_)")
    given, seen = run["clips"][0]
    true_norm = _true_gradient_norm()
    if seen > true_norm * scale / 4 and given < max_norm * 4:
        return f"the update is {kind} than max_norm: clipping saw the scaled gradients"
    if seen < true_norm * 4 / scale:
        return ("the gradients were divided by the scale twice before clipping: unscale_ once, and "
                "divide nothing yourself")
    if not math.isclose(given, max_norm, rel_tol=1e-6):
        return (f"clip_grad_norm_ was given max_norm={given:g}, not the max_norm argument "
                f"({max_norm:g})")
    return f"the update is {run['update']:.2e} long, not max_norm ({max_norm:g})"


def _why_not_04_3(step_fn: Callable) -> str | None:
    """Run the learner's step twice on data of its own: once clean (its update must be exactly
    ``max_norm`` long, through the scaler), once with an inf gradient (the step must be skipped)."""
    max_norm = 3e-4  # not the notebook's CLIP_NORM; the true norm is ~100x larger
    scale = 2.0**12
    for inject in (False, True):
        run = _run_04_3(step_fn, inject, max_norm, scale)
        if run["raised"] is not None and run["calls"]["unscale_"] > 1:
            return ("unscale_ ran twice before update(): call scaler.unscale_(optimizer) once "
                    "per step, before clipping")
        if run["raised"] is not None:
            raise run["raised"]
        if run["outside"]:
            return "the optimizer stepped without the scaler"
        if not run["calls"]["scale"]:
            return "the loss was not scaled (scaler.scale(loss).backward())"
        if not run["calls"]["step"] or not run["calls"]["update"]:
            return "it should end with scaler.step(optimizer) and scaler.update()"
        if inject and run["changed"]:
            return "with an inf gradient the step was applied instead of skipped"
        if not inject and not math.isclose(run["update"], max_norm, rel_tol=1e-3):
            return _wrong_length(run, max_norm, scale)
    return None


def _checkpointed_run(save: Callable | None, load: Callable | None, steps: int,
                      resume_after: int) -> tuple[lab.TrainingState, dict]:
    """04.4's judge run: the faint task, a scaler at 2^12 with growth_interval 4, an inf at step 2
    (skipped), a checkpoint after ``resume_after`` steps (growth counter mid-interval) through
    ``torch.save``/``torch.load(weights_only=True)`` into fresh objects, then the other steps."""
    def fresh() -> lab.TrainingState:
        net = lab.faint_net()
        optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=4)
        return lab.TrainingState(net, optimizer, None, scaler)

    run, saved = fresh(), {}
    for step in range(steps):
        if step == resume_after and save is not None:
            buffer = io.BytesIO()
            torch.save(save(run.model, run.optimizer, run.scaler), buffer)
            before, buffer = run, io.BytesIO(buffer.getvalue())
            run = fresh()
            load(torch.load(buffer, weights_only=True), run.model, run.optimizer, run.scaler)
            saved = {"scaler": before.scaler.state_dict(), "resumed": run.scaler.state_dict(),
                     "model": same_state(snapshot(before.model), snapshot(run.model)),
                     "optimizer": same_state(optimizer_snapshot(before.optimizer),
                                             optimizer_snapshot(run.optimizer))}
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(lab.faint_loss(run.model)[0]).backward()
        if step == 2:
            run.model[0].weight.grad[0, 0] = float("inf")
        run.scaler.step(run.optimizer)
        run.scaler.update()
    return run, saved


def _why_not_04_4(answer: object) -> str | None:
    if not (isinstance(answer, tuple) and len(answer) == 2 and all(map(callable, answer))):
        return "the answer should be the pair of your repaired functions: (save, load)"
    uninterrupted, _ = _checkpointed_run(None, None, steps=9, resume_after=5)
    try:
        resumed, seen = _checkpointed_run(*answer, steps=9, resume_after=5)
    except pickle.UnpicklingError:
        return "the checkpoint does not load with weights_only=True: save state_dicts"
    if seen["resumed"].get("scale") != seen["scaler"]["scale"]:
        return "the resumed scaler does not start with the scale it was saved with"
    if seen["resumed"].get("_growth_tracker") != seen["scaler"]["_growth_tracker"]:
        return "the resumed scaler lost its growth counter (restore the whole scaler state)"
    for part in ("model", "optimizer"):
        if not seen[part]:
            return f"the resumed {part} is not the saved one"
    if not lab.same_run(resumed, uninterrupted):
        return "after resuming, the run is not bit-for-bit the uninterrupted one"
    return None


def _train_ratio(net: nn.Module, optimizer: torch.optim.Optimizer, scaler, inputs, target,
                 steps: int = 30) -> float:
    """Last / first loss of ``steps`` recipe steps (float16 autocast; no scaler: float32)."""
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss = F.mse_loss(net(inputs), target)
            loss.backward()
            optimizer.step()
        else:
            loss = _fp16_loss(net, inputs, target)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        losses.append(loss.item())
    return losses[-1] / losses[0]


def _why_not_04_5(make_run: Callable) -> str | None:
    """Build the learner's (net, optimizer, scaler), train 30 float16-autocast steps on data of
    its own, and compare with the same steps in float32 (within 5 %; without a scaler: 2x off)."""
    built = make_run(torch.device("cpu"))
    if not (isinstance(built, tuple) and len(built) == 3):
        return "it should return (net, optimizer, scaler)"
    net, optimizer, scaler = built
    dtypes = {p.dtype for p in net.parameters()}
    if dtypes != {torch.float32}:
        names = ", ".join(sorted(str(d)[6:] for d in dtypes))
        return f"its parameters are {names}: keep them float32 (autocast does the float16 math)"
    if not isinstance(scaler, torch.amp.GradScaler) or not scaler.is_enabled():
        return "its scaler is not an enabled torch.amp.GradScaler"
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if params != {id(p) for p in net.parameters()}:
        return "its optimizer does not hold the network's parameters"
    inputs = torch.randn(64, 64, generator=torch.Generator().manual_seed(4))
    target = lab.FAINT_FACTOR * inputs
    ratio = _train_ratio(net, optimizer, scaler, inputs, target)
    reference = lab.faint_net()
    expected = _train_ratio(reference, torch.optim.Adam(reference.parameters(), lr=lab.FAINT_LR),
                            None, inputs, target)
    if not abs(ratio / expected - 1) < 0.05:
        return "its float16 run does not follow the float32 run of the same steps"
    return None


SOLUTIONS = {
    # 04.1: scale after clean x3, inf, clean x4, inf, inf, clean with growth_interval=3 from 2**16
    "04.1": _scale_after_sequence,
    # 04.6: smallest power-of-two loss scale that keeps a 1e-9 gradient non-zero in float16
    "04.6": _smallest_scale_keeping_1e9,
    # 04.2: optimizer steps applied over 12 micro-batches, accumulation 4, inf in micro-batch 6
    "04.2": _steps_applied_with_accumulation,
    # 04.3 (fix the code): a step function that unscales before clipping, through the scaler
    "04.3": lambda: Judge(_why_not_04_3, "function", "clip_and_step"),
    # 04.4 (fix the code): save/load functions that checkpoint the scaler's whole state
    "04.4": lambda: Judge(_why_not_04_4, "pair", "(save, load)"),
    # 04.5 (fix the code): float32 parameters, float16 autocast and an enabled scaler
    "04.5": lambda: Judge(_why_not_04_5, "function", "make_run"),
}

