"""Dispatch order of the masa (Algorithm 1), bulk and deepeye policies on hand-made graphs.

Task ids are drawn from every permutation of a name list, so an order that
holds for all permutations cannot come from comparing names.
"""

from __future__ import annotations

import heapq
from itertools import permutations

import numpy as np
import pytest
from sched_graphs import chain_network, merge, single

from masa.runtime.registry import make_policy
from masa.runtime.virtual import simulate_graph
from masa.sched.checker import check_schedule
from masa.sched.core import (
    SchedulerState,
    add_tasks,
    arrive,
    cancel_group,
    finish,
    is_finished,
    new_state,
    select,
    set_cached_stages,
)
from masa.sched.policies import MasaPolicy, _valid_top
from masa.sched.taskgraph import Lock, Task, TaskGraph, TaskKind

NAMES = ("p", "q", "r", "s", "t")
ID_PERMUTATIONS = list(permutations(NAMES))


def run_one_worker(state: SchedulerState) -> list[str]:
    """Dispatch and finish tasks one at a time until everything has ended."""
    order: list[str] = []
    while not is_finished(state):
        dispatches = select(state)
        assert len(dispatches) == 1
        order.append(dispatches[0].task_id)
        finish(state, dispatches[0].task_id)
    return order


@pytest.mark.parametrize("names", ID_PERMUTATIONS)
def test_masa_execs_first_then_loads_each_by_ascending_footprint(names: tuple[str, ...]) -> None:
    ids = dict(zip(("load_small", "load_big", "exec_big", "exec_small", "exec_locked"),
                   names, strict=True))
    graph = merge([
        single(ids["load_small"], TaskKind.LOAD, 1),
        single(ids["load_big"], TaskKind.LOAD, 40),
        single(ids["exec_big"], TaskKind.EXEC, 30),
        single(ids["exec_small"], TaskKind.EXEC, 10),
        # Small direct memory but a large output lock: its footprint is 55.
        single(ids["exec_locked"], TaskKind.EXEC, 5, lock_bytes=50),
    ])
    state = new_state(1, 1000, make_policy("masa"))
    add_tasks(state, graph)
    expected = ["exec_small", "exec_big", "exec_locked", "load_small", "load_big"]
    assert run_one_worker(state) == [ids[role] for role in expected]
    assert state.ledger.reserved_bytes == 0 and state.over_commits == []


@pytest.mark.parametrize("names", ID_PERMUTATIONS[::7])
def test_masa_ties_by_job_network_stage_order_then_id(names: tuple[str, ...]) -> None:
    ids = dict(zip(("late_job", "later_network", "tie_a", "tie_b", "later_stage"),
                   names, strict=True))
    graph = merge([
        single(ids["late_job"], TaskKind.EXEC, 10, order=(1, 0, 0)),
        single(ids["later_network"], TaskKind.EXEC, 10, order=(0, 2, 0)),
        single(ids["tie_a"], TaskKind.EXEC, 10, order=(0, 1, 3)),
        single(ids["tie_b"], TaskKind.EXEC, 10, order=(0, 1, 3)),
        single(ids["later_stage"], TaskKind.EXEC, 10, order=(0, 1, 4)),
    ])
    state = new_state(1, 1000, make_policy("masa"))
    add_tasks(state, graph)
    ties = sorted([ids["tie_a"], ids["tie_b"]])  # full tie: task id decides
    expected = ties + [ids["later_stage"], ids["later_network"], ids["late_job"]]
    assert run_one_worker(state) == expected


