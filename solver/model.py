"""CP-SAT models of the Masa scheduling problem, and solving them.

Owns the constraint model (in the OR-Tools examples' order: data, variables,
constraints, objective, solve), the assignment of concrete workers to a
solution (interval colouring), and decomposition by release time. Two
formulations:

- "cumulative" (default): one fixed-size interval per task in one cumulative
  of capacity `workers` (identical workers), and one memory cumulative over
  the tasks' direct memory and the lock intervals
  [start(from), max(end(until...))). Workers are assigned afterwards.
- "paper": the paper's assignment variables X[t][w] with one optional interval
  per task and worker and a no-overlap per worker, same memory cumulative.

Always: a time limit, a search-worker count, a seed, an optional feasible hint
(the heuristic's schedule, which also bounds the objective from above) and the
bound makespan >= ceil(work / workers). The result's status (OPTIMAL,
FEASIBLE, INFEASIBLE, UNKNOWN) is data, never an exception.

How it searches, on memory-tight instances (measured in docs/bench-solver.md):
backwards (the time-reversed mirror, read back), because their idle time
sits at the end of the schedule; and, for the makespan, by lower-bound
probes (deadlines from the static bound up) before minimising.

No threads, clocks or I/O here beyond CP-SAT's own search workers; solve times
are CP-SAT's reported wall times.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from masa.sched.taskgraph import ScheduledTask, Task, TaskGraph, TaskKind
from solver.instance import (
    Instance,
    ancestor_sets,
    mirror_schedule,
    mirrored,
    spanning_locks,
)
from solver.list_schedule import best_list_schedule

FORMULATIONS = ("cumulative", "paper")
OBJECTIVES = ("makespan", "response")
SEARCHES = ("auto", "set_times", "default")
DIRECTIONS = ("auto", "forward", "backward")
SET_TIMES_MAX_TASKS = 64  # forward search; measured: see benchmarks/bench_solver.py scaling
# Up to this size the defaults aim at a proof (backward set-times search and
# lower-bound probing); above it at a good schedule (forward, CP-SAT's
# portfolio, no probing). Measured on memory-tight instances, 60 s, 2 cores:
# 80 tasks proven only that way; at 120 tasks gap 7.7% against 10.2%; at 168
# and 240 tasks 12.3% and 15.9% against 9.5% and 13.4% (no probe settles,
# and backward search found worse schedules).
PROOF_MAX_TASKS = 128
PROBING_SHARE = 2 / 3  # of the time limit, at most, for lower-bound probes


@dataclass(frozen=True)
class SolveOptions:
    time_limit_s: float = 10.0  # total, shared by all segments of a decomposition
    search_workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    seed: int = 0
    formulation: str = "cumulative"  # one of FORMULATIONS
    objective: str = "makespan"  # one of OBJECTIVES; "response" = sum of job response times
    symmetry_breaking: bool = True  # order identical networks (and workers, paper form.)
    redundant: bool = True  # energy and release-window bounds, tightened domains
    decompose: bool = True  # split by release time when earlier jobs finish in time
    split_locks: bool = False  # chain locks on task intervals (measured slower: off)
    # Also hint with the best of several quick list schedules (solver.list_schedule)
    # when it beats the given hint: a better start and upper bound on tight instances.
    list_hints: bool = True
    # "set_times": the model carries a decision strategy (starts, earliest
    # first; execs first on ties) and CP-SAT's full subsolvers are limited to
    # default_lp and fixed. On 2 workers CP-SAT runs one of them, default_lp,
    # whose integer branching then follows the strategy, beside its
    # first-solution and interleaved neighbourhood searches (CP-SAT's log).
    # On tight instances this completes proofs the default portfolio does
    # not (48 tasks, forward: proven in 30-60 s where the default was not at
    # 60 s). Forward, it found worse schedules than the default portfolio
    # above SET_TIMES_MAX_TASKS tasks (80 tasks: 324 against 292 in 60 s);
    # backward it was as good or better at 80-168 tasks, within 1% at 240.
    # "default": CP-SAT's own portfolio. "auto": set_times when searching
    # backwards, and forwards up to SET_TIMES_MAX_TASKS tasks.
    search: str = "auto"  # one of SEARCHES
    # "backward": solve the instance's mirror (solver.instance.mirrored: time
    # running backwards) and read its schedule backwards, so the search
    # branches from the end of the schedule first. On memory-tight instances
    # the idle time sits at the end (the last loads' exec chains run with
    # the other worker idle), and set-times search from the end settles it
    # first (measured: 48 tasks proven in ~5 s instead of 22-42 s, 80 tasks
    # proven in 60 s where forward never was; benchmarks/bench_solver.py).
    # "auto": backward for the makespan objective on up to PROOF_MAX_TASKS
    # tasks when the mirror exists (one common release, single-until locks),
    # forward otherwise.
    direction: str = "auto"  # one of DIRECTIONS
    # Makespan objective, up to PROOF_MAX_TASKS tasks: lower-bound probing
    # before minimising (see _probe_then_minimise).
    probe: bool = True
    log_search: bool = False


@dataclass(frozen=True)
class SolveResult:
    """The outcome of one solve. Times are in the instance's time unit."""

    status: str  # OPTIMAL / FEASIBLE / INFEASIBLE / UNKNOWN
    objective: str
    formulation: str
    makespan_us: int | None  # of the best schedule found (None without one)
    response_sum_us: int | None  # sum over jobs of (last end - job release)
    objective_value: int | None  # makespan or response sum, whichever was minimised
    bound: int | None  # proven lower bound on the objective
    solve_time_s: float  # CP-SAT wall time, summed over segments
    schedule: tuple[ScheduledTask, ...] = ()
    segments: int = 1  # independent release-time segments solved
    hint_used: bool = False
    # CP-SAT's deterministic time (work units, about seconds on an idle core):
    # comparable across runs on a loaded machine, unlike solve_time_s.
    deterministic_time: float = 0.0
    # Objective of the hint the solve started from (the given one or a better
    # list schedule): the upper bound before search. None without a hint.
    hint_objective: int | None = None
    direction: str = "forward"  # the direction the (last) model was solved in
    probes: int = 0  # lower-bound probes run before (or instead of) minimising

    @property
    def proven(self) -> bool:
        return self.status == "OPTIMAL"

    @property
    def gap(self) -> float | None:
        """(best - bound) / best; 0.0 when proven, None without a solution."""
        if self.objective_value is None or self.bound is None:
            return None
        if self.objective_value == 0:
            return 0.0
        return max(0.0, (self.objective_value - self.bound) / self.objective_value)


