"""Notebook 03: its scaffolding (helpers.nb03), its exercises' solutions and checks (solutions.nb03).

The fix-the-code exercises (03.1, 03.3: a function; 03.2: a class) are checked by running the learner's code: each
test feeds the exercise as given, the plausible wrong and symptom-hiding repairs, and typed numbers, and asserts the
line ``check`` prints for each; and right repairs written differently from the solution."""
import contextlib

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import helpers
from helpers import nb03 as lab
from helpers.exercises import feedback, solution
from helpers.solutions import nb03 as sol
from tests.support import definitions

CPU = torch.device("cpu")


# Notebook 03 section 4's train_step, as its cell types it (the recipe, taught there)
recipe_step = definitions("03", "train_step", namespace={"torch": torch, "F": F, "device": CPU})["train_step"]


def test_compare_training_starts_from_the_same_loss_and_reports_both_runs():
    runs = lab.compare_training(recipe_step, CPU, torch.bfloat16, examples=64, test_examples=64, epochs=1)
    assert list(runs.logs) == ["float32", "autocast bfloat16"]
    assert all(len(log.losses) == 2 for log in runs.logs.values())          # 64 images, batch 32
    assert runs.first_loss_gap() < torch.finfo(torch.bfloat16).eps          # same weights and batch
    assert 0 <= runs.accuracy_gap() <= 1 and runs.final_loss_gap() >= 0
    assert "test accuracy" in repr(runs)


def test_compare_training_gives_float16_a_scaler():
    runs = lab.compare_training(recipe_step, CPU, torch.float16, examples=32, test_examples=8, epochs=1)
    log = runs.logs["autocast float16"]
    assert log.scales and runs.logs["float32"].scales == [] and "skipped by the scaler" in repr(runs)


def test_compare_training_runs_the_step_it_is_given_with_each_dtype():
    seen = []

    def spy(model, optimizer, scaler, inputs, labels, amp):
        seen.append((amp, scaler is None, inputs.shape[0]))
        return recipe_step(model, optimizer, scaler, inputs, labels, amp)

    lab.compare_training(spy, CPU, torch.float16, examples=48, test_examples=8, epochs=1, batch_size=16)
    assert seen == [(None, True, 16)] * 3 + [(torch.float16, False, 16)] * 3


def test_dtype_counts_counts_each_ops_output_dtypes_in_order_of_first_sight():
    ops = [("convolution", [torch.bfloat16]), ("native_batch_norm", [torch.bfloat16, torch.float32, torch.float32]),
           ("convolution", [torch.bfloat16]), ("detach", [])]
    assert lab.dtype_counts(ops) == {"convolution": "bfloat16 x2", "native_batch_norm": "bfloat16 x1, float32 x2"}
    assert list(lab.dtype_counts(ops)) == ["convolution", "native_batch_norm"]  # order of first sight


class _FakeCudaDevice:
    type = "cuda"


