"""Finished schedules as the solver reports them: workers, order, objectives, a serial one.

Owns what the CP-SAT model (solver.model), the search around it
(solver.search), the list schedules (solver.list_schedule) and the command
share about a schedule once its start times are known: concrete workers by
interval colouring (the model only bounds how many tasks run at once), the
order a schedule is reported in, the two objectives (makespan, sum of job
response times), and the one-task-at-a-time schedule that serves as the last
fallback hint. Pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from masa.common.graphs import topological_order
from masa.sched.taskgraph import ScheduledTask, TaskGraph


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


def in_start_order(schedule: Iterable[ScheduledTask]) -> tuple[ScheduledTask, ...]:
    """A schedule as the solver reports it: by start, then worker, then task."""
    return tuple(sorted(schedule, key=lambda item: (item.start_us, item.worker, item.task_id)))


def with_workers(starts: dict[str, int], ends: dict[str, int], workers: int
                 ) -> tuple[ScheduledTask, ...]:
    """Start and end times as a schedule in start order, workers by interval colouring."""
    worker = assign_workers(((t, starts[t], ends[t]) for t in starts), workers)
    return in_start_order(ScheduledTask(t, worker[t], starts[t], ends[t]) for t in starts)


def schedule_makespan(schedule: Iterable[ScheduledTask]) -> int:
    return max((item.end_us for item in schedule), default=0)


def job_releases(graph: TaskGraph) -> dict[int, int]:
    """Each job's release: the earliest release of its tasks."""
    releases: dict[int, int] = {}
    for task in graph.tasks:
        releases[task.job_id] = min(releases.get(task.job_id, task.release_us), task.release_us)
    return releases


def response_sum(graph: TaskGraph, schedule: Iterable[ScheduledTask]) -> int:
    """Sum over jobs of (latest end of its tasks - its release): the online objective."""
    ends: dict[int, int] = {}
    for item in schedule:
        job = graph.by_id[item.task_id].job_id
        ends[job] = max(ends.get(job, 0), item.end_us)
    releases = job_releases(graph)
    return sum(end - releases[job] for job, end in ends.items())


def objective_value(objective: str, graph: TaskGraph, schedule: Sequence[ScheduledTask]) -> int:
    """The schedule's value for `objective` ("makespan" or "response")."""
    if objective == "makespan":
        return schedule_makespan(schedule)
    return response_sum(graph, schedule)


def serial_schedule(graph: TaskGraph) -> tuple[ScheduledTask, ...]:
    """One task at a time on worker 0, in topological order (of precedence and,
    where they allow one, start_after), ties by (order, position).

    A fallback hint when the heuristic's schedule is not within the budget.
    Running one task at a time holds no more than a parallel schedule that
    starts tasks in the same order, so it is feasible whenever such a schedule
    is; with networks one after another it usually fits (check it before use).
    """
    position = {task.task_id: index for index, task in enumerate(graph.tasks)}
    # topological_order breaks ties by input position: list the tasks by tie key.
    by_key = sorted(position, key=lambda t: (graph.by_id[t].order, position[t]))
    # start_after pairs are kept too where they can be (one task at a time, a
    # task listed first also starts first).
    order = (topological_order(by_key, graph.precedence + graph.start_after)
             or topological_order(by_key, graph.precedence))
    if order is None:
        raise ValueError("serial_schedule needs acyclic precedence")
    time_us = 0
    schedule: list[ScheduledTask] = []
    for task_id in order:
        task = graph.by_id[task_id]
        start = max(time_us, task.release_us)
        time_us = start + task.duration_us
        schedule.append(ScheduledTask(task_id, 0, start, time_us))
    return tuple(schedule)