# ---------------------------------------------------------------- schedule helpers

def assign_workers(intervals: Iterable[tuple[str, int, int]], workers: int
                   ) -> dict[str, int]:
    """Interval colouring: (task_id, start, end) -> worker index in [0, workers).

    Greedy by start time onto the lowest-numbered free worker. It never runs
    out when at most `workers` half-open intervals overlap, which the worker
    cumulative guarantees. Zero-length tasks go to a worker free at their
    instant (or, if none is, the one that frees first).
    """
    busy_until = [0] * workers
    result: dict[str, int] = {}
    for task_id, start, end in sorted(intervals, key=lambda item: (item[1], item[2], item[0])):
        free = [w for w in range(workers) if busy_until[w] <= start]
        worker = free[0] if free else min(range(workers), key=lambda w: busy_until[w])
        result[task_id] = worker
        if end > start:
            busy_until[worker] = max(busy_until[worker], end)
    return result


def serial_schedule(graph: TaskGraph) -> tuple[ScheduledTask, ...]:
    """One task at a time on worker 0, in topological order, ties by (order, position).

    A fallback hint when the heuristic's schedule is not within the budget.
    Running one task at a time holds no more than a parallel schedule that
    starts tasks in the same order, so it is feasible whenever such a schedule
    is; with networks one after another it usually fits (check it before use).
    """
    import heapq

    position = {task.task_id: index for index, task in enumerate(graph.tasks)}
    successors: dict[str, list[str]] = {task.task_id: [] for task in graph.tasks}
    waiting = dict.fromkeys(successors, 0)
    for before, after in graph.precedence:
        successors[before].append(after)
        waiting[after] += 1
    ready = [(graph.by_id[t].order, position[t], t) for t, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    time_us = 0
    schedule: list[ScheduledTask] = []
    while ready:
        _, _, task_id = heapq.heappop(ready)
        task = graph.by_id[task_id]
        start = max(time_us, task.release_us)
        time_us = start + task.duration_us
        schedule.append(ScheduledTask(task_id, 0, start, time_us))
        for child in successors[task_id]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, (graph.by_id[child].order, position[child], child))
    return tuple(schedule)


def in_start_order(schedule: Iterable[ScheduledTask]) -> tuple[ScheduledTask, ...]:
    """A schedule as the solver reports it: by start, then worker, then task."""
    return tuple(sorted(schedule, key=lambda item: (item.start_us, item.worker, item.task_id)))


def schedule_makespan(schedule: Sequence[ScheduledTask]) -> int:
    return max((item.end_us for item in schedule), default=0)


def job_releases(graph: TaskGraph) -> dict[int, int]:
    """Each job's release: the earliest release of its tasks."""
    releases: dict[int, int] = {}
    for task in graph.tasks:
        releases[task.job_id] = min(releases.get(task.job_id, task.release_us), task.release_us)
    return releases


def response_sum(graph: TaskGraph, schedule: Sequence[ScheduledTask]) -> int:
    """Sum over jobs of (latest end of its tasks - its release): the online objective."""
    ends: dict[int, int] = {}
    for item in schedule:
        job = graph.by_id[item.task_id].job_id
        ends[job] = max(ends.get(job, 0), item.end_us)
    releases = job_releases(graph)
    return sum(end - releases[job] for job, end in ends.items())


def _objective_of(objective: str, graph: TaskGraph, schedule: Sequence[ScheduledTask]) -> int:
    return schedule_makespan(schedule) if objective == "makespan" else response_sum(
        graph, schedule)


# ---------------------------------------------------------------- structure helpers

def _topological(graph: TaskGraph) -> list[str]:
    successors: dict[str, list[str]] = {task.task_id: [] for task in graph.tasks}
    indegree = dict.fromkeys(successors, 0)
    for before, after in graph.precedence:
        successors[before].append(after)
        indegree[after] += 1
    ready = [task.task_id for task in graph.tasks if indegree[task.task_id] == 0]
    order: list[str] = []
    while ready:
        node = ready.pop()
        order.append(node)
        for child in successors[node]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    return order


def _heads_and_tails(graph: TaskGraph) -> tuple[dict[str, int], dict[str, int]]:
    """Earliest start (releases + chains) and tail (longest path to a sink incl. itself)."""
    order = _topological(graph)
    predecessors: dict[str, list[str]] = {t: [] for t in order}
    successors: dict[str, list[str]] = {t: [] for t in order}
    for before, after in graph.precedence:
        predecessors[after].append(before)
        successors[before].append(after)
    head: dict[str, int] = {}
    for task_id in order:
        task = graph.by_id[task_id]
        head[task_id] = max([task.release_us] + [
            head[p] + graph.by_id[p].duration_us for p in predecessors[task_id]])
    tail: dict[str, int] = {}
    for task_id in reversed(order):
        tail[task_id] = graph.by_id[task_id].duration_us + max(
            [tail[s] for s in successors[task_id]], default=0)
    return head, tail


