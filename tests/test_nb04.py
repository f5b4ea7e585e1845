"""Notebook 04: its scaffolding (helpers.nb04) measures what the notebook claims, and its exercises'
solutions and checks (helpers.solutions.nb04) tell right from wrong: the fix-the-code checks (04.3-5) are fed the
code as given, wrong and symptom-hiding repairs, typed numbers, and right repairs written differently, and the
line each prints is asserted."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import helpers
from helpers import nb04 as lab
from helpers.exercises import feedback, solution
from helpers.model import ShapesCNN
from helpers.solutions.nb04 import injected_inf_steps, load_with_scaler, make_run, save_with_scaler, unscale_then_clip
from tests.support import cell_containing, definitions

CPU = torch.device("cpu")


def small_cnn_batch():
    torch.manual_seed(0)
    model = ShapesCNN(widths=(8, 8)).train()
    generator = torch.Generator().manual_seed(0)
    return model, torch.randn(2, 3, 16, 16, generator=generator), torch.tensor([0, 1])


def test_capture_gradients_catches_activations_and_parameters_and_removes_its_hooks():
    model, images, labels = small_cnn_batch()
    grads = lab.capture_gradients(model, images, labels)
    assert set(grads) == {"activation", "parameter"}
    assert grads["parameter"].numel() == sum(p.numel() for p in model.parameters())
    # outputs of conv, BN, ReLU, pool (x2 blocks) and linear: all caught, each as many values as the output
    assert grads["activation"].numel() > images.numel()
    assert all(not m._forward_hooks for m in model.modules())
    scaled = lab.capture_gradients(model, images, labels, loss_scale=16.0)
    assert torch.allclose(scaled["parameter"], 16 * grads["parameter"], rtol=1e-6, atol=0)


def test_fractions_follow_the_float16_range():
    values = torch.tensor([1e-9, 1e-6, 1e-3, 1.0, 0.0])  # the zero is ignored
    assert lab.fractions(values) == (0.25, 0.5, 0.0)       # 1e-9 rounds to 0; 1e-6 is subnormal
    assert lab.fractions(values, scale=2.0**16) == (0.0, 0.0, 0.25)  # 1.0 * 65536 > 65504
    assert lab.fractions(values, torch.bfloat16).zero == 0.0
    values = torch.tensor([2.0**-24, 2.0**-25, 2.0**-25 * 1.001, 65504.0, 65520.0])
    assert lab.fractions(values) == (0.2, 0.6, 0.2)  # a tie rounds to even (0); 65520 rounds to inf


def test_fractions_reject_bad_arguments():
    with pytest.raises(ValueError, match="positive"):
        lab.fractions(torch.ones(3), scale=0.0)
    with pytest.raises(ValueError, match="no non-zero"):
        lab.fractions(torch.zeros(3))
    with pytest.raises(TypeError, match="not a floating-point"):
        lab.fractions(torch.ones(3), torch.int32)


def test_underflow_table_prints_the_fractions_of_each_kind_and_scale():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(1000, generator=generator) * 2.0 ** torch.randint(-40, 20, (1000,),
                                                                        generator=generator)
    text = lab.underflow_table({"g": values, "h": values * 2.0**-8}, scales=(1.0, 2.0**16))
    lines = text.splitlines()
    assert len(lines) == 5 and lines[1].split()[:2] == ["g", "2^0"] and lines[4].split()[:2] == ["h", "2^16"]
    zero, below, inf = lab.fractions(values, torch.float16, 2.0**16)
    assert lines[2].split()[2:] == [f"{zero:.4%}", f"{below:.4%}", f"{inf:.4%}"]


def cell_steps():
    """04's own faint_step (section 3's cell) and train_steps (section 6's), run on the CPU."""
    inputs, target = lab.faint_data(CPU)
    namespace = {"torch": torch, "F": F, "fp16": torch.float16, "device": CPU, "inputs": inputs, "target": target}
    return definitions("04", "faint_step", "train_steps", namespace=namespace).values()


def faint_run(amp_dtype, use_scaler, steps=30):
    """Section 3's loop: ``steps`` Adam steps of the cell's faint_step from a fresh network."""
    faint_step, _ = cell_steps()
    net = lab.faint_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    scaler = torch.amp.GradScaler("cpu", enabled=use_scaler)
    losses, zeros = zip(*(faint_step(net, optimizer, scaler, amp_dtype) for _ in range(steps)))
    return losses[-1] / losses[0], zeros


def test_section_3_cell_types_the_scaler_loop_it_runs():
    step_cell = cell_containing("04", "def faint_step(")
    for call in ("scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()",
                 "torch.amp.autocast(device.type"):
        assert call in step_cell
    loop_cell = cell_containing("04", "faint_step(net, optimizer, scaler, amp_dtype) for _ in range(30)")
    assert "torch.amp.GradScaler(device.type, enabled=use_scaler)" in loop_cell


def test_faint_task_is_deterministic_and_starts_at_zero():
    (x1, y1), (x2, _) = lab.faint_data(), lab.faint_data()
    assert torch.equal(x1, x2) and torch.equal(y1, lab.FAINT_FACTOR * x1)
    loss, output = lab.faint_loss(lab.faint_net(), None)
    assert torch.equal(output, torch.zeros_like(output))
    # the output gradient 2 * target / N lies below half of float16's smallest subnormal on average
    assert (2 * y1.abs() / y1.numel()).mean() < 2.0**-25


@pytest.mark.slow  # 90 float16 steps, emulated on most CPUs: the notebook's own 30-step comparison
def test_faint_step_underflows_without_a_scaler_and_matches_float32_with_one():
    fp32, fp32_zeros = faint_run(None, use_scaler=False)
    bare, bare_zeros = faint_run(torch.float16, use_scaler=False)
    scaled, scaled_zeros = faint_run(torch.float16, use_scaler=True)
    assert bare_zeros[0] > 0.5 and scaled_zeros[0] == 0 == fp32_zeros[0]
    assert bare > 1.5 * fp32
    assert scaled == pytest.approx(fp32, rel=0.05)


def test_update_norm_shows_why_unscale_comes_before_clipping():
    def no_unscale(model, optimizer, scaler, loss, max_norm):
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()

    net = lab.clipping_net()
    lab.faint_loss(net, None)[0].backward()
    assert nn.utils.clip_grad_norm_(net.parameters(), float("inf")) > 100 * lab.CLIP_NORM  # clipping acts
    assert lab.update_norm(unscale_then_clip) == pytest.approx(lab.CLIP_NORM, rel=1e-4)
    # clipped in scaled units, then divided by 2^16: at most CLIP_NORM / 2^16 (less where float32 weights
    # round such tiny changes away)
    assert 0 < lab.update_norm(no_unscale) <= lab.CLIP_NORM / 2**16 * (1 + 1e-3)


def load_all(state: lab.TrainingState, checkpoint: dict, with_scaler: bool = True) -> None:
    for obj, key in zip(state, ("model", "optimizer", "scheduler", "scaler")):
        if key != "scaler" or with_scaler:
            obj.load_state_dict(checkpoint[key])


def test_a_resume_is_exact_only_with_the_scaler_state():
    _, train_steps = cell_steps()
    uninterrupted, first = lab.fresh_state(), lab.fresh_state()
    train_steps(uninterrupted, 8)
    train_steps(first, 4)
    checkpoint = {key: obj.state_dict() for key, obj in zip(("model", "optimizer", "scheduler", "scaler"),
                                                            first)}
    assert checkpoint["scaler"]["scale"] == 2.0**17 and checkpoint["scaler"]["_growth_tracker"] == 1
    results = {}
    for with_scaler in (True, False):
        resumed = lab.fresh_state()
        load_all(resumed, checkpoint, with_scaler)
        train_steps(resumed, 4)
        results[with_scaler] = lab.same_run(resumed, uninterrupted)
    assert results == {True: True, False: False}


def test_train_steps_does_not_step_the_scheduler_on_a_skipped_step():
    _, train_steps = cell_steps()
    net = lab.faint_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    state = lab.TrainingState(net, optimizer, scheduler, torch.amp.GradScaler("cpu", init_scale=2.0**60))
    train_steps(state, 1)  # 2^60 overflows float16: skipped
    assert state.scaler.get_scale() == 2.0**59 and scheduler.last_epoch == 0
    train_steps(lab.TrainingState(net, optimizer, scheduler, torch.amp.GradScaler("cpu")), 1)
    assert scheduler.last_epoch == 1


def test_injected_inf_steps_backs_off_and_grows():
    scales = injected_inf_steps([False, True, False, False, True, True], init_scale=8.0, growth_interval=2)
    assert scales == [8.0, 4.0, 4.0, 8.0, 4.0, 2.0]
    assert injected_inf_steps([False] * 3) == [2.0**16] * 3   # default growth_interval is 2000


def test_04_1_scale_after_a_sequence_of_steps():
    # 2^16: 3 clean -> 2^17; inf -> 2^16; 3 clean -> 2^17; clean; inf -> 2^16; inf -> 2^15; clean -> 2^15
    assert solution("04.1") == 2.0**15
    assert helpers.exercises.grade("04.1", 32768) is True
    assert helpers.exercises.grade("04.1", 65536) is False


def test_04_6_smallest_scale_that_keeps_1e9():
    assert solution("04.6") == 32.0
    assert (torch.tensor(1e-9) * 32).half().item() > 0
    assert (torch.tensor(1e-9) * 16).half().item() == 0
    assert helpers.exercises.grade("04.6", 32) is True
    assert helpers.exercises.grade("04.6", 5) is False  # the exponent, not the scale


def test_04_2_one_bad_micro_batch_skips_its_whole_accumulated_step():
    assert solution("04.2") == 2
    assert helpers.exercises.grade("04.2", 2) is True
    assert helpers.exercises.grade("04.2", 3) is False


def given(*names: str):
    """The functions ``names`` exactly as notebook 04's exercise cells define them (the learner's start)."""
    from tests.support import definitions

    namespace = {"torch": torch, "nn": nn, "F": F, "lab": lab, "device": torch.device("cpu"), "accumulation_steps": 4}
    return tuple(definitions("04", *names, namespace=namespace).values())


def micro_batches(count: int, seed: int = 1) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 32, generator=g), torch.randint(4, (16,), generator=g)) for _ in range(count)]


