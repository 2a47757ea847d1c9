"""Kept loaded stages (`keep_loaded_bytes`): a stage's session stays loaded between
jobs within a bound of the budget, the next LOAD of it takes it at no cost, and a
dispatch that needs the memory evicts the least recently kept (masa.sched.core);
past the bound only pinned stages are kept (masa.sched.keeping)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from outputs import assert_outputs_like_whole_models
from sched_graphs import chain_network, merge

from masa.cli.main import main
from masa.common.errors import UserError
from masa.runtime.driver import Driver
from masa.runtime.registry import make_policy
from masa.runtime.threads import RealExecutor, RealRunConfig, RealRunResult
from masa.runtime.virtual import VirtualBackend, simulate_graph
from masa.sched.checker import check_schedule
from masa.sched.core import (
    add_tasks,
    finish,
    is_finished,
    new_state,
    select,
)
from masa.sched.jobs import JobSpec, build_workload_graph
from masa.sched.keeping import StageUse, age_uses, pinned_stages
from masa.sched.policies import BulkPolicy, MasaPolicy
from masa.sched.taskgraph import Task, TaskGraph
from model_prep.feeds import random_feeds
from model_prep.manifest import load_store_network

MIB = 2**20


def _run_job(state, job: int) -> list:  # noqa: ANN001
    """Dispatch and finish one task at a time until the state is idle; the dispatches."""
    dispatches = []
    while True:
        started = select(state)
        if not started:
            return dispatches
        for dispatch in started:
            dispatches.append(dispatch)
            finish(state, dispatch.task_id)


def test_a_stage_is_kept_after_its_exec_and_the_next_job_reuses_it() -> None:
    state = new_state(1, 1000, MasaPolicy(keep_loaded_bytes=1000))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    first = _run_job(state, 0)
    assert is_finished(state) and not any(d.reuses_kept for d in first)
    # Both stages stay loaded: their 300 bytes stay reserved, and count as free.
    assert state.ledger.reserved_bytes == 300 and state.ledger.kept_bytes == 300
    assert state.ledger.free_bytes() == 1000 and list(state.kept) == [("n0", "s0"), ("n0", "s1")]
    add_tasks(state, chain_network(1, 0, [100, 200], exec_bytes=7, output_bytes=3))
    second = _run_job(state, 1)
    reused = {d.task_id for d in second if d.reuses_kept}
    assert reused == {"j1/n0/s0/load", "j1/n0/s1/load"}
    assert state.loads_reused == 2 and state.ledger.reserved_bytes == 300
    assert state.ledger.peak_reserved_bytes <= 1000


def test_a_dispatch_that_needs_the_memory_evicts_the_least_recently_kept() -> None:
    state = new_state(1, 400, MasaPolicy(keep_loaded_bytes=400))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert state.ledger.kept_bytes == 300
    # Another network's 250-byte stage fits only once both kept stages are gone:
    # 300 kept + 250 > 400, s0 (kept first) goes, then 200 + 250 > 400, s1 goes too.
    add_tasks(state, chain_network(1, 1, [250], exec_bytes=7, output_bytes=3))
    [dispatch] = select(state)
    assert dispatch.task_id == "j1/n1/s0/load" and not dispatch.over_commit
    events = state.events
    assert [stage for stage, lock in events.kept_changes] == [("n0", "s0"), ("n0", "s1")]
    assert all(lock is None for _, lock in events.kept_changes)
    assert state.ledger.reserved_bytes == 250 <= state.ledger.budget_bytes
    assert state.ledger.peak_reserved_bytes <= state.ledger.budget_bytes
    assert state.kept_evicted == 2 and not state.kept


class _CallOrder(VirtualBackend):
    """A simulator backend that records when kept stages are evicted and tasks start."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def start(self, task: Task, worker: int) -> None:
        self.calls.append(f"start {task.task_id}")
        super().start(task, worker)

    def evict_loaded(self, stage: tuple[str, str]) -> None:
        self.calls.append(f"evict {stage[0]}/{stage[1]}")


def test_kept_stages_are_unloaded_before_the_task_that_needs_their_memory_starts() -> None:
    """On a device whose cap is the budget, a LOAD that starts reading while the
    stages evicted for it are still locked in memory finds no room."""
    # Job 1's EXEC needs 100 bytes beside its 50: 300 kept + 150 > 400.
    graph = merge([chain_network(0, 0, [300], exec_bytes=7, output_bytes=3),
                   chain_network(1, 1, [50], exec_bytes=100, output_bytes=3,
                                 release_us=10_000)])
    backend = _CallOrder()
    driver = Driver(new_state(1, 400, MasaPolicy(keep_loaded_bytes=400)), backend)
    driver.add(graph)
    driver.run()
    evicted = backend.calls.index("evict n0/s0")
    assert backend.calls[evicted + 1] == "start j1/n1/s0/exec"
    assert driver.state.ledger.peak_reserved_bytes <= 400


