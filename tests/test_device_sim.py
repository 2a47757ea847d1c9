"""The simulator on a device (issue 12, part 4): storage, page cache, predicted kills.

Pure: hand-made task graphs (tests/sched_graphs.py) on the virtual clock with a
DeviceModel; durations are virtual microseconds, so exact figures are asserted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sched_graphs import chain_network, merge

from masa.runtime.registry import make_policy
from masa.runtime.virtual import DeviceModel, StageStorage, simulate_graph
from masa.sched.policies import MasaPolicy
from masa.sched.taskgraph import TaskGraph, TaskKind
from solver.analysis import (
    least_missing_bytes,
    stage_file_requests,
    storage_mean_response_lower_bound_us,
)
from solver.schedules import response_sum

BASE = 1_000
MB = 1_000_000


def _device(cap_bytes: int, stages: dict, read: int | None = MB) -> DeviceModel:
    return DeviceModel(memory_cap_bytes=cap_bytes, runtime_base_bytes=BASE,
                       read_bytes_per_s=read, stages=stages)


def _durations(result, kind: str) -> list[int]:
    return [e.end_us - e.start_us for e in sorted(result.schedule, key=lambda e: e.start_us)
            if e.task_id.endswith(f"/{kind}")]


def _two_jobs_one_stage() -> TaskGraph:
    return merge([chain_network(0, 0, [100], load_us=100),
                  chain_network(1, 0, [100], load_us=100, release_us=10 * MB)])


def test_a_cold_load_reads_its_file_and_a_second_load_hits_the_page_cache() -> None:
    stages = {("n0", "s0"): StageStorage(file_bytes=2 * MB)}
    result = simulate_graph(_two_jobs_one_stage(), workers=1, memory_budget_bytes=10_000,
                            device=_device(100 * MB, stages))
    # profiled 100 us + 2 MB at 1 MB/s; then the file is still cached
    assert _durations(result, "load") == [100 + 2 * MB, 100]
    assert result.device.bytes_read == 2 * MB
    assert (result.device.load_misses, result.device.load_hits) == (1, 1)
    # what a real run measures at each LOAD's start: the second found the whole file
    assert (result.device.stage_file_bytes_loaded,
            result.device.stage_file_bytes_cached_at_load) == (4 * MB, 2 * MB)
    assert result.device.killed_at_us is None
    assert [job for job, _ in result.device.jobs_finished_before_kill] == [0, 1]


def test_without_room_for_the_whole_file_the_second_load_reads_what_was_evicted() -> None:
    """The kernel reclaims pages, not files: what the room keeps of the file stays
    cached, and the second LOAD reads the rest."""
    stages = {("n0", "s0"): StageStorage(file_bytes=2 * MB)}
    # Room for the page cache: cap - base - what the job holds (its stage's 100
    # resident bytes and the EXEC's 10), well under 2 MB.
    result = simulate_graph(_two_jobs_one_stage(), workers=1, memory_budget_bytes=10_000,
                            device=_device(BASE + 500_000, stages))
    kept_bytes = 500_000 - 110
    assert _durations(result, "load") == [100 + 2 * MB, 100 + 2 * MB - kept_bytes]
    assert result.device.bytes_read == 4 * MB - kept_bytes
    assert (result.device.load_misses, result.device.load_hits) == (2, 0)
    assert result.device.stage_file_bytes_cached_at_load == kept_bytes


def test_a_warm_device_starts_with_the_files_cached_and_no_bandwidth_costs_nothing() -> None:
    stages = {("n0", "s0"): StageStorage(file_bytes=2 * MB)}
    warm = DeviceModel(100 * MB, BASE, MB, stages, cold_cache=False)
    result = simulate_graph(_two_jobs_one_stage(), workers=1, memory_budget_bytes=10_000,
                            device=warm)
    assert _durations(result, "load") == [100, 100]
    free = simulate_graph(_two_jobs_one_stage(), workers=1, memory_budget_bytes=10_000,
                          device=_device(100 * MB, stages, read=None))
    assert _durations(free, "load") == [100, 100]


def _small_then_big() -> TaskGraph:
    """Job 0: one small stage; job 1 (later): a network of four 1000-byte stages."""
    return merge([chain_network(0, 0, [200]),
                  chain_network(1, 1, [1_000] * 4, release_us=10_000)])


def test_a_policy_that_exceeds_the_cap_is_predicted_killed_with_the_jobs_before() -> None:
    cap = BASE + 2_500  # bulk loads the big network whole: 4000 bytes
    bulk = simulate_graph(_small_then_big(), policy=make_policy("bulk"), workers=2,
                          memory_budget_bytes=2_400, device=_device(cap, {}))
    assert bulk.device.killed_at_us is not None and bulk.device.killed_at_us >= 10_000
    assert [job for job, _ in bulk.device.jobs_finished_before_kill] == [0]
    assert bulk.device.peak_anonymous_bytes > cap
    masa = simulate_graph(_small_then_big(), policy=make_policy("masa"), workers=2,
                          memory_budget_bytes=2_400, device=_device(cap, {}))
    assert masa.device.killed_at_us is None
    assert masa.device.peak_anonymous_bytes <= cap
    assert [job for job, _ in masa.device.jobs_finished_before_kill] == [0, 1]


def test_the_runs_records_of_its_ended_tasks_count_as_anonymous_memory() -> None:
    """A batch run keeps a record of every ended task until its report: memory the
    base, measured before the first job, does not hold. Ten one-stage jobs one after
    another (2 tasks each; at its EXEC a job holds 1010 bytes) fit a cap of base +
    2000 without the records; with 60 bytes a task, job 8's EXEC starts beside 17
    ended tasks' records (1020 bytes) and crosses it."""
    graph = merge([chain_network(job, 0, [1_000], release_us=job * 1_000)
                   for job in range(10)])
    cap = BASE + 2_000
    plain = simulate_graph(graph, workers=1, memory_budget_bytes=5_000,
                           device=_device(cap, {}))
    assert plain.device.killed_at_us is None
    assert plain.device.peak_anonymous_bytes == BASE + 1_010
    recorded = simulate_graph(graph, workers=1, memory_budget_bytes=5_000,
                              device=replace(_device(cap, {}), record_bytes_per_task=60))
    assert recorded.device.killed_at_us == 8_000 + 100  # job 8's LOAD ends at 8100
    assert [job for job, _ in recorded.device.jobs_finished_before_kill] == list(range(8))
    assert recorded.device.peak_anonymous_bytes > cap