def test_drop_last_drops_samples_not_a_leftover_group_of_micro_batches():
    samples = torch.utils.data.TensorDataset(torch.randn(100, 32), torch.randint(4, (100,)))
    assert len(torch.utils.data.DataLoader(samples, batch_size=16, drop_last=True)) == 6  # 6 % 4 == 2 left


def test_section_1_accumulate_steps_the_partial_group_and_leaves_nothing_in_grad():
    (accumulate,) = given("accumulate")
    net, steps, waiting = accumulate(micro_batches(6), step_the_tail=True)
    assert (steps, waiting) == ([[4, 4, 4, 4], [2, 2]], []) and net.weight.grad is None
    net, steps, waiting = accumulate(micro_batches(6), step_the_tail=False)
    assert (steps, waiting) == ([[4, 4, 4, 4]], [4, 4]) and net.weight.grad is not None  # waits for next epoch
    for tail in (False, True):  # whole groups: both loops alike
        assert accumulate(micro_batches(8), step_the_tail=tail)[1:] == ([[4] * 4] * 2, [])


def test_section_1_partial_group_step_is_the_mean_gradient_of_its_micro_batches():
    (accumulate,) = given("accumulate")
    tail = micro_batches(2, seed=3)
    net, steps, _ = accumulate(tail, step_the_tail=True)  # one partial group of 2: one step, lr 0.1
    assert steps == [[2, 2]]
    torch.manual_seed(0)
    reference = nn.Linear(32, 4)  # the same initial weights, float32, the mean loss over both micro-batches
    inputs = torch.cat([x for x, _ in tail])
    labels = torch.cat([y for _, y in tail])
    F.cross_entropy(reference(inputs), labels).backward()
    update = (reference.weight - net.weight).detach() / 0.1
    assert torch.allclose(update, reference.weight.grad, rtol=0.02, atol=1e-4)
    assert not torch.allclose(update / 2, reference.weight.grad, rtol=0.1, atol=1e-4)  # divided by 4: half


