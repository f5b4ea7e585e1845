"""Notebook 04: its scaffolding (helpers.nb04) measures what the notebook claims, and its exercises'
solutions and checks (helpers.solutions.nb04) tell right from wrong."""
import pytest
import torch
from torch import nn

import helpers
from helpers import nb04 as lab
from helpers.exercises import solution
from helpers.model import ShapesCNN
from helpers.solutions.nb04 import injected_inf_steps, unscale_then_clip


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


def test_faint_task_is_deterministic_and_starts_at_zero():
    (x1, y1), (x2, y2) = lab.faint_data(), lab.faint_data()
    assert torch.equal(x1, x2) and torch.equal(y1, lab.FAINT_FACTOR * x1)
    loss, output = lab.faint_loss(lab.faint_net(), None)
    assert torch.equal(output, torch.zeros_like(output))
    # the output gradient 2 * target / N lies below half of float16's smallest subnormal on average
    assert (2 * y1.abs() / y1.numel()).mean() < 2.0**-25


def test_train_faint_underflows_without_a_scaler_and_matches_float32_with_one():
    fp32 = lab.train_faint(None, use_scaler=False)
    bare = lab.train_faint(torch.float16, use_scaler=False)
    scaled = lab.train_faint(torch.float16, use_scaler=True)
    assert bare.zero_output_grads[0] > 0.5 and scaled.zero_output_grads[0] == 0 == fp32.zero_output_grads[0]
    assert bare.final_ratio > 1.5 * fp32.final_ratio
    assert scaled.final_ratio == pytest.approx(fp32.final_ratio, rel=0.05)


def test_faint_step_injects_into_one_gradient_and_the_scaler_skips_exactly_then():
    net = lab.faint_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    scales, unchanged = [], []
    for step in range(12):
        before = helpers.state.snapshot(net), helpers.state.optimizer_snapshot(optimizer)
        lab.faint_step(net, optimizer, scaler, inject=float("inf") if step == 5 else None)
        scales.append(scaler.get_scale())
        unchanged.append(helpers.state.same_state(before[0], helpers.state.snapshot(net)) and
                         helpers.state.same_state(before[1], helpers.state.optimizer_snapshot(optimizer)))
    assert [step for step, same in enumerate(unchanged) if same] == [5]
    # growth after steps 1 and 3 (pairs of clean steps); step 4 counts one, the skip at 5 resets the count
    assert scales == [8, 16, 16, 32, 32, 16, 16, 32, 32, 64, 64, 128]


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
    uninterrupted, first = lab.fresh_state(), lab.fresh_state()
    lab.train_steps(uninterrupted, 8)
    lab.train_steps(first, 4)
    checkpoint = {key: obj.state_dict() for key, obj in zip(("model", "optimizer", "scheduler", "scaler"),
                                                            first)}
    assert checkpoint["scaler"]["scale"] == 2.0**17 and checkpoint["scaler"]["_growth_tracker"] == 1
    results = {}
    for with_scaler in (True, False):
        resumed = lab.fresh_state()
        load_all(resumed, checkpoint, with_scaler)
        lab.train_steps(resumed, 4)
        results[with_scaler] = lab.same_run(resumed, uninterrupted)
    assert results == {True: True, False: False}


def test_train_steps_does_not_step_the_scheduler_on_a_skipped_step():
    net = lab.faint_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    state = lab.TrainingState(net, optimizer, scheduler, torch.amp.GradScaler("cpu", init_scale=2.0**60))
    lab.train_steps(state, 1)  # 2^60 overflows float16: skipped
    assert state.scaler.get_scale() == 2.0**59 and scheduler.last_epoch == 0
    lab.train_steps(lab.TrainingState(net, optimizer, scheduler, torch.amp.GradScaler("cpu")), 1)
    assert scheduler.last_epoch == 1