def test_past_the_bound_only_pinned_stages_are_kept_and_none_without_room_for_the_rest() -> None:
    """Jobs that cycle through more stages than the bound would evict each kept stage
    before its next use: past it only pinned stages are kept, none where pinning
    one would leave the others no room to load."""
    # 300 bytes of stages, a bound of 250: s0 (100) is pinned, s1 (200) is not.
    state = new_state(1, 1000, MasaPolicy(keep_loaded_bytes=250))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert list(state.kept) == [("n0", "s0")] and state.pinned == {("n0", "s0")}
    assert state.ledger.reserved_bytes == state.ledger.pinned_bytes == 100
    # A budget of 250: s0 kept beside a LOAD of s1 (200) and an EXEC (10) would not fit.
    state = new_state(1, 250, MasaPolicy(keep_loaded_bytes=1000))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert not state.kept and state.ledger.reserved_bytes == 0 and state.pinned == frozenset()
    state = new_state(1, 1000, MasaPolicy(keep_loaded_bytes=320))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert list(state.kept) == [("n0", "s0"), ("n0", "s1")]
    # Another network's stage takes the stages loaded to 450 > 320: n0/s0 and n1/s0
    # are pinned (250 of the bound; with n0/s1, 450 would not fit). Keeping n1/s0
    # within the bound evicts n0/s1, kept before and not pinned; n0/s0 stays, pinned.
    add_tasks(state, chain_network(1, 1, [150], exec_bytes=7, output_bytes=3))
    _run_job(state, 1)
    assert state.pinned == {("n0", "s0"), ("n1", "s0")}
    assert list(state.kept) == [("n0", "s0"), ("n1", "s0")] and state.kept_evicted == 1
    assert state.ledger.reserved_bytes == state.ledger.kept_bytes == 250
    assert state.ledger.pinned_bytes == 250


def test_pinned_stages_save_the_most_load_time_per_byte_and_leave_every_worker_room() -> None:
    uses = {("n", "c"): StageUse(500, 50, 50, 1), ("n", "a"): StageUse(900, 100, 100, 1),
            ("n", "b"): StageUse(100, 100, 100, 1), ("n", "d"): StageUse(50, 100, 100, 1)}
    # 10, 9, 1 and 0.5 us per byte: c and a beside one LOAD of 100 fit in 300.
    assert pinned_stages(uses, 300, 300, workers=1) == {("n", "c"), ("n", "a")}
    # Two workers loading 100 each at once: c alone; and room for an EXEC of 60 too.
    assert pinned_stages(uses, 300, 300, workers=2) == {("n", "c")}
    assert pinned_stages(uses, 300, 300, workers=1, exec_bytes=60) == {("n", "c")}
    assert pinned_stages(uses, 150, 150, workers=2) == frozenset()
    # The keep bound caps the pinned bytes, the budget the room left beside them.
    assert pinned_stages(uses, 100, 1000, workers=2) == {("n", "c")}
    # A stage the jobs load 30 times as often saves 30 times the time.
    uses[("n", "d")].recent_loads = 30
    assert pinned_stages(uses, 300, 300, workers=1) == {("n", "d"), ("n", "c")}
    age_uses(uses)
    assert uses[("n", "d")].recent_loads == 15 and uses[("n", "c")].recent_loads == 0.5


