"""Devices as data and their emulation (issue 12): presets, errors, cgroups, kills.

The emulation tests need root and writable cgroups (memory, and blkio for the
throttle); elsewhere they skip and say why. They assert behaviour and ratios
of measured figures, never wall-clock limits.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import onnx
import pytest
from commands import Command
from onnx import TensorProto, helper, numpy_helper

from masa.cli.main import main as masa_main
from masa.common.errors import UserError, ValidationError
from masa.runtime import emulation
from masa.runtime.device import device_from_dict, load_device, preset_names
from masa.runtime.emulation import (
    GROUP_PREFIX,
    EmulatedRun,
    _mounts,
    cgroup_layout,
    check_emulation,
    run_emulated,
)
from model_prep.manifest import load_manifest
from model_prep.prepare_cli import prepare_network
from workloads.generation import generate_jobs
from workloads.loader import load_workload

# ---------------------------------------------------------------- devices as data


def test_every_preset_loads_with_a_cap_below_its_memory() -> None:
    assert {"pi3b-1g", "pi4-1g", "pi4-2g", "pi4-4g", "jetson-nano"} <= set(preset_names())
    for name in preset_names():
        device = load_device(name)
        assert device.name == name
        assert 0 < device.memory_cap_bytes < device.memory_bytes
        assert device.read_bytes_per_s and device.cores >= 1
    pi4 = load_device("pi4-2g")
    assert pi4.memory_bytes == 2 * 2**30 and pi4.read_bytes_per_s == 44_000_000
    assert pi4.default_budget_bytes(60 * 2**20) == pi4.memory_cap_bytes - 60 * 2**20


def test_a_device_file_with_every_problem_listed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmemory: lots\nreserved: 1GiB\nstorage: {read: fast}\n"
                   "cores: 0\ncolour: red\n")
    with pytest.raises(ValidationError) as caught:
        load_device(bad)
    text = "; ".join(caught.value.problems)
    for expected in ("at 'colour': unknown field", "at 'memory': expected a size",
                     "at 'storage.read': expected a bandwidth", "at 'cores': expected a "
                     "positive integer"):
        assert expected in text
    with pytest.raises(UserError, match="neither a device file nor a preset"):
        load_device("pi9")
    device = device_from_dict({"name": "t", "memory": "200MiB", "storage": None}, "t.yaml")
    assert device.read_bytes_per_s is None and device.cold_cache


def test_without_root_the_error_names_what_is_missing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root"):
        check_emulation(load_device("pi4-1g"), tmp_path)
    code = masa_main(["run", "small", "--store", str(tmp_path), "--device", "pi4-1g"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


def test_mountinfo_parsing_finds_v1_controllers_and_v2() -> None:
    text = ("35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
            "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
            "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    v1, v2 = _mounts(text)
    assert v1["memory"] == Path("/sys/fs/cgroup/memory") and "blkio" in v1
    assert v2 == Path("/sys/fs/cgroup/unified")


# ---------------------------------------------------------------- emulation


def _why_no_emulation() -> str | None:
    if os.geteuid() != 0:
        return "needs root to create cgroups"
    layout = cgroup_layout()
    if layout is None or "memory" not in layout.parents:
        return "no memory cgroup controller mounted"
    if not os.access(layout.parents["memory"], os.W_OK):
        return f"cannot write {layout.parents['memory']}"
    if "blkio" not in layout.parents:
        return "no blkio/io controller for the storage throttle"
    return None


needs_cgroups = pytest.mark.skipif(_why_no_emulation() is not None,
                                   reason=str(_why_no_emulation()))


def fc_chain(seed: int, layers: int, rows: int, cols: int) -> onnx.ModelProto:
    """x (1 x rows) -> `layers` MatMul (rows x cols, then cols x cols ...) + Relu."""
    rng = np.random.default_rng(seed)
    nodes, initializers, current, width = [], [], "x", rows
    for index in range(layers):
        weight = numpy_helper.from_array(
            (rng.standard_normal((width, cols)) / np.sqrt(width)).astype(np.float32), f"w{index}")
        initializers.append(weight)
        nodes.append(helper.make_node("MatMul", [current, f"w{index}"], [f"m{index}"]))
        current = "y" if index == layers - 1 else f"r{index}"
        nodes.append(helper.make_node("Relu", [f"m{index}"], [current]))
        width = cols
    graph = helper.make_graph(
        nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _prepare(tmp_path: Path, store: Path, name: str, model: onnx.ModelProto, **options: object
             ) -> None:
    path = tmp_path / f"{name}.onnx"
    onnx.save_model(model, str(path))
    prepare_network(path, store, name, **options)


def _device(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "device.yaml"
    path.write_text(text)
    return path


def _spec(workload: Path, store: Path, policy: str, **extra: object) -> dict:
    return {"workload": str(workload), "store": str(store), "context": "oblivious",
            "job_limit": None, **extra,
            "settings": {"policy": policy, "workers": 2, "memory_budget_bytes": None,
                         "memory_source": "model"}}


def _groups_left(pid: int) -> list[Path]:
    layout = cgroup_layout()
    assert layout is not None
    return [group for parent in set(layout.parents.values())
            for group in parent.glob(f"{GROUP_PREFIX}{pid}-*")]


@needs_cgroups
def test_a_cold_load_through_a_20_mb_s_throttle_takes_size_over_20_mb_s(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    # One 64 MiB fc stage, its weights in the mapped data file (load mode mmap). The
    # throttle lets about 3 MB through at the start of a read (measured here: a
    # 16 MiB stage loaded in 0.80-1.02x its size / 20 MB/s, a 64 MiB one in
    # 0.95-1.01x), so a smaller file would sit at the edge of the 20%.
    _prepare(tmp_path, store, "big", fc_chain(0, 1, 4096, 4096), profile=False)
    manifest = load_manifest(store / "big")
    stage = manifest.stages[0]
    size_bytes = sum((store / "big" / name).stat().st_size
                     for name in (stage.file, stage.data_file))
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [big]\ninput: random\n"
                        "arrivals: {kind: periodic, interval_ms: 1, count: 1}\n")
    device = load_device(_device(tmp_path, "name: slow-card\nmemory: 1GiB\n"
                                           "storage: {read: 20MB/s}\ncores: 1\n"))
    run = run_emulated(check_emulation(device, store), _spec(workload, store, "masa"))
    assert run.status == "finished", run.reason
    assert run.evicted_bytes >= size_bytes
    (network,) = run.report["jobs"][0]["networks"]  # one job, one stage: its LOAD time
    expected_s = size_bytes / 20e6
    assert 0.8 <= network["load_us"] / 1e6 / expected_s <= 1.2
    assert run.bytes_read >= 0.9 * size_bytes  # from storage, not the page cache
    assert _groups_left(os.getpid()) == []


def _job_mix_seed(workload_text: str, path: Path) -> int:
    """A seed whose first jobs run `small` and a later one `big` (composition one)."""
    for seed in range(200):
        path.write_text(workload_text.format(seed=seed))
        jobs = list(generate_jobs(load_workload(path)))
        if [j.networks for j in jobs] == [("small",), ("small",), ("big",)]:
            return seed
    raise AssertionError("no seed gives small, small, big")


@needs_cgroups
@pytest.mark.slow
def test_bulk_is_killed_with_the_jobs_before_and_masa_finishes_under_the_same_cap(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    # Copied weights (anonymous memory, which the cap cannot reclaim): `big` holds
    # 8 x 8 MiB when loaded whole, as Bulk does; Masa loads a few stages at a time.
    _prepare(tmp_path, store, "big", fc_chain(1, 8, 1448, 1448), load_mode="copy",
             profile_runs=1)
    _prepare(tmp_path, store, "small", fc_chain(2, 2, 256, 256), load_mode="copy",
             profile_runs=1)
    workload = tmp_path / "w.yaml"
    seed = _job_mix_seed("graph: [small, big]\ninput: random\ncomposition: one\n"
                         "arrivals: {{kind: periodic, interval_ms: 300, count: 3, "
                         "seed: {seed}}}\n", workload)
    assert seed >= 0
    # Cap: the runtime's base (about 35 MiB here) + 48 MiB; Bulk needs 64 MiB + base.
    device = load_device(_device(tmp_path, "name: tiny\nmemory: 84MiB\nstorage: null\n"
                                           "cold_cache: false\ncores: 2\n"))
    plan = check_emulation(device, store)
    bulk = run_emulated(plan, _spec(workload, store, "bulk"))
    assert bulk.status == "killed" and bulk.oom_kills >= 1, bulk.as_dict()
    assert "out of memory" in (bulk.reason or "")
    assert [job for job, _ in bulk.jobs_finished] == [0, 1]  # the two small jobs
    assert bulk.run_time_s is not None and bulk.run_time_s > 0
    masa = run_emulated(plan, _spec(workload, store, "masa"))
    assert masa.status == "finished", masa.as_dict()
    assert masa.oom_kills == 0
    assert {n["status"] for job in masa.report["jobs"] for n in job["networks"]} == {"done"}
    assert masa.peak_cgroup_bytes <= device.memory_cap_bytes
    # the child's threads, by the names the executor gives them, sampled while it ran
    assert "masa-worker" in masa.thread_cpu_s, masa.thread_cpu_s
    assert sum(run_s for run_s, _ in masa.thread_cpu_s.values()) > 0
    assert _groups_left(os.getpid()) == []


@needs_cgroups
def test_ctrl_c_kills_the_run_and_leaves_no_cgroup(tmp_path: Path) -> None:
    store = tmp_path / "store"
    _prepare(tmp_path, store, "big", fc_chain(0, 1, 1024, 2048), profile=False)
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [big]\ninput: random\n"
                        "arrivals: {kind: periodic, interval_ms: 1, count: 1}\n")
    # 8 MiB at 200 kB/s: the LOAD takes about 40 s, Ctrl-C comes long before.
    device = _device(tmp_path, "name: stuck\nmemory: 1GiB\nstorage: {read: 200kB/s}\n")
    parent = Command(["-vv", "run", str(workload), "--store", str(store), "--device",
                      str(device)], tmp_path / "err.txt", tmp_path)
    try:
        parent.wait_for_line("emulated run: child")  # in its cgroups, loading
        assert _groups_left(parent.process.pid)
        child = _children(parent.process.pid)
        assert child, "the emulated run did not start"
        parent.send_signal(signal.SIGINT)
        code = parent.wait()
    finally:
        if parent.process.poll() is None:
            parent.process.kill()
    assert code == 130, "".join(parent.lines)
    assert not Path(f"/proc/{child[0]}").exists() or _zombie(child[0])
    assert _groups_left(parent.process.pid) == []


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(p) for p in path.read_text().split()]
    except OSError:
        return []


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_a_failed_child_reports_its_one_line_error(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run = EmulatedRun(device={}, status="failed")
    progress = tmp_path / "progress"
    progress.write_text("begin 10.0 100 50 7\njob 0 1500\nerror 2 bad: input here\n")
    run.run_time_s = 12.5
    emulation._read_progress(progress, run)
    assert run.error_code == 2 and run.reason == "bad: input here"
    assert run.jobs_finished == [(0, 1500)] and run.run_time_s == 2.5
    assert (run.memory_budget_bytes, run.runtime_base_bytes, run.evicted_bytes) == (100, 50, 7)


@pytest.mark.parametrize("status", ["finished", "killed"])
def test_a_finished_run_ends_at_its_end_line_not_at_the_childs_exit(
        tmp_path: Path, status: str) -> None:
    """The child writes `end` before serialising its report and trace: a finished
    run's time and cgroup peak are taken there. A killed run has no end line; its
    time runs to the kill."""
    run = EmulatedRun(device={}, status=status)
    progress = tmp_path / "progress"
    progress.write_text("begin 10.0 100 50 7\njob 0 1500\n"
                        + ("end 14.0 4096\n" if status == "finished" else ""))
    run.run_time_s, run.peak_cgroup_bytes = 16.5, 8192  # the child's exit, the file's peak
    emulation._read_progress(progress, run)
    if status == "finished":
        assert (run.run_time_s, run.peak_cgroup_bytes) == (4.0, 4096)
    else:
        assert (run.run_time_s, run.peak_cgroup_bytes) == (6.5, 8192)


@needs_cgroups
def test_an_emulated_run_writes_its_trace(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`masa run --device --trace`: the child writes the Chrome trace, one complete
    event per task of the run."""
    import json

    store = tmp_path / "store"
    _prepare(tmp_path, store, "chain", fc_chain(3, 3, 256, 256), profile=False)
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [chain]\ninput: random\n"
                        "arrivals: {kind: periodic, interval_ms: 10, count: 2}\n")
    device = _device(tmp_path, "name: roomy\nmemory: 1GiB\nstorage: null\n"
                               "cold_cache: false\ncores: 2\n")
    trace_path, report_path = tmp_path / "t.json", tmp_path / "r.json"
    code = masa_main(["run", str(workload), "--store", str(store), "--device", str(device),
                      "--trace", str(trace_path), "--report", str(report_path)])
    assert code == 0, capsys.readouterr()
    assert json.loads(report_path.read_text())["status"] == "finished"
    spans = [e for e in json.loads(trace_path.read_text())["traceEvents"] if e["ph"] == "X"]
    # Two jobs, a LOAD and an EXEC per stage.
    assert len(spans) == 2 * 2 * len(load_manifest(store / "chain").stages)
    assert _groups_left(os.getpid()) == []