def test_resumed_scale_reads_what_load_restored_through_a_weights_only_load():
    def save(model, optimizer, scaler):
        return {"model": model.state_dict(), "scaler": scaler.state_dict()}

    def load(checkpoint, model, optimizer, scaler):
        model.load_state_dict(checkpoint["model"])

    def load_scaler_too(checkpoint, model, optimizer, scaler):
        scaler.load_state_dict(checkpoint["scaler"])

    assert lab.resumed_scale(save, load) == 2.0**16
    assert lab.resumed_scale(save, load_scaler_too, steps=6) == 2.0**18  # growth_interval=3: two growths
    with pytest.raises(Exception, match="weights_only|Unsupported|global"):
        lab.resumed_scale(lambda model, optimizer, scaler: {"optimizer": optimizer}, load)


def test_fp16_training_ratio_refuses_a_half_model_and_trains_a_float32_one():
    half = lab.faint_net().half()
    with pytest.raises(ValueError, match="FP16 gradients"):
        lab.fp16_training_ratio(half, torch.optim.Adam(half.parameters(), lr=lab.FAINT_LR),
                                torch.amp.GradScaler("cpu"), steps=2)
    net = lab.faint_net()
    ratio = lab.fp16_training_ratio(net, torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR),
                                    torch.amp.GradScaler("cpu"), steps=10)
    assert 0 < ratio < 1


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


def test_04_3_clipping_before_unscale_is_rejected_and_the_fix_accepted():
    def broken(model, optimizer, scaler, loss, max_norm):  # notebook 04's exercise cell, as given
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()

    assert solution("04.3") == pytest.approx(lab.CLIP_NORM, rel=1e-4)
    assert helpers.exercises.grade("04.3", lab.update_norm(broken, lab.CLIP_NORM)) is False
    assert helpers.exercises.grade("04.3", lab.update_norm(unscale_then_clip, lab.CLIP_NORM)) is True


def test_04_4_a_checkpoint_without_the_scaler_is_rejected_and_the_fix_accepted():
    def save(model, optimizer, scaler):  # the exercise cell, as given
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def load(checkpoint, model, optimizer, scaler):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])

    def save_fixed(model, optimizer, scaler):
        return {**save(model, optimizer, scaler), "scaler": scaler.state_dict()}

    def load_fixed(checkpoint, model, optimizer, scaler):
        load(checkpoint, model, optimizer, scaler)
        scaler.load_state_dict(checkpoint["scaler"])

    assert solution("04.4") == 2.0**18  # 7 clean steps with growth_interval=3: two growths from 2^16
    assert helpers.exercises.grade("04.4", lab.resumed_scale(save, load)) is False       # restarts at 2^16
    assert helpers.exercises.grade("04.4", lab.resumed_scale(save_fixed, load)) is False  # saved but not loaded
    assert helpers.exercises.grade("04.4", lab.resumed_scale(save_fixed, load_fixed)) is True


def run_04_5(half: bool, scaler_on: bool) -> float:
    net = lab.faint_net()
    net = net.half() if half else net
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    return lab.fp16_training_ratio(net, optimizer, torch.amp.GradScaler("cpu", enabled=scaler_on))


def test_04_5_a_half_model_is_rejected_and_the_fix_accepted():
    assert 0.1 < solution("04.5") < 0.3
    assert helpers.exercises.grade("04.5", run_04_5(half=True, scaler_on=False)) is False   # the exercise cell: NaN
    with pytest.raises(ValueError, match="FP16 gradients"):                     # half only: refused
        run_04_5(half=True, scaler_on=True)
    assert helpers.exercises.grade("04.5", run_04_5(half=False, scaler_on=False)) is False  # no scaler: stalls
    assert helpers.exercises.grade("04.5", run_04_5(half=False, scaler_on=True)) is True


@pytest.mark.parametrize("key", ["04.1", "04.6", "04.2", "04.3", "04.4", "04.5"])
def test_unanswered(key, capsys):
    assert helpers.check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out
