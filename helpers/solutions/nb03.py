"""Solutions to notebook 03's exercises, computed with PyTorch.

The fix-the-code exercises are answered with the learner's repaired function (03.1, 03.3) or
class (03.2): each judge's ``why_not`` runs it on fresh seeded objects, enters autocast itself and
watches what the repair changes (where autocast is on, which ops ran in which dtype, what the
scaler did), so that no typed number and no symptom-hiding repair passes. 03.5's judge counts
the parameter casts itself and names each plausible wrong count (every cast, a second forward in
the same context, inference_mode, every op). No check changes the learner's global generator.
"""
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from ..data import shapes_dataset
from ..device import autocast_state
from ..dtype_trace import OpObserver, record_ops
from ..model import ShapesCNN


class Judge:
    """A fix-the-code exercise's judge: ``why_not(answer)`` is ``check(answer)`` once ``answer`` is
    of the ``kind`` asked for ("function", "class"; any other: ``check`` decides), else a line
    saying what to pass."""

    def __init__(self, check: Callable, kind: str, name: str):
        self.check, self.kind, self.name = check, kind, name

    def why_not(self, answer: object) -> str | None:
        is_class = isinstance(answer, type)
        right_kind = (is_class and issubclass(answer, nn.Module) if self.kind == "class"
                      else callable(answer) and not is_class if self.kind == "function"
                      else True)  # another kind: the check looks at it
        if not right_kind:
            return f"the answer should be your repaired {self.kind} {self.name} itself"
        with torch.random.fork_rng(devices=[]):  # seeded runs; the caller's generator left alone
            return self.check(answer)

    def __repr__(self) -> str:
        return f"<a judge of your repaired {self.kind} {self.name}>"


def _smallest_power_of_two_that_changes_2_in_float16() -> float:
    weight = torch.tensor(2.0, dtype=torch.float16)
    changes = [2.0**-k for k in range(40)
               if (weight + torch.tensor(2.0**-k, dtype=torch.float16)) != weight]
    return min(changes)


def _cdist_dtype_under_cpu_autocast() -> torch.dtype:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 3, generator=g)
    b = torch.randn(5, 3, generator=g)
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        return torch.cdist(a, b).dtype


def _casts_in_the_backward_of_an_autocast_forward_and_loss() -> int:
    with torch.random.fork_rng(devices=[]):  # the learner's global generator left as it was
        torch.manual_seed(0)
        model = ShapesCNN().train()
    inputs, labels = shapes_dataset("train", n=4).tensors
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(inputs), labels)
    _, records = record_ops(loss.backward)
    return sum(record.name == "_to_copy" for record in records)


def exercise_03_5_model() -> nn.Sequential:
    """03.5's model: an embedding, a linear layer, one linear layer used three times, a bias-free
    output layer (the caller seeds or forks the generator)."""
    shared = nn.Linear(32, 32)
    return nn.Sequential(nn.Embedding(10, 16), nn.Linear(16, 32), nn.ReLU(),
                         shared, nn.ReLU(), shared, nn.ReLU(), shared, nn.Linear(32, 4, bias=False))


CAST_NAMES = ("_to_copy", "to")  # "to" where ops are not decomposed (under inference_mode)


def _name_and_source(func, args: tuple) -> tuple[str, bool]:
    """An op's name, and whether its first argument is a parameter."""
    return func.overloadpacket.__name__, bool(args) and isinstance(args[0], nn.Parameter)


def count_03_5(grad_mode: Callable, calls: int = 2) -> list[dict[str, int]]:
    """Per call, ``calls`` forward passes and losses of 03.5's model in ONE CPU bfloat16 autocast
    context under ``grad_mode``: casts of a parameter, all casts, all ops."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = exercise_03_5_model()
    tokens = torch.tensor([1, 4, 9, 2])
    labels = torch.tensor([0, 1, 2, 3])
    counts = []
    with grad_mode(), torch.amp.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(calls):
            seen = []
            observer = OpObserver(lambda func, args, kwargs, out: seen.append(
                _name_and_source(func, args)))
            with observer:
                F.cross_entropy(model(tokens), labels)
            casts = [is_parameter for name, is_parameter in seen if name in CAST_NAMES]
            counts.append({"parameter casts": sum(casts), "casts": len(casts), "ops": len(seen)})
    return counts


def wrong_counts_03_5() -> list[tuple[int, str]]:
    """03.5's plausible wrong answers on this torch, each with what is wrong, first match first."""
    first, second = count_03_5(torch.enable_grad)
    inference = count_03_5(torch.inference_mode, calls=1)[0]
    with torch.random.fork_rng(devices=[]):
        parameters = len(list(exercise_03_5_model().parameters()))
    every_cast = ("that counts every cast, activations too (the embedding's output, the logits): "
                  "count only the casts whose source is an nn.Parameter")
    parameter_tensors = ("that is the number of parameter tensors, not of casts: the embedding's "
                         "weight is not cast, and each parameter is cast once per context")
    cached = ("that is a second forward in the same context (the cast weights come from the "
              "cache), or _to_copy alone under inference_mode (there a cast is `to`): count the "
              "first forward, gradients enabled")
    second_forward = ("that counts a second forward in the same context, whose weights come from "
                      "the cache: count the first forward of a fresh context")
    no_cache = ("that is the count under inference_mode, where autocast caches nothing and the "
                "shared layer is cast at each use: count with gradients enabled")
    inference_casts = ("that counts every cast under inference_mode: count parameter casts, with "
                       "gradients enabled")
    return [(first["casts"], every_cast),
            (parameters, parameter_tensors),
            (second["parameter casts"], cached),
            (second["casts"], second_forward),
            (inference["parameter casts"], no_cache),
            (inference["casts"], inference_casts),
            (first["ops"], "that counts every op the forward ran, not only the casts"),
            (first["ops"] - first["casts"], "that counts the ops that are not casts")]


