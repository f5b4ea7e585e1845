"""Notebook 08's scaffolding (helpers.nb08), its checkpoint command and its exercise solutions."""
import copy
import json
import math

import pytest
import torch
from torch.nn import functional as F

import helpers
from helpers import nb08 as lab
from helpers.exercises import solution
from helpers.solutions import nb08 as solutions
from tests.support import code_cells, definitions
from tools import reference


def test_the_corpus_is_the_same_text_on_every_release():
    # random.Random(seed).choice repeats across Python 3 releases: the first sentences are fixed
    first_two = "A long prompt casts the exponent after the norm. The GPU adds every byte."
    assert lab.corpus_text(2) == first_two
    assert lab.corpus_text(50) == lab.corpus_text(50) != lab.corpus_text(50, seed=1)
    assert lab.corpus_text().isascii()


def test_batches_are_windows_and_their_next_bytes():
    ids = torch.arange(1000)
    inputs, targets = lab.batch(ids, 4, 16, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (4, 16)
    assert torch.equal(targets, inputs + 1)  # consecutive ids: each target is the next id
    again, _ = lab.batch(ids, 4, 16, torch.Generator().manual_seed(0))
    assert torch.equal(inputs, again)
    assert lab.decode(lab.encode("Byte level.")) == "Byte level."


def test_cached_decoding_gives_the_logits_of_a_full_pass():
    torch.manual_seed(0)
    model = lab.GPT(width=32, layers=2, heads=2, context=16).eval()
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, full_cache = model(ids)
        logits, cache = model(ids[:, :8])
        steps = [logits]
        for i in range(8, 12):
            logits, cache = model(ids[:, i:i + 1], cache)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for layer, full_layer in zip(cache, full_cache)
               for a, b in zip(layer, full_layer))
    with pytest.raises(ValueError, match="one token at a time"):
        model(ids[:, 8:10], cache)


@pytest.mark.parametrize("dtype", helpers.COURSE_DTYPES)
def test_cache_bytes_follow_the_formula(dtype):
    model = lab.GPT(width=48, layers=3, heads=3, context=32).to(dtype)
    with torch.inference_mode():
        _, cache = model(torch.zeros(2, 20, dtype=torch.long))
    assert cache[0][0].dtype == dtype
    assert lab.cache_bytes(cache) == 2 * 3 * 3 * 16 * (torch.finfo(dtype).bits // 8) * 2 * 20


def test_the_loss_is_computed_on_float32_logits():
    model = lab.GPT(width=32, layers=1, heads=2, context=16).bfloat16()
    inputs, targets = lab.batch(torch.arange(200) % 256, 2, 16, torch.Generator().manual_seed(0))
    loss = lab.next_token_loss(model, inputs, targets)
    logits, _ = model(inputs)
    assert loss.dtype == torch.float32
    assert loss.item() == F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).item()


def test_the_shipped_checkpoint_loads_small_and_trained():
    assert lab.CHECKPOINT.stat().st_size < 1.5e6
    model = lab.load_gpt()
    assert not model.training and {p.dtype for p in model.parameters()} == {torch.float32}
    record = json.loads(lab.CHECKPOINT.with_suffix(".json").read_text())
    assert record["command"] == lab.REGENERATE
    validation_loss = lab.mean_loss(model, lab.token_splits()[1], batches=2)
    assert validation_loss < math.log(256) / 4  # far below guessing
    assert lab.generate(model, "The ", 8).isascii()


def test_a_missing_checkpoint_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m tools.reference --gpt"):
        lab.load_gpt(tmp_path / "missing.pt")


def test_the_checkpoint_command_trains_and_records():
    model, summary = reference.train_gpt(steps=2, batch_size=2, validation_batches=1)
    assert summary["steps"] == 2
    assert summary["parameters"] == sum(p.numel() for p in model.parameters())
    assert {"final_train_loss", "validation_loss", "train_seconds", "cpu", "torch"} <= set(summary)


def test_trace_table_lines_up_columns_and_leaves_out_absent_rows():
    columns = {"A": {"mm": "bfloat16 x2"}, "B": {"mm": "float16 x2", "gelu": "float16 x1"}}
    table = lab.trace_table(columns, {"mm": "Linear", "gelu": "GELU", "absent": "never ran"})
    lines = table.splitlines()
    assert len(lines) == 3 and "absent" not in table
    assert lines[2].split() == ["gelu", "GELU", "-", "float16", "x1"]