def test_pinned_stages_are_not_free_memory_and_only_a_dispatch_that_fits_no_other_way_evicts(
        ) -> None:
    state = new_state(1, 300, MasaPolicy(keep_loaded_bytes=300))
    # 350 bytes of stages: s0 and s1 are pinned (150, beside one LOAD of 100 = 250).
    add_tasks(state, chain_network(0, 0, [50, 100, 100, 100], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert state.pinned == {("n0", "s0"), ("n0", "s1")} == set(state.kept)
    assert state.ledger.pinned_bytes == state.ledger.kept_bytes == 150
    assert state.ledger.free_bytes() == 150  # kept stages not pinned would count as free
    add_tasks(state, chain_network(1, 0, [50, 100, 100, 100], exec_bytes=7, output_bytes=3))
    second = _run_job(state, 1)
    assert {d.task_id for d in second if d.reuses_kept} == {"j1/n0/s0/load", "j1/n0/s1/load"}
    assert not any(d.over_commit for d in second) and state.ledger.peak_reserved_bytes <= 300
    # A stage of 200 does not fit beside them: with nothing else to run, its LOAD
    # evicts the pinned stage that saves least per byte (s1), not the oldest.
    add_tasks(state, chain_network(2, 1, [200], exec_bytes=7, output_bytes=3))
    [dispatch] = select(state)
    assert dispatch.task_id == "j2/n1/s0/load" and not dispatch.over_commit
    assert [stage for stage, _ in state.events.kept_changes][-1] == ("n0", "s1")
    assert list(state.kept) == [("n0", "s0")] and state.ledger.pinned_bytes == 50


def test_a_simulation_of_jobs_cycling_through_more_stages_than_the_budget_reuses_pinned_ones(
        ) -> None:
    # 8 stages of 100 bytes through a budget of 500: 2 pinned, beside two LOADs of 100
    # and an EXEC's 10 at once.
    graph = merge([chain_network(job, 0, [100] * 8, release_us=job * 5000, load_us=300,
                                 exec_us=50) for job in range(6)])
    results = {pin: simulate_graph(graph, policy=make_policy(
        "masa", keep_loaded_bytes=500, pin_stages=pin), workers=2, memory_budget_bytes=500)
        for pin in (True, False)}
    pinned, unpinned = results[True], results[False]
    assert pinned.kept_stats["pinned_stages"] == 2 and unpinned.kept_stats["loads_reused"] == 0
    assert pinned.kept_stats["loads_reused"] == 2 * 5  # jobs 1-5 each reuse the 2
    assert pinned.makespan_us < unpinned.makespan_us
    assert pinned.peak_reserved_bytes <= 500 and not pinned.over_commits
    assert pinned.final_reserved_bytes == 0
    assert check_schedule(graph, list(pinned.schedule), workers=2, memory_budget_bytes=500) == []


def test_a_failed_network_keeps_nothing() -> None:
    state = new_state(1, 1000, MasaPolicy(keep_loaded_bytes=1000))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    [load] = select(state)
    finish(state, load.task_id)
    [execute] = select(state)
    finish(state, execute.task_id, ok=False)
    assert is_finished(state) and not state.kept and state.ledger.reserved_bytes == 0


def test_a_memory_oblivious_policy_cannot_keep_stages() -> None:
    policy = BulkPolicy()
    policy.keep_loaded_bytes = 100  # type: ignore[attr-defined]
    with pytest.raises(UserError, match="ignores the memory budget"):
        new_state(1, 1000, policy)
    assert not getattr(make_policy("bulk", keep_loaded_bytes=100), "keep_loaded_bytes", 0)


def test_a_simulation_reuses_kept_stages_at_no_cost_and_ends_with_nothing_reserved() -> None:
    graph = merge([chain_network(job, 0, [100, 200, 50], release_us=job * 1000,
                                 load_us=300, exec_us=50) for job in range(4)])
    plain = simulate_graph(graph, policy=make_policy("masa"), workers=2, memory_budget_bytes=600)
    kept = simulate_graph(graph, policy=make_policy("masa", keep_loaded_bytes=600),
                          workers=2, memory_budget_bytes=600)
    loads = {e.task_id: e for e in kept.schedule if e.task_id.endswith("/load")}
    later = [e for task_id, e in loads.items() if not task_id.startswith("j0/")]
    assert later and all(e.end_us == e.start_us for e in later)
    assert all(e.end_us - e.start_us == 300 for t, e in loads.items() if t.startswith("j0/"))
    assert kept.kept_stats == {"keep_loaded_bytes": 600, "loads_reused": 9, "kept_evicted": 3,
                               "pinned_stages": 0}
    assert kept.final_reserved_bytes == 0 and plain.final_reserved_bytes == 0
    assert kept.peak_reserved_bytes <= 600 and not kept.over_commits
    assert kept.makespan_us < plain.makespan_us
    assert check_schedule(graph, list(kept.schedule), workers=2, memory_budget_bytes=600) == []


def _three_jobs(store: Path) -> tuple[dict, dict, TaskGraph]:
    """AgeNet and GoogLeNet for three jobs 0.3 s apart (a job's tiny stages have run
    and been kept when the next arrives): manifests, feeds, graph."""
    networks = ("agenet", "googlenet")
    manifests = {name: load_store_network(store, name) for name in networks}
    feeds = {name: random_feeds(m.inputs, np.random.default_rng(7))
             for name, m in manifests.items()}
    jobs = [JobSpec(job, job * 300_000, networks) for job in range(3)]
    return manifests, feeds, build_workload_graph(jobs, manifests, list(networks))


def _run_real(manifests: dict, feeds: dict, graph: TaskGraph, keep_loaded_bytes: int,
              budget: int = 64 * MIB) -> RealRunResult:
    """Run the jobs for real; every run leaves nothing behind and stays in budget."""
    result = RealExecutor(graph, manifests, lambda job_id, network, upstream: feeds[network],
                          RealRunConfig(workers=2, memory_budget_bytes=budget,
                                        keep_loaded_bytes=keep_loaded_bytes)).run()
    assert_outputs_like_whole_models(result.outputs, manifests, feeds, range(3))
    assert result.final_reserved_bytes == 0 and result.live_sessions_after == 0
    assert result.peak_reserved_bytes <= budget and not result.over_commits
    return result


@pytest.mark.real
def test_a_real_run_reuses_kept_sessions_with_the_same_outputs(small_zoo_store: Path) -> None:
    manifests, feeds, graph = _three_jobs(small_zoo_store)
    result = _run_real(manifests, feeds, graph, keep_loaded_bytes=64 * MIB)
    stages = sum(len(m.stages) for m in manifests.values())
    assert result.policy_stats["loads_reused"] == 2 * stages  # jobs 1 and 2 load nothing
    assert result.policy_stats["kept_evicted"] == stages  # all unloaded at the run's end
    reused = [e for e in result.schedule if e.task_id.endswith("/load")
              and not e.task_id.startswith("j0/")]
    assert reused and all(e.worker >= 0 and e.status == "done" for e in reused)


@pytest.mark.real
def test_a_real_run_past_the_bound_reuses_its_pinned_sessions_with_the_same_outputs(
        small_zoo_store: Path) -> None:
    manifests, feeds, graph = _three_jobs(small_zoo_store)
    stage_bytes = sum(lock.memory_bytes for lock in graph.locks
                      if lock.from_task.startswith("j0/") and lock.from_task.endswith("/load"))
    # Half the stages' bytes: the first job's stages do not all fit, some are pinned.
    stats = _run_real(manifests, feeds, graph, keep_loaded_bytes=stage_bytes // 2).policy_stats
    stages = sum(len(m.stages) for m in manifests.values())
    assert 0 < stats["pinned_stages"] < stages
    assert stats["loads_reused"] == 2 * stats["pinned_stages"]  # jobs 1 and 2 take them
    assert stats["kept_evicted"] == stats["pinned_stages"]  # unloaded at the run's end


@pytest.mark.real
def test_keep_loaded_defaults_to_the_budget_is_refused_for_a_baseline_and_reported(
        small_zoo_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [agenet]\n"
                        "arrivals: {kind: periodic, interval_ms: 5, count: 3, seed: 1}\n")
    base = ["run", str(workload), "--store", str(small_zoo_store), "--memory", "8MiB",
            "--simulate", "--keep-loaded", "4MiB"]
    assert main(base + ["--policy", "bulk"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--keep-loaded" in err[0] and "bulk" in err[0]
    report_path = tmp_path / "r.json"
    assert main(base + ["--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["meta"]["keep_loaded_bytes"] == 4 * MIB
    stats = report["meta"]["policy_stats"]
    assert stats["loads_reused"] > 0 and stats["keep_loaded_bytes"] == 4 * MIB
    # The summary's peak is the ledger's, kept stages included.
    assert report["summary"]["peak_reserved_bytes"] <= 8 * MIB
    # The default: masa keeps within the budget, a baseline keeps nothing (and is not
    # refused), --keep-loaded 0 turns keeping off.
    plain = ["run", str(workload), "--store", str(small_zoo_store), "--memory", "8MiB",
             "--simulate", "--report", str(report_path)]
    for extra, expected_bytes in (([], 8 * MIB), (["--policy", "bulk"], 0),
                                  (["--keep-loaded", "0"], 0)):
        assert main(plain + extra) == 0
        assert json.loads(report_path.read_text())["meta"]["keep_loaded_bytes"] \
            == expected_bytes, extra


def test_a_load_told_to_reuse_a_stage_the_executor_does_not_hold_loads_it() -> None:
    """Should the executor's kept sessions ever miss one the core kept, the LOAD runs
    as any LOAD instead of failing the loop."""
    from masa.runtime.threads import _Stages
    from masa.sched.taskgraph import TaskKind

    stages = _Stages({}, intra_op_threads=1)
    load = Task("j1/n0/s0/load", TaskKind.LOAD, 10, 0, group="j1/n0", network="n0",
                stage_id="s0")
    assert stages.reuse(load) is False and not stages.sessions
