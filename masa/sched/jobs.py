"""Job -> task-graph builder: the LOAD/EXEC tasks, precedences and memory locks of jobs.

This module owns the translation from "job j runs networks N1..Nk" plus the
networks' manifests into a `masa.sched.taskgraph.TaskGraph`, and the per-stage cost
figures (`stage_costs`) every consumer must agree on (policies, simulator,
solver, traffic intensity). Pure: no clocks, threads, files or ONNX.

Everything the process holds for a job is in the ledger (docs/scheduling.md,
"Tasks and memory"). For each network of a job and each stage s of that network:

- LOAD(s): duration = profile.load_time_us; memory_bytes = the *transient*
  part of loading, max(0, load_peak_bytes - resident_bytes). It opens the lock
  ``j{job}/{network}/{s}/resident`` of resident_bytes (the session, its own
  overhead included) held until EXEC(s) ends, after which the stage is unloaded.
- EXEC(s): duration = profile.exec_time_us; memory_bytes = exec_peak_bytes.
  It opens the lock ``j{job}/{network}/{s}/outputs`` of the stage's output
  tensor bytes, held until every consuming EXEC of the same network has ended.
  A stage without consumers (a *sink*) produces final outputs: they are kept
  for the job's result (and downstream networks of the job derive their
  inputs from them), so its lock is held until every sink EXEC of every
  network of the job has ended, i.e. until the job's result is complete.
- the network instance's input tensors: the lock ``j{job}/{network}/inputs`` of
  the bytes of the manifest's inputs, opened by the EXEC of the first stage
  (manifest order) that reads a network input and held until every EXEC of
  the instance has ended (the executor's worker makes the inputs when it starts
  the instance's first EXEC, and they are dropped when the instance ends). A network
  whose stages read no network input has no such lock.
- precedence LOAD(s) -> EXEC(s), EXEC(p) -> EXEC(s) for every producer p;
- start_after LOAD(p) -> LOAD(s) for every producer p: the LOAD order rule. A
  stage is never loaded before its producers' loads have started, so memory is
  not filled with later stages that cannot run while an earlier one waits;
- start_after EXEC(opener) -> EXEC(r) for every other stage r that reads a
  network input: the inputs lock's opener is the first of them to start.

Not in the ledger: the process's runtime base (imports, ONNX Runtime), the
first session's one-time cost, freed heap not yet returned to the OS, and
results a batch run keeps after a job has ended.

Unprofiled manifests get documented estimates (see `estimate_stage_costs`) and
one logged warning per network.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from masa.common.errors import UserError
from masa.sched.taskgraph import Lock, Task, TaskGraph, TaskKind
from model_prep.manifest import NetworkManifest, Stage, TensorSpec

log = logging.getLogger(__name__)

# Estimates for unprofiled stages. Deliberately rough, stated so they can be
# checked against a profile (docs/workload-format.md, "Unprofiled networks"):
# - session creation on a Raspberry-Pi-class CPU costs a few ms plus the file
#   read and weight copy (~200 MB/s);
# - a run costs a fixed dispatch overhead plus streaming weights and tensors
#   through memory once (~1 GB/s; a conv layer reuses weights and costs more,
#   an FC layer about this).
ESTIMATE_LOAD_FIXED_US = 2_000
ESTIMATE_LOAD_BYTES_PER_US = 200.0
ESTIMATE_EXEC_FIXED_US = 50
ESTIMATE_EXEC_BYTES_PER_US = 1_000.0
# A dynamic dimension (batch, image side) counts as 1 when sizing a tensor.
ESTIMATE_DYNAMIC_DIM = 1


@dataclass(frozen=True)
class JobSpec:
    """One job: an input arriving at arrival_us that the listed networks analyse."""

    job_id: int
    arrival_us: int
    networks: tuple[str, ...]  # in the workload's network order


@dataclass(frozen=True)
class StageCost:
    """What scheduling needs about one stage, from its profile or estimated."""

    load_time_us: int
    exec_time_us: int
    load_transient_bytes: int  # direct memory of LOAD: peak minus what stays resident
    resident_bytes: int  # locked from LOAD start until EXEC end
    exec_bytes: int  # direct memory of EXEC
    output_bytes: int  # locked from EXEC start until its consumers (a sink's: the job) end
    estimated: bool


def tensor_bytes(tensor: TensorSpec) -> int:
    """The tensor's size; dynamic dims count as ESTIMATE_DYNAMIC_DIM."""
    if tensor.size_bytes is not None:
        return tensor.size_bytes
    try:
        itemsize = np.dtype(tensor.dtype).itemsize
    except TypeError:
        itemsize = 4  # unknown dtype names (bfloat16 in old numpy): assume 4 bytes
    elements = 1
    for dim in tensor.shape:
        elements *= dim if isinstance(dim, int) and dim > 0 else ESTIMATE_DYNAMIC_DIM
    return elements * itemsize


