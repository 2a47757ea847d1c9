"""The discrete-event simulator and the schedule checker.

Every simulated schedule here also goes through the checker; the checker in
turn is shown to catch each kind of violation on schedules broken on purpose.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from sched_graphs import chain_network, merge, random_workload, single

from masa.report.report import build_report, chrome_trace, format_table, write_json
from masa.runtime.driver import Driver
from masa.runtime.registry import make_policy
from masa.runtime.virtual import simulate_graph
from masa.sched.checker import check_schedule, memory_profile
from masa.sched.core import GroupStatus
from masa.sched.taskgraph import ScheduledTask, Task, TaskGraph, TaskKind

POLICIES = ("masa", "bulk", "deepeye")


def allowed(result: object) -> list[str]:
    return [o.task_id for o in result.over_commits]  # type: ignore[attr-defined]


def checked_budget(policy: str, budget_bytes: int) -> int | None:
    """Memory-oblivious policies ignore the budget: the checker skips their memory."""
    return budget_bytes if make_policy(policy).memory_aware else None


def test_simulation_is_deterministic() -> None:
    graph = random_workload(3, jobs=6)
    first = simulate_graph(graph, workers=2, memory_budget_bytes=150)
    second = simulate_graph(graph, workers=2, memory_budget_bytes=150)
    assert first == second
    other = simulate_graph(random_workload(4, jobs=6), workers=2, memory_budget_bytes=150)
    assert other.schedule != first.schedule


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_random_workloads_are_valid_and_leave_the_ledger_empty(policy: str, workers: int) -> None:
    for seed in range(6):
        graph = random_workload(seed)
        budget_bytes = 120
        result = simulate_graph(graph, policy=make_policy(policy), workers=workers,
                                memory_budget_bytes=budget_bytes)
        assert result.unfinished == () and result.final_reserved_bytes == 0
        assert set(result.group_status.values()) == {"done"}
        assert check_schedule(graph, result.schedule, workers=workers,
                              memory_budget_bytes=checked_budget(policy, budget_bytes),
                              allowed_over_commits=allowed(result),
                              check_durations=True) == []
        # The ledger's view and the checker's interval view of memory agree.
        assert result.peak_reserved_bytes == max(
            (held for _, held in memory_profile(graph, result.schedule)), default=0)
        assert max(b for _, b in result.memory_timeline) == result.peak_reserved_bytes
        if policy == "masa":
            for over_commit in result.over_commits:
                assert over_commit.reason == "progress"


def test_masa_never_exceeds_budget_without_a_recorded_over_commit() -> None:
    for seed in range(10):
        graph = random_workload(seed, jobs=5)
        result = simulate_graph(graph, workers=2, memory_budget_bytes=200)
        if not result.over_commits:
            assert result.peak_reserved_bytes <= 200
        for time_us, reserved_bytes in result.memory_timeline:
            if reserved_bytes > 200:
                assert any(o.time_us <= time_us for o in result.over_commits)


def test_makespan_and_timeline_of_a_hand_computed_chain() -> None:
    # One worker: L0 [0,100) E0 [100,150) L1 [150,250) E1 [250,300).
    graph = chain_network(0, 0, [40, 30], exec_bytes=5, output_bytes=2)
    result = simulate_graph(graph, workers=1, memory_budget_bytes=1000)
    starts = {e.task_id: (e.worker, e.start_us, e.end_us) for e in result.schedule}
    assert starts == {
        "j0/n0/s0/load": (0, 0, 100), "j0/n0/s0/exec": (0, 100, 150),
        "j0/n0/s1/load": (0, 150, 250), "j0/n0/s1/exec": (0, 250, 300)}
    assert result.makespan_us == 300
    # One point per instant, after that instant's ends and starts.
    assert result.memory_timeline == ((0, 0), (0, 40), (100, 47), (150, 32), (250, 39),
                                      (300, 0))
    assert memory_profile(graph, result.schedule) == [(0, 40), (100, 47), (150, 32),
                                                      (250, 39), (300, 0)]


@pytest.mark.parametrize("policy", POLICIES)
def test_injected_failures_fail_one_group_and_release_all_memory(policy: str) -> None:
    rng = np.random.default_rng(11)
    for seed in range(5):
        graph = random_workload(seed)
        failing = {graph.tasks[int(i)].task_id for i in rng.choice(len(graph.tasks), 2)}
        result = simulate_graph(graph, policy=make_policy(policy),
                                workers=2, memory_budget_bytes=120,
                                failing_task_ids=failing)
        failed_groups = {graph.by_id[t].group for t in failing}
        assert result.final_reserved_bytes == 0 and result.unfinished == ()
        for group, status in result.group_status.items():
            assert status == ("failed" if group in failed_groups else "done")
        assert check_schedule(graph, result.schedule, workers=2,
                              memory_budget_bytes=checked_budget(policy, 120),
                              allowed_over_commits=allowed(result)) == []


def test_hook_aborts_a_running_group_and_frees_its_memory() -> None:
    """CA-preempt-like: when n0 ends, n1 (already running) is aborted at that instant."""
    graph = merge([chain_network(0, 0, [10], load_us=100, exec_us=10),
                   chain_network(0, 1, [20, 20, 20], load_us=50, exec_us=50)])
    seen: list[tuple[int, str, GroupStatus]] = []

    def hook(control: Driver, group: str, status: GroupStatus) -> None:
        seen.append((control.now_us, group, status))
        if group == "j0/n0":
            control.cancel("j0/n1", "upstream says not needed")

    result = simulate_graph(graph, workers=2, memory_budget_bytes=1000, on_group_end=hook)
    assert seen == [(110, "j0/n0", GroupStatus.DONE), (110, "j0/n1", GroupStatus.CANCELLED)]
    assert result.group_status == {"j0/n0": "done", "j0/n1": "cancelled"}
    assert result.group_reason["j0/n1"] == "upstream says not needed"
    stopped = [e for e in result.schedule if e.task_id.startswith("j0/n1") and e.worker >= 0
               and e.status == "cancelled"]
    assert stopped and all(e.end_us == 110 for e in stopped)
    assert result.final_reserved_bytes == 0 and result.makespan_us == 110
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=1000) == []


@pytest.mark.parametrize("needed", [True, False])
def test_gated_group_is_opened_or_skipped_by_the_hook(needed: bool) -> None:
    """CA-wait-like: n1 waits for n0; the hook opens it or skips it."""
    graph = merge([chain_network(0, 0, [10]), chain_network(0, 1, [10])])

    def hook(control: Driver, group: str, status: GroupStatus) -> None:
        if group == "j0/n0":
            if needed:
                control.open("j0/n1")
            else:
                control.cancel("j0/n1", "condition false")

    result = simulate_graph(graph, workers=2, memory_budget_bytes=1000,
                            gated_groups=["j0/n1"], on_group_end=hook)
    entries = {e.task_id: e for e in result.schedule}
    assert result.unfinished == () and result.final_reserved_bytes == 0
    if needed:
        assert result.group_status["j0/n1"] == "done"
        assert entries["j0/n1/s0/load"].start_us == entries["j0/n0/s0/exec"].end_us
    else:
        assert result.group_status["j0/n1"] == "cancelled"
        assert all(entries[f"j0/n1/s0/{k}"].worker == -1 for k in ("load", "exec"))
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=1000) == []


def test_group_gated_forever_is_reported_unfinished() -> None:
    graph = chain_network(0, 0, [10])
    result = simulate_graph(graph, workers=1, memory_budget_bytes=100, gated_groups=["j0/n0"])
    assert set(result.unfinished) == {"j0/n0/s0/load", "j0/n0/s0/exec"}
    assert result.group_status == {"j0/n0": "active"}


def test_zero_duration_tasks_and_late_releases() -> None:
    tasks = (Task("a", TaskKind.EXEC, 0, 5, release_us=7),
             Task("b", TaskKind.EXEC, 0, 5, release_us=7),
             Task("c", TaskKind.EXEC, 3, 5, release_us=2))
    graph = TaskGraph(tasks=tasks, precedence=(("a", "b"),))
    result = simulate_graph(graph, workers=1, memory_budget_bytes=10)
    ends = {e.task_id: (e.start_us, e.end_us) for e in result.schedule}
    assert ends == {"c": (2, 5), "a": (7, 7), "b": (7, 7)}
    assert result.makespan_us == 7


# --- the checker catches every kind of violation -------------------------------------

def _valid() -> tuple[TaskGraph, list[ScheduledTask]]:
    graph = chain_network(0, 0, [40, 30], exec_bytes=5, output_bytes=2, release_us=10)
    result = simulate_graph(graph, workers=2, memory_budget_bytes=100)
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=100,
                          check_durations=True) == []
    return graph, list(result.schedule)


def _shift(schedule: list[ScheduledTask], task_id: str, **changes: int) -> list[ScheduledTask]:
    return [dataclasses.replace(e, **changes) if e.task_id == task_id else e for e in schedule]


def _problems(graph: TaskGraph, schedule: list[ScheduledTask], **options: object) -> str:
    kwargs: dict = {"workers": 2, "memory_budget_bytes": 100, **options}
    return "\n".join(check_schedule(graph, schedule, **kwargs))


def test_checker_catches_precedence_violation() -> None:
    graph, schedule = _valid()
    exec_entry = next(e for e in schedule if e.task_id == "j0/n0/s0/exec")
    bad = _shift(schedule, "j0/n0/s0/exec", start_us=exec_entry.start_us - 1)
    assert "precedence" in _problems(graph, bad)
    failed_pred = _shift(schedule, "j0/n0/s0/load", status="failed")
    assert "did not complete" in _problems(graph, failed_pred)


def test_checker_catches_start_after_violation() -> None:
    graph, schedule = _valid()
    # Move LOAD s1 before LOAD s0 on an otherwise idle worker.
    bad = _shift(schedule, "j0/n0/s1/load", start_us=10, end_us=110, worker=1)
    bad = _shift(bad, "j0/n0/s0/load", start_us=11, end_us=111)
    assert "start_after" in _problems(graph, bad)


def test_checker_catches_release_violation() -> None:
    graph, schedule = _valid()
    bad = _shift(schedule, "j0/n0/s0/load", start_us=0)
    assert "before its release" in _problems(graph, bad)


def test_checker_catches_worker_violations() -> None:
    graph, schedule = _valid()
    assert "only 2 workers" in _problems(graph, _shift(schedule, "j0/n0/s1/exec", worker=5))
    assert "more than 1 workers" in _problems(graph, schedule, workers=1)
    first, second = schedule[0], schedule[1]
    overlapping = _shift(schedule, second.task_id, worker=first.worker,
                         start_us=first.start_us, end_us=first.end_us)
    assert "at once" in _problems(graph, overlapping)


def test_checker_catches_memory_violation_unless_over_commit_recorded() -> None:
    graph, schedule = _valid()
    problems = _problems(graph, schedule, memory_budget_bytes=60)
    assert "exceeds the budget of 60" in problems
    # Both stages' resident locks together (70) exceed 60 bytes, but the second
    # LOAD started while the first ran: that is no progress-rule dispatch.
    second_load = max((e for e in schedule if e.task_id.endswith("load")),
                      key=lambda e: e.start_us)
    assert "not the progress rule" in _problems(
        graph, schedule, memory_budget_bytes=60, allowed_over_commits=[second_load.task_id])


def test_checker_allows_only_the_excess_of_a_lone_progress_dispatch() -> None:
    graph = TaskGraph((single("big", TaskKind.LOAD, 80).tasks[0],
                       single("small", TaskKind.EXEC, 10).tasks[0]))
    alone = [ScheduledTask("big", 0, 0, 10), ScheduledTask("small", 0, 10, 20)]
    assert _problems(graph, alone, memory_budget_bytes=60, allowed_over_commits=["big"]) == ""
    assert "exceeds the budget of 60" in _problems(graph, alone, memory_budget_bytes=60)
    # Something else starts while the over-committed task holds memory: only
    # the excess (20 bytes) was allowed, so 90 bytes is a violation.
    beside = [ScheduledTask("big", 0, 0, 10), ScheduledTask("small", 1, 5, 15)]
    assert "plus 20 bytes of progress-rule over-commit" in _problems(
        graph, beside, memory_budget_bytes=60, allowed_over_commits=["big"])
    # Both start together: the over-commit was not made with nothing else running.
    together = [ScheduledTask("big", 0, 0, 10), ScheduledTask("small", 1, 0, 10)]
    assert "not the progress rule" in _problems(
        graph, together, memory_budget_bytes=60, allowed_over_commits=["big"])


def test_checker_catches_bookkeeping_errors() -> None:
    graph, schedule = _valid()
    assert "missing" in _problems(graph, schedule[1:])
    assert _problems(graph, schedule[1:], require_all_tasks=False) != ""  # precedence broken
    assert "unknown task" in _problems(graph, schedule + [ScheduledTask("zz", 0, 0, 1)])
    assert "twice" in _problems(graph, schedule + [schedule[0]])
    entry = schedule[-1]
    reversed_entry = _shift(schedule, entry.task_id, end_us=entry.start_us - 1)
    assert "before it starts" in _problems(graph, reversed_entry)
    longer = _shift(schedule, entry.task_id, end_us=entry.end_us + 1)
    assert "expected" in _problems(graph, longer, check_durations=True)


# --- reports and traces built from simulated runs -----------------------------------

def test_report_statuses_responses_and_trace(tmp_path: Path) -> None:
    """Four networks in two jobs: done, aborted (running when cancelled), skipped, failed."""
    graph = merge([
        chain_network(0, 0, [10], load_us=100, exec_us=10),
        chain_network(0, 1, [20, 20], load_us=50, exec_us=50),
        chain_network(0, 2, [5], load_us=10, exec_us=10),
        chain_network(1, 0, [10, 10], load_us=20, exec_us=20, release_us=30),
    ])

    def hook(control: Driver, group: str, status: GroupStatus) -> None:
        if group == "j0/n0":
            control.cancel("j0/n1", "not needed")
            control.cancel("j0/n2", "condition false")

    result = simulate_graph(graph, workers=2, memory_budget_bytes=1000, on_group_end=hook,
                            gated_groups=["j0/n2"], failing_task_ids=["j1/n0/s1/exec"])
    report = build_report(graph, result.schedule, workers=2, memory_budget_bytes=1000,
                          policy="masa", over_commits=result.over_commits,
                          measured_memory=[(0, 100), (50, 300)],
                          network_status=result.group_status,  # core words: ignored
                          network_reason=result.group_reason)
    statuses = {n["group"]: n["status"] for job in report["jobs"] for n in job["networks"]}
    assert statuses == {"j0/n0": "done", "j0/n1": "aborted", "j0/n2": "skipped",
                        "j1/n0": "failed"}
    job0, job1 = report["jobs"]
    assert (job0["arrival_us"], job0["finish_us"], job0["response_us"]) == (0, 110, 110)
    assert job0["status"] == "done" and job1["status"] == "failed"
    aborted = next(n for n in job0["networks"] if n["group"] == "j0/n1")
    assert aborted["wasted_us"] == aborted["load_us"] + aborted["exec_us"] > 0
    assert aborted["loaded_bytes"] >= 20 and aborted["reason"] == "not needed"
    summary = report["summary"]
    assert summary["response_us"]["mean"] == 110.0  # only job 0 completed
    assert summary["jobs_failed"] == 1
    assert summary["peak_reserved_bytes"] == result.peak_reserved_bytes
    assert summary["peak_measured_bytes"] == 300
    busy_us = sum(e.end_us - e.start_us for e in result.schedule if e.worker >= 0)
    assert summary["worker_utilisation"] == round(busy_us / (2 * summary["makespan_us"]), 4)
    assert report["networks"]["n0"]["count"] == 2

    trace = chrome_trace(graph, result.schedule, workers=2, memory_budget_bytes=1000,
                         measured_memory=[(0, 100)])
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == sum(1 for e in result.schedule if e.worker >= 0)
    assert {e["tid"] for e in slices} <= {0, 1}
    assert any(e["ph"] == "C" and e["name"] == "memory (MiB)" for e in trace["traceEvents"])
    path = tmp_path / "trace.json"
    write_json(path, trace)
    assert json.loads(path.read_text())["traceEvents"][0]["ph"] == "M"
    table = format_table(report)
    assert "n1" in table and "all jobs" in table and "over-commits 0" in table


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_survives_gates_and_aborts_from_hooks(policy: str) -> None:
    """In each job n1 waits for n0 (gated) and n2 is aborted when n0 ends."""
    aborted_total = 0
    for seed in range(4):
        graph = random_workload(seed, jobs=5, max_networks=3)
        groups = {task.group for task in graph.tasks}
        gated = [g for g in groups if g.endswith("/n1")]

        finished_first: set[str] = set()  # n2 groups that ended before their n0

        def hook(control: Driver, group: str, status: GroupStatus,
                 known: set[str] = groups, early: set[str] = finished_first) -> None:
            job = group.split("/")[0]
            if group.endswith("/n0"):
                if f"{job}/n1" in known:
                    control.open(f"{job}/n1")
                if f"{job}/n2" in known:
                    if control.state.groups[f"{job}/n2"].ended:
                        early.add(f"{job}/n2")
                    control.cancel(f"{job}/n2", "not needed")

        result = simulate_graph(graph, policy=make_policy(policy),
                                workers=2, memory_budget_bytes=120,
                                gated_groups=gated, on_group_end=hook)
        assert result.unfinished == () and result.final_reserved_bytes == 0
        for group in groups:
            aborted = group.endswith("/n2") and group not in finished_first
            aborted_total += aborted
            assert result.group_status[group] == ("cancelled" if aborted else "done")
        entries = {e.task_id: e for e in result.schedule}
        for group in gated:
            first_start = min(e.start_us for e in result.schedule
                              if e.task_id.startswith(group + "/") and e.worker >= 0)
            upstream_end = max(e.end_us for e in result.schedule
                               if e.task_id.startswith(group[:-1] + "0/"))
            assert first_start >= upstream_end
        assert len(entries) == len(graph.tasks)
        assert check_schedule(graph, result.schedule, workers=2,
                              memory_budget_bytes=checked_budget(policy, 120),
                              allowed_over_commits=allowed(result)) == []
    assert aborted_total > 0


def test_the_report_counts_load_time_hidden_behind_execution() -> None:
    """load_overlapped_us: the part of LOAD time during which an EXEC ran elsewhere."""
    graph = chain_network(0, 0, [10, 10, 10])
    schedule = [
        ScheduledTask("j0/n0/s0/load", 0, 0, 100),
        ScheduledTask("j0/n0/s0/exec", 0, 100, 150),
        ScheduledTask("j0/n0/s1/load", 1, 120, 220),  # 30 us beside s0's EXEC
        ScheduledTask("j0/n0/s1/exec", 0, 220, 270),
        ScheduledTask("j0/n0/s2/load", 1, 230, 330),  # 40 us beside s1's EXEC
        ScheduledTask("j0/n0/s2/exec", 0, 330, 380),
    ]
    summary = build_report(graph, schedule, workers=2, memory_budget_bytes=1000)["summary"]
    assert summary["load_us"] == 300
    assert summary["load_overlapped_us"] == 30 + 40

    # Masa loads later stages while earlier ones execute; Bulk loads the network first.
    two = merge([chain_network(0, 0, [10] * 4, load_us=50), chain_network(1, 0, [10] * 4,
                                                                            load_us=50)])
    shares = {}
    for policy in ("masa", "bulk"):
        result = simulate_graph(two, policy=make_policy(policy), workers=2,
                                memory_budget_bytes=1000)
        summary = build_report(two, result.schedule, workers=2,
                               memory_budget_bytes=1000)["summary"]
        assert summary["load_us"] == 8 * 50
        shares[policy] = summary["load_overlapped_us"] / summary["load_us"]
    assert shares["masa"] > shares["bulk"]
