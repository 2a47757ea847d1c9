"""Run reports: the report dict (report.json), the Chrome trace, and the text table.

This module owns the output formats shared by the real executor and the
simulator (schema in docs/report-format.md). Everything is computed from the
task graph and the schedule (`ScheduledTask` records), plus what only an
executor knows: job arrival times, network statuses decided by context-aware
execution, measured-memory samples and recorded over-commits. Building is
pure; `write_json` writes atomically.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from masa.common.atomic import atomic_write_text
from masa.common.units import format_bytes
from masa.sched.checker import memory_profile
from masa.sched.core import OverCommit
from masa.sched.taskgraph import ScheduledTask, TaskGraph, TaskKind

if TYPE_CHECKING:  # only the type: importing the runner would load ONNX Runtime
    from masa.runtime.runner import RunOutcome

REPORT_FORMAT = 1
# "interrupted": a SIGINT/SIGTERM stopped the run before the network finished
# (the report is then partial: `partial` true, `interrupted_by` the signal).
NETWORK_STATUSES = ("done", "failed", "skipped", "aborted", "interrupted")
# What a real run measured, next to the ledger's peak_reserved_bytes in the summary
# (null in a simulation); peak_measured_bytes comes first.
MEASURED_KEYS = ("peak_measured_source", "peak_anonymous_bytes", "peak_file_backed_bytes",
                 "peak_stage_file_bytes", "peak_rss_above_baseline_bytes", "baseline_rss_bytes",
                 "baseline_anonymous_bytes", "baseline_file_backed_bytes", "cgroup",
                 "stage_file_bytes_loaded", "stage_file_bytes_cached_at_load")


def _stats_us(values: Sequence[int]) -> dict[str, float | None]:
    """mean / p50 / p95 / max of durations in microseconds (None when empty)."""
    if not values:
        return {"mean": None, "p50": None, "p95": None, "max": None}
    array = np.asarray(values, dtype=np.float64)
    return {
        "mean": round(float(array.mean()), 1),
        "p50": round(float(np.percentile(array, 50)), 1),
        "p95": round(float(np.percentile(array, 95)), 1),
        "max": round(float(array.max()), 1),
    }


def _network_status(entries: list[ScheduledTask], task_count: int) -> str:
    """done / failed / skipped / aborted, from how the group's tasks ended."""
    if any(entry.status == "failed" for entry in entries):
        return "failed"
    ran = [entry for entry in entries if entry.worker >= 0]
    complete = len(entries) == task_count and all(e.status == "done" for e in entries)
    if complete:
        return "done"
    return "aborted" if ran else "skipped"


@dataclass
class _GraphIndex:
    """What the report needs to know about the graph, by network instance (group)."""

    tasks_by_group: dict[str, list[str]]
    job_of_group: dict[str, int]
    network_of_group: dict[str, str]
    arrivals_us: dict[int, int]
    loaded_bytes_of: dict[str, int]  # LOAD task -> bytes its locks keep loaded


def _index_graph(graph: TaskGraph, job_arrivals_us: Mapping[int, int] | None) -> _GraphIndex:
    index = _GraphIndex({}, {}, {}, {}, {})
    for task in graph.tasks:
        index.tasks_by_group.setdefault(task.group, []).append(task.task_id)
        index.job_of_group[task.group] = task.job_id
        index.network_of_group[task.group] = task.network or task.group
        index.arrivals_us[task.job_id] = min(
            index.arrivals_us.get(task.job_id, task.release_us), task.release_us)
    index.arrivals_us.update(job_arrivals_us or {})
    for lock in graph.locks:
        if graph.by_id[lock.from_task].kind is TaskKind.LOAD:
            index.loaded_bytes_of[lock.from_task] = (
                index.loaded_bytes_of.get(lock.from_task, 0) + lock.memory_bytes)
    return index


