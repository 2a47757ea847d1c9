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
from masa.sched.taskgraph import Task, TaskKind

# A ready-heap entry: (sort key..., task_id, ready_epoch); the last two are checked.
_Entry = tuple


_READY = TaskState.READY  # a plain global: enum attribute access is slow in 3.11
# Job order: a job waiting t us counts as JOB_AGEING * t us shorter. Measured
# on stochastic I/II at 512 MiB-1 GiB, rho 0.9-1.1 (docs/bench-compare.md): 0
# (pure shortest remaining work) gave the lowest means but p99s up to 2.6x
# those of 1.0 (long jobs starve); 1.0 the best p99s but means up to 56%
# above today's greedy masa in stochastic I at 512 MiB; 0.25 is between.
JOB_AGEING = 0.25


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


def _still_ready(state: SchedulerState, heap: list[_Entry]) -> list[_Entry]:
    """The heap without its stale entries (a heap again)."""
    tasks = state.tasks
    kept = [entry for entry in heap
            if (info := tasks.get(entry[-2])) is not None and info.state is _READY
            and info.ready_epoch == entry[-1]]
    heapq.heapify(kept)
    return kept


def _resident_bytes(load_info: TaskInfo) -> int:
    """What a LOAD keeps until its stage's EXEC ends: the locks it opens."""
    return load_info.footprint_bytes - load_info.task.memory_bytes