@pytest.mark.parametrize("capability, names", [
    ((8, 0), ["strict float32", "PyTorch's defaults", "full TF32"]),  # Ampere on: TF32 exists
    ((7, 0), ["strict float32"]),  # V100, T4: no TF32, the three are one
])
def test_float32_baselines_on_a_simulated_gpu(monkeypatch, capability, names):
    """Simulated: the GPU branch of 03 §4's baselines (untested on a GPU here)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert list(lab.float32_baselines(_FakeCudaDevice())) == names


def test_float32_baselines_set_the_tf32_switches_they_name(monkeypatch):
    assert list(lab.float32_baselines(CPU)) == ["strict float32"]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    baselines = lab.float32_baselines(_FakeCudaDevice())
    with baselines["full TF32"]():
        assert torch.get_float32_matmul_precision() == "high"
        assert "TF32 matmuls True, TF32 cuDNN True" == lab.tf32_in_effect()
    with baselines["strict float32"]():
        assert "TF32 matmuls False, TF32 cuDNN False" == lab.tf32_in_effect()
    assert torch.get_float32_matmul_precision() == "highest"  # restored
    assert not hasattr(lab, "rule_agreement")


def test_03_6_smallest_update_that_changes_two_in_float16():
    expected = helpers.spacing(2.0, torch.float16).item()  # the gap after 2.0; half of it is a tie
    assert expected == 2.0**-9
    assert solution("03.6") == expected
    assert helpers.exercises.grade("03.6", 2.0**-9) is True
    assert helpers.exercises.grade("03.6", 2.0**-10) is False
    assert helpers.exercises.grade("03.6", 0.00195) is True   # rounded as printed: accepted (TOLERANCES)
    assert helpers.exercises.grade("03.6", 2.0**-8) is False


def test_03_7_cdist_runs_in_float32_under_cpu_autocast():
    assert solution("03.7") == torch.float32
    assert helpers.exercises.grade("03.7", torch.float32) is True
    assert helpers.exercises.grade("03.7", torch.bfloat16) is False


def test_03_4_counts_the_casts_of_the_backward_pass():
    # The forward casts the input, 4 convolution weights, the linear weight and bias to bfloat16, and the
    # logits back to float32. Each cast whose source needs a gradient is mirrored in backward: 4 + 2 weight
    # gradients back to float32, and the loss gradient to bfloat16 for the logits; the input needs none.
    assert solution("03.4") == 4 + 2 + 1
    assert helpers.exercises.grade("03.4", 7) is True
    assert helpers.exercises.grade("03.4", 8) is False   # the forward pass's count


@pytest.mark.parametrize("key, answer", [("03.4", 7), ("03.4", 8), ("03.5", 5), ("03.5", 9), ("03.7", torch.float32)])
def test_number_checks_leave_the_learners_generator_alone(key, answer):
    torch.manual_seed(1234)
    state = torch.random.get_rng_state()
    helpers.exercises.grade(key, answer)
    assert torch.equal(torch.random.get_rng_state(), state)


class ParameterCastCounter(TorchDispatchMode):
    """A learner's dispatch mode as notebook 03 section 3 teaches it: casts whose source is a Parameter."""

    def __init__(self, count_to=True):
        super().__init__()
        self.names = ("_to_copy", "to") if count_to else ("_to_copy",)
        self.parameter_casts = self.casts = self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if func.overloadpacket.__name__ in self.names:
            self.casts += 1
            self.parameter_casts += isinstance(args[0], nn.Parameter)
        return out


def learner_counts(grad_mode=torch.enable_grad, count_to=True, calls=1):
    """What the learner's counter gives for 03.5's model, the model built as the exercise cell builds it."""
    torch.manual_seed(0)
    model = sol.exercise_03_5_model()
    tokens, labels = torch.tensor([1, 4, 9, 2]), torch.tensor([0, 1, 2, 3])
    with grad_mode(), torch.amp.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(calls):
            counter = ParameterCastCounter(count_to)
            with counter:
                F.cross_entropy(model(tokens), labels)
    return counter


def test_03_5_parameter_casts_of_one_forward_are_accepted():
    # 2 (first linear) + 2 (the shared layer, cached after its first use) + 1 (bias-free output); none for
    # the embedding: embedding is on no CPU autocast list.
    assert learner_counts().parameter_casts == 5
    assert feedback("03.5", 5) is None
    assert feedback("03.5", torch.tensor(5)) is None
    assert feedback("03.5", learner_counts(torch.no_grad).parameter_casts) is None  # no_grad caches too


def test_03_5_plausible_wrong_counts_are_named():
    every_cast = learner_counts().casts                                        # activations too
    second = learner_counts(calls=2)                                           # same context: cached
    inference = learner_counts(torch.inference_mode)                           # no cache; casts are `to`
    inference_to_copy_only = learner_counts(torch.inference_mode, count_to=False)
    ops = learner_counts().ops
    parameters = len(list(sol.exercise_03_5_model().parameters()))
    named = [
        (every_cast, "that counts every cast, activations too"),
        (parameters, "that is the number of parameter tensors, not of casts"),
        (second.parameter_casts, "that is a second forward in the same context"),
        (inference_to_copy_only.parameter_casts, "that is a second forward in the same context"),
        (second.casts, "that counts a second forward in the same context"),
        (inference.parameter_casts, "that is the count under inference_mode"),
        (inference.casts, "that counts every cast under inference_mode"),
        (ops, "that counts every op the forward ran, not only the casts"),
        (ops - every_cast, "that counts the ops that are not casts"),
    ]
    assert (every_cast, parameters, second.parameter_casts) == (7, 6, 0)
    # torch 2.4.1 counts the inference_mode casts as with grad (5, 7); later releases differently (9, 11)
    assert inference.parameter_casts in (5, 9)
    expected = {}
    for answer, start in named:  # where two mistakes give one count, the first named is the feedback
        if answer != 5:
            expected.setdefault(answer, start)
    assert len(expected) >= 6  # the wrong counts this release tells apart
    for answer, start in expected.items():
        assert feedback("03.5", answer).startswith(start), answer


