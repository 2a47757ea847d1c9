"""The real executor on real (small) ONNX networks: outputs, memory, faults, CLI.

The store is a scaled-down zoo split into per-layer stages (AgeNet: a chain;
GoogleNet: Inception branches), built once per session without profiles so
the suite stays fast; scheduling then uses the builder's estimates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from outputs import assert_outputs_like_whole_models

from masa.cli.main import main
from masa.runtime.registry import make_policy
from masa.runtime.threads import RealExecutor, RealRunConfig
from masa.runtime.virtual import simulate_graph
from masa.sched.checker import check_schedule
from masa.sched.jobs import JobSpec, build_workload_graph
from model_prep.feeds import random_feeds
from model_prep.manifest import NetworkManifest, load_store_network
from model_prep.verify import run_stages, run_whole_model

pytestmark = [pytest.mark.real, pytest.mark.slow]

NETWORKS = ("agenet", "googlenet")
MIB = 2**20


@pytest.fixture(scope="module")
def store(small_zoo_store: Path) -> Path:
    return small_zoo_store


@pytest.fixture(scope="module")
def manifests(store: Path) -> dict[str, NetworkManifest]:
    return {name: load_store_network(store, name) for name in NETWORKS}


@pytest.fixture(scope="module")
def feeds(manifests: dict[str, NetworkManifest]) -> dict[str, dict[str, np.ndarray]]:
    return {name: random_feeds(m.inputs, np.random.default_rng(7)) for name, m in manifests.items()}


def _executor(manifests, feeds, jobs, *, policy="masa", workers=2, budget_bytes=64 * MIB,
              inputs_for=None, memory_source="measured", plan_in_background=True,
              read_ahead_bytes=None):
    graph = build_workload_graph(jobs, manifests, list(NETWORKS))
    executor = RealExecutor(
        graph, manifests,
        inputs_for or (lambda job_id, network, upstream: feeds[network]),
        RealRunConfig(workers=workers, memory_budget_bytes=budget_bytes, policy=policy,
                      memory_source=memory_source, plan_in_background=plan_in_background,
                      read_ahead_bytes=read_ahead_bytes),
    )
    return graph, executor


def _run(manifests, feeds, jobs, **options):
    graph, executor = _executor(manifests, feeds, jobs, **options)
    return graph, executor.run()


def test_masa_plan_searches_off_the_loop_in_a_real_run(manifests, feeds):
    """A real run's masa-plan plans on a background thread (ThreadPlanner), dispatches by
    the greedy rule until a plan is ready, and stops the planner when the run ends."""
    from masa.runtime.planning import InlinePlanner, PlanningPolicy, ThreadPlanner

    jobs = [JobSpec(job, 0, NETWORKS) for job in range(3)]
    graph = build_workload_graph(jobs, manifests, list(NETWORKS))
    executor = RealExecutor(graph, manifests, lambda job_id, network, upstream: feeds[network],
                            RealRunConfig(workers=2, memory_budget_bytes=64 * MIB,
                                          policy="masa-plan"))
    policy = executor.state.policy
    assert isinstance(policy, PlanningPolicy) and isinstance(policy.planner, ThreadPlanner)
    result = executor.run()
    assert set(result.group_status.values()) == {"done"}
    assert policy.plans >= 1
    # The loop never waited: it took its first decisions greedily, before any plan.
    assert policy.greedy_picks >= 1
    assert policy.planner.closed  # closed with the run
    _assert_clean(graph, result, workers=2, budget_bytes=64 * MIB)
    # The simulator and the solver benchmark plan inline, deterministically.
    assert isinstance(make_policy("masa-plan").planner, InlinePlanner)


def test_masa_plans_its_batch_off_the_loop_in_a_real_run(store):
    """The default policy in a real run: one job of two networks finds the executor
    empty, its plan is searched on the planner's thread, counted in the result's
    policy_stats, and the planner stops with the run."""
    from masa.runtime.planning import BatchPlanningPolicy, ThreadPlanner

    # AgeNet and GenderNet: 24 tasks (GoogLeNet alone has 116, more than a batch plans).
    names = ("agenet", "gendernet")
    manifests = {name: load_store_network(store, name) for name in names}
    feeds = {name: random_feeds(manifest.inputs, np.random.default_rng(0))
             for name, manifest in manifests.items()}
    graph = build_workload_graph([JobSpec(0, 0, names)], manifests, list(names))
    executor = RealExecutor(graph, manifests, lambda job_id, network, upstream: feeds[network],
                            RealRunConfig(workers=2, memory_budget_bytes=64 * MIB))
    policy = executor.state.policy
    assert isinstance(policy, BatchPlanningPolicy) and isinstance(policy.planner, ThreadPlanner)
    result = executor.run()
    assert set(result.group_status.values()) == {"done"}
    assert result.policy_stats["batch_plans_searched"] == 1
    assert result.policy_stats == policy.stats()
    assert policy.planner.closed
    _assert_clean(graph, result, workers=2, budget_bytes=64 * MIB)


def test_masa_plans_no_batch_in_a_real_run_whose_stages_copy_their_weights(store):
    """The same job with every stage prepacked (its weights copied into the session,
    as a copy-mode store's are): the executor's masa searches no plan."""
    from dataclasses import replace

    names = ("agenet", "gendernet")
    manifests = {name: load_store_network(store, name) for name in names}
    manifests = {name: replace(m, stages=tuple(replace(s, prepack=True) for s in m.stages))
                 for name, m in manifests.items()}
    feeds = {name: random_feeds(manifest.inputs, np.random.default_rng(0))
             for name, manifest in manifests.items()}
    graph = build_workload_graph([JobSpec(0, 0, names)], manifests, list(names))
    executor = RealExecutor(graph, manifests, lambda job_id, network, upstream: feeds[network],
                            RealRunConfig(workers=2, memory_budget_bytes=64 * MIB))
    result = executor.run()
    assert set(result.group_status.values()) == {"done"}
    assert result.policy_stats.pop("cached_loads_ahead") >= 0  # the page cache decides
    assert result.policy_stats == {"batch_planning": 0, "batch_plans_searched": 0,
                                   "batch_plans_reused": 0, "batch_plans_followed": 0}
    _assert_clean(graph, result, workers=2, budget_bytes=64 * MIB)


def _assert_clean(graph, result, workers: int, budget_bytes: int | None) -> None:
    """Everything released; the schedule valid (memory unchecked when budget_bytes is None)."""
    assert result.final_reserved_bytes == 0
    assert result.live_sessions_after == 0
    assert result.live_tensors_after == 0
    allowed = [o.task_id for o in result.over_commits]
    assert check_schedule(graph, result.schedule, workers=workers,
                          memory_budget_bytes=budget_bytes, allowed_over_commits=allowed) == []


@pytest.mark.parametrize("policy", ["masa", "masa-plan", "bulk", "deepeye"])
@pytest.mark.parametrize("workers", [1, 2])
def test_outputs_equal_whole_model_under_every_policy(manifests, feeds, policy, workers):
    jobs = [JobSpec(0, 0, NETWORKS), JobSpec(1, 0, NETWORKS)]
    graph, result = _run(manifests, feeds, jobs, policy=policy, workers=workers)
    assert_outputs_like_whole_models(result.outputs, manifests, feeds, [0, 1])
    assert set(result.group_status.values()) == {"done"}
    _assert_clean(graph, result, workers, 64 * MIB)


def test_a_read_ahead_window_of_zero_keeps_one_stage_ahead_in_a_real_run(manifests, feeds):
    """With --read-ahead 0 a stage's LOAD starts only when no other loaded stage waits
    for its EXEC (one stage is always allowed), and the outputs stay right."""
    jobs = [JobSpec(0, 0, NETWORKS), JobSpec(1, 0, NETWORKS)]
    graph, result = _run(manifests, feeds, jobs, read_ahead_bytes=0)
    starts = {item.task_id: item.start_us for item in result.schedule}
    # Stages that hold bytes until their EXEC (a weightless stage counts for nothing).
    ahead = [(starts[lock.from_task], starts[lock.from_task.removesuffix("load") + "exec"])
             for lock in graph.locks if lock.lock_id.endswith("/resident") and lock.memory_bytes]
    assert len(ahead) > 20
    assert max(sum(load_us <= t < exec_us for load_us, exec_us in ahead)
               for t, _ in ahead) == 1
    for name, manifest in manifests.items():
        expected = run_whole_model(manifest.source_path, manifest, feeds[name])
        got = result.outputs[f"j1/{name}"]
        for output, value in expected.items():
            assert np.max(np.abs(got[output] - value)) <= 1e-5 * max(
                1e-12, float(np.max(np.abs(value))))
    assert set(result.group_status.values()) == {"done"}
    _assert_clean(graph, result, 2, 64 * MIB)


def _read_into_page_cache(manifests) -> None:
    """Every stage file read once: the simulator has no page cache, while a real masa
    loads the stages it finds cached first, so the two orders agree only when all are
    cached (the store is shared with other tests, which may have left some evicted)."""
    for manifest in manifests.values():
        for stage in manifest.stages:
            for path in manifest.stage_files(stage):
                path.read_bytes()


def test_one_worker_real_and_simulated_dispatch_orders_match(manifests, feeds):
    jobs = [JobSpec(0, 0, NETWORKS), JobSpec(1, 0, ("googlenet",))]
    for policy in ("masa", "masa-plan", "bulk", "deepeye"):
        _read_into_page_cache(manifests)
        # The ledger alone: measured memory would shrink the budget the real run sees;
        # masa-plan planning inline, as the simulator does (a real run's background
        # search is not deterministic).
        graph, real = _run(manifests, feeds, jobs, policy=policy, workers=1,
                           budget_bytes=4 * MIB, memory_source="model",
                           plan_in_background=False)
        simulated = simulate_graph(graph, policy=make_policy(policy), workers=1,
                                   memory_budget_bytes=4 * MIB)
        assert real.dispatch_order == list(simulated.dispatch_order), policy


def test_budget_below_largest_stage_runs_with_progress_rule(manifests, feeds, caplog):
    jobs = [JobSpec(0, 0, ("agenet",))]
    graph, result = _run(manifests, feeds, jobs, budget_bytes=1024)
    assert result.over_commits, "a stage larger than the budget must be recorded"
    assert all(o.reason == "progress" for o in result.over_commits)
    assert "progress rule" in caplog.text
    expected = run_stages(manifests["agenet"], feeds["agenet"])
    for name, value in expected.items():
        assert np.array_equal(result.outputs["j0/agenet"][name], value)
    _assert_clean(graph, result, 2, 1024)


def test_wrong_input_shape_fails_that_job_alone(manifests, feeds):
    jobs = [JobSpec(0, 0, ("agenet",)), JobSpec(1, 0, ("agenet", "googlenet"))]

    def inputs_for(job_id, network, upstream):
        if job_id == 0:
            return {name: value[..., :-3] for name, value in feeds[network].items()}
        return feeds[network]

    graph, result = _run(manifests, feeds, jobs, inputs_for=inputs_for)
    assert result.group_status["j0/agenet"] == "failed"
    assert "j0/agenet" in result.errors
    assert result.group_status["j1/agenet"] == "done"
    assert result.group_status["j1/googlenet"] == "done"
    _assert_clean(graph, result, 2, 64 * MIB)


def test_a_failing_input_fails_that_network_alone(manifests, feeds):
    """The worker that makes a network instance's inputs reports their error as the
    network's; the job's other network and the other jobs finish."""
    jobs = [JobSpec(0, 0, NETWORKS), JobSpec(1, 0, NETWORKS)]

    def inputs_for(job_id, network, upstream):
        if (job_id, network) == (0, "agenet"):
            raise ValueError("camera frame 0 is truncated")
        return feeds[network]

    graph, result = _run(manifests, feeds, jobs, inputs_for=inputs_for)
    assert result.group_status == {"j0/agenet": "failed", "j0/googlenet": "done",
                                   "j1/agenet": "done", "j1/googlenet": "done"}
    assert "input: camera frame 0 is truncated" in result.errors["j0/agenet"]
    _assert_clean(graph, result, 2, 64 * MIB)


def test_inputs_are_made_on_a_worker_and_read_by_every_input_reader(tmp_path):
    """A network whose 12 branches all read its input: the worker running the first
    branch makes the input while another worker's branch waits for it (not on the
    loop's thread, whose dispatches would wait), and the outputs are the whole
    model's."""
    import threading

    import models

    from masa.common.libc import WORKER_THREAD_PREFIX
    from model_prep.prepare_cli import prepare_network

    model_path = models.save(models.wide_fanout(np.random.default_rng(3)), tmp_path, "fan")
    manifest = prepare_network(model_path, tmp_path / "store", "fan", profile=False,
                               show_progress=False).manifest
    readers = [stage for stage in manifest.stages
               if any(tensor.name == "x" for tensor in stage.inputs)]
    assert len(readers) >= 2
    x = np.random.default_rng(5).random((1, 3, 8, 8), dtype=np.float32)
    graph = build_workload_graph([JobSpec(0, 0, ("fan",))], {"fan": manifest}, ["fan"])
    reader_waiting = threading.Event()
    makers: list[str] = []

    def inputs_for(job_id, network, upstream):
        makers.append(threading.current_thread().name)
        # Held until another input reader waits for them (bounded: a failure, not a hang).
        reader_waiting.wait(timeout=30)
        return {"x": x}

    executor = RealExecutor(graph, {"fan": manifest}, inputs_for,
                            RealRunConfig(workers=2, memory_budget_bytes=64 * MIB))
    stages = executor.backend.stages
    coming = stages.inputs_coming

    def inputs_coming(group):
        coming(group)
        pending = stages.inputs_pending[group]
        wait = pending.wait

        def waited():
            reader_waiting.set()
            return wait()

        pending.wait = waited

    stages.inputs_coming = inputs_coming
    result = executor.run()
    assert result.group_status == {"j0/fan": "done"}
    assert reader_waiting.is_set(), "no second input reader ran while the inputs were made"
    assert len(makers) == 1 and makers[0].startswith(WORKER_THREAD_PREFIX)
    whole = run_whole_model(model_path, manifest, {"x": x})
    for name, expected in whole.items():
        assert np.allclose(result.outputs["j0/fan"][name], expected, atol=1e-5)
    assert not stages.inputs_pending and not stages.tensors


@pytest.mark.parametrize("room", ["both fit", "tight"])
def test_an_unloaded_stages_weights_are_unmapped_after_the_next_start_when_both_fit(
        manifests, feeds, room):
    """A LOAD lock released: the session goes at once; its locked weights stay mapped
    until the decision's tasks are on their way (the loop does not hold them up for
    the unmapping), unless the budget cannot hold both, where they go before the next
    task starts."""
    from masa.sched.core import MemoryLedger
    from masa.sched.taskgraph import TaskKind

    graph, executor = _executor(manifests, feeds, [JobSpec(0, 0, ("agenet",))], workers=1)
    backend, stages = executor.backend, executor.backend.stages
    loads = [task for task in graph.tasks if task.kind is TaskKind.LOAD]
    first = next(task for task in loads
                 if stages.stages[(task.network, task.stage_id)].loaded_mapped_bytes)
    second = next(task for task in loads if task is not first)
    lock = next(lock for lock in graph.locks if lock.from_task == first.task_id)
    key = (first.group, first.stage_id)
    backend.begin()
    try:
        stages.run_task(first)
        locked = stages.locked_weights.get(key)
        if locked is None:
            pytest.skip("the weights cannot be locked here (RLIMIT_MEMLOCK, no CAP_IPC_LOCK)")
        reserved_bytes = 0 if room == "both fit" else 64 * MIB - lock.memory_bytes + 1
        backend.ledger = MemoryLedger(budget_bytes=64 * MIB, reserved_bytes=reserved_bytes)
        backend.lock_released(lock, first)
        assert key not in stages.sessions and key not in stages.locked_weights
        assert locked.locked  # the core's release unloads the session, not the mapping
        backend.start(second, 0)
        assert locked.locked == (room == "both fit")
        (completion,) = backend.wait(None)
        assert completion.task_id == second.task_id and completion.ok
        assert not locked.locked and not backend.unmaps_due
    finally:
        backend.close()
        backend.meter.finish()


def test_stage_file_corrupted_mid_job_fails_that_job_alone(store, feeds, tmp_path):
    # A private copy of the store, so the corruption cannot leak into other tests.
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    manifests = {name: load_store_network(copy, name) for name in NETWORKS}
    middle = manifests["agenet"].stages[len(manifests["agenet"].stages) // 2]
    (copy / "agenet" / middle.file).write_bytes(b"not an onnx model")
    jobs = [JobSpec(0, 0, ("agenet",)), JobSpec(1, 0, ("googlenet",))]
    graph, result = _run(manifests, feeds, jobs)
    assert result.group_status == {"j0/agenet": "failed", "j1/googlenet": "done"}
    assert middle.stage_id in result.errors["j0/agenet"]
    _assert_clean(graph, result, 2, 64 * MIB)


def test_manifest_with_corrupted_stage_is_refused_at_load(store, tmp_path, capsys):
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    stage = load_store_network(copy, "agenet").stages[0]
    (copy / "agenet" / stage.file).write_bytes(b"garbage")
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [agenet]\narrivals: {kind: periodic, interval_ms: 1, count: 1}\n")
    assert main(["run", str(workload), "--store", str(copy), "--simulate"]) == 2
    error = capsys.readouterr().err
    assert "sha256" in error and "stages[0]" in error


def test_infer_command_matches_whole_model(store, manifests, tmp_path, capsys):
    manifest = manifests["googlenet"]
    value = random_feeds(manifest.inputs, np.random.default_rng(3))
    (name, array), = value.items()
    np.save(tmp_path / "x.npy", array)
    for policy in ("masa", "bulk", "deepeye"):
        out = tmp_path / f"y-{policy}.npz"
        assert main(["infer", "--store", str(store), "--model", "googlenet", "--input",
                     str(tmp_path / "x.npy"), "--out", str(out), "--policy", policy,
                     "--memory", "2MiB"]) == 0
        expected = run_whole_model(manifest.source_path, manifest, value)
        with np.load(out) as got:
            for output, reference in expected.items():
                scale = max(1e-12, float(np.max(np.abs(reference))))
                assert np.max(np.abs(got[output] - reference)) <= 1e-5 * scale


def test_infer_rejects_wrong_input_shape(store, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 10, 10), dtype=np.float32))
    code = main(["infer", "--store", str(store), "--model", "agenet", "--input",
                 str(tmp_path / "x.npy"), "--out", str(tmp_path / "y.npz")])
    assert code == 2
    assert "expected shape" in capsys.readouterr().err
    assert not (tmp_path / "y.npz").exists()


