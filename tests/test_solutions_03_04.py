"""The exercise solutions of notebooks 03 and 04 give the known answers, and check() tells right from wrong."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import helpers
from helpers import scaler_lab as lab
from helpers.exercises import solution
from helpers.solutions.nb03 import NearestCentre, exercise_03_4_setup, nearest_centre_data


def test_03_1_smallest_update_that_changes_two_in_float16():
    expected = helpers.spacing(2.0, torch.float16).item()  # the gap after 2.0; half of it is a tie (rounds to even)
    assert expected == 2.0**-9
    assert solution("03.1") == expected
    assert helpers.check("03.1", 2.0**-9) is True
    assert helpers.check("03.1", 2.0**-10) is False
    assert helpers.check("03.1", 0.00195) is True   # rounded as printed: accepted (TOLERANCES)
    assert helpers.check("03.1", 2.0**-8) is False


def test_03_2_cdist_runs_in_float32_under_cpu_autocast():
    assert solution("03.2") == torch.float32
    assert helpers.check("03.2", torch.float32) is True
    assert helpers.check("03.2", torch.bfloat16) is False


def test_03_3_counts_the_casts_of_the_backward_pass():
    # The forward casts the input, 4 convolution weights, the linear weight and bias to bfloat16, and the logits
    # back to float32. Each cast whose source needs a gradient is mirrored in backward: 4 + 2 weight gradients
    # back to float32, and the loss gradient to bfloat16 for the logits; the input needs no gradient.
    assert solution("03.3") == 4 + 2 + 1
    assert helpers.check("03.3", 7) is True
    assert helpers.check("03.3", 8) is False   # the forward pass's count


def test_03_4_one_outer_autocast_context_freezes_the_loss_and_the_fix_trains():
    # The exercise's broken code: one autocast context around the whole loop.
    model, optimizer, inputs, labels = exercise_03_4_setup()
    losses = []
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(5):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert len(set(losses)) == 1                      # frozen: every forward reuses the cached bfloat16 weights
    assert helpers.check("03.4", losses[-1]) is False
    fixed = solution("03.4")
    assert fixed < losses[-1] * 0.95                  # the fixed loop learns
    assert helpers.check("03.4", fixed) is True


def test_03_5_distances_under_autocast_are_rejected_and_the_float32_island_accepted():
    class BrokenNearestCentre(NearestCentre):
        def forward(self, x):  # the exercise's broken forward: no island
            c = self.centres
            return -((x * x).sum(1, keepdim=True) + (c * c).sum(1) - 2 * x @ c.T)

    centres, queries = nearest_centre_data()
    exact = torch.cdist(queries.double(), centres.double()).pow(2).min(dim=1).values.median().item()
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        broken = (-BrokenNearestCentre(centres)(queries).max(dim=1).values).median().item()
    assert abs(broken - exact) > exact              # error larger than the distance itself
    assert helpers.check("03.5", broken) is False
    fixed = solution("03.5")
    # float32 with |x|^2 ~ 1600 and 16 terms: error ~ eps32 * 1600 * a few, far below 2 % of ~0.16
    assert abs(fixed - exact) < 0.01 * exact
    assert helpers.check("03.5", fixed) is True


def test_03_6_bce_loss_skips_steps_under_grad_scaler_and_bce_with_logits_does_not():
    def run(broken: bool) -> tuple[float, int]:
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        inputs = torch.randn(64, 16, generator=g)
        targets = (inputs[:, 0] > 1.5).float()
        model = nn.Sequential(nn.Linear(16, 1), nn.Sigmoid()) if broken else nn.Sequential(nn.Linear(16, 1))
        nn.init.constant_(model[0].bias, -6.9)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        loss_fn = nn.BCELoss() if broken else nn.BCEWithLogitsLoss()
        skipped = 0
        for _ in range(20):
            optimizer.zero_grad()
            with torch.amp.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(inputs).squeeze(1), targets)
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            skipped += scaler.get_scale() < scale
        return loss.item(), skipped

    broken_loss, broken_skipped = run(broken=True)
    fixed_loss, fixed_skipped = run(broken=False)
    assert broken_skipped > 0 and fixed_skipped == 0
    assert helpers.check("03.6", broken_loss) is False
    assert helpers.check("03.6", fixed_loss) is True
    assert fixed_loss == solution("03.6")


def test_04_1_scale_after_a_sequence_of_steps():
    # 2^16: 3 clean -> 2^17; inf -> 2^16; 3 clean -> 2^17; clean; inf -> 2^16; inf -> 2^15; clean -> 2^15
    assert solution("04.1") == 2.0**15
    assert helpers.check("04.1", 32768) is True
    assert helpers.check("04.1", 65536) is False


def test_04_2_smallest_scale_that_keeps_1e9():
    assert solution("04.2") == 32.0
    assert (torch.tensor(1e-9) * 32).half().item() > 0
    assert (torch.tensor(1e-9) * 16).half().item() == 0
    assert helpers.check("04.2", 32) is True
    assert helpers.check("04.2", 5) is False  # the exponent, not the scale


def test_04_3_one_bad_micro_batch_skips_its_whole_accumulated_step():
    assert solution("04.3") == 2
    assert helpers.check("04.3", 2) is True
    assert helpers.check("04.3", 3) is False


def test_04_4_clipping_before_unscale_is_rejected_and_the_fix_accepted():
    def broken(model, optimizer, scaler, loss, max_norm):  # notebook 04's exercise cell, as given
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()

    assert solution("04.4") == pytest.approx(lab.CLIP_NORM, rel=1e-4)
    assert helpers.check("04.4", lab.update_norm(broken, lab.CLIP_NORM)) is False
    assert helpers.check("04.4", lab.update_norm(lab.unscale_then_clip, lab.CLIP_NORM)) is True


def test_04_5_a_checkpoint_without_the_scaler_is_rejected_and_the_fix_accepted():
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

    assert solution("04.5") == 2.0**18  # 7 clean steps with growth_interval=3: two growths from 2^16
    assert helpers.check("04.5", lab.resumed_scale(save, load)) is False       # restarts at 2^16
    assert helpers.check("04.5", lab.resumed_scale(save_fixed, load)) is False  # saved but not loaded
    assert helpers.check("04.5", lab.resumed_scale(save_fixed, load_fixed)) is True


def run_04_6(half: bool, scaler_on: bool) -> float:
    net = lab.faint_net()
    net = net.half() if half else net
    optimizer = torch.optim.Adam(net.parameters(), lr=lab.FAINT_LR)
    return lab.fp16_training_ratio(net, optimizer, torch.amp.GradScaler("cpu", enabled=scaler_on))


def test_04_6_a_half_model_is_rejected_and_the_fix_accepted():
    assert 0.1 < solution("04.6") < 0.3
    assert helpers.check("04.6", run_04_6(half=True, scaler_on=False)) is False   # the exercise cell: NaN
    with pytest.raises(ValueError, match="FP16 gradients"):                     # half only: refused
        run_04_6(half=True, scaler_on=True)
    assert helpers.check("04.6", run_04_6(half=False, scaler_on=False)) is False  # no scaler: stalls
    assert helpers.check("04.6", run_04_6(half=False, scaler_on=True)) is True