@pytest.mark.parametrize("names", ID_PERMUTATIONS[::5])
def test_masa_skips_what_does_not_fit(names: tuple[str, ...]) -> None:
    ids = dict(zip(("blocker", "exec_big", "load_big", "load_small", "unused"),
                   names, strict=True))
    state = new_state(2, 100, make_policy("masa"))
    graph = merge([
        single(ids["blocker"], TaskKind.EXEC, 60),
        single(ids["exec_big"], TaskKind.EXEC, 50),
        single(ids["load_big"], TaskKind.LOAD, 45),
        single(ids["load_small"], TaskKind.LOAD, 30),
    ])
    add_tasks(state, graph, arrived=False)
    arrive(state, [ids["blocker"]])
    assert [d.task_id for d in select(state)] == [ids["blocker"]]
    arrive(state, [ids["exec_big"], ids["load_big"], ids["load_small"]])
    # 60 reserved: EXEC 50 and LOAD 45 do not fit; the smaller LOAD 30 does.
    assert [d.task_id for d in select(state)] == [ids["load_small"]]
    finish(state, ids["blocker"])
    assert [d.task_id for d in select(state)] == [ids["exec_big"]]  # 30 + 50 fits
    assert select(state) == []  # no idle worker
    finish(state, ids["load_small"])
    assert [d.task_id for d in select(state)] == [ids["load_big"]]  # 50 + 45 fits
    assert state.over_commits == []


@pytest.mark.parametrize("names", ID_PERMUTATIONS[::11])
def test_masa_progress_rule_runs_smallest_of_preferred_kind_only_when_idle(
        names: tuple[str, ...]) -> None:
    ids = dict(zip(("blocker", "exec_huge", "exec_huger", "load_big", "unused"),
                   names, strict=True))
    state = new_state(2, 100, make_policy("masa"))
    add_tasks(state, merge([
        single(ids["blocker"], TaskKind.EXEC, 10),
        single(ids["exec_huge"], TaskKind.EXEC, 150),
        single(ids["exec_huger"], TaskKind.EXEC, 160),
        single(ids["load_big"], TaskKind.LOAD, 120),
    ]))
    # Only the blocker fits; while it runs nothing may over-commit.
    dispatches = select(state)
    assert [(d.task_id, d.over_commit) for d in dispatches] == [(ids["blocker"], False)]
    finish(state, ids["blocker"])
    # Nothing fits and no worker is busy: the smallest EXEC (preferred kind) runs,
    # although the LOAD is smaller, and only one task over-commits.
    dispatches = select(state)
    assert [(d.task_id, d.over_commit) for d in dispatches] == [(ids["exec_huge"], True)]
    [record] = state.over_commits
    assert (record.task_id, record.footprint_bytes, record.reserved_bytes, record.reason) == (
        ids["exec_huge"], 150, 150, "progress")
    finish(state, ids["exec_huge"])
    assert [d.task_id for d in select(state)] == [ids["exec_huger"]]
    finish(state, ids["exec_huger"])
    assert [d.task_id for d in select(state)] == [ids["load_big"]]
    finish(state, ids["load_big"])
    assert len(state.over_commits) == 3 and state.ledger.reserved_bytes == 0


@pytest.mark.parametrize("workers", [1, 2])
def test_load_order_rule_avoids_the_over_commit_of_loading_later_stages_first(
        workers: int) -> None:
    """Later stages are smaller, so smallest-first would load them before stage 0.

    Without the rule, s2 and s1 fill memory, s0 cannot be loaded and nothing
    can run: a budget-respecting scheduler is deadlocked and masa must
    over-commit (progress rule). With the rule (start_after LOAD(s) ->
    LOAD(s+1)) the same budget suffices: no over-commit, nothing stuck.
    """
    budget_bytes = 90
    unruled = chain_network(0, 0, [50, 30, 20], load_order_rule=False)
    result = simulate_graph(unruled, workers=workers, memory_budget_bytes=budget_bytes)
    assert result.dispatch_order[:2] == ("j0/n0/s2/load", "j0/n0/s1/load")
    over_commit = result.over_commits[0]
    assert (over_commit.task_id, over_commit.reason) == ("j0/n0/s0/load", "progress")
    assert over_commit.reserved_bytes > budget_bytes

    ruled = chain_network(0, 0, [50, 30, 20])
    result = simulate_graph(ruled, workers=workers, memory_budget_bytes=budget_bytes)
    assert result.over_commits == ()
    assert result.unfinished == () and result.final_reserved_bytes == 0
    assert result.peak_reserved_bytes <= budget_bytes
    assert check_schedule(ruled, result.schedule, workers=workers,
                          memory_budget_bytes=budget_bytes) == []