def test_03_5_the_notebook_builds_the_model_the_check_counts():
    from tests.support import cell_containing

    namespace = {"torch": torch, "nn": nn}
    exec(cell_containing("03", "model_5 = "), namespace)
    with torch.random.fork_rng(devices=[]):
        assert repr(namespace["model_5"]) == repr(sol.exercise_03_5_model())
    assert namespace["answer_5"] is None
    torch.manual_seed(0)
    model = sol.exercise_03_5_model()
    for mine, theirs in zip(model.state_dict().values(), namespace["model_5"].state_dict().values()):
        assert torch.equal(mine, theirs)


def test_03_5_other_numbers_and_types_are_told_apart():
    assert feedback("03.5", 4) == "that is not the number of parameter casts of one forward pass (the hint may help)"
    assert feedback("03.5", 5.0) == "the answer should be an int (a count), not float"
    assert feedback("03.5", True) == "the answer should be an int (a count), not bool"
    assert feedback("03.5", "5") == "the answer should be an int (a count), not str"


def autocast_if(on: bool):
    return torch.amp.autocast("cpu", dtype=torch.bfloat16) if on else contextlib.nullcontext()


def five_steps(where: str):
    """03.1's function with autocast where a learner might put it: around the "loop" (as given),
    "nowhere" (deleted), around each "step" (backward and optimizer step inside), or "step, island"
    (backward and step in an ``enabled=False`` island: right too)."""
    def train(net, sgd, data, classes):
        losses = []
        with autocast_if(where == "loop"):
            for _ in range(5):
                sgd.zero_grad()
                with autocast_if(where.startswith("step")):
                    loss = F.cross_entropy(net(data), classes)
                    island = torch.amp.autocast("cpu", enabled=False)
                    with island if "island" in where else contextlib.nullcontext():
                        loss.backward()
                        sgd.step()
                losses.append(loss.item())
        return losses
    return train


def test_03_1_the_wrong_repairs_are_rejected_and_the_fix_accepted():
    seen, frozen = sol.trace_03_1(five_steps("loop"))
    assert len(set(frozen)) == 1                 # every forward reuses the cached bfloat16 weights
    assert ("step", True) in seen
    _, fixed = sol.trace_03_1(sol.train_five_steps)
    assert fixed[-1] < frozen[-1] * 0.95         # the fixed loop learns
    _, plain = sol.trace_03_1(five_steps("nowhere"))
    assert abs(plain[-1] - fixed[-1]) < 1e-3 * fixed[-1]  # a loss alone cannot tell float32 apart
    wrong = {"loop": "backward ran inside the autocast context",
             "nowhere": "a forward pass ran without bfloat16 autocast",
             "step": "backward ran inside the autocast context"}
    for where, reason in wrong.items():
        assert feedback("03.1", five_steps(where)) == reason, where
    for number in (fixed[-1], torch.tensor(fixed[-1]), fixed):
        assert feedback("03.1", number) == "the answer should be your repaired function train_five_steps itself"
    assert feedback("03.1", sol.train_five_steps) is None
    assert feedback("03.1", five_steps("step, island")) is None  # backward and step in an island: right too


def _loss_outside(to_float: bool):
    """03.1 with only the forward pass under autocast: the loss on the bfloat16 logits (or on their float32 copy)."""
    def train(net, sgd, data, classes):
        losses = []
        for _ in range(5):
            sgd.zero_grad()
            with torch.amp.autocast("cpu", dtype=torch.bfloat16):
                logits = net(data)
            loss = F.cross_entropy(logits.float() if to_float else logits, classes)
            loss.backward()
            sgd.step()
            losses.append(loss.item())
        return losses
    return train


def test_03_1_a_loss_computed_outside_autocast_is_named_not_called_a_model_that_does_not_learn():
    reason = feedback("03.1", _loss_outside(to_float=False))
    assert reason is not None and "loss was computed outside autocast" in reason and "learn" not in reason
    assert feedback("03.1", _loss_outside(to_float=True)) is None  # cross_entropy in float32, as autocast runs it


def test_03_1_a_function_that_steps_inside_autocast_or_forgets_the_losses_is_named():
    def steps_inside(net, sgd, data, classes):
        losses = []
        for _ in range(5):
            sgd.zero_grad()
            with torch.amp.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(net(data), classes)
            loss.backward()
            with torch.amp.autocast("cpu", dtype=torch.bfloat16):
                sgd.step()
            losses.append(loss.item())
        return losses

    def no_losses(net, sgd, data, classes):
        sol.train_five_steps(net, sgd, data, classes)
        return [0.0] * 5

    def swallowed(net, sgd, data, classes):  # the broken loop, its error hidden by try/except
        try:
            return given_function("train_five_steps")(net, sgd, data, classes)
        except Exception:  # noqa: BLE001
            return []

    assert feedback("03.1", steps_inside) == "the optimizer stepped inside the autocast context (its casts stay cached)"
    assert feedback("03.1", no_losses) == "it does not return the five losses of a model that learns"
    assert feedback("03.1", swallowed) == "backward ran inside the autocast context"


