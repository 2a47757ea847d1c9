"""Simulated execution: the driver's loop on a virtual integer clock.

This module owns the virtual-time backend. Time is an integer number of
microseconds; a task runs for exactly its `duration_us`; waiting jumps the
clock to the next completion or release. Nothing here reads a clock or draws
a random number, so a run is a pure function of its inputs. The event loop
itself (arrivals, the core's side effects, context hooks, over-commits) is
masa.runtime.driver's, shared with the real executor.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from masa.runtime.driver import Completion, Driver, GroupEndHook, Recorder
from masa.sched.core import (
    GroupStatus,
    OverCommit,
    Policy,
    SchedulerState,
    gate_group,
    new_state,
)
from masa.sched.core import unfinished_task_ids as _unfinished
from masa.sched.policies import MasaPolicy
from masa.sched.taskgraph import Lock, ScheduledTask, Task, TaskGraph


class VirtualBackend:
    """Tasks take their profiled durations on a clock that jumps from event to event.

    failing_task_ids: tasks that fail when they end (fault injection for tests).
    """

    def __init__(self, failing_task_ids: Iterable[str] = ()) -> None:
        self.failing = frozenset(failing_task_ids)
        self.clock_us = 0
        self._finishes: list[tuple[int, int, str]] = []  # (end_us, sequence, task_id)
        self._sequence = 0
        self._running: set[str] = set()

    def now_us(self) -> int:
        return self.clock_us

    def start(self, task: Task, worker: int) -> None:
        self._sequence += 1
        self._running.add(task.task_id)
        heapq.heappush(self._finishes,
                       (self.clock_us + task.duration_us, self._sequence, task.task_id))

    def terminate(self, task_ids: Sequence[str]) -> list[Completion]:
        """Stopped tasks end at this very instant (their heap entries go stale)."""
        stopped = [task_id for task_id in task_ids if task_id in self._running]
        self._running.difference_update(stopped)
        return [Completion(task_id, self.clock_us, ok=False) for task_id in stopped]

    def wait(self, deadline_us: int | None) -> list[Completion]:
        finishes = self._finishes
        while finishes and finishes[0][2] not in self._running:
            heapq.heappop(finishes)  # stopped earlier
        upcoming = finishes[0][0] if finishes else None
        if upcoming is None and deadline_us is None:
            return []
        target = upcoming if deadline_us is None else (
            deadline_us if upcoming is None else min(upcoming, deadline_us))
        self.clock_us = max(self.clock_us, target)
        done: list[Completion] = []
        while finishes and finishes[0][0] <= self.clock_us:
            _, _, task_id = heapq.heappop(finishes)
            if task_id in self._running:
                self._running.discard(task_id)
                done.append(Completion(task_id, self.clock_us, ok=task_id not in self.failing))
        return done

    # Nothing to wake, measure, load or free in virtual time.
    def wake(self) -> None: ...
    def before_select(self, state: SchedulerState) -> None: ...
    def measured_bytes(self) -> int | None:
        return None
    def task_ended(self, task: Task, ok: bool, group_active: bool) -> None: ...
    def lock_released(self, lock: Lock, opener: Task) -> None: ...
    def group_ended(self, group: str, status: GroupStatus) -> None: ...
    def discard_outputs(self, group: str) -> None: ...
    def job_ended(self, job_id: int) -> None: ...
    def upstream_outputs(self, job_id: int) -> Mapping[str, Mapping[str, Any]]:
        return {}


@dataclass(frozen=True)
class SimulationResult:
    """One simulated run. Times in virtual microseconds from 0."""

    schedule: tuple[ScheduledTask, ...]  # every task: ran (worker >= 0) or cancelled (-1)
    makespan_us: int  # latest end of any task that ran
    peak_reserved_bytes: int
    over_commits: tuple[OverCommit, ...]  # with time_us
    memory_timeline: tuple[tuple[int, int], ...]  # (time_us, reserved_bytes) at each change
    dispatch_order: tuple[str, ...]
    group_status: dict[str, str]  # group -> done / failed / cancelled (/ active if stuck)
    group_reason: dict[str, str]
    final_reserved_bytes: int  # 0 unless tasks are stuck (a group gated forever)
    unfinished: tuple[str, ...]  # tasks that never ended (gated forever)


def simulate_graph(
    graph: TaskGraph,
    *,
    policy: Policy | None = None,
    workers: int,
    memory_budget_bytes: int,
    on_group_end: GroupEndHook | None = None,
    gated_groups: Iterable[str] = (),
    failing_task_ids: Iterable[str] = (),
    driver_options: Mapping[str, Any] | None = None,
) -> SimulationResult:
    """Run `graph` under a fresh `policy` object (default masa) on `workers` virtual
    workers; deterministic.

    gated_groups: groups whose tasks wait until a hook opens them (CA-wait).
    failing_task_ids: tasks that fail when they end (fault injection for tests).
    driver_options: further Driver arguments (e.g. a context controller).
    """
    state = new_state(workers, memory_budget_bytes, policy or MasaPolicy())
    for group in gated_groups:
        gate_group(state, group)
    recorder = Recorder()
    driver = Driver(state, VirtualBackend(failing_task_ids), on_group_end=on_group_end,
                    observers=[recorder], **dict(driver_options or {}))
    # The run allocates hundreds of thousands of long-lived, acyclic objects
    # (task records, heap entries); the cyclic collector would rescan them
    # again and again (2-3x the run time at 60,000 tasks) and has nothing
    # to find: it is paused for the run and restored afterwards.
    collector_was_enabled = gc.isenabled()
    gc.disable()
    try:
        driver.add(graph)
        driver.run()
    finally:
        if collector_was_enabled:
            gc.enable()
    ran_ends = [entry.end_us for entry in recorder.schedule if entry.worker >= 0]
    return SimulationResult(
        schedule=tuple(recorder.schedule),
        makespan_us=max(ran_ends, default=0),
        peak_reserved_bytes=state.ledger.peak_reserved_bytes,
        over_commits=tuple(recorder.over_commits),
        memory_timeline=tuple((t, reserved) for t, reserved, _ in recorder.memory_timeline),
        dispatch_order=tuple(recorder.dispatch_order),
        group_status={name: info.status.value for name, info in state.groups.items()},
        group_reason={name: info.reason for name, info in state.groups.items() if info.reason},
        final_reserved_bytes=state.ledger.reserved_bytes,
        unfinished=tuple(_unfinished(state)),
    )
