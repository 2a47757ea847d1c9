"""The real executor: k worker threads running LOAD and EXEC tasks with ONNX Runtime.

This module owns worker threads, the wall clock and ONNX Runtime sessions. The
event loop is masa.runtime.driver's, the same as the simulator's; this backend
only carries dispatches out and reports completions:

- `start` hands a task to its worker's queue; `wait` blocks on the completion
  queue until a task ends, a job is submitted or the next arrival is due (no
  polling);
- a LOAD creates the stage's session (model_prep.session.load_stage_locked:
  its mapped weights read in and locked in memory until the unload, so that
  the page cache cannot drop them before the EXEC) and keeps it under
  (group, stage); an EXEC runs the stage on tensors of the
  job's tensor store, with its own RunOptions so that CA-preempt can stop it;
- a network instance's input tensors are made by the worker that runs its
  first EXEC, before the stage (the loop only hands it the upstream outputs a
  derived input needs, which exist by then): making them (random data, an
  image fitted to the input) takes a millisecond or two that would otherwise
  hold up every other dispatch and completion;
- when the core releases a lock the backend unloads the session (LOAD lock;
  its locked weights are unmapped once the decision's tasks have started,
  where the budget holds both, so that the next EXEC does not wait for it)
  or drops the stage's output tensors (EXEC lock); a network's final outputs
  are kept for the job's result first. Memory really returns: no handle to a
  session is kept elsewhere, and `release_memory` (malloc_trim) runs after
  unloads, unless the freed heap is within the run's slack
  (`default_heap_slack_bytes`).

Every run also measures the process's memory (`_ResidentMeter`): the baseline
at `begin()` (after ONNX Runtime's warm-up and `release_memory`, with the run's
task graph already in the scheduler state), the
anonymous / file-backed split of the resident memory at every decision and
every 2 ms in between (one read of /proc/self/statm), the loaded stages'
weights in memory (their data files' pages in the page cache, measured with
cachestat/mincore when each LOAD ends: mapped weights are held for the stage
from its LOAD on, whether or not its EXEC has touched them yet, and a memory
cgroup is charged for them), the kernel's exact peak (VmHWM, reset at
`begin()`) and, inside a memory cgroup, the cgroup's usage, peak and OOM kills
over the run. The run's measured memory is anonymous memory above the
baseline plus the loaded stages' weights in memory; VmHWM also holds the
library code the run pages in (ONNX Runtime's kernels), which belongs to the
runtime base.

With ``memory_source="measured"``, before every decision the free memory the
core sees is reduced by whatever the process holds (measured memory, as
above) beyond what is reserved (measured memory reconciles the model); that
reading is the decision's sample.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from masa.common.columns import IntRows
from masa.common.errors import one_line
from masa.common.libc import WORKER_THREAD_PREFIX, name_this_thread
from masa.common.procmem import (
    CgroupMeter,
    CgroupRunMemory,
    ResidentSplit,
    drop_cached,
    files_cached_bytes,
    find_memory_cgroup,
    page_cache_bytes,
    peak_rss_bytes,
    process_memory_bytes,
    read_cgroup_memory,
    reset_peak,
    resident_split,
)
from masa.runtime.driver import Completion, Driver, Observer, Recorder
from masa.runtime.pagecache import KeptFiles
from masa.runtime.registry import close_policy, make_policy, policy_stats, weights_copied
from masa.sched.context import ContextController, parse_group
from masa.sched.core import (
    GroupStatus,
    MemoryLedger,
    OverCommit,
    SchedulerState,
    kept_stats,
    new_state,
    set_cached_stages,
    unfinished_task_ids,
)
from masa.sched.taskgraph import Lock, ScheduledTask, Task, TaskGraph, TaskKind
from model_prep.manifest import NetworkManifest, Stage
from model_prep.session import (
    EXECUTOR_MMAP_THRESHOLD_BYTES,
    LockedPages,
    keep_freed_heap,
    load_stage_locked,
    pin_malloc_threshold,
    release_memory,
    warm_up,
)

log = logging.getLogger(__name__)

MEMORY_SOURCES = ("model", "measured")
# Real runs reconcile by default: the ledger's model misses what no profile sees
# (Python objects, heap not yet returned, per-session allocations of many live
# sessions), and the budget is a promise about the process.
DEFAULT_MEMORY_SOURCE = "measured"

# inputs_for(job_id, network, upstream_outputs) -> feeds of the network's inputs
InputsFor = Callable[[int, str, Mapping[str, Mapping[str, np.ndarray]]], dict[str, np.ndarray]]
# ... bound to one network instance, for the worker that makes them
MakeInputs = Callable[[], Mapping[str, np.ndarray]]
# An unloaded stage's mapped weights (data file, bytes in memory) and their lock
Unmap = tuple[tuple[str, int] | None, LockedPages | None]


# `default_heap_slack_bytes`: at most this much, and at most 1/64 of the budget.
HEAP_SLACK_MAX_BYTES = 4 * 2**20


def default_heap_slack_bytes(budget_bytes: int) -> int:
    """The freed heap a run keeps (RealRunConfig.heap_slack_bytes): min(4 MiB, budget /
    64), so what it takes from the budget the core sees stays small (with measured
    memory, the default, it counts there and the budget shrinks by it; with
    `memory_source="model"` the loop still trims after every unload and only
    free()'s own threshold keeps it). Returned after every unload instead,
    it is faulted in again by the next EXEC's allocations: in the light cell on the
    emulated 1 GiB device (bench_device.py's jobs, four runs each way) the loop spent
    12-17% less CPU with it, the workers 4-7% less, and Masa's mean response fell from
    2.3-3.1 s to 1.8-2.3 s. A daemon's request buffers (a 600 KB tensor read in
    256 KiB pieces) are reused instead of faulted in, ~1 ms of each request."""
    return min(HEAP_SLACK_MAX_BYTES, budget_bytes // 64)


@dataclass(frozen=True)
class RealRunConfig:
    workers: int
    memory_budget_bytes: int
    policy: str = "masa"
    memory_source: str = DEFAULT_MEMORY_SOURCE
    intra_op_threads: int = 1
    keep_outputs: bool = True  # keep every network's outputs in the result
    # masa-plan searches on a background thread (the loop never waits); False: inline,
    # deterministically, as in the simulator (tests compare the two dispatch orders)
    plan_in_background: bool = True
    # Freed heap the process may keep rather than return to the OS and fault in again
    # (`default_heap_slack_bytes`, what `masa run` and the daemon keep): free() keeps
    # up to this much at the heap's top, and the loop trims only above it. 0: trim
    # whenever something is unmodelled.
    heap_slack_bytes: int = 0
    read_ahead_bytes: int | None = None  # masa's read-ahead window (None: memory bounds it)
    keep_cached_bytes: int | None = None  # stage files kept cached (masa.runtime.pagecache)
    cache_first: bool = True  # masa's cached-stages-first rule (MasaPolicy)
    keep_loaded_bytes: int = 0  # loaded stages kept between jobs (masa.sched.core)


@dataclass
class RealRunResult:
    """What a real run did; times are microseconds from the run's start."""

    schedule: Sequence[ScheduledTask]  # a ScheduleLog: compact
    group_status: dict[str, str]  # done / failed / skipped / aborted / cancelled
    group_reason: dict[str, str]
    outputs: dict[str, dict[str, np.ndarray]]  # group -> output name -> array
    over_commits: list[OverCommit]
    peak_reserved_bytes: int
    final_reserved_bytes: int
    # (time_us, reserved, measured memory above the baseline or None)
    memory_timeline: Sequence[tuple[int, int, int | None]]  # IntRows: compact
    baseline_rss_bytes: int  # at begin(), after release_memory()
    peak_rss_bytes: int  # VmHWM when it could be reset at begin(), else the samples' peak
    live_sessions_after: int
    live_tensors_after: int
    dispatch_order: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # group -> first error
    error_details: dict[str, str] = field(default_factory=dict)  # group -> its traceback
    process_memory_after: dict[str, int] = field(default_factory=dict)  # procmem, by kind
    # Measured memory (bytes): the peak of anonymous memory above the baseline plus the
    # loaded stages' weights in memory, over the samples (decisions and every 2 ms).
    peak_measured_bytes: int = 0
    peak_measured_source: str = "samples"
    peak_stage_file_bytes: int = 0  # loaded stages' weights in memory, at most
    peak_rss_above_baseline_bytes: int = 0  # VmHWM (or the samples) less the baseline RSS
    baseline_anonymous_bytes: int = 0
    baseline_file_backed_bytes: int = 0
    peak_anonymous_bytes: int = 0  # sampled at decisions, above the baseline's anonymous
    peak_file_backed_bytes: int = 0  # sampled at decisions, above the baseline's file-backed
    # (time_us, anonymous_bytes, file_backed_bytes) at every sample, absolute
    resident_timeline: Sequence[tuple[int, int, int]] = field(default_factory=list)
    cgroup_memory: CgroupRunMemory | None = None  # None outside a memory cgroup
    stage_file_bytes_loaded: int = 0  # the LOADs' stage files (_Stages.load_file_bytes)
    stage_file_bytes_cached_at_load: int | None = None  # found in the page cache then
    policy_stats: dict[str, int] = field(default_factory=dict)  # registry.policy_stats
    # The signal that stopped the run (SIGINT, SIGTERM), None when it ran to its end.
    # The networks it did not finish then have the status "interrupted".
    interrupted: str | None = None
    # CPU time of the loop's thread over the run: its decisions, unloads, trims and
    # memory readings, the executor's own cost beside the workers' tasks.
    loop_cpu_us: int = 0

    def measured_memory(self) -> dict[str, Any]:
        """The measured figures under the report summary's names (masa.report.report)."""
        return {
            "peak_measured_bytes": self.peak_measured_bytes,
            "peak_measured_source": self.peak_measured_source,
            "peak_anonymous_bytes": self.peak_anonymous_bytes,
            "peak_file_backed_bytes": self.peak_file_backed_bytes,
            "peak_stage_file_bytes": self.peak_stage_file_bytes,
            "peak_rss_above_baseline_bytes": self.peak_rss_above_baseline_bytes,
            "baseline_rss_bytes": self.baseline_rss_bytes,
            "baseline_anonymous_bytes": self.baseline_anonymous_bytes,
            "baseline_file_backed_bytes": self.baseline_file_backed_bytes,
            "cgroup": None if self.cgroup_memory is None else self.cgroup_memory.as_dict(),
            "stage_file_bytes_loaded": self.stage_file_bytes_loaded,
            "stage_file_bytes_cached_at_load": self.stage_file_bytes_cached_at_load,
        }


# Between decisions, the meter samples this often while a task runs: an EXEC's
# working memory peaks inside the task, where no decision is taken (one statm
# read, ~10 us). With no task running it does not wake at all: an idle daemon's
# 500 wake-ups a second cost each HTTP request ~0.65 ms (measured on the POST of
# a 600 KB body, 2.8 -> 2.2 ms p50, three runs each on this 2-core machine).
SAMPLE_PERIOD_S = 0.002

# Memory the ledger does not model is read at every decision, but while tasks run
# their reservations (working memory not yet touched) hide it: measured minus
# reserved reads low, the core fills the budget, and the memory shows again when
# they end. The budget the core sees is shrunk by the largest reading of this
# window instead (measured: 1-2 MiB of one-off growth in a fresh process's first
# jobs that readings during execution missed; tests/test_fidelity.py).
UNMODELLED_WINDOW_US = 1_000_000

# masa's cached-stages-first rule (MasaPolicy) is told which stages' files are in
# the page cache: probed again at most this often, and only for a decision that can
# start a task (stat and cachestat of every stage file: 3.3 ms for the scale-1
# zoo's 119 stages, so at most 1.3% of the loop's thread; storage reads evict on a
# scale of seconds), and a stage whose LOAD ended counts as cached at once. A stage
# counts as cached when at most CACHED_MISSING_FRACTION of its files' bytes are
# missing (page rounding).
CACHE_PROBE_INTERVAL_US = 250_000
CACHED_MISSING_FRACTION = 0.01


class _ResidentMeter:
    """The process's memory over one run: the baseline split, the peaks of the split and
    of measured memory (anonymous above the baseline + the loaded stages' weights in
    memory) at every decision and every SAMPLE_PERIOD_S while a task runs, the kernel's
    exact RSS peak, the cgroup's figures."""

    def __init__(self, stage_file_bytes: Callable[[], int] = lambda: 0) -> None:
        self.stage_file_bytes = stage_file_bytes  # the loaded stages' weights in memory
        self.baseline = ResidentSplit(0, 0)
        self.peak_anonymous_bytes = 0  # absolute, like the two below
        self.peak_file_backed_bytes = 0
        self.peak_sampled_rss_bytes = 0
        self.peak_measured_bytes = 0  # above the baseline
        self.peak_stage_file_bytes = 0
        self.peak_kernel_rss_bytes: int | None = None  # VmHWM since begin(), when reset
        self.vmhwm_reset = False
        # (time_us, anonymous_bytes, file_backed_bytes) at every decision, in columns
        self.timeline = IntRows(3)
        self.cgroup: CgroupMeter | None = None
        self.cgroup_memory: CgroupRunMemory | None = None
        self._peaks_lock = threading.Lock()  # the sampler thread and the loop's thread
        self._stop_sampling = threading.Event()
        self._tasks_running = threading.Event()  # the sampler runs only while it is set
        self._sampler: threading.Thread | None = None

    def begin(self) -> None:
        """Reset the kernel's peaks, take the baseline (after release_memory), start sampling."""
        self.vmhwm_reset = reset_peak()
        cgroup = find_memory_cgroup()
        self.cgroup = None if cgroup is None else CgroupMeter(cgroup)
        if self.cgroup is not None:
            self.cgroup.begin()
        self.baseline = resident_split()
        self.peak_anonymous_bytes, self.peak_file_backed_bytes = self.baseline
        self.peak_sampled_rss_bytes = self.baseline.resident_bytes
        self.peak_measured_bytes = self.peak_stage_file_bytes = 0
        self.peak_kernel_rss_bytes = None
        self.timeline = IntRows(3)
        self._stop_sampling.clear()
        self._tasks_running.clear()
        self._sampler = threading.Thread(target=self._sample_periodically, daemon=True,
                                         name="masa-memory-sampler")
        self._sampler.start()

    @property
    def sampling(self) -> bool:
        """Whether the sampler wakes every SAMPLE_PERIOD_S (a task runs)."""
        return self._tasks_running.is_set()

    def tasks_running(self, running: bool) -> None:
        """Whether a task runs: memory can change between decisions only then."""
        if running:
            self._tasks_running.set()
        else:
            self._tasks_running.clear()

    def _sample_periodically(self) -> None:
        name_this_thread("masa-sampler")
        while True:
            self._tasks_running.wait()
            if self._stop_sampling.wait(SAMPLE_PERIOD_S):
                return
            self._measure()

    def _measure(self) -> tuple[ResidentSplit, int]:
        """The resident split now, and measured memory (anonymous above the baseline +
        the loaded stages' weights in memory)."""
        split = resident_split()
        stage_file_bytes = self.stage_file_bytes()
        measured_bytes = (max(0, split.anonymous_bytes - self.baseline.anonymous_bytes)
                          + stage_file_bytes)
        with self._peaks_lock:
            self.peak_anonymous_bytes = max(self.peak_anonymous_bytes, split.anonymous_bytes)
            self.peak_file_backed_bytes = max(self.peak_file_backed_bytes,
                                              split.file_backed_bytes)
            self.peak_sampled_rss_bytes = max(self.peak_sampled_rss_bytes, split.resident_bytes)
            self.peak_measured_bytes = max(self.peak_measured_bytes, measured_bytes)
            self.peak_stage_file_bytes = max(self.peak_stage_file_bytes, stage_file_bytes)
        return split, measured_bytes

    def sample(self, now_us: int) -> tuple[ResidentSplit, int]:
        """A decision's sample, kept in the timeline: the split and measured memory."""
        split, measured_bytes = self._measure()
        self.timeline.append((now_us, split.anonymous_bytes, split.file_backed_bytes))
        return split, measured_bytes

    def finish(self) -> None:
        """Stop sampling; read the peaks the kernel kept since begin() (workers done)."""
        self._stop_sampling.set()
        self._tasks_running.set()  # the sampler sees the stop
        if self._sampler is not None:
            self._sampler.join()
            self._sampler = None
        self._measure()
        if self.vmhwm_reset:
            self.peak_kernel_rss_bytes = peak_rss_bytes()
        if self.cgroup is not None:
            self.cgroup_memory = self.cgroup.finish()

    @property
    def peak_rss_bytes(self) -> int:
        return max(self.peak_sampled_rss_bytes, self.peak_kernel_rss_bytes or 0)

    def result_fields(self) -> dict[str, Any]:
        """RealRunResult's measured-memory fields."""
        baseline = self.baseline
        return {
            "baseline_rss_bytes": baseline.resident_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_measured_bytes": self.peak_measured_bytes,
            "peak_measured_source": "samples",
            "peak_stage_file_bytes": self.peak_stage_file_bytes,
            "peak_rss_above_baseline_bytes": max(0, self.peak_rss_bytes
                                                 - baseline.resident_bytes),
            "baseline_anonymous_bytes": baseline.anonymous_bytes,
            "baseline_file_backed_bytes": baseline.file_backed_bytes,
            "peak_anonymous_bytes": max(0, self.peak_anonymous_bytes
                                        - baseline.anonymous_bytes),
            "peak_file_backed_bytes": max(0, self.peak_file_backed_bytes
                                          - baseline.file_backed_bytes),
            "resident_timeline": self.timeline,
            "cgroup_memory": self.cgroup_memory,
        }


class _Stages:
    """Sessions and tensors of the running jobs. Touched by workers and the loop's thread."""

    def __init__(self, manifests: Mapping[str, NetworkManifest], intra_op_threads: int,
                 keep_cached_bytes: int | None = None):
        self.manifests = manifests
        self.intra_op_threads = intra_op_threads
        # Which unloaded stages' files stay cached (None: the kernel decides alone).
        self.kept_files = None if keep_cached_bytes is None else KeptFiles(keep_cached_bytes)
        # The LOADs' stage files, and the bytes of them found in the page cache at their
        # start (None: the page cache cannot be read here).
        self.load_file_bytes = 0
        self.load_cached_bytes: int | None = 0
        self.stages: dict[tuple[str, str], Stage] = {
            (name, stage.stage_id): stage
            for name, manifest in manifests.items() for stage in manifest.stages
        }
        self.sessions: dict[tuple[str, str], ort.InferenceSession] = {}
        self.tensors: dict[tuple[str, str], np.ndarray] = {}
        self.run_options: dict[str, ort.RunOptions] = {}
        # Loaded stages' mapped weights: data file and its bytes in memory, measured
        # when the LOAD ended.
        self.weights_in_memory: dict[tuple[str, str], tuple[str, int]] = {}
        # ... and locked in memory until the unload (model_prep.session.LockedPages).
        self.locked_weights: dict[tuple[str, str], LockedPages] = {}
        # Kept loaded stages (masa.sched.core, `keep_loaded_bytes`), by (network,
        # stage_id): the slot of each of the three dicts above, moved out of its job.
        self.kept: dict[tuple[str, str], tuple[ort.InferenceSession,
                                               tuple[str, int] | None, LockedPages | None]] = {}
        # Network instances whose inputs a worker is making: set when they are in the
        # tensor store (or will never be), for another EXEC of the instance reading them.
        self.inputs_pending: dict[str, threading.Event] = {}
        self.warned_unlocked = False
        self.lock = threading.Lock()

    def run_task(self, task: Task) -> None:
        stage = self.stages[(task.network, task.stage_id)]
        key = (task.group, task.stage_id)
        if task.kind is TaskKind.LOAD:
            manifest = self.manifests[task.network]
            path = manifest.stage_path(stage)
            self._count_found_cached(manifest.stage_files(stage))
            session, locked = load_stage_locked(path, stage.prepack, stage.mapped_bytes,
                                                self.intra_op_threads)
            # Mapped weights (not copied by prepacking) are the stage's from now on.
            data_path = f"{path}.data"
            mapped = bool(stage.loaded_mapped_bytes)
            in_memory_bytes = (page_cache_bytes(data_path) or 0) if mapped else 0
            if mapped and locked is None:
                self._warn_unlocked(data_path)
            with self.lock:
                self.sessions[key] = session
                if in_memory_bytes:
                    self.weights_in_memory[key] = (data_path, in_memory_bytes)
                if locked is not None:
                    self.locked_weights[key] = locked
            return
        if task.kind is not TaskKind.EXEC:
            raise RuntimeError(f"task {task.task_id}: the real executor has no {task.kind.value}")
        pending = self.inputs_pending.get(task.group)
        if pending is not None:  # another input reader of the instance makes them now
            pending.wait()
        with self.lock:
            session = self.sessions[key]
            feeds = {}
            for tensor in stage.inputs:
                value = self.tensors.get((task.group, tensor.name))
                if value is None:
                    raise RuntimeError(f"input tensor {tensor.name!r} of {task.task_id} "
                                       "is not available")
                feeds[tensor.name] = value
            options = self.run_options[task.task_id]
        names = [tensor.name for tensor in stage.outputs]
        values = session.run(names, feeds, run_options=options)
        with self.lock:
            for name, value in zip(names, values, strict=True):
                self.tensors[(task.group, name)] = value

    def inputs_coming(self, group: str) -> None:
        """A worker will make the instance's inputs (`put_inputs`); its other EXECs wait."""
        self.inputs_pending[group] = threading.Event()

    def put_inputs(self, group: str, feeds: Mapping[str, np.ndarray] | None) -> None:
        """The instance's inputs are made (None: they failed): into the tensor store,
        unless the instance was dropped meanwhile (they would stay there for good)."""
        with self.lock:
            pending = self.inputs_pending.pop(group, None)
            if pending is not None and feeds is not None:
                for name, value in feeds.items():
                    self.tensors[(group, name)] = value
        if pending is not None:
            pending.set()

    def _warn_unlocked(self, data_path: str) -> None:
        """Say once that weights go unlocked: a warning under a memory limit, where
        the kernel will reclaim them, a note elsewhere."""
        if self.warned_unlocked:
            return
        self.warned_unlocked = True
        cgroup = find_memory_cgroup()
        capped = cgroup is not None and read_cgroup_memory(cgroup).limit_bytes is not None
        log.log(logging.WARNING if capped else logging.INFO,
                "could not lock %s in memory (mlock: no CAP_IPC_LOCK and RLIMIT_MEMLOCK "
                "below its size; raise it with ulimit -l or LimitMEMLOCK=): under memory "
                "pressure a stage loaded ahead may read its weights from storage again in "
                "its EXEC", data_path)

    def release(self, opener: Task, unmap_later: list[Unmap] | None = None) -> bool:
        """Free what a lock opened by `opener` stood for; True when a session was unloaded.
        With `unmap_later`, its locked weights are unmapped by the caller (`unmap`)."""
        if opener.kind is TaskKind.LOAD:
            return self._unload((opener.group, opener.stage_id), unmap_later)
        with self.lock:
            stage = self.stages[(opener.network, opener.stage_id)]
            for tensor in stage.outputs:
                self.tensors.pop((opener.group, tensor.name), None)
        return False

    def cached_stage_keys(self) -> set[tuple[str, str]] | None:
        """The stages, as (network, stage_id), whose files are in the page cache now;
        None where the page cache cannot be read."""
        cached: set[tuple[str, str]] = set()
        for (network, stage_id), stage in self.stages.items():
            file_bytes, cached_bytes = files_cached_bytes(
                self.manifests[network].stage_files(stage))
            if cached_bytes is None:
                return None
            if file_bytes - cached_bytes <= CACHED_MISSING_FRACTION * file_bytes:
                cached.add((network, stage_id))
        return cached

    def _count_found_cached(self, paths: Sequence[Path]) -> None:
        """Count the LOAD's files and how much of them it finds in the page cache: the
        rest comes from storage (the simulator's DeviceBackend predicts the same)."""
        file_bytes, cached_bytes = files_cached_bytes(paths)
        with self.lock:
            self.load_file_bytes += file_bytes
            self.load_cached_bytes = (None if cached_bytes is None or self.load_cached_bytes
                                      is None else self.load_cached_bytes + cached_bytes)

    def _unload(self, key: tuple[str, str], unmap_later: list[Unmap] | None = None) -> bool:
        with self.lock:
            mapped = self.weights_in_memory.pop(key, None)
            locked = self.locked_weights.pop(key, None)
            unloaded = self.sessions.pop(key, None) is not None
        if unmap_later is None:
            self.unmap(mapped, locked)
        elif mapped is not None or locked is not None:
            unmap_later.append((mapped, locked))
        return unloaded

    def unmap(self, mapped: tuple[str, int] | None, locked: LockedPages | None) -> None:
        """A session is gone: its weights' pages are unlocked, and maybe dropped."""
        with self.lock:
            drop = (mapped is not None and self.kept_files is not None
                    and self.kept_files.unloaded(*mapped))
        if locked is not None:
            locked.unlock()  # outside the lock: unmapping a large locked file takes a while
        if mapped is not None and drop:
            drop_cached(mapped[0])  # pages another job's stage maps stay

    def keep(self, opener: Task) -> None:
        """The LOAD `opener`'s stage stays loaded, out of its job, until reused or evicted."""
        key = (opener.group, opener.stage_id)
        with self.lock:
            session = self.sessions.pop(key, None)
            if session is not None:
                self.kept[(opener.network, opener.stage_id)] = (
                    session, self.weights_in_memory.pop(key, None),
                    self.locked_weights.pop(key, None))

    def reuse(self, task: Task) -> bool:
        """The LOAD `task` takes its stage's kept session (and its mapped weights);
        False where none is kept here (the LOAD then loads the stage as any LOAD)."""
        key = (task.group, task.stage_id)
        with self.lock:
            entry = self.kept.pop((task.network, task.stage_id), None)
            if entry is None:
                return False
            session, mapped, locked = entry
            self.sessions[key] = session
            if mapped is not None:
                self.weights_in_memory[key] = mapped
            if locked is not None:
                self.locked_weights[key] = locked
        return True

    def evict(self, stage: tuple[str, str]) -> None:
        with self.lock:
            entry = self.kept.pop(stage, None)
        if entry is not None:
            mapped, locked = entry[1], entry[2]
            # The session goes first: pages it still maps cannot be dropped (unmap).
            del entry
            self.unmap(mapped, locked)

    def stage_file_bytes(self) -> int:
        """The loaded stages' mapped weights in memory, in bytes: a stage loaded by two
        jobs at once maps one file, held once."""
        with self.lock:
            kept = [mapped for _, mapped, _ in self.kept.values() if mapped is not None]
            return sum(dict([*self.weights_in_memory.values(), *kept]).values())

    def drop_group(self, group: str) -> None:
        with self.lock:
            loaded = [key for key in self.sessions if key[0] == group]
        for key in loaded:
            self._unload(key)
        with self.lock:
            pending = self.inputs_pending.pop(group, None)
            for key in [k for k in self.tensors if k[0] == group]:
                del self.tensors[key]
        if pending is not None:
            pending.set()


class ThreadBackend:
    """Worker threads on the wall clock; microseconds since `begin()`."""

    def __init__(self, manifests: Mapping[str, NetworkManifest], inputs_for: InputsFor,
                 config: RealRunConfig, clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.manifests = manifests
        self.inputs_for = inputs_for
        self.clock = clock
        self.stages = _Stages(manifests, config.intra_op_threads, config.keep_cached_bytes)
        # Completions from workers, and None to wake the loop for a submitted job.
        self.completions: queue.SimpleQueue[Completion | None] = queue.SimpleQueue()
        # A task, and what makes its network instance's inputs when it is their first
        # reader; None stops the worker.
        self.work_queues: list[queue.SimpleQueue[tuple[Task, MakeInputs | None] | None]] = [
            queue.SimpleQueue() for _ in range(config.workers)]
        self.threads: list[threading.Thread] = []
        self.outputs: dict[str, dict[str, np.ndarray]] = {}  # group -> final outputs
        self.inputs_ready: set[str] = set()
        self.start_s = clock()
        self.meter = _ResidentMeter(self.stages.stage_file_bytes)
        self.decision_measured_bytes: int | None = None  # taken by before_select
        # When the page cache is probed next for `cached_stages` (None: never again).
        self.cache_probe_due_us: int | None = 0
        self.cached_stages: set[tuple[str, str]] | None = None  # the state's, updated here
        self.pending_unload = False
        # Unloaded stages' locked weights, unmapped once this decision's tasks are on
        # their way (`lock_released`), their locks' bytes, and the ledger that decided.
        self.unmaps_due: list[Unmap] = []
        self.unmap_due_bytes = 0
        self.ledger: MemoryLedger | None = None
        self.reused: set[str] = set()  # LOADs told to take a kept stage (reuse_loaded)
        self.last_unmodelled_bytes: int | None = None  # at the last decision (measured)
        # Unmodelled memory a trim left (or less, read since with nothing running)
        self.unreturned_bytes = 0
        # (time_us, unmodelled bytes) of recent decisions, oldest first
        self.unmodelled_readings: collections.deque[tuple[int, int]] = collections.deque()

    # ------------------------------------------------------------ lifecycle

    @property
    def baseline_rss_bytes(self) -> int:
        return self.meter.baseline.resident_bytes

    @property
    def peak_rss_bytes(self) -> int:
        return self.meter.peak_rss_bytes

    def begin(self) -> None:
        # Large buffers (ONNX Runtime's activations) are mapped and returned when
        # freed, so they do not stay in a worker's heap arena after their run
        # (model_prep.session.EXECUTOR_MMAP_THRESHOLD_BYTES says what it costs).
        pin_malloc_threshold(EXECUTOR_MMAP_THRESHOLD_BYTES)
        if self.config.heap_slack_bytes:
            keep_freed_heap(self.config.heap_slack_bytes)
        # ONNX Runtime's one-time setup (libraries paged in, thread pools) is paid
        # before the baseline, so it is not counted as the run's memory.
        warm_up(self.config.intra_op_threads)
        release_memory()
        self.meter.begin()
        for index in range(self.config.workers):
            thread = threading.Thread(target=self._worker, args=(index,), daemon=True,
                                      name=f"{WORKER_THREAD_PREFIX}-{index}")
            thread.start()
            self.threads.append(thread)
        self.start_s = self.clock()

    def abandon(self) -> None:
        """Stop now (a signal): drop the tasks queued for the workers and terminate the
        running EXECs (ONNX Runtime stops at its next node); a running LOAD ends on its
        own. Their completions are never read."""
        for work in self.work_queues:
            while True:
                try:
                    work.get_nowait()
                except queue.Empty:
                    break
        with self.stages.lock:
            options = list(self.stages.run_options.values())
        for option in options:
            option.terminate = True

    def close(self) -> None:
        self._unmap_released()
        for work in self.work_queues:
            work.put(None)
        for thread in self.threads:
            thread.join()
        self.threads.clear()

    # ------------------------------------------------------------ Backend

    def now_us(self) -> int:
        return int((self.clock() - self.start_s) * 1e6)

    def start(self, task: Task, worker: int) -> None:
        if self.unmaps_due and (self.ledger is None or self.ledger.reserved_bytes
                                + self.unmap_due_bytes > self.ledger.budget_bytes):
            self._unmap_released()  # the budget cannot hold both: they go first
        if task.task_id in self.reused:  # its stage's kept session: nothing to do
            self.reused.discard(task.task_id)
            self.completions.put(Completion(task.task_id, self.now_us(), True))
            return
        make_inputs = None
        if task.kind is TaskKind.EXEC:
            make_inputs = self._inputs_maker(task.group)
            self.stages.run_options[task.task_id] = ort.RunOptions()
        self.meter.tasks_running(True)
        self.work_queues[worker].put((task, make_inputs))

    def terminate(self, task_ids: Sequence[str]) -> list[Completion]:
        """An EXEC stops at its next node boundary, a LOAD when it ends: both report later."""
        for task_id in task_ids:
            options = self.stages.run_options.get(task_id)
            if options is not None:
                options.terminate = True
        return []

    def wait(self, deadline_us: int | None) -> list[Completion]:
        self._unmap_released()
        if self.pending_unload:
            # Sessions are only referenced from the stage store: dropping them frees
            # them; trimming returns the pages without a gc pass.
            if not self._keeps_heap(self.last_unmodelled_bytes):
                release_memory(collect=False)
            self.pending_unload = False
        timeout_s = None if deadline_us is None else max(0.0, (deadline_us - self.now_us()) / 1e6)
        try:
            items = [self.completions.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:  # every completion already queued, before the next decision
            try:
                items.append(self.completions.get_nowait())
            except queue.Empty:
                break
        return [item for item in items if item is not None]

    def wake(self) -> None:
        self.completions.put(None)

    def before_select(self, state: SchedulerState) -> None:
        self.ledger = state.ledger
        if state.running_count == 0:
            self.meter.tasks_running(False)
        # Probed only when the decision can start a task: with every worker busy or
        # nothing waiting (an idle daemon), the answer would go unused.
        if (self.cache_probe_due_us is not None and state.free_workers
                and state.open_count > state.running_count
                and self.now_us() >= self.cache_probe_due_us):
            if getattr(state.policy, "uses_cached_stages", False):
                self.cached_stages = self.stages.cached_stage_keys()
                set_cached_stages(state, self.cached_stages)
                self.cache_probe_due_us = (None if self.cached_stages is None
                                           else self.now_us() + CACHE_PROBE_INTERVAL_US)
            else:
                self.cache_probe_due_us = None  # a policy that never asks
        if self.config.memory_source == "measured":
            # Shrink the budget the core sees by memory held outside its model. This
            # reading is also the decision's sample (measured_bytes), one statm read.
            unmodelled_bytes = self._unmodelled_bytes(state)
            if state.running_count == 0:
                self.unreturned_bytes = min(self.unreturned_bytes, unmodelled_bytes)
                if unmodelled_bytes and not self._keeps_heap(unmodelled_bytes):
                    # Nothing runs, so what the ledger does not hold is mostly heap
                    # that was freed but not returned: return it before it shrinks the
                    # budget (a task that no longer fits would run alone under the
                    # progress rule, over the real budget by as much).
                    release_memory(collect=False)
                    unmodelled_bytes = self._unmodelled_bytes(state)
                    self.unreturned_bytes = unmodelled_bytes
            state.ledger.budget_bytes = max(
                0, self.config.memory_budget_bytes - self._recent_unmodelled_bytes(
                    unmodelled_bytes))

    def _keeps_heap(self, unmodelled_bytes: int | None) -> bool:
        """Whether freed heap may stay rather than be trimmed: a slack is configured,
        memory was read, and the reading is within heap_slack_bytes above what the
        last trim could not return (live objects: a daemon's caches, its heap's
        fragments). Without that floor, a daemon whose heap grew by more than the
        slack in a burst would trim, and fault its request buffers in, on every job."""
        slack_bytes = self.config.heap_slack_bytes
        return (bool(slack_bytes) and unmodelled_bytes is not None
                and unmodelled_bytes <= self.unreturned_bytes + slack_bytes)

    def _recent_unmodelled_bytes(self, unmodelled_bytes: int) -> int:
        """The largest reading of unmodelled memory within UNMODELLED_WINDOW_US."""
        now_us = self.now_us()
        readings = self.unmodelled_readings
        while readings and readings[0][0] < now_us - UNMODELLED_WINDOW_US:
            readings.popleft()
        while readings and readings[-1][1] <= unmodelled_bytes:
            readings.pop()  # a smaller, older reading never is the window's largest
        readings.append((now_us, unmodelled_bytes))
        return readings[0][1]

    def _unmodelled_bytes(self, state: SchedulerState) -> int:
        """Measured memory beyond what the ledger reserves, from a new decision sample."""
        _, measured_bytes = self.meter.sample(self.now_us())
        self.decision_measured_bytes = measured_bytes
        self.last_unmodelled_bytes = max(0, measured_bytes - state.ledger.reserved_bytes)
        return self.last_unmodelled_bytes

    def measured_bytes(self) -> int | None:
        """Measured memory now, above the baseline: anonymous memory plus the loaded
        stages' weights in memory (the decision's sample when it took one). Not the
        resident set: that also holds the library code a run pages in (ONNX Runtime's
        kernels, clean file pages of the runtime base), reported apart as
        peak_rss_above_baseline_bytes."""
        measured_bytes = self.decision_measured_bytes
        self.decision_measured_bytes = None
        if measured_bytes is None:
            _, measured_bytes = self.meter.sample(self.now_us())
        return measured_bytes

    def task_ended(self, task: Task, ok: bool, group_active: bool) -> None:
        self.stages.run_options.pop(task.task_id, None)
        if ok and task.kind is TaskKind.LOAD and self.cached_stages is not None:
            self.cached_stages.add((task.network, task.stage_id))  # just read: cached
        if ok and task.kind is TaskKind.EXEC and group_active:
            self._collect_outputs(task)

    def lock_released(self, lock: Lock, opener: Task) -> None:
        # Unmapping a large stage's locked weights is slow (FaceNet's 144 MiB fc stage:
        # 0.6 ms alone; in a traced run its next EXEC started 3.8 ms after it): the
        # session goes now, its weights once the decision's tasks have started, where
        # the budget holds both (`start` unmaps first where it does not). ctypes
        # releases the GIL for munmap, so the started worker runs meanwhile.
        due = len(self.unmaps_due)
        if self.stages.release(opener, self.unmaps_due):
            self.pending_unload = True
        if len(self.unmaps_due) > due:
            self.unmap_due_bytes += lock.memory_bytes

    def _unmap_released(self) -> None:
        """Unmap the locked weights of the stages unloaded since the last decision."""
        unmaps_due, self.unmaps_due, self.unmap_due_bytes = self.unmaps_due, [], 0
        for mapped, locked in unmaps_due:
            self.stages.unmap(mapped, locked)

    def keep_loaded(self, lock: Lock, opener: Task) -> None:
        self.stages.keep(opener)

    def evict_loaded(self, stage: tuple[str, str]) -> None:
        self.stages.evict(stage)
        self.pending_unload = True

    def reuse_loaded(self, task: Task) -> None:
        if self.stages.reuse(task):
            self.reused.add(task.task_id)

    def group_ended(self, group: str, status: GroupStatus) -> None:
        if status is not GroupStatus.DONE:
            self.outputs.pop(group, None)  # results of a failed or aborted network
        self.inputs_ready.discard(group)
        self.stages.drop_group(group)
        self.pending_unload = True

    def discard_outputs(self, group: str) -> None:
        self.outputs.pop(group, None)

    def job_ended(self, job_id: int) -> None:
        if not self.config.keep_outputs:
            for group in [g for g in self.outputs if parse_group(g)[0] == job_id]:
                del self.outputs[group]

    def upstream_outputs(self, job_id: int) -> dict[str, dict[str, np.ndarray]]:
        """Outputs of the job's finished networks, by network name."""
        found = {}
        for group, outputs in self.outputs.items():
            group_job, network = parse_group(group)
            if group_job == job_id:
                found[network] = outputs
        return found

    # ------------------------------------------------------------ helpers

    def _inputs_maker(self, group: str) -> MakeInputs | None:
        """What makes a network instance's inputs, for the worker running the first
        of its EXECs to start (the inputs lock's opener, or a stage that reads none
        before it); None once handed out. The upstream outputs are taken here, on the
        loop's thread, which alone changes them."""
        if group in self.inputs_ready:
            return None
        self.inputs_ready.add(group)
        job_id, network = parse_group(group)
        upstream = {name: dict(outputs)
                    for name, outputs in self.upstream_outputs(job_id).items()}
        self.stages.inputs_coming(group)
        return lambda: self.inputs_for(job_id, network, upstream)

    def _collect_outputs(self, task: Task) -> None:
        """Keep a network's final outputs for the job result before they are dropped."""
        manifest = self.manifests[task.network]
        stage = self.stages.stages[(task.network, task.stage_id)]
        wanted = {tensor.name for tensor in manifest.outputs}
        with self.stages.lock:
            for tensor in stage.outputs:
                if tensor.name in wanted:
                    value = self.stages.tensors.get((task.group, tensor.name))
                    if value is not None:
                        self.outputs.setdefault(task.group, {})[tensor.name] = value

    def _worker(self, index: int) -> None:
        name_this_thread(f"{WORKER_THREAD_PREFIX}-{index}")
        while True:
            item = self.work_queues[index].get()
            if item is None:
                return
            task, make_inputs = item
            error = detail = None
            if make_inputs is not None:
                error, detail = self._make_inputs(task, make_inputs)
            if error is None:  # else the network fails alone, without running the stage
                try:
                    self.stages.run_task(task)
                except Exception as exc:  # reported to the loop, which fails the group
                    error = f"{type(exc).__name__}: {one_line(exc)}"
                    detail = traceback.format_exc()
            self.completions.put(Completion(task.task_id, self.now_us(), error is None,
                                            error, detail))

    def _make_inputs(self, task: Task, make_inputs: MakeInputs) -> tuple[str | None, str | None]:
        """A worker makes its task's network instance's inputs: (error, detail) if that
        failed (a bad input fails this network alone), else (None, None)."""
        try:
            feeds = make_inputs()
        except Exception as error:
            self.stages.put_inputs(task.group, None)
            return f"input: {one_line(error)}", traceback.format_exc()
        self.stages.put_inputs(task.group, feeds)
        return None, None


class _OverCommitLog(Observer):
    """A real run says when it goes over its budget (a simulation stays quiet)."""

    def over_commit(self, over_commit: OverCommit) -> None:
        if over_commit.reason == "progress":
            log.warning("task %s needs %d bytes, more than is free, and nothing else runs: "
                        "started over the budget (progress rule)",
                        over_commit.task_id, over_commit.footprint_bytes)
        else:  # a memory-oblivious policy: expected, reported in the summary
            log.debug("task %s took reserved memory to %d bytes, over the budget",
                      over_commit.task_id, over_commit.reserved_bytes)


class RealExecutor:
    """One real run of a task graph on k worker threads, through the shared driver."""

    def __init__(
        self,
        graph: TaskGraph,
        manifests: Mapping[str, NetworkManifest],
        inputs_for: InputsFor,
        config: RealRunConfig,
        context: ContextController | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.graph = graph
        self.config = config
        self.context = context
        self.state: SchedulerState = new_state(
            config.workers, config.memory_budget_bytes,
            make_policy(config.policy, real_time=config.plan_in_background,
                        read_ahead_bytes=config.read_ahead_bytes,
                        copied_weights=weights_copied(manifests),
                        cache_first=config.cache_first,
                        keep_loaded_bytes=config.keep_loaded_bytes))
        self.backend = ThreadBackend(manifests, inputs_for, config, clock)
        self.recorder = Recorder.compact()
        self.loop_cpu_us = 0  # set by run()
        self.driver = Driver(self.state, self.backend, context=context,
                             observers=[self.recorder, _OverCommitLog()])

    def run(self) -> RealRunResult:
        """Run the graph to its end. On SIGINT/SIGTERM (a KeyboardInterrupt, see
        masa.common.signals) dispatching stops, running calls are terminated, every
        session is released and the interruption is raised again with the partial
        result as its `partial` attribute."""
        backend = self.backend
        interruption: KeyboardInterrupt | None = None
        try:
            # The scheduler's entry for every task of the batch, added at once (about
            # 650 bytes a task), is the run's own bookkeeping, not its jobs' memory:
            # the baseline holds it, as the runtime's base on a device does
            # (masa.cli.emulation_child.runtime_base_bytes); counted above the
            # baseline it took a third of a 100 MiB budget from a 1200-job batch.
            self.driver.add(self.graph)
            backend.begin()
            loop_started_cpu_s = time.thread_time()
            try:
                self.driver.run()
            finally:
                self.loop_cpu_us = int((time.thread_time() - loop_started_cpu_s) * 1e6)
        except KeyboardInterrupt as stop:
            backend.abandon()  # before the workers are joined: they stop sooner
            interruption = stop
        finally:
            close_policy(self.state.policy)
            backend.close()
            backend.meter.finish()
        if interruption is not None:
            self._stop_interrupted(interruption)
            raise interruption
        stuck = unfinished_task_ids(self.state)
        if stuck:
            raise RuntimeError(f"scheduler stalled with {len(stuck)} tasks pending "
                               f"(e.g. {stuck[:3]})")
        for group in self.state.groups:
            backend.stages.drop_group(group)
        release_memory()
        backend.measured_bytes()
        return self._result()

    def _stop_interrupted(self, interruption: KeyboardInterrupt) -> None:
        """Once the workers are gone: release every session and tensor, and attach the
        partial result to the interruption."""
        backend = self.backend
        with backend.stages.lock:
            backend.stages.sessions.clear()
            backend.stages.tensors.clear()
        release_memory()
        signal_name = getattr(interruption, "signal_name", "SIGINT")
        log.warning("%s: stopped dispatching, terminated the running tasks and released "
                    "every session", signal_name)
        interruption.partial = self._result(interrupted=signal_name)  # type: ignore[attr-defined]

    def _result(self, interrupted: str | None = None) -> RealRunResult:
        status, reason = {}, {}
        for name, info in self.state.groups.items():
            core_status = info.status.value
            if interrupted and info.status is GroupStatus.ACTIVE:
                status[name], reason[name] = "interrupted", f"interrupted by {interrupted}"
                continue
            status[name] = (self.context.network_status(name, core_status)
                            if self.context else core_status)
            if info.reason:
                reason[name] = info.reason
        backend = self.backend
        return RealRunResult(
            schedule=self.recorder.schedule,
            group_status=status,
            group_reason=reason,
            outputs=backend.outputs,
            over_commits=self.recorder.over_commits,
            peak_reserved_bytes=self.state.ledger.peak_reserved_bytes,
            final_reserved_bytes=self.state.ledger.reserved_bytes,
            memory_timeline=self.recorder.memory_timeline,
            policy_stats=policy_stats(self.state.policy) | kept_stats(self.state),
            live_sessions_after=len(backend.stages.sessions) + len(backend.stages.kept),
            live_tensors_after=len(backend.stages.tensors),
            dispatch_order=self.recorder.dispatch_order,
            errors=self.driver.errors,
            error_details=self.driver.error_details,
            process_memory_after=process_memory_bytes(),
            interrupted=interrupted,
            stage_file_bytes_loaded=backend.stages.load_file_bytes,
            stage_file_bytes_cached_at_load=backend.stages.load_cached_bytes,
            loop_cpu_us=self.loop_cpu_us,
            **backend.meter.result_fields(),
        )
