"""Measured memory: the statm split, the memory-cgroup readers (fake v1 and v2 trees),
and real runs whose results and reports carry the measured figures next to the ledger's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from masa.common.procmem import (
    CgroupMeter,
    MemoryCgroup,
    ResidentSplit,
    find_memory_cgroup,
    page_cache_bytes,
    read_cgroup_memory,
    resident_split,
    rss_bytes,
)

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20
V1_UNLIMITED = "9223372036854771712\n"


# ---------------------------------------------------------------- page cache


def test_page_cache_bytes_follows_reads_and_eviction(tmp_path: Path) -> None:
    import masa.common.procmem as procmem

    path = tmp_path / "weights.data"
    path.write_bytes(np.random.default_rng(0).bytes(3 * MIB + 123))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # clean pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        evicted = page_cache_bytes(path)
        if evicted:
            pytest.skip(f"{tmp_path}'s file system keeps pages on DONTNEED (tmpfs?)")
        assert evicted == 0
        os.pread(fd, MIB, MIB)  # the middle MiB (and what the kernel reads ahead)
        partly = page_cache_bytes(path)
        assert MIB <= partly <= path.stat().st_size
        # mincore, the fallback for kernels without cachestat, sees the same pages.
        assert procmem._mincore_bytes(fd, path.stat().st_size) == partly
        while os.read(fd, MIB):
            pass
        assert page_cache_bytes(path) == path.stat().st_size
    finally:
        os.close(fd)


# ---------------------------------------------------------------- statm split


def test_statm_split_sums_to_the_resident_set(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "statm").write_text("9000 700 250 10 0 4000 0\n")
    split = resident_split(proc_root=tmp_path)
    assert split == ResidentSplit(450 * PAGE_BYTES, 250 * PAGE_BYTES)
    assert split.resident_bytes == 700 * PAGE_BYTES


def test_statm_split_of_this_process_matches_its_rss() -> None:
    split = resident_split()
    rss = rss_bytes()
    assert split.anonymous_bytes > 0 and split.file_backed_bytes > 0
    assert abs(split.resident_bytes - rss) <= MIB  # two reads, a few allocations apart


def test_statm_kept_open_is_read_again_by_a_forked_child() -> None:
    """The kept-open statm is the process's own: a forked child (a profiler's worker)
    that allocates 64 MiB sees them, not its parent's figures."""
    resident_split()  # the parent has opened its statm
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: allocate, touch, report, leave without cleanup handlers
        try:
            before = resident_split().anonymous_bytes
            block = bytearray(64 * MIB)
            block[::4096] = b"x" * len(block[::4096])
            os.write(write_end, str(resident_split().anonymous_bytes - before).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    grown = int(os.read(read_end, 64))
    os.close(read_end)
    os.waitpid(pid, 0)
    assert grown >= 60 * MIB


# ---------------------------------------------------------------- fake cgroup trees


def _write(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)


def _proc(tmp_path: Path, cgroup_lines: str) -> Path:
    proc = tmp_path / "proc"
    _write(proc / "self", {"cgroup": cgroup_lines})
    return proc


def _v1_tree(tmp_path: Path, members: str = "4242\n") -> tuple[Path, Path, Path]:
    proc = _proc(tmp_path, "12:memory:/masa.slice/run\n11:cpu,cpuacct:/\n0::/\n")
    sys_root = tmp_path / "cgroup"
    directory = sys_root / "memory" / "masa.slice" / "run"
    _write(directory, {
        "memory.usage_in_bytes": "1000\n", "memory.max_usage_in_bytes": "5000\n",
        "memory.limit_in_bytes": V1_UNLIMITED,
        "memory.stat": "cache 300\nrss 600\nmapped_file 8\ntotal_cache 400\ntotal_rss 700\n",
        "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        "cgroup.procs": members,
    })
    return proc, sys_root, directory


def _v2_tree(tmp_path: Path, path: str = "user.slice/masa") -> tuple[Path, Path, Path]:
    proc = _proc(tmp_path, f"0::/{path}\n")
    sys_root = tmp_path / "cgroup"
    directory = sys_root / path
    _write(directory, {
        "memory.current": "2048\n", "memory.peak": "8192\n", "memory.max": "max\n",
        "memory.stat": "anon 1024\nfile 512\nkernel 64\n",
        "memory.events": "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n",
        "cgroup.procs": "4242\n",
    })
    return proc, sys_root, directory


def test_v1_cgroup_is_found_and_read(tmp_path: Path) -> None:
    proc, sys_root, directory = _v1_tree(tmp_path)
    cgroup = find_memory_cgroup(proc, sys_root)
    assert cgroup == MemoryCgroup(1, "/masa.slice/run", directory)
    reading = read_cgroup_memory(cgroup)
    assert (reading.usage_bytes, reading.peak_bytes, reading.limit_bytes) == (1000, 5000, None)
    assert (reading.anonymous_bytes, reading.file_bytes, reading.oom_kills) == (700, 400, 2)
    (directory / "memory.limit_in_bytes").write_text("536870912\n")
    assert read_cgroup_memory(cgroup).limit_bytes == 512 * MIB


def test_v1_meter_resets_the_peak_only_as_the_cgroups_only_member(tmp_path: Path) -> None:
    proc, sys_root, directory = _v1_tree(tmp_path)
    cgroup = find_memory_cgroup(proc, sys_root)
    assert cgroup is not None
    meter = CgroupMeter(cgroup, pid=4242)
    meter.begin()
    assert (directory / "memory.max_usage_in_bytes").read_text() == "0"
    # The kernel's figures move during the run.
    _write(directory, {"memory.usage_in_bytes": "3000\n", "memory.max_usage_in_bytes": "4000\n",
                       "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"})
    run = meter.finish()
    assert (run.usage_at_begin_bytes, run.usage_after_bytes) == (1000, 3000)
    assert (run.peak_usage_bytes, run.peak_since_begin, run.oom_kills) == (4000, True, 1)
    assert run.as_dict()["path"] == "/masa.slice/run"

    shared = CgroupMeter(cgroup, pid=1)  # another process is in the cgroup: leave its peak
    shared.begin()
    assert (directory / "memory.max_usage_in_bytes").read_text() == "4000\n"
    run = shared.finish()
    assert (run.peak_usage_bytes, run.peak_since_begin, run.oom_kills) == (4000, False, 0)


def test_v2_cgroup_is_found_and_read(tmp_path: Path) -> None:
    proc, sys_root, directory = _v2_tree(tmp_path)
    cgroup = find_memory_cgroup(proc, sys_root)
    assert cgroup == MemoryCgroup(2, "/user.slice/masa", directory)
    reading = read_cgroup_memory(cgroup)
    assert (reading.usage_bytes, reading.peak_bytes, reading.limit_bytes) == (2048, 8192, None)
    assert (reading.anonymous_bytes, reading.file_bytes, reading.oom_kills) == (1024, 512, 1)
    (directory / "memory.max").write_text("1048576\n")
    assert read_cgroup_memory(cgroup).limit_bytes == MIB


def test_v2_meter_never_writes_into_a_regular_file(tmp_path: Path) -> None:
    proc, sys_root, directory = _v2_tree(tmp_path)
    cgroup = find_memory_cgroup(proc, sys_root)
    assert cgroup is not None
    meter = CgroupMeter(cgroup, pid=4242)
    meter.begin()
    assert (directory / "memory.peak").read_text() == "8192\n"
    _write(directory, {"memory.current": "4096\n", "memory.peak": "9000\n"})
    run = meter.finish()
    assert (run.version, run.usage_at_begin_bytes, run.usage_after_bytes) == (2, 2048, 4096)
    assert (run.peak_usage_bytes, run.peak_since_begin, run.oom_kills) == (9000, False, 0)


@pytest.mark.parametrize("lines", [
    "4:memory:/\n0::/\n",  # v1 root: the machine's figures
    "0::/\n",  # v2 root: no memory.current there
    "4:cpu:/a\n",  # no memory controller, no unified hierarchy
    "4:memory:/gone\n",  # not visible under the cgroup root
    "0::/gone\n",
    "garbage\n",
])
def test_root_cgroup_or_none_gives_none(tmp_path: Path, lines: str) -> None:
    proc = _proc(tmp_path, lines)
    _write(tmp_path / "cgroup" / "memory", {"memory.usage_in_bytes": "1\n"})
    assert find_memory_cgroup(proc, tmp_path / "cgroup") is None


def test_no_proc_file_gives_none(tmp_path: Path) -> None:
    assert find_memory_cgroup(tmp_path / "proc", tmp_path / "cgroup") is None


def test_v2_namespace_root_with_memory_files_counts(tmp_path: Path) -> None:
    """In a container with its own cgroup namespace, its cgroup reads as / and has files."""
    proc = _proc(tmp_path, "0::/\n")
    _write(tmp_path / "cgroup", {"memory.current": "77\n"})
    cgroup = find_memory_cgroup(proc, tmp_path / "cgroup")
    assert cgroup is not None and cgroup.version == 2
    assert read_cgroup_memory(cgroup).usage_bytes == 77


# ---------------------------------------------------------------- real runs

NETWORKS = ("agenet", "googlenet")


def _manifests(store: Path) -> dict:
    from model_prep.manifest import load_store_network

    return {name: load_store_network(store, name) for name in NETWORKS}


def _real_executor(store: Path, memory_source: str = "model", jobs: int = 2):
    """A real executor of `jobs` jobs of both NETWORKS at once, 2 workers, 64 MiB, and its
    graph."""
    from masa.runtime.threads import RealExecutor, RealRunConfig
    from masa.sched.jobs import JobSpec, build_workload_graph
    from model_prep.feeds import random_feeds

    manifests = _manifests(store)
    feeds = {name: random_feeds(m.inputs, np.random.default_rng(7))
             for name, m in manifests.items()}
    graph = build_workload_graph([JobSpec(job_id, 0, NETWORKS) for job_id in range(jobs)],
                                 manifests, list(NETWORKS))
    executor = RealExecutor(graph, manifests, lambda job_id, network, upstream: feeds[network],
                            RealRunConfig(workers=2, memory_budget_bytes=64 * MIB,
                                          memory_source=memory_source))
    return graph, executor


def _real_run(store: Path, memory_source: str = "model"):
    graph, executor = _real_executor(store, memory_source)
    return graph, executor.run()


@pytest.mark.real
@pytest.mark.slow
def test_a_real_run_measures_its_peak_and_split(small_zoo_store: Path) -> None:
    from masa.report.report import MEASURED_KEYS, build_report, format_table

    graph, result = _real_run(small_zoo_store)
    assert set(result.group_status.values()) == {"done"}
    assert result.peak_measured_bytes > 0
    # Measured = anonymous above the baseline + the loaded stages' weights in memory,
    # at one sample: its peak covers each part's own peak.
    assert result.peak_measured_bytes >= result.peak_anonymous_bytes
    assert result.peak_measured_bytes >= result.peak_stage_file_bytes
    mapped = [s for m in _manifests(small_zoo_store).values() for s in m.stages
              if s.mapped_bytes and not s.prepack]
    assert mapped  # the store is in load mode mmap
    # Each loaded stage's data file is in memory (read in by its LOAD), held once
    # however many jobs load it.
    assert max(s.mapped_bytes for s in mapped) <= result.peak_stage_file_bytes
    assert result.peak_stage_file_bytes <= sum(
        Path(f"{m.stage_path(s)}.data").stat().st_size
        for m in _manifests(small_zoo_store).values() for s in m.stages if s in mapped)
    assert (result.peak_rss_above_baseline_bytes
            == result.peak_rss_bytes - result.baseline_rss_bytes)
    assert (result.baseline_anonymous_bytes + result.baseline_file_backed_bytes
            == result.baseline_rss_bytes)
    assert result.peak_measured_source == "samples"
    samples = [rss for _, _, rss in result.memory_timeline if rss is not None]
    assert samples and max(samples) <= result.peak_rss_bytes
    assert len(result.resident_timeline) >= len(samples)
    assert (find_memory_cgroup() is None) == (result.cgroup_memory is None)

    report = build_report(graph, result.schedule, workers=2, memory_budget_bytes=64 * MIB,
                          measured=result.measured_memory())
    summary = report["summary"]
    keys = list(summary)
    at = keys.index("peak_reserved_bytes")
    assert keys[at + 1:at + 2 + len(MEASURED_KEYS)] == ["peak_measured_bytes", *MEASURED_KEYS]
    assert summary["peak_measured_bytes"] == result.peak_measured_bytes
    assert summary["peak_anonymous_bytes"] == result.peak_anonymous_bytes
    assert summary["baseline_rss_bytes"] == result.baseline_rss_bytes
    assert summary["cgroup"] == (None if result.cgroup_memory is None
                                 else result.cgroup_memory.as_dict())
    json.dumps(report)
    assert "(anon " in format_table(report)


@pytest.mark.real
def test_the_baseline_is_taken_with_every_task_of_the_batch_in_the_scheduler(
        small_zoo_store: Path) -> None:
    """The scheduler's entries for the batch (about 650 bytes a task, made before the
    first job) are the run's bookkeeping: the baseline holds them, so measured memory
    above it is the jobs' and a long batch does not shrink its own budget."""
    graph, executor = _real_executor(small_zoo_store, "measured", jobs=3)
    tasks_at_baseline: list[int] = []
    begin = executor.backend.begin

    def counting_begin() -> None:
        tasks_at_baseline.append(len(executor.state.tasks))
        begin()

    executor.backend.begin = counting_begin  # type: ignore[method-assign]
    result = executor.run()
    assert set(result.group_status.values()) == {"done"}
    assert tasks_at_baseline == [len(graph.tasks)]


@pytest.mark.real
@pytest.mark.slow
def test_measured_source_reads_statm_once_per_decision(small_zoo_store: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import masa.runtime.threads as threads

    reads: list[ResidentSplit] = []

    def counting_split() -> ResidentSplit:
        split = resident_split()
        if threading.current_thread().name != "masa-memory-sampler":  # the loop's reads
            reads.append(split)
        return split

    monkeypatch.setattr(threads, "resident_split", counting_split)
    _, result = _real_run(small_zoo_store, memory_source="measured")
    assert set(result.group_status.values()) == {"done"}
    decisions = sum(1 for _, _, rss in result.memory_timeline if rss is not None)
    # the baseline, one per decision (the reconciling reading is the sample; a second
    # one after trimming the heap when nothing runs and the ledger misses memory), the
    # final ones (after the run, and when the sampler stops); the sampler read more
    assert len(reads) == 2 + len(result.resident_timeline)
    assert decisions <= len(result.resident_timeline) <= 2 * decisions


def test_simulated_report_has_null_measured_figures() -> None:
    from masa.report.report import MEASURED_KEYS, build_report
    from masa.sched.taskgraph import TaskGraph

    summary = build_report(TaskGraph((), (), ()), [], workers=1,
                           memory_budget_bytes=1)["summary"]
    assert summary["peak_measured_bytes"] is None
    assert all(summary[key] is None for key in MEASURED_KEYS)


def test_comparison_shows_reserved_and_measured_for_every_policy() -> None:
    from masa.cli.run import compare_reports

    def report(measured: dict | None) -> dict:
        summary = {"response_us": {"mean": 1000.0, "p50": 1000.0, "p95": 1000.0},
                   "makespan_us": 10**6, "peak_reserved_bytes": 3 * MIB,
                   "worker_utilisation": 0.5, "jobs_failed": 0,
                   "peak_measured_bytes": None, **(measured or {})}
        return {"summary": summary}

    table = compare_reports({
        "masa": report({"peak_measured_bytes": 5 * MIB, "peak_anonymous_bytes": 4 * MIB,
                        "peak_stage_file_bytes": MIB}),
        "bulk": report(None),  # an older report without the split
    })
    header, _, masa_row, bulk_row = table.splitlines()[:4]
    for column in ("peak reserved", "peak measured", "anon", "weights"):
        assert column in header
    assert masa_row.split()[5:13] == ["3.0", "MiB", "5.0", "MiB", "4.0", "MiB", "1.0", "MiB"]
    assert bulk_row.split()[5:10] == ["3.0", "MiB", "-", "-", "-"]


@pytest.mark.real
@pytest.mark.slow
def test_cli_run_report_has_the_measured_figures(small_zoo_store: Path, tmp_path: Path) -> None:
    from masa.cli.main import main
    from masa.report.report import MEASURED_KEYS

    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [agenet, googlenet]\n"
                        "arrivals: {kind: periodic, interval_ms: 5, count: 2, seed: 1}\n")
    report_path = tmp_path / "r.json"
    assert main(["-q", "run", str(workload), "--store", str(small_zoo_store),
                 "--memory", "64MiB", "--report", str(report_path)]) == 0
    summary = json.loads(report_path.read_text())["summary"]
    assert summary["peak_measured_bytes"] > 0
    assert set(MEASURED_KEYS) <= set(summary)


# ---------------------------------------------------------------- a real run in a cgroup

_CHILD = """
import json, os, sys
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as procs:
    procs.write(str(os.getpid()))
sys.path[:0] = [sys.argv[3], os.path.join(sys.argv[3], "tests")]
from test_measured_memory import _real_run
from pathlib import Path
_, result = _real_run(Path(sys.argv[2]))
print(json.dumps({"status": sorted(set(result.group_status.values())),
                  "measured": result.measured_memory()}))
"""


@pytest.fixture
def fresh_memory_cgroup() -> Iterator[Path]:
    """A new, empty memory cgroup (v1, or v2 with the memory controller delegated)."""
    if os.geteuid() != 0:
        pytest.skip("creating a memory cgroup needs root")
    name = f"masa-test-{uuid.uuid4().hex[:8]}"
    v1 = Path("/sys/fs/cgroup/memory")
    v2 = Path("/sys/fs/cgroup")
    if (v1 / "memory.usage_in_bytes").is_file():
        directory = v1 / name
    elif "memory" in _read(v2 / "cgroup.subtree_control").split():
        directory = v2 / name
    else:
        pytest.skip("no writable v1 memory hierarchy or v2 memory controller")
    try:
        directory.mkdir()
    except OSError as error:
        pytest.skip(f"cannot create a memory cgroup: {error}")
    try:
        yield directory
    finally:
        _remove_cgroup(directory)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _remove_cgroup(directory: Path) -> None:
    """Move stragglers to the parent, then remove the (then empty) cgroup."""
    for pid in _read(directory / "cgroup.procs").split():
        try:
            (directory.parent / "cgroup.procs").write_text(pid)
        except OSError:
            pass
    directory.rmdir()


@pytest.mark.real
@pytest.mark.slow
def test_a_real_run_in_its_own_memory_cgroup(fresh_memory_cgroup: Path,
                                             small_zoo_store: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(fresh_memory_cgroup), str(small_zoo_store),
         str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
    try:
        out, err = child.communicate(timeout=600)  # a safety net, not a measurement
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    found = json.loads(out.strip().splitlines()[-1])
    assert found["status"] == ["done"]
    cgroup = found["measured"]["cgroup"]
    assert cgroup is not None
    assert cgroup["path"] == "/" + fresh_memory_cgroup.name
    assert cgroup["usage_at_begin_bytes"] > 0 and cgroup["usage_after_bytes"] > 0
    assert cgroup["oom_kills"] in (0, None)
    if cgroup["version"] == 1:  # the run's process is the cgroup's only member
        assert cgroup["peak_since_begin"] is True
        assert cgroup["peak_usage_bytes"] >= cgroup["usage_at_begin_bytes"]


def test_the_core_sees_the_budget_less_the_largest_recent_unmodelled_reading() -> None:
    """While tasks run, their untouched reservations hide unmodelled memory: the budget
    is shrunk by the largest reading of the last UNMODELLED_WINDOW_US, not the last."""
    from masa.runtime.threads import UNMODELLED_WINDOW_US, RealRunConfig, ThreadBackend

    now_s = [0.0]
    backend = ThreadBackend({}, lambda *args: {},
                            RealRunConfig(workers=1, memory_budget_bytes=64 * MIB),
                            clock=lambda: now_s[0])
    window_s = UNMODELLED_WINDOW_US / 1e6

    def reading(at_s: float, unmodelled_bytes: int) -> int:
        now_s[0] = at_s
        return backend._recent_unmodelled_bytes(unmodelled_bytes)

    assert reading(0.0, 3 * MIB) == 3 * MIB
    assert reading(0.4 * window_s, 0) == 3 * MIB  # hidden by running tasks' reservations
    assert reading(0.8 * window_s, 1 * MIB) == 3 * MIB
    assert reading(1.2 * window_s, 0) == 1 * MIB  # the 3 MiB reading left the window
    assert reading(1.3 * window_s, 2 * MIB) == 2 * MIB
    assert reading(2.5 * window_s, 0) == 0


def test_the_sampler_wakes_only_while_a_task_runs(tmp_path: Path) -> None:
    """Between decisions memory is sampled every SAMPLE_PERIOD_S, but only while a task
    runs: an idle daemon's sampler does not wake (each wake-up delays its HTTP loop)."""
    import models

    from masa.runtime.driver import Observer
    from masa.runtime.runner import prepare_run
    from masa.runtime.threads import RealExecutor, RealRunConfig
    from model_prep.prepare_cli import prepare_network
    from workloads.inputs import network_inputs

    model = models.save(models.conv_chain(np.random.default_rng(0)), tmp_path, "chain")
    prepare_network(model, tmp_path / "store", "chain", profile=False, show_progress=False)
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [chain]\narrivals: {kind: periodic, interval_ms: 30, "
                        "count: 4}\n")
    prepared = prepare_run(workload, tmp_path / "store")

    def inputs_for(job_id: int, network: str, upstream_outputs: dict) -> dict:
        return network_inputs(prepared.workload, prepared.manifests[network], job_id,
                              upstream_outputs)

    executor = RealExecutor(prepared.graph, prepared.manifests, inputs_for,
                            RealRunConfig(workers=2, memory_budget_bytes=64 * MIB))
    seen: list[tuple[int, bool]] = []  # after each decision: (tasks running, sampling)

    class Watch(Observer):
        def memory(self, now_us: int, reserved_bytes: int, measured_bytes: int | None) -> None:
            seen.append((executor.driver.state.running_count,
                         executor.backend.meter.sampling))

    executor.driver.observers.append(Watch())
    executor.run()
    assert any(running for running, _ in seen)
    assert all(sampling for running, sampling in seen if running)
    # Idle between the jobs (30 ms apart) and at the end: the sampler sleeps.
    assert any(not sampling for running, sampling in seen if not running)
    assert seen[-1] == (0, False)


def test_freed_heap_within_the_slack_above_what_a_trim_left_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run keeps up to heap_slack_bytes of freed heap (buffers reused instead of
    faulted in again) above what its last trim could not return; beyond that the idle
    loop and a stage unload trim. Without a slack they trim whenever anything is
    unmodelled."""
    import masa.runtime.threads as threads
    from masa.runtime.registry import make_policy
    from masa.sched.core import new_state

    def backend_reading(slack_mib: int, readings_mib: list[float]) -> tuple[Any, list[str]]:
        trimmed: list[str] = []
        monkeypatch.setattr(threads, "release_memory",
                            lambda collect=True: trimmed.append("trim"))
        backend = threads.ThreadBackend(
            {}, lambda *args: {},
            threads.RealRunConfig(workers=1, memory_budget_bytes=256 * MIB,
                                  memory_source="measured",
                                  heap_slack_bytes=slack_mib * MIB))
        queued = [round(mib * MIB) for mib in readings_mib]
        monkeypatch.setattr(backend, "_unmodelled_bytes",
                            lambda state: _set_last(backend, queued.pop(0)))
        return backend, trimmed

    def unload(backend: Any) -> None:
        backend.pending_unload = True  # a stage was unloaded
        backend.completions.put(None)
        backend.wait(None)

    state = new_state(1, 256 * MIB, make_policy("masa"))  # idle: nothing runs
    backend, trimmed = backend_reading(4, [2, 6, 5, 8, 10, 3])
    backend.before_select(state)  # 2 MiB: kept
    assert trimmed == []
    backend.before_select(state)  # 6 MiB > 0 + 4: trimmed, 5 MiB left (live)
    assert trimmed == ["trim"] and backend.unreturned_bytes == 5 * MIB
    assert state.ledger.budget_bytes == (256 - 5) * MIB  # less what the trim left
    unload(backend)  # the last reading, 5 MiB, is what the trim left: kept
    backend.before_select(state)  # 8 MiB <= 5 + 4: kept
    assert trimmed == ["trim"]
    backend.before_select(state)  # 10 MiB: trimmed, 3 MiB left
    assert trimmed == ["trim", "trim"] and backend.unreturned_bytes == 3 * MIB

    backend, trimmed = backend_reading(0, [2, 2, 0])
    backend.before_select(state)  # no slack: anything unmodelled is trimmed
    assert trimmed == ["trim"]
    unload(backend)
    assert trimmed == ["trim", "trim"]
    backend.before_select(state)  # nothing unmodelled: nothing to trim
    assert trimmed == ["trim", "trim"]


@pytest.mark.real
def test_masa_run_keeps_the_default_heap_slack(small_zoo_store: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`masa run` (the runner) keeps freed heap up to min(4 MiB, budget / 64) rather than
    trimming after every unload, as the daemon does."""
    import masa.runtime.runner as runner
    from masa.runtime.threads import default_heap_slack_bytes

    configs = []

    class Recording(runner.RealExecutor):
        def __init__(self, graph: Any, manifests: Any, inputs_for: Any, config: Any,
                     **kwargs: Any) -> None:
            configs.append(config)
            super().__init__(graph, manifests, inputs_for, config, **kwargs)

    monkeypatch.setattr(runner, "RealExecutor", Recording)
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [agenet]\ninput: random\n"
                        "arrivals: {kind: periodic, interval_ms: 1, count: 2, seed: 3}\n")
    for budget_mib, slack_bytes in ((64, MIB), (1024, 4 * MIB)):
        outcome = runner.execute(runner.prepare_run(workload, small_zoo_store),
                                 runner.RunSettings(workers=1,
                                                    memory_budget_bytes=budget_mib * MIB),
                                 simulate=False)
        assert set(outcome.network_status.values()) == {"done"} and len(outcome.jobs) == 2
        assert configs[-1].heap_slack_bytes == slack_bytes
        assert default_heap_slack_bytes(budget_mib * MIB) == slack_bytes


def _set_last(backend: Any, unmodelled_bytes: int) -> int:
    backend.last_unmodelled_bytes = unmodelled_bytes
    return unmodelled_bytes


def test_measured_memory_leaves_out_file_pages_that_are_not_weights(tmp_path: Path) -> None:
    """A decision's measured memory is anonymous memory above the baseline plus the
    loaded stages' weights: file pages the process maps beside them (ONNX Runtime's
    kernels paged in during a run) are the runtime base's, and neither the core nor
    the report's peak count them. It used to report the resident set above the
    baseline, so a run that paged in more library code looked over its budget."""
    import mmap

    from masa.runtime.threads import RealRunConfig, ThreadBackend

    backend = ThreadBackend({}, lambda *args: {},
                            RealRunConfig(workers=1, memory_budget_bytes=64 * MIB))
    backend.meter.begin()
    try:
        before = backend.measured_bytes()
        assert before is not None
        library = tmp_path / "library.so"
        library.write_bytes(np.random.default_rng(0).bytes(32 * MIB))
        with library.open("rb") as file, mmap.mmap(file.fileno(), 0,
                                                   access=mmap.ACCESS_READ) as mapped:
            for offset in range(0, len(mapped), PAGE_BYTES):
                mapped[offset]  # fault every page in
            file_backed_growth = (resident_split().file_backed_bytes
                                  - backend.meter.baseline.file_backed_bytes)
            assert file_backed_growth >= 24 * MIB  # the pages are resident, file-backed
            assert backend.measured_bytes() < before + 8 * MIB
    finally:
        backend.meter.finish()
