"""The pure scheduling core: task states, the memory ledger and the scheduler state.

This module owns the online scheduling state as plain data and the functions
that change it. It has no threads, clocks, files or ONNX: the real executor and
the discrete-event simulator (masa.runtime.virtual) drive the same functions and
record times themselves. The decision rules live in masa.sched.policies.

Protocol for an executor (see docs/scheduling.md):

    state = new_state(workers=2, memory_budget_bytes=512 * 2**20, policy=MasaPolicy())
    add_tasks(state, graph)              # a job arrives
    for dispatch in select(state):       # marks RUNNING, reserves memory
        ...start dispatch.task_id on worker dispatch.worker...
    finished = finish(state, task_id, ok=True)   # when it ends
        # finished.released_locks: unload LOAD sessions / drop EXEC outputs
        # finished.to_terminate: running tasks of a failed group to stop
    ...select again...

Memory: a task reserves its footprint (direct memory plus the memory of every
lock it opens) when dispatched; its direct memory returns when it ends; a lock
returns when its opening task and every task it waits for have ended (done,
failed or cancelled). The ledger never goes negative and only exceeds the
budget through a dispatch flagged `over_commit`, which is recorded in
`state.over_commits` (the progress rule of `masa` when nothing else runs, any
dispatch of a memory-oblivious policy, or a "violation" otherwise).

Kept loaded stages (`keep_loaded_bytes`, off unless the policy asks): a LOAD lock
released at its stage's last EXEC may stay reserved as a kept stage, counted free
(`MemoryLedger.kept_bytes`) and evicted, least recently kept first, by a dispatch
that needs the memory; a later LOAD of the stage takes it (`Dispatch.reuses_kept`).
When the stages the jobs load do not all fit, only the pinned ones are kept
(masa.sched.keeping), and they are not free memory to the policy (`_keeps`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Set
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from masa.common.errors import UserError
from masa.common.graphs import find_cycle, topological_order
from masa.sched.keeping import Stage, StageUse, age_uses, pinned_stages
from masa.sched.taskgraph import Lock, Task, TaskGraph, TaskKind


class TaskState(Enum):
    PENDING = "pending"  # not arrived, waiting for predecessors, or its group is gated
    READY = "ready"  # may be dispatched now; known to the policy
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # never ran, or stopped because its group ended

    # Members are singletons: identity hashing is correct and, unlike Enum's
    # Python-level __hash__, costs nothing in the simulator's hot loop.
    __hash__ = object.__hash__


# The one transition table. READY -> PENDING happens when a group is gated.
TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.READY, TaskState.CANCELLED}),
    TaskState.READY: frozenset({TaskState.RUNNING, TaskState.PENDING, TaskState.CANCELLED}),
    TaskState.RUNNING: frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED}),
    TaskState.DONE: frozenset(),
    TaskState.FAILED: frozenset(),
    TaskState.CANCELLED: frozenset(),
}
TERMINAL = frozenset({TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED})


class GroupStatus(Enum):
    """Outcome of a network instance (Task.group)."""

    ACTIVE = "active"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"  # skipped or aborted by context-aware execution, or upstream failed


# (network, stage_id) and the LOAD lock now kept for it, or None: evicted.
KeptChange = tuple[Stage, Lock | None]


class SchedulerError(RuntimeError):
    """The core API was misused (a bug in the caller), not bad user input."""


@dataclass(slots=True)
class MemoryLedger:
    """Reserved bytes against a budget. Never negative; above budget only when told.

    `kept_bytes` is the part of `reserved_bytes` that kept loaded stages hold: still
    in memory, and reclaimable at any dispatch (the core unloads them, oldest
    first), so free memory counts it as free, except `pinned_bytes`."""

    budget_bytes: int
    reserved_bytes: int = 0
    peak_reserved_bytes: int = 0
    kept_bytes: int = 0
    # The part of kept_bytes that pinned kept stages hold (SchedulerState.kept_pinned):
    # not free to the policy, reclaimed only by a dispatch that fits no other way.
    pinned_bytes: int = 0

    def free_bytes(self) -> int:
        return self.budget_bytes - self.reserved_bytes + self.kept_bytes - self.pinned_bytes

    def fits(self, memory_bytes: int) -> bool:
        return self.reserved_bytes - self.kept_bytes + memory_bytes <= self.budget_bytes

    def reserve(self, memory_bytes: int, *, allow_over_budget: bool = False) -> None:
        if memory_bytes < 0:
            raise SchedulerError(f"cannot reserve {memory_bytes} bytes")
        if not allow_over_budget and not self.fits(memory_bytes):
            raise SchedulerError(
                f"reserving {memory_bytes} bytes exceeds the budget "
                f"({self.reserved_bytes} of {self.budget_bytes} reserved)"
            )
        self.reserved_bytes += memory_bytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

    def release(self, memory_bytes: int) -> None:
        if memory_bytes < 0 or memory_bytes > self.reserved_bytes:
            raise SchedulerError(
                f"releasing {memory_bytes} bytes with only {self.reserved_bytes} reserved"
            )
        self.reserved_bytes -= memory_bytes


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Start `task_id` on `worker`; `over_commit` means the budget is exceeded by it."""

    task_id: str
    worker: int
    over_commit: bool = False
    # A LOAD that takes its stage's kept session (`keep_loaded_bytes`): nothing to
    # read or create, so the backend ends it at once.
    reuses_kept: bool = False