def identical_groups(graph: TaskGraph) -> list[list[list[str]]]:
    """Classes of interchangeable networks: each class a list of groups, each a task list.

    Two groups (network instances) are interchangeable when their tasks, taken
    in instance order, match position by position (kind, duration, memory,
    release, job-free) with the same internal precedences and locks, and no
    precedence or lock connects them to any other group. Swapping two such
    groups maps every schedule to another one with the same makespan.
    """
    members: dict[str, list[str]] = {}
    for task in graph.tasks:
        if task.group:
            members.setdefault(task.group, []).append(task.task_id)
    group_of = {task.task_id: task.group for task in graph.tasks}
    crossing: set[str] = set()
    internal_edges: dict[str, list[tuple[str, str]]] = {g: [] for g in members}
    for before, after in graph.precedence:
        if group_of[before] != group_of[after]:
            crossing |= {group_of[before], group_of[after]}
        elif group_of[before]:
            internal_edges[group_of[before]].append((before, after))
    internal_locks: dict[str, list[tuple[str, tuple[str, ...], int]]] = {g: [] for g in members}
    for lock in graph.locks:
        groups = {group_of[t] for t in (lock.from_task, *lock.until_tasks)}
        if len(groups) > 1:
            crossing |= groups
        elif group_of[lock.from_task]:
            internal_locks[group_of[lock.from_task]].append(
                (lock.from_task, lock.until_tasks, lock.memory_bytes))
    signatures: dict[tuple, list[list[str]]] = {}
    for group, task_ids in members.items():
        if group in crossing:
            continue
        position = {task_id: index for index, task_id in enumerate(task_ids)}
        tasks = tuple((graph.by_id[t].kind, graph.by_id[t].duration_us,
                       graph.by_id[t].memory_bytes, graph.by_id[t].release_us)
                      for t in task_ids)
        edges = tuple(sorted((position[a], position[b]) for a, b in internal_edges[group]))
        locks = tuple(sorted((position[f], tuple(sorted(position[u] for u in until)), m)
                             for f, until, m in internal_locks[group]))
        signatures.setdefault((tasks, edges, locks), []).append(task_ids)
    return [groups for groups in signatures.values() if len(groups) > 1]


def conflict_cliques(graph: TaskGraph, memory: int, limit: int | None = None
                     ) -> list[list[str]]:
    """Groups of tasks no two of which can ever run at the same time.

    Two tasks conflict when one must precede the other, or when the memory
    necessarily held while both run exceeds the budget: their direct memory
    plus every lock that spans each of them whatever the schedule (opened by
    the task or an ancestor, closed by the task or a descendant). Cliques of
    the conflict graph, grown greedily from the largest needs, become
    redundant no-overlap constraints: with a tight budget they carry the
    disjunctive reasoning (edge finding, LP cuts) that the memory cumulative,
    whose lock intervals have variable size, propagates only weakly.
    """
    ancestors = ancestor_sets(graph)
    spanning = spanning_locks(graph, ancestors)
    lock_memory = [lock.memory_bytes for lock in graph.locks]
    need = {tid: graph.by_id[tid].memory_bytes + sum(lock_memory[i] for i in locks)
            for tid, locks in spanning.items()}
    candidates = [t.task_id for t in graph.tasks if t.duration_us > 0]

    def conflict(a: str, b: str) -> bool:
        if a in ancestors[b] or b in ancestors[a]:
            return True
        shared = sum(lock_memory[i] for i in spanning[a] & spanning[b])
        return need[a] + need[b] - shared > memory

    neighbours = {a: {b for b in candidates if b != a and conflict(a, b)} for a in candidates}
    by_need = sorted(candidates, key=lambda t: (-need[t], -graph.by_id[t].duration_us, t))
    cliques: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for seed in by_need:
        clique = [seed]
        common = set(neighbours[seed])
        for other in sorted(common, key=lambda t: (-graph.by_id[t].duration_us, t)):
            if other in common:
                clique.append(other)
                common &= neighbours[other]
        key = frozenset(clique)
        # A clique that only restates one precedence chain adds nothing.
        if len(clique) >= 3 and key not in seen and not _is_chain(clique, ancestors):
            seen.add(key)
            cliques.append(clique)
        if limit is not None and len(cliques) >= limit:
            break
    return cliques


def _is_chain(task_ids: list[str], ancestors: dict[str, set[str]]) -> bool:
    return all(a in ancestors[b] or b in ancestors[a]
               for i, a in enumerate(task_ids) for b in task_ids[i + 1:])


def _swappable(graph: TaskGraph, classes: list[list[list[str]]], objective: str
               ) -> list[list[list[str]]]:
    """The classes whose groups may be swapped without changing the objective.

    Makespan: all of them. Sum of job response times: swapping two groups of
    different jobs moves work between jobs, which is harmless only when each
    is its job's only group; otherwise only groups of the same job are swapped.
    """
    if objective == "makespan":
        return classes
    groups_of_job: dict[int, set[str]] = {}
    for task in graph.tasks:
        groups_of_job.setdefault(task.job_id, set()).add(task.group)
    result: list[list[list[str]]] = []
    for groups in classes:
        jobs = [graph.by_id[g[0]].job_id for g in groups]
        if len(set(jobs)) == len(jobs) and all(len(groups_of_job[j]) == 1 for j in jobs):
            result.append(groups)
            continue
        by_job: dict[int, list[list[str]]] = {}
        for job, group in zip(jobs, groups, strict=True):
            by_job.setdefault(job, []).append(group)
        result += [same_job for same_job in by_job.values() if len(same_job) > 1]
    return result


