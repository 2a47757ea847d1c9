"""The daemon's engine: the live driver, the jobs it runs, their results, crash-resume.

Owns everything between an accepted request and a journaled result, on four
kinds of threads:

- callers (the HTTP server's executor threads) `accept`, `cancel` and read;
  `accept` decodes and checks the input, journals the job, then submits its
  task graph to the driver: a job is in the journal before its 202;
- the scheduler thread runs masa.runtime.driver's loop with `live=` (the one
  loop of `masa run` and the simulator) on a `ThreadBackend`, with
  `forget_ended`: an ended job leaves the scheduler state, so the state is
  as large as the unfinished work, not as the service's age;
- the backend's worker threads run LOAD and EXEC tasks (ONNX Runtime);
- the journal writer thread writes each ended job's result and only then
  publishes it (`on_final` listeners, metrics), so a client never sees a
  result that a crash could take back. It also prunes old results.

On `start`, every journaled job that is not final runs again (a cancel
requested before the crash ends it as cancelled): after a kill -9 each
accepted job ends exactly once. `drain` stops accepting and waits for the
running jobs within a grace time; `close` stops the loop, leaving the
unfinished jobs queued in the journal for the next start.
"""

from __future__ import annotations

import hmac
import io
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from masa.common.errors import UserError, one_line
from masa.common.procmem import find_memory_cgroup, read_cgroup_memory, rss_bytes
from masa.common.units import format_bytes
from masa.runtime.driver import Driver, Observer
from masa.runtime.registry import make_policy
from masa.runtime.runner import _with_transform_waits
from masa.runtime.threads import RealRunConfig, ThreadBackend
from masa.sched.context import ContextController, parse_group
from masa.sched.core import GroupStatus, OverCommit, new_state
from masa.sched.jobs import JobSpec, build_job_graph, group_id, stage_costs
from masa.sched.taskgraph import ScheduledTask, TaskGraph
from masa.serve.config import GraphSpec, ServeConfig
from masa.serve.inputs import BadInput, JobInput, Limits, TooLarge, decode_body, network_feeds
from masa.serve.journal import FINAL_STATES, Journal, JournaledJob
from masa.serve.metrics import Metrics
from model_prep.manifest import MANIFEST_NAME, NetworkManifest
from workloads.generation import should_run

log = logging.getLogger(__name__)

_PRUNE_INTERVAL_S = 60.0


