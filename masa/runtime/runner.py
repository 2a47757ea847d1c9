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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from masa.common.errors import RunFailed, UserError
from masa.runtime.registry import POLICY_NAMES, make_policy
from masa.runtime.threads import MEMORY_SOURCES, RealExecutor, RealRunConfig
from masa.runtime.virtual import simulate_graph
from masa.sched.context import CONTEXT_MODES, ContextController
from masa.sched.core import OverCommit
from masa.sched.jobs import JobSpec, build_job_graph, build_workload_graph, group_id, task_id
from masa.sched.taskgraph import ScheduledTask, TaskGraph, TaskKind
from model_prep.feeds import bind_feeds
from model_prep.manifest import NetworkManifest, load_store_network
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
    memory_source: str = "model"
    intra_op_threads: int = 1
    # Real runs: keep every network's outputs in RunOutcome.outputs (by group).
    # Off by default: long runs would otherwise hold every job's results.
    keep_outputs: bool = False

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise UserError(f"--policy: expected one of {', '.join(POLICIES)}, "
                            f"got {self.policy!r}")
        if self.workers < 1:
            raise UserError(f"--workers: expected a positive integer, got {self.workers}")
        if self.memory_source not in MEMORY_SOURCES:
            raise UserError(f"--memory-source: expected one of {', '.join(MEMORY_SOURCES)}, "
                            f"got {self.memory_source!r}")


@dataclass(frozen=True)
class PreparedRun:
    """A workload resolved against a store: jobs, manifests and the task graph."""

    workload: Workload
    context: str
    manifests: Mapping[str, NetworkManifest]
    jobs: tuple[JobSpec, ...]
    graph: TaskGraph
    upstreams: Mapping[str, tuple[str, ...]]


@dataclass
class RunOutcome:
    """What one run did, the same for the real executor and the simulator (times in us)."""

    simulated: bool
    settings: RunSettings
    context: str
    graph: TaskGraph
    jobs: tuple[JobSpec, ...]
    schedule: list[ScheduledTask]
    network_status: dict[str, str]  # group -> done / failed / skipped / aborted / cancelled
    network_reason: dict[str, str]
    over_commits: list[OverCommit]
    peak_reserved_bytes: int
    final_reserved_bytes: int
    memory_timeline: list[tuple[int, int, int | None]]  # (time_us, reserved, rss or None)
    peak_measured_bytes: int | None = None  # RSS above the run's baseline (real runs)
    live_sessions_after: int = 0
    dispatch_order: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    error_details: dict[str, str] = field(default_factory=dict)  # group -> traceback
    outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    process_memory_after: dict[str, int] = field(default_factory=dict)  # real runs: by kind
    # Real runs: peak measured, anonymous / file-backed, cgroup (RealRunResult.measured_memory)
    measured_memory: dict[str, Any] | None = None


def load_manifests(store_dir: str | Path, names: Sequence[str]) -> dict[str, NetworkManifest]:
    return {name: load_store_network(store_dir, name) for name in names}


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
    manifests = load_manifests(store, workload.networks)
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
    graph = _with_transform_waits(graph, job_list, workload, manifests)
    return PreparedRun(workload, context, manifests, job_list, graph,
                       upstreams if context != "oblivious" else {})


def _with_transform_waits(graph: TaskGraph, jobs: Sequence[JobSpec], workload: Workload,
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


def _controller(prepared: PreparedRun, simulate: bool) -> ContextController | None:
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
        return should_run(workload, network, job_id, upstream_outputs)

    return ContextController(prepared.context, prepared.upstreams, decide)


def execute(prepared: PreparedRun, settings: RunSettings, *, simulate: bool) -> RunOutcome:
    """Run the prepared workload under `settings`, for real or simulated."""
    settings.check()
    controller = _controller(prepared, simulate)
    if simulate:
        return _simulate(prepared, settings, controller)
    return _run_real(prepared, settings, controller)


def _simulate(prepared: PreparedRun, settings: RunSettings,
              controller: ContextController | None) -> RunOutcome:
    result = simulate_graph(prepared.graph, policy=make_policy(settings.policy),
                            workers=settings.workers,
                            memory_budget_bytes=settings.memory_budget_bytes,
                            driver_options={"context": controller})
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
    )


def _run_real(prepared: PreparedRun, settings: RunSettings,
              controller: ContextController | None) -> RunOutcome:
    workload = prepared.workload
    manifests = prepared.manifests

    def inputs_for(job_id: int, network: str, upstream_outputs: Mapping) -> dict:
        return network_inputs(workload, manifests[network], job_id, upstream_outputs)

    executor = RealExecutor(
        prepared.graph, manifests, inputs_for,
        RealRunConfig(workers=settings.workers, memory_budget_bytes=settings.memory_budget_bytes,
                      policy=settings.policy, memory_source=settings.memory_source,
                      intra_op_threads=settings.intra_op_threads,
                      keep_outputs=settings.keep_outputs),
        context=controller,
    )
    result = executor.run()
    return RunOutcome(
        simulated=False, settings=settings, context=prepared.context, graph=prepared.graph,
        jobs=prepared.jobs, schedule=result.schedule, network_status=result.group_status,
        network_reason=result.group_reason, over_commits=result.over_commits,
        peak_reserved_bytes=result.peak_reserved_bytes,
        final_reserved_bytes=result.final_reserved_bytes,
        memory_timeline=[(t, reserved, None if rss is None else rss - result.baseline_rss_bytes)
                         for t, reserved, rss in result.memory_timeline],
        peak_measured_bytes=result.peak_rss_bytes - result.baseline_rss_bytes,
        live_sessions_after=result.live_sessions_after,
        dispatch_order=result.dispatch_order, errors=result.errors,
        error_details=result.error_details,
        outputs=result.outputs, process_memory_after=result.process_memory_after,
        measured_memory=result.measured_memory(),
    )


def run_network(store: Path, name: str, feeds: Mapping[str, np.ndarray],
                settings: RunSettings) -> dict[str, np.ndarray]:
    """One network, one input, through the layer scheduler (real executor)."""
    manifest = load_store_network(store, name)
    bound = bind_feeds(manifest, dict(feeds))
    job = JobSpec(job_id=0, arrival_us=0, networks=(name,))
    graph = build_job_graph(job, {name: manifest}, [name])
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