def test_the_runtime_base_holds_the_scheduler_entries_of_the_runs_tasks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A run keeps its scheduler's entries for every task of the batch in its measured
    baseline, so the device's base, which the default budget is the cap less, must
    hold them too (or a long batch's bookkeeping goes over the cap)."""
    from masa.cli import emulation_child
    from masa.sched.taskgraph import Lock, Task, TaskGraph, TaskKind

    monkeypatch.setattr(emulation_child, "find_memory_cgroup", lambda: None)  # own RSS
    jobs = 10_000
    tasks = tuple(Task(f"j{job}/n/s0/{kind.value}", kind, 10, 1, release_us=job, job_id=job,
                       group=f"j{job}/n", network="n", stage_id="s0")
                  for job in range(jobs) for kind in (TaskKind.LOAD, TaskKind.EXEC))
    graph = TaskGraph(tasks, precedence=tuple(
        (f"j{job}/n/s0/load", f"j{job}/n/s0/exec") for job in range(jobs)), locks=tuple(
        Lock(f"j{job}/n/s0/weights", f"j{job}/n/s0/load", (f"j{job}/n/s0/exec",), 1)
        for job in range(jobs)))
    empty_base = emulation_child.runtime_base_bytes(TaskGraph(()), "masa")
    batch_base = emulation_child.runtime_base_bytes(graph, "masa")
    # At least 200 bytes a task (about 650 measured): the entries were counted.
    assert batch_base - empty_base >= 200 * len(tasks)