@dataclass(frozen=True, slots=True)
class OverCommit:
    """A dispatch that took reserved memory above the budget.

    reason: "progress" (masa's progress rule: nothing else ran), "oblivious" (bulk,
    deepeye) or "violation" (a memory-aware policy went over the budget while
    other tasks ran: a bug the report counts and the run fails on).
    time_us is filled in by the executor or simulator (-1 inside the core).
    """

    task_id: str
    footprint_bytes: int
    reserved_bytes: int  # after the dispatch
    reason: str
    time_us: int = -1


@dataclass(slots=True)
class Finished:
    """What changed because a task ended (and everything it caused)."""

    task_id: str
    status: TaskState
    released_bytes: int  # total returned to the ledger by this call
    released_locks: list[Lock] = field(default_factory=list)
    kept_changes: list[KeptChange] = field(default_factory=list)  # see CoreEvents
    newly_cancelled: list[str] = field(default_factory=list)  # tasks that never ran
    newly_failed_groups: list[str] = field(default_factory=list)
    to_terminate: list[str] = field(default_factory=list)  # running tasks to stop
    ended_groups: list[tuple[str, GroupStatus]] = field(default_factory=list)


@dataclass(slots=True)
class CoreEvents:
    """Side effects of gate/cancel/fail/add calls, collected until `take_events`."""

    released_bytes: int = 0
    released_locks: list[Lock] = field(default_factory=list)
    # Kept loaded stages, in order: (stage, lock) when a LOAD lock is released into
    # them (the backend keeps the stage's session under (network, stage_id) instead
    # of unloading it), (stage, None) when a kept stage is evicted (unload it now).
    # A LOAD that takes a kept stage says so in its Dispatch.
    kept_changes: list[KeptChange] = field(default_factory=list)
    newly_cancelled: list[str] = field(default_factory=list)
    ended_groups: list[tuple[str, GroupStatus]] = field(default_factory=list)

    def any(self) -> bool:
        return bool(self.newly_cancelled or self.ended_groups or self.released_locks
                    or self.kept_changes)


@dataclass(slots=True)
class TaskInfo:
    task: Task
    footprint_bytes: int
    state: TaskState = TaskState.PENDING
    arrived: bool = False
    started: bool = False
    waiting_preds: int = 0  # precedence predecessors not yet DONE
    waiting_starts: int = 0  # start_after predecessors not yet started
    successors: list[str] = field(default_factory=list)
    start_successors: list[str] = field(default_factory=list)
    locks_from: list[str] = field(default_factory=list)
    locks_until: list[str] = field(default_factory=list)
    worker: int = -1
    ready_epoch: int = 0  # bumped on every PENDING -> READY; stale heap entries mismatch


@dataclass(slots=True)
class LockInfo:
    lock: Lock
    open_until: int  # until_tasks not yet ended
    from_ended: bool = False
    held: bool = False
    released: bool = False


@dataclass(slots=True)
class GroupInfo:
    name: str
    key: tuple[tuple[int, ...], str]  # arrival order of the network instance
    task_ids: list[str] = field(default_factory=list)
    open_count: int = 0  # tasks not yet ended
    arrived_count: int = 0
    started_count: int = 0
    status: GroupStatus = GroupStatus.ACTIVE
    reason: str = ""
    ended: bool = False


