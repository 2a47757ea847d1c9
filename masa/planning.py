"""The `masa-plan` policy: masa's memory rules, dispatching in a planned order.

This module owns lookahead planning. `masa` decides greedily (EXECs first,
smallest memory first); on memory-tight batches that leaves workers idle
while a heavy LOAD waits for memory that light stages hold (docs/bench-solver.md
shows the pattern: 1.2-1.4x the optimal makespan). `masa-plan` keeps every
memory rule of `masa` (a task starts only if its footprint fits; the headroom
rule keeps room for the EXECs of loaded stages; the progress rule when
nothing fits and nothing runs) but, instead of a fixed priority, follows a
*rank* of the tasks chosen by searching over dispatch orders:

- `RankedPolicy` dispatches, among the ready tasks that fit, the one of lowest
  rank. It is an ordinary policy: the simulator and the real executor drive it
  through masa.core like any other.
- `plan_rank` builds the residual problem (the arrived tasks not yet started,
  the memory free now), decodes candidate orders by running `RankedPolicy` on
  it in masa.simulator, and improves the best of a few rule-based orders by
  seeded random swap and move steps, keeping a step when the makespan does not
  get worse.
- `PlanningPolicy` (registered as `masa-plan`) replans whenever a task it has
  no rank for becomes ready (a job arrived), then dispatches by that rank.

Because the decoder is the simulator driving the same policy, a plan made when
nothing is running is reproduced exactly in simulation; when it is made while
tasks run, their memory counts as held for the whole plan and their remaining
time is not known (the core has no clock), so the plan is an estimate. Cost:
`iterations` simulations of the residual tasks per arrival, O(iterations x n
log n) for n tasks, which is meant for jobs of many networks arriving together
and for checking the heuristic against the optimum (masa-optimal), not for
thousands of queued jobs. Pure: no clocks, threads or I/O; randomness from a
seeded numpy Generator.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import numpy as np

from masa.core import SchedulerState, TaskInfo, TaskState
from masa.policies import MasaPolicy, _Entry
from masa.taskgraph import Lock, Task, TaskGraph, TaskKind

# Local-search steps per plan: up to MAX_ITERATIONS, fewer for large residual
# problems so that one plan costs at most about STEP_BUDGET task decodes
# (1000 steps for the solver benchmark's 16-48-task instances: measured
# median 1.04 and worst 1.14 of the optimum there; 300 steps gave 1.06/1.18).
MAX_ITERATIONS = 1000
MIN_ITERATIONS = 20
STEP_BUDGET = 50_000
_UNRANKED = 1 << 60  # tasks the plan does not know (should not happen) go last
# Orders that end in an over-commit are worse than any within the budget.
_OVER_BUDGET_PENALTY = 1 << 40


class RankedPolicy(MasaPolicy):
    """Among the ready tasks that fit (masa's rules), start the one of lowest rank."""

    name = "masa-ranked"

    def __init__(self, rank: Mapping[str, int]) -> None:
        super().__init__(admission=False, headroom=True)
        self.rank: Mapping[str, int] = rank
        self._ready: list[_Entry] = []  # (rank, task_id, ready_epoch)

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        task_id = info.task.task_id
        heapq.heappush(self._ready, (self.rank.get(task_id, _UNRANKED), task_id,
                                     info.ready_epoch))

    def _ready_entries(self, state: SchedulerState) -> list[_Entry]:
        """The still-ready entries in rank order (stale ones dropped)."""
        tasks = state.tasks
        entries = sorted(
            entry for entry in self._ready
            if (info := tasks.get(entry[1])) is not None and info.state is TaskState.READY
            and info.ready_epoch == entry[2])
        self._ready = entries  # a sorted list is a valid heap
        return entries

    def pick(self, state: SchedulerState) -> str | None:
        entries = self._ready_entries(state)
        free_bytes = state.ledger.free_bytes()
        tasks = state.tasks
        for position, (_, task_id, epoch) in enumerate(entries):
            info = tasks[task_id]
            if info.task.kind is TaskKind.LOAD:
                fits = self._load_fits(state, (info.footprint_bytes, task_id, epoch),
                                       free_bytes, 0)
            else:
                fits = info.footprint_bytes <= free_bytes
            if fits:
                del entries[position]  # still sorted, so still a heap
                return task_id
        if state.running_count == 0 and entries:
            return entries.pop(0)[1]  # progress rule: the lowest rank runs anyway
        return None


def residual_graph(state: SchedulerState) -> TaskGraph:
    """The arrived tasks that have not started, as a graph released at 0.

    Edges and locks from tasks that already started are dropped (their
    effect is in the ledger now); a lock whose holders all left keeps only
    its opening task, so it is held while that task runs.
    """
    residual = {tid: info for tid, info in state.tasks.items()
                if info.arrived and info.state in (TaskState.PENDING, TaskState.READY)}
    tasks: list[Task] = []
    precedence: list[tuple[str, str]] = []
    start_after: list[tuple[str, str]] = []
    locks: list[Lock] = []
    for task_id, info in residual.items():
        task = info.task
        tasks.append(Task(task_id, task.kind, task.duration_us, task.memory_bytes,
                          release_us=0, order=task.order, group=task.group,
                          job_id=task.job_id, network=task.network, stage_id=task.stage_id,
                          layer_type=task.layer_type))
        precedence += [(task_id, s) for s in info.successors if s in residual]
        start_after += [(task_id, s) for s in info.start_successors if s in residual]
        for lock_id in info.locks_from:
            lock = state.locks[lock_id].lock
            until = tuple(u for u in lock.until_tasks if u in residual) or (task_id,)
            locks.append(Lock(lock.lock_id, task_id, until, lock.memory_bytes))
    return TaskGraph(tuple(tasks), tuple(precedence), tuple(locks), tuple(start_after))


def _bottom_levels(graph: TaskGraph) -> dict[str, int]:
    """Longest duration path from each task to the end of the graph (itself included)."""
    successors: dict[str, list[str]] = {task.task_id: [] for task in graph.tasks}
    indegree = dict.fromkeys(successors, 0)
    for before, after in graph.precedence:
        successors[before].append(after)
        indegree[after] += 1
    order = [tid for tid, degree in indegree.items() if degree == 0]
    for tid in order:  # Kahn's order; the list grows while iterating
        for after in successors[tid]:
            indegree[after] -= 1
            if indegree[after] == 0:
                order.append(after)
    duration = {task.task_id: task.duration_us for task in graph.tasks}
    level: dict[str, int] = {}
    for tid in reversed(order):
        level[tid] = duration[tid] + max((level[s] for s in successors[tid]), default=0)
    return level


def initial_orders(graph: TaskGraph) -> list[list[str]]:
    """Rule-based starting orders: critical path, masa-like, network by network."""
    level = _bottom_levels(graph)
    tasks = list(graph.tasks)
    footprint = {task.task_id: task.memory_bytes for task in tasks}
    for lock in graph.locks:
        footprint[lock.from_task] += lock.memory_bytes

    def is_load(task: Task) -> int:
        return int(task.kind is TaskKind.LOAD)

    keys = (
        lambda t: (-level[t.task_id], t.order, t.task_id),
        lambda t: (is_load(t), -level[t.task_id], t.order, t.task_id),
        lambda t: (is_load(t), footprint[t.task_id], t.order, t.task_id),  # masa's rule
        lambda t: (t.order, is_load(t), t.task_id),  # network by network
        lambda t: (is_load(t), -footprint[t.task_id], t.order, t.task_id),
    )
    return [[task.task_id for task in sorted(tasks, key=key)] for key in keys]


def _cost(graph: TaskGraph, order: Sequence[str], workers: int, memory_bytes: int) -> int:
    from masa.simulator import simulate_graph  # here: the simulator imports the core

    rank = {task_id: index for index, task_id in enumerate(order)}
    result = simulate_graph(graph, policy=RankedPolicy(rank), workers=workers,
                            memory_budget_bytes=memory_bytes)
    return result.makespan_us + _OVER_BUDGET_PENALTY * len(result.over_commits)


def plan_rank(graph: TaskGraph, *, workers: int, memory_bytes: int, iterations: int,
              rng: np.random.Generator) -> dict[str, int]:
    """A dispatch rank for `graph`: the best order found by local search."""
    if not graph.tasks:
        return {}
    best_cost, best_order = min(
        ((_cost(graph, order, workers, memory_bytes), order)
         for order in initial_orders(graph)), key=lambda item: item[0])
    count = len(best_order)
    for _ in range(iterations if count > 1 else 0):
        candidate = list(best_order)
        first, second = (int(x) for x in rng.integers(0, count, size=2))
        if rng.random() < 0.5:
            candidate[first], candidate[second] = candidate[second], candidate[first]
        else:
            candidate.insert(second, candidate.pop(first))
        cost = _cost(graph, candidate, workers, memory_bytes)
        if cost <= best_cost:  # equal moves too: they let the search drift on plateaus
            best_cost, best_order = cost, candidate
    return {task_id: index for index, task_id in enumerate(best_order)}


class PlanningPolicy(RankedPolicy):
    """`masa-plan`: replan the rank whenever new tasks arrive, dispatch by it."""

    name = "masa-plan"

    def __init__(self, iterations: int | None = None, seed: int = 0) -> None:
        super().__init__(rank={})
        self.iterations = iterations  # None: scaled to the residual size (STEP_BUDGET)
        self._rng = np.random.default_rng(seed)
        self._stale = False
        self.plans = 0  # how many times it planned (once per arrival batch)

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        if info.task.task_id not in self.rank:
            self._stale = True
        super().on_ready(state, info)

    def pick(self, state: SchedulerState) -> str | None:
        if self._stale:
            self._stale = False
            self.plans += 1
            graph = residual_graph(state)
            iterations = self.iterations
            if iterations is None:
                iterations = max(MIN_ITERATIONS, min(
                    MAX_ITERATIONS, STEP_BUDGET // max(1, len(graph.tasks))))
            self.rank = plan_rank(graph, workers=state.workers,
                                  memory_bytes=max(0, state.ledger.free_bytes()),
                                  iterations=iterations, rng=self._rng)
            self._ready = [(self.rank.get(tid, _UNRANKED), tid, epoch)
                           for _, tid, epoch in self._ready]
        return super().pick(state)
