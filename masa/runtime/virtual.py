"""The discrete-event simulator: the pure core driven on a virtual integer clock.

This module owns simulated execution. Time is an integer number of
microseconds; a task becomes available at its `release_us`, runs for exactly
its `duration_us` and ends; at every instant the simulator first ends the tasks
due, then releases the tasks due, then asks the core (and thus the same policy
code as the real executor) for dispatches. Nothing here reads a clock or draws
a random number, so a run is a pure function of its inputs.

Context-aware execution (issue 4) plugs in through `on_group_end`: called
whenever a network instance's tasks have all ended (done, failed or
cancelled), with a `SimulationControl` that may gate, open or cancel other
groups at that virtual instant. Conditions themselves live elsewhere.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from masa.sched.core import (
    GroupStatus,
    OverCommit,
    Policy,
    SchedulerState,
    add_tasks,
    arrive,
    cancel_group,
    fail_group,
    finish,
    gate_group,
    new_state,
    open_group,
    select,
    take_events,
    unfinished_task_ids,
)
from masa.sched.taskgraph import ScheduledTask, TaskGraph


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


class SimulationControl:
    """What an `on_group_end` hook may do, at the current virtual time."""

    def __init__(self, simulation: _Simulation) -> None:
        self._simulation = simulation

    @property
    def now_us(self) -> int:
        return self._simulation.now_us

    @property
    def state(self) -> SchedulerState:
        """Read it; change it only through the methods below."""
        return self._simulation.state

    def gate(self, group: str) -> None:
        gate_group(self._simulation.state, group)

    def open(self, group: str) -> None:
        open_group(self._simulation.state, group)

    def cancel(self, group: str, reason: str) -> None:
        """Skip or abort a group now: its running tasks stop at this instant."""
        self._simulation.stop(cancel_group(self._simulation.state, group, reason))

    def fail(self, group: str, reason: str) -> None:
        self._simulation.stop(fail_group(self._simulation.state, group, reason))


GroupEndHook = Callable[[SimulationControl, str, GroupStatus], None]


class _Simulation:
    def __init__(self, graph: TaskGraph, state: SchedulerState,
                 on_group_end: GroupEndHook | None, failing: frozenset[str]) -> None:
        self.graph = graph
        self.state = state
        self.on_group_end = on_group_end
        self.failing = failing
        self.control = SimulationControl(self)
        self.now_us = 0
        self.finishes: list[tuple[int, int, str]] = []  # (end_us, sequence, task_id)
        self.sequence = 0
        self.running: dict[str, tuple[int, int]] = {}  # task_id -> (worker, start_us)
        self.schedule: list[ScheduledTask] = []
        self.dispatch_order: list[str] = []
        self.timeline: list[tuple[int, int]] = [(0, 0)]
        self.over_commits: list[OverCommit] = []

    def run(self) -> None:
        state = self.state
        releases: dict[int, list[str]] = {}
        for task in self.graph.tasks:
            releases.setdefault(task.release_us, []).append(task.task_id)
        release_times = sorted(releases)
        # The run allocates hundreds of thousands of long-lived, acyclic objects
        # (task records, heap entries); the cyclic collector would rescan them
        # again and again (2-3x the run time at 60,000 tasks) and has nothing
        # to find: it is paused for the run and restored afterwards.
        collector_was_enabled = gc.isenabled()
        gc.disable()
        try:
            add_tasks(state, self.graph, arrived=False)
            self.drain()
            self._loop(releases, release_times)
        finally:
            if collector_was_enabled:
                gc.enable()

    def _loop(self, releases: dict[int, list[str]], release_times: list[int]) -> None:
        state = self.state
        next_release = 0
        while True:
            while self.finishes and self.finishes[0][0] <= self.now_us:
                _, _, task_id = heapq.heappop(self.finishes)
                if task_id in self.running:  # else it was stopped earlier
                    self.end(task_id, ok=task_id not in self.failing)
            while next_release < len(release_times) and \
                    release_times[next_release] <= self.now_us:
                arrive(state, releases[release_times[next_release]])
                next_release += 1
            self.drain()
            for dispatch in select(state):
                task = self.graph.by_id[dispatch.task_id]
                self.running[dispatch.task_id] = (dispatch.worker, self.now_us)
                self.dispatch_order.append(dispatch.task_id)
                self.sequence += 1
                heapq.heappush(self.finishes,
                               (self.now_us + task.duration_us, self.sequence, task.task_id))
            while len(self.over_commits) < len(state.over_commits):
                over_commit = state.over_commits[len(self.over_commits)]
                self.over_commits.append(replace(over_commit, time_us=self.now_us))
            self.record_memory()
            upcoming = [self.finishes[0][0]] if self.finishes else []
            if next_release < len(release_times):
                upcoming.append(release_times[next_release])
            if not upcoming:
                break
            self.now_us = max(self.now_us, min(upcoming))

    def record_memory(self) -> None:
        reserved_bytes = self.state.ledger.reserved_bytes
        if reserved_bytes != self.timeline[-1][1]:
            self.timeline.append((self.now_us, reserved_bytes))

    def end(self, task_id: str, ok: bool) -> None:
        worker, start_us = self.running.pop(task_id)
        finished = finish(self.state, task_id, ok)
        self.schedule.append(
            ScheduledTask(task_id, worker, start_us, self.now_us, finished.status.value)
        )
        self.record_cancelled(finished.newly_cancelled)
        self.stop(finished.to_terminate)
        self.notify(finished.ended_groups)

    def stop(self, task_ids: Iterable[str]) -> None:
        """Terminate running tasks now (their groups ended); then report side effects."""
        for task_id in task_ids:
            if task_id in self.running:
                self.end(task_id, ok=False)
        self.drain()

    def drain(self) -> None:
        pending = self.state.events
        if not (pending.newly_cancelled or pending.ended_groups or pending.released_locks
                or pending.released_bytes):
            return
        events = take_events(self.state)
        self.record_cancelled(events.newly_cancelled)
        self.notify(events.ended_groups)

    def record_cancelled(self, task_ids: Iterable[str]) -> None:
        for task_id in task_ids:
            self.schedule.append(ScheduledTask(task_id, -1, self.now_us, self.now_us,
                                               "cancelled"))

    def notify(self, ended_groups: Iterable[tuple[str, GroupStatus]]) -> None:
        if self.on_group_end is None:
            return
        for group, status in ended_groups:
            self.on_group_end(self.control, group, status)


def simulate_graph(
    graph: TaskGraph,
    *,
    policy: str | Policy = "masa",
    workers: int,
    memory_budget_bytes: int,
    on_group_end: GroupEndHook | None = None,
    gated_groups: Iterable[str] = (),
    failing_task_ids: Iterable[str] = (),
) -> SimulationResult:
    """Run `graph` under `policy` on `workers` virtual workers; deterministic.

    gated_groups: groups whose tasks wait until a hook opens them (CA-wait).
    failing_task_ids: tasks that fail when they end (fault injection for tests).
    """
    state = new_state(workers, memory_budget_bytes, policy)
    for group in gated_groups:
        gate_group(state, group)
    simulation = _Simulation(graph, state, on_group_end, frozenset(failing_task_ids))
    simulation.run()
    ran_ends = [entry.end_us for entry in simulation.schedule if entry.worker >= 0]
    return SimulationResult(
        schedule=tuple(simulation.schedule),
        makespan_us=max(ran_ends, default=0),
        peak_reserved_bytes=state.ledger.peak_reserved_bytes,
        over_commits=tuple(simulation.over_commits),
        memory_timeline=tuple(simulation.timeline),
        dispatch_order=tuple(simulation.dispatch_order),
        group_status={name: info.status.value for name, info in state.groups.items()},
        group_reason={name: info.reason for name, info in state.groups.items() if info.reason},
        final_reserved_bytes=state.ledger.reserved_bytes,
        unfinished=tuple(unfinished_task_ids(state)),
    )
