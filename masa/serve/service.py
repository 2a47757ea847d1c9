"""The daemon's engine: the live driver, the jobs it runs, their results, crash-resume.

Owns everything between an accepted request and a journaled result, on four
kinds of threads:

- callers (the HTTP server's event loop and executor threads) accept jobs,
  `cancel` and read; `begin_accept` decodes and checks the input (on the
  event loop only for a tensor the networks take as it is), queues the
  job's journal record and submits its task graph to the driver;
  `end_accept` follows the record's commit: the job starts while it is
  being journaled (the journal's cost is not added to its response time),
  and it is in the journal before its 202 (a job whose record cannot be
  written is cancelled and refused);
- the scheduler thread runs masa.runtime.driver's loop with `live=` (the one
  loop of `masa run` and the simulator) on a `ThreadBackend`, with
  `forget_ended`: an ended job leaves the scheduler state, so the state is
  as large as the unfinished work, not as the service's age;
- the backend's worker threads run LOAD and EXEC tasks (ONNX Runtime);
- the journal writer thread takes every record queued (new jobs, starts,
  ends) and writes them in one transaction, in the order they were queued
  (a job's row before its end). It encodes an ended job's result (JSON and
  .npz) and only after the commit publishes it (`on_final` listeners,
  metrics, the last results kept encoded for the long-polls that wait on
  them), so a client never sees a result that a crash could take back. It
  also prunes old results. Without fsync (`journal_sync: normal`) the
  scheduler's thread writes a result itself once the job's row is
  committed: cheaper than the hand-over.

On `start`, every journaled job that is not final runs again (a cancel
requested before the crash ends it as cancelled): after a kill -9 each
accepted job ends exactly once. `drain` stops accepting and waits for the
running jobs within a grace time; `close` stops the loop, leaving the
unfinished jobs queued in the journal for the next start.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from masa.common.errors import UserError, one_line
from masa.common.procmem import find_memory_cgroup, read_cgroup_memory, rss_bytes
from masa.common.units import format_bytes
from masa.runtime.driver import Driver, Observer
from masa.runtime.registry import close_policy, keep_loaded_for, make_policy, weights_copied
from masa.runtime.runner import with_transform_waits
from masa.runtime.threads import RealRunConfig, ThreadBackend, default_heap_slack_bytes
from masa.sched.context import ContextController, parse_group
from masa.sched.core import GroupStatus, OverCommit, new_state
from masa.sched.jobs import JobSpec, build_job_graph, group_id, network_plans, stage_costs
from masa.sched.taskgraph import ScheduledTask, TaskGraph
from masa.serve.config import GraphSpec, ServeConfig
from masa.serve.inputs import (
    BadInput,
    JobInput,
    Limits,
    TooLarge,
    decode_body,
    encode_npz,
    network_feeds,
    sniff_kind,
)
from masa.serve.journal import (
    FINAL_STATES,
    Final,
    Journal,
    JournaledJob,
    NewJob,
    Started,
    Write,
)
from masa.serve.metrics import Metrics
from model_prep.manifest import MANIFEST_NAME, NetworkManifest
from workloads.generation import should_run

log = logging.getLogger(__name__)

_PRUNE_INTERVAL_S = 60.0
# Ended jobs whose result stays encoded in memory: a long-poll woken by the end
# answers without reading the journal. Bounded, so memory stays flat.
_RECENT_RESULTS = 64
_MAX_BATCH = 256  # journal records in one transaction
_STARTED_DELAY_S = 1.0  # the longest a job's start waits to share another record's commit


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
    committed: Future[None] | None = None  # its row's commit; None: resumed, in the journal
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
        # One request decoded at a time: the transient memory of decoding and checking
        # (unmodelled, like any memory outside the ledger) is one job's, not one per
        # HTTP thread.
        self._decoding = threading.Lock()
        self._accepting = False
        self._live = True
        self.on_final: list[Callable[[int], None]] = []  # called after a result is journaled
        self.on_started: list[Callable[[int], None]] = []  # a job's first task was dispatched
        self.violations = 0  # over-commits of a memory-aware policy while others ran
        self.peak_reserved_bytes = 0
        self._plans = network_plans(config.manifests)  # the same for every job
        self.state = new_state(config.workers, self.budget_bytes,
                               make_policy(config.policy, real_time=True,
                                           read_ahead_bytes=config.read_ahead_bytes,
                                           copied_weights=weights_copied(config.manifests),
                                           keep_loaded_bytes=keep_loaded_for(
                                               config.policy, config.keep_loaded_bytes,
                                               self.budget_bytes)))
        controller = None
        if config.context != "oblivious" and config.upstreams:
            controller = _GraphContext(config.context, config.upstreams, self._decide)
            controller.graph_of = lambda job_id: self._jobs[job_id].graph
        self.context = controller
        self.backend = _ServeBackend(
            config.manifests, self._inputs_for,
            RealRunConfig(workers=config.workers, memory_budget_bytes=self.budget_bytes,
                          policy=config.policy, memory_source=config.memory_source,
                          intra_op_threads=config.intra_op_threads, keep_outputs=True,
                          heap_slack_bytes=default_heap_slack_bytes(self.budget_bytes),
                          keep_cached_bytes=config.keep_cached_bytes))
        self.driver = Driver(self.state, self.backend, context=controller,
                             observers=[_JobObserver(self)], forget_ended=True)
        # Journal records off the scheduler's thread, in order; None stops the writer.
        self._writes: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._recent: OrderedDict[int, tuple[str, bytes]] = OrderedDict()  # id -> state, JSON
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
        unfinished = self.journal.unfinished()
        self.journal.drop_orphan_bodies({journaled.job_id for journaled in unfinished})
        for journaled in unfinished:
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
                             attempt)
            resumed += 1
            self.metrics.jobs_resumed.inc()
        if resumed:
            log.info("resumed %d unfinished job(s) from %s", resumed, self.journal.path)
        return resumed

    def _finish_unrun(self, journaled: JournaledJob, state: str, reason: str) -> None:
        result = {"id": journaled.job_id, "graph": journaled.graph, "state": state,
                  "reason": reason, "attempts": journaled.attempts,
                  "accepted_at": journaled.accepted_at, "networks": {}}
        self._writes.put(_FinalWrite(self, journaled.job_id, state, result, {}))

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
        close_policy(self.state.policy)
        self.backend.close()
        self._writes.put(None)
        if self._writer_thread.is_alive():
            self._writer_thread.join()
        while True:  # queued after the writer stopped: refused, never waited on forever
            try:
                item = self._writes.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item.done(RuntimeError("the daemon stopped"))
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

    def begin_accept(self, graph_name: str, body: bytes, content_type: str, *,
                     on_loop: bool = False) -> tuple[int, Future[None]] | None:
        """Decode, check, queue the job's journal record and submit the job: its id and
        the record's commit, not waited for. ServeError when refused. With `on_loop`
        (the event loop calls it) None, doing nothing, unless the body is a tensor the
        job's networks take as it is (decoding it is a view, checking it a comparison)
        and no other request is being decoded: the caller then uses a worker thread."""
        if not self._accepting:
            raise ServeError(503, "the daemon is shutting down", "shutting_down")
        graph = self.config.graphs.get(graph_name)
        if graph is None:
            raise ServeError(400, f"unknown graph {graph_name!r} (offered: "
                             f"{', '.join(sorted(self.config.graphs))})", "unknown_graph")
        if len(body) > self.config.limits["max_body_bytes"]:
            raise ServeError(413, f"body of {len(body)} bytes, more than the limit of "
                             f"{self.config.limits['max_body_bytes']}", "too_large")
        job_input = self._decode(graph, body, content_type, on_loop)
        if job_input is None:
            return None
        committed: Future[None] = Future()
        with self._lock:
            limit = self.config.limits["max_queued_jobs"]
            if len(self._jobs) >= limit:
                raise ServeError(429, f"{len(self._jobs)} jobs are waiting or running (the "
                                 f"limit is {limit}): retry later", "queue_full",
                                 self.config.limits["retry_after_s"])
            job_id = self.journal.allocate_id()
            accepted_at = self.clock()
            # Queued before the job is submitted: its row is written before its end.
            self._writes.put(_AcceptWrite(
                NewJob(job_id, graph.name, content_type, body, accepted_at), committed))
            self._submit(job_id, graph, job_input, accepted_at, 1, committed)
        return job_id, committed

    def end_accept(self, job_id: int, graph_name: str, error: BaseException | None) -> int:
        """After the record's commit (`error`: why it failed): the job id for the 202, or
        ServeError 503 and the job cancelled, unjournaled (the disk)."""
        if error is not None:
            self._cancel(job_id)
            raise ServeError(503, f"cannot journal the job: {one_line(error)}", "journal")
        self.metrics.jobs_accepted.labels(graph_name).inc()
        return job_id

    def _decode(self, graph: GraphSpec, body: bytes, content_type: str,
                on_loop: bool) -> JobInput | None:
        """The body decoded and checked for the graph (one request at a time); None when
        `on_loop` and it is not a tensor of the entry networks' input (see begin_accept)."""
        if on_loop:
            if not _is_npy(body, content_type) or not self._decoding.acquire(blocking=False):
                return None
        else:
            self._decoding.acquire()
        try:
            job_input = decode_body(body, content_type, self.limits)
            if not on_loop:
                self._check_entry_inputs(graph, job_input)
            elif not self._takes_as_is(graph, job_input):
                # Decoded again in a thread, with the full check; a tensor the networks
                # take as it is needs no check beyond its shape and dtype.
                return None
        except TooLarge as error:
            raise ServeError(413, str(error), "too_large") from None
        except (BadInput, ValueError) as error:
            raise ServeError(400, one_line(error), "bad_input") from None
        finally:
            self._decoding.release()
        return job_input

    def _takes_as_is(self, graph: GraphSpec, job_input: JobInput) -> bool:
        """Whether every network fed by the job input takes its one array unchanged (the
        same shape and dtype, no preprocess): making its inputs copies and resizes nothing."""
        (array,) = job_input.arrays.values()
        for node in graph.workload.nodes:
            if node.transform is not None:
                continue
            if node.name in graph.preprocess:
                return False
            for tensor in self.config.manifests[node.name].inputs:
                if tuple(tensor.shape) != array.shape or np.dtype(tensor.dtype) != array.dtype:
                    return False
        return True

    def _check_entry_inputs(self, graph: GraphSpec, job_input: JobInput) -> None:
        """Make the inputs of the networks fed by the job input, one at a time, and drop
        them: a bad input is a 400 before the job is accepted, not a failed network
        later. They are made again when each network starts: a queued job holds only
        its decoded input, not tensors the ledger does not see (the budget holds)."""
        for node in graph.workload.nodes:
            if node.transform is None:
                try:
                    network_feeds(graph, self.config.manifests[node.name], job_input, {})
                except ValueError as error:
                    raise BadInput(f"network {node.name!r}: {one_line(error)}") from None

    def _submit(self, job_id: int, graph: GraphSpec, job_input: JobInput, accepted_at: float,
                attempt: int, committed: Future[None] | None = None) -> None:
        """Hand a job to the scheduler (self._lock held); `committed`: its row's commit,
        when it is being journaled."""
        now_us = self.backend.now_us()
        job = _ActiveJob(job_id, graph, job_input, accepted_at, attempt, submitted_us=now_us,
                         committed=committed,
                         networks={name: _NetworkProgress() for name in graph.networks})
        self._jobs[job_id] = job
        self.metrics.queue_jobs.set(len(self._jobs))
        spec = JobSpec(job_id=job_id, arrival_us=now_us, networks=graph.networks)
        upstreams = ({node.name: node.after for node in graph.workload.nodes if node.after}
                     if self.config.context == "preempt" else None)
        task_graph: TaskGraph = build_job_graph(spec, self.config.manifests,
                                                self.config.network_order, upstreams=upstreams,
                                                plans=self._plans)
        task_graph = with_transform_waits(task_graph, [spec], graph.workload,
                                           self.config.manifests)
        self.driver.submit(task_graph)

    def cancel(self, job_id: int) -> str:
        """Cancel a job: 'cancelling', or its final state when it had already ended.
        ServeError 404 for an unknown job."""
        if self._cancel(job_id):
            self.journal.request_cancel(job_id)
            return "cancelling"
        journaled = self.journal.get(job_id)
        if journaled is None:
            raise ServeError(404, f"no job {job_id}", "not_found")
        return journaled.state

    def _cancel(self, job_id: int) -> bool:
        """Ask the loop to cancel a job's networks; False when the job is not running."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.ending:
                return False
            job.cancel_requested = True
            self.driver.call_soon(lambda: self._cancel_in_loop(job_id))
            return True

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

    def cached_view(self, job_id: int) -> tuple[str, bytes] | None:
        """A running or recently ended job's state and JSON document, from memory (cheap
        enough for the event loop); None when the journal must be read (`job_view`)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                document = self._live_document(job)
                return document["state"], json.dumps(document).encode()
            return self._recent.get(job_id)

    def job_view(self, job_id: int) -> tuple[str, bytes] | None:
        """The job's state and JSON document; None for an unknown job."""
        view = self.cached_view(job_id)
        if view is not None:
            return view
        document = self.job_document(job_id)
        if document is None:
            return None
        return document["state"], json.dumps(document).encode()

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
        networks: dict[str, dict[str, Any]] = {}
        outputs: dict[str, dict[str, np.ndarray]] = {}  # encoded by the journal writer
        failed = False
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
                outputs[name] = tensors
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
        final = _FinalWrite(self, job_id, state, result, outputs)
        committed = job.committed
        if self.journal.durable or (committed is not None and not (
                committed.done() and committed.exception() is None)):
            self._writes.put(final)  # an fsync, or after the row: the writer, in order
        else:
            # A commit without fsync (~0.4 ms) costs less here than handing the result
            # to the writer's thread and waiting for it to be scheduled.
            self._write_batch([final])

    def _writer(self) -> None:
        """Journal the queued records in batches, in order, then act on each; prune.

        A batch of nothing but job starts waits (up to _STARTED_DELAY_S) to share the
        next batch's commit: a start is informative (queued and running jobs both
        resume), not worth an fsync of its own under `synchronous=FULL`."""
        next_prune = time.monotonic() + _PRUNE_INTERVAL_S
        held: list[_Pending] = []  # starts waiting for a commit to share
        while True:
            wait_s = max(0.0, next_prune - time.monotonic())
            try:
                item = self._writes.get(timeout=min(wait_s, _STARTED_DELAY_S) if held
                                        else wait_s)
            except queue.Empty:
                if held:
                    self._write_batch(held)
                    held = []
                if time.monotonic() >= next_prune:
                    self._prune()
                    next_prune = time.monotonic() + _PRUNE_INTERVAL_S
                continue
            batch = [item]
            while batch[-1] is not None and len(batch) < _MAX_BATCH:
                try:
                    batch.append(self._writes.get_nowait())
                except queue.Empty:
                    break
            items = held + [pending for pending in batch if pending is not None]
            held = []
            if batch[-1] is not None and all(isinstance(i, _StartedWrite) for i in items):
                held = items
            elif items:
                self._write_batch(items)
            if batch[-1] is None:
                return

    def _prune(self) -> None:
        try:
            self.journal.prune(self.config.retention_s)
        except Exception:  # the disk: old results stay until the next prune
            log.exception("cannot prune the journal")

    def _write_batch(self, items: Sequence[_Pending]) -> None:
        """One transaction for the batch; when it fails, each record alone, so one bad
        record does not refuse the others."""
        ready: list[tuple[_Pending, Write]] = []
        for item in items:
            try:
                ready.append((item, item.record()))
            except Exception as error:  # a result that cannot be encoded: that job's
                log.exception("cannot encode a journal record")
                item.done(error)
        records = [record for _, record in ready]
        outcomes: list[bool | Exception]
        try:
            outcomes = list(self.journal.write(records))
        except Exception as error:
            outcomes = [error] if len(records) == 1 else [
                self._write_alone(record) for record in records]
        for (item, _), outcome in zip(ready, outcomes, strict=True):
            item.done(outcome)

    def _write_alone(self, record: Write) -> bool | Exception:
        try:
            return self.journal.write([record])[0]
        except Exception as error:
            return error

    def _published(self, job_id: int, state: str, result: Mapping[str, Any],
                   encoded: bytes | None) -> None:
        """A final record was written (`encoded`, the result's JSON) or could not be
        (None: the job stays unfinished in the journal and runs again at start)."""
        written = encoded is not None
        with self._idle:
            job = self._jobs.pop(job_id, None)
            if written:
                self._recent[job_id] = (state, encoded)
                while len(self._recent) > _RECENT_RESULTS:
                    self._recent.popitem(last=False)
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


