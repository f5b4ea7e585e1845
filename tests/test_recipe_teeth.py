"""Tests that fail when the course's recipe is subtly broken (issue 12): gradients reaching the optimizer at the
wrong scale, skipped steps not counted (or the scheduler stepped anyway), and a checkpoint loader that would
unpickle arbitrary objects; for ``helpers.train`` and for the take-home recipe (notebooks/take_home_recipe.py,
with mutants of it that must be caught). Each test compares with an independent reference (a plain float32 step,
a scale sequence worked out by hand, a file that records whether foreign code ran)."""
from __future__ import annotations

import contextlib
import copy
import pickle
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import helpers
from helpers.training import skipped_by_scaler

LR = 0.5
EPS32 = torch.finfo(torch.float32).eps


def small_problem(seed: int = 0, n: int = 32, features: int = 16, classes: int = 4):
    """A seeded linear classifier and one batch: small enough that float16 emulation costs nothing."""
    generator = torch.Generator().manual_seed(seed)
    model = nn.Linear(features, classes)
    with torch.no_grad():
        model.weight.copy_(torch.randn(classes, features, generator=generator) * 0.3)
        model.bias.copy_(torch.randn(classes, generator=generator) * 0.1)
    inputs = torch.randn(n, features, generator=generator)
    labels = torch.randint(0, classes, (n,), generator=generator)
    return model, inputs, labels


def updates(model: nn.Module, steps: int, inputs, labels, **amp_step_kwargs) -> torch.Tensor:
    """The change of every parameter after ``steps`` calls of ``helpers.amp_step`` (SGD, lr=LR), flattened.

    Also checks what every step returns: float32 master weights, logits in the autocast dtype, a float32 loss.
    """
    model = copy.deepcopy(model)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(steps):
        loss, logits = helpers.amp_step(model, inputs, labels, optimizer, **amp_step_kwargs)
        assert logits.dtype == (amp_step_kwargs.get("amp_dtype") or torch.float32)
        assert loss.dtype == torch.float32 and all(p.dtype == torch.float32 for p in model.parameters())
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - before


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("steps", [1, 2])
def test_a_scaled_float32_step_updates_exactly_like_a_plain_float32_step(steps):
    """A GradScaler multiplies the loss by 2**16 and divides the gradients by it again: in float32 both are exact
    (powers of two), so the update equals the plain step's to rounding. A loss scaled twice, or gradients that
    reach the optimizer still scaled, are off by a factor of 65536."""
    model, inputs, labels = small_problem()
    plain = updates(model, steps, inputs, labels)
    scaler = torch.amp.GradScaler("cpu")
    scaled = updates(model, steps, inputs, labels, scaler=scaler)
    assert scaler.get_scale() == 2.0**16  # no step was skipped, so the comparison is meaningful
    n = inputs.shape[0]
    # the two runs differ only by exact power-of-two scaling; allow a few float32 roundings per summed term
    assert relative_error(scaled, plain) <= 8 * EPS32 * n


@pytest.mark.parametrize("steps", [1, 2])
def test_a_float16_autocast_step_with_a_scaler_matches_float32_to_float16_precision(steps):
    model, inputs, labels = small_problem()
    plain = updates(model, steps, inputs, labels)
    scaled = updates(model, steps, inputs, labels, amp_dtype=torch.float16,
                     scaler=helpers.make_scaler("cpu", torch.float16))
    # inputs and weights are rounded to float16 (relative error 2**-11 each) before the matmul, the logits after
    # it: a few roundings (measured: 3e-4); a factor 65536 (or 0, or 2) is far outside, bfloat16's error too
    assert relative_error(scaled, plain) <= 4 * torch.finfo(torch.float16).eps


@pytest.mark.parametrize("steps", [1, 2])
def test_a_bfloat16_autocast_step_matches_float32_to_bfloat16_precision(steps):
    model, inputs, labels = small_problem()
    plain = updates(model, steps, inputs, labels)
    low = updates(model, steps, inputs, labels, amp_dtype=torch.bfloat16)
    assert relative_error(low, plain) <= 4 * torch.finfo(torch.bfloat16).eps  # 8 significant bits; measured 4e-3


