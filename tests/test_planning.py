"""masa-plan: masa's memory rules, dispatching in an order planned by local search.

The plan is decoded by the simulator driving RankedPolicy, so on a batch
released at once the simulated schedule is the planned one; these tests check
it against CP-SAT's proven optimum, masa.sched.checker and the greedy `masa`.
"""

from __future__ import annotations

import functools
import itertools
import json
from concurrent.futures import Future

import numpy as np
import pytest
from sched_graphs import chain_network, merge

from masa.runtime.planning import (
    BATCH_ITERATIONS,
    BatchPlanningPolicy,
    PlanningPolicy,
    RankedPolicy,
    ThreadPlanner,
    plan_rank,
    residual_graph,
)
from masa.runtime.registry import make_policy
from masa.runtime.virtual import simulate_graph
from masa.sched.checker import check_schedule
from masa.sched.core import add_tasks, finish, is_finished, new_state, select
from masa.sched.taskgraph import TaskGraph
from solver.instance import RandomSpec, random_instance
from solver.options import SolveOptions
from solver.search import solve_instance


def _single_stage_networks() -> TaskGraph:
    return merge([chain_network(0, 0, [30]), chain_network(1, 0, [10]),
                  chain_network(2, 0, [50])])


def test_ranked_policy_starts_the_lowest_rank_that_fits() -> None:
    """Budget 70: the LOADs need 30, 10 and 50 (+ headroom 10 for their EXEC).

    Rank j2, j0, j1: j2's LOAD (50 + 10 for its EXEC) starts; j0's (30 + 10)
    no longer fits next to it, so the next that fits in rank order, j1's
    (10), starts on the second worker, although j0 ranks before it.
    """
    graph = _single_stage_networks()
    rank = {task.task_id: 0 for task in graph.tasks}
    rank.update({"j2/n0/s0/load": 0, "j0/n0/s0/load": 1, "j1/n0/s0/load": 2})
    state = new_state(2, 70, RankedPolicy(rank))
    add_tasks(state, graph)
    assert [d.task_id for d in select(state)] == ["j2/n0/s0/load", "j1/n0/s0/load"]
    finish(state, "j1/n0/s0/load")
    assert [d.task_id for d in select(state)] == ["j1/n0/s0/exec"]
    # strict_loads: j0's LOAD does not fit, so it holds back j1's (ranked after it).
    strict = new_state(2, 70, RankedPolicy(rank, strict_loads=True))
    add_tasks(strict, graph)
    assert [d.task_id for d in select(strict)] == ["j2/n0/s0/load"]


@pytest.mark.parametrize("spec", [
    RandomSpec(networks=2, layers=4, seed=1000, workers=2, tightness=4.0, load_ratio=1.0),
    RandomSpec(networks=2, layers=5, seed=1001, workers=3, tightness=1.2, load_ratio=1.0),
    RandomSpec(networks=2, layers=4, seed=1032, workers=2, tightness=1.2, load_ratio=1.0),
    RandomSpec(networks=4, layers=2, seed=1043, workers=3, tightness=1.2, load_ratio=4.0),
], ids=lambda spec: f"n{spec.networks}-l{spec.layers}-s{spec.seed}-t{spec.tightness:g}")
def test_plan_reaches_the_proven_optimum_where_greedy_masa_does_not(spec: RandomSpec) -> None:
    instance = random_instance(spec)
    optimum = solve_instance(instance, SolveOptions(time_limit_s=30, search_workers=1, seed=3))
    assert optimum.proven
    greedy = simulate_graph(instance.graph, policy=make_policy("masa-noplan"),
                            workers=instance.workers, memory_budget_bytes=instance.memory)
    planned = simulate_graph(instance.graph, policy=make_policy("masa-plan"),
                             workers=instance.workers,
                             memory_budget_bytes=instance.memory)
    assert greedy.makespan_us > optimum.makespan_us
    assert planned.makespan_us == optimum.makespan_us
    assert planned.over_commits == ()
    assert check_schedule(instance.graph, list(planned.schedule), workers=instance.workers,
                          memory_budget_bytes=instance.memory) == []


def test_plan_is_deterministic_for_a_seed() -> None:
    instance = random_instance(RandomSpec(networks=3, layers=5, seed=7, workers=2,
                                          tightness=1.3, load_ratio=4.0))
    runs = [simulate_graph(instance.graph, policy=PlanningPolicy(iterations=200, seed=seed),
                           workers=2, memory_budget_bytes=instance.memory)
            for seed in (1, 1)]
    assert runs[0].schedule == runs[1].schedule
    # The search never returns worse than the best rule-based order it starts from.
    start = plan_rank(instance.graph, workers=2, memory_bytes=instance.memory, iterations=0,
                      rng=np.random.default_rng(1))
    unsearched = simulate_graph(instance.graph,
                                policy=RankedPolicy(start.rank, start.strict_loads), workers=2,
                                memory_budget_bytes=instance.memory)
    assert runs[0].makespan_us <= unsearched.makespan_us