def test_load_order_rule_keeps_many_networks_within_budget() -> None:
    """Several networks under a budget that holds two stages plus working memory."""
    graph = merge([chain_network(0, n, [40, 35, 30, 25, 20]) for n in range(4)])
    for workers in (1, 2, 3):
        result = simulate_graph(graph, workers=workers, memory_budget_bytes=100)
        assert result.unfinished == ()
        assert check_schedule(graph, result.schedule, workers=workers,
                              memory_budget_bytes=100,
                              allowed_over_commits=[o.task_id for o in result.over_commits]) == []
        assert result.final_reserved_bytes == 0


def test_bulk_runs_one_network_at_a_time_loads_then_execs() -> None:
    graph = merge([chain_network(0, 1, [10, 10, 10]), chain_network(0, 0, [10, 10]),
                   chain_network(1, 0, [10], release_us=50)])
    result = simulate_graph(graph, policy=make_policy("bulk"),
                            workers=2, memory_budget_bytes=10_000)
    assert result.dispatch_order == (
        "j0/n0/s0/load", "j0/n0/s1/load", "j0/n0/s0/exec", "j0/n0/s1/exec",
        "j0/n1/s0/load", "j0/n1/s1/load", "j0/n1/s2/load",
        "j0/n1/s0/exec", "j0/n1/s1/exec", "j0/n1/s2/exec",
        "j1/n0/s0/load", "j1/n0/s0/exec")
    entries = {entry.task_id: entry for entry in result.schedule}
    # Two loads of a network run in parallel; its first EXEC follows its last LOAD.
    assert entries["j0/n0/s0/load"].start_us == entries["j0/n0/s1/load"].start_us == 0
    assert entries["j0/n1/s0/exec"].start_us >= entries["j0/n1/s2/load"].end_us
    assert entries["j0/n1/s0/load"].start_us >= entries["j0/n0/s1/exec"].end_us
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=10_000) == []


def test_bulk_is_memory_oblivious_and_reports_over_budget_peaks() -> None:
    # 55 bytes hold one stage (40), its working memory (5) and two outputs (5 + 5).
    graph = chain_network(0, 0, [40, 40, 40])
    result = simulate_graph(graph, policy=make_policy("bulk"), workers=1, memory_budget_bytes=55)
    assert result.peak_reserved_bytes >= 120  # every stage loaded at once
    assert result.over_commits and {o.reason for o in result.over_commits} == {"oblivious"}
    assert result.final_reserved_bytes == 0
    assert check_schedule(graph, result.schedule, workers=1, memory_budget_bytes=55,
                          allowed_over_commits=[o.task_id for o in result.over_commits]) == []
    assert check_schedule(graph, result.schedule, workers=1, memory_budget_bytes=55) != []
    # The same budget under masa: no over-commit at all.
    masa = simulate_graph(graph, policy=make_policy("masa"), workers=1, memory_budget_bytes=55)
    assert masa.over_commits == () and masa.peak_reserved_bytes <= 55


def test_deepeye_loads_fc_stages_while_conv_stages_execute() -> None:
    graph = merge([
        chain_network(0, 0, [10, 10, 50, 50], layer_types=["conv", "conv", "fc", "fc"],
                      load_us=100, exec_us=200),
        chain_network(1, 0, [10, 10, 50], layer_types=["conv", "conv", "fc"],
                      load_us=100, exec_us=200),
    ])
    result = simulate_graph(graph, policy=make_policy("deepeye"),
                            workers=2, memory_budget_bytes=10_000)
    entries = {entry.task_id: entry for entry in result.schedule}
    assert result.unfinished == ()
    # A network's first conv EXEC waits for its last conv LOAD.
    assert entries["j0/n0/s0/exec"].start_us >= entries["j0/n0/s1/load"].end_us
    # Some FC LOAD overlaps some conv EXEC of the same network (the interleaving).
    conv_execs = [entries[f"j0/n0/s{i}/exec"] for i in (0, 1)]
    fc_loads = [entries[f"j0/n0/s{i}/load"] for i in (2, 3)]
    assert any(load.start_us < ex.end_us and ex.start_us < load.end_us
               for load in fc_loads for ex in conv_execs)
    # The conv lane moves on to the next network before the first one's FC work ends.
    assert entries["j1/n0/s0/load"].start_us < entries["j0/n0/s3/exec"].end_us
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=10_000) == []


