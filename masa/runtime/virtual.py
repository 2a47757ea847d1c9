"""Simulated execution: the driver's loop on a virtual integer clock.

This module owns the virtual-time backend. Time is an integer number of
microseconds; a task runs for exactly its `duration_us`; waiting jumps the
clock to the next completion or release. Nothing here reads a clock or draws
a random number, so a run is a pure function of its inputs. The event loop
itself (arrivals, the core's side effects, context hooks, over-commits) is
masa.runtime.driver's, shared with the real executor.

With a `DeviceModel` (issue 12) the clock also knows a small device's storage
and memory (`DeviceBackend`): a LOAD takes its profiled (warm) time (times the
device's CPU factor, or its network's, as does an EXEC; times a multiplier
again for a task that starts beside a running one, or, with
`shared_cpu_while_running`, for the part of its work done beside another, a
LOAD's own multiplier beside a LOAD or an EXEC where the device has one) plus the
bytes of its stage files that are not in the simulated page cache divided by
the storage's read bandwidth, after the reads queued before it (one storage,
first come first served); the page cache is an LRU of stage files' bytes (a
file may stay partly cached, as the kernel reclaims pages, not files) whose
room is the memory cap less the runtime's base and the anonymous memory held
(the ledger's reservations less the loaded stages' mapped weight pages, which
stay pinned in the cache while loaded); mapped pages that do not fit are read
again by their EXEC (a thrash); and the run is predicted killed at the first
moment the runtime's base plus the anonymous memory (with the run's records of
its ended tasks, which grow as it goes) exceeds the cap, with the jobs that
finished before it. A LOAD that reads from storage holds its direct
memory (its peak above the stage's resident bytes: the parsed file beside the
session's copy) only once its read has ended: while the file streams in, the
buffer it fills is at most the resident bytes its lock already counts, and with
one storage two LOADs' reads never overlap, so their peaks rarely coincide.
"""

from __future__ import annotations

import gc
import heapq
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from masa.runtime.driver import Completion, Driver, GroupEndHook, Recorder
from masa.sched.core import (
    GroupStatus,
    OverCommit,
    Policy,
    SchedulerState,
    gate_group,
    kept_stats,
    new_state,
    set_cached_stages,
)
from masa.sched.core import unfinished_task_ids as _unfinished
from masa.sched.policies import MasaPolicy
from masa.sched.taskgraph import Lock, ScheduledTask, Task, TaskGraph, TaskKind