def _network_record(graph: TaskGraph, index: _GraphIndex, group: str,
                    entries: list[ScheduledTask], arrival_us: int, status: str) -> dict[str, Any]:
    ran = [e for e in entries if e.worker >= 0]
    load_us = sum(e.end_us - e.start_us for e in ran
                  if graph.by_id[e.task_id].kind is TaskKind.LOAD)
    exec_us = sum(e.end_us - e.start_us for e in ran
                  if graph.by_id[e.task_id].kind is not TaskKind.LOAD)
    finish_us = max((e.end_us for e in entries), default=None)
    return {
        "network": index.network_of_group[group],
        "group": group,
        "status": status,
        "start_us": min((e.start_us for e in ran), default=None),
        "finish_us": finish_us,
        "response_us": None if finish_us is None else finish_us - arrival_us,
        "load_us": load_us,
        "exec_us": exec_us,
        "loaded_bytes": sum(index.loaded_bytes_of.get(e.task_id, 0) for e in ran),
        "wasted_us": load_us + exec_us if status == "aborted" else 0,
    }


def _job_records(graph: TaskGraph, schedule: Sequence[ScheduledTask], index: _GraphIndex,
                 network_status: Mapping[str, str] | None,
                 network_reason: Mapping[str, str] | None) -> dict[int, dict[str, Any]]:
    entries_by_group: dict[str, list[ScheduledTask]] = {}
    for entry in schedule:
        task = graph.by_id.get(entry.task_id)
        if task is not None:
            entries_by_group.setdefault(task.group, []).append(entry)
    jobs = {job_id: {"job_id": job_id, "arrival_us": index.arrivals_us[job_id],
                     "finish_us": None, "response_us": None, "status": "done", "networks": []}
            for job_id in sorted(index.arrivals_us)}
    for group in sorted(index.tasks_by_group, key=lambda g: (index.job_of_group[g], g)):
        entries = entries_by_group.get(group, [])
        job = jobs[index.job_of_group[group]]
        status = _network_status(entries, len(index.tasks_by_group[group]))
        # Overrides outside the report's vocabulary (the core's "cancelled",
        # "active") keep the status derived from the schedule.
        if network_status and network_status.get(group) in NETWORK_STATUSES:
            status = network_status[group]
        record = _network_record(graph, index, group, entries, job["arrival_us"], status)
        if network_reason and group in network_reason:
            record["reason"] = network_reason[group]
        job["networks"].append(record)
        if record["finish_us"] is not None:
            job["finish_us"] = max(job["finish_us"] or record["finish_us"], record["finish_us"])
        if status == "failed":
            job["status"] = "failed"
        elif status == "interrupted" and job["status"] != "failed":
            job["status"] = "interrupted"
    for job in jobs.values():
        if job["finish_us"] is not None and job["status"] != "interrupted":
            job["response_us"] = job["finish_us"] - job["arrival_us"]
    return jobs


def _per_network(jobs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    per_network: dict[str, dict[str, Any]] = {}
    for job in jobs:
        for network in job["networks"]:
            summary = per_network.setdefault(
                network["network"], {"count": 0, **dict.fromkeys(NETWORK_STATUSES, 0),
                                     "_responses": [], "wasted_us": 0})
            summary["count"] += 1
            summary[network["status"]] = summary.get(network["status"], 0) + 1
            summary["wasted_us"] += network["wasted_us"]
            if network["status"] == "done" and network["response_us"] is not None:
                summary["_responses"].append(network["response_us"])
    for summary in per_network.values():
        summary["response_us"] = _stats_us(summary.pop("_responses"))
    return per_network


def _measured_summary(samples: Sequence[tuple[int, int]],
                      measured: Mapping[str, Any] | None) -> dict[str, Any]:
    """The summary's measured-memory keys: the executor's figures where given, else the
    peak of the samples (bytes above the run's baseline)."""
    figures = dict(measured or {})
    sampled_peak = max((b for _, b in samples), default=None)
    peak = figures.get("peak_measured_bytes")
    if peak is None:
        peak = sampled_peak
        figures.setdefault("peak_measured_source", None if peak is None else "samples")
    elif sampled_peak is not None:
        peak = max(peak, sampled_peak)
    return {"peak_measured_bytes": peak, **{key: figures.get(key) for key in MEASURED_KEYS}}


def _load_overlap_us(graph: TaskGraph, ran: Sequence[ScheduledTask]) -> tuple[int, int]:
    """LOAD time, and the part of it during which an EXEC ran on another worker:
    storage I/O and session setup hidden behind computation (the read-ahead Masa's
    LOADs of later stages give while earlier stages execute)."""
    loads, execs = [], []
    for entry in ran:
        kind = graph.by_id[entry.task_id].kind
        (loads if kind is TaskKind.LOAD else execs if kind is TaskKind.EXEC else []).append(
            (entry.start_us, entry.end_us))
    merged: list[list[int]] = []  # the union of EXEC intervals, sorted
    for start_us, end_us in sorted(execs):
        if merged and start_us <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end_us)
        else:
            merged.append([start_us, end_us])
    starts = [start_us for start_us, _ in merged]
    load_us = overlapped_us = 0
    for start_us, end_us in loads:
        load_us += end_us - start_us
        at = max(0, bisect.bisect_right(starts, start_us) - 1)
        while at < len(merged) and merged[at][0] < end_us:
            overlapped_us += max(0, min(end_us, merged[at][1]) - max(start_us, merged[at][0]))
            at += 1
    return load_us, overlapped_us