@pytest.mark.parametrize("policy", ["masa", "bulk", "deepeye"])
def test_every_policy_serves_arrivals_in_order_and_finishes(policy: str) -> None:
    graph = merge([chain_network(job, 0, [30, 20], release_us=job * 10) for job in range(5)])
    result = simulate_graph(graph, policy=make_policy(policy), workers=2, memory_budget_bytes=1_000)
    assert result.unfinished == () and result.final_reserved_bytes == 0
    first_starts = [
        next(e.start_us for e in result.schedule if e.task_id == f"j{job}/n0/s0/load")
        for job in range(5)
    ]
    assert first_starts == sorted(first_starts)


def test_empty_graph() -> None:
    result = simulate_graph(TaskGraph(tasks=()), workers=1, memory_budget_bytes=0)
    assert result.schedule == () and result.makespan_us == 0


@pytest.mark.parametrize("admission", [True, False])
def test_masa_admission_holds_new_networks_while_a_started_one_waits(admission: bool) -> None:
    graph = merge([chain_network(0, 0, [60, 50]), chain_network(1, 0, [10])])
    state = new_state(2, 100, MasaPolicy(admission=admission))
    add_tasks(state, graph, arrived=False)
    arrive(state, [t.task_id for t in graph.tasks if t.job_id == 0])
    # LOAD s0 starts; LOAD s1 (start_after satisfied) does not fit: 60 + 50 > 100.
    assert [d.task_id for d in select(state)] == ["j0/n0/s0/load"]
    arrive(state, [t.task_id for t in graph.tasks if t.job_id == 1])
    new_load = [d.task_id for d in select(state)]
    if not admission:  # the paper's rule starts the new network in the free 40 bytes
        assert new_load == ["j1/n0/s0/load"]
        return
    assert new_load == []
    finish(state, "j0/n0/s0/load")
    assert [d.task_id for d in select(state)] == ["j0/n0/s0/exec"]  # 70 reserved
    finish(state, "j0/n0/s0/exec")  # frees s0: 5 reserved (its outputs)
    # Both fit now: smallest first again.
    assert [d.task_id for d in select(state)] == ["j1/n0/s0/load", "j0/n0/s1/load"]


def test_masa_admission_bounds_memory_under_overload() -> None:
    """Jobs arrive faster than they can be served: held memory must not pile up."""
    graph = merge([chain_network(job, n, [4, 5, 6, 7, 8, 9], exec_bytes=2, output_bytes=1,
                                 release_us=job * 200) for job in range(60) for n in range(2)])
    budget_bytes = 40
    largest_footprint = 9 + 2 + 1
    result = simulate_graph(graph, workers=2, memory_budget_bytes=budget_bytes)
    assert result.peak_reserved_bytes <= budget_bytes + largest_footprint
    paper = simulate_graph(graph, policy=MasaPolicy(admission=False), workers=2,
                           memory_budget_bytes=budget_bytes)
    assert paper.peak_reserved_bytes > 2 * budget_bytes
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=budget_bytes,
                          allowed_over_commits=[o.task_id for o in result.over_commits]) == []