def test_amp_step_zeroes_gradients_and_leaves_them_unscaled_for_the_next_step():
    """After ``scaler.step`` the ``.grad`` the optimizer used are the true (unscaled) gradients of this batch."""
    model, inputs, labels = small_problem()
    reference = copy.deepcopy(model)
    nn.functional.cross_entropy(reference(inputs), labels).backward()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, the grads are kept
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(2):  # a second step must not accumulate onto the first one's gradients
        helpers.amp_step(model, inputs, labels, optimizer, scaler=scaler)
    for got, want in zip(model.parameters(), reference.parameters()):
        assert relative_error(got.grad, want.grad) <= 8 * EPS32 * inputs.shape[0]


INF_BATCHES = (0, 3, 4)  # the first step is one of them: the scheduler must not be stepped before the optimizer


def batches_with_injected_infs(count: int = 8, bad: tuple[int, ...] = INF_BATCHES):
    _, inputs, labels = small_problem()
    batches = []
    for index in range(count):
        x = inputs.clone()
        if index in bad:
            x[index % len(x), 0] = float("inf")  # one inf input -> inf/NaN logits, loss and gradients
        batches.append((x, labels))
    return batches


def expected_scales(init: float, bad: tuple[int, ...], count: int) -> list[float]:
    """GradScaler's documented rule with growth_interval=1: halve after a skipped step, double after a clean one."""
    scales, scale = [], init
    for index in range(count):
        scale = scale * 0.5 if index in bad else scale * 2.0
        scales.append(scale)
    return scales


def test_train_counts_skipped_steps_exactly_and_steps_the_scheduler_only_after_real_updates():
    model, _, _ = small_problem()
    batches = batches_with_injected_infs()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = helpers.make_scaler("cpu", torch.float16, init_scale=2.0**8, growth_interval=1)
    weights = []
    model.register_forward_pre_hook(lambda module, args: weights.append(module.weight.detach().clone()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log = helpers.train(model, batches, optimizer, amp_dtype=torch.float16, scaler=scaler, scheduler=scheduler)
    clean = len(batches) - len(INF_BATCHES)
    assert log.skipped_steps == len(INF_BATCHES)
    assert log.scales == expected_scales(2.0**8, INF_BATCHES, len(batches))  # grows on clean steps: not skips
    assert log.scheduler_steps == clean and scheduler.last_epoch == clean
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**clean, rel=1e-12)
    assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]  # the order warning of notebook 04
    weights.append(model.weight.detach().clone())
    for index in range(len(batches)):  # a skipped step leaves the weights bit-for-bit; a clean one moves them
        assert torch.equal(weights[index], weights[index + 1]) == (index in INF_BATCHES)


def test_train_without_a_scaler_steps_the_scheduler_every_step():
    model, _, _ = small_problem()
    batches = batches_with_injected_infs(bad=())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    log = helpers.train(model, batches, optimizer, scheduler=scheduler, max_steps=5)
    assert log.skipped_steps == 0 and log.scheduler_steps == 5 and scheduler.last_epoch == 5
    assert len(log.losses) == 5


@pytest.mark.parametrize(("before", "after", "skipped"), [
    (2.0**16, 2.0**15, True),    # backed off: skipped
    (2.0**16, 2.0**16, False),   # clean, growth interval not reached
    (2.0**16, 2.0**17, False),   # clean, and the scale grew on this very step
    (2.0**-149, 0.0, True),
])
def test_skipped_by_scaler_reads_a_lower_scale_as_a_skip(before, after, skipped):
    assert skipped_by_scaler(before, after) is skipped