def _is_npy(body: bytes, content_type: str) -> bool:
    try:
        return sniff_kind(body, content_type) == "npy"
    except BadInput:  # refused with its reason by the full decoding
        return False


class _Pending(Protocol):
    """A journal record queued for the writer, and what follows its commit."""

    def record(self) -> Write: ...
    def done(self, outcome: bool | Exception) -> None: ...


@dataclass
class _AcceptWrite:
    new_job: NewJob
    committed: Future[None]  # the accepting thread waits on it before the 202

    def record(self) -> Write:
        return self.new_job

    def done(self, outcome: bool | Exception) -> None:
        if isinstance(outcome, Exception):
            self.committed.set_exception(outcome)
        else:
            self.committed.set_result(None)


@dataclass
class _StartedWrite:
    started: Started

    def record(self) -> Write:
        return self.started

    def done(self, outcome: bool | Exception) -> None:
        if isinstance(outcome, Exception):  # informative only: queued and running jobs resume
            log.error("cannot journal that job %d started: %s", self.started.job_id,
                      one_line(outcome))


@dataclass
class _FinalWrite:
    """An ended job: its outputs are encoded here, on the writer's thread, not the loop's."""

    service: Service
    job_id: int
    state: str
    result: dict[str, Any]
    outputs: dict[str, dict[str, np.ndarray]]  # network -> its output tensors
    encoded: bytes = b""

    def record(self) -> Write:
        inline_limit = self.service.config.limits["inline_output_elements"]
        arrays = {}
        for network, tensors in self.outputs.items():
            self.result["networks"][network]["outputs"] = {
                key: _tensor_json(value, inline_limit) for key, value in tensors.items()}
            arrays.update({f"{network}/{key}": value for key, value in tensors.items()})
        text = json.dumps(self.result)
        self.encoded = text.encode()
        return Final(self.job_id, self.state, text, encode_npz(arrays) if arrays else None)

    def done(self, outcome: bool | Exception) -> None:
        if isinstance(outcome, Exception):  # the disk: the job runs again at start
            log.error("cannot journal the result of job %d: %s", self.job_id,
                      one_line(outcome))
        self.service._published(self.job_id, self.state, self.result,
                                self.encoded if outcome is True else None)


def _tensor_json(value: np.ndarray, inline_limit: int) -> dict[str, Any]:
    array = np.asarray(value)
    document: dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
    if array.size <= inline_limit:
        document["data"] = array.tolist()
    return document


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
            self.service._writes.put(_StartedWrite(Started(job.job_id, job.started_at)))
            for listener in self.service.on_started:
                listener(job.job_id)

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
        service.metrics.kept_loaded_bytes.set(service.state.ledger.kept_bytes)
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
