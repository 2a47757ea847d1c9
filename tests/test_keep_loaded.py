"""Kept loaded stages (`keep_loaded_bytes`): a stage's session stays loaded between
jobs within a bound of the budget, the next LOAD of it takes it at no cost, and a
dispatch that needs the memory evicts the least recently kept (masa.sched.core)."""

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
from masa.runtime.threads import RealExecutor, RealRunConfig
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
from masa.sched.policies import BulkPolicy, MasaPolicy
from masa.sched.taskgraph import Task
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


def test_stages_are_kept_only_while_every_stage_loaded_fits_in_the_bound() -> None:
    """Jobs that cycle through more stages than the bound would evict each kept stage
    before its next use: then nothing more is kept."""
    state = new_state(1, 1000, MasaPolicy(keep_loaded_bytes=250))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert not state.kept and state.ledger.reserved_bytes == 0  # 300 > 250
    state = new_state(1, 250, MasaPolicy(keep_loaded_bytes=1000))  # the budget bounds too
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert not state.kept and state.ledger.reserved_bytes == 0
    state = new_state(1, 1000, MasaPolicy(keep_loaded_bytes=300))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    _run_job(state, 0)
    assert list(state.kept) == [("n0", "s0"), ("n0", "s1")]
    # Another network's stage takes the stages loaded to 450 > 300: it is not kept,
    # and those kept before stay until a task needs their memory.
    add_tasks(state, chain_network(1, 1, [150], exec_bytes=7, output_bytes=3))
    _run_job(state, 1)
    assert list(state.kept) == [("n0", "s0"), ("n0", "s1")]
    assert state.ledger.reserved_bytes == state.ledger.kept_bytes == 300


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
    assert kept.kept_stats == {"keep_loaded_bytes": 600, "loads_reused": 9, "kept_evicted": 3}
    assert kept.final_reserved_bytes == 0 and plain.final_reserved_bytes == 0
    assert kept.peak_reserved_bytes <= 600 and not kept.over_commits
    assert kept.makespan_us < plain.makespan_us
    assert check_schedule(graph, list(kept.schedule), workers=2, memory_budget_bytes=600) == []


@pytest.mark.real
def test_a_real_run_reuses_kept_sessions_with_the_same_outputs(small_zoo_store: Path) -> None:
    networks = ("agenet", "googlenet")
    manifests = {name: load_store_network(small_zoo_store, name) for name in networks}
    feeds = {name: random_feeds(m.inputs, np.random.default_rng(7))
             for name, m in manifests.items()}
    # 0.3 s apart: a job's tiny stages have run and been kept when the next arrives.
    jobs = [JobSpec(job, job * 300_000, networks) for job in range(3)]
    graph = build_workload_graph(jobs, manifests, list(networks))
    budget = 64 * MIB
    result = RealExecutor(graph, manifests, lambda job_id, network, upstream: feeds[network],
                          RealRunConfig(workers=2, memory_budget_bytes=budget,
                                        keep_loaded_bytes=budget)).run()
    stages = sum(len(m.stages) for m in manifests.values())
    assert result.policy_stats["loads_reused"] == 2 * stages  # jobs 1 and 2 load nothing
    assert result.policy_stats["kept_evicted"] == stages  # all unloaded at the run's end
    assert_outputs_like_whole_models(result.outputs, manifests, feeds, range(3))
    assert result.final_reserved_bytes == 0 and result.live_sessions_after == 0
    assert result.peak_reserved_bytes <= budget and not result.over_commits
    reused = [e for e in result.schedule if e.task_id.endswith("/load")
              and not e.task_id.startswith("j0/")]
    assert reused and all(e.worker >= 0 and e.status == "done" for e in reused)


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
