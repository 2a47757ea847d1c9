"""Tests of the solver's own list schedules (solver.list_schedule) and their use as hints.

Tiny instances carry the expected schedule worked out by hand; random
instances check every list schedule against masa.sched.checker and check that
hinting with them never changes a proven optimum.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sched_graphs import solver_instance

from masa.cli.main import main as masa_main
from masa.sched.checker import check_schedule
from masa.sched.taskgraph import Lock, Task, TaskKind
from solver.instance import Instance, RandomSpec, random_instance
from solver.list_schedule import best_list_schedule, list_schedules
from solver.options import SolveOptions
from solver.schedules import schedule_makespan, serial_schedule
from solver.search import solve_instance

pytestmark = pytest.mark.solver

# Bounded by CP-SAT's deterministic time (one worker, a fixed seed): the same
# outcome however loaded the machine is; the wall-time limit is a safety net.
FAST = SolveOptions(time_limit_s=600.0, max_deterministic_time=10.0, search_workers=1, seed=3)


_instance = solver_instance


def _problems(instance: Instance, schedule: object) -> list[str]:
    graph = replace(instance.graph, start_after=())  # a heuristic-only rule
    return check_schedule(graph, list(schedule), workers=instance.workers,
                          memory_budget_bytes=instance.memory, check_durations=True)


def test_heavy_load_first_reaches_the_hand_worked_optimum() -> None:
    """L(2, direct 4) locks 4 until E(3, direct 1); X(6, direct 3); budget 9; 2 workers.

    While L runs it needs 4 + 4 = 8, so X (3) cannot run beside it (11 > 9);
    beside E or the lock alone it can (4 + 1 + 3 = 8). L and X conflict, so
    the makespan is at least 2 + 6 = 8, reached by L at 0, then E and X at 2.
    Longest-tail-first starts X first (L then waits until 6: makespan 11);
    largest-memory-first finds 8, and the best rule is returned.
    """
    tasks = [Task("L", TaskKind.LOAD, 2, 4), Task("E", TaskKind.EXEC, 3, 1),
             Task("X", TaskKind.EXEC, 6, 3)]
    instance = _instance(tasks, workers=2, memory=9, precedence=(("L", "E"),),
                         locks=(Lock("w", "L", ("E",), 4),))
    by_rule = dict(list_schedules(instance))
    assert schedule_makespan(by_rule["tail"]) == 11
    assert schedule_makespan(by_rule["memory"]) == 8
    found = best_list_schedule(instance, schedule_makespan)
    assert found is not None and schedule_makespan(found[1]) == 8
    assert _problems(instance, found[1]) == []
    assert solve_instance(instance, FAST).makespan_us == 8


def test_a_load_is_placed_just_in_time_for_its_exec() -> None:
    """A(5) -> E(1); L(2) -> E, L locks 1 until E ends; 2 workers, ample memory.

    E cannot start before A ends at 5, so loading L at 0 would only hold its
    weights 3 units longer: every rule starts L at 5 - 2 = 3.
    """
    tasks = [Task("A", TaskKind.EXEC, 5, 0), Task("L", TaskKind.LOAD, 2, 1),
             Task("E", TaskKind.EXEC, 1, 0)]
    instance = _instance(tasks, workers=2, memory=10,
                         precedence=(("A", "E"), ("L", "E")),
                         locks=(Lock("w", "L", ("E",), 1),))
    for _, schedule in list_schedules(instance):
        starts = {item.task_id: item.start_us for item in schedule}
        assert (starts["A"], starts["L"], starts["E"]) == (0, 3, 5)


@pytest.mark.parametrize("spec", [
    RandomSpec(networks=4, layers=6, seed=1, tightness=1.2),
    RandomSpec(networks=3, layers=5, seed=7, tightness=1.1, workers=3),
    RandomSpec(networks=2, layers=4, seed=2, tightness=1.5, unload=True),
    RandomSpec(networks=3, layers=4, seed=5, tightness=1.2, release_gap=30),
    RandomSpec(networks=3, layers=4, seed=4, tightness=1.2, identical=True),
])
def test_every_list_schedule_is_valid_and_seeded(spec: RandomSpec) -> None:
    instance = random_instance(spec)
    found = list_schedules(instance, seed=5)
    assert found, "at least one rule completes"
    for name, schedule in found:
        assert sorted(item.task_id for item in schedule) == sorted(instance.graph.by_id)
        assert _problems(instance, schedule) == [], name
    assert found == list_schedules(instance, seed=5)


def test_list_schedules_beat_the_serial_fallback_on_a_tight_instance() -> None:
    """On a memory-tight 48-task instance the best list schedule uses both workers:
    it is well below the serial schedule (one task at a time = the total work)."""
    instance = random_instance(RandomSpec(networks=4, layers=6, seed=1, tightness=1.2))
    serial = schedule_makespan(serial_schedule(instance.graph))
    found = best_list_schedule(instance, schedule_makespan)
    assert found is not None
    assert schedule_makespan(found[1]) < 0.75 * serial


def test_list_hints_keep_the_optimum() -> None:
    """Hinting (and bounding) with list schedules never cuts off an optimum: the
    proven makespan is the same with and without them, in both formulations."""
    for seed in (1, 2, 3):
        instance = random_instance(RandomSpec(networks=2, layers=3, seed=seed,
                                              tightness=1.2))
        plain = solve_instance(instance, replace(FAST, list_hints=False))
        hinted = solve_instance(instance, FAST)
        paper = solve_instance(instance, replace(FAST, formulation="paper"))
        assert plain.status == hinted.status == paper.status == "OPTIMAL"
        assert plain.makespan_us == hinted.makespan_us == paper.makespan_us
        assert _problems(instance, hinted.schedule) == []


def test_a_worse_given_hint_is_replaced_by_a_list_schedule() -> None:
    """Given the serial schedule as hint and almost no time, the solver still
    answers with a schedule at least as good as the best list schedule."""
    instance = random_instance(RandomSpec(networks=4, layers=8, seed=1, tightness=1.2))
    serial = serial_schedule(instance.graph)
    best = best_list_schedule(instance, schedule_makespan, seed=0)
    assert best is not None
    result = solve_instance(instance, SolveOptions(time_limit_s=600.0,
                                                   max_deterministic_time=0.01,
                                                   search_workers=1, seed=0), hint=serial)
    assert result.makespan_us is not None
    assert result.makespan_us <= schedule_makespan(best[1]) < schedule_makespan(serial)
    assert result.hint_objective == schedule_makespan(best[1])  # where the search started
    assert _problems(instance, result.schedule) == []


def test_set_times_search_keeps_the_optimum() -> None:
    """The set-times decision strategy (and, with two search workers, its own
    subsolver) only changes how CP-SAT searches: the proven optimum is the
    one CP-SAT's default portfolio proves."""
    for seed in (5, 6):
        instance = random_instance(RandomSpec(networks=3, layers=2, seed=seed, tightness=1.2))
        default = solve_instance(instance, replace(FAST, search="default"))
        set_times = solve_instance(instance, replace(FAST, search="set_times"))
        two_workers = solve_instance(instance, replace(FAST, search="set_times",
                                                       search_workers=2))
        assert default.status == set_times.status == two_workers.status == "OPTIMAL"
        assert default.makespan_us == set_times.makespan_us == two_workers.makespan_us
        assert _problems(instance, two_workers.schedule) == []
    assert solve_instance(instance, replace(FAST, search="auto")).makespan_us == \
        default.makespan_us
    with pytest.raises(ValueError, match="search must be one of"):
        solve_instance(instance, replace(FAST, search="dfs"))


def test_masa_optimal_search_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Every --search and --direction choice, --plain and --no-hint reach the same
    optimum."""
    spec = "networks=2,layers=3,seed=3,tightness=1.2"
    makespans = []
    for extra in ([], ["--search", "set_times"], ["--search", "default"], ["--plain"],
                  ["--no-hint"], ["--direction", "forward"], ["--direction", "backward"]):
        assert masa_main(["optimal", "--random", spec, "--json", "--search-workers", "1",
                          "--seed", "3", "--time-limit", "600", "--dtime-limit", "10",
                          *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["status"] == "OPTIMAL" and out["solver_check"] == []
        makespans.append(out["optimal_makespan"])
        forward = "--plain" in extra or "forward" in extra
        assert out["direction"] == ("forward" if forward else "backward"), extra
        if "--plain" in extra:
            assert out["probes"] == 0
    assert len(set(makespans)) == 1