def estimate_stage_costs(stage: Stage) -> StageCost:
    """Costs of an unprofiled stage, from its weight and tensor bytes.

    resident ~ weight_bytes (the session holds one copy of the weights);
    load transient ~ weight_bytes (the file is parsed, then copied: peak ~2x);
    exec ~ input + output bytes; durations from the ESTIMATE_* constants.
    """
    in_bytes = sum(tensor_bytes(t) for t in stage.inputs)
    out_bytes = sum(tensor_bytes(t) for t in stage.outputs)
    load_time_us = ESTIMATE_LOAD_FIXED_US + round(stage.weight_bytes / ESTIMATE_LOAD_BYTES_PER_US)
    exec_time_us = ESTIMATE_EXEC_FIXED_US + round(
        (stage.weight_bytes + in_bytes + out_bytes) / ESTIMATE_EXEC_BYTES_PER_US
    )
    return StageCost(
        load_time_us=load_time_us, exec_time_us=exec_time_us,
        load_transient_bytes=stage.weight_bytes, resident_bytes=stage.weight_bytes,
        exec_bytes=in_bytes + out_bytes, output_bytes=out_bytes, estimated=True,
    )


def stage_costs(stage: Stage) -> StageCost:
    """The stage's costs from its profile, or `estimate_stage_costs` without one."""
    profile = stage.profile
    if profile is None:
        return estimate_stage_costs(stage)
    return StageCost(
        load_time_us=profile.load_time_us,
        exec_time_us=profile.exec_time_us,
        load_transient_bytes=max(0, profile.load_peak_bytes - profile.resident_bytes),
        resident_bytes=profile.resident_bytes,
        exec_bytes=profile.exec_peak_bytes,
        output_bytes=sum(tensor_bytes(t) for t in stage.outputs),
        estimated=False,
    )


def network_time_us(manifest: NetworkManifest, include_load: bool = True) -> int:
    """One network run alone, stage after stage: sum of EXEC (and LOAD) durations."""
    total_us = 0
    for stage in manifest.stages:
        cost = stage_costs(stage)
        total_us += cost.exec_time_us + (cost.load_time_us if include_load else 0)
    return total_us


def task_id(job_id: int, network: str, stage_id: str, kind: TaskKind) -> str:
    """The id of one task: "j{job}/{network}/{stage_id}/load|exec" (as built below)."""
    return f"j{job_id}/{network}/{stage_id}/{kind.value}"


def group_id(job_id: int, network: str) -> str:
    """The network instance a task belongs to: "j{job}/{network}"."""
    return f"j{job_id}/{network}"


def build_job_graph(
    job: JobSpec,
    manifests: Mapping[str, NetworkManifest],
    network_order: Sequence[str],
    *,
    upstreams: Mapping[str, Sequence[str]] | None = None,
    plans: Mapping[str, NetworkPlan] | None = None,
) -> TaskGraph:
    """The task graph of one job (see the module docstring for its shape).

    network_order fixes the network index in each task's `order` tie-break key,
    (job_id, network index, stage index); it is normally the workload's
    network list, the same for every job.

    upstreams (network -> its upstream networks, e.g. from the workload's job
    graph) adds the CA-preempt rule as start_after edges: every entry EXEC of a
    downstream network (a stage without producers) starts only after the first
    EXEC of each upstream in the same job has started. Leave it out for
    context-oblivious runs; CA-wait gates whole networks in the executor.

    plans: `network_plans(manifests)`, computed once by a caller that builds one
    job at a time (a daemon): planning the networks is 40% of building a job.
    """
    return build_workload_graph([job], manifests, network_order, upstreams=upstreams,
                                plans=plans)