def _why_not_03_5(answer: object) -> str | None:
    if isinstance(answer, bool) or not isinstance(answer, int):
        return f"the answer should be an int (a count), not {type(answer).__name__}"
    if answer == count_03_5(torch.enable_grad, calls=1)[0]["parameter casts"]:
        return None
    for count, reason in wrong_counts_03_5():
        if answer == count:
            return reason
    return "that is not the number of parameter casts of one forward pass (the hint may help)"


def exercise_03_1_setup() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """03.1's starting point, seeded: a linear model, its SGD optimizer, 64 inputs, their labels."""
    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(0)
    inputs, labels = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
    return model, optimizer, inputs, labels


def train_five_steps(net: nn.Module, sgd: torch.optim.Optimizer, data: torch.Tensor,
                     classes: torch.Tensor) -> list[float]:
    """03.1 repaired: a fresh autocast context around forward + loss only, backward and step out."""
    losses = []
    for _ in range(5):
        sgd.zero_grad()
        with torch.amp.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(net(data), classes)
        loss.backward()
        sgd.step()
        losses.append(loss.item())
    return losses


def trace_03_1(train: Callable) -> tuple[list[tuple], list[float]]:
    """Run ``train(net, sgd, data, classes)`` on 03.1's fresh setup; return what hooks saw (each
    forward's output dtype, whether autocast was on in each backward and each optimizer step, and
    the dtype each loss was computed in: ``log_softmax``'s input) and the losses ``train`` returned."""
    model, optimizer, inputs, labels = exercise_03_1_setup()
    seen: list[tuple] = []
    model.register_forward_hook(lambda module, args, out: seen.append(("forward", out.dtype)))
    model.weight.register_hook(
        lambda grad: seen.append(("backward", autocast_state("cpu").enabled)))
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(("step", autocast_state("cpu").enabled)))
    losses, ops = record_ops(lambda: train(model, optimizer, inputs, labels))
    loss_dtypes = [op.input_dtypes[0] for op in ops if op.name == "_log_softmax"]
    return seen + [("loss", dtype) for dtype in loss_dtypes], losses


def _why_not_03_1(train: Callable) -> str | None:
    traced, losses = trace_03_1(train)
    seen = [(event, state) for event, state in traced if event != "loss"]
    for event, state in seen:
        if event == "forward" and state != torch.bfloat16:
            return "a forward pass ran without bfloat16 autocast"
        if event == "backward" and state:
            return "backward ran inside the autocast context"
        if event == "step" and state:
            return "the optimizer stepped inside the autocast context (its casts stay cached)"
    if seen != [("forward", torch.bfloat16), ("backward", False), ("step", False)] * 5:
        return "each of the five steps should run forward, backward, then the optimizer step"
    if ("loss", torch.bfloat16) in traced:
        return ("the loss was computed outside autocast, on the bfloat16 logits, so in bfloat16: compute it "
                "inside the with block, where autocast runs cross_entropy in float32")
    expected = trace_03_1(train_five_steps)[1]
    if len(losses) != 5 or not math.isclose(losses[-1], expected[-1], rel_tol=1e-3):
        return "it does not return the five losses of a model that learns"
    return None


class NearestCentre(nn.Module):
    """03.2 fixed: scores = minus the squared distance to each centre, in a float32 island."""

    def __init__(self, centres: torch.Tensor):
        super().__init__()
        self.centres = nn.Parameter(centres)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.amp.autocast(x.device.type, enabled=False):
            x, c = x.float(), self.centres.float()
            return -((x * x).sum(1, keepdim=True) + (c * c).sum(1) - 2 * x @ c.T)