# ---------------------------------------------------------------- the model

@dataclass
class _Built:
    model: cp_model.CpModel
    starts: dict[str, cp_model.IntVar]
    workers_x: dict[str, list[cp_model.IntVar]]  # paper formulation only
    makespan: cp_model.IntVar
    objective_offset: int


def static_lower_bound(instance: Instance) -> int:
    """The makespan no schedule can beat, from work and paths alone.

    The work bound ceil(work / workers); for each release r, r plus the work
    released at or after r shared by the workers; the longest chain of
    precedences from a release.
    """
    graph = instance.graph
    head, tail = _heads_and_tails(graph)
    bound = max((head[t] + tail[t] for t in head), default=0)
    for release in {task.release_us for task in graph.tasks}:
        late_work = sum(t.duration_us for t in graph.tasks if t.release_us >= release)
        bound = max(bound, release + math.ceil(late_work / instance.workers))
    return bound


def _build(instance: Instance, options: SolveOptions,
           hint: dict[str, ScheduledTask] | None, end_by: int | None = None,
           at_least: int = 0, set_times: bool = False) -> _Built:
    # --- data
    graph = instance.graph
    tasks: tuple[Task, ...] = graph.tasks
    workers = instance.workers
    duration = {task.task_id: task.duration_us for task in tasks}
    total_work = sum(duration.values())
    horizon = max((task.release_us for task in tasks), default=0) + total_work
    head, tail = _heads_and_tails(graph)
    ancestors = ancestor_sets(graph)

    model = cp_model.CpModel()
    model.name = instance.name or "masa"

    # --- variables: one start per task; intervals are fixed-size.
    starts: dict[str, cp_model.IntVar] = {}
    intervals: dict[str, cp_model.IntervalVar] = {}
    for task in tasks:
        tid = task.task_id
        low = head[tid] if options.redundant else task.release_us
        high = horizon - tail[tid] if options.redundant else horizon - duration[tid]
        starts[tid] = model.new_int_var(low, max(low, high), f"start_{tid}")
        intervals[tid] = model.new_fixed_size_interval_var(
            starts[tid], duration[tid], f"interval_{tid}")
    makespan_var = model.new_int_var(0, horizon, "makespan")

    lock_intervals: list[cp_model.IntervalVar] = []
    lock_demands: list[int] = []
    lock_sizes: list[tuple[int, cp_model.IntVar]] = []
    energy_offset = 0
    # Lock memory carried by the fixed-size task intervals themselves (see below).
    carried: dict[str, int] = dict.fromkeys(duration, 0)
    for lock in graph.locks:
        if lock.memory_bytes == 0:
            continue
        if (options.redundant and options.split_locks and len(lock.until_tasks) == 1
                and lock.from_task in ancestors[lock.until_tasks[0]]):
            # Split [start(from), end(until)) into from's own interval, the gap
            # [end(from), start(until)) and until's own interval: same memory,
            # mostly on fixed-size intervals. Expected to propagate better; on
            # the benchmark instances it was slower, hence off by default.
            until = lock.until_tasks[0]
            carried[lock.from_task] += lock.memory_bytes
            carried[until] += lock.memory_bytes
            gap_start = starts[lock.from_task] + duration[lock.from_task]
            size = model.new_int_var(0, horizon, f"lock_gap_{lock.lock_id}")
            model.add(size == starts[until] - gap_start)
            lock_intervals.append(model.new_interval_var(
                gap_start, size, starts[until], f"lock_{lock.lock_id}"))
            lock_demands.append(lock.memory_bytes)
            lock_sizes.append((lock.memory_bytes, size))
            energy_offset += lock.memory_bytes * (duration[lock.from_task] + duration[until])
            continue
        start = starts[lock.from_task]
        ends = [starts[u] + duration[u] for u in lock.until_tasks]
        # Held at least until `from` itself ends (masa.sched.checker's rule too);
        # implied when every `until` task descends from `from` (the usual case).
        if not all(lock.from_task in ancestors[u] for u in lock.until_tasks):
            ends.append(start + duration[lock.from_task])
        if len(ends) == 1:
            end = ends[0]
            size = model.new_int_var(0, horizon, f"lock_size_{lock.lock_id}")
            model.add(size == end - start)
        else:
            end = model.new_int_var(0, horizon, f"lock_end_{lock.lock_id}")
            model.add_max_equality(end, ends)
            size = model.new_int_var(0, horizon, f"lock_size_{lock.lock_id}")
            model.add(size == end - start)
        lock_intervals.append(model.new_interval_var(start, size, end, f"lock_{lock.lock_id}"))
        lock_demands.append(lock.memory_bytes)
        lock_sizes.append((lock.memory_bytes, size))

    workers_x: dict[str, list[cp_model.IntVar]] = {}

    # --- constraints
    # Workers.
    if options.formulation == "paper":
        per_worker: list[list[cp_model.IntervalVar]] = [[] for _ in range(workers)]
        for index, task in enumerate(tasks):
            tid = task.task_id
            # Symmetry between workers: relabel them by their first task in
            # instance order, so task i uses one of workers 0..i.
            usable = min(workers, index + 1) if options.symmetry_breaking else workers
            row = [model.new_bool_var(f"x_{tid}_{w}") for w in range(usable)]
            workers_x[tid] = row
            model.add_exactly_one(row)
            for w, present in enumerate(row):
                per_worker[w].append(model.new_optional_fixed_size_interval_var(
                    starts[tid], duration[tid], present, f"interval_{tid}_w{w}"))
        for worker_intervals in per_worker:
            model.add_no_overlap(worker_intervals)
    elif workers == 1:
        model.add_no_overlap(list(intervals.values()))
    else:
        model.add_cumulative(list(intervals.values()), [1] * len(tasks), workers)

    # Memory: direct memory while running plus locked memory.
    demand = {t.task_id: t.memory_bytes + carried[t.task_id] for t in tasks}
    memory_intervals = [intervals[t] for t, need in demand.items() if need > 0]
    memory_demands = [need for need in demand.values() if need > 0]
    if memory_intervals or lock_intervals:
        model.add_cumulative(memory_intervals + lock_intervals,
                             memory_demands + lock_demands, instance.memory)

    # Precedence (finish to start); releases are in the start domains.
    for before, after in graph.precedence:
        model.add(starts[after] >= starts[before] + duration[before])

    # Makespan.
    for task in tasks:
        model.add(makespan_var >= starts[task.task_id] + duration[task.task_id])
    model.add(makespan_var >= math.ceil(total_work / workers))

    if at_least:
        model.add(makespan_var >= at_least)
    if options.redundant:
        model.add(makespan_var >= static_lower_bound(instance))
        # Tasks that can never overlap (memory or precedence): disjunctions.
        for clique in conflict_cliques(graph, instance.memory, limit=len(tasks)):
            model.add_no_overlap([intervals[t] for t in clique])
        # Memory energy: what is held, integrated over time, fits under the budget.
        energy = sum(t.memory_bytes * duration[t.task_id] for t in tasks) + energy_offset
        if lock_sizes or energy:
            model.add(sum(m * size for m, size in lock_sizes) + energy
                      <= instance.memory * makespan_var)

    if set_times:
        # Ties (equal earliest starts): execs first, as the masa policy does
        # (they free memory), then instance order. Measured on a 48-task
        # tight instance: proven at ~10 dtime; instance order alone was not
        # proven at 20.
        order = sorted(tasks, key=lambda task: task.kind != TaskKind.EXEC)
        model.add_decision_strategy([starts[t.task_id] for t in order],
                                    cp_model.CHOOSE_LOWEST_MIN, cp_model.SELECT_MIN_VALUE)

    if options.symmetry_breaking:
        for groups in _swappable(graph, identical_groups(graph), options.objective):
            # Any one task position may be ordered across interchangeable
            # networks; order them as the hint does so the hint stays feasible.
            anchor = 0
            if hint is not None:
                groups = sorted(groups, key=lambda g: (hint[g[anchor]].start_us, g[anchor]))
            for first, second in zip(groups, groups[1:], strict=False):
                model.add(starts[first[anchor]] <= starts[second[anchor]])

    # --- objective
    offset = 0
    if end_by is not None:
        # A release-time segment that only has to be done before the next one.
        model.add(makespan_var <= end_by)
    elif options.objective == "makespan":
        model.minimize(makespan_var)
    else:
        releases = job_releases(graph)
        job_tasks: dict[int, list[str]] = {}
        for task in tasks:
            job_tasks.setdefault(task.job_id, []).append(task.task_id)
        job_ends = []
        for job, ids in sorted(job_tasks.items()):
            job_end = model.new_int_var(0, horizon, f"job_end_{job}")
            model.add_max_equality(job_end, [starts[t] + duration[t] for t in ids])
            job_ends.append(job_end)
            if hint is not None:
                model.add_hint(job_end, max(hint[t].end_us for t in ids))
        offset = sum(releases.values())
        model.minimize(sum(job_ends) - offset)

    # --- hint: a complete, feasible schedule, and its objective as an upper bound.
    if hint is not None:
        for task in tasks:
            model.add_hint(starts[task.task_id], hint[task.task_id].start_us)
        model.add_hint(makespan_var, max(item.end_us for item in hint.values()))
        if workers_x:
            first_seen: dict[int, int] = {}
            for task in tasks:
                first_seen.setdefault(hint[task.task_id].worker, len(first_seen))
            for tid, row in workers_x.items():
                label = first_seen[hint[tid].worker]
                for w, present in enumerate(row):
                    model.add_hint(present, w == label)
        bound = _objective_of(options.objective, graph, list(hint.values()))
        if options.objective == "makespan":
            model.add(makespan_var <= bound)
    return _Built(model=model, starts=starts, workers_x=workers_x, makespan=makespan_var,
                  objective_offset=offset)


