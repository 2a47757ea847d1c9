"""Tests of the CP-SAT solver, the instance format and `masa-optimal`.

Tiny instances carry their optimum worked out by hand in the docstring; random
instances check the solver against the `masa` heuristic in the simulator and
every schedule against masa.sched.checker.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from sched_graphs import solver_instance

import solver.evaluation
from masa.cli.main import main as masa_main
from masa.common.errors import UserError
from masa.runtime.registry import make_policy
from masa.runtime.virtual import simulate_graph
from masa.sched.checker import check_schedule
from masa.sched.taskgraph import Lock, ScheduledTask, Task, TaskGraph, TaskKind
from solver.analysis import (
    conflict_cliques,
    identical_groups,
    least_missing_bytes,
    mean_response_lower_bound_us,
    static_lower_bound,
    storage_mean_response_lower_bound_us,
)
from solver.instance import (
    Instance,
    RandomSpec,
    check_feasible,
    infeasibility_reasons,
    instance_from_dict,
    instance_to_dict,
    load_instance,
    minimum_memory,
    mirror_schedule,
    mirrored,
    parse_random_spec,
    random_instance,
    write_instance,
)
from solver.options import SolveOptions, SolveResult
from solver.schedules import assign_workers, response_sum, schedule_makespan, serial_schedule
from solver.search import solve_instance
from workloads.generation import scenario_path
from workloads.zoo import write_zoo

pytestmark = pytest.mark.solver

# One search worker, a fixed seed and a limit in CP-SAT's deterministic time:
# the same search, and so the same outcome, however loaded the machine is. The
# wall-time limit is only a safety net, far above what the tests need.
FAST = SolveOptions(time_limit_s=600.0, max_deterministic_time=10.0, search_workers=1, seed=3)
# The same for `masa optimal`.
CLI_LIMITS = ("--search-workers", "1", "--seed", "3", "--time-limit", "600",
              "--dtime-limit", "10")


def main(argv: list[str]) -> int:
    """`masa optimal ARGS` (what `masa-optimal ARGS` runs)."""
    return masa_main(["optimal", *argv])


def _task(task_id: str, duration: int, memory: int = 0, kind: TaskKind = TaskKind.EXEC,
          release: int = 0, job: int = 0, group: str = "") -> Task:
    return Task(task_id, kind, duration, memory, release_us=release, job_id=job, group=group)


_instance = solver_instance


def _checked(instance: Instance, result: SolveResult) -> SolveResult:
    # The solver ignores start_after (a rule of the heuristic only, as in cli.evaluate).
    graph = replace(instance.graph, start_after=())
    problems = check_schedule(graph, result.schedule, workers=instance.workers,
                              memory_budget_bytes=instance.memory, check_durations=True)
    assert problems == []
    return result


def _solve(instance: Instance, options: SolveOptions = FAST) -> SolveResult:
    return _checked(instance, solve_instance(instance, options))


# ---------------------------------------------------------------- hand-worked optima

def test_independent_tasks_share_the_workers() -> None:
    """A(3), B(4), C(5), no memory pressure.

    1 worker: everything in sequence, 3 + 4 + 5 = 12.
    2 workers: C alone on one worker, A then B on the other: max(5, 7) = 7, and
    no split of {3, 4, 5} into two sets does better (best pair sums 7 vs 5).
    """
    tasks = [_task("A", 3), _task("B", 4), _task("C", 5)]
    assert _solve(_instance(tasks, workers=1, memory=10)).makespan_us == 12
    two = _solve(_instance(tasks, workers=2, memory=10))
    assert (two.status, two.makespan_us, two.bound) == ("OPTIMAL", 7, 7)
    assert {item.worker for item in two.schedule} == {0, 1}


def test_direct_memory_serialises_tasks() -> None:
    """A(3, mem 6) and B(4, mem 6) with budget 10 cannot overlap (12 > 10): 3 + 4 = 7.

    With budget 12 they run side by side: max(3, 4) = 4.
    """
    tasks = [_task("A", 3, 6), _task("B", 4, 6)]
    assert _solve(_instance(tasks, workers=2, memory=10)).makespan_us == 7
    assert _solve(_instance(tasks, workers=2, memory=12)).makespan_us == 4


def test_lock_holds_memory_from_load_start_to_exec_end() -> None:
    """L(2) -> E(3, mem 2); L locks 5 until E ends; X(4, mem 4); budget 8; 2 workers.

    The lock spans [start L, end E), at least 5 long. X (4) with the lock (5)
    needs 9 > 8, so X runs entirely before L or after E: 5 + 4 = 9. Without the
    lock's memory, X runs beside the chain: max(2 + 3, 4) = 5.
    """
    tasks = [_task("L", 2, 0, TaskKind.LOAD), _task("E", 3, 2), _task("X", 4, 4)]
    lock = Lock("w", "L", ("E",), 5)
    instance = _instance(tasks, workers=2, memory=8, precedence=(("L", "E"),), locks=(lock,))
    result = _solve(instance)
    assert (result.status, result.makespan_us) == ("OPTIMAL", 9)
    free = _instance(tasks, workers=2, memory=8, precedence=(("L", "E"),),
                     locks=(replace(lock, memory_bytes=0),))
    assert _solve(free).makespan_us == 5


def test_lock_until_several_tasks_ends_with_the_last() -> None:
    """A(1) opens a lock of 6 until both B(2) and C(5) end (A -> B, A -> C); D(3, mem 5).

    Budget 10, 2 workers. The lock lasts from A's start to C's end (>= 6 long);
    D (5) cannot run beside it (11 > 10), so D goes before A or after C:
    1 + 5 + 3 = 9 (B runs beside C). Were the lock until B alone, D could start
    after B ends (at 3) beside C: max(1 + 5, 1 + 2 + 3) = 6.
    """
    tasks = [_task("A", 1), _task("B", 2), _task("C", 5), _task("D", 3, 5)]
    precedence = (("A", "B"), ("A", "C"))
    both = _instance(tasks, workers=2, memory=10, precedence=precedence,
                     locks=(Lock("l", "A", ("B", "C"), 6),))
    assert _solve(both).makespan_us == 9
    only_b = _instance(tasks, workers=2, memory=10, precedence=precedence,
                       locks=(Lock("l", "A", ("B",), 6),))
    assert _solve(only_b).makespan_us == 6


def test_release_and_precedence() -> None:
    """A(2) -> B(3); C(4) released at 10. 2 workers: A, B done by 5; C runs 10..14."""
    tasks = [_task("A", 2), _task("B", 3), _task("C", 4, release=10)]
    instance = _instance(tasks, workers=2, memory=1, precedence=(("A", "B"),))
    result = solve_instance(instance, replace(FAST, decompose=False))
    assert result.makespan_us == 14
    starts = {item.task_id: item.start_us for item in _checked(instance, result).schedule}
    assert starts["B"] >= 2 and starts["C"] >= 10


def test_response_objective_runs_shortest_job_first() -> None:
    """Jobs 0 (one task of 5) and 1 (one task of 2), both released at 0, 1 worker.

    Makespan is 7 either way; the sum of response times is 2 + 7 = 9 when the
    short job goes first (5 + 7 = 12 otherwise).
    """
    tasks = [_task("long", 5, job=0), _task("short", 2, job=1)]
    instance = _instance(tasks, workers=1, memory=1)
    result = _solve(instance, replace(FAST, objective="response"))
    assert (result.status, result.objective_value, result.makespan_us) == ("OPTIMAL", 9, 7)
    assert response_sum(instance.graph, result.schedule) == 9
    assert result.schedule[0].task_id == "short"


def test_crossing_locks_are_proven_infeasible_as_data() -> None:
    """Lock 1 from A until B, lock 2 from C until D, with A -> D and C -> B; budget 10.

    Each task alone needs 6 <= 10, so no structural reason is found. But
    whichever of A and C starts first, its lock is still held when the other
    starts (its closer must wait for the other), so 6 + 6 = 12 > 10 at that
    instant: no schedule exists. The solver says INFEASIBLE, without raising.
    """
    tasks = [_task(name, 1) for name in "ABCD"]
    instance = _instance(tasks, workers=2, memory=10, precedence=(("A", "D"), ("C", "B")),
                         locks=(Lock("l1", "A", ("B",), 6), Lock("l2", "C", ("D",), 6)))
    assert infeasibility_reasons(instance) == []
    for formulation in ("cumulative", "paper"):
        result = solve_instance(instance, replace(FAST, formulation=formulation))
        assert (result.status, result.schedule, result.gap) == ("INFEASIBLE", (), None)


# ---------------------------------------------------------------- structural infeasibility

def test_structural_infeasibility_names_the_task_or_lock() -> None:
    tasks = [_task("L", 1, 0, TaskKind.LOAD), _task("E", 1, 3), _task("big", 1, 50)]
    instance = _instance(tasks, workers=1, memory=20, precedence=(("L", "E"),),
                         locks=(Lock("weights", "L", ("E",), 25),))
    reasons = infeasibility_reasons(instance)
    assert any("lock 'weights'" in reason for reason in reasons)
    assert any("task 'big'" in reason for reason in reasons)
    # E needs its own 3 plus the 25 locked across it.
    assert any("task 'E' needs 28" in reason for reason in reasons)
    with pytest.raises(UserError, match="infeasible"):
        check_feasible(instance)


def test_cyclic_precedence_is_rejected_with_the_cycle() -> None:
    raw = {"workers": 1, "memory": 10,
           "tasks": [{"id": i, "kind": "exec", "duration": 1, "memory": 0} for i in "abc"],
           "precedence": [["a", "b"], ["b", "c"], ["c", "a"]]}
    with pytest.raises(UserError, match=r"at 'precedence': cyclic precedence: .*a"):
        instance_from_dict(raw, "cyc.json")


# ---------------------------------------------------------------- instance format

def test_instance_validation_reports_every_problem_with_its_path() -> None:
    raw = {"workers": 0, "memory": "lots",
           "tasks": [{"id": "a", "kind": "run", "duration": -1, "memory": 0},
                     {"id": "a", "kind": "exec", "duration": 1},
                     "oops"],
           "precedence": [["a", "zz"], ["a"]],
           "locks": [{"from": "a", "until": ["a", "nope"], "memory": 1}],
           "colour": 1}
    with pytest.raises(UserError) as caught:
        instance_from_dict(raw, "bad.json")
    message = str(caught.value)
    for expected in ("bad.json: at 'workers': expected an integer >= 1",
                     "at 'memory': expected an integer, got 'lots'",
                     "at 'tasks[0].kind': expected one of load, exec, unload",
                     "at 'tasks[0].duration': expected an integer >= 0",
                     "at 'tasks[1].id': duplicate task id 'a'",
                     "at 'tasks[1].memory': missing field",
                     "at 'tasks[2]': expected an object",
                     "at 'precedence[0][1]': unknown task 'zz'",
                     "at 'precedence[1]': expected a pair",
                     "at 'locks[0].until[1]': unknown task 'nope'",
                     "at 'colour': unknown field"):
        assert expected in message, expected
    assert "\n" not in message


def test_issue_example_round_trips_and_until_accepts_a_list(tmp_path: Path) -> None:
    raw = {"workers": 2, "memory": 100,
           "tasks": [{"id": "A.s1.load", "kind": "load", "duration": 4, "memory": 0},
                     {"id": "A.s1.exec", "kind": "exec", "duration": 2, "memory": 5,
                      "release": 0}],
           "precedence": [["A.s1.load", "A.s1.exec"]],
           "locks": [{"from": "A.s1.load", "until": "A.s1.exec", "memory": 30}]}
    instance = instance_from_dict(raw)
    assert instance.graph.locks[0].until_tasks == ("A.s1.exec",)
    assert instance.graph.task("A.s1.load").kind is TaskKind.LOAD
    listed = instance_from_dict({**raw, "locks": [{"from": "A.s1.load",
                                                   "until": ["A.s1.exec"], "memory": 30}]})
    assert listed.graph == instance.graph
    path = tmp_path / "issue.json"
    write_instance(instance, path)
    again = load_instance(path)
    assert again.graph == instance.graph and again.workers == 2 and again.memory == 100
    assert _solve(again).makespan_us == 6
    generated = random_instance(RandomSpec(networks=2, layers=3, unload=True, release_gap=5))
    assert instance_from_dict(instance_to_dict(generated)).graph == generated.graph


def test_load_instance_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="missing.json: cannot read instance"):
        load_instance(tmp_path / "missing.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"workers": 1,\n "memory": }')
    with pytest.raises(UserError, match=r"broken.json: line 2 column \d+: invalid JSON"):
        load_instance(broken)


def test_random_generator_is_seeded_and_respects_its_knobs() -> None:
    spec = RandomSpec(networks=3, layers=4, seed=7, tightness=1.2, unload=True)
    first, second = random_instance(spec), random_instance(spec)
    assert first.graph == second.graph and first.memory == second.memory
    assert first.num_tasks == 3 * 4 * 3
    assert random_instance(replace(spec, seed=8)).graph != first.graph
    assert first.memory == -(-12 * minimum_memory(first.graph) // 10)
    assert infeasibility_reasons(first) == []
    slow_loads = random_instance(replace(spec, load_ratio=5.0))
    kinds = {TaskKind.LOAD: 0, TaskKind.EXEC: 0}
    for task in slow_loads.graph.tasks:
        if task.kind in kinds:
            kinds[task.kind] += task.duration_us
    assert kinds[TaskKind.LOAD] > 2 * kinds[TaskKind.EXEC]
    assert parse_random_spec("networks=2, layers=5,seed=3,unload=1,tightness=1.3") == \
        RandomSpec(networks=2, layers=5, seed=3, unload=True, tightness=1.3)
    for bad in ("networks", "size=3", "layers=two", "tightness=0.5"):
        with pytest.raises(UserError, match="--random"):
            parse_random_spec(bad)


# ---------------------------------------------------------------- solver properties

def test_both_formulations_agree_on_small_instances() -> None:
    for seed in range(4):
        instance = random_instance(RandomSpec(networks=2, layers=3, seed=seed,
                                              tightness=1.3, workers=2 + seed % 2,
                                              unload=seed % 2 == 1))
        cumulative = _solve(instance)
        paper = _solve(instance, replace(FAST, formulation="paper"))
        plain = _solve(instance, replace(FAST, symmetry_breaking=False, redundant=False))
        assert cumulative.status == paper.status == plain.status == "OPTIMAL"
        assert cumulative.makespan_us == paper.makespan_us == plain.makespan_us, seed


def test_heuristic_is_never_better_than_the_optimum() -> None:
    """The masa policy in the simulator vs CP-SAT on 12 seeded instances.

    Both schedules pass the checker (the heuristic's allowing only its recorded
    progress-rule over-commits). A heuristic schedule within the budget is
    never shorter than the optimum, and it is the solver's hint and upper bound.
    """
    within_budget = 0
    for seed in range(12):
        instance = random_instance(RandomSpec(
            networks=2 + seed % 2, layers=3, seed=100 + seed, tightness=(1.1, 1.5, 3.0)[seed % 3],
            load_ratio=(1.0, 4.0)[seed % 2], workers=1 + seed % 3))
        heuristic = simulate_graph(instance.graph, policy=make_policy("masa"),
                                   workers=instance.workers, memory_budget_bytes=instance.memory)
        over_commits = [item.task_id for item in heuristic.over_commits]
        assert check_schedule(instance.graph, heuristic.schedule, workers=instance.workers,
                              memory_budget_bytes=instance.memory,
                              allowed_over_commits=over_commits) == []
        hint = None if over_commits else heuristic.schedule
        result = _checked(instance, solve_instance(instance, FAST, hint=hint))
        assert result.status == "OPTIMAL", seed
        assert result.hint_used == (hint is not None)
        if not over_commits:
            within_budget += 1
            assert heuristic.makespan_us >= result.makespan_us, seed
    assert within_budget >= 8


def test_deterministic_with_one_search_worker_and_a_seed() -> None:
    instance = random_instance(RandomSpec(networks=3, layers=3, seed=5, tightness=1.2))
    first = solve_instance(instance, FAST)
    second = solve_instance(instance, FAST)
    assert first.status == "OPTIMAL"
    assert first.schedule == second.schedule


def test_identical_networks_are_detected_and_symmetry_keeps_the_optimum() -> None:
    instance = random_instance(RandomSpec(networks=3, layers=3, seed=2, identical=True,
                                          tightness=1.2))
    classes = identical_groups(instance.graph)
    assert len(classes) == 1 and len(classes[0]) == 3
    different = random_instance(RandomSpec(networks=3, layers=3, seed=2, tightness=1.2))
    assert identical_groups(different.graph) == []
    broken = _solve(instance, replace(FAST, symmetry_breaking=False))
    assert _solve(instance).makespan_us == broken.makespan_us


def test_conflict_cliques_only_group_tasks_that_cannot_overlap() -> None:
    """Four loads of weights 6 (direct 6, lock 6: each needs 12) under budget 20.

    Any two of them would hold 24 > 20, so all four form one clique; a small
    exec with no lock can run beside any of them and joins no clique.
    """
    tasks = [_task(f"L{i}", 2, 6, TaskKind.LOAD) for i in range(4)]
    tasks += [_task(f"E{i}", 1, 1) for i in range(4)]
    instance = _instance(tasks, workers=2, memory=20,
                         precedence=tuple((f"L{i}", f"E{i}") for i in range(4)),
                         locks=tuple(Lock(f"w{i}", f"L{i}", (f"E{i}",), 6) for i in range(4)))
    cliques = conflict_cliques(instance.graph, instance.memory)
    assert cliques and set(cliques[0]) >= {"L0", "L1", "L2", "L3"}
    result = _solve(instance)
    assert result.makespan_us == 4 * 2 + 1  # loads one at a time, the last exec after


def test_decomposition_by_release_time_is_exact() -> None:
    """Two networks released 1000 apart: the first is long done when the second arrives."""
    instance = random_instance(RandomSpec(networks=2, layers=3, seed=4, tightness=1.2,
                                          release_gap=1000))
    split = _solve(instance)
    whole = _solve(instance, replace(FAST, decompose=False))
    assert split.segments == 2 and whole.segments == 1
    assert split.status == whole.status == "OPTIMAL"
    assert split.makespan_us == whole.makespan_us
    for objective in ("response",):
        options = replace(FAST, objective=objective)
        assert _solve(instance, options).objective_value == \
            _solve(instance, replace(options, decompose=False)).objective_value
    # Released only 1 apart, the first segment overlaps the second: merged.
    close = random_instance(RandomSpec(networks=2, layers=3, seed=4, tightness=1.2,
                                       release_gap=1))
    assert _solve(close).segments == 1


def test_unproven_result_reports_bound_and_gap() -> None:
    instance = random_instance(RandomSpec(networks=4, layers=6, seed=1, tightness=1.2))
    result = solve_instance(instance, replace(FAST, max_deterministic_time=0.1))
    assert result.status in ("FEASIBLE", "UNKNOWN", "OPTIMAL")
    if result.status == "FEASIBLE":
        assert result.bound is not None and result.bound <= result.objective_value
        assert result.gap is not None and 0.0 <= result.gap < 1.0
        _checked(instance, result)


def test_serial_schedule_is_a_valid_fallback_hint() -> None:
    instance = random_instance(RandomSpec(networks=3, layers=4, seed=6, tightness=1.2))
    serial = serial_schedule(instance.graph)
    assert check_schedule(instance.graph, serial, workers=1,
                          memory_budget_bytes=instance.memory, check_durations=True) == []
    assert schedule_makespan(serial) == sum(t.duration_us for t in instance.graph.tasks)
    result = _checked(instance, solve_instance(
        instance, replace(FAST, max_deterministic_time=1.0), hint=serial))
    assert result.hint_used and result.makespan_us is not None
    assert result.makespan_us <= schedule_makespan(serial)


def test_assign_workers_colours_intervals() -> None:
    intervals = [("a", 0, 4), ("b", 0, 2), ("c", 2, 5), ("d", 4, 6), ("z", 6, 6)]
    workers = assign_workers(intervals, 2)
    schedule = [ScheduledTask(t, workers[t], s, e) for t, s, e in intervals]
    graph = TaskGraph(tasks=tuple(_task(t, e - s) for t, s, e in intervals))
    assert check_schedule(graph, schedule, workers=2, memory_budget_bytes=0) == []


# ---------------------------------------------------------------- the command

def test_masa_optimal_json_on_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                     ) -> None:
    instance = random_instance(RandomSpec(networks=2, layers=3, seed=9, tightness=1.3,
                                          unload=True))
    path = tmp_path / "inst.json"
    write_instance(instance, path)
    gantt = tmp_path / "gantt.png"
    code = main([str(path), "--json", *CLI_LIMITS, "--gantt", str(gantt)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "OPTIMAL" and out["optimal_makespan"] == out["best_makespan"]
    assert out["heuristic_makespan"] >= out["optimal_makespan"]
    assert out["ratio"] == pytest.approx(out["heuristic_makespan"] / out["optimal_makespan"])
    assert out["solver_check"] == [] and out["checker_available"]
    assert len(out["schedule"]) == instance.num_tasks
    assert {"id", "worker", "start", "end"} <= set(out["schedule"][0])
    assert gantt.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_masa_optimal_random_text_and_overrides(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    written = tmp_path / "random.json"
    code = main(["--random", "networks=2,layers=2,seed=1", "--workers", "1", "--memory", "500",
                 *CLI_LIMITS, "--write-instance", str(written)])
    assert code == 0
    text = capsys.readouterr().out
    assert "status: OPTIMAL" in text and "optimal_makespan:" in text and "ratio:" in text
    saved = load_instance(written)
    assert (saved.workers, saved.memory) == (1, 500)
    # One worker: the optimum is the total work.
    total = sum(task.duration_us for task in saved.graph.tasks)
    assert f"optimal_makespan: {total} unit" in text


def test_masa_optimal_user_errors_exit_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"workers": 1, "memory": 10, "tasks": [
        {"id": "a", "kind": "exec", "duration": 1, "memory": 50}]}))
    assert main([str(bad)]) == 2
    error = capsys.readouterr().err
    assert "infeasible" in error and "task 'a'" in error and error.count("\n") == 1
    assert main([str(tmp_path / "nope.json")]) == 2
    assert "cannot read instance" in capsys.readouterr().err
    assert main(["--random", "layers=x"]) == 2
    capsys.readouterr()
    assert main(["--random", "layers=2", "--direction", "backward",
                 "--objective", "response"]) == 2
    error = capsys.readouterr().err
    assert "--direction backward" in error and error.count("\n") == 1
    assert main([]) == 2
    assert "missing INSTANCE" in capsys.readouterr().err
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [a]\n")
    assert main([str(workload)]) == 2
    assert "--store" in capsys.readouterr().err


def test_masa_optimal_reports_solver_infeasibility_with_exit_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = {"workers": 2, "memory": 10,
           "tasks": [{"id": i, "kind": "exec", "duration": 1, "memory": 0} for i in "ABCD"],
           "precedence": [["A", "D"], ["C", "B"]],
           "locks": [{"from": "A", "until": "B", "memory": 6},
                     {"from": "C", "until": "D", "memory": 6}]}
    path = tmp_path / "crossing.json"
    path.write_text(json.dumps(raw))
    assert main([str(path), "--json", *CLI_LIMITS]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "INFEASIBLE" and out["best_makespan"] is None


def test_masa_optimal_exits_1_when_a_schedule_fails_the_checker(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A checker finding on the heuristic's or the solver's schedule is a failed
    run (exit 1), still reported in full (one JSON document)."""
    monkeypatch.setattr(solver.evaluation, "check", lambda *args, **kwargs: ["planted"])
    assert main(["--random", "networks=2,layers=2,seed=1", "--json", *CLI_LIMITS]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["solver_check"] == ["planted"] and out["heuristic_check"] == ["planted"]
    assert out["status"] == "OPTIMAL"


def test_masa_optimal_on_a_workload_and_store(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The same graph builder as the scheduler (masa.sched.jobs), on a tiny unprofiled zoo."""
    store = tmp_path / "store"
    write_zoo(store, names=["agenet", "gendernet", "tinyyolo"], scale=0.02, profile=False)
    code = main([str(scenario_path("small")), "--store", str(store), "--workers", "2",
                 "--memory", "5MiB", "--jobs", "2", "--search-workers", "1", "--seed", "3",
                 "--time-limit", "600", "--dtime-limit", "4", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    # 5 MiB: the networks' input tensors are in the ledger (tinyyolo's alone is 2 MB).
    assert out["memory"] == 5 * 1024 * 1024 and out["time_unit"] == "us"
    assert out["status"] in ("OPTIMAL", "FEASIBLE") and out["solver_check"] == []
    assert out["segments"] == 2  # the second job arrives a second later
    assert out["heuristic_makespan"] >= out["bound"]
    assert out["best_makespan"] <= out["heuristic_makespan"]


def test_response_symmetry_only_swaps_what_keeps_jobs_whole() -> None:
    """Jobs 0 and 1 both run networks A (4) and B (1); job 0 also runs C (10); 1 worker.

    The A groups of the two jobs are identical (so are the B groups), but
    swapping A groups across jobs changes the jobs' response times. Optimal
    sum: job 1 first, A1 B1 ends at 5, then A0 B0 C0 ends at 20: 25. Ordering
    A0 before A1 (valid for the makespan, wrong here) would force job 1 to end
    at 9 or later: 29. So no such symmetry breaking may be applied.
    """
    tasks = [_task(f"j{j}.{net}", duration, job=j, group=f"j{j}/{net}")
             for j in (0, 1) for net, duration in (("A", 4), ("B", 1))]
    tasks.append(_task("j0.C", 10, job=0, group="j0/C"))
    instance = _instance(tasks, workers=1, memory=1)
    options = replace(FAST, objective="response")
    assert len(identical_groups(instance.graph)) == 2
    assert _solve(instance, options).objective_value == 25
    assert _solve(instance, replace(options, symmetry_breaking=False)).objective_value == 25


def test_masa_optimal_is_also_a_masa_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    assert masa_main(["optimal", "--random", "networks=2,layers=2,seed=1", "--json",
                      *CLI_LIMITS]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "OPTIMAL" and out["tasks"] == 8
    assert masa_main(["optimal", "--random", "networks=0"]) == 2


# ---------------------------------------------------------------- time reversal

def test_a_mirror_schedule_read_backwards_is_valid_with_the_same_makespan() -> None:
    """Solve the mirror (time reversed) forwards; reading its schedule backwards
    gives a valid schedule of the original of the same makespan, and reading
    that backwards again gives the mirror's schedule back."""
    instance = random_instance(RandomSpec(networks=3, layers=3, seed=7, tightness=1.2,
                                          unload=True))
    mirror = mirrored(instance)
    assert mirror is not None
    assert {(b, a) for a, b in instance.graph.precedence} == set(mirror.graph.precedence)
    solved = solve_instance(mirror, replace(FAST, direction="forward"))
    assert solved.status == "OPTIMAL" and solved.direction == "forward"
    backwards = mirror_schedule(solved.schedule, solved.makespan_us)
    _checked(instance, replace(solved, schedule=tuple(backwards)))
    assert schedule_makespan(backwards) == solved.makespan_us
    assert set(mirror_schedule(backwards, solved.makespan_us)) == set(solved.schedule)


def test_both_directions_prove_the_same_optimum() -> None:
    """Backward search changes only where CP-SAT starts branching: on seeded
    instances (with and without unload tasks, 1-3 workers, one common release
    of 7) it proves the optimum forward search proves, and its schedules,
    read back into forward time, pass the checker."""
    for seed in range(6):
        instance = random_instance(RandomSpec(
            networks=2 + seed % 2, layers=3, seed=200 + seed, tightness=(1.2, 1.6)[seed % 2],
            workers=1 + seed % 3, unload=seed % 3 == 0, load_ratio=(1.0, 4.0)[seed % 2]))
        if seed >= 4:  # released together, later than 0: the mirror starts at 0
            graph = instance.graph
            instance = replace(instance, graph=replace(graph, tasks=tuple(
                replace(task, release_us=7) for task in graph.tasks)))
        forward = _solve(instance, replace(FAST, direction="forward"))
        backward = _solve(instance, replace(FAST, direction="backward"))
        assert (forward.direction, backward.direction) == ("forward", "backward")
        assert forward.status == backward.status == "OPTIMAL", seed
        assert forward.makespan_us == backward.makespan_us, seed
        assert min(item.start_us for item in backward.schedule) >= (7 if seed >= 4 else 0)
        assert _solve(instance).direction == "backward"  # auto, makespan


def test_backward_search_only_where_the_mirror_is_exact() -> None:
    """No mirror for different releases, a lock until several tasks, or a lock
    whose until-task does not descend from its from-task: those instances, and
    the response objective (a mirror keeps the makespan, not response times),
    are solved forwards; asking for backward with the response objective is an
    error."""
    releases = random_instance(RandomSpec(networks=2, layers=2, seed=1, release_gap=3))
    assert mirrored(releases) is None
    tasks = [_task("A", 1), _task("B", 2), _task("C", 5), _task("D", 3, 5)]
    several = _instance(tasks, workers=2, memory=10, precedence=(("A", "B"), ("A", "C")),
                        locks=(Lock("l", "A", ("B", "C"), 6),))
    unrelated = _instance(tasks, workers=2, memory=10, locks=(Lock("l", "A", ("C",), 6),))
    for instance in (releases, several, unrelated):
        assert mirrored(instance) is None
        assert _solve(instance, replace(FAST, direction="backward", decompose=False)
                      ).direction == "forward"
    tight = random_instance(RandomSpec(networks=2, layers=2, seed=1, tightness=1.5))
    assert mirrored(tight) is not None
    assert _solve(tight, replace(FAST, objective="response")).direction == "forward"
    with pytest.raises(ValueError, match="backward"):
        solve_instance(tight, replace(FAST, objective="response", direction="backward"))
    with pytest.raises(ValueError, match="direction must be one of"):
        solve_instance(tight, replace(FAST, direction="sideways"))


# ---------------------------------------------------------------- lower-bound probing

def test_static_lower_bound_takes_work_releases_and_chains() -> None:
    """Work 2 + 3 + 4 = 9 on 2 workers: 5. A released at 0, C at 10: 10 + 4/2 = 12.
    A chain A(2) -> B(3) -> C(4) on 3 workers: 9 beats the work bound 3."""
    tasks = [_task("A", 2), _task("B", 3), _task("C", 4)]
    assert static_lower_bound(_instance(tasks, workers=2, memory=1)) == 5
    released = [_task("A", 2), _task("B", 3), _task("C", 4, release=10)]
    assert static_lower_bound(_instance(released, workers=2, memory=1)) == 14
    chain = _instance(tasks, workers=3, memory=1, precedence=(("A", "B"), ("B", "C")))
    assert static_lower_bound(chain) == 9


def test_mean_response_bound_takes_each_jobs_path_and_shortest_remaining_work() -> None:
    """One job A(2) -> B(3) -> C(4) on 3 workers: its path, 9 (its work / 3 is 3).
    One worker, job 0 of 100 at 0 and job 1 of 10 at 50: shortest remaining work
    first preempts job 0 at 50 (job 1 ends at 60, job 0 at 110): (110 + 10) / 2,
    above the paths' (100 + 10) / 2. Three jobs of 30, 10, 20 at 0: (10 + 30 + 60) / 3
    on one worker; on two, the paths' (30 + 10 + 20) / 3. A job's work shared by the
    workers bounds it too."""
    chain = _instance([_task("A", 2), _task("B", 3), _task("C", 4)], workers=3, memory=1,
                      precedence=(("A", "B"), ("B", "C")))
    assert mean_response_lower_bound_us(chain.graph, 3) == 9
    late_short = _instance([_task("long", 100, job=0), _task("short", 10, release=50, job=1)],
                           workers=1, memory=1)
    assert mean_response_lower_bound_us(late_short.graph, 1) == 60
    three = _instance([_task("a", 30, job=0), _task("b", 10, job=1), _task("c", 20, job=2)],
                      workers=1, memory=1)
    assert mean_response_lower_bound_us(three.graph, 1) == pytest.approx(100 / 3)
    # On 2 workers the fast machine's (5 + 15 + 30) / 3 is below the paths' 20.
    assert mean_response_lower_bound_us(three.graph, 2) == 20
    # A chain of 60 at 0; four tasks of 10 at 100 on 2 workers: their path is 10,
    # their work 20, so (60 + 20) / 2 (paths alone: 35; the fast machine: 25).
    apart = _instance([_task("c0", 30, job=0), _task("c1", 30, job=0)]
                      + [_task(f"w{i}", 10, release=100, job=1) for i in range(4)],
                      workers=2, memory=1, precedence=(("c0", "c1"),))
    assert mean_response_lower_bound_us(apart.graph, 2) == 40


def test_no_schedule_has_a_mean_response_below_the_bound() -> None:
    """CP-SAT's least sum of responses and the three policies, on seeded instances
    whose networks are separate jobs released apart: none beats the bound."""
    for seed in range(6):
        instance = random_instance(RandomSpec(
            networks=3, layers=2, seed=200 + seed, tightness=(1.2, 3.0)[seed % 2],
            load_ratio=(1.0, 4.0)[seed % 2], workers=1 + seed % 2, release_gap=20 * (seed % 3)))
        jobs = len({task.job_id for task in instance.graph.tasks})
        bound_us = mean_response_lower_bound_us(instance.graph, instance.workers)
        assert jobs == 3 and bound_us > 0
        optimum = _solve(instance, replace(FAST, objective="response"))
        assert optimum.status == "OPTIMAL", seed
        assert optimum.objective_value / jobs >= bound_us - 1e-9, seed
        for name in ("masa", "bulk", "deepeye"):
            run = simulate_graph(instance.graph, policy=make_policy(name),
                                 workers=instance.workers, memory_budget_bytes=instance.memory)
            assert response_sum(instance.graph, run.schedule) / jobs >= bound_us - 1e-9, name


def test_least_missing_bytes_keeps_what_fits_between_an_items_requests() -> None:
    """Items A and B of 100 bytes in a room of 150, asked for at 0, 1, 2, 3: both first
    reads miss (200); A is kept whole from 0 to 2, which leaves B 50 bytes at 2, so
    B's second request misses 50. Requests at the same instant share one read; a room
    as large as everything misses only the first reads; no room misses every byte."""
    requests = [(0, "A", 100), (1, "B", 100), (2, "A", 100), (3, "B", 100)]
    assert least_missing_bytes(requests, 150) == 250
    assert least_missing_bytes(requests, 200) == 200
    assert least_missing_bytes(requests, 0) == 400
    assert least_missing_bytes([(5, "A", 100), (5, "A", 100)], 0) == 100
    # 3 jobs of 400 bytes each, read at 100 bytes/s over 3 jobs: (400 + 300 + 300) / 100 / 3
    jobs = [(0, "N", 400), (10_000_000, "N", 400), (20_000_000, "N", 400)]
    assert storage_mean_response_lower_bound_us(jobs, 3, 100, 100) == pytest.approx(
        1_000 / 100 / 3 * 1e6)


def test_least_missing_bytes_is_the_optimum_of_its_linear_program() -> None:
    """The greedy keep (intervals by their right end) against GLOP on the same
    relaxation: keep k_i <= bytes in each interval between an item's requests, the kept
    bytes at every request time within the room; missing = all bytes - sum k_i."""
    from ortools.linear_solver import pywraplp
    rng = np.random.default_rng(14)
    for case in range(40):
        items = {f"n{i}": int(rng.integers(1, 60)) for i in range(int(rng.integers(2, 6)))}
        names = sorted(items)
        requests = [(int(rng.integers(0, 30)), name, items[name])
                    for name in rng.choice(names, size=int(rng.integers(3, 25)))]
        room = int(rng.integers(0, 150))
        times = sorted({t for t, _, _ in requests})
        lp = pywraplp.Solver.CreateSolver("GLOP")
        kept_vars, load_at = [], {t: [] for t in times}
        total = 0
        for name in names:
            asked = sorted({t for t, n, _ in requests if n == name})
            total += items[name] * len(asked)
            for before, after in pairwise(asked):
                kept_var = lp.NumVar(0, items[name], f"kept_{name}_{after}")
                kept_vars.append(kept_var)
                for t in times:
                    if before < t <= after:
                        load_at[t].append(kept_var)
        for t in times:
            lp.Add(sum(load_at[t]) <= room)
        lp.Maximize(sum(kept_vars))
        assert lp.Solve() == pywraplp.Solver.OPTIMAL
        expected = total - lp.Objective().Value()
        assert least_missing_bytes(requests, room) == pytest.approx(expected, abs=1e-6), case


def test_probes_refute_each_makespan_below_the_optimum() -> None:
    """The lock instance of test_lock_holds_memory_from_load_start_to_exec_end:
    optimum 9, static bound 5 (work 9 on 2 workers). Probing refutes 5, 6, 7
    and 8 one after the other and ends at the bound 9, proven, whatever the
    schedule it started from; minimising directly proves the same."""
    tasks = [_task("L", 2, 0, TaskKind.LOAD), _task("E", 3, 2), _task("X", 4, 4)]
    instance = _instance(tasks, workers=2, memory=8, precedence=(("L", "E"),),
                         locks=(Lock("w", "L", ("E",), 5),))
    assert static_lower_bound(instance) == 5
    for list_hints in (True, False):
        probed = _solve(instance, replace(FAST, list_hints=list_hints))
        assert (probed.status, probed.makespan_us, probed.bound) == ("OPTIMAL", 9, 9)
        # With no hint, a first probe finds any schedule: then 5, 6, 7, 8.
        assert probed.probes == (4 if list_hints else 5)
    direct = _solve(instance, replace(FAST, probe=False))
    assert (direct.status, direct.makespan_us, direct.probes) == ("OPTIMAL", 9, 0)


def test_probing_keeps_the_optimum_on_random_instances() -> None:
    for seed in range(4):
        instance = random_instance(RandomSpec(networks=2 + seed % 2, layers=3,
                                              seed=300 + seed, tightness=1.3,
                                              workers=1 + seed % 3))
        probed = _solve(instance)
        direct = _solve(instance, replace(FAST, probe=False))
        assert probed.status == direct.status == "OPTIMAL", seed
        assert probed.makespan_us == direct.makespan_us, seed


def test_probing_tells_an_infeasible_instance() -> None:
    """No deadline can be met when no schedule exists at all: probing asks for
    any schedule first and reports INFEASIBLE, rather than refuting deadline
    after deadline. Network n0 here (budget 24) fits no schedule: loading its
    second stage holds 10 + 10 and, after its first exec, that exec's output
    5 (25); loaded before that exec, its weights 10 sit beside the exec's
    7 + 5 + 5 (27)."""
    instance = random_instance(RandomSpec(networks=2, layers=2, seed=1, tightness=1.2))
    result = solve_instance(instance, FAST)
    assert result.status == "INFEASIBLE" and result.probes == 1 and not result.schedule