def _copied_loads(transient_bytes: int, networks: int = 2) -> TaskGraph:
    """`networks` one-stage networks arriving together; each LOAD holds 1000 resident
    bytes and, while it runs, `transient_bytes` more (a copied stage's parse)."""
    graph = merge([chain_network(n, n, [1_000]) for n in range(networks)])
    tasks = tuple(replace(task, memory_bytes=transient_bytes)
                  if task.kind is TaskKind.LOAD else task for task in graph.tasks)
    return replace(graph, tasks=tasks)


def test_a_load_uses_its_transient_memory_once_its_read_has_ended() -> None:
    """Two cold LOADs share one storage: the second reads while the first parses, so
    their transients never coincide and the run fits a cap the ledger's sum exceeds.
    Warm, both parse at once and are predicted killed at their start."""
    stages = {(f"n{n}", "s0"): StageStorage(file_bytes=1_000) for n in range(2)}
    cap = BASE + 3_500  # the ledger: 2 x (1000 resident + 1000 transient)
    cold = simulate_graph(_copied_loads(1_000), workers=2, memory_budget_bytes=5_000,
                          device=_device(cap, stages, read=MB))
    assert cold.peak_reserved_bytes == 4_000
    # reads [0, 1000) and [1000, 2000) us; the first LOAD's parse ends at 1100
    assert _durations(cold, "load") == [1_100, 2_100]
    assert cold.device.killed_at_us is None
    assert cold.device.peak_anonymous_bytes == BASE + 3_000
    warm = simulate_graph(_copied_loads(1_000), workers=2, memory_budget_bytes=5_000,
                          device=DeviceModel(cap, BASE, MB, stages, cold_cache=False))
    assert warm.device.killed_at_us == 0


