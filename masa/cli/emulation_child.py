"""The child process of an emulated run: `python -m masa.cli.emulation_child SPEC.json`.

masa.runtime.emulation starts it inside the device's cgroups. It owns the
order of one emulated run: prepare the run (the start-up checks: manifests,
stage files by size and modification time, each network's version pinned),
warm ONNX Runtime up and measure the runtime's own memory, the scheduler's
entries for the run's tasks included (the budget defaults to the device's cap
less that base), evict the store's files from the page
cache (a cold device), then execute, writing one progress line per ended job
so that a kill still tells the parent what finished, and one when the run
ends (its time and its cgroup's peak, before anything is written). The run's report
(masa.report.report, with the spec's `meta`) is written as JSON for the
parent: plain data, nothing the parent has to execute to read; with
`trace_path`, the run's Chrome trace too (a killed run writes none). A failure
before the run is written as an `error CODE MESSAGE` line (exit 2 for bad
input, 1 otherwise). With `measure_only` in the spec it
stops before the first job (a benchmark's way to measure the base).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from masa.common.atomic import atomic_write_text
from masa.common.errors import EXIT_FAILED, EXIT_USAGE, RunFailed, UserError, one_line
from masa.common.procmem import find_memory_cgroup, read_cgroup_memory, rss_bytes
from masa.report.report import outcome_report, outcome_trace, write_json
from masa.runtime.driver import Observer
from masa.runtime.emulation import evict_files
from masa.runtime.registry import make_policy
from masa.runtime.runner import PreparedRun, RunSettings, execute, prepare_run
from masa.sched.core import add_tasks, new_state
from masa.sched.taskgraph import TaskGraph
from model_prep.manifest import MANIFEST_NAME, NetworkManifest
from model_prep.session import release_memory, warm_up


class _JobProgress(Observer):
    """One flushed line per ended job: what the parent reports if the run is killed."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def job_ended(self, job_id: int, now_us: int) -> None:
        self.stream.write(f"job {job_id} {now_us}\n")
        self.stream.flush()


def network_files(manifests: Iterable[NetworkManifest]) -> list[Path]:
    """Every file of the networks: manifests, stage files and their data files."""
    files = []
    for manifest in manifests:
        files.append(manifest.directory / MANIFEST_NAME)
        for stage in manifest.stages:
            files.extend(manifest.stage_files(stage))
    return files


def runtime_base_bytes(graph: TaskGraph, policy: str) -> int:
    """The process's own memory before any job: its memory cgroup's usage (what the
    cap binds), or its resident size outside one; with the scheduler's entry for each
    of the run's tasks (about 650 bytes a task), which the run builds before its first
    job and keeps in its measured baseline (masa.runtime.threads): built here to be
    measured, then dropped (on return) for the run's own to take its place."""
    warm_up()
    state = new_state(1, 1, make_policy(policy))
    add_tasks(state, graph, arrived=False)
    release_memory()
    cgroup = find_memory_cgroup()
    return read_cgroup_memory(cgroup).usage_bytes if cgroup is not None else rss_bytes()


def _check_versions(prepared: PreparedRun, expected: dict[str, str]) -> None:
    pinned = prepared.network_versions
    changed = sorted(name for name, version in expected.items()
                     if pinned.get(name, version) != version)
    if changed:
        raise RunFailed(f"network(s) {', '.join(changed)} were prepared again since the "
                        "comparison began; its runs would mix versions: run it again")


def _run(spec: dict[str, Any], progress: IO[str]) -> None:
    for plugin in spec.get("plugins", []):
        from workloads.conditions import load_plugin

        load_plugin(plugin)
    prepared = prepare_run(spec["workload"], spec["store"], spec["context"],
                           job_limit=spec.get("job_limit"))
    _check_versions(prepared, spec.get("network_versions") or {})
    base_bytes = runtime_base_bytes(prepared.graph, spec["settings"]["policy"])
    settings = dict(spec["settings"])
    if settings.get("memory_budget_bytes") is None:
        settings["memory_budget_bytes"] = spec["memory_cap_bytes"] - base_bytes
        if settings["memory_budget_bytes"] <= 0:
            raise UserError(f"the device's memory cap ({spec['memory_cap_bytes']} bytes) "
                            f"leaves nothing beyond the runtime's base ({base_bytes} bytes)")
    if settings.get("keep_loaded_bytes", 0) is None:  # the default: keep within the budget
        settings["keep_loaded_bytes"] = settings["memory_budget_bytes"]
    evicted = evict_files(network_files(prepared.manifests.values())) \
        if spec.get("cold_cache") else 0
    progress.write(f"begin {time.monotonic()} {settings['memory_budget_bytes']} "
                   f"{base_bytes} {evicted}\n")
    progress.flush()
    if spec.get("measure_only"):  # the runtime's base for this workload, no jobs
        return
    outcome = execute(prepared, RunSettings(**settings), simulate=False,
                      observers=[_JobProgress(progress)])
    # The run's end and its cgroup's peak, before the report and the trace are
    # serialised: their time and memory are not the run's.
    cgroup = find_memory_cgroup()
    peak_bytes = read_cgroup_memory(cgroup).peak_bytes if cgroup is not None else None
    progress.write(f"end {time.monotonic()} {-1 if peak_bytes is None else peak_bytes}\n")
    progress.flush()
    report = outcome_report(outcome, spec.get("meta"))
    atomic_write_text(spec["report_path"], json.dumps(report))
    if spec.get("trace_path"):
        try:
            write_json(spec["trace_path"], outcome_trace(outcome))
        except OSError as error:
            raise RunFailed(f"--trace {spec['trace_path']}: {error}") from error


def main(argv: Sequence[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    logging.basicConfig(level=spec.get("log_level", logging.WARNING),
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    with open(spec["progress_path"], "a", buffering=1) as progress:
        try:
            _run(spec, progress)
        except RunFailed as error:
            progress.write(f"error {EXIT_FAILED} {one_line(error)}\n")
            return EXIT_FAILED
        except (UserError, ValueError) as error:
            progress.write(f"error {EXIT_USAGE} {one_line(error)}\n")
            return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