class VirtualBackend:
    """Tasks take their profiled durations on a clock that jumps from event to event.

    failing_task_ids: tasks that fail when they end (fault injection for tests).
    """

    def __init__(self, failing_task_ids: Iterable[str] = ()) -> None:
        self.failing = frozenset(failing_task_ids)
        self.clock_us = 0
        self._finishes: list[tuple[int, int, str]] = []  # (end_us, sequence, task_id)
        self._sequence = 0
        self._entry_of: dict[str, int] = {}  # task id -> sequence of its live heap entry
        self._running: set[str] = set()
        self._reusing: set[str] = set()  # LOADs told to take a kept stage: they take no time

    def now_us(self) -> int:
        return self.clock_us

    def start(self, task: Task, worker: int) -> None:
        self._running.add(task.task_id)
        reused = task.task_id in self._reusing
        self._reusing.discard(task.task_id)
        self._push_finish(self.clock_us + (0 if reused else task.duration_us), task.task_id)

    def reuse_loaded(self, task: Task) -> None:
        self._reusing.add(task.task_id)

    def _push_finish(self, end_us: int, task_id: str) -> None:
        """The task's (new) completion time; an entry pushed before for it goes stale."""
        self._sequence += 1
        self._entry_of[task_id] = self._sequence
        heapq.heappush(self._finishes, (end_us, self._sequence, task_id))

    def _live(self, entry: tuple[int, int, str]) -> bool:
        return entry[2] in self._running and self._entry_of.get(entry[2]) == entry[1]

    def terminate(self, task_ids: Sequence[str]) -> list[Completion]:
        """Stopped tasks end at this very instant (their heap entries go stale)."""
        stopped = [task_id for task_id in task_ids if task_id in self._running]
        self._running.difference_update(stopped)
        for task_id in stopped:
            self._entry_of.pop(task_id, None)
        return [Completion(task_id, self.clock_us, ok=False) for task_id in stopped]

    def _next_event_us(self, deadline_us: int | None) -> int | None:
        """When the clock jumps to next: the first live completion or the deadline."""
        finishes = self._finishes
        while finishes and not self._live(finishes[0]):
            heapq.heappop(finishes)  # stopped earlier, or its end moved
        upcoming = finishes[0][0] if finishes else None
        if upcoming is None or deadline_us is None:
            return upcoming if deadline_us is None else deadline_us
        return min(upcoming, deadline_us)

    def wait(self, deadline_us: int | None) -> list[Completion]:
        target = self._next_event_us(deadline_us)
        if target is None:
            return []
        finishes = self._finishes
        self.clock_us = max(self.clock_us, target)
        done: list[Completion] = []
        while finishes and finishes[0][0] <= self.clock_us:
            entry = heapq.heappop(finishes)
            if self._live(entry):
                self._running.discard(entry[2])
                del self._entry_of[entry[2]]
                done.append(Completion(entry[2], self.clock_us, ok=entry[2] not in self.failing))
        return done

    # Nothing to wake, measure, load or free in virtual time.
    def wake(self) -> None: ...
    def before_select(self, state: SchedulerState) -> None: ...
    def measured_bytes(self) -> int | None:
        return None
    def task_ended(self, task: Task, ok: bool, group_active: bool) -> None: ...
    def lock_released(self, lock: Lock, opener: Task) -> None: ...
    def keep_loaded(self, lock: Lock, opener: Task) -> None: ...
    def evict_loaded(self, stage: tuple[str, str]) -> None: ...
    def group_ended(self, group: str, status: GroupStatus) -> None: ...
    def discard_outputs(self, group: str) -> None: ...
    def job_ended(self, job_id: int) -> None: ...
    def upstream_outputs(self, job_id: int) -> Mapping[str, Mapping[str, Any]]:
        return {}



# ------------------------------------------------------------------ a device


@dataclass(frozen=True)
class StageStorage:
    """What a stage costs the device's storage and page cache."""

    file_bytes: int  # its files (graph and weights), read by a cold LOAD
    mapped_bytes: int = 0  # of its resident bytes, file-backed weight pages (zero-copy)


