"""How the solver searches: solve_instance and the strategies around single CP-SAT solves.

Owns everything that runs solver.model more than once or on a transformed
instance, and the time each call gets:

- decomposition by release time: independent segments solved one by one;
- hints: the best of the given schedule and the solver's own list schedules
  (solver.list_schedule), checked by masa.sched.checker;
- direction: on memory-tight instances, solving the time-reversed mirror
  (solver.instance.mirrored) and reading its schedule backwards, because
  their idle time sits at the end of the schedule;
- lower-bound probing for the makespan: deadlines from the static bound up,
  before minimising.

The measurements behind each choice are in docs/bench-solver.md. Both time
limits of SolveOptions (wall and deterministic) are totals shared by all the
CP-SAT calls of one solve_instance. Solve times are CP-SAT's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from masa.sched.checker import check_schedule
from masa.sched.taskgraph import ScheduledTask, TaskGraph
from solver.analysis import static_lower_bound
from solver.instance import (
    Instance,
    mirror_schedule,
    mirrored,
    model_start_after,
    without_load_order,
)
from solver.list_schedule import best_list_schedule
from solver.model import ModelSolution, solve_model
from solver.options import SolveOptions, SolveResult, validate_options
from solver.schedules import (
    in_start_order,
    objective_value,
    response_sum,
    schedule_makespan,
    with_workers,
)

SET_TIMES_MAX_TASKS = 64  # forward search; measured: see benchmarks/bench_solver.py scaling
# Up to this size the defaults aim at a proof (backward set-times search and
# lower-bound probing); above it at a good schedule (forward, CP-SAT's
# portfolio, no probing). Measured on memory-tight instances, 60 s, 2 cores:
# 80 tasks proven only that way; at 120 tasks gap 7.7% against 10.2%; at 168
# and 240 tasks 12.3% and 15.9% against 9.5% and 13.4% (no probe settles,
# and backward search found worse schedules).
PROOF_MAX_TASKS = 128
PROBING_SHARE = 2 / 3  # of the time limits, at most, for lower-bound probes
# Time every later CP-SAT call gets at least, even when an earlier one used up
# the limit: a solve always ends with an answer (the hint, at worst).
_MIN_TIME = 0.05

_Hint = dict[str, ScheduledTask]


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
    validate_options(options)
    hint_by_id = {item.task_id: item for item in hint} if hint else None
    if hint_by_id is not None and set(hint_by_id) != set(instance.graph.by_id):
        raise ValueError("the hint must schedule every task of the instance exactly once")
    segments = _release_segments(instance.graph) if options.decompose else []
    if len(segments) <= 1:
        return _solve_one(instance, options, hint_by_id)
    return _solve_segments(instance, options, hint_by_id, segments)


def _budget(options: SolveOptions, time_limit_s: float, deterministic_time: float
            ) -> SolveOptions:
    return replace(options, time_limit_s=time_limit_s,
                   max_deterministic_time=deterministic_time)


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
    for before, after in model_start_after(graph):
        union(before, after)
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


def _solve_segments(instance: Instance, options: SolveOptions, hint: _Hint | None,
                    segments: list[list[str]]) -> SolveResult:
    """Segment by segment, merging a segment into the next when they may interact."""
    results: list[SolveResult] = []
    remaining_s, remaining_dtime = options.time_limit_s, options.max_deterministic_time
    spent_s = spent_dtime = 0.0  # including attempts that were merged away
    pending: list[str] = []
    index = 0
    while index < len(segments):
        pending = pending + segments[index]
        index += 1
        last = index == len(segments)
        # Share the time between the segments still to solve.
        share = 1 if last else len(segments) - index + 1
        next_release = None if last else min(
            instance.graph.by_id[t].release_us for t in segments[index])
        result = _solve_one(
            _subinstance(instance, pending),
            _budget(options, remaining_s / share, remaining_dtime / share),
            {t: hint[t] for t in pending} if hint else None,
            # Only the last segment decides the makespan: earlier ones need
            # just a schedule that ends before the next segment is released.
            end_by=next_release if options.objective == "makespan" else None)
        remaining_s = max(_MIN_TIME, remaining_s - result.solve_time_s)
        remaining_dtime = max(_MIN_TIME, remaining_dtime - result.deterministic_time)
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


# ---------------------------------------------------------------- one instance

def _solve_one(instance: Instance, options: SolveOptions, hint: _Hint | None,
               end_by: int | None = None) -> SolveResult:
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


def _better_hint(instance: Instance, options: SolveOptions, hint: _Hint | None
                 ) -> _Hint | None:
    """The given hint or the best list schedule, whichever has the lower objective.

    A list schedule is used only if masa.sched.checker finds nothing wrong with it
    (the LOAD order rule is the heuristic's only, so it is not checked): its
    objective becomes an upper bound, so it must be truly feasible.
    """
    graph = instance.graph

    def value(schedule: Sequence[ScheduledTask]) -> int:
        return objective_value(options.objective, graph, schedule)

    found = best_list_schedule(instance, value, seed=options.seed)
    if found is None:
        return hint
    schedule = found[1]
    if hint is not None and value(list(hint.values())) <= value(schedule):
        return hint
    unordered = without_load_order(graph)
    if check_schedule(unordered, list(schedule), workers=instance.workers,
                      memory_budget_bytes=instance.memory, check_durations=True):
        return hint
    return {item.task_id: item for item in schedule}


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


# ---------------------------------------------------------------- probing

def _probe_then_minimise(instance: Instance, options: SolveOptions, hint: _Hint | None,
                         mirror: Instance | None) -> SolveResult:
    """Lower-bound probing: ask CP-SAT for any schedule ending by T, for T =
    `static_lower_bound`, T + 1, ...; then minimise with the time left.

    A probe proven infeasible raises the bound to T + 1; a probe that finds a
    schedule has found an optimal one (every shorter makespan was refuted).
    Probing gets PROBING_SHARE of the time limits; a probe that runs out of it
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
    probing = _Probing(instance, options, mirror)
    best = hint
    if best is None:
        # Refuting every deadline would never tell an infeasible instance:
        # first any schedule at all (within the horizon: work after the
        # last release).
        first = probing.first_schedule()
        if first.status == "INFEASIBLE":
            return replace(first, probes=1)
        if first.schedule:
            best = {item.task_id: item for item in first.schedule}
    best = probing.probe_up_to(best)
    best_value = None if best is None else schedule_makespan(best.values())
    if best is not None and probing.lower >= best_value:
        schedule = in_start_order(best.values())
        result = SolveResult(
            status="OPTIMAL", objective="makespan", formulation=options.formulation,
            makespan_us=best_value, response_sum_us=response_sum(instance.graph, schedule),
            objective_value=best_value, bound=best_value, solve_time_s=0.0,
            schedule=schedule, direction="forward" if mirror is None else "backward")
    else:
        rest = _budget(options, max(_MIN_TIME, options.time_limit_s - probing.spent_s),
                       max(_MIN_TIME, options.max_deterministic_time - probing.spent_dtime))
        result = _cp_sat(instance, rest, best, mirror, at_least=probing.lower)
    return replace(result, solve_time_s=result.solve_time_s + probing.spent_s,
                   deterministic_time=result.deterministic_time + probing.spent_dtime,
                   hint_used=hint is not None, probes=probing.probes,
                   hint_objective=None if hint is None else schedule_makespan(hint.values()))


class _Probing:
    """The probes of one instance: the proven lower bound and the time they took."""

    def __init__(self, instance: Instance, options: SolveOptions,
                 mirror: Instance | None) -> None:
        self.instance = instance
        self.options = options
        self.mirror = mirror
        self.lower = static_lower_bound(instance)
        self.probing_s = options.time_limit_s * PROBING_SHARE
        self.probing_dtime = options.max_deterministic_time * PROBING_SHARE
        self.spent_s = self.spent_dtime = 0.0
        self.probes = 0

    def _run(self, options: SolveOptions, end_by: int) -> SolveResult:
        result = _cp_sat(self.instance, options, None, self.mirror, end_by=end_by)
        self.probes += 1
        self.spent_s += result.solve_time_s
        self.spent_dtime += result.deterministic_time
        return result

    def first_schedule(self) -> SolveResult:
        """Any schedule within the horizon (the work after the last release)."""
        tasks = self.instance.graph.tasks
        horizon = max((t.release_us for t in tasks), default=0) + sum(
            t.duration_us for t in tasks)
        return self._run(_budget(self.options, self.probing_s, self.probing_dtime), horizon)

    def probe_up_to(self, best: _Hint | None) -> _Hint | None:
        """Probe deadlines from `lower` up until one is met or the share runs out;
        returns the best schedule known (a met deadline's, else `best`)."""
        best_value = None if best is None else schedule_makespan(best.values())
        while ((best_value is None or self.lower < best_value)
               and self.spent_s < self.probing_s and self.spent_dtime < self.probing_dtime):
            probe = self._run(_budget(self.options, self.probing_s - self.spent_s,
                                      self.probing_dtime - self.spent_dtime), self.lower)
            if probe.status == "INFEASIBLE":
                self.lower += 1
            elif probe.schedule:
                best = {item.task_id: item for item in probe.schedule}
                best_value = probe.makespan_us
            else:
                break  # out of its share of the time: minimise with the rest
        return best


# ---------------------------------------------------------------- one CP-SAT call

def _cp_sat(instance: Instance, options: SolveOptions, hint: _Hint | None,
            mirror: Instance | None, end_by: int | None = None, at_least: int = 0
            ) -> SolveResult:
    """One CP-SAT solve: of `mirror` (the instance's, when searching
    backwards) or of the instance; with `end_by`, only a schedule ending by
    then is sought; `at_least`: a proven lower bound on the makespan."""
    graph = instance.graph
    set_times = _set_times(options, instance.num_tasks, backward=mirror is not None)
    # The mirror starts at 0 where the instance starts at `release`.
    release = graph.tasks[0].release_us if mirror is not None and graph.tasks else 0
    if mirror is None:
        found = solve_model(instance, options, hint, deadline=end_by, at_least=at_least,
                            set_times=set_times)
    else:
        mirror_hint = None if hint is None else {
            item.task_id: item for item in mirror_schedule(
                hint.values(), schedule_makespan(hint.values()))}
        found = solve_model(mirror, options, mirror_hint,
                            deadline=None if end_by is None else end_by - release,
                            at_least=max(0, at_least - release), set_times=set_times)
    schedule = _schedule(instance, found, mirror is not None, release)
    return _result(instance, options, found, schedule, hint, end_by, release,
                   "forward" if mirror is None else "backward")


def _schedule(instance: Instance, found: ModelSolution, backward: bool, release: int
              ) -> tuple[ScheduledTask, ...] | None:
    """The solution as a schedule of the instance (read backwards from a mirror),
    None without one."""
    if found.starts is None:
        return None
    starts = found.starts
    ends = {t.task_id: starts[t.task_id] + t.duration_us for t in instance.graph.tasks}
    if backward:
        end_us = release + max(ends.values(), default=0)
        starts, ends = ({tid: end_us - ends[tid] for tid in starts},
                        {tid: end_us - starts[tid] for tid in starts})
    if not found.workers:
        return with_workers(starts, ends, instance.workers)
    return in_start_order(ScheduledTask(tid, found.workers[tid], starts[tid], ends[tid])
                          for tid in starts)


def _result(instance: Instance, options: SolveOptions, found: ModelSolution,
            schedule: tuple[ScheduledTask, ...] | None, hint: _Hint | None,
            end_by: int | None, release: int, direction: str) -> SolveResult:
    """A SolveResult from one CP-SAT call, its status and proven bound."""
    graph = instance.graph
    name = found.status
    bound: int | None = None
    if end_by is not None:
        # A feasibility solve proves nothing about the optimum.
        name = "FEASIBLE" if schedule else name
    elif name == "OPTIMAL":
        bound = objective_value(options.objective, graph, schedule or ())
    elif name != "INFEASIBLE":
        bound = math.ceil(found.objective_bound - 1e-6) + release
        if schedule is not None:
            bound = min(bound, objective_value(options.objective, graph, schedule))
        elif hint is not None:
            # Time ran out before CP-SAT found anything: the hint is a checked
            # feasible schedule, so report it rather than nothing.
            schedule = in_start_order(hint.values())
            bound = min(bound, objective_value(options.objective, graph, schedule))
            name = "FEASIBLE"
    value = None if schedule is None else objective_value(options.objective, graph, schedule)
    return SolveResult(
        status=name, objective=options.objective, formulation=options.formulation,
        makespan_us=None if schedule is None else schedule_makespan(schedule),
        response_sum_us=None if schedule is None else response_sum(graph, schedule),
        objective_value=value, bound=bound, solve_time_s=found.wall_time_s,
        schedule=schedule or (),
        hint_used=hint is not None, deterministic_time=found.deterministic_time,
        hint_objective=None if hint is None else objective_value(
            options.objective, graph, list(hint.values())),
        direction=direction)