class BrokenNearestCentre(sol.NearestCentre):
    def forward(self, x):  # the exercise's broken forward: no island
        c = self.centres
        return -((x * x).sum(1, keepdim=True) + (c * c).sum(1) - 2 * x @ c.T)


def centre_variant(forward):
    return type("Variant", (sol.NearestCentre,), {"forward": forward})


def _island(x, c, dtype=torch.float32, device_type=None):
    with torch.amp.autocast(device_type or x.device.type, enabled=False):
        x, c = x.to(dtype), c.to(dtype)
        return -((x * x).sum(1, keepdim=True) + (c * c).sum(1) - 2 * x @ c.T)


def _island_as_is(layer, x):  # autocast off, inputs left as they come: bfloat16 queries meet float32 centres
    with torch.amp.autocast(x.device.type, enabled=False):
        return BrokenNearestCentre.forward(layer, x)


WRONG_03_2 = {
    "as given": (BrokenNearestCentre, "under autocast the matmul still runs in bfloat16"),
    "the result cast to float32": (centre_variant(lambda self, x: BrokenNearestCentre.forward(self, x).float()),
                                   "under autocast the matmul still runs in bfloat16"),
    "nan_to_num of the result": (centre_variant(lambda self, x: torch.nan_to_num(BrokenNearestCentre.forward(self, x))),
                                 "under autocast the matmul still runs in bfloat16"),
    "an island in the input's dtype": (centre_variant(lambda self, x: _island(x, self.centres, dtype=x.dtype)),
                                       "under autocast its scores are bfloat16, not the island's float32"),
    "an island without .float()": (centre_variant(lambda self, x: _island_as_is(self, x)),
                                   "running your code raised RuntimeError"),
    "an island for CUDA (hard-coded device)": (centre_variant(lambda self, x: _island(x, self.centres,
                                                                                     device_type="cuda")),
                                               "under autocast the matmul still runs in bfloat16"),
    "float64 hard-coded": (centre_variant(lambda self, x: _island(x, self.centres, dtype=torch.float64)),
                           "under autocast its scores are float64, not the island's float32"),
    "centres detached": (centre_variant(lambda self, x: _island(x, self.centres.detach())),
                         "no gradient reaches the centres (they were detached)"),
}


@pytest.mark.parametrize("name", WRONG_03_2)
def test_03_2_wrong_repairs_fail_with_the_condition_they_break(name):
    answer, reason = WRONG_03_2[name]
    assert feedback("03.2", answer).startswith(reason)


def test_03_2_numbers_from_section_5_and_the_cell_without_autocast_do_not_pass():
    g = torch.Generator().manual_seed(0)
    points = 10 + torch.randn(256, 16, generator=g)  # section 5's data
    queries = points + 0.1 * torch.randn(256, 16, generator=g)
    exact = (points - queries).double().pow(2).sum(1)
    with torch.no_grad():
        unrepaired = (-BrokenNearestCentre(points)(queries).max(dim=1).values).median()  # autocast deleted
    for typed in (exact.median().item(), exact.median(), unrepaired, unrepaired.item(), 0.156):
        assert feedback("03.2", typed) == "the answer should be your repaired class NearestCentre itself"
    assert feedback("03.2", BrokenNearestCentre(points)) == (
        "the answer should be your repaired class NearestCentre itself")  # an instance, not the class


def test_03_2_right_repairs_written_differently_pass():
    right = [sol.NearestCentre,
             centre_variant(lambda self, x: _island(x, self.centres)),
             centre_variant(lambda self, x: -(x.float()[:, None] - self.centres.float()[None]).pow(2).sum(-1)),
             centre_variant(lambda self, x: -torch.cdist(x.float(), self.centres.float()).pow(2))]
    for answer in right:
        assert feedback("03.2", answer) is None


def test_03_2_the_given_class_is_rejected():
    assert feedback("03.2", given_class("NearestCentre")) == "under autocast the matmul still runs in bfloat16"


