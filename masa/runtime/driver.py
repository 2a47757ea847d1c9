"""The one event loop over the pure core, for simulated and real time alike.

This module owns the order of everything that happens in a run: tasks arrive
at their release time, the core dispatches ready tasks to idle workers, a
backend carries them out and reports their completions, the core's side
effects (released locks, cancelled tasks, ended network instances) are handed
to the backend and to context-aware execution, and ended jobs are forgotten.
As dask's `get_async` serves its synchronous and threaded schedulers, and
SimPy's `Environment` and `RealtimeEnvironment` share one loop, the simulator
(masa.runtime.virtual), the real executor (masa.runtime.threads), masa-plan's
decoding and a live service all run this loop; only the backend differs:

- `VirtualBackend`: an integer clock that jumps to the next completion; a
  task runs exactly its profiled `duration_us`.
- `ThreadBackend`: the wall clock; worker threads run ONNX Runtime sessions
  and `wait` blocks on their completion queue.

At one instant the loop first ends the tasks that completed, then lets the
tasks due arrive, then asks the core for dispatches: the order of a
simulation is a pure function of its inputs.

`submit` adds a job's task graph while the loop runs (from another thread
too), `call_soon` runs a control action (a client's cancel) on the loop's
thread, and `run(live=...)` keeps the loop waiting while idle (masa.serve).
With `forget_ended`, a job's tasks, locks and groups leave the scheduler state
once the job has ended and been reported to the observers, so a long-running
driver's state holds only unfinished jobs.
"""

from __future__ import annotations

import heapq
import logging
import queue
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from masa.common.columns import IntRows
from masa.sched.context import ContextController
from masa.sched.core import (
    CoreEvents,
    GroupStatus,
    KeptChange,
    OverCommit,
    SchedulerState,
    add_tasks,
    arrive,
    cancel_group,
    evict_kept,
    fail_group,
    finish,
    forget_group,
    gate_group,
    open_group,
    select,
    take_events,
)
from masa.sched.taskgraph import Lock, ScheduledTask, ScheduleLog, Task, TaskGraph

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Completion:
    """A task that ended on a backend: when, whether it succeeded, and why not."""

    task_id: str
    end_us: int
    ok: bool = True
    error: str | None = None  # one line, for reports
    detail: str | None = None  # the full traceback of a failure, for the debug log


class Backend(Protocol):
    """Carries out dispatches and reports completions; owns the clock."""

    def now_us(self) -> int: ...
    def start(self, task: Task, worker: int) -> None: ...
    def terminate(self, task_ids: Sequence[str]) -> list[Completion]:
        """Stop running tasks; the completions that take effect now (the rest come later)."""
        ...
    def wait(self, deadline_us: int | None) -> list[Completion]:
        """Until a completion or the deadline (None: no deadline); [] when nothing can come."""
        ...
    def wake(self) -> None: ...
    def before_select(self, state: SchedulerState) -> None: ...
    def measured_bytes(self) -> int | None: ...
    def task_ended(self, task: Task, ok: bool, group_active: bool) -> None: ...
    def lock_released(self, lock: Lock, opener: Task) -> None: ...
    # Kept loaded stages (SchedulerState.kept): a LOAD lock released with its stage
    # kept under (network, stage_id); a kept stage to unload; a LOAD about to start
    # that takes the kept stage (it does nothing and ends at once).
    def keep_loaded(self, lock: Lock, opener: Task) -> None: ...
    def evict_loaded(self, stage: tuple[str, str]) -> None: ...
    def reuse_loaded(self, task: Task) -> None: ...
    def group_ended(self, group: str, status: GroupStatus) -> None: ...
    def discard_outputs(self, group: str) -> None: ...
    def job_ended(self, job_id: int) -> None: ...
    def upstream_outputs(self, job_id: int) -> Mapping[str, Mapping[str, Any]]: ...


class Observer:
    """What a run reports as it goes; every method is optional (no-op here)."""

    def dispatched(self, task_id: str, worker: int, now_us: int) -> None: ...
    def ended(self, record: ScheduledTask) -> None: ...
    def over_commit(self, over_commit: OverCommit) -> None: ...
    def memory(self, now_us: int, reserved_bytes: int, measured_bytes: int | None) -> None: ...
    def group_ended(self, group: str, status: GroupStatus, now_us: int) -> None: ...
    def job_ended(self, job_id: int, now_us: int) -> None: ...


