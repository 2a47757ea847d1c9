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
  through masa.sched.core like any other.
- `plan_rank` takes the residual problem (`residual_graph`: the arrived tasks
  not yet started, the memory free now), decodes candidate orders by running
  `RankedPolicy` on it in masa.runtime.virtual, and improves the best of a few
  rule-based orders by seeded simulated annealing, in both decoder modes
  (`strict_loads` off and on).
- `PlanningPolicy` (registered as `masa-plan`) replans whenever a task it has
  no rank for becomes ready (a job arrived), then dispatches by that rank.
  Where the search runs is a `Planner`'s choice: `InlinePlanner` (the
  default) plans inside `pick`, deterministically, as the simulator and the
  solver benchmark need; `ThreadPlanner` plans on a background thread with a
  time budget per arrival, and until that plan is ready the policy
  dispatches by masa's greedy rule, so a real executor's loop never waits
  for the search.

Because the decoder is the simulator driving the same policy, a plan made when
nothing is running is reproduced exactly in simulation; when it is made while
tasks run, their memory counts as held for the whole plan and their remaining
time is not known (the core has no clock), so the plan is an estimate. Cost:
`iterations` simulations of the residual tasks per arrival (about 100,000
task decodes, docs/scheduling.md), which is meant for jobs of many networks
arriving together and for checking the heuristic against the optimum (masa-optimal), not for
thousands of queued jobs. The policy and the search are pure (randomness from a seeded numpy
Generator); only `ThreadPlanner` owns a thread and reads a clock (injectable).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from masa.common.libc import name_this_thread
from masa.runtime.virtual import simulate_graph
from masa.sched.core import SchedulerState, TaskInfo, TaskState
from masa.sched.policies import MasaPolicy, _Entry
from masa.sched.taskgraph import Lock, Task, TaskGraph, TaskKind

# Annealing steps per plan (split between the two decoder modes): up to
# MAX_ITERATIONS, fewer for large residual problems so that one plan costs at
# most about STEP_BUDGET task decodes. 2,000 steps for the solver benchmark's
# 16-48-task instances (docs/bench-solver.md); with 1,000 the tight median
# was 1.055-1.061 of the optimum over two seeds, with 2,000 1.036-1.042.
MAX_ITERATIONS = 2000
MIN_ITERATIONS = 20
STEP_BUDGET = 100_000
# Annealing's starting temperature, as a fraction of the starting makespan
# (0.5%, 1% and 3% measured: 1% best on the solver benchmark's instances).
ANNEALING_START = 0.01
_UNRANKED = 1 << 60  # tasks the plan does not know (should not happen) go last
# Orders that end in an over-commit are worse than any within the budget.
_OVER_BUDGET_PENALTY = 1 << 40


class RankedPolicy(MasaPolicy):
    """Among the ready tasks that fit (masa's rules), start the one of lowest rank."""

    name = "masa-ranked"

    def __init__(self, rank: Mapping[str, int], strict_loads: bool = False) -> None:
        super().__init__(admission=False, headroom=True)
        self.rank: Mapping[str, int] = rank
        # strict_loads: LOADs start in rank order; one that does not fit holds
        # back the LOADs ranked after it (EXECs still pass). This lets a plan
        # keep memory free for a heavy LOAD instead of filling it with light ones.
        self.strict_loads = strict_loads
        self._ready: list[_Entry] = []  # (rank, task_id, ready_epoch)

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        task_id = info.task.task_id
        heapq.heappush(self._ready, (self.rank.get(task_id, _UNRANKED), task_id,
                                     info.ready_epoch))

    def pick(self, state: SchedulerState) -> str | None:
        self._ready = _ready_in_rank(state, self._ready)  # a sorted list is a valid heap
        return _pick_in_rank(self, state, self._ready, self.strict_loads)


def _ready_in_rank(state: SchedulerState, entries: Iterable[_Entry]) -> list[_Entry]:
    """The entries (rank, task id, ready epoch) still ready, in rank order."""
    tasks = state.tasks
    return sorted(
        entry for entry in entries
        if (info := tasks.get(entry[1])) is not None and info.state is TaskState.READY
        and info.ready_epoch == entry[2])


