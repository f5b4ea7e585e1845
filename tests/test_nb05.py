"""Notebook 05's scaffolding (helpers.nb05), its job's script (helpers.ddp_train) and its solutions.

Thread-local autocast and the CPU re-enactment of nn.DataParallel; bounded launches (run_job, one command or
several agents at once); the rank-side experiments run in-process on a one-rank gloo group (DDP agreement,
GradScaler, FSDP2's policy, reduction dtypes, bytes per rank). The two-agent job (two torchrun agents on
loopback: the rendezvous, not a network) is notebook 05's section 6, which plain `pytest` executes and asserts.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import parallel_apply

from helpers import ddp_train, jobs, nb05
from helpers.device import AutocastState, autocast_state
from helpers.exercises import feedback, grade, solution
from helpers.nb05 import (
    DtypeProbe,
    Seen,
    SharedLog,
    free_port,
    local_launch_env,
    observe,
    replay_data_parallel,
    run_in_thread,
    run_job,
    source_block,
    source_lines,
)
from helpers.solutions.nb05 import _gradients
from tests.support import cell_containing, cells, notebook, source

X = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))


def probe_states(probe: DtypeProbe) -> set[tuple]:
    return {entry[1:] for entry in probe.log}  # (autocast on?, autocast dtype, output dtype)


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
    assert run_in_thread(lambda a, b=0: (threading.current_thread().name, a + b), 2, b=3, name="t1") == ("t1_0", 5)
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
    assert [(entry[1], entry[3]) for entry in probe.log] == [(False, torch.float32), (True, torch.bfloat16)]
    assert probe.log[0][0] == threading.current_thread().name


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
    assert sorted(entry[0] for entry in probe.log) == ["replica-0", "replica-1", "replica-2"]


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
    assert [entry[0] for entry in probe.log] == [threading.current_thread().name]


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
    with pytest.raises(ValueError, match="behaviour '1.6' or '1.7\\+'.*not '1.5'"):
        replay_data_parallel(probe, X, behaviour="1.5")
    with pytest.raises(ValueError, match="replicas >= 1.*0"):
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
    lines = source_lines(replay_data_parallel, ["threading.Thread("])
    assert len(lines) == 1 and "threading.Thread(" in lines[0]
    number = int(lines[0].split(":")[0])
    assert number > 1 and "/" not in lines[0]


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
    assert grade("05.1", torch.bfloat16) is True
    assert grade("05.1", torch.float16) is False and grade("05.1", torch.float32) is False
    assert grade("05.1", "bfloat16") is False  # a dtype is asked for, not its name


def test_solution_05_2_bare_autocast_falls_back_to_a_default():
    assert solution("05.2") == torch.bfloat16
    assert grade("05.2", torch.bfloat16) is True
    assert grade("05.2", torch.float16) is False
    assert feedback("05.2", torch.float16) == "that is not the value this exercise computes (the hint may help)"


def test_solutions_05_1_and_05_2_do_not_depend_on_the_order_a_learner_ran_cells():
    """Issue 25's reproduction: 05.1's experiment run in the notebook's own thread (float16 set), its check
    (the first import of the solutions), the dtype reset, then 05.2: the expected answer stayed bfloat16."""
    def learner_order() -> tuple:
        torch.set_autocast_dtype("cpu", torch.float16)  # 05.1's experiment, in the notebook's thread
        module = importlib.import_module("helpers.solutions.nb05")
        importlib.reload(module)  # first imported now, in this state
        first = (solution("05.1"), solution("05.2"))  # computed while float16 is still set
        torch.set_autocast_dtype("cpu", torch.bfloat16)  # the reset the hint allows
        return first, solution("05.2"), grade("05.2", torch.bfloat16)

    module = sys.modules["helpers.solutions.nb05"]
    try:
        assert run_in_thread(learner_order) == ((torch.bfloat16, torch.bfloat16), torch.bfloat16, True)
    finally:
        sys.modules["helpers.solutions.nb05"] = module


def test_observe_returns_what_every_replica_saw():
    probe = DtypeProbe()
    seen = observe(probe, torch.float16, lambda: replay_data_parallel(probe, X))
    assert seen == Seen(torch.float16, ("replica-0", "replica-1"), True, torch.bfloat16, torch.bfloat16)
    assert len(probe.log) == 2
    assert observe(probe, torch.bfloat16, lambda: run_in_thread(probe, X)).threads == ("worker_0",)
    assert len(probe.log) == 1  # cleared before each call


def test_observe_rejects_replicas_that_disagree():
    probe = DtypeProbe()

    def disagree():
        probe(X)  # autocast on, in this thread
        run_in_thread(probe, X)  # autocast off there

    with pytest.raises(ValueError, match="expected one state"):
        observe(probe, torch.bfloat16, disagree)


def test_seen_shows_an_aligned_row():
    seen = Seen(torch.bfloat16, ("MainThread",), True, torch.bfloat16, torch.bfloat16)
    off = Seen(torch.float16, ("replica-0", "replica-1"), False, torch.bfloat16, torch.float32)
    assert "autocast inside: on, bfloat16" in repr(seen) and "output: bfloat16" in repr(seen)
    assert "outside: float16" in repr(off) and "autocast inside: off" in repr(off) and "output: float32" in repr(off)
    assert repr(seen).index("ran in") == repr(off).index("ran in")
    assert repr(seen).index("autocast inside") == repr(off).index("autocast inside")


def _notebook_cell(needle: str) -> str:
    return cell_containing("05", needle)


def _cells_under(heading: str) -> tuple[str, str]:
    """(source, printed output) of the first code cell after the markdown cell containing ``heading``."""
    all_cells = cells(notebook("05"))
    start = next(i for i, c in enumerate(all_cells) if c["cell_type"] == "markdown" and heading in source(c))
    cell = next(c for c in all_cells[start:] if c["cell_type"] == "code")
    printed = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    return source(cell), printed


def _run_cell(source: str, capsys) -> str:
    exec(source, {"lab": nb05})
    return capsys.readouterr().out


JOB = Path(__file__).resolve().parent.parent / "notebooks" / "ddp_fsdp_job.py"
JOB_PROMISES = ("DistributedDataParallel(model)", "torch.amp.autocast(", "GradScaler(", "scaler.scale(loss).backward()",
                "scaler.step(optimizer)", "scaler.update()", "init_process_group(",
                "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
                "fully_shard(layer, mp_policy=policy)", "fully_shard(model, mp_policy=MixedPrecisionPolicy(")


def test_section_6_prints_the_whole_job_and_it_holds_what_sections_6_and_7_promise():
    source, committed = _cells_under("FSDP2 with a mixed-precision policy (section 7):")
    assert source == 'print(Path("ddp_fsdp_job.py").read_text())'
    assert committed == JOB.read_text() + "\n"  # the whole file, as committed
    missing = [line for line in JOB_PROMISES if line not in committed]
    assert not missing, f"the job lacks {missing}"
    assert "ddp_train" not in committed.split("if records:")[0]  # the instrumentation stays apart


def _job_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddp_fsdp_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_jobs_ddp_half_trains_and_keeps_rank_0s_weights(single_rank_group):
    job = _job_module()
    line = job.run_ddp(0, torch.device("cpu"), torch.bfloat16)
    first, last = (float(x) for x in re.findall(r"loss ([\d.]+) -> ([\d.]+)", line)[0])
    assert last < first and line.endswith("weights equal to rank 0's: True")
    assert job.train(*job.model_and_data(0, torch.device("cpu"), steps=2), torch.device("cpu"),
                     torch.float16).startswith("loss ")  # float16: through its GradScaler


def test_the_jobs_fsdp2_half_runs_or_fails_only_on_old_releases(single_rank_group):
    job = _job_module()
    try:
        line = job.run_fsdp(0, torch.device("cpu"))
    except Exception:  # torch 2.4-2.5 on a CPU: FSDP2 assumed a GPU; the job prints why
        assert not hasattr(torch.distributed.fsdp, "fully_shard") and not torch.cuda.is_available()
    else:
        assert re.fullmatch(r"loss [\d.]+ -> [\d.]+", line)


def test_source_block_numbers_the_lines_between_two_markers_and_refuses_a_missing_one():
    block = source_block(replay_data_parallel, "def worker", "threading.Thread(")
    assert "def worker" in block[0] and "threading.Thread(" in block[-1] and len(block) > 3
    assert all(re.match(r"^ *\d+: ", line) for line in block)
    with pytest.raises(ValueError, match="no line containing 'not in the source'"):
        source_block(replay_data_parallel, "not in the source", "threading.Thread(")
    with pytest.raises(ValueError, match="after 'def worker'"):
        source_block(replay_data_parallel, "def worker", "not in the source")


def _exercise_setup(needle: str, **names) -> dict:
    """Run the notebook's exercise cell as given, up to its answer line, and return its names."""
    source = _notebook_cell(needle).split("answer_")[0]
    namespace = {"torch": torch, "nn": torch.nn, **names}
    exec(source, namespace)
    return namespace


