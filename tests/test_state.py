"""helpers.state: snapshots and bit-exact comparisons of model and optimizer state (notebooks 04, 06)."""
import torch
from torch import nn

from helpers.state import bitwise_equal, optimizer_snapshot, same_state, snapshot


def test_bitwise_equal_is_stricter_than_equal():
    nan = torch.tensor([float("nan")])
    assert bitwise_equal(nan, nan.clone()) and not torch.equal(nan, nan)
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert torch.equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not bitwise_equal(torch.ones(2), torch.ones(2, dtype=torch.float16))
    assert not bitwise_equal(torch.ones(2), torch.ones(3))
    assert bitwise_equal(torch.arange(3), torch.arange(3))
    assert bitwise_equal(torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16))


def test_snapshot_same_state_and_difference():
    torch.manual_seed(0)
    layer = nn.Linear(3, 2)
    before = snapshot(layer)
    assert same_state(before, snapshot(layer))
    with torch.no_grad():
        layer.weight[0, 0] += 1e-3
    after = snapshot(layer)
    assert not same_state(before, after)
    assert not same_state(before, {"weight": after["weight"]})  # a missing name is a difference


def test_optimizer_snapshot_sees_adam_steps_but_not_skipped_ones():
    torch.manual_seed(0)
    weight = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adam([weight], lr=0.1)
    assert optimizer_snapshot(optimizer) == {}        # no state before the first step
    scaler = torch.amp.GradScaler("cpu")
    for bad in (False, True):
        before = optimizer_snapshot(optimizer)
        optimizer.zero_grad()
        scaler.scale(weight.sum()).backward()
        if bad:
            weight.grad[0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        assert same_state(before, optimizer_snapshot(optimizer)) == bad
    snap = optimizer_snapshot(optimizer)
    assert {"0.step", "0.exp_avg", "0.exp_avg_sq"} <= snap.keys()
    assert all(isinstance(v, torch.Tensor) for v in snap.values())
    snap["0.exp_avg"] += 1                            # a copy: changing it leaves the optimizer alone
    assert not same_state(snap, optimizer_snapshot(optimizer))