def _pick_in_rank(policy: MasaPolicy, state: SchedulerState, entries: list[_Entry],
                  strict_loads: bool) -> str | None:
    """RankedPolicy's rule on `entries` (ready, in rank order): the first that fits
    under `policy`'s memory rules, removed from `entries`; else the progress rule."""
    free_bytes = state.ledger.free_bytes()
    tasks = state.tasks
    loads_blocked = False
    for position, (_, task_id, _) in enumerate(entries):
        info = tasks[task_id]
        if info.task.kind is TaskKind.LOAD:
            if loads_blocked:
                continue
            fits = policy._load_fits(state, task_id, info.footprint_bytes, free_bytes, 0)
            loads_blocked = strict_loads and not fits
        else:
            fits = info.footprint_bytes <= free_bytes
        if fits:
            del entries[position]  # still sorted, so still a heap
            return task_id
    if state.running_count == 0 and entries:
        return entries.pop(0)[1]  # progress rule: the lowest rank runs anyway
    return None


def residual_graph(state: SchedulerState, groups: Iterable[str] | None = None) -> TaskGraph:
    """The arrived tasks that have not started, as a graph released at 0 (only
    those of `groups`, if given: cheaper than a scan of every task).

    Edges and locks from tasks that already started are dropped (their
    effect is in the ledger now); a lock whose holders all left keeps only
    its opening task, so it is held while that task runs.
    """
    candidates: Iterable[tuple[str, TaskInfo]] = state.tasks.items()
    if groups is not None:
        candidates = ((tid, state.tasks[tid]) for group in groups if group in state.groups
                      for tid in state.groups[group].task_ids if tid in state.tasks)
    residual = {tid: info for tid, info in candidates
                if info.arrived and info.state in (TaskState.PENDING, TaskState.READY)}
    tasks: list[Task] = []
    precedence: list[tuple[str, str]] = []
    start_after: list[tuple[str, str]] = []
    locks: list[Lock] = []
    for task_id, info in residual.items():
        tasks.append(dataclasses.replace(info.task, release_us=0))
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
    """Rule-based starting orders: critical path, masa-like, network by network (in
    arrival order, lightest, heaviest or longest network first)."""
    level = _bottom_levels(graph)
    tasks = list(graph.tasks)
    footprint = {task.task_id: task.memory_bytes for task in tasks}
    for lock in graph.locks:
        footprint[lock.from_task] += lock.memory_bytes

    def is_load(task: Task) -> int:
        return int(task.kind is TaskKind.LOAD)

    # Whole networks one after another, lightest, heaviest or longest first: on
    # memory-tight batches these are often the best start (docs/bench-solver.md).
    network_bytes: dict[str, int] = {}
    network_us: dict[str, int] = {}
    for task in tasks:
        network_bytes[task.group] = network_bytes.get(task.group, 0) + footprint[task.task_id]
        network_us[task.group] = network_us.get(task.group, 0) + task.duration_us

    keys = (
        lambda t: (-level[t.task_id], t.order, t.task_id),
        lambda t: (is_load(t), -level[t.task_id], t.order, t.task_id),
        lambda t: (is_load(t), footprint[t.task_id], t.order, t.task_id),  # masa's rule
        lambda t: (t.order, is_load(t), t.task_id),  # network by network
        lambda t: (is_load(t), -footprint[t.task_id], t.order, t.task_id),
        lambda t: (network_bytes[t.group], t.order, is_load(t), t.task_id),
        lambda t: (-network_bytes[t.group], t.order, is_load(t), t.task_id),
        lambda t: (-network_us[t.group], t.order, is_load(t), t.task_id),
    )
    return [[task.task_id for task in sorted(tasks, key=key)] for key in keys]


def _cost(graph: TaskGraph, order: Sequence[str], workers: int, memory_bytes: int,
          strict_loads: bool) -> int:
    rank = {task_id: index for index, task_id in enumerate(order)}
    result = simulate_graph(graph, policy=RankedPolicy(rank, strict_loads), workers=workers,
                            memory_budget_bytes=memory_bytes)
    return result.makespan_us + _OVER_BUDGET_PENALTY * len(result.over_commits)