def test_residual_graph_holds_only_what_has_not_started() -> None:
    graph = chain_network(0, 0, [30, 20])
    state = new_state(1, 100, make_policy("masa"))
    add_tasks(state, graph)
    assert [d.task_id for d in select(state)] == ["j0/n0/s0/load"]
    residual = residual_graph(state)
    assert {t.task_id for t in residual.tasks} == {
        "j0/n0/s0/exec", "j0/n0/s1/load", "j0/n0/s1/exec"}
    # s0's resident lock opened at the started LOAD: in the ledger now, not in the plan.
    assert {lock.from_task for lock in residual.locks} == {
        "j0/n0/s0/exec", "j0/n0/s1/load", "j0/n0/s1/exec"}
    assert ("j0/n0/s0/exec", "j0/n0/s1/exec") in residual.precedence
    assert all(task.release_us == 0 for task in residual.tasks)


def test_plan_again_when_a_job_arrives() -> None:
    """Job 1 arrives while job 0 runs: it gets planned too and everything completes."""
    graph = merge([chain_network(0, 0, [20, 30, 10]),
                   chain_network(1, 0, [20, 30, 10], release_us=150)])
    policy = PlanningPolicy(iterations=50)
    result = simulate_graph(graph, policy=policy, workers=2, memory_budget_bytes=80)
    assert policy.plans == 2
    assert set(result.group_status.values()) == {"done"}
    assert result.over_commits == ()
    assert check_schedule(graph, list(result.schedule), workers=2,
                          memory_budget_bytes=80) == []