class Policy(Protocol):
    """A dispatch rule (masa.sched.policies): told about tasks, asked for the next one."""

    name: str
    memory_aware: bool  # False: over-budget dispatches are "oblivious", not "progress"

    def on_added(self, state: SchedulerState, info: TaskInfo) -> None: ...
    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None: ...
    def on_started(self, state: SchedulerState, info: TaskInfo) -> None: ...
    def on_ended(self, state: SchedulerState, info: TaskInfo) -> None: ...
    def pick(self, state: SchedulerState) -> str | None: ...


@dataclass(slots=True)
class SchedulerState:
    """Everything the core knows, as plain data. Mutated only by this module's functions."""

    workers: int
    ledger: MemoryLedger
    policy: Policy
    tasks: dict[str, TaskInfo] = field(default_factory=dict)
    locks: dict[str, LockInfo] = field(default_factory=dict)
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    free_workers: list[int] = field(default_factory=list)  # a min-heap of worker ids
    running_count: int = 0
    open_count: int = 0  # tasks not yet ended, over all groups
    over_commits: list[OverCommit] = field(default_factory=list)
    events: CoreEvents = field(default_factory=CoreEvents)
    # Stages, as (network, stage_id), whose files the backend found in the page cache
    # before this decision (a LOAD of them reads no storage); None: not known. Set by
    # the backend when the policy asks for it (`uses_cached_stages`); read-only here.
    cached_stages: Set[tuple[str, str]] | None = None
    # Kept loaded stages (issue 14): a LOAD lock released at the stage's last EXEC
    # moves here instead, its bytes still reserved (`ledger.kept_bytes`), within
    # `keep_loaded_bytes` and the budget (0: nothing is kept; `_keeps`). The next LOAD
    # of that stage takes it and costs nothing; a dispatch that needs the memory
    # evicts the least recently kept (`_evict_one`). (network, stage_id) -> the lock,
    # oldest first.
    keep_loaded_bytes: int = 0
    kept: dict[Stage, Lock] = field(default_factory=dict)
    # Every stage a LOAD was added for (its LOAD's time, bytes and how often the jobs
    # load it), and the sum of their resident bytes.
    seen_stages: dict[Stage, StageUse] = field(default_factory=dict)
    seen_stage_bytes: int = 0
    largest_exec_bytes: int = 0  # the largest footprint of an EXEC added
    # Once the stages seen exceed the keep bound, only the stages in `pinned` are kept
    # (masa.sched.keeping), and the kept ones among them (`kept_pinned`) are not free
    # memory to the policy (`MemoryLedger.pinned_bytes`): only a dispatch that fits no
    # other way evicts them. None: to be chosen again (`_pinned`).
    pinned: frozenset[Stage] | None = None
    pin_stages: bool = True  # False: keep nothing once not all fit (the policy says)
    kept_pinned: set[Stage] = field(default_factory=set)
    loads_since_pinned: int = 0  # LOADs added since `pinned` was chosen
    loads_since_aged: int = 0  # since the stages' recent LOAD counts were last halved
    loads_reused: int = 0
    kept_evicted: int = 0


def new_state(workers: int, memory_budget_bytes: int, policy: Policy) -> SchedulerState:
    """An empty scheduler for `workers` workers, a memory budget and a fresh policy
    object (masa.runtime.registry.make_policy by name), used by this state only."""
    if workers < 1:
        raise UserError(f"workers: expected a positive integer, got {workers}")
    if memory_budget_bytes < 0:
        raise UserError(f"memory budget: expected a non-negative size, got {memory_budget_bytes}")
    keep_loaded_bytes = getattr(policy, "keep_loaded_bytes", 0)
    if keep_loaded_bytes and not policy.memory_aware:
        raise UserError(f"keeping loaded stages: policy {policy.name!r} ignores the memory "
                        "budget, so it cannot keep stages within it")
    return SchedulerState(
        workers=workers,
        ledger=MemoryLedger(memory_budget_bytes),
        policy=policy,
        free_workers=list(range(workers)),
        keep_loaded_bytes=keep_loaded_bytes,
        pin_stages=getattr(policy, "pin_stages", True),
    )


def set_cached_stages(state: SchedulerState, stages: Set[tuple[str, str]] | None) -> None:
    """What the backend found in the page cache before a decision (`cached_stages`)."""
    state.cached_stages = stages


def _set_state(info: TaskInfo, new: TaskState) -> None:
    if new not in TRANSITIONS[info.state]:
        raise SchedulerError(
            f"task {info.task.task_id!r}: illegal transition {info.state.value} -> {new.value}"
        )
    info.state = new


