"""The three dispatch policies: masa (Algorithm 1), bulk and deepeye.

Each policy is told by masa.sched.core when a task is added, becomes ready, starts
and ends, and is asked `pick(state)` for the next task to start on an idle
worker (or None). Policies are pure: heaps of plain tuples, no clocks or I/O.
Every decision costs O(log n) in ready tasks: heap entries are never re-sorted;
entries of tasks that stopped being ready are dropped lazily when they reach
the top (their state or ready epoch no longer matches).
"""

from __future__ import annotations

import heapq

from masa.sched.core import GroupStatus, SchedulerState, TaskInfo, TaskState
from masa.sched.taskgraph import TaskKind

# A ready-heap entry: (sort key..., task_id, ready_epoch); the last two are checked.
_Entry = tuple


_READY = TaskState.READY  # a plain global: enum attribute access is slow in 3.11


def _valid_top(state: SchedulerState, heap: list[_Entry]) -> _Entry | None:
    """The heap's smallest entry that is still a ready task, dropping stale ones."""
    tasks = state.tasks
    while heap:
        entry = heap[0]
        info = tasks.get(entry[-2])  # None: its group was forgotten (core.forget_group)
        if info is not None and info.state is _READY and info.ready_epoch == entry[-1]:
            return entry
        heapq.heappop(heap)
    return None