def _why_not_03_2(layer_class: type) -> str | None:
    """Run the class on centres and bfloat16 queries of its own (another seed, size and offset than
    the notebook's), under bfloat16 autocast that the judge enters itself, traced; then backward."""
    g = torch.Generator().manual_seed(5)
    centres = 12 + torch.randn(96, 24, generator=g)
    queries = centres[torch.randperm(96, generator=g)[:64]] + 0.1 * torch.randn(64, 24, generator=g)
    queries = queries.bfloat16()  # as a bfloat16 op before the layer would hand them over
    layer = layer_class(centres.clone())
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        scores, records = record_ops(lambda: layer(queries))
    if scores.dtype != torch.float32:
        return f"under autocast its scores are {str(scores.dtype)[6:]}, not the island's float32"
    if any(r.name in ("mm", "addmm", "bmm") and torch.bfloat16 in r.output_dtypes for r in records):
        return "under autocast the matmul still runs in bfloat16"
    exact = torch.cdist(queries.double(), centres.double()).pow(2).min(dim=1).values
    nearest = -scores.detach().max(dim=1).values.double()
    if not (nearest - exact).abs().max() < 0.01 * exact.median():
        return "under autocast its squared distances are still wrong (cast inputs, not results)"
    if not scores.requires_grad:
        return "no gradient reaches the centres (they were detached)"
    scores.sum().backward()
    grad = next(layer.parameters()).grad
    if grad is None or grad.dtype != torch.float32 or not grad.isfinite().all():
        return "no finite float32 gradient reaches the centres"
    return None


def detector_data() -> tuple[torch.Tensor, torch.Tensor]:
    """03.3's 64 inputs and their rare positive class."""
    features = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    return features, (features[:, 0] > 1.5).float()


def train_detector(features: torch.Tensor, is_positive: torch.Tensor,
                   grad_scaler: torch.amp.GradScaler, steps: int = 20) -> list[float]:
    """03.3 repaired: no Sigmoid layer, BCEWithLogitsLoss; float16 autocast with the GradScaler."""
    torch.manual_seed(0)
    classifier = nn.Sequential(nn.Linear(16, 1))
    nn.init.constant_(classifier[0].bias, -6.9)
    sgd = torch.optim.SGD(classifier.parameters(), lr=0.1)
    loss_fn = nn.BCEWithLogitsLoss()
    losses = []
    for _ in range(steps):
        sgd.zero_grad()
        with torch.amp.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(classifier(features).squeeze(1), is_positive)
        grad_scaler.scale(loss).backward()
        grad_scaler.step(sgd)
        grad_scaler.update()
        losses.append(loss.item())
    return losses


def trace_03_3(train: Callable) -> tuple[list[float], list[str], set[tuple], int, float]:
    """Run ``train(features, is_positive, grad_scaler)`` on 03.3's data with a fresh scaler, under
    :func:`record_ops`: its losses, the names of the ops that ran (in order), the output dtypes of
    the linear layer's ``addmm``, how many scale updates the scaler made, and its final scale."""
    scaler = torch.amp.GradScaler("cpu")
    losses, records = record_ops(lambda: train(*detector_data(), scaler))
    names = [record.name for record in records]
    linear = {record.output_dtypes for record in records if record.name == "addmm"}
    return losses, names, linear, names.count("_amp_update_scale_"), scaler.get_scale()


def _why_not_03_3(train: Callable) -> str | None:
    losses, ops, linear, updates, scale = trace_03_3(train)
    if "binary_cross_entropy" in ops:
        return "the loss is still BCELoss (binary_cross_entropy on probabilities)"
    if "binary_cross_entropy_with_logits" not in ops:
        return "the loss is not BCEWithLogitsLoss"
    if "sigmoid" in ops[: ops.index("binary_cross_entropy_with_logits")]:  # in forward
        return "a sigmoid still runs before the loss: BCEWithLogitsLoss takes the logits"
    if linear != {(torch.float16,)}:
        return "the linear layer did not run in float16 (float16 autocast)"
    if updates != len(losses) or updates != 20:
        return f"{updates} of the 20 steps went through scaler.update()"
    if scale != 2.0**16:
        return "the scaler still skipped steps (its scale fell)"
    if not math.isclose(losses[-1], trace_03_3(train_detector)[0][-1], rel_tol=5e-3):
        return "its losses are not those of the detector trained on logits"
    return None


SOLUTIONS = {
    # 03.6: smallest power of two that changes a float16 weight of 2.0 when added
    "03.6": _smallest_power_of_two_that_changes_2_in_float16,
    # 03.7: dtype of torch.cdist on float32 inputs under CPU bfloat16 autocast
    "03.7": _cdist_dtype_under_cpu_autocast,
    # 03.4: casts (_to_copy) in the backward of a ShapesCNN forward + loss under CPU bf16 autocast
    "03.4": _casts_in_the_backward_of_an_autocast_forward_and_loss,
    # 03.5: parameter casts of one forward + loss of exercise_03_5_model (fresh context)
    "03.5": lambda: Judge(_why_not_03_5, "count", "count"),
    # 03.1: a five-step training function with a fresh autocast context per forward pass
    "03.1": lambda: Judge(_why_not_03_1, "function", "train_five_steps"),
    # 03.2: a NearestCentre class whose distances stay right under autocast (a float32 island)
    "03.2": lambda: Judge(_why_not_03_2, "class", "NearestCentre"),
    # 03.3: a float16 + GradScaler training function on logits with BCEWithLogitsLoss
    "03.3": lambda: Judge(_why_not_03_3, "function", "train_detector"),
}

# 03.6's answer, 2**-9 = 0.001953125, is often typed rounded (0.00195); its neighbours 2**-8 and
# 2**-10 are a factor of 2 away, so 1 % tolerance accepts the rounding and nothing else.
TOLERANCES = {"03.6": 0.01}