def test_a_load_whose_peak_exceeds_the_cap_is_killed_when_its_read_ends() -> None:
    stages = {("n0", "s0"): StageStorage(file_bytes=1_000)}
    result = simulate_graph(_copied_loads(3_000, networks=1), workers=1,
                            memory_budget_bytes=5_000,
                            device=_device(BASE + 2_500, stages, read=MB))
    assert result.device.killed_at_us == 1_000
    assert result.device.jobs_finished_before_kill == []


def test_mapped_weights_that_do_not_fit_are_read_again_by_their_exec() -> None:
    """Zero-copy stages hold file-backed pages, not anonymous memory: over the cap
    they are not killed but evicted and read again (a thrash)."""
    stages = {("n1", f"s{i}"): StageStorage(file_bytes=1_000, mapped_bytes=1_000)
              for i in range(4)}
    cap = BASE + 2_500
    bulk = simulate_graph(_small_then_big(), policy=make_policy("bulk"), workers=2,
                          memory_budget_bytes=2_400, device=_device(cap, stages))
    assert bulk.device.killed_at_us is None
    assert bulk.device.thrash_bytes > 0
    roomy = simulate_graph(_small_then_big(), policy=make_policy("bulk"), workers=2,
                           memory_budget_bytes=2_400, device=_device(BASE + 100_000, stages))
    assert roomy.device.thrash_bytes == 0
    assert roomy.device.bytes_read == 4_000


