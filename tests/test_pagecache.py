"""Keeping stage files cached (`--keep-cached`, masa.runtime.pagecache): the rule
keeps the files unloaded first up to its size and drops the others, and the
executor's unload really drops their pages from the page cache, except pages a
stage of another job still maps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from masa.cli.main import main as masa_main
from masa.common.procmem import drop_cached, page_cache_bytes
from masa.runtime.pagecache import KeptFiles
from masa.runtime.threads import _Stages
from masa.sched.taskgraph import Task, TaskKind
from model_prep.manifest import NetworkManifest, load_manifest
from model_prep.split import split_model
from tests import models
from tests.test_zero_copy import _can_lock, _fc_model


def test_kept_files_keep_the_first_unloaded_and_drop_the_rest() -> None:
    kept = KeptFiles(keep_bytes=10)
    assert kept.unloaded("a", 4) is False and kept.unloaded("b", 4) is False
    assert kept.unloaded("c", 4) is True  # 12 > 10: the most recent goes
    assert kept.unloaded("a", 4) is False  # kept files stay kept, counted once
    assert kept.unloaded("d", 2) is False  # what still fits is kept
    assert kept.unloaded("c", 4) is True
    assert (kept.kept_bytes, kept.dropped_bytes) == (10, 8)
    assert KeptFiles(0).unloaded("a", 1) is True
    with pytest.raises(ValueError, match="keep_bytes"):
        KeptFiles(-1)


@pytest.fixture(scope="module")
def fc_manifest(tmp_path_factory: pytest.TempPathFactory) -> NetworkManifest:
    directory = tmp_path_factory.mktemp("fc-keep")
    source = models.save(_fc_model(np.random.default_rng(7)), directory, "fc")
    manifest = split_model(source, directory / "fc", "fc")
    return replace(manifest, stages=tuple(replace(s, prepack=False) for s in manifest.stages))


def _data_paths(manifest: NetworkManifest) -> list[str]:
    return [f"{manifest.stage_path(stage)}.data" for stage in manifest.stages]


def _loads(manifest: NetworkManifest, job: int) -> list[Task]:
    return [Task(f"j{job}/fc/{s.stage_id}/load", TaskKind.LOAD, 0, 0, group=f"j{job}/fc",
                 network="fc", stage_id=s.stage_id) for s in manifest.stages]


@pytest.mark.parametrize("keep", [False, True])
def test_an_unload_drops_what_is_not_kept(fc_manifest: NetworkManifest, keep: bool) -> None:
    first, second = _data_paths(fc_manifest)
    for path in (first, second):
        drop_cached(path)
    first_bytes = Path(first).stat().st_size
    stages = _Stages({"fc": fc_manifest}, intra_op_threads=1,
                     keep_cached_bytes=first_bytes if keep else None)
    loads = _loads(fc_manifest, 0)
    for task in loads:
        stages.run_task(task)
    for task in loads:  # stage 0 is unloaded first, so it is the one kept
        stages.release(task)
    assert page_cache_bytes(first) == first_bytes
    # Without the rule the kernel keeps both (no memory pressure here); with it the
    # second file, unloaded once the kept bytes were full, is dropped at its unload.
    assert page_cache_bytes(second) == (0 if keep else Path(second).stat().st_size)


def test_pages_another_job_maps_stay_cached(fc_manifest: NetworkManifest) -> None:
    _, second = _data_paths(fc_manifest)
    size = Path(second).stat().st_size
    if not _can_lock(2 * size):
        pytest.skip("RLIMIT_MEMLOCK below the weights and not root: mlock is refused here")
    stages = _Stages({"fc": fc_manifest}, intra_op_threads=1, keep_cached_bytes=0)
    mine, other = _loads(fc_manifest, 0)[1], _loads(fc_manifest, 1)[1]
    stages.run_task(mine)
    stages.run_task(other)
    stages.release(mine)  # dropped by the rule, but job 1's stage holds the pages
    assert page_cache_bytes(second) == size
    stages.release(other)
    assert page_cache_bytes(second) == 0


def test_a_load_counts_the_stage_files_it_finds_in_the_page_cache(
        fc_manifest: NetworkManifest) -> None:
    stage = fc_manifest.stages[0]
    files = fc_manifest.stage_files(stage)
    file_bytes = sum(path.stat().st_size for path in files)
    for path in files:
        drop_cached(path, write_back=True)
    if page_cache_bytes(files[0]) is None:
        pytest.skip("neither cachestat(2) nor mincore(2) here: the page cache is unreadable")
    stages = _Stages({"fc": fc_manifest}, intra_op_threads=1)
    cold, warm = _loads(fc_manifest, 0)[0], _loads(fc_manifest, 1)[0]
    stages.run_task(cold)
    assert (stages.load_file_bytes, stages.load_cached_bytes) == (file_bytes, 0)
    stages.release(cold)  # no memory pressure: the kernel keeps the pages
    stages.run_task(warm)
    assert (stages.load_file_bytes, stages.load_cached_bytes) == (2 * file_bytes, file_bytes)
    stages.release(warm)


def test_the_executor_tells_masa_which_stages_are_cached(fc_manifest: NetworkManifest) -> None:
    """`cached_stage_keys` (what masa's cached-stages-first rule is told): a stage
    counts once its files are in the page cache, and not once they are dropped."""
    first, second = fc_manifest.stages
    for stage in (first, second):
        for path in fc_manifest.stage_files(stage):
            drop_cached(path, write_back=True)
    if page_cache_bytes(fc_manifest.stage_files(first)[0]) is None:
        pytest.skip("neither cachestat(2) nor mincore(2) here: the page cache is unreadable")
    stages = _Stages({"fc": fc_manifest}, intra_op_threads=1)
    assert stages.cached_stage_keys() == set()
    for path in fc_manifest.stage_files(second):
        path.read_bytes()
    assert stages.cached_stage_keys() == {("fc", second.stage_id)}
    for path in fc_manifest.stage_files(second):
        drop_cached(path)
    assert stages.cached_stage_keys() == set()


def _fc_store(tmp_path: Path) -> tuple[Path, Path]:
    """A store holding the fc network (mmap stages, not profiled) and a two-job workload."""
    store = tmp_path / "store"
    store.mkdir()
    source = models.save(_fc_model(np.random.default_rng(7)), tmp_path, "fc")
    assert masa_main(["prepare", str(source), "--store", str(store), "--name", "fc",
                      "--no-profile"]) == 0
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [fc]\narrivals: {kind: periodic, interval_ms: 5, count: 2}\n")
    return store, workload


def test_masa_run_keep_cached_reaches_the_executor_and_the_report(tmp_path: Path) -> None:
    store, workload = _fc_store(tmp_path)
    report_path = tmp_path / "r.json"
    assert masa_main(["run", str(workload), "--store", str(store), "--memory", "256MiB",
                      "--keep-cached", "0", "--report", str(report_path)]) == 0
    report = json.loads(report_path.read_text())
    assert report["meta"]["keep_cached_bytes"] == 0
    assert all(n["status"] == "done" for j in report["jobs"] for n in j["networks"])
    data_files = sorted((store / "fc").rglob("*.data"))
    assert data_files and all(page_cache_bytes(path) == 0 for path in data_files)
    with pytest.raises(SystemExit) as bad_size:  # argparse: one line, exit 2
        masa_main(["run", str(workload), "--store", str(store), "--keep-cached=-1MiB"])
    assert bad_size.value.code == 2


def test_a_real_run_reports_the_stage_files_its_loads_found_cached(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, workload = _fc_store(tmp_path)
    manifest = load_manifest(store / "fc")
    file_bytes = sum(path.stat().st_size for stage in manifest.stages
                     for path in manifest.stage_files(stage))
    report_path = tmp_path / "r.json"
    # Every job loads its stages (no stage kept loaded between jobs, which would load
    # nothing the second time).
    assert masa_main(["run", str(workload), "--store", str(store), "--memory", "256MiB",
                      "--keep-loaded", "0", "--report", str(report_path)]) == 0
    summary = json.loads(report_path.read_text())["summary"]
    assert summary["stage_file_bytes_loaded"] == 2 * file_bytes  # two jobs, every stage
    cached = summary["stage_file_bytes_cached_at_load"]
    if cached is not None:  # the second job finds what the first loaded
        assert file_bytes <= cached <= 2 * file_bytes
        assert "found in the page cache" in capsys.readouterr().out


def test_a_simulation_says_it_does_not_model_keep_cached(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, workload = _fc_store(tmp_path)
    assert masa_main(["run", str(workload), "--store", str(store), "--simulate",
                      "--keep-cached", "1MiB"]) == 0
    assert "--keep-cached: a simulation does not model it" in caplog.text


def test_the_executor_probes_the_page_cache_only_when_a_task_can_start(
        fc_manifest: NetworkManifest) -> None:
    """The probe (every stage file's cachestat) runs only for a decision that can start
    a task: not with nothing waiting (an idle daemon), not with every worker busy."""
    from masa.runtime.registry import make_policy
    from masa.runtime.threads import RealRunConfig, ThreadBackend
    from masa.sched.core import add_tasks, finish, new_state, select
    from masa.sched.taskgraph import TaskGraph

    if page_cache_bytes(fc_manifest.stage_files(fc_manifest.stages[0])[0]) is None:
        pytest.skip("neither cachestat(2) nor mincore(2) here: the page cache is unreadable")
    now_s = [0.0]
    backend = ThreadBackend({"fc": fc_manifest}, lambda *args: {},
                            RealRunConfig(workers=1, memory_budget_bytes=2**30),
                            clock=lambda: now_s[0])
    state = new_state(1, 2**30, make_policy("masa"))
    backend.before_select(state)
    assert state.cached_stages is None  # nothing waits: no probe
    add_tasks(state, TaskGraph(tuple(_loads(fc_manifest, 0))))
    (started,) = select(state)  # the only worker is busy now, one LOAD waits
    now_s[0] = 1.0
    backend.before_select(state)
    assert state.cached_stages is None
    finish(state, started.task_id)  # the worker is free again
    backend.before_select(state)
    assert state.cached_stages is not None