@dataclass(frozen=True)
class Plan:
    """A dispatch rank, the RankedPolicy mode it was decoded with, and its makespan."""

    rank: dict[str, int]
    strict_loads: bool
    cost: int  # the decoded makespan (plus a large penalty per over-commit)


def _anneal(graph: TaskGraph, workers: int, memory_bytes: int, strict_loads: bool,
            steps: int, rng: np.random.Generator,
            should_stop: Callable[[], bool] | None = None) -> tuple[int, list[str]]:
    """Simulated annealing over dispatch orders from the best rule-based one."""
    current_cost, current = min(
        ((_cost(graph, order, workers, memory_bytes, strict_loads), order)
         for order in initial_orders(graph)), key=lambda item: item[0])
    best_cost, best_order = current_cost, current
    count = len(current)
    start_temperature = ANNEALING_START * current_cost
    steps = steps if count > 1 else 0
    for step in range(steps):
        if should_stop is not None and should_stop():
            break  # the time budget is spent: the best order so far
        temperature = start_temperature * (1 - step / steps)
        candidate = list(current)
        first, second = (int(x) for x in rng.integers(0, count, size=2))
        if rng.random() < 0.5:
            candidate[first], candidate[second] = candidate[second], candidate[first]
        else:
            candidate.insert(second, candidate.pop(first))
        cost = _cost(graph, candidate, workers, memory_bytes, strict_loads)
        worse_by = cost - current_cost
        # Draw every step, so the sequence of random numbers does not depend on costs.
        chance = float(rng.random())
        if worse_by <= 0 or (temperature > 0 and chance < math.exp(-worse_by / temperature)):
            current_cost, current = cost, candidate
            if cost < best_cost:
                best_cost, best_order = cost, candidate
    return best_cost, best_order