def _big_chain_on_a_tiny_device(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A store with `big` (8 unprofiled copy-mode fc stages: each holds its 8 MiB of
    weights once loaded), a workload of two `big` jobs, and an 80 MiB device whose
    card reads 20 MB/s: Bulk, loading `big` whole, is killed there."""
    from test_device import _prepare, fc_chain

    store = tmp_path / "store"
    _prepare(tmp_path, store, "big", fc_chain(1, 8, 1448, 1448), load_mode="copy",
             profile=False)
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [big]\ninput: random\n"
                        "arrivals: {kind: periodic, interval_ms: 100, count: 2}\n")
    device = tmp_path / "d.yaml"
    device.write_text("name: tiny\nmemory: 80MiB\nstorage: {read: 20MB/s}\ncores: 2\n")
    return store, workload, device


def test_compare_simulate_on_a_device_predicts_bulks_kill_without_root(
        tmp_path, monkeypatch, capsys, caplog) -> None:
    """`masa compare --simulate --device` needs no cgroups: the simulator models the device."""
    import json
    import os

    from masa.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    store, workload, device = _big_chain_on_a_tiny_device(tmp_path)
    code = main(["compare", str(workload), "--store", str(store), "--device", str(device),
                 "--simulate", "--memory", "24MiB", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1  # a run was killed
    reports = document["reports"]
    assert reports["bulk"]["status"] == "killed"
    assert reports["bulk"]["emulation"]["simulated"] is True
    assert reports["bulk"]["summary"]["jobs_finished_before_end"] == 0
    masa = reports["masa"]
    assert masa["status"] == "finished" and masa["summary"]["jobs_failed"] == 0
    # Cold: every stage file read once at 20 MB/s at least.
    stage_bytes = sum(p.stat().st_size for p in (store / "big").rglob("*.onnx*")
                      if p.name != "source.onnx")
    assert masa["emulation"]["bytes_read"] >= 0.9 * stage_bytes
    assert masa["summary"]["makespan_us"] >= 0.9 * stage_bytes / 20e6 * 1e6
    assert "above what device" not in caplog.text
    # A budget above what the cap leaves the scheduler is allowed, with a warning.
    main(["compare", str(workload), "--store", str(store), "--device", str(device),
          "--simulate", "--memory", "64MiB", "--policies", "masa", "--json"])
    assert "--memory 64.0 MiB is above what device tiny leaves the scheduler" in caplog.text
    # Without --json, the table says the runs were simulated, not real.
    capsys.readouterr()
    main(["compare", str(workload), "--store", str(store), "--device", str(device),
          "--simulate", "--memory", "24MiB", "--policies", "masa"])
    assert f"{workload}: simulated runs of 2 jobs on device tiny" in capsys.readouterr().out


def test_concurrent_cold_loads_share_the_storage() -> None:
    """Two jobs' cold LOADs at once: the second waits for the first one's read."""
    graph = merge([chain_network(0, 0, [100], load_us=100),
                   chain_network(1, 1, [100], load_us=100)])
    stages = {("n0", "s0"): StageStorage(file_bytes=MB), ("n1", "s0"): StageStorage(MB)}
    result = simulate_graph(graph, workers=2, memory_budget_bytes=10_000,
                            device=_device(100 * MB, stages))
    assert sorted(_durations(result, "load")) == [100 + MB, 100 + 2 * MB]


def test_a_file_enters_the_page_cache_when_its_read_ends() -> None:
    """Room for 3 MB of page cache, n0's 2 MB cached by job 0. Job 1's LOAD of n1
    (2 MB, cold) starts reading at 10 s; job 2's LOAD of n0 starts 100 us later,
    while the read goes on: nothing has been evicted for n1 yet, so n0 is found
    whole (the model that filled the cache when a read began evicted 1 MB of n0
    there, read again by job 2)."""
    graph = merge([chain_network(0, 0, [100], load_us=100),
                   chain_network(1, 1, [100], load_us=100, release_us=10 * MB),
                   chain_network(2, 0, [100], load_us=100, release_us=10 * MB + 100)])
    stages = {("n0", "s0"): StageStorage(file_bytes=2 * MB),
              ("n1", "s0"): StageStorage(file_bytes=2 * MB)}
    result = simulate_graph(graph, policy=MasaPolicy(cache_first=False), workers=2,
                            memory_budget_bytes=10_000, device=_device(BASE + 3 * MB, stages))
    loads = {e.task_id: e.end_us - e.start_us for e in result.schedule
             if e.task_id.endswith("/load")}
    assert loads == {"j0/n0/s0/load": 100 + 2 * MB, "j1/n1/s0/load": 100 + 2 * MB,
                     "j2/n0/s0/load": 100}
    assert result.device.bytes_read == 4 * MB
    assert (result.device.load_misses, result.device.load_hits) == (2, 1)


def test_a_load_of_a_file_being_read_waits_for_that_read_and_reads_nothing() -> None:
    """Two jobs' LOADs of the same cold file, 100 us apart: the file is read once,
    and the second LOAD ends when the read has (not at once, as from the cache)."""
    graph = merge([chain_network(0, 0, [100], load_us=100),
                   chain_network(1, 0, [100], load_us=100, release_us=100)])
    stages = {("n0", "s0"): StageStorage(file_bytes=2 * MB)}
    result = simulate_graph(graph, workers=2, memory_budget_bytes=10_000,
                            device=_device(100 * MB, stages))
    loads = {e.task_id: (e.start_us, e.end_us) for e in result.schedule
             if e.task_id.endswith("/load")}
    assert loads == {"j0/n0/s0/load": (0, 100 + 2 * MB),
                     "j1/n0/s0/load": (100, 100 + 2 * MB)}
    assert result.device.bytes_read == 2 * MB


def test_tasks_that_run_side_by_side_take_the_shared_cpu_multiplier() -> None:
    """Alone a task takes cpu_factor x its profile; dispatched beside another (together,
    or while one runs) that x shared_cpu_multiplier again."""
    device = DeviceModel(100 * MB, BASE, None, {}, cpu_factor=0.5, shared_cpu_multiplier=4.0)
    alone = simulate_graph(chain_network(0, 0, [100], load_us=100, exec_us=400), workers=2,
                           memory_budget_bytes=10_000, device=device)
    assert _durations(alone, "load") == [50] and _durations(alone, "exec") == [200]
    together = simulate_graph(merge([chain_network(0, 0, [100], load_us=100),
                                     chain_network(1, 1, [100], load_us=100)]),
                              workers=2, memory_budget_bytes=10_000, device=device)
    assert _durations(together, "load") == [200, 200]
    one_worker = simulate_graph(merge([chain_network(0, 0, [100], load_us=100),
                                       chain_network(1, 1, [100], load_us=100)]),
                                workers=1, memory_budget_bytes=10_000, device=device)
    assert _durations(one_worker, "load") == [50, 50]  # one after the other: each alone


def test_the_shared_multiplier_may_hold_only_while_tasks_run_side_by_side() -> None:
    """With shared_cpu_while_running a task slows down when a second one starts beside
    it and speeds up again when that ends: a LOAD alone for 500 of its 1000 us
    takes the other 500 x2 once another starts, and that one, beside it for 1000 us
    (500 us of its work), does its last 500 us alone. Without, the first keeps the
    speed it started at and the second is slow throughout."""
    jobs = merge([chain_network(0, 0, [100], load_us=1000, exec_us=0),
                  chain_network(1, 1, [100], load_us=1000, exec_us=0, release_us=500)])
    spans = {}
    for while_running in (True, False):
        device = DeviceModel(100 * MB, BASE, None, {}, shared_cpu_multiplier=2.0,
                             shared_cpu_while_running=while_running)
        run = simulate_graph(jobs, workers=2, memory_budget_bytes=10_000, device=device)
        spans[while_running] = {e.task_id: (e.start_us, e.end_us) for e in run.schedule
                                if e.task_id.endswith("/load")}
    assert spans[True] == {"j0/n0/s0/load": (0, 1500), "j1/n1/s0/load": (500, 2000)}
    assert spans[False] == {"j0/n0/s0/load": (0, 1000), "j1/n1/s0/load": (500, 2500)}


def test_a_network_with_its_own_cpu_factor_takes_it_and_the_shared_multiplier() -> None:
    """Networks named in cpu_factor_by_network take their factor instead of cpu_factor;
    beside another task every network's factor is multiplied alike."""
    device = DeviceModel(100 * MB, BASE, None, {}, cpu_factor=0.5, shared_cpu_multiplier=2.0,
                         cpu_factor_by_network={"n0": 0.25})
    together = simulate_graph(merge([chain_network(0, 0, [100], load_us=100, exec_us=400),
                                     chain_network(1, 1, [100], load_us=100, exec_us=400)]),
                              workers=2, memory_budget_bytes=10_000, device=device)
    by_task = {e.task_id: e.end_us - e.start_us for e in together.schedule}
    loads = {task.split("/")[1]: us for task, us in by_task.items() if task.endswith("/load")}
    assert loads == {"n0": 50, "n1": 100}, by_task
    alone = simulate_graph(chain_network(0, 0, [100], load_us=100, exec_us=400), workers=2,
                           memory_budget_bytes=10_000, device=device)
    assert _durations(alone, "exec") == [100]


def test_a_network_with_its_own_load_factor_takes_it_for_loads_only() -> None:
    """load_cpu_factor_by_network sets a network's LOAD time per profiled time (the
    profiler times a session's creation alone); its EXECs keep the network's CPU
    factor, and a network without one loads at that factor too."""
    device = DeviceModel(100 * MB, BASE, None, {}, cpu_factor=0.5,
                         cpu_factor_by_network={"n0": 0.25},
                         load_cpu_factor_by_network={"n0": 3.0})
    run = simulate_graph(merge([chain_network(0, 0, [100], load_us=100, exec_us=400),
                                chain_network(1, 1, [100], load_us=100, exec_us=400)]),
                         workers=1, memory_budget_bytes=10_000, device=device)
    by_task = {e.task_id: e.end_us - e.start_us for e in run.schedule}
    assert by_task == {"j0/n0/s0/load": 300, "j0/n0/s0/exec": 100,
                       "j1/n1/s0/load": 50, "j1/n1/s0/exec": 200}, by_task


def test_a_simulated_device_run_keeps_context_aware_conditions(tmp_path) -> None:
    """CA-wait on a simulated device: a downstream network whose label is never drawn
    is skipped, so its stage files are never read from the card."""
    from test_device import _prepare, fc_chain

    from masa.cli.emulated import simulate_on_device, stage_storage
    from masa.runtime.runner import RunSettings, prepare_run

    store = tmp_path / "store"
    for name, seed in (("first", 1), ("second", 2)):
        _prepare(tmp_path, store, name, fc_chain(seed, 2, 256, 256), profile=False)
    stage_bytes = {name: sum(p.stat().st_size for p in (store / name).rglob("*.onnx*")
                             if p.name != "source.onnx") for name in ("first", "second")}
    reads = {}
    for probability in (0.0, 1.0):
        workload = tmp_path / f"w{probability}.yaml"
        workload.write_text("graph:\n  first:\n  second:\n    after: first\n"
                            f"    when: {{probability: {probability}}}\ninput: random\n"
                            "arrivals: {kind: periodic, interval_ms: 100, count: 1}\n")
        prepared = prepare_run(workload, store, "wait")
        device = DeviceModel(memory_cap_bytes=512 * MB, runtime_base_bytes=0,
                             read_bytes_per_s=20 * MB, stages=stage_storage(prepared.manifests),
                             cold_cache=True)
        outcome, result = simulate_on_device(
            prepared, RunSettings(workers=2, memory_budget_bytes=64 * MB), device)
        second = outcome.network_status["j0/second"]
        assert second == ("skipped" if probability == 0.0 else "done"), second
        reads[probability] = result.device.bytes_read
    assert reads[1.0] - reads[0.0] == stage_bytes["second"]
    assert reads[0.0] == stage_bytes["first"]


def test_the_dispatch_time_holds_the_worker_but_not_the_tasks_recorded_end() -> None:
    """With dispatch_us, a worker starts its next task that long after the last one
    ended; each task's recorded duration stays its own time."""
    device = DeviceModel(100 * MB, BASE, None, {}, dispatch_us=50)
    run = simulate_graph(chain_network(0, 0, [100, 100], load_us=100, exec_us=400), workers=1,
                         memory_budget_bytes=10_000, device=device)
    schedule = sorted(run.schedule, key=lambda e: e.start_us)
    assert [e.end_us - e.start_us for e in schedule] == [100, 400, 100, 400]
    gaps = [b.start_us - a.end_us for a, b in zip(schedule[:-1], schedule[1:], strict=True)]
    assert gaps == [50, 50, 50], schedule


def _cached_job_then_a_smaller_network() -> TaskGraph:
    """Job 0 loads n0 (a 2 MB file); job 1 needs n0 again and n1, whose stage is
    smaller in memory, so smallest-first loads n1 first."""
    return merge([chain_network(0, 0, [100], load_us=100),
                  chain_network(1, 0, [100], load_us=100, release_us=10 * MB),
                  chain_network(1, 1, [50], load_us=100, release_us=10 * MB)])


def test_masa_loads_a_stage_still_cached_before_a_smaller_one_that_would_evict_it() -> None:
    """Room for 3 MB of page cache: reading n1's 2 MB first evicts 1 MB of n0, read
    again by its LOAD; loading n0 first (cached) reads only n1."""
    stages = {("n0", "s0"): StageStorage(file_bytes=2 * MB),
              ("n1", "s0"): StageStorage(file_bytes=2 * MB)}
    device = _device(BASE + 3 * MB + 200, stages)
    graph = _cached_job_then_a_smaller_network()
    smallest_first = simulate_graph(graph, policy=MasaPolicy(cache_first=False), workers=1,
                                    memory_budget_bytes=10_000, device=device)
    cached_first = simulate_graph(graph, policy=MasaPolicy(), workers=1,
                                  memory_budget_bytes=10_000, device=device)
    order = [e.task_id for e in sorted(cached_first.schedule, key=lambda e: e.start_us)
             if e.task_id.startswith("j1/") and e.task_id.endswith("/load")]
    assert order == ["j1/n0/s0/load", "j1/n1/s0/load"]
    assert cached_first.device.bytes_read == 4 * MB
    assert smallest_first.device.bytes_read > 4 * MB + MB // 2
    assert cached_first.makespan_us < smallest_first.makespan_us
    # Every file cached and room for all of them: the order is smallest-first's.
    warm = DeviceModel(memory_cap_bytes=BASE + 5 * MB, runtime_base_bytes=BASE,
                       read_bytes_per_s=MB, stages=stages, cold_cache=False)
    assert ([e.task_id for e in simulate_graph(graph, policy=MasaPolicy(), workers=1,
                                               memory_budget_bytes=10_000, device=warm).schedule]
            == [e.task_id for e in simulate_graph(graph, policy=MasaPolicy(cache_first=False),
                                                  workers=1, memory_budget_bytes=10_000,
                                                  device=warm).schedule])


def test_the_job_order_engages_for_a_lone_job_only_where_its_loads_read_nothing() -> None:
    """One job, one worker: with the job order (`queue_jobs`=1) the job goes depth
    first (n0's last stage before n1), smallest-first (`queue_jobs`=2, one worker's
    threshold) keeps n0's large stage for last. By default masa goes depth first where
    every stage the job still loads is cached (a warm device, or no storage modelled)
    and smallest-first where they must be read (a cold device)."""
    graph = merge([chain_network(0, 0, [100, 100, 400]), chain_network(0, 1, [200] * 3)])
    stages = {(f"n{n}", f"s{i}"): StageStorage(file_bytes=1_000)
              for n in range(2) for i in range(3)}
    warm = DeviceModel(10**9, BASE, MB, stages, cold_cache=False)
    cold = _device(10**9, stages)

    def order(policy: MasaPolicy, device: DeviceModel | None) -> tuple[str, ...]:
        return simulate_graph(graph, policy=policy, workers=1, memory_budget_bytes=100_000,
                              device=device).dispatch_order

    depth_first = order(MasaPolicy(queue_jobs=1), None)
    smallest_first = order(MasaPolicy(queue_jobs=2), None)
    assert depth_first.index("j0/n0/s2/load") < depth_first.index("j0/n1/s0/load")
    assert smallest_first[-2:] == ("j0/n0/s2/load", "j0/n0/s2/exec")
    assert order(MasaPolicy(), None) == depth_first
    assert order(MasaPolicy(), warm) == depth_first
    assert order(MasaPolicy(), cold) == smallest_first


def test_a_simulated_device_run_writes_its_trace_unless_predicted_killed(
        tmp_path, monkeypatch, capsys) -> None:
    """`masa run --simulate --device --trace`: a finished run's trace has a complete
    event per task; a run predicted killed writes none and says so."""
    import json
    import os

    from masa.cli.main import main

    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # no root needed
    store, workload, device = _big_chain_on_a_tiny_device(tmp_path)
    common = ["run", str(workload), "--store", str(store), "--device", str(device),
              "--simulate", "--memory", "24MiB"]
    trace = tmp_path / "masa.json"
    assert main([*common, "--trace", str(trace)]) == 0
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 2 * 2 * 8  # two jobs, a LOAD and an EXEC per stage
    capsys.readouterr()
    killed = tmp_path / "bulk.json"
    assert main([*common, "--policy", "bulk", "--trace", str(killed)]) == 1
    assert not killed.exists()
    assert "--trace: not written: the run was killed" in capsys.readouterr().err


def test_a_kept_stage_is_loaded_again_at_no_cost_and_reads_nothing() -> None:
    """Masa keeping loaded stages: the second job's LOAD takes the first's session, so
    on the device it neither reads its file nor spends its profiled time; without
    keeping it finds its file cached and spends its profiled time."""
    stages = {("n0", "s0"): StageStorage(file_bytes=2 * MB, mapped_bytes=2 * MB)}
    kept = simulate_graph(_two_jobs_one_stage(), workers=1, memory_budget_bytes=10_000,
                          policy=MasaPolicy(keep_loaded_bytes=10_000),
                          device=_device(100 * MB, stages))
    assert _durations(kept, "load") == [100 + 2 * MB, 0]
    assert kept.device.bytes_read == 2 * MB and kept.kept_stats["loads_reused"] == 1
    assert kept.final_reserved_bytes == 0
    plain = simulate_graph(_two_jobs_one_stage(), workers=1, memory_budget_bytes=10_000,
                           policy=MasaPolicy(), device=_device(100 * MB, stages))
    assert _durations(plain, "load") == [100 + 2 * MB, 100]
    # The executor's dispatch time follows a task a worker ran, not the hand-over of
    # a kept stage, which the real executor ends on its loop's thread.
    slow = replace(_device(100 * MB, stages), dispatch_us=500)
    kept = simulate_graph(_two_jobs_one_stage(), workers=1, memory_budget_bytes=10_000,
                          policy=MasaPolicy(keep_loaded_bytes=10_000), device=slow)
    starts = {e.task_id: (e.start_us, e.end_us) for e in kept.schedule}
    assert starts["j0/n0/s0/exec"][0] == starts["j0/n0/s0/load"][1] + 500
    assert starts["j1/n0/s0/exec"][0] == starts["j1/n0/s0/load"][1] == \
        starts["j1/n0/s0/load"][0]


def test_no_policy_beats_the_storage_bound_on_a_cold_device() -> None:
    """Six jobs a second apart, each loading two networks of 2 MB of stage files into
    3 MB of room at 1 MB/s: every job must read what its room could not keep, and no
    policy's simulated mean response is below `storage_mean_response_lower_bound_us`
    (more than a second per job here: the card, not the CPU, sets it), nor does any
    read fewer bytes than `least_missing_bytes`."""
    networks = [chain_network(job, network, [100, 100], load_us=100, release_us=job * MB)
                for job in range(6) for network in range(2)]
    graph = merge(networks)
    stages = {(f"n{n}", f"s{s}"): StageStorage(file_bytes=MB) for n in range(2) for s in range(2)}
    requests = stage_file_requests(graph, {key: st.file_bytes for key, st in stages.items()})
    assert len(requests) == 12 and {size for _, _, size in requests} == {2 * MB}
    bound_us = storage_mean_response_lower_bound_us(requests, 6, 3 * MB, MB)
    assert bound_us > 1 * MB  # more than a second per job
    for name in ("masa", "bulk", "deepeye"):
        result = simulate_graph(graph, policy=make_policy(name), workers=2,
                                memory_budget_bytes=100_000,
                                device=_device(BASE + 3 * MB, stages))
        assert result.device.killed_at_us is None
        assert response_sum(graph, result.schedule) / 6 >= bound_us, name
        # and no policy reads fewer bytes than the least any keeping could miss
        assert result.device.bytes_read >= least_missing_bytes(requests, 3 * MB), name