def detector(sigmoid: bool, loss_fn: nn.Module, dtype: torch.dtype, use_scaler: bool):
    """03.3's training function, with the choices a learner might make."""
    def train(features, is_positive, grad_scaler, steps=20):
        torch.manual_seed(0)
        layers = [nn.Linear(16, 1)] + ([nn.Sigmoid()] if sigmoid else [])
        classifier = nn.Sequential(*layers)
        nn.init.constant_(classifier[0].bias, -6.9)
        sgd = torch.optim.SGD(classifier.parameters(), lr=0.1)
        losses = []
        for _ in range(steps):
            sgd.zero_grad()
            with torch.amp.autocast("cpu", dtype=dtype):
                loss = loss_fn(classifier(features).squeeze(1), is_positive)
            losses.append(loss.item())
            if not use_scaler:
                loss.backward()
                sgd.step()
                continue
            grad_scaler.scale(loss).backward()
            grad_scaler.step(sgd)
            grad_scaler.update()
        return losses
    return train


def test_03_3_the_wrong_repairs_are_rejected_and_the_fix_accepted():
    given = detector(True, nn.BCELoss(), torch.float16, use_scaler=True)
    losses, ops, linear, updates, scale = sol.trace_03_3(given)
    assert "binary_cross_entropy" in ops and scale < 2.0**16 and updates == 20  # the scaler skipped steps
    fixed = sol.trace_03_3(sol.train_detector)
    assert fixed[4] == 2.0**16 and fixed[2] == {(torch.float16,)}              # no skip, float16 linear
    bce = "the loss is still BCELoss (binary_cross_entropy on probabilities)"
    wrong = {"as given": (given, bce),
             "no GradScaler, BCELoss kept": (detector(True, nn.BCELoss(), torch.float16, False), bce),
             "bfloat16, BCELoss kept": (detector(True, nn.BCELoss(), torch.bfloat16, True), bce),
             "BCEWithLogitsLoss, no scaler": (detector(False, nn.BCEWithLogitsLoss(), torch.float16, False),
                                              "0 of the 20 steps went through scaler.update()"),
             "BCEWithLogitsLoss in bfloat16": (detector(False, nn.BCEWithLogitsLoss(), torch.bfloat16, True),
                                               "the linear layer did not run in float16 (float16 autocast)"),
             "BCEWithLogitsLoss after the Sigmoid": (detector(True, nn.BCEWithLogitsLoss(), torch.float16, True),
                                                     "a sigmoid still runs before the loss: BCEWithLogitsLoss "
                                                     "takes the logits")}
    for name, (train, reason) in wrong.items():
        assert feedback("03.3", train) == reason, name
    for number in (losses[-1], fixed[0][-1], torch.tensor(fixed[0][-1])):
        assert feedback("03.3", number) == "the answer should be your repaired function train_detector itself"
    assert feedback("03.3", detector(False, nn.BCEWithLogitsLoss(), torch.float16, True)) is None
    assert feedback("03.3", sol.train_detector) is None


def test_03_3_clamped_probabilities_and_an_autocast_off_loss_are_named():
    def clamped(features, is_positive, grad_scaler, steps=20):  # symptom hiding: BCELoss on clamped p
        return detector_with(lambda logits: nn.BCELoss()(torch.sigmoid(logits).clamp(1e-3, 1 - 1e-3), is_positive),
                             features, grad_scaler, steps)

    def no_autocast(features, is_positive, grad_scaler, steps=20):  # autocast disabled: float32 linear
        return detector_with(lambda logits: nn.BCEWithLogitsLoss()(logits, is_positive), features, grad_scaler,
                             steps, autocast=False)

    assert feedback("03.3", clamped) == "the loss is still BCELoss (binary_cross_entropy on probabilities)"
    assert feedback("03.3", no_autocast) == "the linear layer did not run in float16 (float16 autocast)"


def detector_with(loss_of, features, grad_scaler, steps, autocast=True):
    torch.manual_seed(0)
    classifier = nn.Linear(16, 1)
    nn.init.constant_(classifier.bias, -6.9)
    sgd = torch.optim.SGD(classifier.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        sgd.zero_grad()
        with torch.amp.autocast("cpu", dtype=torch.float16, enabled=autocast):
            loss = loss_of(classifier(features).squeeze(1))
        grad_scaler.scale(loss).backward()
        grad_scaler.step(sgd)
        grad_scaler.update()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("key", ["03.5", "03.6", "03.7", "03.4", "03.1", "03.2", "03.3"])
def test_unanswered(key, capsys):
    assert helpers.check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out


def given_class(name: str):
    return given_function(name)


def given_function(name: str):
    """The function or class ``name`` exactly as notebook 03's exercise cell defines it."""
    from tests.support import definitions

    return definitions("03", name, namespace={"torch": torch, "nn": nn, "F": F})[name]


@pytest.mark.parametrize("name, key", [("train_five_steps", "03.1"), ("train_detector", "03.3")])
def test_the_notebook_gives_code_that_check_rejects(name, key):
    assert helpers.exercises.grade(key, given_function(name)) is False