def test_masa_optimal_compares_the_policy_it_is_asked_for(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    from masa.cli.main import optimal_main

    spec = "networks=4,layers=2,seed=1043,workers=3,tightness=1.2,load_ratio=4"
    reports = {}
    for policy in ("masa", "masa-plan"):
        assert optimal_main(["--random", spec, "--policy", policy, "--json",
                             "--search-workers", "1", "--time-limit", "30"]) == 0
        reports[policy] = json.loads(capsys.readouterr().out)
    assert reports["masa"]["policy"] == "masa"
    assert reports["masa-plan"]["policy"] == "masa-plan"
    optimum = reports["masa"]["optimal_makespan"]
    assert optimum == reports["masa-plan"]["optimal_makespan"] is not None
    assert reports["masa"]["heuristic_makespan"] > optimum
    assert reports["masa-plan"]["heuristic_makespan"] == optimum
    assert reports["masa-plan"]["heuristic_check"] == []


class _ManualPlanner:
    """A background planner whose search runs only when the test says so."""

    def __init__(self) -> None:
        self.searches: list = []
        self.futures: list[Future] = []

    def submit(self, search):  # noqa: ANN001, ANN201 - the Planner protocol
        future: Future = Future()
        self.searches.append(search)
        self.futures.append(future)
        return future

    def complete(self) -> None:
        """Run the pending searches now (what the background thread would do)."""
        for search, future in zip(self.searches, self.futures, strict=True):
            if not future.done():
                future.set_result(search(None))


def test_dispatches_continue_while_a_plan_is_computed() -> None:
    graph = merge([chain_network(job, 0, [30, 20]) for job in range(3)])
    planner = _ManualPlanner()
    policy = PlanningPolicy(iterations=40, planner=planner)
    state = new_state(2, 200, policy)
    add_tasks(state, graph)
    started = select(state)
    # The plan was submitted, not computed, and both workers got work anyway.
    assert policy.plans == 1 and not planner.futures[0].done()
    assert len(started) == 2 and policy.greedy_picks >= 2
    finish(state, started[0].task_id)
    meanwhile = select(state)
    assert len(meanwhile) == 1  # still deciding while the plan is pending
    planner.complete()
    dispatched = [d.task_id for d in started + meanwhile]
    while not is_finished(state):
        running = [tid for tid, info in state.tasks.items() if info.state.value == "running"]
        for task_id in running[:1]:
            finish(state, task_id)
        dispatched += [d.task_id for d in select(state)]
    assert policy.plans == 1 and sorted(set(dispatched)) == sorted(t.task_id for t in graph.tasks)
    assert state.over_commits == []


def test_a_time_budget_ends_the_search_with_the_best_order_so_far() -> None:
    """A fake clock that moves 1 s per reading: a 5 s budget allows a few steps only."""
    graph = merge([chain_network(job, 0, [30, 20, 10]) for job in range(3)])
    ticks = itertools.count()
    planner = ThreadPlanner(time_budget_s=5.0, clock=lambda: float(next(ticks)))
    readings_before = next(ticks)
    future = planner.submit(functools.partial(
        lambda stop: plan_rank(graph, workers=2, memory_bytes=120, iterations=10_000,
                               rng=np.random.default_rng(0), should_stop=stop)))
    plan = future.result(timeout=60)
    planner.close()
    # Each mode reads the clock once per step until the deadline, then once more.
    assert next(ticks) - readings_before <= 2 * 7
    assert set(plan.rank) == {task.task_id for task in graph.tasks}
    unlimited = plan_rank(graph, workers=2, memory_bytes=120, iterations=0,
                          rng=np.random.default_rng(0))
    assert plan.cost <= unlimited.cost  # at least the best rule-based order


def test_masa_plans_a_batch_that_arrives_at_an_empty_executor() -> None:
    """Two 2-layer networks released together on a tight budget: greedy masa takes
    101, the default's plan 85, and the run is exactly the plan's decode."""
    instance = random_instance(RandomSpec(networks=2, layers=2, seed=1000, workers=2,
                                          tightness=1.2, load_ratio=4.0))
    policy = make_policy("masa")
    planned = simulate_graph(instance.graph, policy=policy, workers=2,
                             memory_budget_bytes=instance.memory)
    greedy = simulate_graph(instance.graph, policy=make_policy("masa-noplan"), workers=2,
                            memory_budget_bytes=instance.memory)
    assert isinstance(policy, BatchPlanningPolicy)
    assert (policy.plans, policy.plans_followed) == (1, 1)
    assert planned.makespan_us < greedy.makespan_us
    decoded = plan_rank(instance.graph, workers=2, memory_bytes=instance.memory,
                        iterations=BATCH_ITERATIONS, rng=np.random.default_rng(0))
    assert planned.makespan_us == decoded.cost
    assert planned.over_commits == ()
    assert check_schedule(instance.graph, list(planned.schedule), workers=2,
                          memory_budget_bytes=instance.memory) == []


def test_masa_plans_no_batch_for_a_store_that_copies_its_weights() -> None:
    """The batch above, for a store whose LOADs copy their weights: no search, and the
    run is greedy masa's, task for task."""
    instance = random_instance(RandomSpec(networks=2, layers=2, seed=1000, workers=2,
                                          tightness=1.2, load_ratio=4.0))
    policy = make_policy("masa", copied_weights=True)
    copied = simulate_graph(instance.graph, policy=policy, workers=2,
                            memory_budget_bytes=instance.memory)
    greedy = simulate_graph(instance.graph, policy=make_policy("masa-noplan"), workers=2,
                            memory_budget_bytes=instance.memory)
    assert policy.stats() == {"batch_planning": 0, "batch_plans_searched": 0,  # type: ignore[attr-defined]
                              "batch_plans_reused": 0, "batch_plans_followed": 0,
                              "cached_loads_ahead": 0}  # no device: no page cache known
    assert copied.schedule == greedy.schedule


def test_masa_plans_only_when_the_executor_is_empty() -> None:
    """Job 1 arrives while job 0 runs: the plan is dropped and greedy masa decides.
    Job 2 (job 0's networks) arrives after everything ended: job 0's plan again,
    not searched again. Job 4, of other networks: searched. A single network: no plan."""
    def job(job_id: int, release_us: int) -> TaskGraph:
        return merge([chain_network(job_id, 0, [30, 20], release_us=release_us),
                      chain_network(job_id, 1, [40, 10], release_us=release_us)])

    other = merge([chain_network(4, 0, [10, 50], release_us=300_000),
                   chain_network(4, 1, [40, 10], release_us=300_000)])
    graph = merge([job(0, 0), job(1, 20), job(2, 100_000),
                   chain_network(3, 0, [30, 20], release_us=200_000), other])
    policy = BatchPlanningPolicy()
    result = simulate_graph(graph, policy=policy, workers=2, memory_budget_bytes=120)
    assert (policy.plans, policy.plans_reused) == (2, 1)
    assert set(result.group_status.values()) == {"done"}
    assert result.over_commits == ()
    assert check_schedule(graph, list(result.schedule), workers=2,
                          memory_budget_bytes=120) == []


def test_masa_dispatches_greedily_while_its_batch_plan_is_computed() -> None:
    instance = random_instance(RandomSpec(networks=2, layers=2, seed=1000, workers=2,
                                          tightness=1.2, load_ratio=4.0))
    planner = _ManualPlanner()
    policy = BatchPlanningPolicy(planner=planner)
    state = new_state(2, instance.memory, policy)
    add_tasks(state, instance.graph)
    started = select(state)
    assert policy.plans == 1 and not planner.futures[0].done() and started
    planner.complete()
    dispatched = [d.task_id for d in started]
    while not is_finished(state):
        running = [tid for tid, info in state.tasks.items() if info.state.value == "running"]
        for task_id in running[:1]:
            finish(state, task_id)
        dispatched += [d.task_id for d in select(state)]
    assert policy.plans == 1
    assert sorted(dispatched) == sorted(t.task_id for t in instance.graph.tasks)
    assert state.over_commits == []
