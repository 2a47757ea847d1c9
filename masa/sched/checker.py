"""The schedule checker: does a schedule respect its task graph, workers and memory?

Used on simulator schedules, real executor traces and solver schedules alike.
A schedule is a sequence of `ScheduledTask`; entries with worker >= 0 ran over
[start_us, end_us); entries with worker == -1 are tasks cancelled before they
started (recorded at the cancellation instant; they only end locks).

Memory follows masa.sched.taskgraph: a task that ran holds `memory_bytes` over
[start, end); a lock whose opening task ran holds its bytes from that task's
start until the latest end among the opening task and the lock's until-tasks
present in the schedule. At every instant the memory held must be within the
budget, not counting what belongs to tasks listed in `allowed_over_commits`
(their direct memory and the locks they open): a recorded progress-rule (or
memory-oblivious) dispatch may exceed the budget, nothing else may.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from masa.sched.taskgraph import ScheduledTask, TaskGraph

_MAX_PROBLEMS_PER_KIND = 10


def _lock_intervals(
    graph: TaskGraph, entries: dict[str, ScheduledTask]
) -> list[tuple[int, int, int, str]]:
    """(start_us, end_us, memory_bytes, from_task) of every lock whose opener ran."""
    intervals: list[tuple[int, int, int, str]] = []
    for lock in graph.locks:
        opener = entries.get(lock.from_task)
        if opener is None or opener.worker < 0:
            continue
        end_us = opener.end_us
        for task_id in lock.until_tasks:
            until = entries.get(task_id)
            if until is not None:
                end_us = max(end_us, until.end_us)
        intervals.append((opener.start_us, end_us, lock.memory_bytes, lock.from_task))
    return intervals


def memory_intervals(
    graph: TaskGraph, schedule: Sequence[ScheduledTask]
) -> list[tuple[int, int, int, str]]:
    """Every held piece of memory as (start_us, end_us, memory_bytes, owning task id)."""
    entries = {entry.task_id: entry for entry in schedule if entry.task_id in graph.by_id}
    intervals = [
        (entry.start_us, entry.end_us, graph.by_id[entry.task_id].memory_bytes, entry.task_id)
        for entry in entries.values() if entry.worker >= 0
    ]
    return intervals + _lock_intervals(graph, entries)


def memory_profile(
    graph: TaskGraph, schedule: Sequence[ScheduledTask], *, excluded: Iterable[str] = ()
) -> list[tuple[int, int]]:
    """Memory held over time as (time_us, bytes) steps, one per instant where it changes.

    `excluded`: task ids whose direct memory and opened locks are left out.
    """
    skip = set(excluded)
    deltas: dict[int, int] = {}
    for start_us, end_us, memory_bytes, owner in memory_intervals(graph, schedule):
        if owner in skip or end_us <= start_us or memory_bytes == 0:
            continue
        deltas[start_us] = deltas.get(start_us, 0) + memory_bytes
        deltas[end_us] = deltas.get(end_us, 0) - memory_bytes
    profile: list[tuple[int, int]] = []
    held_bytes = 0
    for time_us in sorted(deltas):
        if deltas[time_us] == 0:
            continue
        held_bytes += deltas[time_us]
        profile.append((time_us, held_bytes))
    return profile


class _Problems:
    """Violations as readable lines, at most _MAX_PROBLEMS_PER_KIND of each kind."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts: dict[str, int] = {}

    def add(self, kind: str, message: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        if self.counts[kind] <= _MAX_PROBLEMS_PER_KIND:
            self.lines.append(message)

    def summary(self) -> list[str]:
        return self.lines + [f"... and {count - _MAX_PROBLEMS_PER_KIND} more {kind} problems"
                             for kind, count in self.counts.items()
                             if count > _MAX_PROBLEMS_PER_KIND]


def _known_entries(graph: TaskGraph, schedule: Sequence[ScheduledTask],
                   problems: _Problems) -> dict[str, ScheduledTask]:
    entries: dict[str, ScheduledTask] = {}
    for entry in schedule:
        if entry.task_id not in graph.by_id:
            problems.add("unknown", f"unknown task {entry.task_id!r} in the schedule")
            continue
        if entry.task_id in entries:
            problems.add("duplicate", f"task {entry.task_id!r} appears twice")
            continue
        entries[entry.task_id] = entry
        if entry.end_us < entry.start_us:
            problems.add("interval", f"task {entry.task_id!r} ends at {entry.end_us} us "
                                     f"before it starts at {entry.start_us} us")
    return entries


def _check_times(graph: TaskGraph, ran: Mapping[str, ScheduledTask], check_durations: bool,
                 problems: _Problems) -> None:
    for task_id, entry in ran.items():
        task = graph.by_id[task_id]
        if entry.start_us < task.release_us:
            problems.add("release", f"task {task_id!r} starts at {entry.start_us} us before "
                                    f"its release at {task.release_us} us")
        if check_durations and entry.status == "done" and \
                entry.end_us - entry.start_us != task.duration_us:
            problems.add("duration", f"task {task_id!r} ran {entry.end_us - entry.start_us} "
                                     f"us, expected {task.duration_us} us")


def _check_order(graph: TaskGraph, entries: Mapping[str, ScheduledTask],
                 ran: Mapping[str, ScheduledTask], problems: _Problems) -> None:
    for before, after in graph.precedence:
        if after not in ran:
            continue
        pred = entries.get(before)
        if pred is None or pred.worker < 0 or pred.status != "done":
            problems.add("precedence",
                         f"precedence: {after!r} ran but {before!r} did not complete")
        elif pred.end_us > ran[after].start_us:
            problems.add("precedence", f"precedence: {after!r} starts at "
                                       f"{ran[after].start_us} us before {before!r} ends at "
                                       f"{pred.end_us} us")
    for before, after in graph.start_after:
        if after not in ran:
            continue
        started = ran.get(before)
        if started is None:
            problems.add("start_after",
                         f"start_after: {after!r} ran but {before!r} never started")
        elif started.start_us > ran[after].start_us:
            problems.add("start_after", f"start_after: {after!r} starts at "
                                        f"{ran[after].start_us} us before {before!r} starts "
                                        f"at {started.start_us} us")


def _check_workers(ran: Mapping[str, ScheduledTask], workers: int, problems: _Problems) -> None:
    by_worker: dict[int, list[ScheduledTask]] = {}
    for entry in ran.values():
        if entry.worker >= workers:
            problems.add("worker", f"task {entry.task_id!r} runs on worker {entry.worker}, "
                                   f"but there are only {workers} workers")
        by_worker.setdefault(entry.worker, []).append(entry)
    for worker, worker_entries in sorted(by_worker.items()):
        worker_entries.sort(key=lambda e: (e.start_us, e.end_us))
        for first, second in zip(worker_entries, worker_entries[1:], strict=False):
            if second.start_us < first.end_us:
                problems.add("overlap", f"worker {worker} runs {first.task_id!r} and "
                                        f"{second.task_id!r} at once at {second.start_us} us")
    busy_deltas: dict[int, int] = {}
    for entry in ran.values():
        if entry.end_us > entry.start_us:
            busy_deltas[entry.start_us] = busy_deltas.get(entry.start_us, 0) + 1
            busy_deltas[entry.end_us] = busy_deltas.get(entry.end_us, 0) - 1
    busy = 0
    for time_us in sorted(busy_deltas):
        busy += busy_deltas[time_us]
        if busy > workers:
            problems.add("workers", f"{busy} tasks run at once at {time_us} us, "
                                    f"more than {workers} workers")


def _check_memory(graph: TaskGraph, entries: Sequence[ScheduledTask],
                  ran: Mapping[str, ScheduledTask], budget_bytes: int,
                  allowed: set[str], problems: _Problems) -> None:
    """Memory within the budget, plus the excess of each valid progress-rule dispatch."""
    profile = memory_profile(graph, entries)
    allowance: dict[int, int] = {}
    for task_id in sorted(allowed & ran.keys()):
        start_us = ran[task_id].start_us
        others = sorted(e.task_id for e in ran.values() if e.task_id != task_id
                        and e.start_us <= start_us < e.end_us)
        if others:
            problems.add("progress", f"over-commit of {task_id!r} at {start_us} us while "
                                     f"{others[0]!r} runs: not the progress rule")
            continue
        held_bytes = next((held for time_us, held in reversed(profile)
                           if time_us <= start_us), 0)
        excess_bytes = max(0, held_bytes - budget_bytes)
        end_us = max((end for _, end, _, owner in memory_intervals(graph, entries)
                      if owner == task_id), default=start_us)
        allowance[start_us] = allowance.get(start_us, 0) + excess_bytes
        allowance[end_us] = allowance.get(end_us, 0) - excess_bytes
    held_at = dict(profile)
    held_bytes = allowed_bytes = 0
    for time_us in sorted(held_at.keys() | allowance.keys()):
        held_bytes = held_at.get(time_us, held_bytes)
        allowed_bytes += allowance.get(time_us, 0)
        if held_bytes > budget_bytes + allowed_bytes:
            problems.add("memory", f"memory {held_bytes} bytes at {time_us} us exceeds the "
                                   f"budget of {budget_bytes} bytes (no recorded "
                                   "over-commit)" if not allowed_bytes else
                                   f"budget of {budget_bytes} bytes plus {allowed_bytes} "
                                   "bytes of progress-rule over-commit")


def check_schedule(
    graph: TaskGraph,
    schedule: Sequence[ScheduledTask],
    *,
    workers: int,
    memory_budget_bytes: int | None,
    allowed_over_commits: Iterable[str] = (),
    require_all_tasks: bool = True,
    check_durations: bool = False,
) -> list[str]:
    """Every violation found, as one readable line each ([] means the schedule is valid).

    Checks: known and unique task ids, end >= start, release times, precedence
    (finish-to-start, predecessor done), start_after (start-to-start), worker
    ids in range, no worker running two tasks at once, at most `workers` tasks
    at once, memory within the budget; optionally that every task appears
    and that done tasks took exactly `duration_us`.

    allowed_over_commits: tasks recorded as progress-rule dispatches. Each must
    have started while no other task ran, and only what it took above the
    budget is allowed, while its own memory (direct or locked) is held.
    memory_budget_bytes=None skips the memory checks (memory-oblivious policies).
    """
    problems = _Problems()
    entries = _known_entries(graph, schedule, problems)
    if require_all_tasks:
        for task in graph.tasks:
            if task.task_id not in entries:
                problems.add("missing", f"task {task.task_id!r} is missing from the schedule")
    ran = {task_id: entry for task_id, entry in entries.items() if entry.worker >= 0}
    _check_times(graph, ran, check_durations, problems)
    _check_order(graph, entries, ran, problems)
    _check_workers(ran, workers, problems)
    if memory_budget_bytes is not None:
        _check_memory(graph, list(entries.values()), ran, memory_budget_bytes,
                      set(allowed_over_commits), problems)
    return problems.summary()