class _Lab:  # what the exercise cells call as `lab`
    replay_data_parallel = staticmethod(replay_data_parallel)
    ddp_train = ddp_train


def _wrong_repairs(broken: type) -> dict:
    """Repairs of 05.4 that hide the symptom or fix one case only, each with the feedback it must get."""
    class CastTheResult(broken):  # issue 25: the output's dtype right, the matmuls in the thread's default
        def forward(self, x):
            with torch.amp.autocast(x.device.type):
                return self.body(x).to(self.amp_dtype)

    class AutocastDeleted(broken):
        def forward(self, x):
            return self.body(x).to(self.amp_dtype)

    class HardCoded(broken):  # the repair typed in for one dtype: wrong for a bfloat16 model
        def forward(self, x):
            with torch.amp.autocast(x.device.type, dtype=torch.float16):
                return self.body(x)

    class CallersFlag(broken):  # the 1.6 worker passes no flag: off there
        def forward(self, x):
            with torch.amp.autocast(x.device.type, dtype=self.amp_dtype, enabled=torch.is_autocast_enabled("cpu")):
                return self.body(x)

    class SetsTheThreadsDtype(broken):  # right in the replicas, but leaks into a caller's thread
        def forward(self, x):
            torch.set_autocast_dtype(x.device.type, self.amp_dtype)
            with torch.amp.autocast(x.device.type):
                return self.body(x)

    class HalfWeights(broken):  # pure 16-bit: no float32 weights left to train
        def __init__(self, amp_dtype):
            super().__init__(amp_dtype)
            self.body.to(amp_dtype)

        def forward(self, x):
            return self.body(x.to(self.amp_dtype))

    model_case = "float16 outside, the PyTorch 1.7+ worker)"
    return {
        broken: f"the replica still ran addmm in bfloat16 (a float16 model, {model_case}",
        CastTheResult: f"the replica still ran addmm in bfloat16 (a float16 model, {model_case}",
        AutocastDeleted: f"the replica still ran addmm in bfloat16 (a float16 model, {model_case}",
        HardCoded: f"the replica still ran addmm in float16 (a bfloat16 model, {model_case}",
        CallersFlag: "the replica still ran addmm in float32 (a float16 model, float16 outside, the PyTorch 1.6 "
                     "worker)",
        SetsTheThreadsDtype: "forward changed the calling thread's autocast dtype for good",
        HalfWeights: "the weights are no longer float32: autocast casts per op, the weights stay",
    }