def _growth_bytes(exec_info: TaskInfo, resident_bytes: int) -> int:
    """What an EXEC leaves held once it ends beyond what it frees: the outputs it
    opens less its stage's resident bytes (inputs it frees are not counted: a bound)."""
    outputs_bytes = exec_info.footprint_bytes - exec_info.task.memory_bytes
    return max(0, outputs_bytes - resident_bytes)


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
      EXEC), plus what those EXECs will leave held beyond the weights they
      free (outputs larger than their stage's resident bytes: an early conv
      layer's activation), summed, since any of them may run before the
      largest. Otherwise loads fill memory to the brim, the EXEC they exist
      for cannot start, and the progress rule over-commits. (Counting the
      transient memory as returned matters when loads peak far above what
      they keep: the first version kept room for the EXEC on top of the whole
      load peak and ran such loads one at a time.) Only the smallest LOAD is
      tested, which keeps a decision O(log n).

    A third, on by default with the two others (`job_order`, issue 14):
    once at least `queue_jobs` jobs (default workers + 1) have ready or
    running work, the most urgent job goes first: the ready EXEC, else LOAD,
    of the job with the least remaining profiled work, aged by arrival (key:
    remaining work + `ageing` x arrival time, i.e. work minus ageing x time
    waited, which needs no clock), if it fits; otherwise the footprint order
    above decides as before, so no worker idles for the sake of the order.
    With a long queue it stops interleaving every job's small tasks, which
    stretched every job (docs/bench-compare.md). With a short one it engages
    only where LOADs read nothing from storage (the stage of every LOAD not yet
    started in the page cache, or a simulation that models no storage; a batch
    plan's search is told which): there it won on
    the warm simulated grid, but on the emulated Pi, whose card binds, the
    order a lone job loaded its networks in (depth first) left the next jobs
    fewer cached stage files, 13-70% slower (docs/scheduling.md "When the job
    order engages"); smallest-first runs there unchanged. Jobs are told apart
    by Task.job_id.

    Cached stages first, on by default with our other rules (`cache_first`):
    where the backend tells which stages' files are in the page cache
    (`SchedulerState.cached_stages`: the real executor probes them, a simulated
    device knows its model of the cache), a LOAD of a cached stage that may start
    (admission and headroom kept) goes before the smallest LOAD, the smallest
    such first. On a device whose storage is slow, a job's stages still cached
    from an earlier job are otherwise read again: smallest-first loads the job's
    uncached stages first, and their reads evict the cached ones before their
    turn (docs/scheduling.md, "Cached stages first"). Where every stage is cached
    (or nothing is known) the order is smallest-first, unchanged; the job order,
    when engaged, still decides first.

    A read-ahead window, off by default (`read_ahead_bytes`, issue 14): the
    resident bytes of stages whose LOAD has started and whose EXEC has not may
    not exceed it, except that one stage may always be loaded ahead (a stage
    larger than the window still loads, alone). Without it loads run ahead
    until memory is full, which is right where loading costs CPU; where a slow
    card binds and stages hold copied weights, the memory left to the page
    cache keeps the next jobs' stage files cached, and Masa filling its budget
    made it read more than the baselines. Zero-copy stages are their files'
    cached pages, and there it is no gain (docs/scheduling.md, "Read-ahead").
    """

    name = "masa"
    memory_aware = True

    def __init__(self, admission: bool = True, headroom: bool = True,
                 job_order: bool | None = None, ageing: float = JOB_AGEING,
                 queue_jobs: int | None = None, read_ahead_bytes: int | None = None,
                 cache_first: bool | None = None, keep_loaded_bytes: int = 0,
                 pin_stages: bool = True) -> None:
        if read_ahead_bytes is not None and read_ahead_bytes < 0:
            raise ValueError(f"read_ahead_bytes: expected >= 0 or None, got {read_ahead_bytes}")
        if keep_loaded_bytes < 0:
            raise ValueError(f"keep_loaded_bytes: expected >= 0, got {keep_loaded_bytes}")
        # The bound on loaded stages kept between jobs: all kept while every stage
        # loaded fits in it and in the budget, else the pinned ones (masa.sched.core,
        # `_keeps`).
        self.keep_loaded_bytes = keep_loaded_bytes
        # Once not all stages fit in that bound: keep the pinned ones (True) or none.
        self.pin_stages = pin_stages
        self.admission = admission
        self.headroom = headroom
        # None: our job order comes with our other rules (masa), not with the paper's.
        self.job_order = admission if job_order is None else job_order
        # The backend probes the page cache only for a policy that uses it.
        self.uses_cached_stages = admission if cache_first is None else cache_first
        # Ready LOADs by stage, (network, stage_id) -> heap of entries as in _loads.
        self._loads_by_stage: dict[tuple[str, str], list[_Entry]] = {}
        # An upper bound on the entries in them (pops are not counted off, stale
        # ones included): it only decides when _compact recounts.
        self._stage_entries = 0
        self.cached_loads_ahead = 0  # LOADs the rule started before a smaller one
        self.ageing = ageing
        self.queue_jobs = queue_jobs  # None: workers + 1
        self._job_work_us: dict[int, int] = {}  # profiled work of the job's open tasks
        self._job_open: dict[int, int] = {}  # the job's tasks not yet ended
        self._active_jobs: set[int] = set()  # jobs with a task that became ready, not ended
        # LOADs added and not started, by stage: what the jobs will still read.
        self._unstarted_loads: dict[tuple[str, str], int] = {}
        self._execs_by_job: list[_Entry] = []  # (job key, footprint, order, id, epoch)
        self._loads_by_job: list[_Entry] = []
        # A task sits in two heaps when job order is on and leaves one lazily, when it
        # reaches its top: past this many entries, stale ones are dropped (amortised O(1)).
        self._compact_at = 1024
        self._pending_exec_needs: list[tuple[int, str]] = []  # (-footprint, exec id)
        self._running_load_direct_bytes = 0  # transient copies, returned when LOADs end
        # What the EXECs of loaded stages will leave held beyond the weights they free
        # (outputs larger than the stage's resident bytes), summed: the headroom keeps it.
        self._growth_by_exec: dict[str, int] = {}
        self._pending_growth_bytes = 0
        self.read_ahead_bytes = read_ahead_bytes  # None: loads run ahead as memory allows
        self._ahead_bytes = 0  # resident bytes of stages loaded (or loading), EXEC not started
        self._ahead_by_exec: dict[str, int] = {}  # EXEC id -> its LOAD's resident bytes
        self._execs: list[_Entry] = []
        self._loads: list[_Entry] = []  # LOADs of started networks (all LOADs without admission)
        self._fresh: list[_Entry] = []  # LOADs that would start a network

    def on_added(self, state: SchedulerState, info: TaskInfo) -> None:
        if self.job_order:
            task = info.task
            job = task.job_id
            self._job_work_us[job] = self._job_work_us.get(job, 0) + task.duration_us
            self._job_open[job] = self._job_open.get(job, 0) + 1
            if task.kind is TaskKind.LOAD:
                self._count_unstarted_load(task, 1)

    def _count_unstarted_load(self, task: Task, delta: int) -> None:
        stage = (task.network, task.stage_id)
        count = self._unstarted_loads.get(stage, 0) + delta
        if count:
            self._unstarted_loads[stage] = count
        else:
            del self._unstarted_loads[stage]

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        task = info.task
        if task.kind is not TaskKind.LOAD:
            heap = self._execs
        elif self.admission and state.groups[task.group].started_count == 0:
            heap = self._fresh
        else:
            heap = self._loads
        entry = (info.footprint_bytes, task.order, task.task_id, info.ready_epoch)
        heapq.heappush(heap, entry)
        if self.uses_cached_stages and heap is not self._execs:
            heapq.heappush(self._loads_by_stage.setdefault((task.network, task.stage_id), []),
                           entry)
            self._stage_entries += 1
        if self.job_order or self.uses_cached_stages:
            self._compact(state)
        if self.job_order:
            # Shortest remaining job work first, aged by arrival: comparing
            # work_a - ageing * (now - release_a) with b's is comparing
            # work + ageing * release, so the key needs no clock.
            job = task.job_id
            self._active_jobs.add(job)
            key = self._job_work_us.get(job, 0) + self.ageing * task.release_us
            heapq.heappush(self._execs_by_job if heap is self._execs else self._loads_by_job,
                           (key, *entry))

    def _compact(self, state: SchedulerState) -> None:
        heaps = ("_execs", "_loads", "_fresh", "_execs_by_job", "_loads_by_job")
        if (sum(len(getattr(self, name)) for name in heaps) + self._stage_entries
                <= self._compact_at):
            return
        for name in heaps:
            setattr(self, name, _still_ready(state, getattr(self, name)))
        for stage, stage_heap in list(self._loads_by_stage.items()):
            kept = _still_ready(state, stage_heap)
            if kept:
                self._loads_by_stage[stage] = kept
            else:
                del self._loads_by_stage[stage]
        self._stage_entries = sum(len(stage_heap) for stage_heap in self._loads_by_stage.values())
        self._compact_at = max(1024, 4 * (sum(len(getattr(self, name)) for name in heaps)
                                          + self._stage_entries))

    def on_started(self, state: SchedulerState, info: TaskInfo) -> None:
        task = info.task
        if task.kind is not TaskKind.LOAD:
            self._forget_pending_exec(task.task_id)
            return
        if self.job_order:
            self._count_unstarted_load(task, -1)
        if self.headroom:
            self._running_load_direct_bytes += task.memory_bytes
        resident_bytes = _resident_bytes(info)
        counted_ahead = self.read_ahead_bytes is None
        for successor in info.successors:
            successor_info = state.tasks[successor]
            if successor_info.task.kind is TaskKind.LOAD:
                continue
            if self.headroom:
                heapq.heappush(self._pending_exec_needs,
                               (-successor_info.footprint_bytes, successor))
                growth_bytes = _growth_bytes(successor_info, resident_bytes)
                if growth_bytes:
                    self._growth_by_exec[successor] = growth_bytes
                    self._pending_growth_bytes += growth_bytes
            if not counted_ahead:  # a stage has one EXEC: its bytes count once
                counted_ahead = True
                self._ahead_by_exec[successor] = resident_bytes
                self._ahead_bytes += resident_bytes

    def _forget_pending_exec(self, exec_id: str) -> None:
        """An EXEC started, or ended without starting: its stage is no longer ahead."""
        self._ahead_bytes -= self._ahead_by_exec.pop(exec_id, 0)
        self._pending_growth_bytes -= self._growth_by_exec.pop(exec_id, 0)

    def on_ended(self, state: SchedulerState, info: TaskInfo) -> None:
        if not info.started:
            self._forget_pending_exec(info.task.task_id)
        if self.headroom and info.started and info.task.kind is TaskKind.LOAD:
            self._running_load_direct_bytes -= info.task.memory_bytes
        if self.job_order:
            if not info.started and info.task.kind is TaskKind.LOAD:  # cancelled
                self._count_unstarted_load(info.task, -1)
            job = info.task.job_id
            self._job_work_us[job] -= info.task.duration_us
            self._job_open[job] -= 1
            if self._job_open[job] == 0:
                del self._job_open[job], self._job_work_us[job]
                self._active_jobs.discard(job)

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

    def _own_needs(self, state: SchedulerState, task_id: str) -> tuple[int, int]:
        """For the EXECs that directly wait for this LOAD: the largest footprint, and
        what they would leave held beyond its weights (summed growth)."""
        info = state.tasks[task_id]
        resident_bytes = _resident_bytes(info)
        need_bytes = growth_bytes = 0
        for successor in info.successors:
            successor_info = state.tasks[successor]
            if successor_info.task.kind is not TaskKind.LOAD:
                need_bytes = max(need_bytes, successor_info.footprint_bytes)
                growth_bytes += _growth_bytes(successor_info, resident_bytes)
        return need_bytes, growth_bytes

    def _fresh_top(self, state: SchedulerState) -> _Entry | None:
        """Smallest LOAD of a network not started yet (moving ones started meanwhile)."""
        while True:
            top = _valid_top(state, self._fresh)
            if top is None or state.groups[state.tasks[top[-2]].task.group].started_count == 0:
                return top
            heapq.heappush(self._loads, heapq.heappop(self._fresh))

    def _job_order_engaged(self, state: SchedulerState) -> bool:
        """Once `queue_jobs` jobs have work; by default once more jobs than workers
        have work, or from the first job where its LOADs read nothing from storage
        (the stage of every LOAD not yet started is cached, or the backend tells
        nothing: a simulation without storage, or an executor that cannot read the
        page cache): the order a lone job loads its networks in (depth first under
        the job order) then evicts no stage file another job would have found cached."""
        jobs = len(self._active_jobs)
        if self.queue_jobs is not None:
            return jobs >= self.queue_jobs
        if jobs > state.workers:
            return True
        if jobs == 0 or not self.uses_cached_stages:
            return False
        cached = state.cached_stages
        return cached is None or self._unstarted_loads.keys() <= cached  # a C loop

    def pick(self, state: SchedulerState) -> str | None:
        free_bytes = state.ledger.free_bytes()
        if self.job_order and self._job_order_engaged(state):
            chosen = self._pick_by_job(state, free_bytes)
            if chosen is not None:
                return chosen
        exec_top = _valid_top(state, self._execs)
        if exec_top is not None and exec_top[0] <= free_bytes:
            return heapq.heappop(self._execs)[-2]
        # First, as it moves LOADs of networks started meanwhile into self._loads.
        fresh_top = self._fresh_top(state) if self.admission else None
        load_top = _valid_top(state, self._loads)
        if state.cached_stages and self.uses_cached_stages:
            # Only when the smallest LOAD must read storage: where it is cached (every
            # stage is, where the page cache holds the store), smallest-first decides
            # as before, without the scan.
            smallest = min((e for e in (load_top, fresh_top) if e is not None), default=None)
            task = None if smallest is None else state.tasks[smallest[-2]].task
            if task is not None and (task.network, task.stage_id) not in state.cached_stages:
                chosen = self._pick_cached(state, free_bytes, load_top)
                if chosen is not None:
                    return chosen
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

    def _pick_cached(self, state: SchedulerState, free_bytes: int,
                     load_top: _Entry | None) -> str | None:
        """The smallest ready LOAD of a cached stage that may start now (a network's
        first LOAD keeps room for the smallest LOAD of the started ones, as
        admission does); None if there is none. Costs O(cached stages with ready
        LOADs), not O(ready tasks); called only when the smallest LOAD is not cached."""
        cached = state.cached_stages
        assert cached is not None
        by_stage = self._loads_by_stage
        smaller, larger = (by_stage, cached) if len(by_stage) <= len(cached) else (cached, by_stage)
        stages = [stage for stage in smaller if stage in larger]
        candidates = []
        for stage in stages:
            top = _valid_top(state, by_stage[stage])
            if top is None:
                del by_stage[stage]
            else:
                candidates.append((top, stage))
        for top, stage in sorted(candidates):
            task_id = top[-2]
            fresh = (self.admission
                     and state.groups[state.tasks[task_id].task.group].started_count == 0)
            reserve_bytes = 0 if not fresh or load_top is None else load_top[0]
            if self._load_fits(state, task_id, top[0], free_bytes, reserve_bytes):
                heapq.heappop(by_stage[stage])
                self.cached_loads_ahead += 1  # the smallest LOAD is uncached: this one is larger
                return task_id
        return None

    def stats(self) -> dict[str, int]:
        """For the report: LOADs of cached stages started before a smaller one."""
        return {"cached_loads_ahead": self.cached_loads_ahead} if self.uses_cached_stages else {}

    def _pick_by_job(self, state: SchedulerState, free_bytes: int) -> str | None:
        """The EXEC, else the LOAD, of the most urgent job that has one, if it fits
        (admission and headroom kept); None: let the footprint order decide."""
        exec_top = _valid_top(state, self._execs_by_job)
        if exec_top is not None and exec_top[1] <= free_bytes:
            return heapq.heappop(self._execs_by_job)[-2]
        load_top = _valid_top(state, self._loads_by_job)
        if load_top is None:
            return None
        task_id = load_top[-2]
        reserve_bytes = 0
        if self.admission and state.groups[state.tasks[task_id].task.group].started_count == 0:
            self._fresh_top(state)
            continuing = _valid_top(state, self._loads)
            reserve_bytes = 0 if continuing is None else continuing[0]
        if self._load_fits(state, task_id, load_top[1], free_bytes, reserve_bytes):
            return heapq.heappop(self._loads_by_job)[-2]
        return None

    def _load_fits(self, state: SchedulerState, task_id: str, footprint: int,
                   free_bytes: int, reserve_bytes: int) -> bool:
        """Whether a LOAD may start now, with `reserve_bytes` kept free besides it."""
        if footprint + reserve_bytes > free_bytes:
            return False
        info = state.tasks[task_id]
        if self.read_ahead_bytes is not None and self._ahead_bytes and (
                self._ahead_bytes + _resident_bytes(info) > self.read_ahead_bytes):
            return False
        if not self.headroom:
            return True
        # The EXECs of loaded stages (and this LOAD's own) must still find room
        # once the running LOADs end and hand back their transient direct memory;
        # otherwise loads fill memory to the brim and no EXEC can ever start.
        # Each of those EXECs may leave its outputs held beyond the weights it frees
        # (an early conv layer: small weights, a large activation) before the largest
        # one runs, so their growth is kept too, this LOAD's own EXEC's included.
        own_need_bytes, own_growth_bytes = self._own_needs(state, task_id)
        need = (max(self._exec_need(state), own_need_bytes)
                + self._pending_growth_bytes + own_growth_bytes)
        returning = self._running_load_direct_bytes + info.task.memory_bytes
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
