"""Tests for masa.sched.jobs: jobs + manifests -> LOAD/EXEC task graphs with memory locks."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from masa.common.errors import UserError
from masa.sched.jobs import (
    ESTIMATE_EXEC_BYTES_PER_US,
    ESTIMATE_EXEC_FIXED_US,
    ESTIMATE_LOAD_BYTES_PER_US,
    ESTIMATE_LOAD_FIXED_US,
    JobSpec,
    build_job_graph,
    build_workload_graph,
    network_plans,
    network_time_us,
    stage_costs,
    task_id,
    tensor_bytes,
)
from masa.sched.taskgraph import TaskKind, validate_graph
from model_prep.manifest import NetworkManifest, Stage, StageProfile, TensorSpec
from workloads.generation import generate_jobs, list_scenarios, scenario_path
from workloads.loader import load_workload


def _tensor(name: str, elements: int) -> TensorSpec:
    return TensorSpec(name=name, dtype="float32", shape=(1, elements), size_bytes=4 * elements)


def _profile(index: int) -> StageProfile:
    # Distinct, index-dependent figures so a mix-up between stages shows.
    return StageProfile(
        load_time_us=1000 + index, exec_time_us=200 + index, exec_runs=5,
        load_peak_bytes=5000 + 100 * index, resident_bytes=3000 + 10 * index,
        exec_peak_bytes=700 + index, sampled_load_peak_bytes=0,
        sampled_exec_peak_bytes=0, sampling_interval_us=2.0,
    )


def _manifest(name: str, edges: dict[str, tuple[str, ...]], profiled: bool = True,
              layer_types: dict[str, str] | None = None) -> NetworkManifest:
    """A network whose stages (in dict order) read the outputs of the listed producers."""
    stages = []
    for index, (stage_id, producers) in enumerate(edges.items()):
        inputs = tuple(_tensor(f"{p}_out", 10 * (i + 1)) for i, p in enumerate(producers)) or (
            _tensor("data", 8),)
        stages.append(Stage(
            stage_id=stage_id, file=f"stages/{stage_id}.onnx", sha256="0" * 64,
            op_types=("Gemm",), layer_type=(layer_types or {}).get(stage_id, "fc"),
            inputs=inputs, outputs=(_tensor(f"{stage_id}_out", 16 * (index + 1)),),
            producers=producers, weight_bytes=40_000 * (index + 1),
            profile=_profile(index) if profiled else None,
        ))
    return NetworkManifest(
        name=name, source_path=f"{name}.onnx", source_sha256="0" * 64, ir_version=8,
        opsets=(("", 17),), inputs=(_tensor("data", 8),),
        outputs=(stages[-1].outputs[0],), stages=tuple(stages),
    )


CHAIN = {"s0": (), "s1": ("s0",), "s2": ("s1",)}
# s0 feeds two branches that join in s3 (a residual / inception shape).
DIAMOND = {"s0": (), "s1": ("s0",), "s2": ("s0",), "s3": ("s1", "s2")}


def test_chain_job_has_two_tasks_and_two_locks_per_stage() -> None:
    manifests = {"alpha": _manifest("alpha", CHAIN), "beta": _manifest("beta", DIAMOND)}
    job = JobSpec(job_id=4, arrival_us=12_345, networks=("alpha", "beta"))
    graph = build_job_graph(job, manifests, ["alpha", "beta"])

    stage_count = len(CHAIN) + len(DIAMOND)
    assert len(graph.tasks) == 2 * stage_count
    # Two locks per stage plus one inputs lock per network instance.
    assert len(graph.locks) == 2 * stage_count + 2
    producer_edges = sum(len(p) for p in CHAIN.values()) + sum(len(p) for p in DIAMOND.values())
    assert len(graph.precedence) == stage_count + producer_edges
    # Only s0 reads the network input in either network: no inputs-opener edges.
    assert len(graph.start_after) == producer_edges
    assert validate_graph(graph) == []
    ids = [task.task_id for task in graph.tasks]
    assert len(set(ids)) == len(ids)
    assert len({lock.lock_id for lock in graph.locks}) == len(graph.locks)
    assert {task.release_us for task in graph.tasks} == {12_345}
    assert graph.task("j4/beta/s3/exec").group == "j4/beta"
    assert graph.task("j4/beta/s3/exec").order == (4, 1, 3)
    assert graph.task("j4/alpha/s0/load").order == (4, 0, 0)
    assert task_id(4, "beta", "s3", TaskKind.EXEC) == "j4/beta/s3/exec"


def test_memory_and_durations_come_from_the_profile() -> None:
    manifest = _manifest("alpha", CHAIN, layer_types={"s0": "conv"})
    graph = build_job_graph(JobSpec(0, 0, ("alpha",)), {"alpha": manifest}, ["alpha"])
    for index, stage in enumerate(manifest.stages):
        profile = _profile(index)
        load = graph.task(f"j0/alpha/{stage.stage_id}/load")
        run = graph.task(f"j0/alpha/{stage.stage_id}/exec")
        assert load.kind is TaskKind.LOAD and run.kind is TaskKind.EXEC
        assert load.duration_us == profile.load_time_us
        assert load.memory_bytes == profile.load_peak_bytes - profile.resident_bytes
        assert run.duration_us == profile.exec_time_us
        assert run.memory_bytes == profile.exec_peak_bytes
        assert load.layer_type == run.layer_type == stage.layer_type
        # A LOAD needs its transient plus the resident lock it opens.
        assert graph.footprint_bytes(load.task_id) == profile.load_peak_bytes
    assert graph.task("j0/alpha/s0/exec").layer_type == "conv"


def test_load_transient_is_never_negative() -> None:
    manifest = _manifest("alpha", {"s0": ()})
    stage = manifest.stages[0]
    odd = StageProfile(**{**_profile(0).__dict__, "load_peak_bytes": 10, "resident_bytes": 99})
    stage_with_odd_profile = Stage(**{**stage.__dict__, "profile": odd})
    assert stage_costs(stage_with_odd_profile).load_transient_bytes == 0


def test_locks_follow_resident_and_output_lifetimes() -> None:
    manifest = _manifest("beta", DIAMOND)
    graph = build_job_graph(JobSpec(1, 0, ("beta",)), {"beta": manifest}, ["beta"])
    locks = {lock.lock_id: lock for lock in graph.locks}

    resident = locks["j1/beta/s2/resident"]
    assert resident.from_task == "j1/beta/s2/load"
    assert resident.until_tasks == ("j1/beta/s2/exec",)
    assert resident.memory_bytes == _profile(2).resident_bytes

    # s0's output feeds both branches: held until both consuming EXECs end.
    fan_out = locks["j1/beta/s0/outputs"]
    assert fan_out.from_task == "j1/beta/s0/exec"
    assert set(fan_out.until_tasks) == {"j1/beta/s1/exec", "j1/beta/s2/exec"}
    assert fan_out.memory_bytes == tensor_bytes(manifest.stages[0].outputs[0])

    # The final stage's outputs are kept for the job's result until the job ends
    # (here the job's only sink is this stage itself).
    final = locks["j1/beta/s3/outputs"]
    assert final.until_tasks == ("j1/beta/s3/exec",)

    assert ("j1/beta/s1/exec", "j1/beta/s3/exec") in graph.precedence
    assert ("j1/beta/s2/exec", "j1/beta/s3/exec") in graph.precedence
    assert ("j1/beta/s3/load", "j1/beta/s3/exec") in graph.precedence
    # The LOAD order rule: a stage's load starts after its producers' loads started.
    assert set(graph.start_after) == {
        ("j1/beta/s0/load", "j1/beta/s1/load"), ("j1/beta/s0/load", "j1/beta/s2/load"),
        ("j1/beta/s1/load", "j1/beta/s3/load"), ("j1/beta/s2/load", "j1/beta/s3/load"),
    }


def test_unprofiled_manifest_uses_documented_estimates_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manifest = _manifest("rough", CHAIN, profiled=False)
    with caplog.at_level(logging.WARNING, logger="masa.sched.jobs"):
        graph = build_job_graph(JobSpec(0, 0, ("rough",)), {"rough": manifest}, ["rough"])
    assert any("rough" in record.getMessage() and "estimated" in record.getMessage()
               for record in caplog.records)
    stage = manifest.stages[1]
    in_bytes = sum(t.size_bytes or 0 for t in stage.inputs)
    out_bytes = sum(t.size_bytes or 0 for t in stage.outputs)
    load = graph.task("j0/rough/s1/load")
    run = graph.task("j0/rough/s1/exec")
    assert load.memory_bytes == stage.weight_bytes
    assert graph.footprint_bytes(load.task_id) == 2 * stage.weight_bytes
    assert run.memory_bytes == in_bytes + out_bytes
    assert load.duration_us == ESTIMATE_LOAD_FIXED_US + round(
        stage.weight_bytes / ESTIMATE_LOAD_BYTES_PER_US)
    assert run.duration_us == ESTIMATE_EXEC_FIXED_US + round(
        (stage.weight_bytes + in_bytes + out_bytes) / ESTIMATE_EXEC_BYTES_PER_US)
    assert validate_graph(graph) == []


def test_dynamic_tensor_sizes_are_estimated_with_unit_dims() -> None:
    tensor = TensorSpec(name="x", dtype="float16", shape=("batch", 3, 5), size_bytes=None)
    assert tensor_bytes(tensor) == 2 * 3 * 5


def test_upstreams_add_the_preempt_start_rule() -> None:
    manifests = {"face": _manifest("face", CHAIN), "age": _manifest("age", DIAMOND),
                 "mem": _manifest("mem", CHAIN)}
    order = ["face", "age", "mem"]
    upstreams = {"age": ["face"]}
    plain = build_job_graph(JobSpec(0, 0, ("face", "age", "mem")), manifests, order)
    graph = build_job_graph(JobSpec(0, 0, ("face", "age", "mem")), manifests, order,
                            upstreams=upstreams)
    added = set(graph.start_after) - set(plain.start_after)
    assert added == {("j0/face/s0/exec", "j0/age/s0/exec")}
    assert validate_graph(graph) == []
    # A job without the upstream has nothing to wait for.
    alone = build_job_graph(JobSpec(1, 0, ("age",)), manifests, order, upstreams=upstreams)
    assert set(alone.start_after) == set(
        build_job_graph(JobSpec(1, 0, ("age",)), manifests, order).start_after)


def test_plans_computed_once_give_the_same_job_graphs() -> None:
    """A daemon plans its networks once and builds each job from the plans."""
    manifests = {"face": _manifest("face", CHAIN), "age": _manifest("age", DIAMOND)}
    plans = network_plans({"face": manifests["face"]})  # age: planned on the way
    for job_id in range(3):
        spec = JobSpec(job_id, 100 * job_id, ("face", "age"))
        assert build_job_graph(spec, manifests, ["face", "age"], upstreams={"age": ["face"]},
                               plans=plans) == build_job_graph(
            spec, manifests, ["face", "age"], upstreams={"age": ["face"]})
    assert set(plans) == {"face"}  # the caller's mapping is read, not changed


def test_workload_graph_merges_jobs_with_disjoint_ids() -> None:
    manifests = {"alpha": _manifest("alpha", CHAIN), "beta": _manifest("beta", DIAMOND)}
    order = ["beta", "alpha"]
    jobs = [JobSpec(0, 0, ("beta", "alpha")), JobSpec(1, 500, ("alpha",)),
            JobSpec(2, 900, ("beta",))]
    graph = build_workload_graph(jobs, manifests, order)
    assert validate_graph(graph) == []
    assert len(graph.tasks) == 2 * (len(DIAMOND) + len(CHAIN) + len(CHAIN) + len(DIAMOND))
    assert graph.task("j1/alpha/s2/exec").release_us == 500
    # The order key uses the position in network_order, not in the job.
    assert graph.task("j1/alpha/s0/load").order == (1, 1, 0)
    assert graph.task("j0/beta/s0/load").order == (0, 0, 0)
    with pytest.raises(UserError, match="job id 1 appears twice"):
        build_workload_graph(jobs + [JobSpec(1, 1000, ("alpha",))], manifests, order)


def test_unknown_network_is_a_user_error() -> None:
    manifests = {"alpha": _manifest("alpha", CHAIN)}
    with pytest.raises(UserError, match="no manifest for network 'gamma'"):
        build_job_graph(JobSpec(0, 0, ("gamma",)), manifests, ["alpha", "gamma"])
    with pytest.raises(UserError, match="not in the network order"):
        build_job_graph(JobSpec(0, 0, ("alpha",)), manifests, ["beta"])
    with pytest.raises(UserError, match="listed twice"):
        build_job_graph(JobSpec(0, 0, ("alpha", "alpha")), manifests, ["alpha"])


def test_network_time_sums_stage_durations() -> None:
    manifest = _manifest("alpha", CHAIN)
    exec_us = sum(_profile(i).exec_time_us for i in range(len(CHAIN)))
    load_us = sum(_profile(i).load_time_us for i in range(len(CHAIN)))
    assert network_time_us(manifest, include_load=False) == exec_us
    assert network_time_us(manifest) == exec_us + load_us


def test_every_scenario_builds_a_valid_graph_from_a_split_zoo(tmp_path: Path) -> None:
    """Scenario names match a real (tiny, unprofiled) zoo store; graphs are valid."""
    from model_prep.manifest import load_store_network
    from workloads.zoo import write_zoo

    store = tmp_path / "store"
    write_zoo(store, scale=0.02, profile=False)
    for name in list_scenarios():
        workload = load_workload(scenario_path(name), store_dir=store)
        manifests = {n: load_store_network(store, n, check_files=False)
                     for n in workload.networks}
        jobs = generate_jobs(workload)[:5]
        graph = build_workload_graph(jobs, manifests, workload.networks)
        assert validate_graph(graph) == [], name
        expected_tasks = 2 * sum(len(manifests[n].stages) for job in jobs for n in job.networks)
        assert len(graph.tasks) == expected_tasks, name
        assert gc.isenabled()