def test_run_command_writes_report_and_trace(store, tmp_path, capsys):
    import json

    workload = tmp_path / "w.yaml"
    workload.write_text(
        "graph: [agenet, googlenet]\n"
        "arrivals: {kind: periodic, interval_ms: 5, count: 3, seed: 1}\n")
    for simulate in (False, True):
        report_path, trace_path = tmp_path / "r.json", tmp_path / "t.json"
        argv = ["run", str(workload), "--store", str(store), "--memory", "8MiB",
                "--report", str(report_path), "--trace", str(trace_path)]
        assert main(argv + (["--simulate"] if simulate else [])) == 0
        report = json.loads(report_path.read_text())
        assert report["summary"]["jobs"] == 3
        assert report["meta"]["simulated"] is simulate
        assert report["meta"]["read_ahead_bytes"] is None
        # The executor's loop's own CPU: measured in a real run, within its wall time.
        loop_cpu_us = report["meta"]["loop_cpu_us"]
        if simulate:
            assert loop_cpu_us is None
        else:
            assert 0 < loop_cpu_us <= report["summary"]["last_end_us"] * 1.05 + 50_000
        assert all(n["status"] == "done" for j in report["jobs"] for n in j["networks"])
        trace = json.loads(trace_path.read_text())
        assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    assert "all jobs" in capsys.readouterr().out


