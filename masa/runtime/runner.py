"""Running a workload end to end: load it, build its task graph, execute or simulate it.

This module owns the glue between the data (workload YAML, store manifests),
the pure core, and the two executors, so that `masa run`, `masa compare`,
`masa infer`, `masa demo` and the benchmarks all run a workload the same way:

    prepared = prepare_run(workload_path, store_dir, context="wait")
    outcome = execute(prepared, RunSettings(policy="masa", ...), simulate=True)

A run's outcome has the same shape for both executors (schedule, per-network
status, memory), which masa.report.report turns into the report JSON and trace.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from masa.common.errors import RunFailed, UserError, one_line
from masa.common.units import format_bytes
from masa.runtime.driver import Observer
from masa.runtime.registry import POLICY_NAMES, make_policy, policy_stats, weights_copied
from masa.runtime.threads import (
    DEFAULT_MEMORY_SOURCE,
    MEMORY_SOURCES,
    RealExecutor,
    RealRunConfig,
    RealRunResult,
    default_heap_slack_bytes,
)
from masa.runtime.virtual import DeviceModel, SimulationResult, simulate_graph
from masa.sched.context import CONTEXT_MODES, ContextController
from masa.sched.core import OverCommit
from masa.sched.jobs import JobSpec, build_job_graph, build_workload_graph, group_id, task_id
from masa.sched.taskgraph import ScheduledTask, TaskGraph, TaskKind
from model_prep.feeds import bind_feeds
from model_prep.manifest import NetworkManifest, load_manifest, load_store_network
from model_prep.store_lock import PinnedNetwork
from workloads.generation import generate_jobs, resolve_workload_path, should_run
from workloads.inputs import network_inputs
from workloads.loader import load_workload
from workloads.model import TENSOR_PREDICATE_KINDS, Workload

log = logging.getLogger(__name__)

POLICIES = POLICY_NAMES


@dataclass(frozen=True)
class RunSettings:
    policy: str = "masa"
    workers: int = 2
    memory_budget_bytes: int = 512 * 2**20
    memory_source: str = DEFAULT_MEMORY_SOURCE
    intra_op_threads: int = 1
    # Real runs: keep every network's outputs in RunOutcome.outputs (by group).
    # Off by default: long runs would otherwise hold every job's results.
    keep_outputs: bool = False
    # masa's read-ahead window: the resident bytes of stages loaded ahead of their
    # EXEC (None: as many as memory allows; MasaPolicy). Other policies ignore it.
    read_ahead_bytes: int | None = None
    # Real runs: at most this many bytes of unloaded stages' files stay cached, those
    # unloaded first; the others are dropped at their unload (masa.runtime.pagecache).
    # None: the kernel alone decides. The simulator does not model it.
    keep_cached_bytes: int | None = None
    # masa's cached-stages-first rule (MasaPolicy); off: smallest-first, as before it.
    cache_first: bool = True
    # masa and masa-noplan: keep loaded stages between jobs within this many bytes of
    # the budget, evicted when a task needs the memory (masa.sched.core). 0: off.
    keep_loaded_bytes: int = 0

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise UserError(f"--policy: expected one of {', '.join(POLICIES)}, "
                            f"got {self.policy!r}")
        if self.workers < 1:
            raise UserError(f"--workers: expected a positive integer, got {self.workers}")
        if self.memory_source not in MEMORY_SOURCES:
            raise UserError(f"--memory-source: expected one of {', '.join(MEMORY_SOURCES)}, "
                            f"got {self.memory_source!r}")
        if self.read_ahead_bytes is not None and self.read_ahead_bytes < 0:
            raise UserError(f"--read-ahead: expected a size >= 0, got {self.read_ahead_bytes}")
        if self.keep_cached_bytes is not None and self.keep_cached_bytes < 0:
            raise UserError(f"--keep-cached: expected a size >= 0, got {self.keep_cached_bytes}")
        if self.keep_loaded_bytes < 0:
            raise UserError(f"--keep-loaded: expected a size >= 0, got {self.keep_loaded_bytes}")


@dataclass(frozen=True)
class PreparedRun:
    """A workload resolved against a store: jobs, manifests and the task graph."""

    workload: Workload
    context: str
    manifests: Mapping[str, NetworkManifest]
    jobs: tuple[JobSpec, ...]
    graph: TaskGraph
    upstreams: Mapping[str, tuple[str, ...]]
    # Each network's version held for the run (model_prep.store_lock): its stage
    # files are read from the pinned directory, even if it is re-prepared meanwhile.
    pins: tuple[PinnedNetwork, ...] = ()

    @property
    def network_versions(self) -> dict[str, str]:
        """Network name -> sha256 of the manifest the run pinned."""
        return {pin.name: pin.version for pin in self.pins}


@dataclass
class RunOutcome:
    """What one run did, the same for the real executor and the simulator (times in us)."""

    simulated: bool
    settings: RunSettings
    context: str
    graph: TaskGraph
    jobs: tuple[JobSpec, ...]
    schedule: Sequence[ScheduledTask]
    network_status: dict[str, str]  # group -> done / failed / skipped / aborted / cancelled
    network_reason: dict[str, str]
    over_commits: list[OverCommit]
    peak_reserved_bytes: int
    final_reserved_bytes: int
    # (time_us, reserved, measured memory above the baseline: real runs only, else None)
    memory_timeline: Sequence[tuple[int, int, int | None]]
    # Anonymous above the run's baseline + loaded stages' weights in memory (real runs)
    peak_measured_bytes: int | None = None
    live_sessions_after: int = 0
    dispatch_order: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    error_details: dict[str, str] = field(default_factory=dict)  # group -> traceback
    outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    process_memory_after: dict[str, int] = field(default_factory=dict)  # real runs: by kind
    # Real runs: peak measured, anonymous / file-backed, cgroup (RealRunResult.measured_memory)
    measured_memory: dict[str, Any] | None = None
    policy_stats: dict[str, int] = field(default_factory=dict)  # masa.runtime.registry
    network_versions: dict[str, str] = field(default_factory=dict)  # name -> manifest sha256
    # The signal that stopped a real run (SIGINT, SIGTERM): the outcome is partial and
    # the networks it did not finish have the status "interrupted".
    interrupted: str | None = None
    # Real runs: CPU time of the executor's loop thread (RealRunResult.loop_cpu_us)
    loop_cpu_us: int | None = None


def load_manifests(store_dir: str | Path, names: Sequence[str]) -> dict[str, NetworkManifest]:
    return {name: load_store_network(store_dir, name) for name in names}


def pin_manifests(store_dir: str | Path, names: Sequence[str]
                  ) -> tuple[dict[str, NetworkManifest], tuple[PinnedNetwork, ...]]:
    """Each network's manifest, read from the version the run pins (its stage files
    are then read from that version too, whatever a prepare does meanwhile)."""
    if not Path("/proc/self/fd").is_dir():  # no /proc: unpinned
        return load_manifests(store_dir, names), ()
    manifests, pins = {}, []
    for name in names:
        if not (Path(store_dir) / name).is_dir():
            load_store_network(store_dir, name)  # the one-line error naming the store's
        pin = PinnedNetwork(store_dir, name)
        pins.append(pin)
        try:
            manifests[name] = load_manifest(pin.directory)
        except UserError as error:  # name the store's path, not /proc/self/fd/N
            message = str(error).replace(str(pin.directory), str(pin.store_path))
            # (type(error)(message) would split a ValidationError's message into letters)
            raise (RunFailed if isinstance(error, RunFailed) else UserError)(message) from None
    return manifests, tuple(pins)


def prepare_run(
    workload_path: str | Path,
    store_dir: str | Path,
    context: str = "oblivious",
    *,
    jobs: Sequence[JobSpec] | None = None,
    job_limit: int | None = None,
) -> PreparedRun:
    """Load and validate a workload against a store and build its task graph.

    jobs: run these instead of the workload's own; job_limit: only the first N.
    """
    if context not in CONTEXT_MODES:
        raise UserError(f"--context: expected one of {', '.join(CONTEXT_MODES)}, "
                        f"got {context!r}")
    store = Path(store_dir)
    workload = load_workload(resolve_workload_path(workload_path), store_dir=store)
    manifests, pins = pin_manifests(store, workload.networks)
    if jobs is None and job_limit is not None and job_limit < workload.arrivals.count:
        # The first N jobs, without generating the others (the seeded draws are
        # sequential: the first N of a shorter stream are the same).
        workload = replace(workload, arrivals=replace(workload.arrivals, count=job_limit))
    job_list = tuple(jobs) if jobs is not None else tuple(generate_jobs(workload))
    if job_limit is not None:
        job_list = job_list[:job_limit]
    upstreams = {node.name: tuple(node.after) for node in workload.nodes if node.after}
    graph = build_workload_graph(
        job_list, manifests, workload.networks,
        upstreams=upstreams if context == "preempt" else None,
    )
    # In every context a derived input needs its upstreams' outputs (under CA-wait
    # the gate already ensures it; the edges then change nothing).
    graph = with_transform_waits(graph, job_list, workload, manifests)
    return PreparedRun(workload, context, manifests, job_list, graph,
                       upstreams if context != "oblivious" else {}, pins)


def with_transform_waits(graph: TaskGraph, jobs: Sequence[JobSpec], workload: Workload,
                          manifests: Mapping[str, NetworkManifest]) -> TaskGraph:
    """A network whose input derives from upstream outputs may load early, but its
    first EXEC needs those outputs: it waits for the upstreams' last EXECs."""
    extra: list[tuple[str, str]] = []
    for job in jobs:
        for network in job.networks:
            node = workload.node(network)
            if node.transform is None:
                continue
            entries = [s.stage_id for s in manifests[network].stages if not s.producers]
            for upstream in node.after:
                if upstream not in job.networks:
                    continue
                consumed = {p for s in manifests[upstream].stages for p in s.producers}
                sinks = [s.stage_id for s in manifests[upstream].stages
                         if s.stage_id not in consumed]
                extra += [(task_id(job.job_id, upstream, sink, TaskKind.EXEC),
                           task_id(job.job_id, network, entry, TaskKind.EXEC))
                          for sink in sinks for entry in entries]
    if not extra:
        return graph
    return TaskGraph(graph.tasks, graph.precedence + tuple(extra), graph.locks,
                     graph.start_after)