@dataclass
class Recorder(Observer):
    """Keeps the whole trace of a run: every task, dispatch, over-commit and memory change.

    Memory is recorded at each change of the reserved bytes, or at every
    sample when measured memory is given (it changes without the ledger).
    `compact()` keeps the schedule and the memory timeline in columns
    (ScheduleLog, IntRows): a real run's records are part of the memory it
    measures (about 200 bytes a task with them, 480 with objects).
    """

    schedule: list[ScheduledTask] | ScheduleLog = field(default_factory=list)
    dispatch_order: list[str] = field(default_factory=list)
    over_commits: list[OverCommit] = field(default_factory=list)
    memory_timeline: list[tuple[int, int, int | None]] | IntRows = field(
        default_factory=lambda: [(0, 0, None)])
    group_status: dict[str, GroupStatus] = field(default_factory=dict)

    @classmethod
    def compact(cls) -> Recorder:
        return cls(schedule=ScheduleLog(), memory_timeline=IntRows(3, [(0, 0, None)]))

    def dispatched(self, task_id: str, worker: int, now_us: int) -> None:
        self.dispatch_order.append(task_id)

    def ended(self, record: ScheduledTask) -> None:
        self.schedule.append(record)

    def over_commit(self, over_commit: OverCommit) -> None:
        self.over_commits.append(over_commit)

    def memory(self, now_us: int, reserved_bytes: int, measured_bytes: int | None) -> None:
        if measured_bytes is not None or reserved_bytes != self.memory_timeline[-1][1]:
            self.memory_timeline.append((now_us, reserved_bytes, measured_bytes))

    def group_ended(self, group: str, status: GroupStatus, now_us: int) -> None:
        self.group_status[group] = status


GroupEndHook = Callable[["Driver", str, GroupStatus], None]