def _backward(options: SolveOptions, num_tasks: int) -> bool:
    """Whether to solve the mirror (when it exists): reading a schedule
    backwards keeps its makespan, not its jobs' response times."""
    return options.direction == "backward" or (
        options.direction == "auto" and options.objective == "makespan"
        and num_tasks <= PROOF_MAX_TASKS)


def _set_times(options: SolveOptions, num_tasks: int, backward: bool) -> bool:
    """Set-times search: asked for, or `auto` and either searching backwards
    or forwards on up to SET_TIMES_MAX_TASKS tasks (see SolveOptions.search)."""
    if options.search != "auto":
        return options.search == "set_times"
    return backward or num_tasks <= SET_TIMES_MAX_TASKS


def _solve_one(instance: Instance, options: SolveOptions,
               hint: dict[str, ScheduledTask] | None, end_by: int | None = None
               ) -> SolveResult:
    """One instance (or segment): the best hint, then probes from below when
    minimising the makespan, else one CP-SAT solve; with `end_by`, only a
    schedule ending by then is sought."""
    if options.list_hints:
        hint = _better_hint(instance, options, hint)
    # Built once for every CP-SAT solve below (it costs a transitive closure).
    mirror = mirrored(instance) if _backward(options, instance.num_tasks) else None
    if (end_by is None and options.objective == "makespan" and options.probe
            and instance.num_tasks <= PROOF_MAX_TASKS):
        return _probe_then_minimise(instance, options, hint, mirror)
    return _cp_sat(instance, options, hint, mirror, end_by)


