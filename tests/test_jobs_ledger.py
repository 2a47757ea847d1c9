"""Everything the process holds for a job is in the ledger (issue 10, the ledger side).

masa.sched.jobs adds, besides each stage's resident and outputs locks, the
network instance's input tensors (`j{job}/{network}/inputs`, opened by the
first EXEC that reads a network input) and keeps each network's final outputs
until every final-stage EXEC of the job has ended. These tests build a
two-network job from small hand-made manifests and check the graph, the
ledger in simulation (budgets, peaks, release of every byte), the context
modes and failures (every byte back, ended jobs forgotten), the checker, the
planner and the solver on the new lock shapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import pytest

from masa.runtime.driver import Driver, Recorder
from masa.runtime.registry import POLICY_NAMES, make_policy
from masa.runtime.virtual import VirtualBackend, simulate_graph
from masa.sched.checker import check_schedule, memory_intervals, memory_profile
from masa.sched.context import ContextController
from masa.sched.core import GroupStatus, new_state
from masa.sched.jobs import JobSpec, build_job_graph, build_workload_graph, tensor_bytes
from masa.sched.policies import MasaPolicy
from masa.sched.taskgraph import Lock, ScheduledTask, TaskGraph, validate_graph
from model_prep.manifest import NetworkManifest, Stage, StageProfile, TensorSpec

ORDER = ["det", "face", "blank"]
# det: a chain whose first stage reads the image. face: two entry stages read
# the crop (s1 the mask too), s2 joins them and reads the mask again (a skip
# input), and two final stages s3 and s4. blank: one stage reading no input.
DET = {"s0": ((), ("image",)), "s1": (("s0",), ()), "s2": (("s1",), ())}
FACE = {"s0": ((), ("crop",)), "s1": ((), ("crop", "mask")), "s2": (("s0", "s1"), ("mask",)),
        "s3": (("s2",), ()), "s4": (("s2",), ())}
BLANK = {"s0": ((), ())}
INPUT_ELEMENTS = {"image": 2_000, "crop": 500, "mask": 100}
OUTPUT_ELEMENTS = 10


def _tensor(name: str, elements: int) -> TensorSpec:
    return TensorSpec(name=name, dtype="float32", shape=(1, elements), size_bytes=4 * elements)


def _manifest(name: str, stages: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]],
              exec_time_us: int = 50) -> NetworkManifest:
    """stage id -> (producers, network inputs it reads); small profiled costs."""
    profile = StageProfile(
        load_time_us=100, exec_time_us=exec_time_us, exec_runs=1, load_peak_bytes=300,
        resident_bytes=200, exec_peak_bytes=100, sampled_load_peak_bytes=0,
        sampled_exec_peak_bytes=0, sampling_interval_us=2.0)
    built = []
    consumed = {p for producers, _ in stages.values() for p in producers}
    for stage_id, (producers, reads) in stages.items():
        inputs = tuple(_tensor(f"{p}_out", OUTPUT_ELEMENTS) for p in producers)
        inputs += tuple(_tensor(n, INPUT_ELEMENTS[n]) for n in reads)
        built.append(Stage(
            stage_id=stage_id, file=f"stages/{stage_id}.onnx", sha256="0" * 64,
            op_types=("Gemm",), layer_type="fc", inputs=inputs,
            outputs=(_tensor(f"{stage_id}_out", OUTPUT_ELEMENTS),), producers=producers,
            weight_bytes=200, profile=profile))
    read = dict.fromkeys(n for _, reads in stages.values() for n in reads)
    return NetworkManifest(
        name=name, source_path=f"{name}.onnx", source_sha256="0" * 64, ir_version=8,
        opsets=(("", 17),), inputs=tuple(_tensor(n, INPUT_ELEMENTS[n]) for n in read),
        outputs=tuple(s.outputs[0] for s in built if s.stage_id not in consumed),
        stages=tuple(built))


# face runs longer than det, so det's final outputs wait for face's.
MANIFESTS = {"det": _manifest("det", DET), "face": _manifest("face", FACE, exec_time_us=400),
             "blank": _manifest("blank", BLANK)}
UPSTREAMS = {"face": ("det",)}
IMAGE_BYTES = 4 * INPUT_ELEMENTS["image"]
FACE_INPUT_BYTES = 4 * (INPUT_ELEMENTS["crop"] + INPUT_ELEMENTS["mask"])


def _job_graph(job_id: int = 0, networks: Sequence[str] = ("det", "face"),
               upstreams: Mapping[str, Sequence[str]] | None = None) -> TaskGraph:
    return build_job_graph(JobSpec(job_id, 0, tuple(networks)), MANIFESTS, ORDER,
                           upstreams=upstreams)


def _locks(graph: TaskGraph) -> dict[str, Lock]:
    return {lock.lock_id: lock for lock in graph.locks}


def _without_inputs_locks(graph: TaskGraph) -> TaskGraph:
    return replace(graph, locks=tuple(lock for lock in graph.locks
                                      if not lock.lock_id.endswith("/inputs")))


# ---------------------------------------------------------------- the graph

def test_inputs_lock_has_the_input_bytes_and_the_first_reading_exec_opens_it() -> None:
    graph = _job_graph()
    assert validate_graph(graph) == []
    locks = _locks(graph)
    det = locks["j0/det/inputs"]
    assert det.from_task == "j0/det/s0/exec"
    assert det.memory_bytes == IMAGE_BYTES == tensor_bytes(MANIFESTS["det"].inputs[0])
    face = locks["j0/face/inputs"]
    assert face.from_task == "j0/face/s0/exec"
    assert face.memory_bytes == FACE_INPUT_BYTES
    assert face.memory_bytes == sum(tensor_bytes(t) for t in MANIFESTS["face"].inputs)
    # The executor drops an instance's inputs when the instance ends: held until
    # every EXEC of the instance has ended.
    assert set(face.until_tasks) == {f"j0/face/s{i}/exec" for i in range(5)}
    assert set(det.until_tasks) == {f"j0/det/s{i}/exec" for i in range(3)}
    # The opener is the first input-reading EXEC to start.
    exec_edges = {pair for pair in graph.start_after if pair[0].endswith("/exec")}
    assert exec_edges == {("j0/face/s0/exec", "j0/face/s1/exec"),
                          ("j0/face/s0/exec", "j0/face/s2/exec")}
    assert graph.footprint_bytes("j0/face/s0/exec") == 100 + 4 * OUTPUT_ELEMENTS + \
        FACE_INPUT_BYTES


def test_network_reading_no_input_has_no_inputs_lock() -> None:
    graph = _job_graph(networks=("blank",))
    assert "j0/blank/inputs" not in _locks(graph)
    assert len(graph.locks) == 2 and graph.start_after == ()


def test_final_outputs_are_kept_until_every_final_stage_of_the_job_ends() -> None:
    graph = _job_graph(networks=("det", "face", "blank"))
    locks = _locks(graph)
    job_sinks = {"j0/det/s2/exec", "j0/face/s3/exec", "j0/face/s4/exec", "j0/blank/s0/exec"}
    for sink in job_sinks:
        lock = locks[sink.replace("/exec", "/outputs")]
        assert lock.from_task == sink and set(lock.until_tasks) == job_sinks
        assert lock.memory_bytes == 4 * OUTPUT_ELEMENTS
    # Inner stages keep theirs only until their consumers end.
    assert locks["j0/face/s2/outputs"].until_tasks == ("j0/face/s3/exec", "j0/face/s4/exec")
    assert locks["j0/det/s0/outputs"].until_tasks == ("j0/det/s1/exec",)
    # Another job's sinks are not waited for.
    two = build_workload_graph([JobSpec(0, 0, ("det",)), JobSpec(1, 0, ("det",))],
                               MANIFESTS, ORDER)
    assert _locks(two)["j0/det/s2/outputs"].until_tasks == ("j0/det/s2/exec",)


# ---------------------------------------------------------------- the ledger

def test_simulation_within_budget_releases_everything_and_its_peak_includes_the_inputs() -> None:
    graph = _job_graph(networks=("det",))
    budget = IMAGE_BYTES + 1_000
    result = simulate_graph(graph, workers=1, memory_budget_bytes=budget)
    assert result.over_commits == () and result.final_reserved_bytes == 0
    assert result.memory_timeline[-1][1] == 0
    assert IMAGE_BYTES < result.peak_reserved_bytes <= budget
    # The inputs are held from the first EXEC's start to the last EXEC's end.
    starts = {e.task_id: e.start_us for e in result.schedule}
    ends = {e.task_id: e.end_us for e in result.schedule}
    for time_us, reserved in result.memory_timeline:
        if starts["j0/det/s0/exec"] <= time_us < ends["j0/det/s2/exec"]:
            assert reserved >= IMAGE_BYTES
    without = simulate_graph(_without_inputs_locks(graph), workers=1,
                             memory_budget_bytes=budget)
    assert without.peak_reserved_bytes < IMAGE_BYTES
    assert check_schedule(graph, result.schedule, workers=1, memory_budget_bytes=budget,
                          check_durations=True) == []


_Timeline = Sequence[tuple[int, int] | tuple[int, int, int | None]]


def _ledger_matches_checker(graph: TaskGraph, timeline: _Timeline,
                            schedule: Sequence[ScheduledTask]) -> None:
    """At every instant the driver recorded, the ledger held what the checker counts
    (the last record of an instant is the state after everything at it)."""
    profile = memory_profile(graph, schedule)
    reserved_at = {record[0]: record[1] for record in timeline}
    for time_us, reserved in reserved_at.items():
        held = next((held for t, held in reversed(profile) if t <= time_us), 0)
        assert reserved == held, time_us


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_ledger_and_checker_agree_on_the_new_locks_under_every_policy(policy: str) -> None:
    graph = build_workload_graph(
        [JobSpec(0, 0, ("det", "face", "blank")), JobSpec(1, 300, ("det", "face"))],
        MANIFESTS, ORDER)
    budget = IMAGE_BYTES + FACE_INPUT_BYTES + 3_000
    result = simulate_graph(graph, policy=make_policy(policy), workers=2,
                            memory_budget_bytes=budget)
    assert result.final_reserved_bytes == 0 and result.unfinished == ()
    assert set(result.group_status.values()) == {"done"}
    _ledger_matches_checker(graph, result.memory_timeline, result.schedule)
    aware = policy not in ("bulk", "deepeye")
    assert check_schedule(graph, result.schedule, workers=2,
                          memory_budget_bytes=budget if aware else None,
                          allowed_over_commits=[o.task_id for o in result.over_commits],
                          check_durations=True) == []
    # det's final outputs stay until face's last final stage has ended.
    ends = {e.task_id: e.end_us for e in result.schedule}
    kept = [end for start, end, _, owner in memory_intervals(graph, result.schedule)
            if owner == "j1/det/s2/exec"]
    assert max(kept) == max(ends["j1/face/s3/exec"], ends["j1/face/s4/exec"],
                            ends["j1/det/s2/exec"])


# ---------------------------------------------------------------- context, failures, forget

def _drive(graph: TaskGraph, *, context: ContextController | None = None,
           failing: Sequence[str] = (), budget: int = 20_000, forget: bool = True
           ) -> tuple[Driver, Recorder]:
    recorder = Recorder()
    driver = Driver(new_state(2, budget, MasaPolicy()), VirtualBackend(failing),
                    context=context, observers=[recorder], forget_ended=forget)
    driver.add(graph)
    driver.run()
    return driver, recorder


def _assert_released_and_forgotten(graph: TaskGraph, driver: Driver, recorder: Recorder,
                                   budget: int = 20_000, forgotten: bool = True) -> None:
    state = driver.state
    assert state.ledger.reserved_bytes == 0
    assert recorder.memory_timeline[-1][1] == 0
    if forgotten:
        assert state.tasks == {} and state.locks == {} and state.groups == {}
    else:
        assert all(info.released or not info.held for info in state.locks.values())
    assert check_schedule(graph, recorder.schedule, workers=2, memory_budget_bytes=budget,
                          allowed_over_commits=[o.task_id for o in recorder.over_commits]
                          ) == []
    _ledger_matches_checker(graph, recorder.memory_timeline, recorder.schedule)


def test_ca_wait_skip_releases_the_kept_outputs_at_once_and_forgets_the_job() -> None:
    graph = _job_graph()
    controller = ContextController("wait", UPSTREAMS, decide=lambda job, net, outs: False)
    driver, recorder = _drive(graph, context=controller)
    assert recorder.group_status == {"j0/det": GroupStatus.DONE,
                                     "j0/face": GroupStatus.CANCELLED}
    assert all(e.worker < 0 for e in recorder.schedule if "/face/" in e.task_id)
    # Nothing is held once det has ended: face's skip ended det's kept outputs.
    det_end = max(e.end_us for e in recorder.schedule if "/det/" in e.task_id)
    assert recorder.memory_timeline[-1] == (det_end, 0, None)
    _assert_released_and_forgotten(graph, driver, recorder)
    assert controller.outcome == {}  # forgotten with the job


def test_ca_wait_open_keeps_det_outputs_until_face_ends() -> None:
    graph = _job_graph()
    controller = ContextController("wait", UPSTREAMS, decide=lambda job, net, outs: True)
    driver, recorder = _drive(graph, context=controller)
    assert set(recorder.group_status.values()) == {GroupStatus.DONE}
    det_end = max(e.end_us for e in recorder.schedule if "/det/" in e.task_id)
    held_after_det = [reserved for t, reserved, _ in recorder.memory_timeline if t == det_end]
    assert held_after_det and held_after_det[-1] >= 4 * OUTPUT_ELEMENTS
    _assert_released_and_forgotten(graph, driver, recorder)


def test_ca_preempt_abort_releases_everything_and_forgets_the_job() -> None:
    graph = _job_graph(upstreams=UPSTREAMS)
    controller = ContextController("preempt", UPSTREAMS, decide=lambda job, net, outs: False)
    driver, recorder = _drive(graph, context=controller)
    assert recorder.group_status["j0/face"] is GroupStatus.CANCELLED
    face = [e for e in recorder.schedule if "/face/" in e.task_id]
    # It started early and was aborted midway: some of its tasks ran, others never did.
    assert any(e.worker >= 0 for e in face) and any(e.worker < 0 for e in face)
    _assert_released_and_forgotten(graph, driver, recorder)



# The last failing task: face's first EXEC fails while face's other tasks run (det
# ended, its outputs kept): stopping them ends the job, and the driver must hand
# the failure's released locks to the backend before it forgets the job.
@pytest.mark.parametrize("forget", [False, True])
@pytest.mark.parametrize("failing", ["j0/det/s2/exec", "j0/face/s2/exec", "j0/face/s0/exec"])
def test_a_failed_network_still_releases_the_job_and_forgets_it(failing: str,
                                                                 forget: bool) -> None:
    graph = _job_graph()
    driver, recorder = _drive(graph, failing=[failing], forget=forget)
    failed_group = failing.rsplit("/", 2)[0]
    assert recorder.group_status[failed_group] is GroupStatus.FAILED
    _assert_released_and_forgotten(graph, driver, recorder, forgotten=forget)


def test_many_jobs_with_mixed_fates_leave_nothing_behind() -> None:
    """CA-preempt over 12 jobs, every other face aborted, one det failing."""
    jobs = [JobSpec(job_id, job_id * 150, ("det", "face", "blank")) for job_id in range(12)]
    graph = build_workload_graph(jobs, MANIFESTS, ORDER, upstreams=UPSTREAMS)
    controller = ContextController("preempt", UPSTREAMS,
                                   decide=lambda job, net, outs: job % 2 == 0)
    driver, recorder = _drive(graph, context=controller, failing=["j5/det/s1/exec"])
    statuses = recorder.group_status
    assert statuses["j5/det"] is GroupStatus.FAILED
    assert statuses["j5/face"] is GroupStatus.CANCELLED
    assert statuses["j4/face"] is GroupStatus.DONE and statuses["j3/face"] is \
        GroupStatus.CANCELLED
    _assert_released_and_forgotten(graph, driver, recorder)


# ---------------------------------------------------------------- solver

@pytest.mark.solver
def test_solver_keeps_the_inputs_opener_rule_and_agrees_with_the_simulator() -> None:
    from solver.instance import graph_to_instance, mirrored, model_start_after, without_load_order
    from solver.options import SolveOptions
    from solver.search import solve_instance

    graph = _job_graph()
    kept = set(model_start_after(graph))
    assert kept == {("j0/face/s0/exec", "j0/face/s1/exec"),
                    ("j0/face/s0/exec", "j0/face/s2/exec")}
    budget = IMAGE_BYTES + FACE_INPUT_BYTES + 1_500
    instance = graph_to_instance(graph, workers=2, memory_bytes=budget)
    # det's final outputs wait for face's: no exact mirror for a two-network job.
    assert mirrored(instance) is None
    options = SolveOptions(time_limit_s=600.0, max_deterministic_time=10.0,
                           search_workers=1, seed=3)
    result = solve_instance(instance, options)
    assert result.status == "OPTIMAL"
    assert check_schedule(without_load_order(graph), result.schedule, workers=2,
                          memory_budget_bytes=budget, check_durations=True) == []
    heuristic = simulate_graph(graph, workers=2, memory_budget_bytes=budget)
    assert heuristic.over_commits == ()
    assert result.makespan_us <= heuristic.makespan_us
    # Dropping the inputs locks can only help the optimum.
    loose = solve_instance(graph_to_instance(_without_inputs_locks(graph), workers=2,
                                             memory_bytes=budget), options)
    assert loose.makespan_us <= result.makespan_us
    # One network with one input reader and one final stage has an exact mirror.
    alone = graph_to_instance(_job_graph(networks=("det",)), workers=2, memory_bytes=budget)
    assert mirrored(alone) is not None
    assert solve_instance(alone, options).direction == "backward"