def add_tasks(state: SchedulerState, graph: TaskGraph, *, arrived: bool = True) -> None:
    """Add a graph's tasks (a job arriving). With arrived=False, call `arrive` later.

    Edges and locks may name tasks added earlier; locks must open at a new task.
    """
    problems = _graph_problems(state, graph)
    if problems:
        raise SchedulerError("; ".join(problems[:5]))
    added = _add_task_infos(state, graph)
    doomed = _link(state, graph)
    for info in added:
        state.policy.on_added(state, info)
    for task_id in doomed:
        info = state.tasks[task_id]
        if info.state not in TERMINAL:
            _end_group(state, info.task.group, GroupStatus.CANCELLED,
                       "a predecessor had already ended without running")
    if arrived:
        arrive(state, [task.task_id for task in graph.tasks])


def _graph_problems(state: SchedulerState, graph: TaskGraph) -> list[str]:
    """Why the graph cannot join the state (unknown or duplicate ids, cycles...)."""
    known = state.tasks
    problems: list[str] = []
    seen: set[str] = set()
    for task in graph.tasks:
        if task.task_id in known or task.task_id in seen:
            problems.append(f"duplicate task id {task.task_id!r}")
        seen.add(task.task_id)
        if task.duration_us < 0 or task.memory_bytes < 0:
            problems.append(f"task {task.task_id!r}: negative duration or memory")
        group = state.groups.get(task.group)
        if group is not None and group.ended:
            problems.append(f"task {task.task_id!r}: group {task.group!r} has already ended")
    for before, after in graph.precedence + graph.start_after:
        if after not in seen:
            problems.append(f"edge ({before!r}, {after!r}) must end at a new task")
        if before not in seen and before not in known:
            problems.append(f"edge names unknown task {before!r}")
    for lock in graph.locks:
        if lock.from_task not in seen:
            problems.append(f"lock {lock.lock_id!r} must open at a new task")
        if lock.lock_id in state.locks:
            problems.append(f"duplicate lock id {lock.lock_id!r}")
        if lock.memory_bytes < 0:
            problems.append(f"lock {lock.lock_id!r}: negative memory")
        for task_id in lock.until_tasks:
            if task_id not in seen and task_id not in known:
                problems.append(f"lock {lock.lock_id!r} names unknown task {task_id!r}")
    if not problems:
        new_ids = [task.task_id for task in graph.tasks]
        inner = tuple(
            (a, b) for a, b in graph.precedence + graph.start_after if a in seen and b in seen
        )
        if topological_order(new_ids, inner) is None:
            problems.append("cyclic dependencies: " + " -> ".join(find_cycle(new_ids, inner)))
    return problems


def _add_task_infos(state: SchedulerState, graph: TaskGraph) -> list[TaskInfo]:
    footprint = {task.task_id: task.memory_bytes for task in graph.tasks}
    for lock in graph.locks:
        footprint[lock.from_task] += lock.memory_bytes
    added: list[TaskInfo] = []
    for task in graph.tasks:
        if state.keep_loaded_bytes:
            if task.kind is TaskKind.LOAD:
                _see_stage(state, task, footprint[task.task_id] - task.memory_bytes,
                           footprint[task.task_id])
            elif footprint[task.task_id] > state.largest_exec_bytes:
                state.largest_exec_bytes = footprint[task.task_id]
        info = TaskInfo(task=task, footprint_bytes=footprint[task.task_id])
        state.tasks[task.task_id] = info
        added.append(info)
        group = state.groups.get(task.group)
        if group is None:
            group = GroupInfo(name=task.group, key=(task.order, task.group))
            state.groups[task.group] = group
        elif task.order < group.key[0]:
            group.key = (task.order, task.group)
        group.task_ids.append(task.task_id)
        group.open_count += 1
        state.open_count += 1
    return added