def test_08_1_accepts_the_float32_loss_and_rejects_the_bfloat16_one():
    logits, next_bytes = solutions.exercise_08_1_logits()
    unfixed = F.cross_entropy(logits.flatten(0, 1), next_bytes.flatten())
    assert unfixed.dtype == torch.bfloat16
    for upcast in (logits.float(), logits.double()):
        loss = F.cross_entropy(upcast.flatten(0, 1), next_bytes.flatten())
        assert helpers.exercises.grade("08.1", loss.item())
    assert not helpers.exercises.grade("08.1", unfixed.item())
    with torch.no_grad():
        fp32_model_loss = lab.next_token_loss(lab.load_gpt(), *lab.batch(
            lab.token_splits()[1], 16, 64, torch.Generator().manual_seed(3))).item()
    assert not helpers.exercises.grade("08.1", fp32_model_loss)  # the bfloat16 model stays


def test_08_2_is_the_measured_cache_and_rejects_the_usual_slips():
    right = 2 * 3 * 2 * 32 * 2 * 100 * 4  # K and V, layers, heads, head_dim, bytes, tokens, batch
    assert solution("08.2") == right
    # forgetting K and V, float32 bytes, no batch, per token
    for wrong in (right // 2, right * 2, right // 4, right // 100):
        assert not helpers.exercises.grade("08.2", wrong)


FP16_MIN = torch.finfo(torch.float16).min
WRONG_MASKS = {  # answer -> words of the failed condition the check names
    "unfixed: -1e9 added": (lambda s, a: (s + ((~a).float() * -1e9).half()[:, None]).softmax(-1),
                            "made inf"),
    "-inf fill": (lambda s, a: s.masked_fill(~a[:, None], float("-inf")).softmax(-1), "made inf"),
    "finfo.min added": (lambda s, a: (s + torch.zeros_like(s).masked_fill(~a[:, None], FP16_MIN))
                        .softmax(-1), "`add` made inf"),
    "nan_to_num on the softmax output": (
        lambda s, a: (s + ((~a).float() * -1e9).half()[:, None]).softmax(-1).nan_to_num(), "made inf"),
    "no mask": (lambda s, a: s.softmax(-1), "disallowed key"),
    "the scores rescaled": (lambda s, a: (s / 2).masked_fill(~a[:, None], FP16_MIN).softmax(-1),
                            "not a softmax of their scores"),
    "float32's min in float16": (
        lambda s, a: s.masked_fill(~a[:, None], torch.finfo(torch.float32).min).softmax(-1), "raised"),
    "a number": (3.0, "function attention_weights itself"),
    "a fill of -45, below the small scores only": (
        lambda s, a: s.masked_fill(~a[:, None], -45.0).softmax(-1),
        "at or below -280, a real token still gives weight"),
    "the wrong signature": (lambda s: s.softmax(-1), "raised TypeError"),
}


@pytest.mark.parametrize("name", WRONG_MASKS)
def test_08_3_names_what_is_wrong_with_each_unsafe_mask(name):
    answer, words = WRONG_MASKS[name]
    reason = helpers.exercises.feedback("08.3", answer)
    assert reason is not None and words in reason and "\n" not in reason, reason


def test_08_3_accepts_every_safe_fill_and_the_notebook_cell_shows_the_nan():
    right = [solutions.attention_weights,
             lambda s, a: s.masked_fill(~a[:, None], -1e4).softmax(-1),  # any finite fill
             lambda s, a: torch.where(a.unsqueeze(1), s, torch.tensor(FP16_MIN).half()).softmax(dim=-1),
             lambda s, a: (s.float() + (~a[:, None]).float() * -1e9).softmax(-1).half()]  # an island
    assert [helpers.exercises.feedback("08.3", answer) for answer in right] == [None] * len(right)
    pad, allowed, hidden = solutions.exercise_08_3_inputs()
    added, fixed = (WRONG_MASKS["unfixed: -1e9 added"][0], solutions.attention_weights)
    outputs = []
    for mask in (added, fixed):  # the notebook's two layers: NaN at real tokens, then none
        h = hidden
        for _ in range(2):
            h = mask(h @ h.transpose(-2, -1) * h.shape[-1] ** -0.5, allowed) @ h
        outputs.append(h.squeeze(1)[pad].isnan().any().item())
    assert outputs == [True, False]
    # the notebook's own scores never fall to -16: there an added finfo.min would still look fine
    scores = hidden @ hidden.transpose(-2, -1) * hidden.shape[-1] ** -0.5
    assert scores.min() > -16


def _comparison(ratio, low, high, verdict):
    return helpers.timing.Comparison(ratio=ratio, low=low, high=high, verdict=verdict,
                                     baseline_s=1.0, candidate_s=1.0 / ratio, threads=2)


def test_a_decoding_round_holds_five_calls_of_the_slowest():
    import time
    calls = []
    def slow():
        calls.append(1)
        time.sleep(0.03)
    assert lab.round_seconds(lambda: None, slow) >= 5 * 0.03
    assert len(calls) == 4  # a warm-up, then the median of 3
    assert lab.round_seconds(lambda: None, floor=0.1) == 0.1
    assert lab.round_seconds(slow, cap=0.1) == 0.1  # a stalled machine: capped


@pytest.mark.parametrize("prefill, decode, verdict", [
    ((2.0, 1.8, 2.2), (1.7, 1.5, 1.9), "faster"),
    ((0.4, 0.35, 0.45), (0.5, 0.45, 0.55), "slower"),
    ((2.0, 1.8, 2.2), (0.9, 0.5, 1.6), "no clear difference"),  # decoding's interval straddles 1x
])
def test_the_chat_turn_is_judged_from_both_intervals(prefill, decode, verdict):
    """08 §5's chat_verdict (typed in its cell): the turn's interval from both intervals' ends."""
    chat_verdict = definitions("08", "chat_ratio", "chat_verdict")["chat_verdict"]
    m = {"tokens": 32, "prefill": _comparison(*prefill, "faster"), "decode": _comparison(*decode, "faster")}
    median, low, high, judged = chat_verdict(1.0, m)
    assert low <= median <= high and judged == verdict


def _audit_cells():
    """Section 7's audit, its model built to overflow and its float32 island, as the notebook types them."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from tests.support import definitions
    namespace = {"torch": torch, "TorchDispatchMode": TorchDispatchMode, "tree_leaves": tree_leaves}
    return definitions("08", "OpMaxima", "fp16_audit", "RMSNorm", "SensorNet", "Float32", namespace=namespace)


def test_the_audit_names_the_module_whose_inner_op_overflows_float16():
    cells = _audit_cells()
    torch.manual_seed(0)
    net = cells["SensorNet"]().eval()
    readings = 1000 * torch.rand(64, 16, generator=torch.Generator().manual_seed(1))
    keep, maxima = cells["fp16_audit"](net, readings)
    assert list(keep) == ["norm"] and any(why.startswith("pow ") for why in keep["norm"])
    assert maxima[("norm", "pow")] > torch.finfo(torch.float16).max > maxima[("embed", "addmm")]
    quiet = readings / 100  # activations far below 256: nothing to keep
    assert cells["fp16_audit"](net, quiet)[0] == {}


def test_the_audit_flags_weights_too_large_or_too_small_for_float16():
    cells = _audit_cells()
    net = cells["SensorNet"]().eval()
    quiet = torch.rand(8, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        net.head.weight[0, 0] = 1e-9  # nonzero, below 2**-24: float16 stores 0
        net.embed.bias[0] = 2e4  # above 65504 / 8
    keep, _ = cells["fp16_audit"](net, quiet)
    assert any("1 nonzero weights of head.weight" in why for why in keep["head"])
    assert any(why.startswith("embed.bias reaches") for why in keep["embed"])
    with torch.no_grad():
        net.embed.bias[0] = 0.0
    assert set(cells["fp16_audit"](net, quiet, margin=1.0)[0]) == {"head"}


def test_the_audit_maps_each_op_to_the_innermost_module_and_removes_its_hooks():
    cells = _audit_cells()
    net = cells["SensorNet"]().eval()
    ones = torch.ones(2, 16)
    with torch.no_grad(), cells["OpMaxima"](net) as recorder:
        net(ones)
    modules = {module for module, _ in recorder.maxima}
    assert {"embed", "norm", "head"} <= modules and "(outside)" not in modules
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


def test_a_float32_island_keeps_the_float16_model_right():
    cells = _audit_cells()
    torch.manual_seed(0)
    net = cells["SensorNet"]().eval()
    readings = 1000 * torch.rand(32, 16, generator=torch.Generator().manual_seed(3))
    half = copy.deepcopy(net).half()
    with torch.no_grad():
        expected = net(readings)
        broken = half(readings.half()).float()
        half.norm = cells["Float32"](half.norm)
        fixed = half(readings.half()).float()
    assert (broken - expected).abs().max() > 0.5
    torch.testing.assert_close(fixed, expected, rtol=0, atol=1e-2)  # float16's rounding of the head's inputs


def test_section_5_reads_the_rule_with_the_shared_helpers_only():
    assert not hasattr(lab, "chat_finding") and not hasattr(lab, "decode_explanation")
    source = "\n".join(c for c in code_cells("08") if "roof.reason(dec" in c)
    assert "helpers.timing.against_rule(dec, expected, verdicts=verdicts)" in source
