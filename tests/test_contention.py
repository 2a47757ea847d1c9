"""Contention read from a trace (masa.report.contention) recovers what the simulator charged.

The simulator stretches a task's work by its multiplier while another worker runs a
task; the trace of a simulated run must give that multiplier back, beside EXECs and
beside LOADs alike, and 1.0 when nothing is charged.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from sched_graphs import chain_network, merge

from masa.common.libc import name_this_thread
from masa.report.contention import (
    TaskSpan,
    alone_times_us,
    beside_shares,
    fit_contention,
    fit_load_multipliers,
    load_shares_by_network,
    task_spans,
    time_ratio_by_context,
)
from masa.report.report import chrome_trace
from masa.runtime.virtual import DeviceModel, simulate_graph
from masa.sched.taskgraph import TaskGraph


def _jobs(seed: int, count: int = 200) -> TaskGraph:
    """`count` one-stage jobs of one of three networks (different EXEC and LOAD times),
    arriving at seeded random gaps: some tasks run alone, others side by side."""
    rng = np.random.default_rng(seed)
    gaps_us = rng.exponential(500, size=count)
    networks = rng.integers(0, 3, size=count)
    return merge([chain_network(job, int(network), [10], load_us=150 + 100 * int(network),
                                exec_us=200 + 150 * int(network), release_us=int(arrival_us))
                  for job, (network, arrival_us) in enumerate(
                      zip(networks, np.cumsum(gaps_us), strict=True))])


def _simulated_spans(graph: TaskGraph, **charged: float) -> list[TaskSpan]:
    """The tasks of `graph` simulated on two workers with the multipliers `charged`
    (DeviceModel's fields) held while tasks run side by side."""
    device = DeviceModel(memory_cap_bytes=10**9, runtime_base_bytes=0, read_bytes_per_s=None,
                         stages={}, cold_cache=False, shared_cpu_while_running=True,
                         **charged)
    result = simulate_graph(graph, workers=2, memory_budget_bytes=10**6, device=device)
    return task_spans(chrome_trace(graph, result.schedule, workers=2))


def _fit(graph: TaskGraph, multiplier: float):
    shares = beside_shares(_simulated_spans(graph, shared_cpu_multiplier=multiplier))
    alone = alone_times_us(shares)
    return alone, fit_contention(shares, alone)


def _assert_fitted(fit, alone: float, beside_exec: float, beside_load: float,
                   within: float) -> None:
    assert fit is not None
    assert (fit.alone, fit.beside_exec, fit.beside_load) == pytest.approx(
        (alone, beside_exec, beside_load), abs=within)


@pytest.mark.parametrize("multiplier", [1.0, 1.146, 1.5])
def test_the_multiplier_the_simulator_charged_is_read_back_from_its_trace(multiplier) -> None:
    graph = _jobs(seed=7)
    alone, fit = _fit(graph, multiplier)
    # every stage ran alone often enough to know its time alone: its profiled time
    assert alone == {(f"n{n}", "s0"): 200 + 150 * n for n in range(3)}
    assert fit is not None and fit.execs == 200
    assert 0.1 < fit.share_beside_exec and 0.1 < fit.share_beside_load
    _assert_fitted(fit, 1.0, multiplier, multiplier, within=0.01)


def test_a_run_slower_alone_too_is_told_apart_from_contention() -> None:
    """Against another run's times alone (Bulk's, in the benchmark), a run whose every
    task is 10% slower shows a multiplier alone of 1.1 and the charged one beside."""
    graph = _jobs(seed=7)
    reference, _ = _fit(graph, 1.0)
    slower = _simulated_spans(graph, cpu_factor=1.1, shared_cpu_multiplier=1.3)
    fit = fit_contention(beside_shares(slower), reference)
    _assert_fitted(fit, 1.1, 1.3, 1.3, within=0.02)


def _trace(*tasks: tuple[str, int, int, int]) -> dict:
    """A Chrome trace of tasks ("KIND net/stage", worker, start us, duration us), and a
    counter event that is not a task."""
    return {"traceEvents": [
        {"ph": "X", "cat": name.split()[0].lower(), "name": name, "tid": worker, "ts": start,
         "dur": duration} for name, worker, start, duration in tasks]
        + [{"ph": "C", "name": "memory (MiB)", "ts": 0}]}


def test_shares_count_only_the_other_workers_time_within_the_exec() -> None:
    trace = _trace(("EXEC a/s0", 0, 100, 100), ("LOAD b/s0", 1, 50, 75),
                   ("EXEC b/s0", 1, 150, 100), ("EXEC a/s1", 0, 200, 10))
    shares = {share.task.stage: share for share in beside_shares(task_spans(trace))}
    # a/s0 [100, 200): LOAD b [50, 125) for 25 us, EXEC b [150, 250) for 50 us
    assert (shares["a", "s0"].beside_exec, shares["a", "s0"].beside_load) == (0.5, 0.25)
    # b/s0 [150, 250): a/s0 until 200, a/s1 [200, 210): 60 of its 100 us
    assert (shares["b", "s0"].beside_exec, shares["b", "s0"].beside_load) == (0.6, 0.0)
    assert (shares["a", "s1"].beside_exec, shares["a", "s1"].beside_load) == (1.0, 0.0)


def test_loads_are_read_by_context_as_the_simulator_charged_them() -> None:
    """A LOAD alone takes its profiled time; beside another task the simulator stretches
    the part it overlaps, so each context's time ratio lies between 1 and the multiplier."""
    graph = _jobs(seed=11)
    profiled_us = {(f"n{n}", "s0"): 150 + 100 * n for n in range(3)}
    ratios = {}
    for multiplier in (1.0, 1.4):
        spans = _simulated_spans(graph, shared_cpu_multiplier=multiplier)
        ratios[multiplier] = time_ratio_by_context(beside_shares(spans, kind="load"),
                                                   profiled_us)
    assert set(ratios[1.4]) == {"alone", "beside_exec", "beside_load"}
    assert sum(count for _, count in ratios[1.4].values()) == 200
    assert all(ratio == pytest.approx(1.0) for ratio, _ in ratios[1.0].values())
    assert ratios[1.4]["alone"][0] == pytest.approx(1.0, abs=0.01)
    for context in ("beside_exec", "beside_load"):
        assert 1.1 < ratios[1.4][context][0] < 1.4


def test_a_kind_no_task_ran_beside_is_left_out_of_the_fit() -> None:
    """Bulk's LOADs run alone or beside its other LOADs, never beside an EXEC: the
    multiplier beside a LOAD is still fitted, the one beside an EXEC is unknown."""
    graph = _jobs(seed=7)
    shares = [share for share in beside_shares(_simulated_spans(
        graph, shared_cpu_multiplier=1.3), kind="load") if share.beside_exec == 0]
    fit = fit_contention(shares, {(f"n{n}", "s0"): 150 + 100 * n for n in range(3)})
    assert fit is not None and fit.beside_exec is None and fit.share_beside_exec == 0
    assert fit.alone == pytest.approx(1.0, abs=0.01)
    assert fit.beside_load == pytest.approx(1.3, abs=0.02)
    assert fit_contention([s for s in shares if s.beside_load == 0], {
        (f"n{n}", "s0"): 150 + 100 * n for n in range(3)}) is None


def test_a_load_s_own_multipliers_are_read_back_from_its_trace() -> None:
    """With LOADs charged their own multipliers beside a LOAD and beside an EXEC, the
    LOADs' fit gives those back and the EXECs' fit the shared one."""
    graph = _jobs(seed=7)
    spans = _simulated_spans(graph, shared_cpu_multiplier=1.1,
                             load_beside_load_multiplier=2.0, load_beside_exec_multiplier=1.4)
    loads = fit_contention(beside_shares(spans, kind="load"),
                           {(f"n{n}", "s0"): 150 + 100 * n for n in range(3)})
    execs = fit_contention(beside_shares(spans), {(f"n{n}", "s0"): 200 + 150 * n
                                                  for n in range(3)})
    _assert_fitted(loads, 1.0, 1.4, 2.0, within=0.03)
    _assert_fitted(execs, 1.0, 1.1, 1.1, within=0.01)


def test_a_run_s_load_times_per_network_give_the_load_s_own_multipliers_back() -> None:
    """Only each network's total LOAD time per run is known (the grid's records): with
    the shares of that time by context, the LOADs' scale alone and their multipliers
    beside a LOAD and beside an EXEC come back from a few runs at different rates."""
    charged = {"shared_cpu_multiplier": 1.1, "load_beside_load_multiplier": 2.2,
               "load_beside_exec_multiplier": 1.6,
               "load_cpu_factor_by_network": {f"n{n}": 0.5 for n in range(3)}}
    rows = []
    for seed in (3, 7, 11):
        spans = _simulated_spans(_jobs(seed=seed), **charged)
        shares = load_shares_by_network(beside_shares(spans, kind="load"))
        assert set(shares) == {"n0", "n1", "n2"}
        for network, found in shares.items():
            assert found.alone + found.beside_load + found.beside_exec == pytest.approx(1.0)
            profiled_us = sum(150 + 100 * int(network[1:]) for span in spans
                              if span.kind == "load" and span.network == network)
            rows.append((found, found.duration_us / profiled_us, 1.0))
    assert all(0.1 < found.beside_load and 0.1 < found.beside_exec for found, _, _ in rows)
    scale, beside_load, beside_exec = fit_load_multipliers(rows)
    assert scale == pytest.approx(0.5, rel=0.02)
    assert beside_load == pytest.approx(2.2, rel=0.03)
    assert beside_exec == pytest.approx(1.6, rel=0.03)
    held = fit_load_multipliers(rows, beside_load=2.2)
    assert held[1] == 2.2
    assert held[0] == pytest.approx(0.5, rel=0.02)
    assert held[2] == pytest.approx(1.6, rel=0.03)
    # held too low, the LOADs alone come out slower to make up for it
    assert fit_load_multipliers(rows, beside_load=1.5)[0] > 0.53


def test_the_first_loads_of_each_stage_are_left_out_of_the_shares() -> None:
    """The first LOADs of a stage read its file from storage: `skip_first` drops them."""
    trace = _trace(("LOAD a/s0", 0, 0, 100), ("LOAD b/s0", 1, 50, 100),
                   ("LOAD a/s0", 0, 300, 40), ("EXEC b/s0", 1, 310, 100))
    all_loads = load_shares_by_network(beside_shares(task_spans(trace), kind="load"))
    assert all_loads["a"].duration_us == 140 and all_loads["b"].duration_us == 100
    later = load_shares_by_network(beside_shares(task_spans(trace), kind="load"),
                                   skip_first=1)
    # a/s0's second LOAD [300, 340) ran beside the EXEC for 30 of its 40 us
    assert set(later) == {"a"}
    assert (later["a"].alone, later["a"].beside_load, later["a"].beside_exec) == (
        pytest.approx(0.25), 0.0, pytest.approx(0.75))


def test_a_task_s_context_is_the_kind_it_ran_beside_longest() -> None:
    trace = _trace(("LOAD a/s0", 0, 0, 100), ("LOAD b/s0", 1, 60, 40),
                   ("LOAD a/s1", 0, 200, 300), ("EXEC b/s0", 1, 300, 100))
    shares = beside_shares(task_spans(trace), kind="load")
    ratios = time_ratio_by_context(shares, {("a", "s0"): 50, ("a", "s1"): 100,
                                            ("b", "s0"): 20})
    # a/s0 and b/s0 overlap for 40 us: beside a LOAD; a/s1 beside the EXEC for a third
    assert ratios == {"beside_exec": (3.0, 1), "beside_load": (140 / 70, 2)}


@pytest.mark.skipif(not Path("/proc/thread-self/comm").exists(),
                    reason="needs Linux's /proc/thread-self (thread names in the kernel)")
def test_executor_threads_carry_their_names_into_the_kernel() -> None:
    """Per-thread figures (schedstat, top -H) tell the workers, the memory sampler and
    the planner apart only if the kernel knows their names; the 16-byte limit cuts."""
    seen: list[str] = []

    def record(name: str) -> None:
        name_this_thread(name)
        seen.append(Path("/proc/thread-self/comm").read_text().strip())

    for name in ("masa-worker-1", "masa-sampler-with-a-long-name"):
        thread = threading.Thread(target=record, args=(name,))
        thread.start()
        thread.join()
    assert seen == ["masa-worker-1", "masa-sampler-wi"]
