"""helpers.scaler_lab: the harnesses of notebook 04 measure what the notebook claims."""
import pytest
import torch
from torch import nn

from helpers import scaler_lab as lab
from helpers.model import ShapesCNN
from helpers.scaling import overflow_fraction, subnormal_fraction, underflow_fraction


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
    assert torch.allclose(scaled["parameter"], 16 * grads["parameter"], rtol=1e-6, atol=0)  # power of two: exact-ish


def test_underflow_table_agrees_with_the_fraction_functions():
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(1000, generator=generator) * 2.0 ** torch.randint(-40, 20, (1000,), generator=generator)
    table = lab.underflow_table({"g": values}, scales=(1.0, 2.0**16))
    for scale in (1.0, 2.0**16):
        fractions = table[scale]["g"]
        assert fractions.zero == underflow_fraction(values, torch.float16, scale)
        assert fractions.below_normal == subnormal_fraction(values, torch.float16, scale)
        assert fractions.inf == overflow_fraction(values, torch.float16, scale)
    assert table[1.0]["g"].zero > table[2.0**16]["g"].zero and table[1.0]["g"].inf < table[2.0**16]["g"].inf
    text = lab.format_underflow_table(table)
    assert "2^16" in text and "g gradients" in text and len(text.splitlines()) == 4


def test_lost_in_backward_counts_new_zeros_only():
    reference = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert lab.lost_in_backward(reference, torch.tensor([0.0, 0.0, 2.0, 3.0])) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="different gradients"):
        lab.lost_in_backward(reference, torch.zeros(3))


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
    assert "float32" in lab.format_runs({"float32": fp32})


def test_scale_history_skips_exactly_the_injected_steps_and_resets_the_growth_count():
    history = lab.scale_history(12, {5: float("inf")}, init_scale=8.0, growth_interval=2)
    assert [h.step for h in history if h.skipped] == [5]
    assert [h.step for h in history if h.weights_unchanged] == [5]
    assert [h.step for h in history if h.optimizer_unchanged] == [5]
    # growth after steps 1 and 3 (pairs of clean steps); step 4 counts one, the skip at 5 resets the count
    assert [h.scale_after for h in history] == [8, 16, 16, 32, 32, 16, 16, 32, 32, 64, 64, 128]


def test_update_norm_shows_why_unscale_comes_before_clipping():
    def no_unscale(model, optimizer, scaler, loss, max_norm):
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()

    assert lab.true_gradient_norm() > 100 * lab.CLIP_NORM  # so clipping is active
    assert lab.update_norm(lab.unscale_then_clip) == pytest.approx(lab.CLIP_NORM, rel=1e-4)
    # clipped in scaled units, then divided by 2^16: at most CLIP_NORM / 2^16 (less where float32 weights round
    # such tiny changes away)
    assert 0 < lab.update_norm(no_unscale) <= lab.CLIP_NORM / 2**16 * (1 + 1e-3)


def load_all(state: lab.TrainingState, checkpoint: dict, with_scaler: bool = True) -> None:
    for obj, key in zip(state, ("model", "optimizer", "scheduler", "scaler")):
        if key != "scaler" or with_scaler:
            obj.load_state_dict(checkpoint[key])


def test_a_resume_is_exact_only_with_the_scaler_state():
    uninterrupted, first = lab.fresh_state(), lab.fresh_state()
    lab.train_steps(uninterrupted, 8)
    lab.train_steps(first, 4)
    checkpoint = lab.save_and_load({key: obj.state_dict() for key, obj in
                                    zip(("model", "optimizer", "scheduler", "scaler"), first)})
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


def test_resumed_scale_reads_what_load_restored():
    def save(model, optimizer, scaler):
        return {"model": model.state_dict(), "scaler": scaler.state_dict()}

    def load(checkpoint, model, optimizer, scaler):
        model.load_state_dict(checkpoint["model"])

    def load_scaler_too(checkpoint, model, optimizer, scaler):
        scaler.load_state_dict(checkpoint["scaler"])

    assert lab.resumed_scale(save, load) == 2.0**16
    assert lab.resumed_scale(save, load_scaler_too, steps=6) == 2.0**18  # growth_interval=3: two growths


def test_fp16_training_ratio_refuses_a_half_model_and_trains_a_float32_one():
    half = lab.faint_net().half()
    with pytest.raises(ValueError, match="FP16 gradients"):
        lab.fp16_training_ratio(half, torch.optim.Adam(half.parameters(), lr=lab.FAINT_LR),
                                torch.amp.GradScaler("cpu"), steps=2)
    net = lab.faint_net()
    ratio = lab.fp16_training_ratio(net, torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR),
                                    torch.amp.GradScaler("cpu"), steps=10)
    assert 0 < ratio < 1
