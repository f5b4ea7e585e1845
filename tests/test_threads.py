"""Thread-local autocast and the CPU re-enactment of nn.DataParallel (helpers.threads), and exercises 05.1-05.2."""
from __future__ import annotations

import copy
import inspect
import json
import re
import threading
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import parallel_apply

from helpers.exercises import check, solution
from helpers.threads import (AutocastState, DtypeProbe, Observations, Seen, SharedLog, autocast_state,
                             doc_sentences, observe, parallel_apply_autocast_calls, replay_data_parallel,
                             replay_parallel_apply, run_in_thread, source_lines)

X = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))


def probe_states(probe: DtypeProbe) -> set[tuple]:
    return {(o.autocast_enabled, o.autocast_dtype, o.output_dtype) for o in probe.log}


def test_autocast_state_is_thread_local_flag_and_dtype():
    with torch.amp.autocast("cpu", dtype=torch.float16):
        here = autocast_state("cpu")
        there = run_in_thread(autocast_state, "cpu")
    assert here == AutocastState(True, torch.float16)
    assert there == AutocastState(False, torch.bfloat16)  # CPU autocast's default dtype, not the parent's


def test_a_fresh_thread_starts_with_each_device_default_dtype():
    assert run_in_thread(torch.get_autocast_dtype, "cpu") == torch.bfloat16
    assert run_in_thread(torch.get_autocast_dtype, "cuda") == torch.float16


def test_run_in_thread_runs_elsewhere_returns_and_reraises():
    assert run_in_thread(lambda a, b=0: (threading.current_thread().name, a + b), 2, b=3, name="t1") == ("t1", 5)
    assert run_in_thread(threading.get_ident) != threading.get_ident()

    def fail():
        raise KeyError("from the thread")

    with pytest.raises(KeyError, match="from the thread"):
        run_in_thread(fail)


def test_probe_logs_state_and_output_dtype():
    probe = DtypeProbe()
    probe(X)
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        probe(X)
    assert [(o.autocast_enabled, o.output_dtype) for o in probe.log] == [(False, torch.float32),
                                                                         (True, torch.bfloat16)]
    assert probe.log[0].thread == threading.current_thread().name


def test_shared_log_is_shared_by_copies_but_weights_are_not():
    probe = DtypeProbe()
    replica = copy.deepcopy(probe)
    assert isinstance(probe.log, SharedLog) and replica.log is probe.log
    assert replica.linear.weight is not probe.linear.weight


def test_replay_16_loses_autocast_in_every_replica():
    probe = DtypeProbe()
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        out = replay_data_parallel(probe, X, replicas=3, behaviour="1.6")
    assert out.dtype == torch.float32
    assert probe_states(probe) == {(False, torch.bfloat16, torch.float32)}
    assert sorted(o.thread for o in probe.log) == ["replica-0", "replica-1", "replica-2"]


@pytest.mark.parametrize("outside", [torch.bfloat16, torch.float16])
def test_replay_today_passes_the_flag_but_not_the_dtype(outside):
    probe = DtypeProbe()
    with torch.amp.autocast("cpu", dtype=outside):
        out = replay_data_parallel(probe, X)
    assert out.dtype == torch.bfloat16  # the CPU default, whatever the caller chose
    assert probe_states(probe) == {(True, torch.bfloat16, torch.bfloat16)}


def test_replay_today_keeps_autocast_off_when_it_is_off():
    probe = DtypeProbe()
    assert replay_data_parallel(probe, X).dtype == torch.float32
    assert probe_states(probe) == {(False, torch.bfloat16, torch.float32)}


def test_single_replica_runs_in_the_calling_thread_and_keeps_the_dtype():
    probe = DtypeProbe()
    with torch.amp.autocast("cpu", dtype=torch.float16):
        out = replay_data_parallel(probe, X, replicas=1)
    assert out.dtype == torch.float16
    assert [o.thread for o in probe.log] == [threading.current_thread().name]