def build_workload_graph(
    jobs: Iterable[JobSpec],
    manifests: Mapping[str, NetworkManifest],
    network_order: Sequence[str],
    *,
    upstreams: Mapping[str, Sequence[str]] | None = None,
    plans: Mapping[str, NetworkPlan] | None = None,
) -> TaskGraph:
    """One task graph for a whole list of jobs (the union of their job graphs)."""
    # Building 100,000+ small frozen objects triggers the cyclic garbage collector
    # over and over although none of them can form a cycle: pausing it made a
    # 1,000-job graph build 2-3x faster. It is restored even on error.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _build(jobs, manifests, network_order, upstreams or {}, dict(plans or {}))
    finally:
        if collecting:
            gc.enable()


def _build(
    jobs: Iterable[JobSpec],
    manifests: Mapping[str, NetworkManifest],
    network_order: Sequence[str],
    upstreams: Mapping[str, Sequence[str]],
    plans: dict[str, NetworkPlan],
) -> TaskGraph:
    parts = _GraphParts()
    index_of = {name: index for index, name in enumerate(network_order)}
    # Stage costs and consumer lists depend only on the network: plan each once.
    seen_job_ids: set[int] = set()
    for job in jobs:
        if job.job_id in seen_job_ids:
            raise UserError(f"job id {job.job_id} appears twice; job ids must be unique")
        seen_job_ids.add(job.job_id)
        if len(set(job.networks)) != len(job.networks):
            raise UserError(f"job {job.job_id}: a network is listed twice in {job.networks}")
        for network in job.networks:
            if network not in manifests:
                raise UserError(f"job {job.job_id}: no manifest for network {network!r}")
            if network not in index_of:
                raise UserError(f"job {job.job_id}: network {network!r} is not in the "
                                f"network order ({', '.join(network_order)})")
            if network not in plans:
                plans[network] = _network_plan(manifests[network])
        # Every network's final outputs are kept until the job's result is complete.
        job_sinks = tuple(f"{group_id(job.job_id, network)}/{sink}/exec"
                          for network in job.networks for sink in plans[network].sinks)
        for network in job.networks:
            _add_network(parts, job, network, index_of[network], plans[network], job_sinks)
        _add_preempt_rule(parts, job, plans, upstreams)
    return TaskGraph(tasks=tuple(parts.tasks), precedence=tuple(parts.precedence),
                     locks=tuple(parts.locks), start_after=tuple(parts.start_after))


def _add_preempt_rule(parts: _GraphParts, job: JobSpec, plans: Mapping[str, NetworkPlan],
                      upstreams: Mapping[str, Sequence[str]]) -> None:
    """CA-preempt: a downstream's entry EXECs start after each upstream's first EXEC."""
    for network in job.networks:
        for upstream in upstreams.get(network, ()):
            if upstream not in job.networks:
                continue  # not in this job: nothing to wait for
            first_upstream_exec = f"{group_id(job.job_id, upstream)}/" \
                f"{plans[upstream].stages[0].stage_id}/exec"
            for stage in plans[network].stages:
                if not stage.producers:
                    parts.start_after.append(
                        (first_upstream_exec,
                         f"{group_id(job.job_id, network)}/{stage.stage_id}/exec"))


@dataclass(frozen=True)
class _StagePlan:
    stage_id: str
    layer_type: str
    cost: StageCost
    producers: tuple[str, ...]
    consumers: tuple[str, ...]


@dataclass(frozen=True)
class NetworkPlan:
    """What every instance of one network shares: its stages and its input tensors."""

    stages: tuple[_StagePlan, ...]
    input_bytes: int  # the network's input tensors, as the executor feeds them
    input_readers: tuple[str, ...]  # stages reading a network input, in manifest order
    sinks: tuple[str, ...]  # stages without consumers: they produce the final outputs


@dataclass
class _GraphParts:
    tasks: list[Task] = field(default_factory=list)
    precedence: list[tuple[str, str]] = field(default_factory=list)
    locks: list[Lock] = field(default_factory=list)
    start_after: list[tuple[str, str]] = field(default_factory=list)


def network_plans(manifests: Mapping[str, NetworkManifest]) -> dict[str, NetworkPlan]:
    """Each network's plan (its stages' costs and consumers): the part of a job's graph
    that depends only on the network."""
    return {name: _network_plan(manifest) for name, manifest in manifests.items()}