@dataclass
class _ConditionFailures:
    """Conditions (`when:`) that raised instead of answering, by group: the network is
    not run (the controller hears "no"), then reported failed with the exception."""

    errors: dict[str, str] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)

    def record(self, job_id: int, network: str, error: Exception) -> None:
        group = group_id(job_id, network)
        self.errors[group] = (f"condition of {network!r} raised {type(error).__name__}: "
                              f"{one_line(error)}")
        self.details[group] = traceback.format_exc()
        log.error("job %d: %s", job_id, self.errors[group])
        log.debug("job %d: the condition of %r failed:\n%s", job_id, network,
                  self.details[group])

    def apply(self, outcome: RunOutcome) -> None:
        for group, message in self.errors.items():
            outcome.network_status[group] = "failed"
            outcome.network_reason[group] = message
            outcome.errors.setdefault(group, message)
            outcome.error_details.setdefault(group, self.details[group])


def _controller(prepared: PreparedRun, simulate: bool,
                failures: _ConditionFailures | None = None) -> ContextController | None:
    if prepared.context == "oblivious" or not prepared.upstreams:
        return None
    workload = prepared.workload
    warned: set[str] = set()

    def decide(job_id: int, network: str, upstream_outputs: Mapping) -> bool:
        if simulate:
            node = workload.node(network)
            if any(c.kind in TENSOR_PREDICATE_KINDS or c.kind == "call" for c in node.when):
                if network not in warned:
                    warned.add(network)
                    log.warning("simulation cannot evaluate the output condition of %r: "
                                "assuming it holds", network)
                return True
            return should_run(workload, network, job_id, {})
        try:
            return should_run(workload, network, job_id, upstream_outputs)
        except Exception as error:  # a user's predicate: its network fails, not the run
            if failures is None:
                raise
            failures.record(job_id, network, error)
            return False

    return ContextController(prepared.context, prepared.upstreams, decide)