def _work_summary(graph: TaskGraph, ran: Sequence[ScheduledTask], workers: int,
                  span_us: int) -> dict[str, Any]:
    """The summary's busy time, LOAD time (and its part beside an EXEC), utilisation."""
    busy_us = sum(e.end_us - e.start_us for e in ran)
    load_us, load_overlapped_us = _load_overlap_us(graph, ran)
    return {
        "busy_us": busy_us,
        "load_us": load_us,
        "load_overlapped_us": load_overlapped_us,
        "worker_utilisation": round(busy_us / (workers * span_us), 4) if span_us else 0.0,
    }


def build_report(
    graph: TaskGraph,
    schedule: Sequence[ScheduledTask],
    *,
    workers: int,
    memory_budget_bytes: int,
    policy: str = "",
    job_arrivals_us: Mapping[int, int] | None = None,
    network_status: Mapping[str, str] | None = None,
    network_reason: Mapping[str, str] | None = None,
    measured_memory: Sequence[tuple[int, int]] = (),
    reserved_timeline: Sequence[tuple[int, int]] | None = None,
    over_commits: Iterable[OverCommit] = (),
    meta: Mapping[str, Any] | None = None,
    measured: Mapping[str, Any] | None = None,
    interrupted: str | None = None,
) -> dict[str, Any]:
    """The report dict of one run (see docs/report-format.md).

    job_arrivals_us: job id -> arrival; default: the earliest release of its tasks.
    network_status: group -> done/failed/skipped/aborted, overriding the status
      derived from the schedule (context-aware execution knows skipped vs aborted);
      other values (the core's "cancelled") are ignored.
    measured_memory: (time_us, bytes) samples of measured memory above the run's
      baseline (RSS).
    measured: a real run's measured figures under the summary's names
      (RealRunResult.measured_memory(): the exact peak, the anonymous / file-backed
      peaks, the baseline, the cgroup's figures); absent keys are null.
    reserved_timeline: the ledger's (time_us, reserved_bytes); default: computed
      from the schedule with masa.sched.checker.memory_profile.
    interrupted: the signal that stopped the run; the report is then partial.
    """
    index = _index_graph(graph, job_arrivals_us)
    jobs = _job_records(graph, schedule, index, network_status, network_reason)
    per_network = _per_network(jobs.values())
    ran_all = [e for e in schedule if e.worker >= 0 and e.task_id in graph.by_id]
    first_arrival_us = min(index.arrivals_us.values(), default=0)
    last_end_us = max((e.end_us for e in ran_all), default=first_arrival_us)
    span_us = max(0, last_end_us - first_arrival_us)
    timeline = list(reserved_timeline) if reserved_timeline is not None else \
        memory_profile(graph, schedule)
    peak_reserved_bytes = max((b for _, b in timeline), default=0)
    job_responses = [j["response_us"] for j in jobs.values()
                     if j["status"] == "done" and j["response_us"] is not None]
    over_commit_list = [
        {"task_id": o.task_id, "time_us": o.time_us, "footprint_bytes": o.footprint_bytes,
         "reserved_bytes": o.reserved_bytes, "reason": o.reason}
        for o in over_commits
    ]
    return {
        "format": REPORT_FORMAT,
        "policy": policy,
        "workers": workers,
        "memory_budget_bytes": memory_budget_bytes,
        "meta": dict(meta or {}),
        "partial": interrupted is not None, "interrupted_by": interrupted,
        "summary": {
            "jobs": len(jobs),
            "jobs_failed": sum(1 for j in jobs.values() if j["status"] == "failed"),
            "jobs_interrupted": sum(1 for j in jobs.values() if j["status"] == "interrupted"),
            "response_us": _stats_us(job_responses),
            "makespan_us": span_us,
            "first_arrival_us": first_arrival_us,
            "last_end_us": last_end_us,
            "peak_reserved_bytes": peak_reserved_bytes,
            **_measured_summary(measured_memory, measured),
            "over_budget": peak_reserved_bytes > memory_budget_bytes,
            "over_commits": len(over_commit_list),
            # Over the budget while other tasks ran, by a memory-aware policy: a bug.
            "progress_rule_violations": sum(1 for o in over_commit_list
                                            if o["reason"] == "violation"),
            **_work_summary(graph, ran_all, workers, span_us),
            "wasted_us": sum(s["wasted_us"] for s in per_network.values()),
        },
        "networks": per_network,
        "jobs": list(jobs.values()),
        "over_commits": over_commit_list,
    }


