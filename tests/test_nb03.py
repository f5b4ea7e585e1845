"""Notebook 03: its scaffolding (helpers.nb03), its exercises' solutions and checks (solutions.nb03).

The fix-the-code exercises 03.1 and 03.3 are checked by running the learner's function: each test runs the
exercise as given and the plausible wrong repairs, and asserts that ``check`` rejects them."""
import contextlib

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import helpers
from helpers import nb03 as lab
from helpers.exercises import solution
from helpers.solutions import nb03 as sol

CPU = torch.device("cpu")


def test_compare_training_starts_from_the_same_loss_and_reports_both_runs():
    runs = lab.compare_training(CPU, torch.bfloat16, examples=64, test_examples=64, epochs=1)
    assert list(runs.logs) == ["float32", "autocast bfloat16"]
    assert all(len(log.losses) == 2 for log in runs.logs.values())          # 64 images, batch 32
    assert runs.first_loss_gap() < torch.finfo(torch.bfloat16).eps          # same weights and batch
    assert 0 <= runs.accuracy_gap() <= 1 and runs.final_loss_gap() >= 0
    assert "test accuracy" in repr(runs)


def test_compare_training_gives_float16_a_scaler():
    runs = lab.compare_training(CPU, torch.float16, examples=32, test_examples=8, epochs=1)
    log = runs.logs["autocast float16"]
    assert log.scales and runs.logs["float32"].scales == [] and "skipped by the scaler" in repr(runs)


def test_03_5_smallest_update_that_changes_two_in_float16():
    expected = helpers.spacing(2.0, torch.float16).item()  # the gap after 2.0; half of it is a tie
    assert expected == 2.0**-9
    assert solution("03.5") == expected
    assert helpers.exercises.grade("03.5", 2.0**-9) is True
    assert helpers.exercises.grade("03.5", 2.0**-10) is False
    assert helpers.exercises.grade("03.5", 0.00195) is True   # rounded as printed: accepted (TOLERANCES)
    assert helpers.exercises.grade("03.5", 2.0**-8) is False


def test_03_6_cdist_runs_in_float32_under_cpu_autocast():
    assert solution("03.6") == torch.float32
    assert helpers.exercises.grade("03.6", torch.float32) is True
    assert helpers.exercises.grade("03.6", torch.bfloat16) is False


def test_03_4_counts_the_casts_of_the_backward_pass():
    # The forward casts the input, 4 convolution weights, the linear weight and bias to bfloat16, and the
    # logits back to float32. Each cast whose source needs a gradient is mirrored in backward: 4 + 2 weight
    # gradients back to float32, and the loss gradient to bfloat16 for the logits; the input needs none.
    assert solution("03.4") == 4 + 2 + 1
    assert helpers.exercises.grade("03.4", 7) is True
    assert helpers.exercises.grade("03.4", 8) is False   # the forward pass's count


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
    for where in ("loop", "nowhere", "step"):
        assert helpers.exercises.grade("03.1", five_steps(where)) is False, where
    assert helpers.exercises.grade("03.1", fixed[-1]) is False  # a number is not an answer any more
    assert helpers.exercises.grade("03.1", sol.train_five_steps) is True
    assert helpers.exercises.grade("03.1", five_steps("step, island")) is True


def test_03_2_distances_under_autocast_are_rejected_and_the_float32_island_accepted():
    class BrokenNearestCentre(sol.NearestCentre):
        def forward(self, x):  # the exercise's broken forward: no island
            c = self.centres
            return -((x * x).sum(1, keepdim=True) + (c * c).sum(1) - 2 * x @ c.T)

    centres, queries = sol.nearest_centre_data()
    exact = torch.cdist(queries.double(), centres.double()).pow(2).min(dim=1).values.median().item()
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        broken = (-BrokenNearestCentre(centres)(queries).max(dim=1).values).median().item()
    assert abs(broken - exact) > exact              # error larger than the distance itself
    assert helpers.exercises.grade("03.2", broken) is False
    fixed = solution("03.2")
    # float32 with |x|^2 ~ 1600 and 16 terms: error ~ eps32 * 1600 * a few, far below 2 % of ~0.16
    assert abs(fixed - exact) < 0.01 * exact
    assert helpers.exercises.grade("03.2", fixed) is True


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
    wrong = {"as given": given,
             "no GradScaler, BCELoss kept": detector(True, nn.BCELoss(), torch.float16, False),
             "bfloat16, BCELoss kept": detector(True, nn.BCELoss(), torch.bfloat16, True),
             "bfloat16, no scaler, BCELoss kept": detector(True, nn.BCELoss(), torch.bfloat16, False),
             "BCEWithLogitsLoss, no scaler": detector(False, nn.BCEWithLogitsLoss(), torch.float16, False),
             "BCEWithLogitsLoss in bfloat16": detector(False, nn.BCEWithLogitsLoss(), torch.bfloat16, True),
             "BCEWithLogitsLoss after the Sigmoid": detector(True, nn.BCEWithLogitsLoss(), torch.float16,
                                                             True)}
    for name, train in wrong.items():
        assert helpers.exercises.grade("03.3", train) is False, name
    assert helpers.exercises.grade("03.3", losses[-1]) is False and helpers.exercises.grade("03.3", fixed[0][-1]) is False
    assert helpers.exercises.grade("03.3", detector(False, nn.BCEWithLogitsLoss(), torch.float16, True)) is True
    assert helpers.exercises.grade("03.3", sol.train_detector) is True


@pytest.mark.parametrize("key", ["03.5", "03.6", "03.4", "03.1", "03.2", "03.3"])
def test_unanswered(key, capsys):
    assert helpers.check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out


def given_function(name: str):
    """The function ``name`` exactly as notebook 03's exercise cell defines it."""
    import ast
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "notebooks" / "03_autocast_training.ipynb"
    for cell in json.loads(path.read_text())["cells"]:
        tree = ast.parse("".join(cell["source"])) if cell["cell_type"] == "code" else None
        for node in tree.body if tree else []:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                namespace = {"torch": torch, "nn": nn, "F": F}
                exec(compile(ast.Module([node], []), path.name, "exec"), namespace)
                return namespace[name]
    raise LookupError(name)


@pytest.mark.parametrize("name, key", [("train_five_steps", "03.1"), ("train_detector", "03.3")])
def test_the_notebook_gives_code_that_check_rejects(name, key):
    assert helpers.exercises.grade(key, given_function(name)) is False