def clip_step(order: str, max_norm_factor=None):
    """04.3's step with its lines in ``order`` (a learner's attempt); ``max_norm_factor`` scales max_norm by
    the scale (clipping scaled gradients against a scaled limit: right too)."""
    def step(model, optimizer, scaler, loss, max_norm):
        actions = {
            "scaled": lambda: scaler.scale(loss).backward(),
            "plain": lambda: loss.backward(),
            "unscale": lambda: scaler.unscale_(optimizer),
            "clip": lambda: nn.utils.clip_grad_norm_(
                model.parameters(), max_norm * (scaler.get_scale() if max_norm_factor else 1)),
            "nan_to_num": lambda: [p.grad.nan_to_num_(0.0, 0.0, 0.0) for p in model.parameters()],
            "step": lambda: scaler.step(optimizer),
            "optimizer.step": lambda: optimizer.step(),
            "update": lambda: scaler.update(),
        }
        for action in order.split(", "):
            actions[action]()
    return step


WRONG_04_3 = {
    "as given": ("scaled, clip, unscale, step, update", "the update is shorter than max_norm"),
    "scaler bypassed": ("plain, clip, optimizer.step", "the optimizer stepped without the scaler"),
    "unscaled, then optimizer.step()": ("scaled, unscale, clip, optimizer.step, update",
                                        "the optimizer stepped without the scaler"),
    "the clipping line deleted": ("scaled, unscale, step, update", "the update is longer than max_norm"),
    "nan_to_num before unscale_": ("scaled, nan_to_num, unscale, clip, step, update",
                                   "with an inf gradient the step was applied instead of skipped"),
    "update() forgotten": ("scaled, unscale, clip, step", "it should end with scaler.step(optimizer) and "
                                                          "scaler.update()"),
}