def test_masa_headroom_keeps_room_for_the_exec_of_a_loaded_stage() -> None:
    """Two stages' residents fit (60 + 35) but not with the first EXEC's 10 bytes."""
    graph = chain_network(0, 0, [60, 35], exec_bytes=5, output_bytes=5)
    brim = simulate_graph(graph, policy=MasaPolicy(headroom=False), workers=2,
                          memory_budget_bytes=100)
    assert brim.dispatch_order[:2] == ("j0/n0/s0/load", "j0/n0/s1/load")
    assert [o.task_id for o in brim.over_commits][:1] == ["j0/n0/s0/exec"]
    result = simulate_graph(graph, workers=2, memory_budget_bytes=100)
    assert result.dispatch_order == ("j0/n0/s0/load", "j0/n0/s0/exec", "j0/n0/s1/load",
                                     "j0/n0/s1/exec")
    assert result.over_commits == () and result.peak_reserved_bytes <= 100
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=100) == []


def test_masa_headroom_counts_the_transient_load_memory_as_returned() -> None:
    """Loads that peak at 40 but keep 10: two run at once in 80 bytes.

    Each LOAD reserves 30 (transient copy, direct) + 10 (resident lock); each
    EXEC needs 5 + 5. With both LOADs running, 80 of 80 are reserved, but once
    they end only 20 stay, so both EXECs still fit: the headroom rule must not
    demand room for an EXEC on top of the whole load peak (which would run the
    two loads one after the other), and nothing may go over the budget.
    """
    tasks: list[Task] = []
    precedence: list[tuple[str, str]] = []
    locks: list[Lock] = []
    for job in range(2):
        group = f"j{job}/n0"
        load_id, exec_id = f"{group}/s0/load", f"{group}/s0/exec"
        common = dict(order=(job, 0, 0), group=group, job_id=job, network="n0",
                      stage_id="s0")
        tasks += [Task(load_id, TaskKind.LOAD, 100, 30, **common),
                  Task(exec_id, TaskKind.EXEC, 50, 5, **common)]
        precedence.append((load_id, exec_id))
        locks += [Lock(f"{load_id}#resident", load_id, (exec_id,), 10),
                  Lock(f"{exec_id}#outputs", exec_id, (exec_id,), 5)]
    graph = TaskGraph(tuple(tasks), tuple(precedence), tuple(locks))
    result = simulate_graph(graph, workers=2, memory_budget_bytes=80)
    starts = {item.task_id: item.start_us for item in result.schedule}
    assert starts["j0/n0/s0/load"] == starts["j1/n0/s0/load"] == 0
    assert result.makespan_us == 150  # both loads, then both execs, side by side
    assert result.over_commits == () and result.peak_reserved_bytes == 80
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=80) == []


def test_masa_headroom_counts_what_an_exec_leaves_held() -> None:
    """An EXEC whose outputs outweigh its freed weights leaves memory held: the room
    kept for the other loaded stages' EXECs must count it.

    Budget 100. Job 0's stage b0 keeps 30 and its EXEC needs 35; it loads from t=0.
    Job 1 arrives at t=5: its stage a0 keeps 10 and its EXEC opens 40 of outputs (an
    early conv layer: small weights, a large activation) held until a1 runs, whose
    stage keeps 50. Counting only the largest EXEC need (45), a0 loads beside b0 (60
    free) and executes while b0 still loads; its outputs stay, a1 cannot load, and
    b0's EXEC finds 70 held: 105 > 100 with nothing running, so the progress rule
    over-commits. Counting a0's growth (40 - 10), a0 waits for b0 to be done.
    """
    tasks: list[Task] = []
    precedence: list[tuple[str, str]] = []
    locks: list[Lock] = []
    # (job, network, stage, load us, resident, exec direct, outputs)
    stages = [(0, "b", 0, 100, 30, 30, 5), (1, "a", 0, 10, 10, 5, 40), (1, "a", 1, 10, 50, 5, 0)]
    for job, network, stage, load_us, resident, direct, outputs in stages:
        group = f"j{job}/{network}"
        load_id, exec_id = f"{group}/s{stage}/load", f"{group}/s{stage}/exec"
        common = dict(order=(job, 0, stage), group=group, job_id=job, network=network,
                      stage_id=f"s{stage}", release_us=5 * job)
        tasks += [Task(load_id, TaskKind.LOAD, load_us, 0, **common),
                  Task(exec_id, TaskKind.EXEC, 50, direct, **common)]
        precedence.append((load_id, exec_id))
        locks.append(Lock(f"{load_id}#resident", load_id, (exec_id,), resident))
        consumer = "j1/a/s1/exec" if exec_id == "j1/a/s0/exec" else exec_id
        if consumer != exec_id:
            precedence.append((exec_id, consumer))
        locks.append(Lock(f"{exec_id}#outputs", exec_id, (consumer,), outputs))
    graph = TaskGraph(tuple(tasks), tuple(precedence), tuple(locks),
                      start_after=(("j1/a/s0/load", "j1/a/s1/load"),))
    result = simulate_graph(graph, workers=2, memory_budget_bytes=100)
    assert result.over_commits == () and result.peak_reserved_bytes <= 100
    assert len(result.schedule) == len(tasks)
    assert check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=100) == []


