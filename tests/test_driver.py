"""The one driver loop: live submission, forgetting ended jobs, both clocks.

The simulator and the real executor are both this loop (their own tests live
in test_simulator.py and test_executor.py); here the loop is driven as a
long-running service would drive it: jobs submitted while it runs, ended
jobs forgotten, state and memory flat.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from sched_graphs import chain_network, merge

from masa.common.procmem import rss_bytes
from masa.runtime.driver import Driver, Observer, Recorder
from masa.runtime.registry import POLICY_NAMES, make_policy
from masa.runtime.virtual import VirtualBackend, simulate_graph
from masa.sched.context import ContextController
from masa.sched.core import GroupStatus, new_state
from masa.sched.policies import MasaPolicy


class _Counter(Observer):
    def __init__(self) -> None:
        self.jobs_ended = 0
        self.tasks_ended = 0
        self.statuses: dict[GroupStatus, int] = {}

    def ended(self, record) -> None:  # noqa: ANN001
        self.tasks_ended += 1

    def group_ended(self, group: str, status: GroupStatus, now_us: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def job_ended(self, job_id: int, now_us: int) -> None:
        self.jobs_ended += 1


def _job(job_id: int, release_us: int, rng: np.random.Generator):
    stages = [int(x) for x in rng.integers(5, 40, size=2)]
    return chain_network(job_id, 0, stages, load_us=40, exec_us=20, release_us=release_us)


def _state_size(driver: Driver) -> int:
    state = driver.state
    return len(state.tasks) + len(state.groups) + len(state.locks)


@pytest.mark.slow
def test_100000_jobs_through_the_live_driver_keep_state_and_memory_flat() -> None:
    """Submitted while the loop runs, forgotten once ended: only unfinished jobs stay."""
    rng = np.random.default_rng(5)
    counter = _Counter()
    driver = Driver(new_state(2, 200, MasaPolicy()), VirtualBackend(),
                    observers=[counter], forget_ended=True)
    interval_us, batch = 70, 100  # about 90% load on 2 workers
    sizes: list[int] = []
    rss_after_warmup = 0
    for first in range(0, 100_000, batch):
        for job_id in range(first, first + batch):
            driver.submit(_job(job_id, job_id * interval_us, rng))
        driver.run(until_us=(first + batch) * interval_us)
        sizes.append(_state_size(driver))
        if first == 10_000:
            gc.collect()
            rss_after_warmup = rss_bytes()
    driver.run()
    gc.collect()
    assert counter.jobs_ended == 100_000
    assert counter.statuses == {GroupStatus.DONE: 100_000}
    assert _state_size(driver) == 0 and driver.state.ledger.reserved_bytes == 0
    # At every batch boundary the state held only the jobs not yet finished:
    # never more than a few batches' worth (a job is 4 tasks, 1 group, 4 locks).
    assert max(sizes) < 9 * 3 * batch
    assert rss_bytes() - rss_after_warmup < 8 * 2**20


def test_submit_while_running_matches_adding_everything_up_front() -> None:
    """The live path (submit between runs) decides exactly as one simulation."""
    rng = np.random.default_rng(2)
    graphs = [_job(job_id, job_id * 30, rng) for job_id in range(40)]
    for policy in POLICY_NAMES:
        if policy == "masa-plan":
            continue  # plans depend on what is known when: not comparable
        reference = simulate_graph(merge(graphs), policy=make_policy(policy), workers=2,
                                   memory_budget_bytes=120)
        recorder = Recorder()
        driver = Driver(new_state(2, 120, make_policy(policy)), VirtualBackend(),
                        observers=[recorder])
        for graph in graphs:
            driver.submit(graph)
            driver.run(until_us=graph.tasks[0].release_us)
        driver.run()
        assert tuple(recorder.dispatch_order) == reference.dispatch_order, policy
        assert tuple(recorder.schedule) == reference.schedule, policy


def test_forgetting_keeps_context_decisions_of_running_jobs() -> None:
    """CA-wait with forgetting: skipped downstreams are reported, then forgotten."""
    graphs = []
    for job_id in range(20):
        graphs.append(chain_network(job_id, 0, [10, 10], release_us=job_id * 500))
        graphs.append(chain_network(job_id, 1, [10], release_us=job_id * 500))
    controller = ContextController(
        "wait", {"n1": ("n0",)}, decide=lambda job_id, network, outputs: job_id % 2 == 0)
    counter = _Counter()
    driver = Driver(new_state(2, 100, MasaPolicy()), VirtualBackend(), context=controller,
                    observers=[counter], forget_ended=True)
    for graph in graphs:
        driver.submit(graph)
    driver.run()
    assert counter.jobs_ended == 20
    assert counter.statuses == {GroupStatus.DONE: 30, GroupStatus.CANCELLED: 10}
    assert _state_size(driver) == 0
    assert controller.job_networks == {} and controller.outcome == {}