def test_exercise_05_4_judges_the_dtype_of_the_matmuls_inside_the_replicas():
    broken = _exercise_setup("class TinyClassifier", lab=_Lab, x=X)["TinyClassifier"]  # the cell as given
    for wrong, why in _wrong_repairs(broken).items():
        assert feedback("05.4", wrong) == why, wrong.__name__
    for typed in (torch.float16, torch.bfloat16, broken(torch.float16)):  # a dtype, an instance
        assert feedback("05.4", typed).startswith("hand the check the repaired class itself"), typed

    class Repaired(broken):  # the solution's repair
        def forward(self, x):
            with torch.amp.autocast(x.device.type, dtype=self.amp_dtype):
                return self.body(x)

    class WrittenDifferently(broken):  # torch.autocast, keywords, `enabled=`, float32 logits for the loss
        def forward(self, x):
            with torch.autocast(device_type="cpu", dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                logits = self.body(x)
            return logits.float()

    assert feedback("05.4", Repaired) is None and feedback("05.4", WrittenDifferently) is None
    assert torch.get_autocast_dtype("cpu") == torch.bfloat16  # the judge ran in a thread of its own


def test_exercise_05_4_the_trace_sees_the_replicas_own_ops():
    """The judge's trace records in the replica threads: the 1.6 worker (autocast off there) shows float32."""
    from helpers.solutions.nb05 import _Traced

    log = SharedLog()
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        replay_data_parallel(_Traced(DtypeProbe(), log), X, behaviour="1.6")
    assert sorted(thread for thread, _ in log) == ["replica-0", "replica-1"]
    assert {op for _, ops in log for op in ops} == {("addmm", torch.float32)}


def test_exercise_05_5_wants_bfloat16_compute_and_float32_reduction():
    given = _exercise_setup("MixedPrecisionPolicy(param_dtype=torch.bfloat16)", lab=_Lab)
    policy, MixedPrecisionPolicy = given["policy"], given["MixedPrecisionPolicy"]
    assert policy.reduce_dtype is None and grade("05.5", policy) is False  # unset: reduces in param_dtype
    for wrong in ({"reduce_dtype": torch.bfloat16}, {"reduce_dtype": torch.float16},
                  {"param_dtype": torch.float32, "reduce_dtype": torch.float32},
                  {"reduce_dtype": torch.float32, "output_dtype": torch.bfloat16}):
        assert grade("05.5", MixedPrecisionPolicy(**{"param_dtype": torch.bfloat16, **wrong})) is False, wrong
    assert grade("05.5", torch.float32) is False
    assert grade("05.5", MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)) is True
    assert grade("05.5", MixedPrecisionPolicy(torch.bfloat16, torch.float32)) is True  # positional
    assert feedback("05.5", policy) == "the gradients would still be averaged in bfloat16"
    assert feedback("05.5", MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float16)) == (
        "the gradients would still be averaged in float16")
    assert feedback("05.5", MixedPrecisionPolicy(reduce_dtype=torch.float32)) == (
        "the policy no longer computes in bfloat16 (param_dtype)")
    assert feedback("05.5", torch.float32) == "hand the check the repaired MixedPrecisionPolicy, not dtype"