def _ahead_peak_bytes(graph: TaskGraph, schedule: tuple) -> int:
    """Largest sum of resident bytes of stages whose LOAD has started and whose EXEC has not."""
    starts = {item.task_id: item.start_us for item in schedule}
    resident = {lock.from_task: lock.memory_bytes for lock in graph.locks
                if lock.lock_id.endswith("#resident")}
    stages = [(starts[load], starts[load.removesuffix("load") + "exec"], size)
              for load, size in resident.items()]
    return max(sum(size for load_us, exec_us, size in stages if load_us <= t < exec_us)
               for t in sorted({load_us for load_us, _, _ in stages}))


def test_masa_read_ahead_window_bounds_the_stages_loaded_ahead() -> None:
    """Loads are slower than execs: unbounded, the second worker loads every stage
    ahead; a 25-byte window keeps at most two 10-byte stages ahead (and a stage
    larger than the window still loads, alone)."""
    graph = merge([chain_network(0, 0, [10] * 6, load_us=100, exec_us=10),
                   chain_network(0, 1, [40], load_us=100, exec_us=10)])
    unbounded = simulate_graph(graph, workers=2, memory_budget_bytes=1000)
    assert _ahead_peak_bytes(graph, unbounded.schedule) >= 40
    policy = MasaPolicy(read_ahead_bytes=25)
    bounded = simulate_graph(graph, policy=policy, workers=2, memory_budget_bytes=1000)
    assert _ahead_peak_bytes(graph, bounded.schedule) <= 40
    starts = {item.task_id: item.start_us for item in bounded.schedule}
    big_load = starts["j0/n1/s0/load"]
    # The 40-byte stage loaded alone: no other stage was ahead while it was.
    assert all(not starts[f"j0/n0/s{k}/load"] <= big_load < starts[f"j0/n0/s{k}/exec"]
               for k in range(6))
    assert len(bounded.schedule) == len(graph.tasks) and bounded.over_commits == ()
    assert policy._ahead_bytes == 0 and policy._ahead_by_exec == {}
    assert check_schedule(graph, bounded.schedule, workers=2, memory_budget_bytes=1000) == []


def test_masa_read_ahead_window_forgets_the_stages_of_a_cancelled_network() -> None:
    """A network cancelled with a stage loaded ahead gives its bytes back to the window."""
    graph = merge([chain_network(0, 0, [10] * 4), chain_network(0, 1, [10] * 2)])
    policy = MasaPolicy(read_ahead_bytes=15)
    state = new_state(2, 1000, policy)
    add_tasks(state, graph)
    # One 10-byte stage fits the 15-byte window; a second would not, on either network.
    assert [d.task_id for d in select(state)] == ["j0/n0/s0/load"]
    finish(state, "j0/n0/s0/load")
    assert policy._ahead_bytes == 10
    cancel_group(state, "j0/n0", "test")
    assert policy._ahead_bytes == 0 and policy._ahead_by_exec == {}
    assert [d.task_id for d in select(state)] == ["j0/n1/s0/load"]