class MasaPolicy:
    """The paper's Algorithm 1 on per-layer tasks.

    Idle worker: ready EXEC tasks first (they free memory; UNLOAD counts as an
    EXEC), then LOADs; within a kind, ascending footprint (direct memory plus
    the locks the task opens), ties by Task.order then task id. A kind's heap
    is ordered by footprint, so when its smallest task does not fit in free
    memory none does. If nothing fits and no worker is busy, the smallest task
    of the preferred kind runs anyway (progress rule, recorded as over-commit).

    Two additions of ours, both on by default; `MasaPolicy(admission=False,
    headroom=False)` is the paper's rule (docs/scheduling.md has the figures):

    - admission: a LOAD that would start a network instance (no task of its
      group has started yet) runs only if the smallest ready LOAD of the
      already started networks would still fit next to it, and the progress
      rule prefers continuing a started network over starting one. Without
      it, under sustained load the smallest LOADs are always the first stages
      of newly arrived networks: they take every freed byte, the started
      networks' larger stages starve, and the progress rule keeps starting
      new networks whose held tensors pile up far above the budget.
    - headroom: a LOAD fits only if its footprint fits and, once the running
      LOADs and this one have ended and handed back their direct (transient)
      memory, free memory still holds the largest EXEC footprint among stages
      whose LOAD has started but whose EXEC has not (and its own stage's
      EXEC). Otherwise loads fill memory to the brim, the EXEC they exist for
      cannot start, and the progress rule over-commits. (Counting the
      transient memory as returned matters when loads peak far above what
      they keep: the first version kept room for the EXEC on top of the whole
      load peak and ran such loads one at a time.) Only the smallest LOAD is
      tested, which keeps a decision O(log n).
    """

    name = "masa"
    memory_aware = True

    def __init__(self, admission: bool = True, headroom: bool = True) -> None:
        self.admission = admission
        self.headroom = headroom
        self._pending_exec_needs: list[tuple[int, str]] = []  # (-footprint, exec id)
        self._running_load_direct_bytes = 0  # transient copies, returned when LOADs end
        self._execs: list[_Entry] = []
        self._loads: list[_Entry] = []  # LOADs of started networks (all LOADs without admission)
        self._fresh: list[_Entry] = []  # LOADs that would start a network

    def on_added(self, state: SchedulerState, info: TaskInfo) -> None:
        pass

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        task = info.task
        if task.kind is not TaskKind.LOAD:
            heap = self._execs
        elif self.admission and state.groups[task.group].started_count == 0:
            heap = self._fresh
        else:
            heap = self._loads
        heapq.heappush(heap, (info.footprint_bytes, task.order, task.task_id, info.ready_epoch))

    def on_started(self, state: SchedulerState, info: TaskInfo) -> None:
        if self.headroom and info.task.kind is TaskKind.LOAD:
            self._running_load_direct_bytes += info.task.memory_bytes
            for successor in info.successors:
                successor_info = state.tasks[successor]
                if successor_info.task.kind is not TaskKind.LOAD:
                    heapq.heappush(self._pending_exec_needs,
                                   (-successor_info.footprint_bytes, successor))

    def on_ended(self, state: SchedulerState, info: TaskInfo) -> None:
        if self.headroom and info.started and info.task.kind is TaskKind.LOAD:
            self._running_load_direct_bytes -= info.task.memory_bytes

    def _exec_need(self, state: SchedulerState) -> int:
        """Largest footprint of an EXEC whose LOAD has started but which has not started."""
        heap = self._pending_exec_needs
        while heap:
            negative_need, task_id = heap[0]
            info = state.tasks.get(task_id)
            if info is not None and info.state in (TaskState.PENDING, _READY):
                return -negative_need
            heapq.heappop(heap)
        return 0

    def _own_need(self, state: SchedulerState, task_id: str) -> int:
        """Largest footprint among the EXECs that directly wait for this LOAD."""
        tasks = state.tasks
        return max((tasks[successor].footprint_bytes for successor in tasks[task_id].successors
                    if tasks[successor].task.kind is not TaskKind.LOAD), default=0)

    def _fresh_top(self, state: SchedulerState) -> _Entry | None:
        """Smallest LOAD of a network not started yet (moving ones started meanwhile)."""
        while True:
            top = _valid_top(state, self._fresh)
            if top is None or state.groups[state.tasks[top[-2]].task.group].started_count == 0:
                return top
            heapq.heappush(self._loads, heapq.heappop(self._fresh))

    def pick(self, state: SchedulerState) -> str | None:
        free_bytes = state.ledger.free_bytes()
        exec_top = _valid_top(state, self._execs)
        if exec_top is not None and exec_top[0] <= free_bytes:
            return heapq.heappop(self._execs)[-2]
        # First, as it moves LOADs of networks started meanwhile into self._loads.
        fresh_top = self._fresh_top(state) if self.admission else None
        load_top = _valid_top(state, self._loads)
        load_fits = load_top is not None and self._load_fits(
            state, load_top[-2], load_top[0], free_bytes, 0)
        # Admission: a network starts only if the smallest waiting LOAD of the
        # started networks still fits next to it.
        fresh_fits = fresh_top is not None and self._load_fits(
            state, fresh_top[-2], fresh_top[0], free_bytes,
            0 if load_top is None else load_top[0])
        if load_fits and (not fresh_fits or load_top <= fresh_top):  # type: ignore[operator]
            return heapq.heappop(self._loads)[-2]
        if fresh_fits:
            return heapq.heappop(self._fresh)[-2]
        if state.running_count == 0:
            if exec_top is not None:
                return heapq.heappop(self._execs)[-2]
            if load_top is not None:
                return heapq.heappop(self._loads)[-2]
            if fresh_top is not None:
                return heapq.heappop(self._fresh)[-2]
        return None

    def _load_fits(self, state: SchedulerState, task_id: str, footprint: int,
                   free_bytes: int, reserve_bytes: int) -> bool:
        """Whether a LOAD may start now, with `reserve_bytes` kept free besides it."""
        if footprint + reserve_bytes > free_bytes:
            return False
        if not self.headroom:
            return True
        # The EXECs of loaded stages (and this LOAD's own) must still find room
        # once the running LOADs end and hand back their transient direct memory;
        # otherwise loads fill memory to the brim and no EXEC can ever start.
        need = max(self._exec_need(state), self._own_need(state, task_id))
        returning = self._running_load_direct_bytes + state.tasks[task_id].task.memory_bytes
        return free_bytes - footprint - reserve_bytes + returning >= need