def execute(prepared: PreparedRun, settings: RunSettings, *, simulate: bool,
            observers: Sequence[Observer] = ()) -> RunOutcome:
    """Run the prepared workload under `settings`, for real or simulated.

    observers: told of a real run's progress as it goes (masa.runtime.driver).
    """
    settings.check()
    failures = _ConditionFailures()
    controller = _controller(prepared, simulate, failures)
    if simulate:
        outcome, _ = _simulate(prepared, settings, controller)
    else:
        try:
            outcome = _run_real(prepared, settings, controller, observers)
        except KeyboardInterrupt as interruption:  # masa.common.signals: a partial outcome
            partial = getattr(interruption, "partial", None)
            if isinstance(partial, RunOutcome):
                failures.apply(partial)
            raise
    failures.apply(outcome)
    outcome.network_versions = prepared.network_versions
    for pin in prepared.pins:
        if pin.replaced():
            log.info("network %r was prepared again during the run; the run used the "
                     "version it started with (manifest sha256 %s)", pin.name, pin.version)
    return outcome


def simulate_run(prepared: PreparedRun, settings: RunSettings, *,
                 device: DeviceModel | None = None) -> tuple[RunOutcome, SimulationResult]:
    """The prepared workload simulated under `settings` (on `device`: storage, page
    cache, kills), with its context-aware conditions decided as `execute` decides them
    in a simulation; the outcome and the simulator's own result."""
    settings.check()
    return _simulate(prepared, settings, _controller(prepared, True), device)