def test_masa_starts_a_cached_stage_before_a_smaller_uncached_one() -> None:
    """Told which stages' files are in the page cache, masa loads those first (the
    smallest of them); not told, or with the rule off, smallest-first decides."""
    graph = merge([chain_network(0, 0, [30, 30]), chain_network(0, 1, [10])])

    def first_load(policy: MasaPolicy, cached: set[tuple[str, str]] | None) -> str:
        state = new_state(1, 1000, policy)
        add_tasks(state, graph)
        set_cached_stages(state, cached)
        return select(state)[0].task_id

    assert first_load(MasaPolicy(), None) == "j0/n1/s0/load"
    assert first_load(MasaPolicy(), {("n0", "s1"), ("n0", "s0")}) == "j0/n0/s0/load"
    assert first_load(MasaPolicy(cache_first=False), {("n0", "s0")}) == "j0/n1/s0/load"
    assert first_load(MasaPolicy(), {("n1", "s0"), ("n0", "s0")}) == "j0/n1/s0/load"
    # The paper's rule (masa-paper) knows no page cache.
    paper = MasaPolicy(admission=False, headroom=False)
    assert not paper.uses_cached_stages
    assert first_load(paper, {("n0", "s0")}) == "j0/n1/s0/load"


def test_masa_keeps_a_cached_stage_waiting_when_it_does_not_fit() -> None:
    """The rule only reorders what may start: a cached stage larger than free memory
    waits, and the smallest LOAD that fits starts."""
    graph = merge([chain_network(0, 0, [900]), chain_network(0, 1, [10])])
    state = new_state(1, 500, MasaPolicy())
    add_tasks(state, graph)
    set_cached_stages(state, {("n0", "s0")})
    assert [d.task_id for d in select(state)] == ["j0/n1/s0/load"]


def test_a_negative_read_ahead_window_is_refused() -> None:
    with pytest.raises(ValueError, match="read_ahead_bytes"):
        MasaPolicy(read_ahead_bytes=-1)
    assert make_policy("masa", read_ahead_bytes=64).read_ahead_bytes == 64  # type: ignore[attr-defined]
    assert make_policy("bulk", read_ahead_bytes=64).name == "bulk"


class _IgnoresMemory(MasaPolicy):
    """Claims to be memory-aware but starts the smallest ready task whether it fits or not."""

    def __init__(self) -> None:
        super().__init__(admission=False, headroom=False)

    def pick(self, state: SchedulerState) -> str | None:
        for heap in (self._execs, self._loads):
            if _valid_top(state, heap) is not None:
                return heapq.heappop(heap)[-2]
        return None


def test_the_core_and_the_checker_reject_a_policy_that_ignores_memory() -> None:
    graph = merge([chain_network(job, 0, [40, 30]) for job in range(3)])
    result = simulate_graph(graph, policy=_IgnoresMemory(), workers=2, memory_budget_bytes=60)
    reasons = {o.reason for o in result.over_commits}
    assert "violation" in reasons  # over the budget while another task ran
    problems = check_schedule(graph, result.schedule, workers=2, memory_budget_bytes=60,
                              allowed_over_commits=[o.task_id for o in result.over_commits])
    assert any("not the progress rule" in line for line in problems)
    # masa itself, on the same graph and budget, never needs the excuse.
    masa = simulate_graph(graph, policy=make_policy("masa"), workers=2, memory_budget_bytes=60)
    assert {o.reason for o in masa.over_commits} <= {"progress"}
    assert check_schedule(graph, masa.schedule, workers=2, memory_budget_bytes=60,
                          allowed_over_commits=[o.task_id for o in masa.over_commits]) == []


def _response_us(graph: TaskGraph, schedule: tuple) -> dict[int, int]:
    release = {task.job_id: task.release_us for task in graph.tasks}
    job_of = {task.task_id: task.job_id for task in graph.tasks}
    finish_us: dict[int, int] = {}
    for entry in schedule:
        finish_us[job_of[entry.task_id]] = max(finish_us.get(job_of[entry.task_id], 0),
                                               entry.end_us)
    return {job: end - release[job] for job, end in finish_us.items()}