class LeavesATrace:
    """Unpickling this calls ``Path.touch``: a stand-in for arbitrary code that a checkpoint file could run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_checkpoint_loader_reads_a_plain_state_dict(tmp_path):
    torch.manual_seed(1)
    saved = helpers.ShapesCNN()
    path = tmp_path / "weights.pt"
    torch.save(saved.state_dict(), path)
    loaded = helpers.load_reference_model(path)
    assert not loaded.training
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), loaded.state_dict().values()))


def test_checkpoint_loader_refuses_a_pickled_object_and_runs_none_of_its_code(tmp_path):
    marker = tmp_path / "foreign code ran"
    state = helpers.ShapesCNN().state_dict()
    path = tmp_path / "weights.pt"
    torch.save({**state, "extra": LeavesATrace(marker)}, path)
    with pytest.raises(pickle.UnpicklingError):  # torch.load(..., weights_only=True) refuses the class
        helpers.load_reference_model(path)
    assert not marker.exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, None])
def test_make_scaler_refuses_every_dtype_but_float16(dtype):
    with pytest.raises(ValueError, match="No GradScaler is needed"):
        helpers.make_scaler("cpu", dtype)
    assert isinstance(helpers.make_scaler("cpu", torch.float16), torch.amp.GradScaler)


def test_evaluate_in_chunks_sees_every_image_once():
    model = helpers.load_reference_model()
    dataset = helpers.shapes_dataset("test", n=10)
    whole = helpers.evaluate(model, dataset, batch_size=10)
    chunked = helpers.evaluate(model, dataset, batch_size=3)  # 3 + 3 + 3 + 1
    assert chunked.logits.shape == whole.logits.shape == (10, len(helpers.CLASSES))
    # another batch size may pick other conv kernels: equal to float32 rounding over the largest reduction
    # (64 channels x 3 x 3 = 576 terms), relative to the largest logit
    tolerance = 576 * EPS32 * whole.logits.abs().max().item()
    torch.testing.assert_close(chunked.logits, whole.logits, rtol=0, atol=tolerance)


# ---- The take-home recipe (notebooks/take_home_recipe.py), which replaced notebook 07 §6's recipe cell: its
# training step, checkpoint and inference are checked against independent references, and each mutant below (a
# mistake the recipe exists to prevent) must make :func:`take_home_problems` report something.

TAKE_HOME = Path(__file__).resolve().parent.parent / "notebooks" / "take_home_recipe.py"
CPU = torch.device("cpu")


def load_take_home(source: str | None = None):
    """The recipe as a module, from its file or from a (mutated) copy of its source."""
    import types

    module = types.ModuleType("take_home_recipe")
    module.__file__ = str(TAKE_HOME)
    exec(compile(source if source is not None else TAKE_HOME.read_text(), str(TAKE_HOME), "exec"), module.__dict__)
    return module


class SharedList(list):
    """A list that a deep copy of its module shares (predict runs a copy of the model)."""

    def __deepcopy__(self, memo):
        return self


class Recorder(nn.Module):
    """A linear classifier that records the dtype it computed in and whether it ran in training mode."""

    def __init__(self):
        super().__init__()
        self.model, _, _ = small_problem()
        self.seen: list[tuple[torch.dtype, bool]] = SharedList()

    def forward(self, x):
        out = self.model(x)
        self.seen.append((out.dtype, self.training))
        return out


def reference_step(model: nn.Module, inputs, labels, max_norm: float) -> torch.Tensor:
    """One plain float32 SGD step with clipping of the true gradients: the update, flattened."""
    model = copy.deepcopy(model)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    nn.functional.cross_entropy(model(inputs), labels).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - before


def take_home_problems(recipe) -> list[str]:
    """What is wrong with the recipe's train_one_epoch, checkpoint and predict (empty: nothing found)."""
    problems = []
    fp16 = recipe.Advice(torch.float16, "autocast + GradScaler", "test")
    model, inputs, labels = small_problem()
    with torch.no_grad():
        model.weight.mul_(20)  # large gradients: clipping to norm 1 is active, on the true gradients only
    want = reference_step(model, inputs, labels, max_norm=1.0)
    for steps in (1, 2):  # the second batch must not add to the first one's gradients
        recorder = Recorder()
        recorder.model = copy.deepcopy(model)
        recorder.eval()
        before = torch.cat([p.detach().flatten().clone() for p in recorder.parameters()])
        scaler = torch.amp.GradScaler("cpu")
        optimizer = torch.optim.SGD(recorder.parameters(), lr=LR)
        recipe.train_one_epoch(recorder, [(inputs, labels)] * steps, optimizer, scaler, fp16, CPU)
        got = torch.cat([p.detach().flatten() for p in recorder.parameters()]) - before
        if steps == 1 and not relative_error(got, want) <= 4 * torch.finfo(torch.float16).eps:
            problems.append(f"an fp16 step with clipping differs from float32's: {relative_error(got, want):.2e}")
        if steps == 2 and not relative_error(got, want * 2) <= 0.1:
            problems.append("two steps on one batch do not move the weights twice as far (gradients kept?)")
        if {seen for seen in recorder.seen} != {(torch.float16, True)}:
            problems.append(f"the forward pass ran as {set(recorder.seen)}, not float16 in training mode")
        if scaler.get_scale() != 2.0**16:
            problems.append(f"the scale changed to {scaler.get_scale()} on clean steps (update missing?)")

    recorder = Recorder()  # gradient norm 0.94: clipping to norm 1 leaves it alone
    optimizer = torch.optim.SGD(recorder.parameters(), lr=0.0)  # lr 0: every step sees the same gradients
    float32 = recipe.Advice(torch.float32, "float32", "test")  # (with a scaler, unscale_ hides stale gradients)
    recipe.train_one_epoch(recorder, [(inputs, labels)] * 2, optimizer, torch.amp.GradScaler("cpu", enabled=False),
                           float32, CPU)
    reference, _, _ = small_problem()
    nn.functional.cross_entropy(reference(inputs), labels).backward()
    got = torch.cat([p.grad.flatten() for p in recorder.parameters()])
    want_grad = torch.cat([p.grad.flatten() for p in reference.parameters()])
    if not relative_error(got, want_grad) <= 8 * EPS32 * inputs.shape[0]:
        problems.append("after two steps the gradients are not the last batch's alone (zero_grad missing?)")

    bad = inputs.clone()
    bad[0, 0] = float("inf")
    recorder = Recorder()
    scaler = torch.amp.GradScaler("cpu")
    before = [p.detach().clone() for p in recorder.parameters()]
    recipe.train_one_epoch(recorder, [(bad, labels)], torch.optim.SGD(recorder.parameters(), lr=LR), scaler, fp16,
                           CPU)
    if not all(torch.equal(a, b) for a, b in zip(before, recorder.parameters())) or scaler.get_scale() != 2.0**15:
        problems.append("an overflowing step was not skipped with the scale halved")

    folder = Path(tempfile.mkdtemp())
    recorder = Recorder()
    optimizer = torch.optim.SGD(recorder.parameters(), lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    recipe.train_one_epoch(recorder, [(inputs, labels)] * 3, optimizer, scaler, fp16, CPU)
    recipe.save_checkpoint(folder / "c.pt", recorder, optimizer, scaler, fp16)
    restored = Recorder()
    restored_scaler = recipe.load_checkpoint(folder / "c.pt", restored, torch.optim.SGD(restored.parameters(), lr=LR),
                                             fp16, CPU)
    if restored_scaler.state_dict() != scaler.state_dict():
        problems.append(f"the scaler came back as {restored_scaler.state_dict()}, saved {scaler.state_dict()}")
    if not all(torch.equal(a, b) for a, b in zip(recorder.state_dict().values(), restored.state_dict().values())):
        problems.append("the model's weights did not come back")
    problems += changed_precision_problems(recipe, folder)
    marker = folder / "foreign code ran"
    torch.save({"model": restored.state_dict(), "extra": LeavesATrace(marker)}, folder / "evil.pt")
    try:
        recipe.load_checkpoint(folder / "evil.pt", restored, torch.optim.SGD(restored.parameters(), lr=LR), fp16, CPU)
    except pickle.UnpicklingError:
        pass  # refused, as it should be
    except KeyError:
        pass  # unpickled (the marker tells), then failed on the missing optimizer state
    if marker.exists():
        problems.append("loading a checkpoint ran code from the file (weights_only=True missing)")
    problems += loop_problems(recipe, inputs, labels)

    for how, dtype in (("16-bit weights", torch.bfloat16), ("autocast", torch.bfloat16), ("float32", torch.float32)):
        recorder = Recorder()
        recorder.train()
        advice = recipe.Advice(dtype, how, "test")
        logits = recipe.predict(recipe.deployed(recorder, advice), inputs, advice, CPU)
        if recorder.training or recorder.seen[-1] != (dtype, False):
            problems.append(f"predict ({how}) ran as {recorder.seen[-1]}, not {dtype} in eval mode")
        if logits.dtype != torch.float32:
            problems.append(f"predict ({how}) returned {logits.dtype} logits")
    return problems


def changed_precision_problems(recipe, folder: Path) -> list[str]:
    """A checkpoint saved under bf16 (scaler off) and resumed under fp16 + GradScaler: refused; allowed, it warns
    and returns an enabled scaler (its stored, disabled state loaded first: load_state_dict({}) would raise)."""
    problems = []
    bf16 = recipe.Advice(torch.bfloat16, "autocast", "test")
    fp16 = recipe.Advice(torch.float16, "autocast + GradScaler", "test")
    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    recipe.save_checkpoint(folder / "bf16.pt", model, optimizer, recipe.make_scaler(bf16.how, CPU), bf16)
    try:
        recipe.load_checkpoint(folder / "bf16.pt", Recorder(), optimizer, fp16, CPU)
        problems.append("a checkpoint trained in bf16 was resumed under fp16 without a word")
    except ValueError as error:
        if "autocast (torch.bfloat16)" not in str(error) or "--allow-precision-change" not in str(error):
            problems.append(f"the refusal does not say what changed and how to go on: {error}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler = recipe.load_checkpoint(folder / "bf16.pt", Recorder(), optimizer, fp16, CPU, allow_change=True)
    if not scaler.is_enabled() or scaler.get_scale() != 2.0**16:
        problems.append("resumed under fp16, the scaler is not a fresh enabled one")
    if not [w for w in caught if "--allow-precision-change" in str(w.message)]:
        problems.append("an allowed precision change did not warn")
    return problems


def loop_problems(recipe, inputs, labels) -> list[str]:
    """The loop's named clipping norm, its loss read every LOG_EVERY steps, the scheduler after real steps only,
    and no autocast context at all when autocast is off (torch 2.4 raises on autocast("mps", enabled=False))."""
    problems = []
    float32 = recipe.Advice(torch.float32, "float32", "test")
    model, _, _ = small_problem()
    with torch.no_grad():
        model.weight.mul_(20)  # large gradients: clipping would change the step
    for max_norm in (None, 0.5):  # 0.5: not the default, so the parameter must reach the clip
        want = reference_step(model, inputs, labels, max_norm=max_norm or float("inf"))
        trained = copy.deepcopy(model)
        before = torch.cat([p.detach().flatten().clone() for p in trained.parameters()])
        recipe.train_one_epoch(trained, [(inputs, labels)], torch.optim.SGD(trained.parameters(), lr=LR),
                               torch.amp.GradScaler("cpu", enabled=False), float32, CPU, max_grad_norm=max_norm)
        got = torch.cat([p.detach().flatten() for p in trained.parameters()]) - before
        if not relative_error(got, want) <= 8 * EPS32 * inputs.shape[0]:
            problems.append(f"max_grad_norm={max_norm} is not the norm the step was clipped to")
    reads = []
    item = torch.Tensor.item
    torch.Tensor.item = lambda self: reads.append(1) or item(self)
    try:
        losses = recipe.train_one_epoch(Recorder(), [(inputs, labels)] * 8, torch.optim.SGD(Recorder().parameters()),
                                        torch.amp.GradScaler("cpu", enabled=False), float32, CPU, log_every=4)
    finally:
        torch.Tensor.item = item
    if len(reads) != 2 or len(losses) != 2:
        problems.append(f"8 steps read the loss {len(reads)} times, logged {len(losses)}: not every 4 steps")
    bad = inputs.clone()
    bad[0, 0] = float("inf")
    recorder = Recorder()
    optimizer = torch.optim.SGD(recorder.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    fp16 = recipe.Advice(torch.float16, "autocast + GradScaler", "test")
    recipe.train_one_epoch(recorder, [(bad, labels), (inputs, labels)], optimizer, torch.amp.GradScaler("cpu"), fp16,
                           CPU, scheduler=scheduler)
    if scheduler.last_epoch != 1:
        problems.append(f"one skipped and one real step stepped the scheduler {scheduler.last_epoch} times")
    if not isinstance(recipe.autocast(float32, torch.device("mps")), contextlib.nullcontext):
        problems.append("with autocast off the recipe still opens an autocast context (raises on torch 2.4 MPS)")
    return problems


def test_the_take_home_recipe_trains_checkpoints_and_predicts_as_the_course_teaches():
    assert take_home_problems(load_take_home()) == []


UNSCALE = "        scaler.unscale_(optimizer)  # the true gradients, before clipping looks at them\n"
CLIP = ("        if max_grad_norm is not None:\n"
        "            nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)\n")
TAKE_HOME_MUTANTS = {
    "unscale_ after clipping": (UNSCALE + CLIP, CLIP + UNSCALE),
    "unscale_ dropped": (UNSCALE, ""),
    "optimizer.step() instead of scaler.step()": ("scaler.step(optimizer)", "optimizer.step()"),
    "scaler.update() dropped": ("        scaler.update()  # halves", "        pass  # halves"),
    "zero_grad dropped": ("        optimizer.zero_grad(set_to_none=True)\n", ""),
    "autocast never enabled": ('    if advice.how.startswith("autocast"):\n', "    if False:\n"),
    "autocast(enabled=False) instead of no context": ("    return contextlib.nullcontext()\n",
                                                      "    return torch.amp.autocast(device.type, enabled=False)\n"),
    "model.train() dropped": ("    model.train()\n", ""),
    "scaler state not restored": ('    scaler.load_state_dict(checkpoint["scaler"])\n', ""),
    "scaler not saved": ('"scaler": scaler.state_dict(),', '"scaler": {},'),
    "scaler built from the new rule, not the stored choice": ('scaler = make_scaler(stored["how"], device)',
                                                              "scaler = make_scaler(training.how, device)"),
    "a changed precision resumed silently": ("    if stored == precision_record(training):\n", "    if True:\n"),
    "checkpoint loaded with weights_only=False": ("weights_only=True", "weights_only=False"),
    "clipping ignores its parameter": ("max_norm=max_grad_norm)", "max_norm=1.0)"),
    "loss read every step": ("        if step % log_every == 0:\n", "        if True:\n"),
    "scheduler stepped on skipped steps": ("if scheduler is not None and scaler.get_scale() >= scale:",
                                           "if scheduler is not None:"),
    "served without model.eval()": ("    model.eval()\n    if advice.how", "    if advice.how"),
    "16-bit weights not cast": ("return copy.deepcopy(model).to(advice.dtype)", "return copy.deepcopy(model)"),
    "predict keeps 16-bit logits": ("return model(inputs).float()", "return model(inputs)"),
}


@pytest.mark.parametrize("name", list(TAKE_HOME_MUTANTS))
def test_each_mutant_of_the_take_home_recipe_is_caught(name):
    old, new = TAKE_HOME_MUTANTS[name]
    source = TAKE_HOME.read_text()
    assert source.count(old) == 1, f"the mutant {name!r} no longer applies: update it"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # weights_only=False warns on some releases
        try:
            problems = take_home_problems(load_take_home(source.replace(old, new)))
        except Exception as error:  # noqa: BLE001 - a mutant that makes the recipe raise is caught too
            problems = [f"raised {error!r}"]
    assert problems, f"no check noticed the mutant {name!r}"