def _simulate(prepared: PreparedRun, settings: RunSettings,
              controller: ContextController | None,
              device: DeviceModel | None = None) -> tuple[RunOutcome, SimulationResult]:
    policy = make_policy(settings.policy, read_ahead_bytes=settings.read_ahead_bytes,
                         copied_weights=weights_copied(prepared.manifests),
                         cache_first=settings.cache_first,
                         keep_loaded_bytes=settings.keep_loaded_bytes)
    result = simulate_graph(prepared.graph, policy=policy, workers=settings.workers,
                            memory_budget_bytes=settings.memory_budget_bytes,
                            driver_options={"context": controller}, device=device)
    status = {
        group: controller.network_status(group, value) if controller else value
        for group, value in result.group_status.items()
    }
    return RunOutcome(
        simulated=True, settings=settings, context=prepared.context, graph=prepared.graph,
        jobs=prepared.jobs, schedule=list(result.schedule), network_status=status,
        network_reason=dict(result.group_reason), over_commits=list(result.over_commits),
        peak_reserved_bytes=result.peak_reserved_bytes,
        final_reserved_bytes=result.final_reserved_bytes,
        memory_timeline=[(t, reserved, None) for t, reserved in result.memory_timeline],
        dispatch_order=list(result.dispatch_order),
        policy_stats=policy_stats(policy) | result.kept_stats,
    ), result


def _run_real(prepared: PreparedRun, settings: RunSettings,
              controller: ContextController | None,
              observers: Sequence[Observer] = ()) -> RunOutcome:
    workload = prepared.workload
    manifests = prepared.manifests

    def inputs_for(job_id: int, network: str, upstream_outputs: Mapping) -> dict:
        return network_inputs(workload, manifests[network], job_id, upstream_outputs)

    executor = RealExecutor(
        prepared.graph, manifests, inputs_for,
        RealRunConfig(workers=settings.workers, memory_budget_bytes=settings.memory_budget_bytes,
                      policy=settings.policy, memory_source=settings.memory_source,
                      intra_op_threads=settings.intra_op_threads,
                      keep_outputs=settings.keep_outputs,
                      read_ahead_bytes=settings.read_ahead_bytes,
                      keep_cached_bytes=settings.keep_cached_bytes,
                      cache_first=settings.cache_first,
                      keep_loaded_bytes=settings.keep_loaded_bytes,
                      heap_slack_bytes=default_heap_slack_bytes(settings.memory_budget_bytes)),
        context=controller,
    )
    executor.driver.observers.extend(observers)
    log.debug("real run of %d jobs started (SIGINT or SIGTERM stops it: partial outcome)",
              len(prepared.jobs))
    try:
        result = executor.run()
    except KeyboardInterrupt as interruption:  # SIGINT/SIGTERM: what ran, as an outcome
        partial = getattr(interruption, "partial", None)
        if isinstance(partial, RealRunResult):
            interruption.partial = _real_outcome(  # type: ignore[attr-defined]
                prepared, settings, partial)
        raise
    return _real_outcome(prepared, settings, result)