def _probe_then_minimise(instance: Instance, options: SolveOptions,
                         hint: dict[str, ScheduledTask] | None,
                         mirror: Instance | None) -> SolveResult:
    """Lower-bound probing: ask CP-SAT for any schedule ending by T, for T =
    `static_lower_bound`, T + 1, ...; then minimise with the time left.

    A probe proven infeasible raises the bound to T + 1; a probe that finds a
    schedule has found an optimal one (every shorter makespan was refuted).
    Probing gets PROBING_SHARE of the time limit; a probe that runs out of it
    ends the probing, and CP-SAT minimises with the time left, from the best
    schedule as hint and with the proven bound as a constraint (on large
    instances the first probe is rarely settled, and a schedule found by
    minimising is then all the run yields).

    Why: with the deadline a hard constraint every start has a tight window,
    and CP-SAT refutes a makespan just below the optimum, or finds a schedule
    at it, much faster than minimising from a loose upper bound, which
    searches among far worse schedules first. Measured on an 80-task
    memory-tight instance (backward set-times search, 2 workers): makespan
    293-297 refuted in 1-5 s each, a schedule of the optimum 298 found in
    10-23 s over five seeds, where minimising proved 298 only after 99 s.
    Probing one unit at a time, not bisecting: a deadline above the optimum
    leaves slack and was no faster to satisfy (299: 18 s, or not in 28 s).
    """
    lower = static_lower_bound(instance)
    best = hint
    hint_value = best_value = None if hint is None else schedule_makespan(list(hint.values()))
    spent_s = spent_dtime = 0.0
    probes = 0
    direction = "forward" if mirror is None else "backward"
    if best is None:
        # Refuting every deadline would never tell an infeasible instance:
        # first any schedule at all (within the horizon: work after the
        # last release).
        horizon = max((t.release_us for t in instance.graph.tasks), default=0) + sum(
            t.duration_us for t in instance.graph.tasks)
        first = _cp_sat(instance, replace(options, time_limit_s=options.time_limit_s
                                          * PROBING_SHARE), None, mirror, end_by=horizon)
        spent_s, spent_dtime, probes = first.solve_time_s, first.deterministic_time, 1
        if first.status == "INFEASIBLE":
            return replace(first, probes=1)
        if first.schedule:
            best = {item.task_id: item for item in first.schedule}
            best_value = first.makespan_us
    probing_s = options.time_limit_s * PROBING_SHARE
    while (best_value is None or lower < best_value) and spent_s < probing_s:
        probe = _cp_sat(instance, replace(options, time_limit_s=probing_s - spent_s), None,
                        mirror, end_by=lower)
        probes += 1
        spent_s += probe.solve_time_s
        spent_dtime += probe.deterministic_time
        if probe.status == "INFEASIBLE":
            lower += 1
        elif probe.schedule:
            best = {item.task_id: item for item in probe.schedule}
            best_value = probe.makespan_us
        else:
            break  # out of its share of the time: minimise with the rest
    if best is not None and lower >= best_value:
        schedule = in_start_order(best.values())
        result = SolveResult(
            status="OPTIMAL", objective="makespan", formulation=options.formulation,
            makespan_us=best_value, response_sum_us=response_sum(instance.graph, schedule),
            objective_value=best_value, bound=best_value, solve_time_s=0.0,
            schedule=schedule, direction=direction)
    else:
        rest = replace(options, time_limit_s=max(0.05, options.time_limit_s - spent_s))
        result = _cp_sat(instance, rest, best, mirror, at_least=lower)
    return replace(result, solve_time_s=result.solve_time_s + spent_s,
                   deterministic_time=result.deterministic_time + spent_dtime,
                   hint_used=hint is not None, probes=probes, hint_objective=hint_value)