def plan_rank(graph: TaskGraph, *, workers: int, memory_bytes: int, iterations: int,
              rng: np.random.Generator, should_stop: Callable[[], bool] | None = None
              ) -> Plan:
    """The best dispatch order found by simulated annealing, in either decoder mode.

    Each mode (LOADs may overtake a LOAD that does not fit, or not) gets half
    the steps; each starts from its best rule-based order. A step swaps two
    tasks or moves one and is kept if the makespan does not grow, or grows by
    d with probability exp(-d / T), T falling linearly from 1% of the starting
    makespan to 0. Why annealing: plain descent got stuck (3,000 steps found
    nothing better than 1,000 on the benchmark's tight instances). Why both
    modes: each one reaches optima the other cannot on some instances.
    `should_stop` (a time budget) ends each mode's search early; both modes
    always decode their rule-based starting orders.
    """
    if not graph.tasks:
        return Plan(rank={}, strict_loads=False, cost=0)
    best: Plan | None = None
    for strict_loads in (False, True):
        cost, order = _anneal(graph, workers, memory_bytes, strict_loads,
                              iterations // 2, rng, should_stop)
        if best is None or cost < best.cost:
            best = Plan({task_id: index for index, task_id in enumerate(order)},
                        strict_loads, cost)
    assert best is not None
    return best


class PlanFuture(Protocol):
    """A plan being computed (concurrent.futures.Future fits)."""

    def done(self) -> bool: ...
    def result(self) -> Plan: ...


class Planner(Protocol):
    """Where masa-plan's search runs: `submit` starts it, `should_stop` bounds it."""

    def submit(self, search: Callable[[Callable[[], bool] | None], Plan]) -> PlanFuture: ...


@dataclass(frozen=True)
class _Ready:
    plan: Plan

    def done(self) -> bool:
        return True

    def result(self) -> Plan:
        return self.plan


class InlinePlanner:
    """Plans at once, inside `pick`, with no time limit: deterministic (simulation, solver)."""

    def submit(self, search: Callable[[Callable[[], bool] | None], Plan]) -> PlanFuture:
        return _Ready(search(None))


class ThreadPlanner:
    """Plans on one background thread, each search stopped after `time_budget_s`.

    The scheduler's loop only submits a snapshot (the residual graph, built on
    the loop's thread) and later polls `done()`: it never waits. A search that
    runs out of time returns the best order found so far. `clock` is injectable
    (seconds, monotonic) so tests can drive the budget without sleeping.
    Caveat: the search is Python code holding the GIL in turns with the loop
    (docs/scheduling.md); ONNX Runtime runs release it.
    """

    def __init__(self, time_budget_s: float = 0.2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.time_budget_s = time_budget_s
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="masa-plan",
                                        initializer=name_this_thread,
                                        initargs=("masa-plan",))
        self.closed = False  # close() was called: no search starts any more

    def submit(self, search: Callable[[Callable[[], bool] | None], Plan]) -> PlanFuture:
        def timed() -> Plan:
            deadline = self.clock() + self.time_budget_s
            return search(lambda: self.clock() >= deadline)

        future: Future[Plan] = self._pool.submit(timed)
        return future

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.closed = True


def _close_planner(planner: Planner) -> None:
    close = getattr(planner, "close", None)
    if close is not None:
        close()


class PlanningPolicy(RankedPolicy):
    """`masa-plan`: replan the rank whenever new tasks arrive, dispatch by it.

    With a background `planner`, masa's greedy rule (admission and headroom
    off, as in RankedPolicy) decides while a plan is being computed.
    """

    name = "masa-plan"

    def __init__(self, iterations: int | None = None, seed: int = 0,
                 planner: Planner | None = None) -> None:
        super().__init__(rank={})
        self.iterations = iterations  # None: scaled to the residual size (STEP_BUDGET)
        self.planner: Planner = planner if planner is not None else InlinePlanner()
        self._rng = np.random.default_rng(seed)
        self._stale = False
        self._pending: PlanFuture | None = None
        self._pending_ids: frozenset[str] = frozenset()  # the tasks the pending plan ranks
        self.plans = 0  # how many times it planned (once per arrival batch)
        self.greedy_picks = 0  # decisions taken by the greedy rule while a plan was pending

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        task_id = info.task.task_id
        if task_id not in self.rank and task_id not in self._pending_ids:
            self._stale = True
        super().on_ready(state, info)
        if not isinstance(self.planner, InlinePlanner):
            MasaPolicy.on_ready(self, state, info)  # the greedy rule's heaps

    def _adopt(self, plan: Plan) -> None:
        self.rank, self.strict_loads = plan.rank, plan.strict_loads
        self._ready = [(self.rank.get(tid, _UNRANKED), tid, epoch)
                       for _, tid, epoch in self._ready]
        heapq.heapify(self._ready)

    def _start_plan(self, state: SchedulerState) -> None:
        self._stale = False
        self.plans += 1
        graph = residual_graph(state)  # a snapshot: the search never reads the state
        self._pending_ids = frozenset(graph.by_id)
        iterations = self.iterations
        if iterations is None:
            iterations = max(MIN_ITERATIONS, min(
                MAX_ITERATIONS, STEP_BUDGET // max(1, len(graph.tasks))))
        self._pending = self.planner.submit(functools.partial(
            _search, graph, state.workers, max(0, state.ledger.free_bytes()), iterations,
            self._rng))

    def close(self) -> None:
        """Stop the planner's background search, if it has one (the run is over)."""
        _close_planner(self.planner)

    def stats(self) -> dict[str, int]:
        """For the report: plans made, decisions taken greedily while one was computed."""
        return {**MasaPolicy.stats(self), "plans": self.plans,
                "greedy_picks": self.greedy_picks}

    def pick(self, state: SchedulerState) -> str | None:
        if self._pending is None and self._stale:
            self._start_plan(state)
        if self._pending is not None:
            if not self._pending.done():
                self.greedy_picks += 1
                return MasaPolicy.pick(self, state)
            self._adopt(self._pending.result())
            self._pending, self._pending_ids = None, frozenset()
            if self._stale:  # tasks arrived while it planned: plan again
                return self.pick(state)
        return super().pick(state)


def _search(graph: TaskGraph, workers: int, memory_bytes: int, iterations: int,
            rng: np.random.Generator, should_stop: Callable[[], bool] | None) -> Plan:
    return plan_rank(graph, workers=workers, memory_bytes=memory_bytes,
                     iterations=iterations, rng=rng, should_stop=should_stop)


# `masa` (BatchPlanningPolicy) plans a batch of at most BATCH_MAX_TASKS arrived,
# unstarted tasks that finds the executor empty, with the rule-based orders in
# both decoder modes and BATCH_ITERATIONS annealing steps: about 40 decodes, about
# 30 ms per 16-48-task instance here (docs/scheduling.md has the figures). On the solver
# benchmark's tight instances 0 steps gave a median of 1.074 of the optimum and a
# worst of 1.250; 20 steps 1.074 and 1.227; 40 steps 1.074 and 1.239.
BATCH_MAX_TASKS = 64
BATCH_ITERATIONS = 20
# Plans kept by batch shape: a stream of jobs of the same networks, each finding the
# executor empty, poses the same problem again and again. Searching each one again
# cost a real run (small, warm store, one job every 200 ms, 33-36 searches for 100
# jobs) a mean response of 157-175 ms against 142-144 ms greedily; with the plans
# computed and never followed it was 157-168 ms: the searches' CPU, not the plans.
PLAN_CACHE_SIZE = 64
MEMORY_TOLERANCE = 0.02  # free memory within this fraction: the same shape


class BatchPlanningPolicy(MasaPolicy):
    """`masa`, the default: masa's greedy rules, except that a batch of networks
    that finds the executor empty runs in a planned order.

    When tasks no plan knows become ready and the executor is empty (nothing
    runs and no memory is held), the arrived, unstarted tasks of the jobs with
    ready work are the batch. If it has at
    most `max_tasks` tasks in at least two networks, a light plan is searched
    (`plan_rank` with `iterations` steps: the rule-based orders in both decoder
    modes, then a little annealing) and greedy masa's own run of the batch is
    decoded too; the plan is followed only if its makespan is shorter. Made
    with nothing running, the plan is exact: a simulated batch runs as
    decoded, so `masa` is never slower than greedy masa on a batch alone.
    Tasks the plan does not know (the next arrival) drop it, and greedy masa
    decides until the executor is empty again: a plan made while tasks run
    would not know their remaining time, one made while a loaded stage's
    weights are held counts them as held for good (such plans lost to greedy
    masa on the solver's instances), and under load the job order decides
    (MasaPolicy). No plan with a read-ahead window (the decoder has none), nor
    with `plan_batches` False (stores whose LOADs copy their weights, set by
    `make_policy`: the plan packs the budget with copied stages held for long,
    which on a device leaves the page cache no room for the next job's files;
    the decoder knows no page cache).
    Where the search runs is the `planner`'s choice, as for masa-plan;
    until the plan is ready the greedy rule decides. Plans are kept by the
    batch's shape (`_batch_shape`: its networks, costs and free memory to 2%),
    so a stream of like jobs is searched once; one search at a time.
    """

    name = "masa"

    def __init__(self, planner: Planner | None = None, max_tasks: int = BATCH_MAX_TASKS,
                 iterations: int = BATCH_ITERATIONS, seed: int = 0,
                 plan_batches: bool = True, **masa_options: object) -> None:
        super().__init__(**masa_options)  # type: ignore[arg-type]
        self.plan_batches = plan_batches
        self._masa_options = masa_options
        self.planner: Planner = planner if planner is not None else InlinePlanner()
        self.max_tasks = max_tasks
        self.iterations = iterations
        self._rng = np.random.default_rng(seed)
        self._rank: dict[str, int] = {}  # the plan being followed ({}: none)
        self._strict_loads = False
        self._ranked: list[_Entry] = []  # its ready tasks: (rank, task id, ready epoch)
        self._unplanned = False  # a task no plan knows became ready
        # The batch waiting for its plan: (shape, its task ids in the shape's order).
        self._pending: tuple[Hashable, list[str]] | None = None
        self._pending_ids: frozenset[str] = frozenset()
        # Plans by batch shape (None: greedy masa is as fast), least recently used
        # first, and the one search under way (at most one: a bounded cost).
        self._plans_by_shape: OrderedDict[Hashable, _ShapePlan | None] = OrderedDict()
        self._search: tuple[Hashable, list[str], PlanFuture] | None = None
        # Per job not yet over: its networks and its tasks not yet ended (so a
        # daemon that is never idle forgets its jobs all the same).
        self._groups_by_job: dict[int, set[str]] = {}
        self._open_by_job: dict[int, int] = {}
        self._jobs_with_work: set[int] = set()  # of those, jobs that had a task ready
        self.plans = 0  # searches started
        self.plans_reused = 0  # batches of a shape planned before
        self.plans_followed = 0  # plans better than greedy masa's decode, followed

    def on_added(self, state: SchedulerState, info: TaskInfo) -> None:
        super().on_added(state, info)
        job = info.task.job_id
        self._groups_by_job.setdefault(job, set()).add(info.task.group)
        self._open_by_job[job] = self._open_by_job.get(job, 0) + 1

    def on_ended(self, state: SchedulerState, info: TaskInfo) -> None:
        super().on_ended(state, info)
        job = info.task.job_id
        self._open_by_job[job] -= 1
        if self._open_by_job[job] == 0:
            del self._open_by_job[job], self._groups_by_job[job]
            self._jobs_with_work.discard(job)

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        super().on_ready(state, info)
        task_id = info.task.task_id
        self._jobs_with_work.add(info.task.job_id)
        rank = self._rank.get(task_id)
        if rank is not None:
            heapq.heappush(self._ranked, (rank, task_id, info.ready_epoch))
        elif task_id not in self._pending_ids:
            self._unplanned = True

    def close(self) -> None:
        """Stop the planner's background search, if it has one (the run is over)."""
        _close_planner(self.planner)

    def stats(self) -> dict[str, int]:
        """For the report: batch plans searched, reused by shape, followed."""
        return {**MasaPolicy.stats(self), "batch_planning": int(self.plan_batches),
                "batch_plans_searched": self.plans, "batch_plans_reused": self.plans_reused,
                "batch_plans_followed": self.plans_followed}

    def pick(self, state: SchedulerState) -> str | None:
        if self._unplanned:
            self._unplanned = False
            self._rank, self._ranked = {}, []
            self._pending, self._pending_ids = None, frozenset()  # a search left is ignored
            # Only an empty executor (nothing running, nothing held) makes the plan
            # exact: a plan made later counts held memory as held throughout and
            # does not know the running tasks' remaining time, and on the solver
            # benchmark such plans lost to greedy masa.
            if (state.running_count == 0 and state.ledger.reserved_bytes == 0
                    and self.plan_batches and self.read_ahead_bytes is None):
                self._start_plan(state)
        if self._pending is not None:
            self._collect_search()
            shape, task_ids = self._pending
            if shape not in self._plans_by_shape:
                return super().pick(state)  # still searching
            self._pending, self._pending_ids = None, frozenset()
            plan = self._plans_by_shape[shape]
            if plan is not None:
                self._follow(state, plan, task_ids)
        if self._rank:
            self._ranked = _ready_in_rank(state, self._ranked)
            return _pick_in_rank(self, state, self._ranked, self._strict_loads)
        return super().pick(state)

    def _batch_groups(self, state: SchedulerState) -> list[str]:
        """The networks of the jobs with work that have arrived, unstarted tasks."""
        return [group for job in self._jobs_with_work for group in self._groups_by_job[job]
                if (info := state.groups.get(group)) is not None
                and info.arrived_count > info.started_count]

    def _start_plan(self, state: SchedulerState) -> None:
        groups = self._batch_groups(state)
        waiting = sum(state.groups[group].arrived_count - state.groups[group].started_count
                      for group in groups)
        if len(groups) < 2 or waiting > self.max_tasks:
            return
        graph = residual_graph(state, groups)
        memory_bytes = max(0, state.ledger.free_bytes())
        options = self._masa_options
        if self.job_order and self.queue_jobs is None:
            # The greedy run a plan must beat is this policy's own, whose job order
            # engages for a lone job by what the page cache holds: the search's
            # simulation models no page cache, so it is told.
            options = {**options, "queue_jobs": 1 if self._job_order_engaged(state)
                       else state.workers + 1}
        batch_shape, task_ids = _batch_shape(graph, state.workers, memory_bytes)
        shape = (batch_shape, options.get("queue_jobs"))
        self._collect_search()
        if shape in self._plans_by_shape:
            self._plans_by_shape.move_to_end(shape)
            self.plans_reused += 1
        elif self._search is None:
            self.plans += 1
            self._search = (shape, task_ids, self.planner.submit(functools.partial(
                _batch_search, graph, state.workers, memory_bytes, self.iterations,
                self._rng, options)))
            self._collect_search()  # an inline planner is done already
        elif self._search[0] != shape:
            return  # another shape's search is under way: greedy masa runs this one
        self._pending, self._pending_ids = (shape, task_ids), frozenset(task_ids)

    def _collect_search(self) -> None:
        """Keep the plan of the search under way, if it has ended."""
        if self._search is None or not self._search[2].done():
            return
        shape, task_ids, future = self._search
        self._search = None
        plan = future.result()
        self._plans_by_shape[shape] = None if plan is None else _ShapePlan(
            tuple(plan.rank[task_id] for task_id in task_ids), plan.strict_loads)
        if len(self._plans_by_shape) > PLAN_CACHE_SIZE:
            self._plans_by_shape.popitem(last=False)

    def _follow(self, state: SchedulerState, plan: _ShapePlan, task_ids: list[str]) -> None:
        self.plans_followed += 1
        self._rank = dict(zip(task_ids, plan.ranks, strict=True))
        self._strict_loads = plan.strict_loads
        tasks = state.tasks
        self._ranked = [(rank, task_id, tasks[task_id].ready_epoch)
                        for task_id, rank in self._rank.items() if task_id in tasks]


@dataclass(frozen=True)
class _ShapePlan:
    """A batch plan by position in its shape's task order (`_batch_shape`)."""

    ranks: tuple[int, ...]
    strict_loads: bool


def _batch_shape(graph: TaskGraph, workers: int, memory_bytes: int
                 ) -> tuple[Hashable, list[str]]:
    """What a batch's plan depends on, without its task, network and job names (two
    jobs of the same networks have the same shape) and with free memory in 2% steps,
    and the batch's task ids in that order."""
    tasks = sorted(graph.tasks, key=lambda task: (task.order, task.kind.value, task.task_id))
    index = {task.task_id: position for position, task in enumerate(tasks)}
    groups: dict[str, int] = {}
    jobs: dict[int, int] = {}
    task_keys = tuple(
        (groups.setdefault(task.group, len(groups)), jobs.setdefault(task.job_id, len(jobs)),
         task.network, task.stage_id, task.kind.value, task.duration_us, task.memory_bytes,
         task.layer_type) for task in tasks)
    # Free memory to within 2%: measured memory moves the budget by a few MiB from
    # one job to the next (503-509 MiB of 512 in the small scenario), and a rank
    # made for one of those figures is as good for the others (fits are checked live).
    memory_bucket = int(math.log(max(1, memory_bytes)) / math.log(1 + MEMORY_TOLERANCE))
    shape = (workers, memory_bucket, task_keys,
             tuple(sorted((index[a], index[b]) for a, b in graph.precedence)),
             tuple(sorted((index[a], index[b]) for a, b in graph.start_after)),
             tuple(sorted((index[lock.from_task], tuple(sorted(index[t] for t in lock.until_tasks)),
                           lock.memory_bytes) for lock in graph.locks)))
    return shape, [task.task_id for task in tasks]


def _batch_search(graph: TaskGraph, workers: int, memory_bytes: int, iterations: int,
                  rng: np.random.Generator, masa_options: Mapping[str, object],
                  should_stop: Callable[[], bool] | None) -> Plan | None:
    """A light plan of the batch, or None if greedy masa runs it as fast."""
    greedy = simulate_graph(graph, policy=MasaPolicy(**masa_options),  # type: ignore[arg-type]
                            workers=workers, memory_budget_bytes=memory_bytes)
    greedy_cost = greedy.makespan_us + _OVER_BUDGET_PENALTY * len(greedy.over_commits)
    plan = plan_rank(graph, workers=workers, memory_bytes=memory_bytes, iterations=iterations,
                     rng=rng, should_stop=should_stop)
    return plan if plan.cost < greedy_cost else None