def _link(state: SchedulerState, graph: TaskGraph) -> list[str]:
    """Record edges and locks; returns new tasks whose predecessors already ended badly."""
    known = state.tasks
    doomed: list[str] = []
    for before, after in graph.precedence:
        pred = known[before]
        pred.successors.append(after)
        if pred.state is not TaskState.DONE:
            known[after].waiting_preds += 1
            if pred.state in TERMINAL:
                doomed.append(after)
    for before, after in graph.start_after:
        pred = known[before]
        pred.start_successors.append(after)
        if not pred.started:
            known[after].waiting_starts += 1
            if pred.state in TERMINAL:
                doomed.append(after)
    for lock in graph.locks:
        open_until = 0
        for task_id in lock.until_tasks:
            known[task_id].locks_until.append(lock.lock_id)
            if known[task_id].state not in TERMINAL:
                open_until += 1
        known[lock.from_task].locks_from.append(lock.lock_id)
        state.locks[lock.lock_id] = LockInfo(lock=lock, open_until=open_until)
    return doomed


def arrive(state: SchedulerState, task_ids: Iterable[str]) -> None:
    """Tasks reach their release time (the simulator calls this at release_us)."""
    for task_id in task_ids:
        info = state.tasks[task_id]
        if info.arrived:
            continue
        info.arrived = True
        state.groups[info.task.group].arrived_count += 1
        _try_ready(state, info)


def _try_ready(state: SchedulerState, info: TaskInfo) -> None:
    if (
        info.state is TaskState.PENDING
        and info.arrived
        and info.waiting_preds == 0
        and info.waiting_starts == 0
        and info.task.group not in state.gated
    ):
        _set_state(info, TaskState.READY)
        info.ready_epoch += 1
        state.policy.on_ready(state, info)


def select(state: SchedulerState) -> list[Dispatch]:
    """Dispatch ready tasks to idle workers, as the policy decides; reserves their memory."""
    dispatches: list[Dispatch] = []
    while state.free_workers:
        task_id = state.policy.pick(state)
        if task_id is None:
            break
        dispatches.append(_start(state, task_id))
    return dispatches


def _over_commit_reason(state: SchedulerState) -> str:
    """Why a dispatch just took the ledger over the budget (called after counting it).

    A memory-aware policy may only do so under the progress rule: nothing else
    runs. Anything else is recorded as a "violation" (a policy bug), which fails
    the run's report; memory-oblivious policies are "oblivious".
    """
    if not state.policy.memory_aware:
        return "oblivious"
    return "progress" if state.running_count == 1 else "violation"


def _start(state: SchedulerState, task_id: str) -> Dispatch:
    info = state.tasks[task_id]
    _set_state(info, TaskState.RUNNING)
    info.started = True
    info.worker = heapq.heappop(state.free_workers)
    state.running_count += 1
    ledger = state.ledger
    reuses_kept = bool(state.kept) and _take_kept(state, info.task)
    over_commit = not ledger.fits(info.footprint_bytes)
    # Kept stages make room before the reservation, so the ledger's peak never
    # counts a kept stage and the task that evicts it at once.
    while ledger.kept_bytes and (ledger.reserved_bytes + info.footprint_bytes
                                 > ledger.budget_bytes):
        _evict_one(state)
    ledger.reserve(info.footprint_bytes, allow_over_budget=True)
    if over_commit:
        state.over_commits.append(
            OverCommit(task_id, info.footprint_bytes, ledger.reserved_bytes,
                       _over_commit_reason(state))
        )
    for lock_id in info.locks_from:
        state.locks[lock_id].held = True
    state.groups[info.task.group].started_count += 1
    state.policy.on_started(state, info)
    for successor_id in info.start_successors:
        successor = state.tasks[successor_id]
        successor.waiting_starts -= 1
        _try_ready(state, successor)
    return Dispatch(task_id, info.worker, over_commit, reuses_kept)


def _take_kept(state: SchedulerState, task: Task) -> bool:
    """A LOAD of a kept stage takes it: the kept bytes return to the ledger, which
    reserves the LOAD's footprint as for any LOAD."""
    if task.kind is not TaskKind.LOAD:
        return False
    lock = _unkeep(state, (task.network, task.stage_id))
    if lock is None:
        return False
    state.loads_reused += 1
    return True


def _unkeep(state: SchedulerState, stage: Stage) -> Lock | None:
    """Take `stage` out of the kept stages, its bytes out of the ledger; its lock."""
    lock = state.kept.pop(stage, None)
    if lock is not None:
        state.ledger.kept_bytes -= lock.memory_bytes
        if stage in state.kept_pinned:
            state.kept_pinned.discard(stage)
            state.ledger.pinned_bytes -= lock.memory_bytes
        state.ledger.release(lock.memory_bytes)
    return lock