@pytest.mark.parametrize("name", WRONG_04_3)
def test_04_3_wrong_repairs_fail_with_the_condition_they_break(name):
    order, reason = WRONG_04_3[name]
    assert feedback("04.3", clip_step(order)).startswith(reason)


def test_04_3_the_given_step_numbers_and_a_disabled_scaler_are_rejected():
    (clip_and_step,) = given("clip_and_step")
    assert feedback("04.3", clip_and_step).startswith("the update is shorter than max_norm")

    def disabled(model, optimizer, scaler, loss, max_norm):  # a scaler of its own, switched off
        clip_step("scaled, unscale, clip, step, update")(model, optimizer, torch.amp.GradScaler("cpu", enabled=False),
                                                          loss, max_norm)

    assert feedback("04.3", disabled) == "the optimizer stepped without the scaler"
    for typed in (lab.CLIP_NORM, 1e-4, torch.tensor(1e-4), lab.update_norm(unscale_then_clip, lab.CLIP_NORM)):
        assert feedback("04.3", typed) == "the answer should be your repaired function clip_and_step itself"


def test_04_3_a_wrong_max_norm_is_named_not_blamed_on_clipping():
    for wrong in (1.0, lab.CLIP_NORM, 1e-3):  # a typed limit: above the true norm, the notebook's, another
        def typed_limit(model, optimizer, scaler, loss, max_norm, wrong=wrong):
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), wrong)
            scaler.step(optimizer)
            scaler.update()

        assert feedback("04.3", typed_limit) == (
            f"clip_grad_norm_ was given max_norm={wrong:g}, not the max_norm argument (0.0003)"), wrong


def test_04_3_unscale_twice_is_named():
    # unscale_ added before clipping, the given one after it left in place: the second call raises
    twice = clip_step("scaled, unscale, clip, unscale, step, update")
    assert feedback("04.3", twice) == ("unscale_ ran twice before update(): call scaler.unscale_(optimizer) "
                                       "once per step, before clipping")

    def divided_again(model, optimizer, scaler, loss, max_norm):  # unscale_, then a division of its own
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        for p in model.parameters():
            p.grad /= scaler.get_scale()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()

    assert feedback("04.3", divided_again) == ("the gradients were divided by the scale twice before clipping: "
                                               "unscale_ once, and divide nothing yourself")


def test_04_3_right_repairs_written_differently_pass():
    assert lab.update_norm(unscale_then_clip) == pytest.approx(lab.CLIP_NORM, rel=1e-4)
    assert feedback("04.3", unscale_then_clip) is None
    assert feedback("04.3", clip_step("scaled, unscale, clip, step, update")) is None
    assert feedback("04.3", clip_step("scaled, clip, step, update", max_norm_factor=True)) is None


def _save(model, optimizer, scaler, scaler_state=True):
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    return {**checkpoint, "scaler": scaler.state_dict()} if scaler_state else checkpoint


def _load(checkpoint, model, optimizer, scaler, scaler_state="all"):
    model.load_state_dict(checkpoint["model"])
    if scaler_state != "no optimizer":
        optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler_state in ("all", "no optimizer"):
        scaler.load_state_dict(checkpoint["scaler"])
    elif scaler_state == "scale only":  # the growth counter lost
        scaler.load_state_dict({**checkpoint["scaler"], "_growth_tracker": 0})


def pair(save_scaler=True, load_scaler="all"):
    return (lambda model, optimizer, scaler: _save(model, optimizer, scaler, save_scaler),
            lambda checkpoint, model, optimizer, scaler: _load(checkpoint, model, optimizer, scaler, load_scaler))


WRONG_04_4 = {
    "no scaler saved": (pair(False, "none"), "the resumed scaler does not start with the scale it was saved with"),
    "saved, not loaded": (pair(True, "none"), "the resumed scaler does not start with the scale it was saved with"),
    "only the scale restored": (pair(True, "scale only"), "the resumed scaler lost its growth counter"),
    "the optimizer not loaded": (pair(True, "no optimizer"), "the resumed optimizer is not the saved one"),
    "the scaler object pickled": ((lambda model, optimizer, scaler: {**_save(model, optimizer, scaler, False),
                                                                     "scaler": scaler}, pair()[1]),
                                  "the checkpoint does not load with weights_only=True"),
}