class _Lane:
    """One network instance at a time, in arrival order: its loads, then its execs.

    `wait_for_loads`: a group's EXECs start only once all its LOADs in this
    lane have ended (bulk; DeepEye's conv lane). Memory-oblivious.
    """

    def __init__(self, wait_for_loads: bool) -> None:
        self.wait_for_loads = wait_for_loads
        self.running = 0
        self._groups: list[tuple[tuple[tuple[int, ...], str], str]] = []
        self._ready: dict[str, list[_Entry]] = {}
        self._open_tasks: dict[str, int] = {}
        self._open_loads: dict[str, int] = {}
        # A group enters the heap with its first ready task, so groups that have
        # not arrived yet are never scanned while the lane waits for arrivals.
        self._queued: set[str] = set()

    def added(self, state: SchedulerState, info: TaskInfo) -> None:
        group = info.task.group
        if group not in self._open_tasks:
            self._open_tasks[group] = 0
            self._open_loads[group] = 0
            self._ready[group] = []
        self._open_tasks[group] += 1
        if info.task.kind is TaskKind.LOAD:
            self._open_loads[group] += 1

    def ready(self, state: SchedulerState, info: TaskInfo) -> None:
        task = info.task
        group = task.group
        if group not in self._queued:
            self._queued.add(group)
            heapq.heappush(self._groups, (state.groups[group].key, group))
        phase = 0 if task.kind is TaskKind.LOAD else 1
        heapq.heappush(self._ready[group], (phase, task.order, task.task_id, info.ready_epoch))

    def ended(self, info: TaskInfo) -> None:
        group = info.task.group
        self._open_tasks[group] -= 1
        if info.task.kind is TaskKind.LOAD:
            self._open_loads[group] -= 1
        if info.started:
            self.running -= 1

    def _current_group(self, state: SchedulerState) -> str | None:
        skipped: list[tuple[tuple[tuple[int, ...], str], str]] = []
        found: str | None = None
        while self._groups:
            group = self._groups[0][1]
            if self._open_tasks[group] == 0:
                heapq.heappop(self._groups)
                del self._open_tasks[group], self._open_loads[group], self._ready[group]
                self._queued.discard(group)
                continue
            info = state.groups[group]
            if (group in state.gated or info.status is not GroupStatus.ACTIVE
                    or info.arrived_count == 0):
                # Gated, ending, or not yet arrived: the next network goes first.
                skipped.append(heapq.heappop(self._groups))
                continue
            found = group
            break
        for entry in skipped:
            heapq.heappush(self._groups, entry)
        return found

    def pick(self, state: SchedulerState) -> str | None:
        group = self._current_group(state)
        if group is None:
            return None
        heap = self._ready[group]
        top = _valid_top(state, heap)
        if top is None:
            return None
        if top[0] == 1 and self.wait_for_loads and self._open_loads[group] > 0:
            return None
        return heapq.heappop(heap)[-2]


class BulkPolicy:
    """One network instance at a time in arrival order (job, network): load all
    its stages (in parallel on k workers), then execute them. Memory-oblivious."""

    name = "bulk"
    memory_aware = False

    def __init__(self) -> None:
        self._lane = _Lane(wait_for_loads=True)

    def on_added(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane.added(state, info)

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane.ready(state, info)

    def on_started(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane.running += 1

    def on_ended(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane.ended(info)

    def pick(self, state: SchedulerState) -> str | None:
        return self._lane.pick(state)


class DeepEyePolicy:
    """DeepEye: convolution-stage execution interleaved with FC-stage loading.

    Two lanes, as the reference code's two pools: the conv lane (conv and
    other stages) and the fc lane; each runs one network instance at a time in
    arrival order, loads before execs. A network's first conv EXEC waits for
    its last conv LOAD; FC EXECs wait only for their data. An idle worker
    serves the lane with fewer running tasks (conv on a tie), so FC weights
    load while convolutions run. Memory-oblivious.
    """

    name = "deepeye"
    memory_aware = False

    def __init__(self) -> None:
        self._conv = _Lane(wait_for_loads=True)
        self._fc = _Lane(wait_for_loads=False)

    def _lane(self, info: TaskInfo) -> _Lane:
        return self._fc if info.task.layer_type == "fc" else self._conv

    def on_added(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane(info).added(state, info)

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane(info).ready(state, info)

    def on_started(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane(info).running += 1

    def on_ended(self, state: SchedulerState, info: TaskInfo) -> None:
        self._lane(info).ended(info)

    def pick(self, state: SchedulerState) -> str | None:
        first, second = (
            (self._fc, self._conv) if self._fc.running < self._conv.running
            else (self._conv, self._fc)
        )
        task_id = first.pick(state)
        return task_id if task_id is not None else second.pick(state)