def chrome_trace(
    graph: TaskGraph,
    schedule: Sequence[ScheduledTask],
    *,
    workers: int,
    memory_budget_bytes: int | None = None,
    measured_memory: Sequence[tuple[int, int]] = (),
    reserved_timeline: Sequence[tuple[int, int]] | None = None,
    over_commits: Iterable[OverCommit] = (),
    job_arrivals_us: Mapping[int, int] | None = None,
) -> dict[str, Any]:
    """A Chrome trace (JSON object format; opens in Perfetto and chrome://tracing).

    One thread lane per worker with a slice per LOAD/EXEC task, counter tracks
    for reserved (and measured) memory in MiB, instant events for job arrivals
    and over-commits. Timestamps are microseconds.
    """
    pid = 1
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "masa"}},
    ]
    for worker in range(workers):
        events.append({"ph": "M", "pid": pid, "tid": worker, "name": "thread_name",
                       "args": {"name": f"worker {worker}"}})
        events.append({"ph": "M", "pid": pid, "tid": worker, "name": "thread_sort_index",
                       "args": {"sort_index": worker}})
    for entry in sorted(schedule, key=lambda e: (e.start_us, e.worker, e.task_id)):
        task = graph.by_id.get(entry.task_id)
        if task is None or entry.worker < 0:
            continue
        label = f"{task.kind.value.upper()} {task.network or task.group}"
        if task.stage_id:
            label += f"/{task.stage_id}"
        events.append({
            "ph": "X", "pid": pid, "tid": entry.worker, "name": label,
            "cat": task.kind.value, "ts": entry.start_us, "dur": entry.end_us - entry.start_us,
            "args": {"task_id": task.task_id, "group": task.group, "status": entry.status,
                     "memory_bytes": task.memory_bytes, "layer_type": task.layer_type},
        })
    timeline = list(reserved_timeline) if reserved_timeline is not None else \
        memory_profile(graph, schedule)
    mib = float(2**20)
    for time_us, reserved_bytes in timeline:
        counter_args: dict[str, float] = {"reserved": round(reserved_bytes / mib, 3)}
        if memory_budget_bytes is not None:
            counter_args["budget"] = round(memory_budget_bytes / mib, 3)
        events.append({"ph": "C", "pid": pid, "name": "memory (MiB)", "ts": time_us,
                       "args": counter_args})
    for time_us, measured_bytes in measured_memory:
        events.append({"ph": "C", "pid": pid, "name": "measured memory (MiB)", "ts": time_us,
                       "args": {"measured": round(measured_bytes / mib, 3)}})
    arrivals: dict[int, int] = {}
    for task in graph.tasks:
        arrivals[task.job_id] = min(arrivals.get(task.job_id, task.release_us), task.release_us)
    if job_arrivals_us:
        arrivals.update(job_arrivals_us)
    for job_id, time_us in sorted(arrivals.items()):
        events.append({"ph": "i", "s": "p", "pid": pid, "tid": 0, "ts": time_us,
                       "name": f"arrival j{job_id}"})
    for over_commit in over_commits:
        events.append({"ph": "i", "s": "p", "pid": pid, "tid": 0,
                       "ts": max(0, over_commit.time_us),
                       "name": f"over-commit {over_commit.task_id}",
                       "args": {"reserved_bytes": over_commit.reserved_bytes,
                                "reason": over_commit.reason}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_json(path: str | Path, data: Mapping[str, Any]) -> None:
    """Write a report or trace atomically."""
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=False) + "\n")