def _cp_sat(instance: Instance, options: SolveOptions,
            hint: dict[str, ScheduledTask] | None, mirror: Instance | None,
            end_by: int | None = None, at_least: int = 0) -> SolveResult:
    """One CP-SAT solve: of `mirror` (the instance's, when searching
    backwards) or of the instance; with `end_by`, only a schedule ending by
    then is sought; `at_least`: a proven lower bound on the makespan."""
    release = instance.graph.tasks[0].release_us if instance.graph.tasks else 0
    set_times = _set_times(options, instance.num_tasks, backward=mirror is not None)
    if mirror is None:
        built = _build(instance, options, hint, end_by, at_least, set_times)
    else:  # the mirror starts at 0 where the instance starts at `release`
        mirror_hint = None if hint is None else {
            item.task_id: item for item in mirror_schedule(
                hint.values(), max(item.end_us for item in hint.values()))}
        built = _build(mirror, options, mirror_hint,
                       None if end_by is None else end_by - release,
                       max(0, at_least - release), set_times)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, options.time_limit_s)
    solver.parameters.num_search_workers = max(1, options.search_workers)
    solver.parameters.random_seed = options.seed
    solver.parameters.log_search_progress = options.log_search
    if set_times and options.search_workers >= 2:
        # See SolveOptions.search: on 2 workers only default_lp runs as a full
        # subsolver, following the decision strategy.
        solver.parameters.subsolvers.extend(["default_lp", "fixed"])
    if options.redundant:
        # Stronger cumulative reasoning: the memory cumulative is where tight
        # instances are decided (measured: 36 tasks at tightness 1.2 proven in
        # ~9 s instead of not at all in 20 s).
        solver.parameters.use_timetable_edge_finding_in_cumulative = True
        solver.parameters.use_overload_checker_in_cumulative = True
        solver.parameters.use_hard_precedences_in_cumulative = True
    status = solver.solve(built.model)
    name = solver.status_name(status)
    if name == "MODEL_INVALID":
        raise AssertionError(f"CP-SAT rejected the model: {built.model.validate()}")
    graph = instance.graph
    schedule: tuple[ScheduledTask, ...] = ()
    objective_value = makespan = responses = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts = {tid: solver.value(var) for tid, var in built.starts.items()}
        ends = {t.task_id: starts[t.task_id] + t.duration_us for t in graph.tasks}
        if mirror is not None:  # read the mirror's schedule backwards
            end_us = release + max(ends.values())
            starts, ends = ({tid: end_us - ends[tid] for tid in starts},
                            {tid: end_us - starts[tid] for tid in starts})
        if built.workers_x:
            worker = {tid: next(w for w, x in enumerate(row) if solver.boolean_value(x))
                      for tid, row in built.workers_x.items()}
        else:
            worker = assign_workers(((tid, starts[tid], ends[tid]) for tid in starts),
                                    instance.workers)
        schedule = in_start_order(
            ScheduledTask(tid, worker[tid], starts[tid], ends[tid]) for tid in starts)
        makespan = schedule_makespan(schedule)
        responses = response_sum(graph, schedule)
        objective_value = makespan if options.objective == "makespan" else responses
    if end_by is not None:
        bound = None  # a feasibility solve proves nothing about the optimum
        name = "FEASIBLE" if schedule else name
    elif status == cp_model.OPTIMAL:
        bound = objective_value
    elif status == cp_model.INFEASIBLE:
        bound = None
    else:
        bound = math.ceil(solver.best_objective_bound - 1e-6)
        if mirror is not None:
            bound += release
        if objective_value is not None:
            bound = min(bound, objective_value)
        elif hint is not None:
            # Time ran out before CP-SAT found anything: the hint is a checked
            # feasible schedule, so report it rather than nothing.
            schedule = in_start_order(hint.values())
            makespan = schedule_makespan(schedule)
            responses = response_sum(graph, schedule)
            objective_value = makespan if options.objective == "makespan" else responses
            bound = min(bound, objective_value)
            name = "FEASIBLE"
    return SolveResult(status=name, objective=options.objective,
                       formulation=options.formulation, makespan_us=makespan,
                       response_sum_us=responses, objective_value=objective_value,
                       bound=bound, solve_time_s=solver.wall_time, schedule=schedule,
                       hint_used=hint is not None,
                       deterministic_time=solver.deterministic_time,
                       hint_objective=None if hint is None else _objective_of(
                           options.objective, graph, list(hint.values())),
                       direction="forward" if mirror is None else "backward")


def _better_hint(instance: Instance, options: SolveOptions,
                 hint: dict[str, ScheduledTask] | None) -> dict[str, ScheduledTask] | None:
    """The given hint or the best list schedule, whichever has the lower objective.

    A list schedule is used only if masa.sched.checker finds nothing wrong with it
    (start_after is a rule of the heuristic only, so it is not checked): its
    objective becomes an upper bound, so it must be truly feasible.
    """
    from masa.sched.checker import check_schedule  # noqa: PLC0415 (only needed here)

    graph = instance.graph

    def value(schedule: Sequence[ScheduledTask]) -> int:
        return _objective_of(options.objective, graph, schedule)

    found = best_list_schedule(instance, value, seed=options.seed)
    if found is None:
        return hint
    schedule = found[1]
    if hint is not None and value(list(hint.values())) <= value(schedule):
        return hint
    unordered = replace(graph, start_after=())
    if check_schedule(unordered, list(schedule), workers=instance.workers,
                      memory_budget_bytes=instance.memory, check_durations=True):
        return hint
    return {item.task_id: item for item in schedule}


# ---------------------------------------------------------------- decomposition

def _release_segments(graph: TaskGraph) -> list[list[str]]:
    """Connected components (by precedence and locks), grouped by their release."""
    parent = {task.task_id: task.task_id for task in graph.tasks}

    def find(node: str) -> str:
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    def union(a: str, b: str) -> None:
        parent[find(a)] = find(b)

    for before, after in graph.precedence:
        union(before, after)
    for lock in graph.locks:
        for until in lock.until_tasks:
            union(lock.from_task, until)
    first_of_job: dict[int, str] = {}
    for task in graph.tasks:  # a job's response time must stay within one segment
        union(task.task_id, first_of_job.setdefault(task.job_id, task.task_id))
    components: dict[str, list[str]] = {}
    for task in graph.tasks:
        components.setdefault(find(task.task_id), []).append(task.task_id)
    by_release: dict[int, list[str]] = {}
    for ids in components.values():
        release = min(graph.by_id[t].release_us for t in ids)
        by_release.setdefault(release, []).extend(ids)
    return [by_release[release] for release in sorted(by_release)]