def _network_plan(manifest: NetworkManifest) -> NetworkPlan:
    if not manifest.profiled:
        _warn_unprofiled(manifest.name)
    consumers: dict[str, list[str]] = {stage.stage_id: [] for stage in manifest.stages}
    for stage in manifest.stages:
        for producer in stage.producers:
            consumers[producer].append(stage.stage_id)
    stages = tuple(
        _StagePlan(stage_id=stage.stage_id, layer_type=stage.layer_type,
                   cost=stage_costs(stage), producers=stage.producers,
                   consumers=tuple(consumers[stage.stage_id]))
        for stage in manifest.stages
    )
    input_names = {tensor.name for tensor in manifest.inputs}
    return NetworkPlan(
        stages=stages,
        input_bytes=sum(tensor_bytes(tensor) for tensor in manifest.inputs),
        input_readers=tuple(stage.stage_id for stage in manifest.stages
                            if any(t.name in input_names for t in stage.inputs)),
        sinks=tuple(stage.stage_id for stage in stages if not stage.consumers),
    )


def _add_network(parts: _GraphParts, job: JobSpec, network: str, network_index: int,
                 plan: NetworkPlan, job_sinks: tuple[str, ...]) -> None:
    group = group_id(job.job_id, network)
    for stage_index, stage in enumerate(plan.stages):
        cost = stage.cost
        prefix = f"{group}/{stage.stage_id}"
        load_id, exec_id = f"{prefix}/load", f"{prefix}/exec"
        order = (job.job_id, network_index, stage_index)
        parts.tasks.append(Task(
            task_id=load_id, kind=TaskKind.LOAD, duration_us=cost.load_time_us,
            memory_bytes=cost.load_transient_bytes, release_us=job.arrival_us, order=order,
            group=group, job_id=job.job_id, network=network, stage_id=stage.stage_id,
            layer_type=stage.layer_type))
        parts.tasks.append(Task(
            task_id=exec_id, kind=TaskKind.EXEC, duration_us=cost.exec_time_us,
            memory_bytes=cost.exec_bytes, release_us=job.arrival_us, order=order,
            group=group, job_id=job.job_id, network=network, stage_id=stage.stage_id,
            layer_type=stage.layer_type))
        parts.locks.append(Lock(lock_id=f"{prefix}/resident", from_task=load_id,
                                until_tasks=(exec_id,), memory_bytes=cost.resident_bytes))
        consumer_execs = tuple(f"{group}/{consumer}/exec" for consumer in stage.consumers)
        parts.locks.append(Lock(lock_id=f"{prefix}/outputs", from_task=exec_id,
                                until_tasks=consumer_execs or job_sinks,
                                memory_bytes=cost.output_bytes))
        parts.precedence.append((load_id, exec_id))
        for producer in stage.producers:
            parts.precedence.append((f"{group}/{producer}/exec", exec_id))
            parts.start_after.append((f"{group}/{producer}/load", load_id))
    _add_inputs_lock(parts, group, plan)


def _add_inputs_lock(parts: _GraphParts, group: str, plan: NetworkPlan) -> None:
    """The network instance's input tensors: from its first input-reading EXEC on.

    The executor's worker puts them into the instance's tensor store when it starts
    its first EXEC, and they are dropped when the instance ends, so the lock is held
    until every EXEC of the instance has ended. The start_after edges make the
    opener the first input-reading EXEC to start.
    """
    if not plan.input_readers:
        return
    opener, *others = (f"{group}/{stage_id}/exec" for stage_id in plan.input_readers)
    parts.locks.append(Lock(
        lock_id=f"{group}/inputs", from_task=opener,
        until_tasks=tuple(f"{group}/{stage.stage_id}/exec" for stage in plan.stages),
        memory_bytes=plan.input_bytes))
    parts.start_after += [(opener, other) for other in others]


_warned_unprofiled: set[str] = set()


def _warn_unprofiled(network: str) -> None:
    # Once per network per process: a workload of 1,000 jobs should not log 1,000 lines.
    if network in _warned_unprofiled:
        return
    _warned_unprofiled.add(network)
    log.warning("network %r has stages without a profile: using estimated load/exec "
                "times and memory from weight and tensor bytes (run `masa prepare` "
                "with profiling for real figures)", network)