@pytest.mark.parametrize("text, expected", [
    ("graph: [agenet, facenet2]\narrivals: {kind: periodic, interval_ms: 1, count: 1}\n",
     "facenet2"),
    ("graph: [agenet\n", "YAML"),
    ("graph: [agenet]\narrivals: {kind: poisson, rate_per_s: -1, count: 2}\n", "arrivals"),
])
def test_run_bad_workloads_exit_2_with_path(store, tmp_path, capsys, text, expected):
    workload = tmp_path / "bad.yaml"
    workload.write_text(text)
    assert main(["run", str(workload), "--store", str(store), "--simulate"]) == 2
    error = capsys.readouterr().err
    assert str(workload) in error and expected in error
    assert error.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize("policy", ["bulk", "deepeye"])
def test_memory_oblivious_policies_report_their_peak_over_the_budget(manifests, feeds, policy):
    from masa.report.report import build_report

    jobs = [JobSpec(0, 0, NETWORKS), JobSpec(1, 0, NETWORKS)]
    budget_bytes = 64 * 1024
    graph, result = _run(manifests, feeds, jobs, policy=policy, budget_bytes=budget_bytes)
    assert result.peak_reserved_bytes > budget_bytes
    assert result.over_commits and {o.reason for o in result.over_commits} == {"oblivious"}
    report = build_report(graph, result.schedule, workers=2, memory_budget_bytes=budget_bytes,
                          policy=policy, over_commits=result.over_commits)
    assert report["summary"]["over_budget"] is True
    assert report["summary"]["peak_reserved_bytes"] > budget_bytes
    assert report["summary"]["progress_rule_violations"] == 0  # oblivious, not a violation
    _assert_clean(graph, result, 2, None)  # they ignore the budget by design