def _subinstance(instance: Instance, task_ids: Sequence[str]) -> Instance:
    keep = set(task_ids)
    graph = instance.graph
    sub = TaskGraph(
        tasks=tuple(t for t in graph.tasks if t.task_id in keep),
        precedence=tuple(p for p in graph.precedence if p[0] in keep),
        locks=tuple(lock for lock in graph.locks if lock.from_task in keep),
        start_after=tuple(p for p in graph.start_after if p[0] in keep and p[1] in keep))
    return replace(instance, graph=sub)


def solve_instance(instance: Instance, options: SolveOptions | None = None,
                   hint: Sequence[ScheduledTask] | None = None) -> SolveResult:
    """Solve an instance; `hint` must be a feasible schedule of it (e.g. checked
    with masa.sched.checker), since its objective is used as an upper bound.

    With `options.decompose`, tasks are split into release-time segments
    (components of precedence and locks, grouped by release). Segment i is
    solved alone; if its schedule ends by the next segment's earliest release,
    the segments cannot interact and each sub-instance, a relaxation of the
    whole, gives a valid bound; otherwise it is merged with the next one.
    """
    options = options or SolveOptions()
    if options.formulation not in FORMULATIONS:
        raise ValueError(f"formulation must be one of {FORMULATIONS}")
    if options.objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}")
    if options.search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES}")
    if options.direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}")
    if options.direction == "backward" and options.objective != "makespan":
        raise ValueError("direction 'backward' keeps the makespan, not response times: "
                         "use it with the makespan objective")
    hint_by_id = {item.task_id: item for item in hint} if hint else None
    if hint_by_id is not None and set(hint_by_id) != set(instance.graph.by_id):
        raise ValueError("the hint must schedule every task of the instance exactly once")
    segments = _release_segments(instance.graph) if options.decompose else []
    if len(segments) <= 1:
        return _solve_one(instance, options, hint_by_id)

    results: list[SolveResult] = []
    remaining_s = options.time_limit_s
    spent_s = spent_dtime = 0.0  # including attempts that were merged away
    pending: list[str] = []
    index = 0
    while index < len(segments):
        pending = pending + segments[index]
        index += 1
        last = index == len(segments)
        sub = _subinstance(instance, pending)
        sub_hint = {t: hint_by_id[t] for t in pending} if hint_by_id else None
        # Share the time between the segments still to solve.
        limit_s = remaining_s if last else remaining_s / (len(segments) - index + 1)
        sub_options = replace(options, time_limit_s=limit_s)
        next_release = None if last else min(
            instance.graph.by_id[t].release_us for t in segments[index])
        if not last and options.objective == "makespan":
            # Only the last segment decides the makespan: earlier ones need
            # just a schedule that ends before the next segment is released.
            result = _solve_one(sub, sub_options, sub_hint, end_by=next_release)
        else:
            result = _solve_one(sub, sub_options, sub_hint)
        remaining_s = max(0.05, remaining_s - result.solve_time_s)
        spent_s += result.solve_time_s
        spent_dtime += result.deterministic_time
        if result.status == "INFEASIBLE" and (last or options.objective == "response"):
            results.append(result)  # a relaxation of the whole is infeasible
            break
        if not last and result.status == "UNKNOWN":
            # Too hard to settle within its share: stop splitting and give the
            # rest of the time to everything that is left, in one model.
            pending = pending + [t for segment in segments[index:] for t in segment]
            index = len(segments) - 1
            segments = segments[:index] + [[]]
            continue
        if not last and (result.makespan_us is None or result.makespan_us > next_release):
            continue  # it would overlap the next segment: solve the two together
        results.append(result)
        pending = []
    combined = _combine(instance, options, results, hint is not None,
                        complete=results[-1].makespan_us is not None)
    return replace(combined, solve_time_s=spent_s, deterministic_time=spent_dtime)


def _combine(instance: Instance, options: SolveOptions, results: list[SolveResult],
             hint_used: bool, complete: bool) -> SolveResult:
    solve_time_s = sum(r.solve_time_s for r in results)
    deterministic_time = sum(r.deterministic_time for r in results)
    probes = sum(r.probes for r in results)
    last = results[-1]
    if last.status in ("INFEASIBLE", "UNKNOWN") or not complete:
        bound = None
        if last.status != "INFEASIBLE" and options.objective == "makespan":
            bound = last.bound
        status = last.status if last.status in ("INFEASIBLE", "UNKNOWN") else "UNKNOWN"
        return SolveResult(status=status, objective=options.objective,
                           formulation=options.formulation, makespan_us=None,
                           response_sum_us=None, objective_value=None, bound=bound,
                           solve_time_s=solve_time_s, segments=len(results),
                           hint_used=hint_used, deterministic_time=deterministic_time,
                           direction=last.direction, probes=probes)
    schedule = in_start_order(item for r in results for item in r.schedule)
    makespan = schedule_makespan(schedule)
    responses = response_sum(instance.graph, schedule)
    if options.objective == "makespan":
        # The last segment holds the latest end, and alone it is a relaxation.
        value = makespan
        bound = last.bound if last.bound is not None else 0
        status = "OPTIMAL" if last.proven else "FEASIBLE"
    else:
        value = responses
        bound = sum(r.bound for r in results if r.bound is not None)
        status = "OPTIMAL" if all(r.proven for r in results) else "FEASIBLE"
    return SolveResult(status=status, objective=options.objective,
                       formulation=options.formulation, makespan_us=makespan,
                       response_sum_us=responses, objective_value=value, bound=bound,
                       solve_time_s=solve_time_s, schedule=schedule, segments=len(results),
                       hint_used=hint_used, deterministic_time=deterministic_time,
                       direction=last.direction, probes=probes)