class ServeError(Exception):
    """A refused request: HTTP status, one-line message, the rejection metric's reason."""

    def __init__(self, status: int, message: str, reason: str,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


def resolve_budget(config: ServeConfig) -> tuple[int, str]:
    """The memory budget in bytes and how it was found (`memory: auto`: the cgroup's
    limit less what the process holds, or MemAvailable, less the margin)."""
    if config.memory_budget_bytes is not None:
        return config.memory_budget_bytes, "configured"
    margin = config.memory_margin_bytes
    cgroup = find_memory_cgroup()
    limit = None if cgroup is None else read_cgroup_memory(cgroup).limit_bytes
    if limit is not None:
        held = rss_bytes()
        budget = limit - held - margin
        how = (f"auto: cgroup limit {format_bytes(limit)} less {format_bytes(held)} resident "
               f"and a {format_bytes(margin)} margin")
    else:
        available = _mem_available_bytes()
        budget = available - margin
        how = f"auto: MemAvailable {format_bytes(available)} less a {format_bytes(margin)} margin"
    if budget <= 0:
        raise UserError(f"{config.source}: at 'memory': {how} leaves no memory; set a size")
    return budget, how


def _mem_available_bytes() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise UserError("memory: auto needs /proc/meminfo's MemAvailable; set a size")


def largest_task_bytes(manifest: NetworkManifest) -> int:
    """The most one task of the network reserves (a LOAD's peak or an EXEC's working set)."""
    largest = 0
    for stage in manifest.stages:
        cost = stage_costs(stage)
        largest = max(largest, cost.load_transient_bytes + cost.resident_bytes,
                      cost.exec_bytes + cost.output_bytes)
    return largest


@dataclass
class _NetworkProgress:
    state: str = "pending"  # pending, running, then the final status
    load_us: int = 0
    exec_us: int = 0
    started_us: int | None = None  # from the job's submission to the scheduler
    ended_us: int | None = None


@dataclass
class _ActiveJob:
    job_id: int
    graph: GraphSpec
    job_input: JobInput
    accepted_at: float
    attempt: int
    submitted_us: int = 0
    started_at: float | None = None
    cancel_requested: bool = False
    ending: bool = False  # ended in the scheduler, result not yet journaled
    feeds: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # checked at accept
    networks: dict[str, _NetworkProgress] = field(default_factory=dict)


class _GraphContext(ContextController):
    """Context-aware execution over several graphs: the controller's upstream map is the
    union of every graph's, but a job's upstreams and downstreams are its own graph's
    (a network may be downstream in one graph and independent in another)."""

    graph_of: Callable[[int], GraphSpec]

    def _upstreams_in_job(self, job_id: int, network: str) -> list[str]:
        return list(self.graph_of(job_id).workload.node(network).after)

    def _transitive_downstreams(self, job_id: int, network: str) -> list[str]:
        return list(self.graph_of(job_id).workload.downstreams(network))


class _ServeBackend(ThreadBackend):
    """The real backend, without the per-decision memory timeline a finite run keeps
    for its report (a service would grow it forever)."""

    def measured_bytes(self) -> int | None:
        value = super().measured_bytes()
        self.meter.timeline.clear()
        return value


class Service:
    """One daemon's jobs on one driver; thread-safe public methods."""

    def __init__(self, config: ServeConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.metrics = Metrics()
        self.budget_bytes, self.budget_how = resolve_budget(config)
        self.metrics.budget_bytes.set(self.budget_bytes)
        self.limits = Limits(config.limits["max_image_pixels"],
                             config.limits["max_decoded_bytes"])
        self.journal = Journal(config.journal, synchronous=config.journal_sync, clock=clock)
        self._jobs: dict[int, _ActiveJob] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._accepting = False
        self._live = True
        self.on_final: list[Callable[[int], None]] = []  # called after a result is journaled
        self.on_started: list[Callable[[int], None]] = []  # a job's first task was dispatched
        self.violations = 0  # over-commits of a memory-aware policy while others ran
        self.peak_reserved_bytes = 0
        self.state = new_state(config.workers, self.budget_bytes, make_policy(config.policy))
        controller = None
        if config.context != "oblivious" and config.upstreams:
            controller = _GraphContext(config.context, config.upstreams, self._decide)
            controller.graph_of = lambda job_id: self._jobs[job_id].graph
        self.context = controller
        self.backend = _ServeBackend(
            config.manifests, self._inputs_for,
            RealRunConfig(workers=config.workers, memory_budget_bytes=self.budget_bytes,
                          policy=config.policy, memory_source=config.memory_source,
                          intra_op_threads=config.intra_op_threads, keep_outputs=True))
        self.driver = Driver(self.state, self.backend, context=controller,
                             observers=[_JobObserver(self)], forget_ended=True)
        # Journal writes off the scheduler's thread, in order; None stops the writer.
        self._writes: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._loop_thread = threading.Thread(target=self._loop, name="masa-scheduler",
                                             daemon=True)
        self._writer_thread = threading.Thread(target=self._writer, name="masa-journal",
                                               daemon=True)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Start the workers and the loop, resume the journal's unfinished jobs, accept.

        Returns how many jobs were resumed."""
        self.backend.begin()
        self._loop_thread.start()
        self._writer_thread.start()
        self.journal.prune(self.config.retention_s)
        resumed = self._resume()
        self._accepting = True
        return resumed

    def _resume(self) -> int:
        resumed = 0
        for journaled in self.journal.unfinished():
            if journaled.cancel_requested:
                self._finish_unrun(journaled, "cancelled", "cancelled by the client")
                continue
            graph = self.config.graphs.get(journaled.graph)
            if graph is None:
                self._finish_unrun(journaled, "failed",
                                   f"graph {journaled.graph!r} is no longer offered")
                continue
            try:
                job_input = decode_body(journaled.body, journaled.content_type, self.limits)
            except (BadInput, TooLarge) as error:
                self._finish_unrun(journaled, "failed", f"input: {error}")
                continue
            attempt = self.journal.begin_attempt(journaled.job_id)
            with self._lock:
                self._submit(journaled.job_id, graph, job_input, journaled.accepted_at,
                             attempt, {})
            resumed += 1
            self.metrics.jobs_resumed.inc()
        if resumed:
            log.info("resumed %d unfinished job(s) from %s", resumed, self.journal.path)
        return resumed

    def _finish_unrun(self, journaled: JournaledJob, state: str, reason: str) -> None:
        result = {"id": journaled.job_id, "graph": journaled.graph, "state": state,
                  "reason": reason, "attempts": journaled.attempts,
                  "accepted_at": journaled.accepted_at, "networks": {}}
        self._writes.put(lambda: self._write_final(journaled.job_id, state, result, None))

    def stop_accepting(self) -> None:
        self._accepting = False

    def drain(self, grace_s: float) -> bool:
        """Stop accepting; wait up to grace_s for the accepted jobs to end. True if they did."""
        self._accepting = False
        return self.wait_idle(grace_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait up to timeout_s until no accepted job is unfinished. True if none is."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._jobs:
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    return False
                self._idle.wait(left_s)
        return True

    def close(self) -> None:
        """Stop the loop and the workers; jobs still unfinished stay in the journal."""
        self._accepting = False
        self._live = False
        self.backend.wake()
        if self._loop_thread.is_alive():
            self._loop_thread.join()
        self.backend.close()
        self._writes.put(None)
        if self._writer_thread.is_alive():
            self._writer_thread.join()
        self.journal.close()

    def _loop(self) -> None:
        try:
            self.driver.run(live=lambda: self._live)
        except Exception:  # a bug in the loop: no job can end any more
            log.exception("the scheduler loop stopped")
            self._accepting = False
            return
        running = self.driver.running_task_ids
        if running:
            self.backend.terminate(running)  # EXECs stop at their next node

    # ------------------------------------------------------------ requests

    @property
    def accepting(self) -> bool:
        return self._accepting

    def accept(self, graph_name: str, body: bytes, content_type: str) -> int:
        """Decode, check, journal and submit one job; its id. ServeError when refused."""
        if not self._accepting:
            raise ServeError(503, "the daemon is shutting down", "shutting_down")
        graph = self.config.graphs.get(graph_name)
        if graph is None:
            raise ServeError(400, f"unknown graph {graph_name!r} (offered: "
                             f"{', '.join(sorted(self.config.graphs))})", "unknown_graph")
        if len(body) > self.config.limits["max_body_bytes"]:
            raise ServeError(413, f"body of {len(body)} bytes, more than the limit of "
                             f"{self.config.limits['max_body_bytes']}", "too_large")
        try:
            job_input = decode_body(body, content_type, self.limits)
            feeds = self._entry_feeds(graph, job_input)
        except TooLarge as error:
            raise ServeError(413, str(error), "too_large") from None
        except (BadInput, ValueError) as error:
            raise ServeError(400, one_line(error), "bad_input") from None
        with self._lock:
            limit = self.config.limits["max_queued_jobs"]
            if len(self._jobs) >= limit:
                raise ServeError(429, f"{len(self._jobs)} jobs are waiting or running (the "
                                 f"limit is {limit}): retry later", "queue_full",
                                 self.config.limits["retry_after_s"])
            job_id = self.journal.accept(graph.name, content_type, body)
            self._submit(job_id, graph, job_input, self.clock(), 1, feeds)
        self.metrics.jobs_accepted.labels(graph.name).inc()
        return job_id

    def _entry_feeds(self, graph: GraphSpec, job_input: JobInput) -> dict[str, dict]:
        """The inputs of the networks fed by the job input, made now: a bad input is a 400
        before the job is accepted, not a failed network later."""
        feeds = {}
        for node in graph.workload.nodes:
            if node.transform is None:
                try:
                    feeds[node.name] = network_feeds(graph, self.config.manifests[node.name],
                                                     job_input, {})
                except ValueError as error:
                    raise BadInput(f"network {node.name!r}: {one_line(error)}") from None
        return feeds

    def _submit(self, job_id: int, graph: GraphSpec, job_input: JobInput, accepted_at: float,
                attempt: int, feeds: dict[str, dict]) -> None:
        """Hand a journaled job to the scheduler (self._lock held)."""
        now_us = self.backend.now_us()
        job = _ActiveJob(job_id, graph, job_input, accepted_at, attempt, submitted_us=now_us,
                         feeds=feeds,
                         networks={name: _NetworkProgress() for name in graph.networks})
        self._jobs[job_id] = job
        self.metrics.queue_jobs.set(len(self._jobs))
        spec = JobSpec(job_id=job_id, arrival_us=now_us, networks=graph.networks)
        upstreams = ({node.name: node.after for node in graph.workload.nodes if node.after}
                     if self.config.context == "preempt" else None)
        task_graph: TaskGraph = build_job_graph(spec, self.config.manifests,
                                                self.config.network_order, upstreams=upstreams)
        task_graph = _with_transform_waits(task_graph, [spec], graph.workload,
                                           self.config.manifests)
        self.driver.submit(task_graph)

    def cancel(self, job_id: int) -> str:
        """Cancel a job: 'cancelling', or its final state when it had already ended.
        ServeError 404 for an unknown job."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and not job.ending:
                job.cancel_requested = True
                self.journal.request_cancel(job_id)
                self.driver.call_soon(lambda: self._cancel_in_loop(job_id))
                return "cancelling"
        journaled = self.journal.get(job_id)
        if journaled is None:
            raise ServeError(404, f"no job {job_id}", "not_found")
        return journaled.state

    def _cancel_in_loop(self, job_id: int) -> None:
        for network in self._jobs[job_id].graph.networks:
            group = group_id(job_id, network)
            info = self.state.groups.get(group)
            if info is not None and info.status is GroupStatus.ACTIVE:
                self.driver.cancel(group, "cancelled by the client")

    # ------------------------------------------------------------ reads

    def job_document(self, job_id: int) -> dict[str, Any] | None:
        """The job as JSON: live progress while it runs, the journaled result after."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                return self._live_document(job)
        journaled = self.journal.get(job_id)
        if journaled is None:
            return None
        if journaled.result is not None:
            return journaled.result
        return {"id": job_id, "graph": journaled.graph, "state": journaled.state,
                "attempts": journaled.attempts, "accepted_at": journaled.accepted_at,
                "networks": {}}

    def _live_document(self, job: _ActiveJob) -> dict[str, Any]:
        state = "running" if job.started_at is not None else "queued"
        return {"id": job.job_id, "graph": job.graph.name, "state": state,
                "attempts": job.attempt, "accepted_at": job.accepted_at,
                "started_at": job.started_at, "cancel_requested": job.cancel_requested,
                "networks": {name: {"status": progress.state,
                                    "load_ms": progress.load_us / 1000,
                                    "exec_ms": progress.exec_us / 1000}
                             for name, progress in job.networks.items()}}

    def outputs_npz(self, job_id: int) -> bytes | None:
        return self.journal.outputs(job_id)

    def is_final(self, document: Mapping[str, Any]) -> bool:
        return document.get("state") in FINAL_STATES

    def active_jobs(self) -> int:
        with self._lock:
            return len(self._jobs)

    def state_sizes(self) -> dict[str, int]:
        """Entries held for jobs by the scheduler and the service (flat over time)."""
        driver, backend, state = self.driver, self.backend, self.state
        sizes = {
            "tasks": len(state.tasks), "groups": len(state.groups), "locks": len(state.locks),
            "gated": len(state.gated),
            "driver_jobs": len(driver._job_groups) + len(driver._ended_job_groups)
            + len(driver._registered_jobs) + len(driver._unforgotten) + len(driver._releases),
            "driver_errors": len(driver.errors) + len(driver.error_details),
            "backend": len(backend.outputs) + len(backend.stages.sessions)
            + len(backend.stages.tensors) + len(backend.stages.run_options)
            + len(backend.inputs_ready) + len(backend.meter.timeline),
            "service_jobs": len(self._jobs),
        }
        if self.context is not None:
            sizes["context"] = (len(self.context.job_networks) + len(self.context.outcome)
                                + len(self.context.ended))
        return sizes

    # ------------------------------------------------------------ the loop's callbacks

    def _inputs_for(self, job_id: int, network: str,
                    upstream_outputs: Mapping[str, Mapping[str, np.ndarray]]
                    ) -> dict[str, np.ndarray]:
        job = self._jobs[job_id]
        feeds = job.feeds.pop(network, None)
        if feeds is not None:
            return feeds
        return network_feeds(job.graph, self.config.manifests[network], job.job_input,
                             upstream_outputs)

    def _decide(self, job_id: int, network: str,
                upstream_outputs: Mapping[str, Mapping[str, Any]]) -> bool:
        return should_run(self._jobs[job_id].graph.workload, network, job_id, upstream_outputs)

    def _job_ended(self, job_id: int, now_us: int) -> None:
        """Collect a job's result (the loop's thread, before the job is forgotten)."""
        with self._lock:
            job = self._jobs[job_id]
            job.ending = True
        networks, outputs = {}, {}
        failed = False
        inline_limit = self.config.limits["inline_output_elements"]
        for name in job.graph.networks:
            group = group_id(job_id, name)
            info = self.state.groups.get(group)
            core_status = info.status.value if info is not None else "cancelled"
            status = (self.context.network_status(group, core_status)
                      if self.context is not None else core_status)
            error = self.driver.errors.pop(group, None)
            self.driver.error_details.pop(group, None)
            tensors = self.backend.outputs.pop(group, {})
            failed |= status == "failed"
            progress = job.networks[name]
            progress.state = status
            record: dict[str, Any] = {
                "status": status, "load_ms": progress.load_us / 1000,
                "exec_ms": progress.exec_us / 1000,
                "started_ms": None if progress.started_us is None else progress.started_us / 1000,
                "ended_ms": None if progress.ended_us is None else progress.ended_us / 1000}
            if info is not None and info.reason:
                record["reason"] = info.reason
            if error is not None:
                record["error"] = error
            if status == "done":
                record["outputs"] = {key: _tensor_json(value, inline_limit)
                                     for key, value in tensors.items()}
                outputs.update({f"{name}/{key}": value for key, value in tensors.items()})
            networks[name] = record
            self.metrics.networks_finished.labels(name, status).inc()
            if progress.ended_us is not None:
                self.metrics.network_response.labels(name).observe(progress.ended_us / 1e6)
        state = "cancelled" if job.cancel_requested else "failed" if failed else "done"
        ended_at = self.clock()
        result = {"id": job_id, "graph": job.graph.name, "state": state,
                  "attempts": job.attempt, "accepted_at": job.accepted_at,
                  "started_at": job.started_at, "ended_at": ended_at,
                  "response_ms": round((ended_at - job.accepted_at) * 1000, 3),
                  "networks": networks}
        npz = _npz(outputs) if outputs else None
        self._writes.put(lambda: self._write_final(job_id, state, result, npz))

    def _writer(self) -> None:
        """Journal each ended job's result, then publish it; prune old results."""
        next_prune = time.monotonic() + _PRUNE_INTERVAL_S
        while True:
            try:
                item = self._writes.get(timeout=max(0.0, next_prune - time.monotonic()))
            except queue.Empty:
                self.journal.prune(self.config.retention_s)
                next_prune = time.monotonic() + _PRUNE_INTERVAL_S
                continue
            if item is None:
                return
            item()

    def _write_final(self, job_id: int, state: str, result: dict[str, Any],
                     outputs: bytes | None) -> None:
        try:
            written = self.journal.finish(job_id, state, result, outputs)
        except Exception:  # the disk: the job stays unfinished and runs again at start
            log.exception("cannot journal the result of job %d", job_id)
            written = False
        self._published(job_id, state, result, written)

    def _write_running(self, job_id: int, started_at: float) -> None:
        try:
            self.journal.mark_running(job_id, started_at)
        except Exception:  # informative only: queued and running jobs both resume
            log.exception("cannot journal that job %d started", job_id)

    def _published(self, job_id: int, state: str, result: Mapping[str, Any],
                   written: bool) -> None:
        with self._idle:
            job = self._jobs.pop(job_id, None)
            self.metrics.queue_jobs.set(len(self._jobs))
            if not self._jobs:
                self._idle.notify_all()
        if written:
            self.metrics.jobs_finished.labels(result["graph"], state).inc()
            if job is not None and "response_ms" in result:
                self.metrics.job_response.labels(result["graph"]).observe(
                    result["response_ms"] / 1000)
        for listener in self.on_final:
            listener(job_id)


def _tensor_json(value: np.ndarray, inline_limit: int) -> dict[str, Any]:
    array = np.asarray(value)
    document: dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
    if array.size <= inline_limit:
        document["data"] = array.tolist()
    return document


def _npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


class _JobObserver(Observer):
    """The driver's reports, turned into job progress, results and metrics."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def _progress(self, task_id: str) -> tuple[_ActiveJob, _NetworkProgress] | None:
        job_id, network = parse_group(task_id.rsplit("/", 2)[0])
        job = self.service._jobs.get(job_id)
        if job is None:
            return None
        return job, job.networks[network]

    def dispatched(self, task_id: str, worker: int, now_us: int) -> None:
        found = self._progress(task_id)
        if found is None:
            return
        job, progress = found
        if progress.started_us is None:
            progress.started_us = now_us - job.submitted_us
            progress.state = "running"
        if job.started_at is None:
            job.started_at = self.service.clock()
            started_at, job_id = job.started_at, job.job_id
            self.service._writes.put(lambda: self.service._write_running(job_id, started_at))
            for listener in self.service.on_started:
                listener(job_id)

    def ended(self, record: ScheduledTask) -> None:
        found = self._progress(record.task_id)
        if found is None or record.worker < 0:
            return
        _, progress = found
        duration_us = record.end_us - record.start_us
        kind = record.task_id.rsplit("/", 1)[1]
        if kind == "load":
            progress.load_us += duration_us
        else:
            progress.exec_us += duration_us
        network = parse_group(record.task_id.rsplit("/", 2)[0])[1]
        self.service.metrics.task_seconds.labels(network, kind).inc(duration_us / 1e6)

    def over_commit(self, over_commit: OverCommit) -> None:
        self.service.metrics.over_commits.labels(over_commit.reason).inc()
        if over_commit.reason == "violation":
            self.service.violations += 1

    def memory(self, now_us: int, reserved_bytes: int, measured_bytes: int | None) -> None:
        service = self.service
        service.metrics.reserved_bytes.set(reserved_bytes)
        service.peak_reserved_bytes = max(service.peak_reserved_bytes, reserved_bytes)

    def group_ended(self, group: str, status: GroupStatus, now_us: int) -> None:
        job_id, network = parse_group(group)
        job = self.service._jobs.get(job_id)
        if job is not None:
            job.networks[network].ended_us = now_us - job.submitted_us

    def job_ended(self, job_id: int, now_us: int) -> None:
        self.service._job_ended(job_id, now_us)
        self.service.metrics.state_entries.set(
            len(self.service.state.tasks) + len(self.service.state.groups)
            + len(self.service.state.locks))


def token_matches(expected: bytes, offered: str | None) -> bool:
    """Constant-time comparison of a bearer token (hmac.compare_digest)."""
    if offered is None:
        return False
    return hmac.compare_digest(expected, offered.encode("utf-8", "surrogateescape"))


def read_token(config: ServeConfig) -> bytes | None:
    if config.token_file is None:
        return None
    return config.token_file.read_text().strip().encode()


def readiness(service: Service) -> dict[str, Any]:
    """The checks of /readyz: store readable, budget sane, journal writable, accepting."""
    config = service.config
    store_ok = all(os.access(config.store / name / MANIFEST_NAME, os.R_OK)
                   for name in config.manifests)
    largest = max((largest_task_bytes(m) for m in config.manifests.values()), default=0)
    checks = {
        "store_readable": store_ok,
        "budget_sane": 0 < service.budget_bytes and largest <= service.budget_bytes,
        "journal_writable": service.journal.writable(),
        "accepting": service.accepting,
    }
    return {"ready": all(checks.values()), "checks": checks,
            "memory_budget_bytes": service.budget_bytes, "budget": service.budget_how,
            "largest_task_bytes": largest}