@pytest.mark.parametrize("name", WRONG_04_4)
def test_04_4_wrong_repairs_fail_with_the_condition_they_break(name):
    answer, reason = WRONG_04_4[name]
    assert feedback("04.4", answer).startswith(reason)


def test_04_4_the_given_pair_and_typed_scales_are_rejected():
    assert feedback("04.4", given("save", "load")).startswith("the resumed scaler does not start with the scale")
    checkpoint = {key: obj.state_dict() for key, obj in zip(("model", "optimizer", "scheduler", "scaler"),
                                                            lab.fresh_state())}
    for typed in (checkpoint["scaler"]["scale"], 2**18, 2.0**18, torch.tensor(2.0**18), given("save", "load")[0]):
        assert feedback("04.4", typed) == "the answer should be the pair of your repaired functions: (save, load)"


def test_04_4_right_repairs_written_differently_pass():
    assert feedback("04.4", (save_with_scaler, load_with_scaler)) is None
    assert feedback("04.4", pair()) is None

    def save_all(model, optimizer, scaler):  # another layout: a list of three state dicts
        return [obj.state_dict() for obj in (model, optimizer, scaler)]

    def load_all_of(checkpoint, model, optimizer, scaler):
        for obj, state in zip((model, optimizer, scaler), checkpoint):
            obj.load_state_dict(state)

    assert feedback("04.4", (save_all, load_all_of)) is None


def run_maker(half=False, bfloat16=False, scaler_on=True, own_optimizer=True):
    def make_run(device):
        net = lab.faint_net(device)
        net = net.half() if half else net.bfloat16() if bfloat16 else net
        params = net.parameters() if own_optimizer else lab.faint_net(device).parameters()
        return net, torch.optim.Adam(params, lr=lab.FAINT_LR), torch.amp.GradScaler(device.type, enabled=scaler_on)
    return make_run


WRONG_04_5 = {
    "as given": (run_maker(half=True, scaler_on=False), "its parameters are float16"),
    "half only (the scaler refuses)": (run_maker(half=True), "its parameters are float16"),
    "bfloat16 weights, scaler on": (run_maker(bfloat16=True), "its parameters are bfloat16"),
    "float32, scaler still off": (run_maker(scaler_on=False), "its scaler is not an enabled torch.amp.GradScaler"),
    "an optimizer of another network": (run_maker(own_optimizer=False),
                                        "its optimizer does not hold the network's parameters"),
}


@pytest.mark.parametrize("name", WRONG_04_5)
def test_04_5_wrong_repairs_fail_with_the_condition_they_break(name):
    answer, reason = WRONG_04_5[name]
    assert feedback("04.5", answer).startswith(reason)


def test_04_5_the_given_function_and_typed_ratios_are_rejected():
    assert feedback("04.5", given("make_run")[0]).startswith("its parameters are float16")
    ratios = [faint_run(torch.float16, use_scaler=True, steps=3)[0], faint_run(None, use_scaler=False, steps=3)[0]]
    for typed in (*ratios, 0.113):
        assert feedback("04.5", typed) == "the answer should be your repaired function make_run itself"


def test_04_5_a_scaler_that_does_not_follow_float32_is_named(monkeypatch):
    from helpers.solutions import nb04 as sol

    def stalled(device):  # a working setup whose scaler starts so low that gradients underflow
        net = lab.faint_net(device)
        return net, torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR), torch.amp.GradScaler(
            "cpu", init_scale=1.0, growth_interval=10_000)

    assert feedback("04.5", stalled) == "its float16 run does not follow the float32 run of the same steps"
    assert sol.make_run(CPU)[0][0].weight.dtype == torch.float32


def test_04_5_right_repairs_written_differently_pass():
    assert feedback("04.5", make_run) is None
    assert feedback("04.5", run_maker()) is None

    def back_to_float(device):  # .half() undone, the scaler at another initial scale
        net = lab.faint_net(device).half().float()
        return net, torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR), torch.amp.GradScaler(device.type,
                                                                                                init_scale=2.0**14)
    assert feedback("04.5", back_to_float) is None


@pytest.mark.parametrize("key", ["04.1", "04.6", "04.2", "04.3", "04.4", "04.5"])
def test_unanswered(key, capsys):
    assert helpers.check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out