def _evict_one(state: SchedulerState) -> None:
    """Unload a kept stage: the oldest not pinned, else the pinned one whose LOAD
    saves the least time per byte."""
    stage = next((stage for stage in state.kept if stage not in state.kept_pinned), None)
    if stage is None:
        stage = min(state.kept,
                    key=lambda kept: (state.seen_stages[kept].saved_us_per_byte(), kept))
    lock = _unkeep(state, stage)
    assert lock is not None
    state.events.released_bytes += lock.memory_bytes
    state.events.kept_changes.append((stage, None))
    state.kept_evicted += 1


def kept_stats(state: SchedulerState) -> dict[str, int]:
    """For the report: LOADs that reused a kept stage, kept stages evicted, and the
    stages pinned when not all fit (0 when all did; {} when nothing is kept)."""
    if not state.keep_loaded_bytes:
        return {}
    return {"keep_loaded_bytes": state.keep_loaded_bytes, "loads_reused": state.loads_reused,
            "kept_evicted": state.kept_evicted, "pinned_stages": len(state.pinned or ())}


def evict_kept(state: SchedulerState) -> None:
    """Unload every kept stage (a run's end): `take_events` lists them."""
    while state.kept:
        _evict_one(state)


def _see_stage(state: SchedulerState, task: Task, resident_bytes: int,
               footprint_bytes: int) -> None:
    """Count a LOAD added for its stage (what `pinned_stages` weighs)."""
    stage = (task.network, task.stage_id)
    use = state.seen_stages.get(stage)
    if use is None:
        use = state.seen_stages[stage] = StageUse(task.duration_us, resident_bytes,
                                                  footprint_bytes)
        state.seen_stage_bytes += resident_bytes
        state.pinned = None
    use.recent_loads += 1
    state.loads_since_pinned += 1
    state.loads_since_aged += 1
    stages = len(state.seen_stages)
    if state.loads_since_pinned >= stages:  # about once per job that loads them all
        state.pinned = None
    if state.loads_since_aged >= AGE_AFTER_JOBS * stages:
        age_uses(state.seen_stages)
        state.loads_since_aged = 0


# The stages' recent LOAD counts halve after about this many jobs' LOADs (each
# loading every stage once): the pinned stages follow a workload that changes.
AGE_AFTER_JOBS = 32


def _pinned(state: SchedulerState) -> frozenset[Stage]:
    """The stages kept once not all fit, chosen again when `_see_stage` says so. The
    kept stages among them are pinned (a stage kept before the bound was passed
    included); a kept stage no longer among them becomes evictable as any kept stage."""
    if state.pinned is None:
        state.pinned = pinned_stages(state.seen_stages, state.keep_loaded_bytes,
                                     state.ledger.budget_bytes, state.workers,
                                     state.largest_exec_bytes)
        state.loads_since_pinned = 0
        state.kept_pinned = state.pinned & state.kept.keys()
        state.ledger.pinned_bytes = sum(state.kept[stage].memory_bytes
                                        for stage in state.kept_pinned)
    return state.pinned


def _keeps(state: SchedulerState, lock: Lock) -> bool:
    """Whether a LOAD lock being released moves into the kept stages: its LOAD ran to
    the end in a network not failed, and no other copy of the stage is kept.

    While every stage the jobs have loaded fits in `keep_loaded_bytes` and in the
    budget, every such stage is kept, and evicted oldest first when a dispatch needs
    the memory. Past that, keeping them all would evict each kept stage before its
    next use (LRU on a cycle larger than the cache), and the kept stages would take
    the room the page cache keeps stage files in: measured on the emulated Pi 4,
    mixed at 512 MiB (638 MiB of stages) took 10.4 s against 7.7 s without keeping,
    lifelogging at 1 GiB (1092 MiB) 14.3 s against 11.2 s. Then only the pinned
    stages are kept (masa.sched.keeping: the most LOAD time saved per byte, with room
    left for every worker to load one of the others), and the policy does not count
    them as free."""
    opener = state.tasks[lock.from_task]
    task = opener.task
    stage = (task.network, task.stage_id)
    if (task.kind is not TaskKind.LOAD or opener.state is not TaskState.DONE
            or state.groups[task.group].status is GroupStatus.FAILED or stage in state.kept):
        return False
    pin = state.seen_stage_bytes > min(state.keep_loaded_bytes, state.ledger.budget_bytes)
    if pin and not (state.pin_stages and stage in _pinned(state)):
        return False
    if pin:  # stages kept before the bound was passed make way (they are not pinned)
        while state.kept and state.ledger.kept_bytes + lock.memory_bytes > state.keep_loaded_bytes:
            _evict_one(state)
    state.kept[stage] = lock
    state.ledger.kept_bytes += lock.memory_bytes
    if pin:
        state.kept_pinned.add(stage)
        state.ledger.pinned_bytes += lock.memory_bytes
    state.events.kept_changes.append((stage, lock))
    return True