def _real_outcome(prepared: PreparedRun, settings: RunSettings,
                  result: RealRunResult) -> RunOutcome:
    return RunOutcome(
        simulated=False, settings=settings, context=prepared.context, graph=prepared.graph,
        jobs=prepared.jobs, schedule=result.schedule, network_status=result.group_status,
        network_reason=result.group_reason, over_commits=result.over_commits,
        peak_reserved_bytes=result.peak_reserved_bytes,
        final_reserved_bytes=result.final_reserved_bytes,
        memory_timeline=result.memory_timeline,
        peak_measured_bytes=result.peak_measured_bytes,
        live_sessions_after=result.live_sessions_after,
        dispatch_order=result.dispatch_order, errors=result.errors,
        error_details=result.error_details,
        outputs=result.outputs, process_memory_after=result.process_memory_after,
        measured_memory=result.measured_memory(), interrupted=result.interrupted,
        policy_stats=result.policy_stats, loop_cpu_us=result.loop_cpu_us,
    )


def check_budget(graph: TaskGraph, memory_budget_bytes: int) -> None:
    """Refuse a budget below what the largest task needs alone (its memory and the
    locks it opens): no schedule could keep it, and the run would go over it at once."""
    opened: dict[str, int] = {}
    for lock in graph.locks:
        opened[lock.from_task] = opened.get(lock.from_task, 0) + lock.memory_bytes
    need_bytes, task_id = max(((t.memory_bytes + opened.get(t.task_id, 0), t.task_id)
                               for t in graph.tasks), default=(0, ""))
    if memory_budget_bytes < need_bytes:
        task = graph.by_id[task_id]
        at_least_kib = -(-need_bytes // 1024)
        # A layer's weights can be sliced into stages that fit (model_prep.slicing).
        sliceable = task.kind is TaskKind.LOAD and task.layer_type in ("conv", "fc")
        budget = (f"{memory_budget_bytes >> 20}MiB" if memory_budget_bytes % 2**20 == 0
                  else f"{-(-memory_budget_bytes // 1024)}KiB")
        raise UserError(f"--memory {format_bytes(memory_budget_bytes)} is below what the "
                        f"largest task needs alone: {format_bytes(need_bytes)} ({need_bytes} "
                        f"bytes, {task.network}/{task.stage_id} {task.kind.value}); give at "
                        f"least --memory {at_least_kib}KiB"
                        + (f", or prepare {task.network} again with --target-memory {budget} "
                           "(masa prepare, masa zoo) to slice its large layers"
                           if sliceable else ""))


def run_network(store: Path, name: str, feeds: Mapping[str, np.ndarray],
                settings: RunSettings) -> dict[str, np.ndarray]:
    """One network, one input, through the layer scheduler (real executor)."""
    manifest = load_store_network(store, name)
    bound = bind_feeds(manifest, dict(feeds))
    job = JobSpec(job_id=0, arrival_us=0, networks=(name,))
    graph = build_job_graph(job, {name: manifest}, [name])
    check_budget(graph, settings.memory_budget_bytes)
    executor = RealExecutor(
        graph, {name: manifest}, lambda job_id, network, upstream: bound,
        RealRunConfig(workers=settings.workers, memory_budget_bytes=settings.memory_budget_bytes,
                      policy=settings.policy, memory_source=settings.memory_source),
    )
    result = executor.run()
    group = group_id(0, name)
    if result.group_status.get(group) != "done":
        raise RunFailed(f"network {name!r} failed: "
                            f"{result.errors.get(group, 'unknown error')}")
    return result.outputs[group]