class Driver:
    """One run of the core on a backend: add or submit graphs, then `run`.

    The driver is also the control that context-aware execution and group
    hooks use (`gate`, `open`, `cancel`, `fail`, `now_us`, `state`).
    """

    def __init__(self, state: SchedulerState, backend: Backend, *,
                 context: ContextController | None = None,
                 on_group_end: GroupEndHook | None = None,
                 observers: Sequence[Observer] = (),
                 forget_ended: bool = False) -> None:
        self.state = state
        self.backend = backend
        self.context = context
        self.on_group_end = on_group_end
        self.observers = list(observers)
        self.forget_ended = forget_ended
        self.errors: dict[str, str] = {}  # group -> first error, one line
        self.error_details: dict[str, str] = {}  # group -> that error's traceback
        self._releases: list[tuple[int, int, list[str]]] = []  # (release_us, sequence, ids)
        self._sequence = 0
        self._running: dict[str, tuple[int, int]] = {}  # task_id -> (worker, start_us)
        self._inbox: queue.SimpleQueue[TaskGraph] = queue.SimpleQueue()
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._job_groups: dict[int, set[str]] = {}  # job -> its groups not yet ended
        self._job_networks: dict[int, list[str]] = {}  # job -> networks, in graph order
        self._registered_jobs: set[int] = set()  # jobs told to the context controller
        self._ended_job_groups: dict[int, list[str]] = {}  # job -> its ended groups
        self._unforgotten: list[str] = []  # ended groups forget_group refused (cross-job edges)

    # ---------------------------------------------------------------- control API

    @property
    def now_us(self) -> int:
        return self.backend.now_us()

    def gate(self, group: str) -> None:
        gate_group(self.state, group)

    def open(self, group: str) -> None:
        open_group(self.state, group)

    def cancel(self, group: str, reason: str) -> None:
        """Skip or abort a group now: its running tasks are stopped."""
        self._stop(cancel_group(self.state, group, reason))

    def fail(self, group: str, reason: str) -> None:
        self._stop(fail_group(self.state, group, reason))

    # ---------------------------------------------------------------- adding work

    def add(self, graph: TaskGraph) -> None:
        """Add a graph now (from the loop's thread); each task arrives at its release_us."""
        add_tasks(self.state, graph, arrived=False)
        by_release: dict[int, list[str]] = {}
        for task in graph.tasks:
            by_release.setdefault(task.release_us, []).append(task.task_id)
            groups = self._job_groups.setdefault(task.job_id, set())
            if task.group not in groups:
                groups.add(task.group)
                networks = self._job_networks.setdefault(task.job_id, [])
                if task.network not in networks:
                    networks.append(task.network)
        for release_us, task_ids in by_release.items():
            self._sequence += 1
            heapq.heappush(self._releases, (release_us, self._sequence, task_ids))
        self._drain()

    def submit(self, graph: TaskGraph) -> None:
        """Add a graph from any thread; the loop takes it at its next step."""
        self._inbox.put(graph)
        self.backend.wake()

    def call_soon(self, action: Callable[[], None]) -> None:
        """Run `action` on the loop's thread at its next step, after the graphs submitted
        before it (from any thread): how a service cancels a job or reads the state."""
        self._calls.put(action)
        self.backend.wake()

    @property
    def running_task_ids(self) -> list[str]:
        return list(self._running)

    # ---------------------------------------------------------------- the loop

    def run(self, until_us: int | None = None, *,
            live: Callable[[], bool] | None = None) -> None:
        """Run until nothing runs and nothing more can arrive, or the clock reaches until_us.

        With `live`, run while live() is true, idle or not (a service: idle, the
        backend's `wait` blocks until a submit, a call or a `wake`), and return
        at the first step where it is false, even with tasks running.
        """
        while True:
            self._take_inbox()
            self._arrive_due()
            self._drain()
            self._dispatch()
            next_release = self._releases[0][0] if self._releases else None
            if live is not None:
                if not live():
                    return
            elif (not self._running and next_release is None and self._inbox.empty()
                  and self._calls.empty()):
                evict_kept(self.state)  # the run is over: every reserved byte returns
                self._drain()
                return
            deadline = next_release
            if until_us is not None:
                if self.backend.now_us() >= until_us:
                    return
                deadline = until_us if deadline is None else min(deadline, until_us)
            for completion in self.backend.wait(deadline):
                self._end(completion)

    def _take_inbox(self) -> None:
        while not self._inbox.empty():
            try:
                graph = self._inbox.get_nowait()
            except queue.Empty:
                return
            self.add(graph)
        while not self._calls.empty():
            try:
                action = self._calls.get_nowait()
            except queue.Empty:
                return
            action()

    def _arrive_due(self) -> None:
        now_us = self.backend.now_us()
        while self._releases and self._releases[0][0] <= now_us:
            _, _, task_ids = heapq.heappop(self._releases)
            if self.context is not None:
                self._register_jobs(task_ids)
            arrive(self.state, task_ids)

    def _register_jobs(self, task_ids: Iterable[str]) -> None:
        """Tell context-aware execution about a job when its first task arrives;
        CA-wait gates its downstream networks before any of their tasks is ready."""
        assert self.context is not None
        tasks = self.state.tasks
        for task_id in task_ids:
            job_id = tasks[task_id].task.job_id
            if job_id in self._registered_jobs:
                continue
            self._registered_jobs.add(job_id)
            for group in self.context.register_job(job_id, self._job_networks.get(job_id, ())):
                self.gate(group)

    def _dispatch(self) -> None:
        state = self.state
        backend = self.backend
        backend.before_select(state)
        now_us = backend.now_us()
        tasks = state.tasks
        dispatches = select(state)
        if state.events.kept_changes:
            # Kept stages evicted to make room are unloaded before any task starts:
            # on a device whose cap is the budget, a LOAD that began reading while
            # they were still locked in memory found no room (an OOM kill, measured).
            self._drain()
        for dispatch in dispatches:
            task = tasks[dispatch.task_id].task
            self._running[dispatch.task_id] = (dispatch.worker, now_us)
            for observer in self.observers:
                observer.dispatched(dispatch.task_id, dispatch.worker, now_us)
            if dispatch.reuses_kept:
                backend.reuse_loaded(task)
            backend.start(task, dispatch.worker)
        if state.over_commits:
            # Taken out of the state, so a long-running one does not grow.
            over_commits, state.over_commits = state.over_commits, []
            for over_commit in over_commits:
                self._report_over_commit(replace(over_commit, time_us=now_us))
        measured = backend.measured_bytes()
        for observer in self.observers:
            observer.memory(now_us, state.ledger.reserved_bytes, measured)

    def _report_over_commit(self, over_commit: OverCommit) -> None:
        for observer in self.observers:
            observer.over_commit(over_commit)

    def _end(self, completion: Completion) -> None:
        """A task completed: tell the core, then carry out everything that follows."""
        worker, start_us = self._running.pop(completion.task_id)
        info = self.state.tasks[completion.task_id]
        task = info.task
        group_active = self.state.groups[task.group].status is GroupStatus.ACTIVE
        if not completion.ok and group_active and completion.error is not None:
            if task.group not in self.errors:
                self.errors[task.group] = f"{task.task_id}: {completion.error}"
                if completion.detail:
                    self.error_details[task.group] = completion.detail
            log.error("task %s failed: %s", task.task_id, completion.error)
            if completion.detail:
                log.debug("task %s failed:\n%s", task.task_id, completion.detail)
        self.backend.task_ended(task, completion.ok, group_active)
        finished = finish(self.state, task.task_id, completion.ok)
        record = ScheduledTask(task.task_id, worker, start_us, completion.end_us,
                               finished.status.value)
        for observer in self.observers:
            observer.ended(record)
        # Most completions change nothing else: skip the calls (the simulator's hot path).
        if finished.newly_cancelled:
            self._record_cancelled(finished.newly_cancelled)
        # Locks first: stopping running siblings may end (and forget) the whole job,
        # after which the tasks these locks name are gone.
        if finished.released_locks or finished.kept_changes:
            self._apply(finished.released_locks, (), finished.kept_changes)
        if finished.to_terminate:
            self._stop(finished.to_terminate)
        if finished.ended_groups:
            self._apply((), finished.ended_groups)

    def _stop(self, task_ids: Sequence[str]) -> None:
        """Terminate running tasks (their groups ended); then handle the side effects."""
        running = [task_id for task_id in task_ids if task_id in self._running]
        if running:
            for completion in self.backend.terminate(running):
                if completion.task_id in self._running:
                    self._end(completion)
        self._drain()

    def _drain(self) -> None:
        """Carry out the core's pending side effects until there are none."""
        while True:
            if not self.state.events.any():
                return
            events: CoreEvents = take_events(self.state)
            self._record_cancelled(events.newly_cancelled)
            self._apply(events.released_locks, events.ended_groups, events.kept_changes)

    def _record_cancelled(self, task_ids: Iterable[str]) -> None:
        now_us = self.backend.now_us()
        for task_id in task_ids:
            record = ScheduledTask(task_id, -1, now_us, now_us, "cancelled")
            for observer in self.observers:
                observer.ended(record)

    def _apply(self, released_locks: Iterable[Lock],
               ended_groups: Iterable[tuple[str, GroupStatus]],
               kept_changes: Iterable[KeptChange] = ()) -> None:
        tasks = self.state.tasks
        for lock in released_locks:
            self.backend.lock_released(lock, tasks[lock.from_task].task)
        for stage, kept_lock in kept_changes:  # in order: a stage may go and come back
            if kept_lock is None:
                self.backend.evict_loaded(stage)
            else:
                self.backend.keep_loaded(kept_lock, tasks[kept_lock.from_task].task)
        for group, status in ended_groups:
            self._group_ended(group, status)

    def _group_ended(self, group: str, status: GroupStatus) -> None:
        now_us = self.backend.now_us()
        self.backend.group_ended(group, status)
        job_id = self.state.tasks[self.state.groups[group].task_ids[0]].task.job_id
        if self.context is not None:
            outputs = self.backend.upstream_outputs(job_id)
            for doomed in self.context.group_ended(group, status, self, outputs):
                self.backend.discard_outputs(doomed)  # an aborted network's results go
        if self.on_group_end is not None:
            self.on_group_end(self, group, status)
        for observer in self.observers:
            observer.group_ended(group, status, now_us)
        open_groups = self._job_groups.get(job_id)
        if open_groups is None:
            return
        open_groups.discard(group)
        self._ended_job_groups.setdefault(job_id, []).append(group)
        if not open_groups:
            self._job_ended(job_id, now_us)

    def _job_ended(self, job_id: int, now_us: int) -> None:
        """Every network of the job ended: report it, then let it go."""
        del self._job_groups[job_id]
        self._job_networks.pop(job_id, None)
        self._registered_jobs.discard(job_id)
        ended = self._ended_job_groups.pop(job_id)
        log.debug("job %d ended at %d us", job_id, now_us)
        self.backend.job_ended(job_id)
        for observer in self.observers:
            observer.job_ended(job_id, now_us)
        if not self.forget_ended:
            return
        if self.context is not None:
            self.context.forget_job(job_id)
        retry, self._unforgotten = self._unforgotten, []
        for group in retry + ended:
            if group in self.state.groups and not forget_group(self.state, group):
                self._unforgotten.append(group)