def _share(part: float | None, whole: float | None) -> str:
    return "-" if part is None or not whole else f"{100 * part / whole:.0f}%"


def _ms(value_us: float | None) -> str:
    return "-" if value_us is None else f"{value_us / 1000:.1f}"


def format_table(report: Mapping[str, Any]) -> str:
    """The text table `masa run` prints: per network and overall response times."""
    header = (f"{'network':<16} {'runs':>5} {'done':>5} {'fail':>5} {'skip':>5} {'abort':>5} "
              f"{'mean ms':>9} {'p50 ms':>9} {'p95 ms':>9}")
    lines = [header, "-" * len(header)]
    for name, summary in sorted(report["networks"].items()):
        stats = summary["response_us"]
        lines.append(
            f"{name:<16} {summary['count']:>5} {summary['done']:>5} {summary['failed']:>5} "
            f"{summary['skipped']:>5} {summary['aborted']:>5} {_ms(stats['mean']):>9} "
            f"{_ms(stats['p50']):>9} {_ms(stats['p95']):>9}")
    overall = report["summary"]
    stats = overall["response_us"]
    lines.append("-" * len(header))
    lines.append(
        f"{'all jobs':<16} {overall['jobs']:>5} {overall['jobs'] - overall['jobs_failed']:>5} "
        f"{overall['jobs_failed']:>5} {'':>5} {'':>5} {_ms(stats['mean']):>9} "
        f"{_ms(stats['p50']):>9} {_ms(stats['p95']):>9}")
    lines.append(
        f"policy {report['policy'] or '-'}, {report['workers']} workers: "
        f"makespan {overall['makespan_us'] / 1e6:.3f} s, "
        f"peak reserved {format_bytes(overall['peak_reserved_bytes'])} "
        f"(budget {format_bytes(report['memory_budget_bytes'])}"
        f"{', OVER BUDGET' if overall['over_budget'] else ''}), "
        f"peak measured {format_measured(overall)}, "
        f"utilisation {100 * overall['worker_utilisation']:.0f}%, "
        f"LOAD time beside an EXEC "
        f"{_share(overall.get('load_overlapped_us'), overall.get('load_us'))}, "
        f"over-commits {overall['over_commits']}")
    loop_cpu_us = (report.get("meta") or {}).get("loop_cpu_us")
    if loop_cpu_us and overall["makespan_us"]:
        lines.append(f"the executor's loop: {loop_cpu_us / 1e6:.2f} s of CPU, "
                     f"{loop_cpu_us / overall['makespan_us']:.0%} of a core over the makespan")
    cgroup = overall.get("cgroup")
    if cgroup:
        lines.append(format_cgroup(cgroup))
    if overall.get("stage_file_bytes_loaded"):
        lines.append(format_found_cached(overall["stage_file_bytes_loaded"],
                                         overall.get("stage_file_bytes_cached_at_load")))
    if report.get("partial"):
        lines.append(f"PARTIAL: interrupted by {report.get('interrupted_by')}; "
                     f"{overall.get('jobs_interrupted', 0)} of {overall['jobs']} jobs did not "
                     "finish (status interrupted)")
    return "\n".join(lines)


