"""The scheduling problem as plain, frozen data: tasks, precedences and memory locks.

Everything that schedules speaks this one language: the pure policies, the
simulator, the real executor (through masa.sched.jobs, which builds graphs from jobs
and manifests) and the CP-SAT solver (whose instance JSON is this graph
serialised, see docs/instance-format.md).

Memory model (the paper's direct and locked memory):
- a task holds `memory_bytes` while it runs: [start, end);
- a `Lock` holds `memory_bytes` from the start of its `from_task` until every
  task in `until_tasks` has ended. For a stage in a job: LOAD(s) locks the
  stage's resident bytes until EXEC(s) ends (then it is unloaded); EXEC(s)
  locks its output tensors until every consuming EXEC has ended.
So at any instant: sum(running tasks' memory) + sum(active locks) <= budget.

Precedence (a, b): b may start only after a has ended. `start_after` (a, b):
b may start only after a has started (used for the LOAD order rule, see
masa.sched.jobs); solvers may ignore it, it only restricts the heuristic.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import overload

from masa.common.columns import IntRows
from masa.common.graphs import find_cycle


class TaskKind(Enum):
    LOAD = "load"
    EXEC = "exec"
    UNLOAD = "unload"


@dataclass(frozen=True)
class Task:
    task_id: str
    kind: TaskKind
    duration_us: int  # profiled or estimated; the simulator and solver use it
    memory_bytes: int  # direct memory, held while the task runs
    release_us: int = 0  # earliest start (the job's arrival)
    # Deterministic tie-break: (job arrival index, network index, stage index).
    order: tuple[int, ...] = ()
    # Which network instance the task belongs to ("j3/facenet"): the unit that
    # context-aware execution skips or aborts, and Bulk runs one at a time.
    group: str = ""
    job_id: int = 0
    network: str = ""
    stage_id: str = ""
    layer_type: str = "other"  # conv / fc / other: DeepEye interleaves by it


@dataclass(frozen=True)
class Lock:
    lock_id: str
    from_task: str
    until_tasks: tuple[str, ...]  # held until all of these have ended
    memory_bytes: int


@dataclass(frozen=True)
class TaskGraph:
    tasks: tuple[Task, ...]
    precedence: tuple[tuple[str, str], ...] = ()
    locks: tuple[Lock, ...] = ()
    start_after: tuple[tuple[str, str], ...] = ()
    by_id: dict[str, Task] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {task.task_id: task for task in self.tasks})

    def task(self, task_id: str) -> Task:
        return self.by_id[task_id]

    def merged(self, other: TaskGraph) -> TaskGraph:
        """This graph plus another (a new job's tasks) with disjoint ids."""
        return TaskGraph(
            tasks=self.tasks + other.tasks,
            precedence=self.precedence + other.precedence,
            locks=self.locks + other.locks,
            start_after=self.start_after + other.start_after,
        )

    def footprint_bytes(self, task_id: str) -> int:
        """Memory a task needs to start: its direct memory plus the locks it opens."""
        task = self.by_id[task_id]
        return task.memory_bytes + sum(
            lock.memory_bytes for lock in self.locks if lock.from_task == task_id
        )


@dataclass(frozen=True)
class ScheduledTask:
    """One task as it actually ran (or was planned): the common trace record."""

    task_id: str
    worker: int
    start_us: int
    end_us: int
    status: str = "done"  # done / failed / cancelled


class ScheduleLog(Sequence[ScheduledTask]):
    """Ended tasks as a real run records them: a sequence of ScheduledTask held in
    columns (the graph's own task-id strings, int64 times: about 40 bytes a task,
    where a ScheduledTask with its two large ints takes about 230;
    masa.common.columns). Read it as a list; records are built on reading."""

    __slots__ = ("_task_ids", "_statuses", "_numbers")

    def __init__(self, records: Iterable[ScheduledTask] = ()) -> None:
        self._task_ids: list[str] = []
        self._statuses: list[str] = []
        self._numbers = IntRows(3)  # worker, start_us, end_us
        for record in records:
            self.append(record)

    def append(self, record: ScheduledTask) -> None:
        self._task_ids.append(record.task_id)
        self._statuses.append(sys.intern(record.status))
        self._numbers.append((record.worker, record.start_us, record.end_us))

    def __len__(self) -> int:
        return len(self._task_ids)

    @overload
    def __getitem__(self, index: int) -> ScheduledTask: ...
    @overload
    def __getitem__(self, index: slice) -> list[ScheduledTask]: ...

    def __getitem__(self, index: int | slice) -> ScheduledTask | list[ScheduledTask]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        worker, start_us, end_us = self._numbers[index]
        return ScheduledTask(self._task_ids[index], worker, start_us, end_us,  # type: ignore[arg-type]
                             self._statuses[index])

    def __iter__(self) -> Iterator[ScheduledTask]:
        for task_id, status, (worker, start_us, end_us) in zip(
                self._task_ids, self._statuses, self._numbers, strict=True):
            yield ScheduledTask(task_id, worker, start_us, end_us, status)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ScheduleLog | list | tuple):
            return len(self) == len(other) and all(
                a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __sizeof__(self) -> int:  # the task-id strings are the graph's: not counted
        return (object.__sizeof__(self) + sys.getsizeof(self._task_ids)
                + sys.getsizeof(self._statuses) + sys.getsizeof(self._numbers))


def validate_graph(graph: TaskGraph) -> list[str]:
    """Structural problems: unknown ids, duplicate ids, negative numbers, cycles."""
    problems: list[str] = []
    ids = [task.task_id for task in graph.tasks]
    if len(ids) != len(set(ids)):
        seen: set[str] = set()
        problems += [f"duplicate task id {i!r}" for i in ids if i in seen or seen.add(i)]
    known = set(ids)
    for task in graph.tasks:
        if task.duration_us < 0 or task.memory_bytes < 0 or task.release_us < 0:
            problems.append(f"task {task.task_id!r}: duration, memory and release must be >= 0")
    for kind, pairs in (("precedence", graph.precedence), ("start_after", graph.start_after)):
        for before, after in pairs:
            for task_id in (before, after):
                if task_id not in known:
                    problems.append(f"{kind} names unknown task {task_id!r}")
    for lock in graph.locks:
        for task_id in (lock.from_task, *lock.until_tasks):
            if task_id not in known:
                problems.append(f"lock {lock.lock_id!r} names unknown task {task_id!r}")
        if lock.memory_bytes < 0:
            problems.append(f"lock {lock.lock_id!r}: memory must be >= 0")
    if not problems:
        cycle = find_cycle(ids, graph.precedence)
        if cycle:
            problems.append("cyclic precedence: " + " -> ".join(cycle))
    return problems