def finish(state: SchedulerState, task_id: str, ok: bool = True) -> Finished:
    """A running task ended. ok=False: it failed (or was stopped, if its group had ended).

    A failure fails the task's group: its pending tasks are cancelled and its
    other running tasks are listed in `to_terminate`. Returns everything that
    changed, including effects of earlier gate/cancel calls not yet taken.
    """
    info = state.tasks.get(task_id)
    if info is None or info.state is not TaskState.RUNNING:
        raise SchedulerError(f"finish({task_id!r}): task is not running")
    group = state.groups[info.task.group]
    if ok:
        status = TaskState.DONE
    elif group.status is not GroupStatus.ACTIVE:
        status = TaskState.CANCELLED  # stopped on purpose because its group ended
    else:
        status = TaskState.FAILED
    _set_state(info, status)
    state.running_count -= 1
    heapq.heappush(state.free_workers, info.worker)
    state.ledger.release(info.task.memory_bytes)
    state.events.released_bytes += info.task.memory_bytes
    to_terminate: list[str] = []
    failed_groups: list[str] = []
    if status is TaskState.FAILED:
        failed_groups.append(group.name)
        to_terminate += _end_group(state, group.name, GroupStatus.FAILED,
                                   f"task {task_id!r} failed")
    _task_ended(state, info)
    if status is TaskState.DONE:
        for successor_id in info.successors:
            successor = state.tasks[successor_id]
            successor.waiting_preds -= 1
            _try_ready(state, successor)
    else:
        to_terminate += _doom_successors(state, info, info.successors)
    events = take_events(state)
    return Finished(
        task_id=task_id,
        status=status,
        released_bytes=events.released_bytes,
        released_locks=events.released_locks,
        kept_changes=events.kept_changes,
        newly_cancelled=events.newly_cancelled,
        newly_failed_groups=failed_groups,
        to_terminate=to_terminate,
        ended_groups=events.ended_groups,
    )


def _task_ended(state: SchedulerState, info: TaskInfo) -> None:
    """Bookkeeping shared by every way a task ends: locks, group, policy."""
    state.open_count -= 1
    for lock_id in info.locks_from:
        lock_info = state.locks[lock_id]
        lock_info.from_ended = True
        _maybe_release(state, lock_info)
    for lock_id in info.locks_until:
        lock_info = state.locks[lock_id]
        lock_info.open_until -= 1
        _maybe_release(state, lock_info)
    state.policy.on_ended(state, info)
    group = state.groups[info.task.group]
    group.open_count -= 1
    _check_group_end(state, group)


def _maybe_release(state: SchedulerState, lock_info: LockInfo) -> None:
    if lock_info.from_ended and lock_info.open_until == 0 and not lock_info.released:
        lock_info.released = True
        # (Keeping is tested first: without it, no call per lock on the hot path.)
        if lock_info.held and not (state.keep_loaded_bytes and _keeps(state, lock_info.lock)):
            state.ledger.release(lock_info.lock.memory_bytes)
            state.events.released_bytes += lock_info.lock.memory_bytes
            state.events.released_locks.append(lock_info.lock)


def _check_group_end(state: SchedulerState, group: GroupInfo) -> None:
    if group.open_count == 0 and not group.ended:
        group.ended = True
        if group.status is GroupStatus.ACTIVE:
            group.status = GroupStatus.DONE
        state.gated.discard(group.name)
        state.events.ended_groups.append((group.name, group.status))


def _cancel_unstarted(state: SchedulerState, info: TaskInfo) -> list[str]:
    """Cancel a task that never ran; returns running tasks of other groups to stop."""
    _set_state(info, TaskState.CANCELLED)
    state.events.newly_cancelled.append(info.task.task_id)
    _task_ended(state, info)
    return _doom_successors(state, info, info.successors + info.start_successors)