def _size(memory_bytes: float | None) -> str:
    return "-" if memory_bytes is None else format_bytes(memory_bytes)


def format_measured(summary: Mapping[str, Any]) -> str:
    """'41.2 MiB (anon 30.1 MiB, file 11.1 MiB)', '-' when nothing was measured."""
    peak = summary.get("peak_measured_bytes")
    anonymous = summary.get("peak_anonymous_bytes")
    if anonymous is None:
        return _size(peak)
    return (f"{_size(peak)} (anon {_size(anonymous)}, "
            f"file {_size(summary.get('peak_file_backed_bytes'))})")


def format_found_cached(loaded_bytes: int, cached_bytes: int | None) -> str:
    """One line: the LOADs' stage files and how much of them was already in the page
    cache at their start (the rest came from storage)."""
    if cached_bytes is None:
        return f"stage files loaded {_size(loaded_bytes)} (page cache not readable here)"
    return (f"stage files loaded {_size(loaded_bytes)}, found in the page cache "
            f"{_size(cached_bytes)} ({_share(cached_bytes, loaded_bytes)})")


def format_cgroup(cgroup: Mapping[str, Any]) -> str:
    """One line of a summary's `cgroup` figures."""
    since = "since the run began" if cgroup["peak_since_begin"] else "since the cgroup began"
    limit = cgroup["limit_bytes"]
    return (f"memory cgroup v{cgroup['version']} {cgroup['path']}: "
            f"usage {_size(cgroup['usage_at_begin_bytes'])} at the start, "
            f"peak {_size(cgroup['peak_usage_bytes'])} ({since}), "
            f"limit {'none' if limit is None else _size(limit)}, "
            f"OOM kills {'-' if cgroup['oom_kills'] is None else cgroup['oom_kills']}")


def outcome_report(outcome: RunOutcome, meta: Mapping[str, object] | None = None) -> dict:
    """The report dict (masa.report.report) of a run."""
    settings = outcome.settings
    samples = [(t, rss) for t, _, rss in outcome.memory_timeline if rss is not None]
    # A real run's figures (RealRunResult.measured_memory()), where the runner carries
    # them; else at least its exact peak.
    measured = getattr(outcome, "measured_memory", None)
    if measured is None and outcome.peak_measured_bytes is not None:
        measured = {"peak_measured_bytes": outcome.peak_measured_bytes}
    return build_report(
        outcome.graph, outcome.schedule,
        workers=settings.workers, memory_budget_bytes=settings.memory_budget_bytes,
        policy=settings.policy,
        job_arrivals_us={job.job_id: job.arrival_us for job in outcome.jobs},
        network_status=outcome.network_status, network_reason=outcome.network_reason,
        measured_memory=samples, measured=measured,
        over_commits=outcome.over_commits,
        reserved_timeline=_kept_aware_timeline(outcome),
        interrupted=getattr(outcome, "interrupted", None),
        meta={"context": outcome.context, "simulated": outcome.simulated,
              "memory_source": settings.memory_source,
              "read_ahead_bytes": settings.read_ahead_bytes,
              "keep_cached_bytes": settings.keep_cached_bytes,
              "keep_loaded_bytes": settings.keep_loaded_bytes, "errors": outcome.errors,
              "policy_stats": getattr(outcome, "policy_stats", {}),
              "loop_cpu_us": getattr(outcome, "loop_cpu_us", None),
              "error_tracebacks": outcome.error_details,
              "process_memory_after_bytes": outcome.process_memory_after,
              # network -> sha256 of the manifest the run pinned (model_prep.store_lock)
              "network_versions": getattr(outcome, "network_versions", {}),
              **dict(meta or {})},
    )


def _kept_aware_timeline(outcome: RunOutcome) -> list[tuple[int, int]] | None:
    """The ledger's own timeline where stages were kept between jobs: the schedule
    alone (`memory_profile`) does not show what the kept stages hold. None: the
    schedule's, which is the ledger's at every instant, not only at decisions."""
    if not outcome.settings.keep_loaded_bytes:
        return None
    return [(time_us, reserved) for time_us, reserved, _ in outcome.memory_timeline]


