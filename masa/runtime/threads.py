"""The real executor: k worker threads running LOAD and EXEC tasks with ONNX Runtime.

This module owns threads, the clock and ONNX Runtime sessions for a real run.
Every decision comes from the pure core (masa.sched.core, masa.sched.policies) exactly as
in the simulator; this shell only carries decisions out and reports back:

- the main thread runs an event loop: it admits jobs at their arrival time,
  asks the core for dispatches, hands each to its worker's queue, and blocks
  on the completion queue (with a timeout only until the next arrival: no
  polling);
- a LOAD creates the stage's session (model_prep.session.create_session) and keeps
  it under (group, stage); an EXEC runs the stage on tensors of the job's
  tensor store, with its own RunOptions so that CA-preempt can stop it;
- when the core releases a lock the shell unloads the session (LOAD lock) or
  drops the stage's output tensors (EXEC lock); a network's final outputs are
  moved into the job result first. Memory really returns: no handle to a
  session is kept elsewhere, and `release_memory` (gc + malloc_trim) runs
  after unloads.

With ``memory_source="measured"``, before every decision the free memory the
core sees is reduced by whatever the process holds above its baseline RSS
beyond what is reserved (measured memory reconciles the model).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from masa.common.procmem import rss_bytes
from masa.sched import core
from masa.sched.context import ContextController, parse_group
from masa.sched.core import GroupStatus, SchedulerState
from masa.sched.taskgraph import ScheduledTask, Task, TaskGraph, TaskKind
from model_prep.manifest import NetworkManifest, Stage
from model_prep.session import create_session, release_memory

log = logging.getLogger(__name__)

MEMORY_SOURCES = ("model", "measured")

# inputs_for(job_id, network, upstream_outputs) -> feeds of the network's inputs
InputsFor = Callable[[int, str, Mapping[str, Mapping[str, np.ndarray]]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class RealRunConfig:
    workers: int
    memory_budget_bytes: int
    policy: str = "masa"
    memory_source: str = "model"
    intra_op_threads: int = 1
    keep_outputs: bool = True  # keep every network's outputs in the result


@dataclass
class RealRunResult:
    """What a real run did; times are microseconds from the run's start."""

    schedule: list[ScheduledTask]
    group_status: dict[str, str]  # done / failed / skipped / aborted / cancelled
    group_reason: dict[str, str]
    outputs: dict[str, dict[str, np.ndarray]]  # group -> output name -> array
    over_commits: list[core.OverCommit]
    peak_reserved_bytes: int
    final_reserved_bytes: int
    memory_timeline: list[tuple[int, int, int]]  # (time_us, reserved_bytes, rss_bytes)
    baseline_rss_bytes: int
    peak_rss_bytes: int
    live_sessions_after: int
    live_tensors_after: int
    dispatch_order: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # group -> first error


@dataclass
class _Completion:
    task_id: str
    worker: int
    end_s: float
    error: str | None


class _Runtime:
    """Sessions and tensors of the running jobs. Touched by workers and the main thread."""

    def __init__(self, manifests: Mapping[str, NetworkManifest], intra_op_threads: int):
        self.manifests = manifests
        self.intra_op_threads = intra_op_threads
        self.stages: dict[tuple[str, str], Stage] = {
            (name, stage.stage_id): stage
            for name, manifest in manifests.items() for stage in manifest.stages
        }
        self.sessions: dict[tuple[str, str], ort.InferenceSession] = {}
        self.tensors: dict[tuple[str, str], np.ndarray] = {}
        self.run_options: dict[str, ort.RunOptions] = {}
        self.lock = threading.Lock()

    def run_task(self, task: Task) -> None:
        stage = self.stages[(task.network, task.stage_id)]
        key = (task.group, task.stage_id)
        if task.kind is TaskKind.LOAD:
            session = create_session(
                self.manifests[task.network].stage_path(stage), self.intra_op_threads
            )
            with self.lock:
                self.sessions[key] = session
            return
        if task.kind is not TaskKind.EXEC:
            raise RuntimeError(f"task {task.task_id}: the real executor has no {task.kind.value}")
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

    def release(self, task: Task) -> bool:
        """Free what the lock `task` opened stood for; True when a session was unloaded."""
        with self.lock:
            if task.kind is TaskKind.LOAD:
                return self.sessions.pop((task.group, task.stage_id), None) is not None
            stage = self.stages[(task.network, task.stage_id)]
            for tensor in stage.outputs:
                self.tensors.pop((task.group, tensor.name), None)
            return False

    def drop_group(self, group: str) -> None:
        with self.lock:
            for key in [k for k in self.sessions if k[0] == group]:
                del self.sessions[key]
            for key in [k for k in self.tensors if k[0] == group]:
                del self.tensors[key]