def test_masa_job_order_serves_the_shortest_job_first_once_jobs_queue() -> None:
    """Four jobs queue on one worker: job 3 has the least work but the largest
    footprint, so smallest-first serves it last; the job order serves it first."""
    graph = merge([chain_network(job, 0, [10, 10], load_us=100, exec_us=100)
                   for job in range(3)]
                  + [chain_network(3, 0, [40], load_us=10, exec_us=10)])
    greedy = simulate_graph(graph, policy=MasaPolicy(job_order=False), workers=1,
                            memory_budget_bytes=1_000)
    ordered = simulate_graph(graph, workers=1, memory_budget_bytes=1_000)
    assert greedy.dispatch_order[0] != "j3/n0/s0/load"
    assert ordered.dispatch_order[:2] == ("j3/n0/s0/load", "j3/n0/s0/exec")
    # ...and finishes each job before starting the next (no interleaving).
    jobs = [task_id.split("/")[0] for task_id in ordered.dispatch_order]
    assert jobs == sorted(jobs, key=lambda job: (job != "j3", job))
    assert sum(_response_us(graph, ordered.schedule).values()) < sum(
        _response_us(graph, greedy.schedule).values())


def test_masa_job_order_ages_waiting_jobs() -> None:
    """A long job that arrived long before short ones goes first once aged enough."""
    graph = merge([chain_network(0, 0, [10], load_us=500, exec_us=500)]
                  + [chain_network(job, 0, [10], load_us=50, exec_us=50, release_us=2_000)
                     for job in (1, 2, 3)])
    state = new_state(1, 1_000, MasaPolicy(ageing=1.0, queue_jobs=1))
    add_tasks(state, graph)
    # Job 0: 1,000 us of work, released at 0 -> key 1,000; the others 100 + 2,000.
    assert [d.task_id for d in select(state)] == ["j0/n0/s0/load"]
    state = new_state(1, 1_000, MasaPolicy(ageing=0.0, queue_jobs=1))
    add_tasks(state, graph)
    assert [d.task_id for d in select(state)] == ["j1/n0/s0/load"]  # no ageing: shortest


def test_masa_job_order_leaves_a_short_queue_to_smallest_first() -> None:
    graph = merge([chain_network(job, 0, [30, 5, 20], release_us=job * 40) for job in range(2)])
    ordered = simulate_graph(graph, workers=2, memory_budget_bytes=80)
    greedy = simulate_graph(graph, policy=MasaPolicy(job_order=False), workers=2,
                            memory_budget_bytes=80)
    assert ordered.dispatch_order == greedy.dispatch_order  # 2 jobs < workers + 1
    assert make_policy("masa").job_order and not make_policy("masa-paper").job_order


def test_masa_job_order_keeps_the_memory_rules_under_overload() -> None:
    graph = merge([chain_network(job, n, [4, 5, 6, 7, 8, 9], exec_bytes=2, output_bytes=1,
                                 load_us=30 + 7 * n, exec_us=20 + 5 * (job % 3),
                                 release_us=job * 60) for job in range(60) for n in range(2)])
    budget_bytes = 40
    ordered = simulate_graph(graph, workers=2, memory_budget_bytes=budget_bytes)
    greedy = simulate_graph(graph, policy=MasaPolicy(job_order=False), workers=2,
                            memory_budget_bytes=budget_bytes)
    assert ordered.unfinished == () and ordered.final_reserved_bytes == 0
    assert all(o.reason == "progress" for o in ordered.over_commits)
    assert len(ordered.over_commits) <= len(greedy.over_commits)
    assert check_schedule(graph, ordered.schedule, workers=2, memory_budget_bytes=budget_bytes,
                          allowed_over_commits=[o.task_id for o in ordered.over_commits]) == []
    ordered_mean = np.mean(list(_response_us(graph, ordered.schedule).values()))
    greedy_mean = np.mean(list(_response_us(graph, greedy.schedule).values()))
    assert ordered_mean < greedy_mean