@pytest.mark.parametrize("behaviour", ["1.6", "1.7+"])
def test_autocast_inside_forward_fixes_every_version(behaviour):
    fixed = DtypeProbe(amp_dtype=torch.float16)
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        out = replay_data_parallel(fixed, X, behaviour=behaviour)
    assert out.dtype == torch.float16
    assert probe_states(fixed) == {(True, torch.float16, torch.float16)}


def test_replay_scatters_and_gathers_in_order_and_keeps_grad_mode():
    probe = DtypeProbe()
    out = replay_data_parallel(probe, X, replicas=3)
    torch.testing.assert_close(out, probe(X))  # rows in order (chunked matmuls may round differently)
    assert out.requires_grad
    with torch.no_grad():
        assert not replay_data_parallel(probe, X).requires_grad


def test_replay_rejects_bad_arguments_and_reraises_replica_errors():
    probe = DtypeProbe()
    with pytest.raises(ValueError, match="behaviour must be one of"):
        replay_data_parallel(probe, X, behaviour="1.5")
    with pytest.raises(ValueError, match="2 modules but 1 inputs"):
        replay_parallel_apply([probe, probe], [X])
    with pytest.raises(ValueError, match="replicas must be at least 1"):
        replay_data_parallel(probe, X, replicas=0)
    with pytest.raises(RuntimeError):  # a replica's error (wrong input width) reaches the caller
        replay_data_parallel(probe, torch.randn(4, 5))


def test_the_today_worker_matches_the_installed_pytorch():
    """The re-enactment assumes parallel_apply re-enters autocast with the flag only: fail if PyTorch changes."""
    source = inspect.getsource(parallel_apply)
    calls = re.findall(r"autocast\(([^()]*)\)", source)  # arguments of each autocast(...) call, newlines allowed
    assert calls and all("enabled=autocast_enabled" in args and "dtype" not in args for args in calls)
    assert "threading.Thread(" in source


def test_source_lines_numbers_matching_lines_without_paths():
    lines = source_lines(replay_parallel_apply, ["threading.Thread("])
    assert len(lines) == 1 and "threading.Thread(" in lines[0]
    number = int(lines[0].split(":")[0])
    assert number > 1 and "/" not in lines[0]


def test_doc_sentences_picks_sentences_and_plains_sphinx_markup():
    def documented():
        """Short intro.

        .. warning:: It is recommended to use :class:`~torch.nn.parallel.DistributedDataParallel`, not this.
            See :ref:`the DDP notes <ddp>` and :func:`torch.compile`. Another sentence.
        """

    assert doc_sentences(documented, "recommended") == [
        "It is recommended to use `DistributedDataParallel`, not this."]
    assert doc_sentences(documented, "See") == ["See `the DDP notes` and `torch.compile`."]
    assert doc_sentences(documented, "absent") == [] and doc_sentences(lambda: None, "x") == []


def test_data_parallel_docstring_still_recommends_ddp():
    advice = doc_sentences(torch.nn.DataParallel, "DistributedDataParallel")
    assert advice and all(":class:" not in sentence and "\n" not in sentence for sentence in advice)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_real_data_parallel_runs_replicas_in_the_default_dtype():
    probe = DtypeProbe().to("cuda")
    with torch.amp.autocast("cuda", dtype=torch.bfloat16):
        out = torch.nn.DataParallel(probe)(torch.randn(8, 8, device="cuda"))
    assert out.dtype == torch.float16
    assert probe_states(probe) == {(True, torch.float16, torch.float16)}


def test_set_autocast_dtype_is_thread_local_too():
    def set_and_read() -> tuple[torch.dtype, torch.dtype]:
        torch.set_autocast_dtype("cpu", torch.float16)
        return torch.get_autocast_dtype("cpu"), run_in_thread(torch.get_autocast_dtype, "cpu")

    assert run_in_thread(set_and_read) == (torch.float16, torch.bfloat16)