def _doom_successors(state: SchedulerState, info: TaskInfo, successor_ids: list[str]) -> list[str]:
    """Successors of a task that will never complete can never run: end their groups."""
    to_terminate: list[str] = []
    for successor_id in successor_ids:
        successor = state.tasks[successor_id]
        if successor.state in (TaskState.PENDING, TaskState.READY):
            group_name = successor.task.group
            if state.groups[group_name].status is GroupStatus.ACTIVE:
                to_terminate += _end_group(
                    state, group_name, GroupStatus.CANCELLED,
                    f"predecessor {info.task.task_id!r} did not complete",
                )
            elif successor.state is not TaskState.CANCELLED:
                to_terminate += _cancel_unstarted(state, successor)
    return to_terminate


def _end_group(state: SchedulerState, group_name: str, status: GroupStatus,
               reason: str) -> list[str]:
    """Fail or cancel a group: cancel its unstarted tasks; return its running ones."""
    group = state.groups.get(group_name)
    if group is None or group.status is not GroupStatus.ACTIVE:
        return []
    group.status = status
    group.reason = reason
    running: list[str] = []
    other_running: list[str] = []
    for task_id in group.task_ids:
        info = state.tasks[task_id]
        if info.state in (TaskState.PENDING, TaskState.READY):
            other_running += _cancel_unstarted(state, info)
        elif info.state is TaskState.RUNNING:
            running.append(task_id)
    _check_group_end(state, group)
    return running + other_running


def fail_group(state: SchedulerState, group: str, reason: str) -> list[str]:
    """Mark a network instance failed. Returns the running task ids to terminate.

    Their memory returns when the executor reports them with `finish`; the
    tasks it cancelled and the locks it released are in `take_events`.
    """
    return _end_group(state, group, GroupStatus.FAILED, reason)


def cancel_group(state: SchedulerState, group: str, reason: str) -> list[str]:
    """Cancel (skip or abort) a network instance. Returns the running task ids to terminate."""
    return _end_group(state, group, GroupStatus.CANCELLED, reason)


def gate_group(state: SchedulerState, group: str) -> None:
    """Context-aware wait: the group's tasks stop becoming ready until `open_group`.

    Works before the group's tasks are added. Running tasks are not affected.
    """
    state.gated.add(group)
    info = state.groups.get(group)
    if info is None:
        return
    for task_id in info.task_ids:
        task_info = state.tasks[task_id]
        if task_info.state is TaskState.READY:
            # The policy's heap entry goes stale through the epoch on re-ready.
            _set_state(task_info, TaskState.PENDING)


def open_group(state: SchedulerState, group: str) -> None:
    """Lift a gate: the group's tasks become ready as their dependencies allow."""
    state.gated.discard(group)
    info = state.groups.get(group)
    if info is None:
        return
    for task_id in info.task_ids:
        _try_ready(state, state.tasks[task_id])


def take_events(state: SchedulerState) -> CoreEvents:
    """Released locks, cancelled tasks and ended groups since the last call (then cleared)."""
    events = state.events
    state.events = CoreEvents()
    return events


def forget_group(state: SchedulerState, group: str) -> bool:
    """Drop an ended group's tasks, locks and record, so a long-running state stays small.

    Only when every task of the group has ended, none of its locks is still
    held and no task of another group still waits for one of its tasks.
    Returns whether it was forgotten. Later graphs must not name its tasks.
    """
    info = state.groups.get(group)
    if info is None or not info.ended:
        return False
    tasks = state.tasks
    members = set(info.task_ids)
    for task_id in info.task_ids:
        task_info = tasks[task_id]
        for lock_id in task_info.locks_from:
            lock_info = state.locks[lock_id]
            if lock_info.held and not lock_info.released:
                return False
        for successor in task_info.successors + task_info.start_successors:
            # A successor no longer known was forgotten, so it had ended (a
            # CA-preempt downstream aborted, and forgotten, before its upstream).
            other = tasks.get(successor)
            if successor not in members and other is not None and other.state not in TERMINAL:
                return False
    for task_id in info.task_ids:
        for lock_id in tasks.pop(task_id).locks_from:
            del state.locks[lock_id]
    del state.groups[group]
    return True


def group_status(state: SchedulerState, group: str) -> GroupStatus:
    return state.groups[group].status


def is_finished(state: SchedulerState) -> bool:
    """Every task added so far has ended."""
    return state.open_count == 0


def unfinished_task_ids(state: SchedulerState) -> list[str]:
    return [task_id for task_id, info in state.tasks.items() if info.state not in TERMINAL]