def test_measured_memory_source_reconciles_and_stays_correct(manifests, feeds):
    """Memory the process holds outside the ledger's model shrinks the budget it sees."""
    jobs = [JobSpec(0, 0, NETWORKS), JobSpec(1, 0, NETWORKS)]
    graph = build_workload_graph(jobs, manifests, list(NETWORKS))
    budget_bytes = 256 * MIB
    hog: list[np.ndarray] = []

    def inputs_for(job_id, network, upstream):
        if not hog:  # 96 MiB the scheduler knows nothing about, touched so it is resident
            hog.append(np.ones(96 * MIB // 8, dtype=np.float64))
        return feeds[network]

    executor = RealExecutor(
        graph, manifests, inputs_for,
        RealRunConfig(workers=2, memory_budget_bytes=budget_bytes, memory_source="measured"),
    )
    result = executor.run()
    assert set(result.group_status.values()) == {"done"}
    assert executor.state.ledger.budget_bytes < budget_bytes - 64 * MIB
    expected = run_stages(manifests["agenet"], feeds["agenet"])
    for name, value in expected.items():
        assert np.array_equal(result.outputs["j1/agenet"][name], value)
    assert result.final_reserved_bytes == 0 and result.live_sessions_after == 0


def test_demo_runs_the_three_policies_and_prints_the_comparison(tmp_path, capsys):
    assert main(["-q", "demo", "--store", str(tmp_path / "demo"), "--scale", "0.05",
                 "--jobs", "2", "--interval-ms", "5"]) == 0
    out = capsys.readouterr().out
    for policy in ("masa", "bulk", "deepeye"):
        assert any(line.startswith(policy + " ") for line in out.splitlines())
    assert "masa vs bulk" in out
    assert sum(line.startswith("stage ") for line in out.splitlines()) == 4  # 4 tables