class RealExecutor:
    """One real run of a list of jobs (their task graph) on k worker threads."""

    def __init__(
        self,
        graph: TaskGraph,
        manifests: Mapping[str, NetworkManifest],
        job_arrivals_us: Mapping[int, int],
        inputs_for: InputsFor,
        config: RealRunConfig,
        context: ContextController | None = None,
        job_networks: Mapping[int, Sequence[str]] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.graph = graph
        self.config = config
        self.runtime = _Runtime(manifests, config.intra_op_threads)
        self.manifests = manifests
        self.inputs_for = inputs_for
        self.context = context
        self.clock = clock
        self.job_arrivals_us = dict(job_arrivals_us)
        self.job_networks = {job: tuple(nets) for job, nets in (job_networks or {}).items()}
        if not self.job_networks:
            for task in graph.tasks:
                nets = self.job_networks.setdefault(task.job_id, ())
                if task.network not in nets:
                    self.job_networks[task.job_id] = nets + (task.network,)
        self.inputs_ready: set[str] = set()  # groups whose input tensors were made
        self.state: SchedulerState = core.new_state(
            config.workers, config.memory_budget_bytes, config.policy
        )
        self.completions: queue.Queue[_Completion] = queue.Queue()
        self.work_queues: list[queue.Queue[Task | None]] = [
            queue.Queue() for _ in range(config.workers)
        ]
        self.running: dict[str, int] = {}
        # Start time of a task = when the main thread handed it to its idle worker:
        # dispatch order is what start-to-start rules and the checker reason about.
        self.dispatched_s: dict[str, float] = {}
        self.schedule: list[ScheduledTask] = []
        self.dispatch_order: list[str] = []
        self.outputs: dict[str, dict[str, np.ndarray]] = {}
        self.errors: dict[str, str] = {}
        self.timeline: list[tuple[int, int, int]] = []
        self.over_commits: list[core.OverCommit] = []
        self.start_s = 0.0
        self.baseline_rss_bytes = 0
        self.peak_rss_bytes = 0
        self.pending_unload = False

    # ------------------------------------------------------------ control API
    # (the context controller's GroupControl)

    def gate(self, group: str) -> None:
        core.gate_group(self.state, group)

    def open(self, group: str) -> None:
        core.open_group(self.state, group)

    def cancel(self, group: str, reason: str) -> None:
        self._terminate(core.cancel_group(self.state, group, reason))

    # ------------------------------------------------------------ the run

    def run(self) -> RealRunResult:
        tasks_by_job: dict[int, list[str]] = {}
        for task in self.graph.tasks:
            tasks_by_job.setdefault(task.job_id, []).append(task.task_id)
        arrivals = sorted(self.job_arrivals_us.items(), key=lambda item: (item[1], item[0]))
        core.add_tasks(self.state, self.graph, arrived=False)
        workers = [
            threading.Thread(target=self._worker, args=(index,), daemon=True,
                             name=f"masa-worker-{index}")
            for index in range(self.config.workers)
        ]
        release_memory()
        self.baseline_rss_bytes = rss_bytes()
        self.peak_rss_bytes = self.baseline_rss_bytes
        for thread in workers:
            thread.start()
        self.start_s = self.clock()
        next_arrival = 0
        try:
            while True:
                now_us = self._now_us()
                while next_arrival < len(arrivals) and arrivals[next_arrival][1] <= now_us:
                    self._admit(arrivals[next_arrival][0], tasks_by_job)
                    next_arrival += 1
                self._apply_events(core.take_events(self.state))
                self._dispatch()
                if next_arrival == len(arrivals) and core.is_finished(self.state):
                    break
                if not self.running and next_arrival == len(arrivals):
                    stuck = core.unfinished_task_ids(self.state)
                    raise RuntimeError(f"scheduler stalled with {len(stuck)} tasks pending "
                                       f"(e.g. {stuck[:3]})")
                timeout_s = None
                if next_arrival < len(arrivals):
                    timeout_s = max(0.0, (arrivals[next_arrival][1] - now_us) / 1e6)
                try:
                    completion = self.completions.get(timeout=timeout_s)
                except queue.Empty:
                    continue
                self._complete(completion)
                while True:  # handle every completion already queued before deciding
                    try:
                        self._complete(self.completions.get_nowait())
                    except queue.Empty:
                        break
                if self.pending_unload:
                    # Sessions are only referenced from the runtime's dict: dropping
                    # them frees them; trimming returns the pages without a gc pass.
                    release_memory(collect=False)
                    self.pending_unload = False
        finally:
            for work in self.work_queues:
                work.put(None)
            for thread in workers:
                thread.join()
        for group in self.state.groups:
            self.runtime.drop_group(group)
        release_memory()
        self._sample_memory()
        status, reason = {}, {}
        for name, info in self.state.groups.items():
            core_status = info.status.value
            status[name] = (self.context.network_status(name, core_status)
                            if self.context else core_status)
            if info.reason:
                reason[name] = info.reason
        return RealRunResult(
            schedule=self.schedule,
            group_status=status,
            group_reason=reason,
            outputs=self.outputs,
            over_commits=self.over_commits,
            peak_reserved_bytes=self.state.ledger.peak_reserved_bytes,
            final_reserved_bytes=self.state.ledger.reserved_bytes,
            memory_timeline=self.timeline,
            baseline_rss_bytes=self.baseline_rss_bytes,
            peak_rss_bytes=self.peak_rss_bytes,
            live_sessions_after=len(self.runtime.sessions),
            live_tensors_after=len(self.runtime.tensors),
            dispatch_order=self.dispatch_order,
            errors=self.errors,
        )

    def _now_us(self) -> int:
        return int((self.clock() - self.start_s) * 1e6)

    def _admit(self, job_id: int, tasks_by_job: Mapping[int, list[str]]) -> None:
        networks = self.job_networks.get(job_id, ())
        if self.context is not None:
            for group in self.context.register_job(job_id, networks):
                self.gate(group)
        core.arrive(self.state, tasks_by_job.get(job_id, []))

    def _prepare_inputs(self, group: str) -> None:
        """Put a network instance's input tensors into the tensor store.

        Called when the network's first EXEC is dispatched: by then every
        upstream output a derived input needs exists (the task graph makes such
        an EXEC wait for its upstreams), and inputs of jobs still waiting for
        their turn take no memory.
        """
        job_id, network = parse_group(group)
        if group in self.inputs_ready:
            return
        self.inputs_ready.add(group)
        try:
            feeds = self.inputs_for(job_id, network, self.upstream_outputs(job_id))
        except Exception as error:  # a bad input fails this network alone
            self.errors.setdefault(group, f"input: {error}")
            log.error("job %d network %s: cannot make its input: %s", job_id, network, error)
            self._terminate(core.fail_group(self.state, group, f"input: {error}"))
            return
        with self.runtime.lock:
            for name, value in feeds.items():
                self.runtime.tensors[(group, name)] = value

    def upstream_outputs(self, job_id: int) -> dict[str, dict[str, np.ndarray]]:
        """Outputs of the job's finished networks, by network name."""
        return {
            parse_group(name)[1]: outputs for name, outputs in self.outputs.items()
            if parse_group(name)[0] == job_id
        }

    def _dispatch(self) -> None:
        if self.config.memory_source == "measured":
            self._reconcile_memory()
        for dispatch in core.select(self.state):
            task = self.graph.by_id[dispatch.task_id]
            if task.kind is TaskKind.EXEC:
                self._prepare_inputs(task.group)
                self.runtime.run_options[task.task_id] = ort.RunOptions()
            self.running[task.task_id] = dispatch.worker
            self.dispatched_s[task.task_id] = self.clock()
            self.dispatch_order.append(task.task_id)
            self.work_queues[dispatch.worker].put(task)
        while len(self.over_commits) < len(self.state.over_commits):
            over_commit = self.state.over_commits[len(self.over_commits)]
            if over_commit.reason == "progress":
                log.warning("task %s needs %d bytes, more than is free, and nothing else "
                            "runs: started over the budget (progress rule)",
                            over_commit.task_id, over_commit.footprint_bytes)
            else:  # a memory-oblivious policy: expected, reported in the summary
                log.debug("task %s took reserved memory to %d bytes, over the budget",
                          over_commit.task_id, over_commit.reserved_bytes)
            self.over_commits.append(
                core.OverCommit(over_commit.task_id, over_commit.footprint_bytes,
                                over_commit.reserved_bytes, over_commit.reason, self._now_us())
            )
        self._sample_memory()

    def _reconcile_memory(self) -> None:
        """Shrink the budget the core sees by memory held outside its model."""
        measured_bytes = max(0, rss_bytes() - self.baseline_rss_bytes)
        unmodelled_bytes = max(0, measured_bytes - self.state.ledger.reserved_bytes)
        self.state.ledger.budget_bytes = max(
            0, self.config.memory_budget_bytes - unmodelled_bytes
        )

    def _sample_memory(self) -> None:
        rss = rss_bytes()
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        self.timeline.append((self._now_us(), self.state.ledger.reserved_bytes, rss))

    def _worker(self, index: int) -> None:
        while True:
            task = self.work_queues[index].get()
            if task is None:
                return
            error = None
            try:
                self.runtime.run_task(task)
            except Exception as exc:  # reported to the main thread, which fails the group
                error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
            self.completions.put(_Completion(task.task_id, index, self.clock(), error))

    def _complete(self, completion: _Completion) -> None:
        task = self.graph.by_id[completion.task_id]
        self.running.pop(task.task_id, None)
        start_s = self.dispatched_s.pop(task.task_id)
        self.runtime.run_options.pop(task.task_id, None)
        ok = completion.error is None
        group_active = self.state.groups[task.group].status is GroupStatus.ACTIVE
        if not ok and group_active:
            self.errors.setdefault(task.group, f"{task.task_id}: {completion.error}")
            log.error("task %s failed: %s", task.task_id, completion.error)
        if ok and task.kind is TaskKind.EXEC and group_active:
            self._collect_outputs(task)
        finished = core.finish(self.state, task.task_id, ok)
        self.schedule.append(ScheduledTask(
            task.task_id, completion.worker,
            int((start_s - self.start_s) * 1e6),
            int((completion.end_s - self.start_s) * 1e6),
            finished.status.value,
        ))
        self._terminate(finished.to_terminate)
        self._apply_events(core.CoreEvents(
            released_bytes=finished.released_bytes,
            released_locks=finished.released_locks,
            newly_cancelled=finished.newly_cancelled,
            ended_groups=finished.ended_groups,
        ))

    def _collect_outputs(self, task: Task) -> None:
        """Move a network's final outputs into the job result before they are dropped."""
        manifest = self.manifests[task.network]
        stage = self.runtime.stages[(task.network, task.stage_id)]
        wanted = {tensor.name for tensor in manifest.outputs}
        with self.runtime.lock:
            for tensor in stage.outputs:
                if tensor.name in wanted:
                    value = self.runtime.tensors.get((task.group, tensor.name))
                    if value is not None:
                        self.outputs.setdefault(task.group, {})[tensor.name] = value

    def _apply_events(self, events: core.CoreEvents) -> None:
        now_us = self._now_us()
        for lock in events.released_locks:
            if self.runtime.release(self.graph.by_id[lock.from_task]):
                self.pending_unload = True
        for task_id in events.newly_cancelled:
            self.schedule.append(ScheduledTask(task_id, -1, now_us, now_us, "cancelled"))
        for group, status in events.ended_groups:
            if status is not GroupStatus.DONE:
                self.outputs.pop(group, None)  # results of a failed or aborted network
            self.runtime.drop_group(group)
            self.pending_unload = True
            if self.context is not None:
                job_id = parse_group(group)[0]
                for doomed in self.context.group_ended(group, status, self,
                                                       self.upstream_outputs(job_id)):
                    self.outputs.pop(doomed, None)  # an aborted network's results go
            if not self.config.keep_outputs:
                self._forget_finished_job(parse_group(group)[0])
        if events.ended_groups or events.newly_cancelled:
            # Decisions above may have produced more events (cancels, opened gates).
            more = core.take_events(self.state)
            if more.released_locks or more.newly_cancelled or more.ended_groups:
                self._apply_events(more)

    def _forget_finished_job(self, job_id: int) -> None:
        """Drop a job's outputs once none of its networks can still need them."""
        groups = [f"j{job_id}/{network}" for network in self.job_networks.get(job_id, ())]
        if all(self.state.groups[g].ended for g in groups if g in self.state.groups):
            for group in groups:
                self.outputs.pop(group, None)

    def _terminate(self, task_ids: Sequence[str]) -> None:
        """Stop running tasks: an EXEC at the next node boundary, a LOAD when it ends."""
        for task_id in task_ids:
            options = self.runtime.run_options.get(task_id)
            if options is not None:
                options.terminate = True