@pytest.mark.parametrize("field, value", [("reduce_dtype", "float32"), ("reduce_dtype", "torch.float32"),
                                          ("param_dtype", "bfloat16")])
def test_exercise_05_5_a_dtype_given_as_a_string_is_told_it_is_a_string(field, value):
    MixedPrecisionPolicy, _ = ddp_train.fsdp2()
    fields = {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32, field: value}
    text = feedback("05.5", MixedPrecisionPolicy(**fields))
    assert f"{field} is {value!r}, a str, not a torch.dtype" in text
    assert "torch.float32" in text or "torch.bfloat16" in text
    assert "averaged in" not in text


# ------------------------------------------------------------------------------ launches: run_job, agents

def test_local_launch_env_drops_job_variables_and_pins_threads_and_loopback():
    base = {"PATH": "/bin", "RANK": "3", "MASTER_ADDR": "10.0.0.1", "GROUP_RANK": "1", "OMP_NUM_THREADS": "8"}
    env = local_launch_env(base)
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "1"
    assert not {"RANK", "MASTER_ADDR", "GROUP_RANK"} & set(env)
    if sys.platform.startswith("linux"):
        assert env["GLOO_SOCKET_IFNAME"] == "lo" and "lo" in {name for _, name in socket.if_nameindex()}
    assert base["RANK"] == "3"  # the caller's mapping is left alone


def test_jobs_reads_the_parent_from_a_stat_line_whose_name_holds_spaces_and_parentheses():
    assert jobs.parent_of("4242 (python (x) y) S 17 4242 4242 0 -1") == 17
    assert os.getpid() in jobs.descendants(os.getppid()) or not Path("/proc").exists()


def test_free_port_is_free_and_on_loopback():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # nothing holds it
    assert 1024 <= port < 65536