def outcome_trace(outcome: RunOutcome) -> dict:
    """The Chrome trace (masa.report.report) of a run."""
    settings = outcome.settings
    return chrome_trace(
        outcome.graph, outcome.schedule, workers=settings.workers,
        memory_budget_bytes=settings.memory_budget_bytes,
        reserved_timeline=_kept_aware_timeline(outcome),
        measured_memory=[(t, rss) for t, _, rss in outcome.memory_timeline if rss is not None],
        over_commits=outcome.over_commits,
        job_arrivals_us={job.job_id: job.arrival_us for job in outcome.jobs},
    )


# ------------------------------------------------------------ emulated devices

RUN_STATUSES = ("finished", "killed", "failed")


def emulated_report(emulation: Mapping[str, Any], report: Mapping[str, Any] | None, *,
                    policy: str, workers: int, jobs: int,
                    meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The report of a run on an emulated device (masa.runtime.emulation.EmulatedRun.as_dict).

    A finished run's report gains `status` and `emulation`; a killed or failed
    run has no schedule, so its report has `status`, `emulation` and a summary
    whose response times are null: it never enters an average.
    """
    status = emulation["status"]
    if report is not None and status == "finished":
        return {**report, "status": status, "emulation": dict(emulation)}
    finished = len(emulation.get("jobs_finished", []))
    return {
        "format": REPORT_FORMAT,
        "status": status,
        "policy": policy,
        "workers": workers,
        "memory_budget_bytes": emulation.get("memory_budget_bytes"),
        "meta": dict(meta or {}),
        "summary": {
            "jobs": jobs,
            "jobs_finished_before_end": finished,
            "jobs_failed": jobs - finished,
            "ended_at_s": emulation.get("run_time_s"),
            "reason": emulation.get("reason"),
            "response_us": _stats_us([]),
            "makespan_us": None,
            "peak_reserved_bytes": None,
            "over_commits": 0,
            "progress_rule_violations": 0,
            "worker_utilisation": None,
        },
        "emulation": dict(emulation),
        "networks": {},
        "jobs": [],
        "over_commits": [],
    }


def format_emulation(report: Mapping[str, Any]) -> str:
    """Two lines on a run's emulated device: what it was, what the run did on it."""
    emulation = report["emulation"]
    device = emulation["device"]
    throttle = device["read_bytes_per_s"]
    cpus = f" (run on CPUs {device['cpus']})" if device.get("cpus") else ""  # what the run had
    head = (f"device {device['name']}: cap {_size(device['memory_cap_bytes'])}, "
            f"reads {'unthrottled' if not throttle else f'{throttle / 1e6:g} MB/s'}, "
            f"swap {_size(device['swap_bytes'])}, {device['cores']} cores{cpus}, "
            f"{'cold' if device['cold_cache'] else 'warm'} page cache; budget "
            f"{_size(emulation['memory_budget_bytes'])} (runtime base "
            f"{_size(emulation['runtime_base_bytes'])})")
    if emulation["status"] == "finished":
        ended = "finished"
    else:
        ended = (f"{emulation['status'].upper()} after {emulation['run_time_s']} s with "
                 f"{len(emulation['jobs_finished'])} jobs finished: {emulation['reason']}")
    # A simulation predicts what a real run's summary measures (format_table prints it).
    predicted = ("" if not emulation.get("stage_file_bytes_loaded") else "\n" + format_found_cached(
        emulation["stage_file_bytes_loaded"], emulation.get("stage_file_bytes_cached_at_load")))
    return (f"{head}\n{ended}; cgroup peak {_size(emulation['peak_cgroup_bytes'])} "
            f"(anon {_size(emulation['peak_anonymous_bytes'])}, page cache "
            f"{_size(emulation['peak_page_cache_bytes'])}, swap "
            f"{_size(emulation['peak_swap_bytes'])}), read "
            f"{_size(emulation['bytes_read'])} from storage, "
            f"{emulation['major_faults']} major faults, OOM kills {emulation['oom_kills']}"
            f"{predicted}")