@dataclass(frozen=True)
class DeviceModel:
    """A small device as the simulator sees it (masa.runtime.device, plus measured figures)."""

    memory_cap_bytes: int
    runtime_base_bytes: int  # the process's own memory before any job
    read_bytes_per_s: int | None  # None: storage costs nothing
    stages: Mapping[tuple[str, str], StageStorage]  # (network, stage id) -> storage
    cold_cache: bool = True
    # The device's CPU time per profiled CPU time (a slower core, or a machine shared
    # with other work): scales EXECs and the LOADs' parse/setup time.
    cpu_factor: float = 1.0
    # Per network, its tasks' time per profiled time on the device: a profile can be
    # off by a different amount for each network (small stages pay more fixed cost
    # per run). A network named here takes its factor instead of cpu_factor.
    cpu_factor_by_network: Mapping[str, float] = field(default_factory=dict)
    # Per network, its LOADs' time per profiled LOAD time where it is not the factor
    # above: the profiler times a session's creation alone, a run's LOAD also maps
    # and locks the file and hands the session to its worker (1.7-3.9 ms more per
    # stage on this host, 1.6-4.0x the network's EXEC factor: docs/bench-device.md).
    load_cpu_factor_by_network: Mapping[str, float] = field(default_factory=dict)
    # A task that starts while another runs takes this much longer again: cores that
    # share caches and memory bandwidth, or a host's hyperthreads, run two tasks at
    # once slower than one alone. The factors above are then times alone.
    shared_cpu_multiplier: float = 1.0
    # Whether that multiplier holds while another task runs (a task's remaining CPU
    # time stretches when a second task starts beside it and shrinks back when that
    # ends) rather than for the whole task when another runs as it starts.
    shared_cpu_while_running: bool = False
    # With shared_cpu_while_running, a LOAD's own multipliers beside another LOAD and
    # beside an EXEC (None: shared_cpu_multiplier). A LOAD creates a session (maps its
    # file, faults pages in and locks them: kernel work for the whole process); traced,
    # one beside another LOAD took about 2.2x its time alone (docs/bench-contention.md,
    # "LOADs beside each other"); benchmarks/fit_load_multipliers.py fits the rest.
    load_beside_load_multiplier: float | None = None
    load_beside_exec_multiplier: float | None = None
    # The anonymous memory the run keeps per ended task until its end (a batch run's
    # records of it for the report: masa.runtime.device.RUN_RECORD_BYTES_PER_TASK);
    # the runtime's base is measured before the first job, without them.
    record_bytes_per_task: int = 0
    # The executor's own time per task: from a task's end to the next start on its
    # worker (the completion's hand-off, the loop's decision, freeing the task's
    # memory), measured as the mean gap between tasks on a busy worker. The worker
    # is held that long after each task; the task's recorded end is not moved.
    dispatch_us: int = 0

    def cpu_us(self, duration_us: int, running_tasks: int, network: str = "",
               load: bool = False) -> int:
        """A task's CPU time on the device: its profiled time x its network's factor
        (a LOAD's own factor if it has one, else cpu_factor), x shared_cpu_multiplier
        when other tasks run as it starts (`running_tasks` counts itself)."""
        factor = self.cpu_factor_by_network.get(network, self.cpu_factor)
        if load:
            factor = self.load_cpu_factor_by_network.get(network, factor)
        if running_tasks > 1:
            factor *= self.shared_cpu_multiplier
        return round(duration_us * factor)

    def beside_multiplier(self, load: bool, beside_load: bool) -> float:
        """A task's multiplier while another runs: a LOAD's own where set (beside a LOAD
        when any task beside it is one), else shared_cpu_multiplier."""
        if load:
            own = (self.load_beside_load_multiplier if beside_load
                   else self.load_beside_exec_multiplier)
            if own is not None:
                return own
        return self.shared_cpu_multiplier

    def read_us(self, read_bytes: int) -> int:
        if not self.read_bytes_per_s or read_bytes <= 0:
            return 0
        return -(-read_bytes * 1_000_000 // self.read_bytes_per_s)


@dataclass
class DeviceOutcome:
    """What the device did in a simulated run (bytes; times in virtual microseconds)."""

    killed_at_us: int | None = None  # the predicted out-of-memory kill
    jobs_finished_before_kill: list[tuple[int, int]] = field(default_factory=list)
    bytes_read: int = 0  # from storage: LOAD misses and EXEC re-reads
    thrash_bytes: int = 0  # of which mapped pages read again by an EXEC
    load_hits: int = 0  # LOADs whose files were all in the page cache
    load_misses: int = 0
    # The LOADs' stage files, and the bytes of them in the page cache at their start
    # (a real run measures the same: RealRunResult.stage_file_bytes_cached_at_load).
    stage_file_bytes_loaded: int = 0
    stage_file_bytes_cached_at_load: int = 0
    peak_anonymous_bytes: int = 0  # base + anonymous reservations
    peak_page_cache_bytes: int = 0


class _PageCache:
    """An LRU of stage files' bytes; loaded zero-copy stages are pinned (their pages
    are mapped). Eviction takes a file's bytes, not the whole file: the kernel
    reclaims pages, so the least recently used file may stay partly cached."""

    def __init__(self) -> None:
        self.files: OrderedDict[tuple[str, str], int] = OrderedDict()  # key -> cached bytes
        self.pins: dict[tuple[str, str], int] = {}
        self.cached_bytes = 0
        self.whole: set[tuple[str, str]] = set()  # files wholly cached (cached_stages)

    def missing_bytes(self, key: tuple[str, str], size: int) -> int:
        return max(0, size - self.files.get(key, 0))

    def touch(self, key: tuple[str, str], size: int) -> None:
        self.cached_bytes += size - self.files.pop(key, 0)
        self.files[key] = size
        self.whole.add(key)

    def use(self, key: tuple[str, str]) -> None:
        """A LOAD uses the file's cached part: the most recently used now."""
        if key in self.files:
            self.files.move_to_end(key)

    def fill(self, key: tuple[str, str], read_bytes: int, size: int) -> None:
        """Bytes read from storage enter the cache, the most recently used."""
        before = self.files.pop(key, 0)
        cached = min(size, before + read_bytes)
        self.cached_bytes += cached - before
        self.files[key] = cached
        if cached == size:
            self.whole.add(key)

    def shrink_to(self, room_bytes: int) -> None:
        """Evict unpinned files' bytes, least recently used first, until they fit
        `room_bytes`."""
        for key in list(self.files):
            excess = self.cached_bytes - room_bytes
            if excess <= 0:
                return
            if self.pins.get(key):
                continue
            evicted = min(excess, self.files[key])
            self.cached_bytes -= evicted
            self.whole.discard(key)
            if evicted == self.files[key]:
                del self.files[key]
            else:
                self.files[key] -= evicted


class DeviceBackend(VirtualBackend):
    """The virtual clock on a `DeviceModel`: LOADs wait for storage, memory may kill."""

    def __init__(self, device: DeviceModel, failing_task_ids: Iterable[str] = ()) -> None:
        super().__init__(failing_task_ids)
        self.device = device
        self.outcome = DeviceOutcome()
        self.cache = _PageCache()
        self.mapped_loaded_bytes = 0
        self.storage_free_us = 0  # the storage reads one LOAD's misses at a time
        # Started since the last wait: (task id, network, a LOAD?, profiled us,
        # storage us).
        self._starting: list[tuple[str, str, bool, int, int]] = []
        # LOADs still reading from storage: task id -> (read end, direct bytes not
        # yet in use; the ledger reserves them from the start).
        self._reading: dict[str, tuple[int, int]] = {}
        # With shared_cpu_while_running: running task id -> (when its CPU work
        # begins, its CPU time left alone, us), as of `_progress_us`.
        self._cpu_left: dict[str, tuple[int, float]] = {}
        self._loading: set[str] = set()  # of those, the LOADs
        self._progress_us = 0
        # Stage files being read: key -> (read end, bytes). They enter the page cache
        # when the read ends, not when it starts: until then the kernel has not
        # had to evict anything for them, and a LOAD starting meanwhile finds its
        # own file as cached as it was.
        self._filling: dict[tuple[str, str], tuple[int, int]] = {}
        self._state: SchedulerState | None = None
        self._ended_at_us: dict[str, int] = {}  # a task's end, before the dispatch time
        self._handed_over: set[str] = set()  # LOADs that took a kept stage, not yet ended
        self._records_bytes = 0  # the run's records of its ended tasks
        if not device.cold_cache:
            for key, storage in device.stages.items():
                self.cache.touch(key, storage.file_bytes)

    def _storage(self, task: Task) -> tuple[tuple[str, str], StageStorage]:
        key = (task.network, task.stage_id)
        return key, self.device.stages.get(key, StageStorage(0))

    def _reserved_anonymous_bytes(self) -> int:
        """The runtime's base and the run's records of its ended tasks, plus the
        ledger's reservations less the mapped weight pages of loaded stages."""
        reserved = self._state.ledger.reserved_bytes if self._state is not None else 0
        return (self.device.runtime_base_bytes + self._records_bytes
                + max(0, reserved - self.mapped_loaded_bytes))

    def _anonymous_bytes(self, at_us: int) -> int:
        """The anonymous memory in use at `at_us` with today's reservations: less the
        direct memory of LOADs whose read has not ended by then."""
        not_yet = sum(direct for read_end_us, direct in self._reading.values()
                      if read_end_us > at_us)
        return max(self.device.runtime_base_bytes + self._records_bytes,
                   self._reserved_anonymous_bytes() - not_yet)

    def _room_bytes(self) -> int:
        """The page cache's room: the cap less every reservation. (Giving it a
        reading LOAD's direct memory too, until the read ends, made the calibrated
        simulation of mixed at 1 GiB with copied weights 15% optimistic for Masa.)"""
        return max(0, self.device.memory_cap_bytes - self._reserved_anonymous_bytes())

    def start(self, task: Task, worker: int) -> None:
        key, storage = self._storage(task)
        extra_us = 0
        if task.task_id in self._reusing:  # a kept stage: no read, no CPU, its pin kept
            # nor the dispatch time: the real executor ends it on the loop's thread,
            # without handing it to a worker
            self._reusing.discard(task.task_id)
            self._handed_over.add(task.task_id)
            self._running.add(task.task_id)
            self._starting.append((task.task_id, task.network, True, 0, 0))
            return
        if task.kind is TaskKind.LOAD:
            self._fill_until(self.clock_us)
            read_end_us, in_flight = self._filling.get(key, (0, 0))
            missing = max(0, self.cache.missing_bytes(key, storage.file_bytes) - in_flight)
            if self.outcome.killed_at_us is None:  # what the run did before its kill
                self.outcome.bytes_read += missing
                self.outcome.load_misses += bool(missing)
                self.outcome.load_hits += not missing
                self.outcome.stage_file_bytes_loaded += storage.file_bytes
                self.outcome.stage_file_bytes_cached_at_load += storage.file_bytes - missing
            extra_us = self._queued_read_us(self.device.read_us(missing))
            if in_flight:  # another LOAD reads the same file: wait for its read
                extra_us = max(extra_us, read_end_us - self.clock_us)
            if extra_us and task.memory_bytes:
                self._reading[task.task_id] = (self.clock_us + extra_us, task.memory_bytes)
            self.cache.use(key)
            if missing:
                self._filling[key] = (self.clock_us + extra_us, in_flight + missing)
            self._pin((key, storage), 1)
        elif storage.mapped_bytes:
            extra_us = self._queued_read_us(self.device.read_us(self._reread_bytes(storage)))
        self._running.add(task.task_id)
        # Its end is set at the next wait, once every task of this decision has
        # started: tasks dispatched together share the CPU alike.
        self._starting.append((task.task_id, task.network, task.kind is TaskKind.LOAD,
                               task.duration_us, extra_us))

    def terminate(self, task_ids: Sequence[str]) -> list[Completion]:
        self._progress(self.clock_us)
        for task_id in task_ids:
            self._ended_at_us.pop(task_id, None)
            self._reading.pop(task_id, None)
            self._cpu_left.pop(task_id, None)
            self._loading.discard(task_id)
            self._handed_over.discard(task_id)
        stopped = super().terminate(task_ids)
        if self.device.shared_cpu_while_running:
            self._move_ends()
        return stopped

    def wait(self, deadline_us: int | None) -> list[Completion]:
        if self.device.shared_cpu_while_running:
            done = self._wait_sharing(deadline_us)
        else:
            running = len(self._running)
            for task_id, network, load, duration_us, extra_us in self._starting:
                if task_id in self._running:
                    cpu_us = self.device.cpu_us(duration_us, running, network, load)
                    self._end_at(task_id, self.clock_us + cpu_us + extra_us)
            self._starting.clear()
            self._reads_end_before(self._next_event_us(deadline_us))
            done = super().wait(deadline_us)
        if not self._ended_at_us:
            return done
        return [replace(c, end_us=self._ended_at_us.pop(c.task_id, c.end_us)) for c in done]

    def _end_at(self, task_id: str, end_us: int) -> None:
        """The task's work ends at `end_us`; its worker is free the dispatch time later
        (at once for a LOAD that took a kept stage)."""
        if task_id in self._handed_over:
            self._handed_over.discard(task_id)
            self._push_finish(end_us, task_id)
            return
        if self.device.dispatch_us:
            self._ended_at_us[task_id] = end_us
        self._push_finish(end_us + self.device.dispatch_us, task_id)

    def _wait_sharing(self, deadline_us: int | None) -> list[Completion]:
        """`wait` where the multiplier holds while tasks run side by side: each running
        task's remaining CPU time (alone) is brought up to date and its end moved
        whenever the number of running tasks changes."""
        self._progress(self.clock_us)
        for task_id, network, load, duration_us, extra_us in self._starting:
            if task_id in self._running:  # its CPU work begins after its storage wait
                self._cpu_left[task_id] = (self.clock_us + extra_us, float(
                    self.device.cpu_us(duration_us, 1, network, load)))
                if load:
                    self._loading.add(task_id)
        self._starting.clear()
        self._move_ends()
        self._reads_end_before(self._next_event_us(deadline_us))
        done = super().wait(deadline_us)
        if done:
            self._progress(self.clock_us)
            for completion in done:
                self._cpu_left.pop(completion.task_id, None)
                self._loading.discard(completion.task_id)
            self._move_ends()
        return done

    def _progress(self, to_us: int) -> None:
        """The running tasks' CPU work done since the last update, each at the rate the
        tasks running beside it set meanwhile (`_slowdown`)."""
        for task_id, (cpu_start_us, left_us) in self._cpu_left.items():
            begin_us = max(self._progress_us, cpu_start_us)
            if to_us > begin_us:
                rate = 1.0 / self._slowdown(task_id)
                self._cpu_left[task_id] = (cpu_start_us, left_us - (to_us - begin_us) * rate)
        self._progress_us = to_us

    def _move_ends(self) -> None:
        """Each running task's end at the rate the tasks running now set (`_slowdown`; a
        task whose work has ended keeps its end: only its dispatch time is left)."""
        for task_id, (cpu_start_us, left_us) in self._cpu_left.items():
            if left_us < 0.5 and task_id in self._entry_of:
                continue
            self._end_at(task_id, max(self.clock_us, cpu_start_us)
                         + round(max(0.0, left_us) * self._slowdown(task_id)))

    def _slowdown(self, task_id: str) -> float:
        """How much slower the running task works now: 1 alone, else its multiplier
        beside the others (`DeviceModel.beside_multiplier`)."""
        if len(self._cpu_left) < 2:
            return 1.0
        if task_id not in self._loading:  # an EXEC's multiplier is the same beside either
            return self.device.shared_cpu_multiplier
        beside_load = any(other in self._loading for other in self._cpu_left
                          if other != task_id)
        return self.device.beside_multiplier(True, beside_load)

    def _reads_end_before(self, next_event_us: int | None) -> None:
        """Until the next event nothing is reserved or freed, but LOADs whose read
        ends before it start to use their direct memory: memory grows at each of
        those moments, so the cap is checked there; and the files they read enter
        the page cache then, evicting what no longer fits."""
        if next_event_us is None:
            return
        ending = sorted({read_end_us for read_end_us, _ in self._reading.values()
                         if self.clock_us < read_end_us < next_event_us}
                        | {read_end_us for read_end_us, _ in self._filling.values()
                           if read_end_us <= next_event_us})
        for read_end_us in ending:
            self._fill_until(read_end_us)
            self._check_memory(read_end_us)
        self._reading = {task_id: read for task_id, read in self._reading.items()
                         if read[0] >= next_event_us}

    def _fill_until(self, at_us: int) -> None:
        """The stage files whose read has ended by `at_us` enter the page cache."""
        for key, (read_end_us, read_bytes) in sorted(self._filling.items(),
                                                    key=lambda item: item[1][0]):
            if read_end_us <= at_us:
                del self._filling[key]
                self.cache.fill(key, read_bytes, self.device.stages[key].file_bytes)

    def _queued_read_us(self, read_us: int) -> int:
        """The wait for the storage (one read at a time, first come first served, as
        behind one throttle) plus the read itself."""
        if read_us <= 0:
            return 0
        begin_us = max(self.clock_us, self.storage_free_us)
        self.storage_free_us = begin_us + read_us
        return self.storage_free_us - self.clock_us

    def _reread_bytes(self, storage: StageStorage) -> int:
        """An EXEC of a zero-copy stage reads again its share of the mapped pages
        that the room left for the page cache cannot hold (pro rata)."""
        pinned = self.mapped_loaded_bytes
        excess = pinned - self._room_bytes()
        if excess <= 0 or pinned <= 0:
            return 0
        reread = storage.mapped_bytes * excess // pinned
        if self.outcome.killed_at_us is None:
            self.outcome.bytes_read += reread
            self.outcome.thrash_bytes += reread
        return reread

    def before_select(self, state: SchedulerState) -> None:
        self._state = state
        if state.cached_stages is None and getattr(state.policy, "uses_cached_stages", False):
            set_cached_stages(state, self.cache.whole)  # the same set, kept up to date

    def measured_bytes(self) -> int | None:
        """Called after every dispatch: a moment memory grows. Checks the cap."""
        self._check_memory(self.clock_us)
        return None

    def _check_memory(self, at_us: int) -> None:
        anonymous = self._anonymous_bytes(at_us)
        outcome = self.outcome
        self.cache.shrink_to(self._room_bytes())
        outcome.peak_anonymous_bytes = max(outcome.peak_anonymous_bytes, anonymous)
        outcome.peak_page_cache_bytes = max(outcome.peak_page_cache_bytes,
                                            self.cache.cached_bytes)
        if outcome.killed_at_us is None and anonymous > self.device.memory_cap_bytes:
            outcome.killed_at_us = at_us

    def task_ended(self, task: Task, ok: bool, group_active: bool) -> None:
        self._reading.pop(task.task_id, None)
        self._records_bytes += self.device.record_bytes_per_task

    def lock_released(self, lock: Lock, opener: Task) -> None:
        """A stage is unloaded when its LOAD's lock is released: its EXEC has ended, or
        will never run (its LOAD failed, its network was cancelled)."""
        if opener.kind is TaskKind.LOAD:
            self._pin(self._storage(opener), -1)

    def _pin(self, stage: tuple[tuple[str, str], StageStorage], delta: int) -> None:
        """A loaded (+1) or unloaded (-1) copy of a stage holds its mapped weights."""
        key, storage = stage
        if storage.mapped_bytes and (delta > 0 or self.cache.pins.get(key)):
            self.cache.pins[key] = self.cache.pins.get(key, 0) + delta
            self.mapped_loaded_bytes += delta * storage.mapped_bytes

    # A kept stage stays loaded, its LOAD's pin held (its lock is not released) until
    # its eviction; a LOAD that reuses it takes that pin over.
    def evict_loaded(self, stage: tuple[str, str]) -> None:
        self._pin((stage, self.device.stages.get(stage, StageStorage(0))), -1)

    def job_ended(self, job_id: int) -> None:
        if self.outcome.killed_at_us is None:
            self.outcome.jobs_finished_before_kill.append((job_id, self.clock_us))

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
    device: DeviceOutcome | None = None  # with a DeviceModel: storage, cache, the kill
    kept_stats: dict[str, int] = field(default_factory=dict)  # masa.sched.core.kept_stats


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
    device: DeviceModel | None = None,
) -> SimulationResult:
    """Run `graph` under a fresh `policy` object (default masa) on `workers` virtual
    workers; deterministic.

    gated_groups: groups whose tasks wait until a hook opens them (CA-wait).
    failing_task_ids: tasks that fail when they end (fault injection for tests).
    driver_options: further Driver arguments (e.g. a context controller).
    device: simulate on this device (DeviceBackend): storage, page cache, kills.
    """
    state = new_state(workers, memory_budget_bytes, policy or MasaPolicy())
    for group in gated_groups:
        gate_group(state, group)
    recorder = Recorder()
    backend = (VirtualBackend(failing_task_ids) if device is None
               else DeviceBackend(device, failing_task_ids))
    driver = Driver(state, backend, on_group_end=on_group_end,
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
        device=backend.outcome if isinstance(backend, DeviceBackend) else None,
        kept_stats=kept_stats(state),
    )