def test_autocast_without_dtype_keeps_the_dtype_current_when_created():
    with torch.amp.autocast("cpu", dtype=torch.float16):
        created_here = torch.amp.autocast("cpu")
    probe = DtypeProbe()

    def enter_and_call() -> torch.dtype:
        with created_here:
            return probe(X).dtype

    assert run_in_thread(enter_and_call) == torch.float16  # the new thread's own default is bfloat16
    assert probe_states(probe) == {(True, torch.float16, torch.float16)}


def test_solution_05_1_set_autocast_dtype_does_not_reach_the_replicas():
    before = torch.get_autocast_dtype("cpu")
    assert solution("05.1") == torch.bfloat16  # the replica threads' own default, not the main thread's float16
    assert torch.get_autocast_dtype("cpu") == before  # the solution leaves the caller's thread alone
    # the same experiment without the replicas: the main thread's setting does apply there
    def main_thread_only() -> torch.dtype:
        torch.set_autocast_dtype("cpu", torch.float16)
        with torch.amp.autocast("cpu"):
            return DtypeProbe()(X).dtype

    assert run_in_thread(main_thread_only) == torch.float16
    assert check("05.1", torch.bfloat16) is True
    assert check("05.1", torch.float16) is False and check("05.1", torch.float32) is False


def test_solution_05_2_bare_autocast_falls_back_to_a_default():
    assert solution("05.2") == torch.bfloat16
    assert check("05.2", torch.bfloat16) is True
    assert check("05.2", torch.float16) is False


def test_observe_returns_what_every_replica_saw():
    probe = DtypeProbe()
    seen = observe(probe, torch.float16, lambda: replay_data_parallel(probe, X))
    assert seen == Seen(torch.float16, ("replica-0", "replica-1"), True, torch.bfloat16, torch.bfloat16)
    assert len(probe.log) == 2
    assert observe(probe, torch.bfloat16, lambda: run_in_thread(probe, X)).threads == ("worker",)
    assert len(probe.log) == 1  # cleared before each call


def test_observe_rejects_replicas_that_disagree():
    probe = DtypeProbe()

    def disagree():
        probe(X)  # autocast on, in this thread
        run_in_thread(probe, X)  # autocast off there

    with pytest.raises(ValueError, match="expected one state"):
        observe(probe, torch.bfloat16, disagree)


def test_seen_and_observations_show_aligned_rows():
    seen = Seen(torch.bfloat16, ("MainThread",), True, torch.bfloat16, torch.bfloat16)
    off = Seen(torch.float16, ("replica-0", "replica-1"), False, torch.bfloat16, torch.float32)
    assert "autocast inside: on, bfloat16" in repr(seen) and "output: bfloat16" in repr(seen)
    assert "autocast inside: off" in repr(off) and "output: float32" in repr(off)
    lines = repr(Observations({"a": seen, "longer name": off})).splitlines()
    assert len(lines) == 2 and lines[0].index("outside") == lines[1].index("outside")
    assert repr(Observations()) == ""


def test_parallel_apply_autocast_calls_pass_the_flag_only():
    calls = parallel_apply_autocast_calls()
    assert calls and all("enabled=autocast_enabled" in c and "dtype" not in c and "\n" not in c for c in calls)


def _notebook_cell(notebook: str, needle: str) -> str:
    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / notebook).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    matching = [s for s in sources if needle in s]
    assert len(matching) == 1, f"expected one cell with {needle!r}"
    return matching[0]


def test_exercise_05_4_broken_code_is_rejected_and_the_repair_accepted():
    namespace = {"torch": torch, "nn": torch.nn}
    exec(_notebook_cell("05_dataparallel_and_ddp.ipynb", "class TinyClassifier"), namespace)  # as given
    broken = namespace["TinyClassifier"](amp_dtype=torch.float16)
    with torch.amp.autocast("cpu", dtype=torch.float16):
        broken_dtype = replay_data_parallel(broken, X).dtype
    assert broken_dtype == torch.bfloat16  # the replica thread's default
    assert check("05.4", broken_dtype) is False
    assert check("05.4", torch.float32) is False
    assert solution("05.4") == torch.float16 and check("05.4", torch.float16) is True