def test_run_job_captures_output_and_exit_status():
    done = run_job([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                   timeout=60)
    assert (done.returncode, done.stdout, done.stderr, done.attempts_used) == (3, "out\n", "err\n", 1)


def test_run_job_runs_agents_at_once_on_one_free_port(tmp_path):
    """Two commands that can only finish together (each waits for the other's file) and see the same port."""
    def agents(port: int) -> list[list[str]]:
        return [[sys.executable, "-c", f"import pathlib, time; d = pathlib.Path({str(tmp_path)!r}); "
                 f"(d / '{me}').write_text('{port}'); "
                 f"[time.sleep(0.05) for _ in range(200) if not (d / '{other}').exists()]; "
                 f"print((d / '{other}').read_text())"] for me, other in (("a", "b"), ("b", "a"))]

    runs = run_job(agents, timeout=30)
    assert [run.returncode for run in runs] == [0, 0]
    assert runs[0].stdout == runs[1].stdout == (tmp_path / "a").read_text() + "\n"


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` has ended within ``seconds`` (killed processes may take a moment to go)."""
    deadline = time.perf_counter() + seconds
    while alive(pid) and time.perf_counter() < deadline:
        time.sleep(0.1)
    return not alive(pid)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = f"/proc/{pid}/stat"
    return not (os.path.exists(stat) and open(stat).read().rsplit(") ", 1)[-1].startswith("Z"))


@pytest.mark.skipif(os.name != "posix", reason="stops a process group: POSIX only")
def test_run_job_timeout_stops_the_command_and_its_children(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); "
              "print('grandchild started', file=sys.stderr, flush=True); time.sleep(120)")
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"within 1 s(.|\n)*1 attempt(.|\n)*grandchild started"):
        run_job([sys.executable, "-c", script], timeout=1)
    assert time.perf_counter() - started < 60
    assert gone_within(int(pid_file.read_text()), 10), "the job's child process outlived the timeout"


@pytest.mark.skipif(os.name != "posix", reason="stops a process group: POSIX only")
def test_run_job_stops_a_child_in_a_session_of_its_own_and_tries_again(tmp_path):
    """A launcher's ranks may live in sessions of their own (holding the output pipes): a timeout must still
    return promptly, kill them, and a second attempt may succeed."""
    marker, pid_file = tmp_path / "tried", tmp_path / "detached.pid"
    script = ("import pathlib, subprocess, sys, time; "
              f"m = pathlib.Path({str(marker)!r}); "
              "sys.exit(0) if m.exists() else m.write_text('1'); "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    started = time.perf_counter()
    run = run_job([sys.executable, "-c", script], timeout=1, attempts=2)
    assert run.returncode == 0 and run.attempts_used == 2
    assert time.perf_counter() - started < 30
    assert gone_within(int(pid_file.read_text()), 10), "a process in its own session outlived the timeout"


@pytest.mark.skipif(os.name != "posix", reason="stops a process group: POSIX only")
def test_run_job_retries_agents_on_a_new_port_and_kills_all_of_them(tmp_path):
    ports = []

    def agents(port: int) -> list[list[str]]:
        ports.append(port)
        hang = "import time; time.sleep(120)" if len(ports) == 1 else "print('ok')"
        return [[sys.executable, "-c", hang], [sys.executable, "-c", "print('ok')"]]

    runs = run_job(agents, timeout=1, attempts=2)
    assert [r.stdout for r in runs] == ["ok\n", "ok\n"] and runs[0].attempts_used == 2
    assert len(set(ports)) == 2  # a new port for the second attempt
    with pytest.raises(TimeoutError, match="2 attempt"):
        run_job(lambda port: [[sys.executable, "-c", "import time; time.sleep(120)"]], timeout=1, attempts=2)


# ------------------------------------------------------------------- the job's script: helpers.ddp_train

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
HAS_FSDP2_ON_CPU = hasattr(importlib.import_module("torch.distributed.fsdp"), "fully_shard")  # 2.14.1, not 2.4.1


def test_launch_from_env_reads_torchrun_variables():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    assert ddp_train.launch_from_env(env) == ddp_train.Launch(3, 4, 1, 2, node=1)
    assert ddp_train.launch_from_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}).local_world_size == 2


def test_launch_without_torchrun_says_how_to_start_it():
    with pytest.raises(ddp_train.LaunchError, match="not started by torchrun") as caught:
        ddp_train.launch_from_env({})
    assert ddp_train.EXAMPLE in str(caught.value) and "none is set" in str(caught.value)
    with pytest.raises(ddp_train.LaunchError, match="WORLD_SIZE, LOCAL_RANK not set"):
        ddp_train.launch_from_env({"RANK": "0"})


def test_choose_backend():
    assert ddp_train.choose_backend("auto", 2, cuda_devices=0) == "gloo"
    assert ddp_train.choose_backend("auto", 2, cuda_devices=1) == "gloo"  # not a GPU per process
    assert ddp_train.choose_backend("gloo", 2, cuda_devices=8) == "gloo"
    assert ddp_train.choose_backend("nccl", 2, cuda_devices=2) == "nccl"
    if dist.is_nccl_available():
        assert ddp_train.choose_backend("auto", 2, cuda_devices=2) == "nccl"


def test_parse_args_rejects_bad_values(capsys):
    assert ddp_train.parse_args(["--steps", "5", "--fsdp"]).fsdp is True
    with pytest.raises(SystemExit):
        ddp_train.parse_args(["--steps", "0"])
    assert "--steps must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ddp_train.parse_args(["--backend", "mpi"])
    assert "invalid choice: 'mpi'" in capsys.readouterr().err


def test_main_without_torchrun_prints_a_clear_message_and_returns_2(monkeypatch, capsys):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert ddp_train.main([]) == 2
    out, err = capsys.readouterr()
    assert "not started by torchrun" in err and ddp_train.EXAMPLE in err and out == ""


def test_batches_are_each_ranks_own_and_the_model_the_same_everywhere():
    a, b = ddp_train.batches(0, 2, torch.device("cpu")), ddp_train.batches(1, 2, torch.device("cpu"))
    assert not torch.equal(a[0][0], b[0][0]) and torch.equal(a[0][0], ddp_train.batches(0, 1, "cpu")[0][0])
    first, second = ddp_train.tiny_model("cpu"), ddp_train.tiny_model("cpu")
    assert all(torch.equal(p, q) for p, q in zip(first.parameters(), second.parameters()))
    assert all(p.shape[0] % 8 == 0 for p in first.parameters())  # even shards up to 8 ranks


@pytest.fixture
def single_rank_group():
    """A one-process gloo group in this process (no torchrun, no network)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield ddp_train.Launch(rank=0, world_size=1, local_rank=0, local_world_size=1)
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def test_float16_training_uses_a_grad_scaler_and_counts_saved_tensors():
    data = ddp_train.batches(0, 3, torch.device("cpu"))
    record: dict = {}
    ddp_train.train(ddp_train.tiny_model("cpu"), data, torch.float16, record)
    assert record["grad_scaler"] is True and record["logits"] == "float16" and len(record["losses"]) == 3
    assert all(torch.isfinite(torch.tensor(record["losses"])))
    saved = record["saved"]
    assert ("float16", [64, 64], 64 * 64 * 2) in [tuple(s[:3]) for s in saved]  # autocast's weight copy
    assert record["bytes"] == {"parameters": 5896 * 4, "gradients": 5896 * 4, "optimizer": 5896 * 8}


def test_weight_check_compares_every_rank_with_rank_0(single_rank_group, monkeypatch):
    """One real process stands in for rank 0 of two: the gather hands it a "rank 1" whose first parameter is
    off by 1. The script's exact check must see that, and the summary must say so."""
    gathered_sizes = []

    def all_gather_object(out: list, obj: dict) -> None:
        out[:] = [{**obj, "rank": rank, "node": rank} for rank in range(len(out))]

    def all_gather(out: list, tensor: torch.Tensor) -> None:
        for slot in out:
            slot.copy_(tensor)
        out[1][0] += 1.0
        gathered_sizes.append(tensor.numel())

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    launch = ddp_train.Launch(rank=0, world_size=2, local_rank=0, local_world_size=1)
    report = ddp_train.train_rank(ddp_train.parse_args(["--steps", "2"]), launch, "gloo")
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    ddp = report["ranks"][0]["ddp"]
    assert gathered_sizes == [5896] and ddp["identical"] is False
    assert ddp["max_difference"] == pytest.approx(1.0, rel=1e-3)
    lines = ddp_train.summary_lines(report)
    assert lines[-1] == "parameters identical on every rank: False" and "node 1" in lines[1]


def test_one_rank_job_agrees_with_itself_and_measures_reductions(single_rank_group):
    report = ddp_train.train_rank(ddp_train.parse_args(["--steps", "2", "--fsdp"]), single_rank_group, "gloo")
    rank = report["ranks"][0]
    assert rank["ddp"]["identical"] and rank["ddp"]["parameters"] == rank["ddp"]["gradients"] == "float32"
    # DDP's all-reduce bucket: a float32 copy of every gradient by default, the gradients themselves with views
    for name, in_buckets in (("ddp", False), ("ddp_view", True)):
        assert rank[name]["bytes"]["buckets"] == 5896 * 4 and rank[name]["grads_in_buckets"] is in_buckets
    assert rank["ddp_view"]["identical"] and rank["ddp_view"]["losses"] == rank["ddp"]["losses"]
    reduction = rank["reduction"]
    assert reduction["elements"] == 5896 and reduction["noise"] == 0  # one rank: it is the average
    assert reduction["float32"]["error"] == 0  # nothing to add: the float32 average is exact
    for name in ("bfloat16", "float16"):  # one rounding to 16 bits: a fraction of the format's eps
        eps = torch.finfo(getattr(torch, name)).eps
        assert 0 < reduction[name]["error"] <= eps and reduction[name]["bytes"] == 5896 * 2
    assert ("fsdp" in rank) is HAS_FSDP2_ON_CPU, rank.get("fsdp_error")  # FSDP2 on a CPU: 2.14.1, not 2.4.1
    assert ("fsdp_error" in rank) is not HAS_FSDP2_ON_CPU


@pytest.mark.skipif(not HAS_FSDP2_ON_CPU, reason="FSDP2 on a CPU: seen on torch 2.14.1, not 2.4.1")
def test_fsdp_policy_dtypes_on_one_rank(single_rank_group):
    data = ddp_train.batches(0, 2, torch.device("cpu"))
    record = ddp_train.run_fsdp(data, torch.bfloat16, torch.float32)
    assert record["sharded"] == "DTensor float32 [64, 64] of [64, 64]"  # one rank holds everything
    assert record["unsharded"] == "Parameter bfloat16 [64, 64]" and record["grad_before"] == "bfloat16"
    assert record["grad_after"] == "DTensor float32 [64, 64]"
    assert record["input"] == record["activation"] == "bfloat16"  # cast_forward_inputs; the layers compute in bf16
    assert record["logits"] == "float32"  # the root's output_dtype
    # after forward, the root's own parameters (LayerNorm's) stay gathered for backward; the Linears' are resharded
    assert record["after_forward"] == {"root": "Parameter bfloat16 [64]", "middle": "DTensor float32 [64, 64]"}
    assert record["optimizer_state"] == "DTensor float32 [64, 64]"
    assert [64, 64] in [s[1] for s in record["saved"] if s[2] == 0]  # the gathered weight, freed
    reducing_in_bf16 = ddp_train.run_fsdp(data, torch.bfloat16, torch.bfloat16)
    # reducing in bfloat16, the averaged gradient still lands in the float32 shard's dtype
    assert reducing_in_bf16["grad_after"] == "DTensor float32 [64, 64]"


def test_solution_05_3_batchnorm_breaks_gradient_averaging():
    state = torch.random.get_rng_state()
    assert solution("05.3") is False
    assert torch.equal(torch.random.get_rng_state(), state)  # the learner's generator is left alone
    assert grade("05.3", False) is True and grade("05.3", True) is False
    # Without BatchNorm, the mean of two half-batch gradients is the full-batch gradient (what DDP relies on).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 8))
    inputs, labels = torch.randn(32, 3, 32, 32), torch.randint(0, 8, (32,))
    halves = (_gradients(model, inputs[:16], labels[:16]) + _gradients(model, inputs[16:], labels[16:])) / 2
    full = _gradients(model, inputs, labels)
    # Equal up to rounding: each weight's gradient sums 32 per-image terms, in another order here (measured:
    # 1.8 float32 eps of the largest gradient, on AVX512 and AVX2 kernels). allclose's default atol=1e-8 is not
    # a float32 tolerance for entries near 0.
    tolerance = 32 * torch.finfo(torch.float32).eps * full.abs().max().item()
    torch.testing.assert_close(full, halves, rtol=0, atol=tolerance)
