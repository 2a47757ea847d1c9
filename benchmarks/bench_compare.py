"""Policy comparison: Masa vs Bulk vs DeepEye on the paper's five scenarios (issue 3, 6b).

Owns the `masa compare`-equivalent benchmark: for each scenario (small, mixed,
lifelogging, stochastic1, stochastic2) and memory budget (512 MiB, 1 GiB,
2 GiB), the same jobs run under each policy, simulated (many jobs) and for real
(few jobs: every job loads hundreds of MB of layers at scale 1), and the script
prints and writes (docs/bench-compare.md, PNG plots) the mean job response per
policy, Masa's gain over Bulk and DeepEye, and peak reserved / measured memory,
next to the paper's figures.

Load. The scenarios' default rates are placeholders, so arrivals are set from an
offered load rho: rho = arrival rate x expected job work / workers, where job
work is the sum of the profiled LOAD + EXEC durations of the job's networks
(what one worker alone would spend). rho = 1 saturates the workers if the
policy keeps both busy all the time. The paper's traffic intensity (rate x mean
network time) is reported next to it: intensity = rho x workers / networks per
job. Simulations also sweep rho, because "who wins" depends on it.

Run:  python benchmarks/bench_compare.py --store /work/zoo1
      python benchmarks/bench_compare.py --store /tmp/benchstore --simulate-only
The helpers (scenario_jobs, run_policies, machine_note, ...) are shared with
benchmarks/bench_context.py and benchmarks/bench_grid.py (issue 14's grid: job
order, slicing, p90/p99, 2 -> 4 workers, simulation only), whose section of
docs/bench-compare.md this script keeps when it rewrites the page.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from masa.common.atomic import atomic_write_bytes, atomic_write_text
from masa.common.units import parse_memory_bytes
from masa.report.report import outcome_report
from masa.runtime.runner import (
    PreparedRun,
    RunSettings,
    execute,
    load_manifests,
    prepare_run,
)
from masa.sched.jobs import JobSpec, network_time_us
from workloads.arrivals import US_PER_S, with_rate
from workloads.generation import generate_jobs, scenario_path
from workloads.loader import load_workload
from workloads.model import Workload

SCENARIOS = ("small", "mixed", "lifelogging", "stochastic1", "stochastic2")
POLICIES = ("masa", "bulk", "deepeye")
BUDGETS = ("512MiB", "1GiB", "2GiB")
# Real runs: few jobs, fewer for the scenarios whose jobs load >1 GB of layers.
REAL_JOBS = {"small": 8, "mixed": 4, "lifelogging": 4, "stochastic1": 8, "stochastic2": 4}
# The paper's reported gains of Masa (Cox et al. 2021/2022), as quoted in issue 3.
PAPER_GAIN = {
    "small": "<= -30% vs Bulk at 512 MiB",
    "mixed": "<= -30% vs Bulk at 512 MiB",
    "lifelogging": "<= -30% vs Bulk at 512 MiB",
    "stochastic1": "up to -90% at 512 MiB-1 GiB",
    "stochastic2": "(no figure quoted)",
}
MIB = 2**20


# ------------------------------------------------------------------ workloads


def networks_per_job(workload: Workload) -> float:
    """Expected number of networks in one job, from the workload's composition."""
    count = len(workload.networks)
    composition = workload.composition
    if composition.kind == "one":
        return 1.0
    if composition.kind == "subset":
        high = composition.max_size if composition.max_size is not None else count
        return (composition.min_size + high) / 2  # uniform size, uniform subset
    return float(count)


@dataclasses.dataclass(frozen=True)
class LoadInfo:
    """The arrival rate behind one run, in the three units people quote."""

    rho: float  # offered load: rate x expected job work / workers
    rate_per_s: float
    intensity: float  # the paper's: rate x mean network time (LOAD + EXEC)
    job_work_us: float  # expected profiled work of one job
    mean_network_us: float


def scenario_jobs(store: Path, scenario: str, rho: float, count: int, workers: int,
                  seed: int | None = None) -> tuple[Workload, list[JobSpec], LoadInfo]:
    """The scenario's first `count` jobs with arrivals set for offered load `rho`."""
    workload = load_workload(scenario_path(scenario), store_dir=store)
    manifests = load_manifests(store, workload.networks)
    mean_network_us = float(np.mean([network_time_us(manifests[name])
                                     for name in workload.networks]))
    job_work_us = mean_network_us * networks_per_job(workload)
    rate_per_s = rho * workers * US_PER_S / job_work_us
    arrivals = dataclasses.replace(with_rate(workload.arrivals, rate_per_s), count=count)
    if seed is not None:
        arrivals = dataclasses.replace(arrivals, seed=seed)
    workload = dataclasses.replace(workload, arrivals=arrivals)
    info = LoadInfo(rho=rho, rate_per_s=rate_per_s,
                    intensity=rate_per_s * mean_network_us / US_PER_S,
                    job_work_us=job_work_us, mean_network_us=mean_network_us)
    return workload, generate_jobs(workload), info


def warm_page_cache(store: Path, networks: Sequence[str]) -> int:
    """Read every stage file once so no policy pays a cold disk read the others don't."""
    total_bytes = 0
    for name in networks:
        for path in sorted((store / name / "stages").glob("*.onnx")):
            total_bytes += len(path.read_bytes())
    return total_bytes


# ---------------------------------------------------------------------- runs


def job_phases_us(report: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """Mean wait (arrival -> first task start) and mean span (first start -> finish).

    Separates queueing from interleaving: a FIFO policy makes jobs wait, then
    finishes each quickly; a policy that interleaves many jobs starts them at
    once and stretches each.
    """
    waits: list[int] = []
    spans: list[int] = []
    for job in report["jobs"]:
        starts = [n["start_us"] for n in job["networks"] if n["start_us"] is not None]
        if not starts or job["finish_us"] is None or job["status"] == "failed":
            continue
        waits.append(min(starts) - job["arrival_us"])
        spans.append(job["finish_us"] - min(starts))
    if not waits:
        return None, None
    return float(np.mean(waits)), float(np.mean(spans))


def summarise(report: Mapping[str, Any], wall_s: float, keep_groups: bool = False
              ) -> dict[str, Any]:
    """The figures this benchmark reports from one run's report dict.

    keep_groups: also keep, per network instance, [status, LOAD+EXEC us, loaded bytes].
    """
    summary = report["summary"]
    wait_us, span_us = job_phases_us(report)
    aborted_bytes = sum(n["loaded_bytes"] for job in report["jobs"] for n in job["networks"]
                        if n["status"] == "aborted")
    statuses: dict[str, int] = {}
    for job in report["jobs"]:
        for network in job["networks"]:
            statuses[network["status"]] = statuses.get(network["status"], 0) + 1
    groups = {n["group"]: [n["status"], n["load_us"] + n["exec_us"], n["loaded_bytes"]]
              for job in report["jobs"] for n in job["networks"]} if keep_groups else None
    return {
        "groups": groups,
        "jobs": summary["jobs"],
        "jobs_failed": summary["jobs_failed"],
        "mean_us": summary["response_us"]["mean"],
        "p50_us": summary["response_us"]["p50"],
        "p95_us": summary["response_us"]["p95"],
        "makespan_us": summary["makespan_us"],
        "busy_us": summary["busy_us"],
        "utilisation": summary["worker_utilisation"],
        "peak_reserved_bytes": summary["peak_reserved_bytes"],
        "peak_measured_bytes": summary["peak_measured_bytes"],
        "over_commits": summary["over_commits"],
        "wasted_us": summary["wasted_us"],
        "aborted_loaded_bytes": aborted_bytes,
        "network_status": statuses,
        "wait_us": wait_us,
        "span_us": span_us,
        "wall_s": round(wall_s, 2),
    }


def run_policies(prepared: PreparedRun, policies: Sequence[str], budget_bytes: int,
                 workers: int, simulate: bool, keep_groups: bool = False
                 ) -> dict[str, dict[str, Any]]:
    """One run per policy on the same prepared jobs: {policy: summarise(...)}."""
    results: dict[str, dict[str, Any]] = {}
    for policy in policies:
        start_s = time.perf_counter()
        outcome = execute(prepared, RunSettings(policy=policy, workers=workers,
                                                memory_budget_bytes=budget_bytes),
                          simulate=simulate)
        wall_s = time.perf_counter() - start_s
        results[policy] = summarise(outcome_report(outcome), wall_s, keep_groups)
        results[policy]["profiled_work_us"] = profiled_work_us(prepared)
        if not simulate:
            results[policy]["live_sessions_after"] = outcome.live_sessions_after
            results[policy]["final_reserved_bytes"] = outcome.final_reserved_bytes
            results[policy]["loadavg_after"] = round(os.getloadavg()[0], 2)
    return results


def profiled_work_us(prepared: PreparedRun) -> int:
    """The profiled LOAD + EXEC time of every network of every job (one worker alone)."""
    return sum(network_time_us(prepared.manifests[name])
               for job in prepared.jobs for name in job.networks)


def gain_pct(masa_us: float | None, other_us: float | None) -> float | None:
    """Masa's mean response relative to another policy's (negative: Masa faster)."""
    if masa_us is None or not other_us:
        return None
    return 100.0 * (masa_us / other_us - 1.0)


def concurrency_us(schedule: Sequence[Any]) -> dict[int, int]:
    """Time (us) during which exactly n tasks ran, for n = 0, 1, 2, ... (first to last end)."""
    events = sorted([(e.start_us, 1) for e in schedule if e.worker >= 0]
                    + [(e.end_us, -1) for e in schedule if e.worker >= 0])
    spans: dict[int, int] = {}
    running, last_us = 0, events[0][0] if events else 0
    for time_us, delta in events:
        spans[running] = spans.get(running, 0) + time_us - last_us
        running, last_us = running + delta, time_us
    return spans


def diagnose(store: Path, scenario: str, budget: str, rho: float, count: int, workers: int,
             policies: Sequence[str]) -> list[dict[str, Any]]:
    """Real vs simulated on the same jobs: how much slower LOAD and EXEC tasks ran than
    profiled, and for how long 0, 1 or 2 tasks ran at once (per policy)."""
    workload, jobs, info = scenario_jobs(store, scenario, rho, count, workers)
    prepared = prepare_run(scenario_path(scenario), store, "oblivious", jobs=jobs)
    warm_page_cache(store, workload.networks)
    rows = []
    for policy in policies:
        for simulated in (True, False):
            outcome = execute(prepared, RunSettings(policy=policy, workers=workers,
                                                    memory_budget_bytes=parse_memory_bytes(
                                                        budget)), simulate=simulated)
            report = outcome_report(outcome)
            ran_us = {"load": 0, "exec": 0}
            profiled_us = {"load": 0, "exec": 0}
            for entry in outcome.schedule:
                task = prepared.graph.by_id.get(entry.task_id)
                if entry.worker < 0 or task is None:
                    continue
                kind = task.kind.value
                ran_us[kind] = ran_us.get(kind, 0) + entry.end_us - entry.start_us
                profiled_us[kind] = profiled_us.get(kind, 0) + task.duration_us
            rows.append({
                "scenario": scenario, "budget": budget, "jobs": len(jobs), "rho": rho,
                "policy": policy, "simulated": simulated,
                "mean_us": report["summary"]["response_us"]["mean"],
                "makespan_us": report["summary"]["makespan_us"],
                "load_ratio": ran_us["load"] / max(1, profiled_us["load"]),
                "exec_ratio": ran_us["exec"] / max(1, profiled_us["exec"]),
                "concurrency_us": {str(k): v for k, v in
                                   concurrency_us(outcome.schedule).items()},
                "peak_reserved_bytes": report["summary"]["peak_reserved_bytes"],
                "loadavg": round(os.getloadavg()[0], 2),
            })
            print(f"diagnose {scenario} {budget} {policy} {'sim' if simulated else 'real'}: "
                  f"mean {ms(rows[-1]['mean_us'])} ms, load x{rows[-1]['load_ratio']:.2f}, "
                  f"exec x{rows[-1]['exec_ratio']:.2f}, concurrency "
                  f"{rows[-1]['concurrency_us']}", flush=True)
    return rows


def diagnosis_rows(diagnosis: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for row in diagnosis:
        spans = row["concurrency_us"]
        rows.append([row["scenario"], row["budget"], str(row["jobs"]), f"{row['rho']:.2f}",
                     row["policy"],
                     "sim" if row["simulated"] else "real", ms(row["mean_us"]),
                     f"{row['makespan_us'] / 1e6:.1f}", f"{row['load_ratio']:.2f}",
                     f"{row['exec_ratio']:.2f}"]
                    + [f"{spans.get(str(n), 0) / 1e6:.1f}" for n in (2, 1, 0)]
                    + [mib(row["peak_reserved_bytes"]), f"{row['loadavg']:.1f}"])
    return rows


# ------------------------------------------------------------------ formatting


def ms(value_us: float | None) -> str:
    return "-" if value_us is None else f"{value_us / 1000:.0f}"


def mib(value_bytes: float | None) -> str:
    return "-" if value_bytes is None else f"{value_bytes / MIB:.0f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.0f}%"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def machine_note() -> str:
    cpus = os.cpu_count()
    try:
        mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text()
                       .splitlines() if line.startswith("MemTotal:"))
        memory = f"{mem_kib / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        memory = "unknown RAM"
    return (f"{platform.machine()} Linux, {cpus} cores, {memory}, Python "
            f"{platform.python_version()}; the cores were shared with other engineers' "
            f"builds and tests while this ran (1-min load average is recorded per real run), "
            f"so real timings are noisy. No cgroup memory limit was applied: the budget is "
            f"the ledger's, so memory-oblivious policies are not penalised for exceeding it.")


def figure_png(figure: Any) -> bytes:  # noqa: ANN401 - a matplotlib Figure
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def pyplot() -> Any:  # noqa: ANN401 - the matplotlib.pyplot module
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------- the bench


def result_rows(results: list[dict[str, Any]], policies: Sequence[str]) -> list[list[str]]:
    rows = []
    for entry in results:
        by_policy = entry["policies"]
        masa_mean = by_policy.get("masa", {}).get("mean_us")
        row = [entry["scenario"], entry["budget"], "sim" if entry["simulated"] else "real",
               str(entry["jobs"]), f"{entry['load']['rho']:.2f}",
               f"{entry['load']['intensity']:.2f}"]
        row += [ms(by_policy[p]["mean_us"]) for p in policies]
        row += [pct(gain_pct(masa_mean, by_policy[p]["mean_us"]))
                for p in policies if p != "masa"]
        row += [mib(by_policy[p]["peak_reserved_bytes"]) for p in policies]
        row += [mib(by_policy[p]["peak_measured_bytes"]) for p in policies]
        row.append("/".join(str(by_policy[p]["over_commits"]) for p in policies))
        rows.append(row)
    return rows


def result_header(policies: Sequence[str]) -> list[str]:
    header = ["scenario", "budget", "mode", "jobs", "rho", "intensity"]
    header += [f"{p} mean ms" for p in policies]
    header += [f"masa vs {p}" for p in policies if p != "masa"]
    header += [f"{p} peak rsv MiB" for p in policies]
    header += [f"{p} peak meas MiB" for p in policies]
    header.append("over-commits " + "/".join(policies))
    return header


def entry_profiled_work_us(entry: dict[str, Any], store: Path, workers: int) -> int:
    """The profiled work of an entry's jobs (recomputed for JSON files that lack it)."""
    recorded = next(iter(entry["policies"].values())).get("profiled_work_us")
    if recorded is not None:
        return int(recorded)
    workload, jobs, _ = scenario_jobs(Path(store), entry["scenario"], entry["load"]["rho"],
                                      entry["jobs"], workers)
    manifests = load_manifests(Path(store), workload.networks)
    return sum(network_time_us(manifests[name]) for job in jobs for name in job.networks)


def phase_rows(results: list[dict[str, Any]], policies: Sequence[str], store: Path,
               workers: int) -> list[list[str]]:
    rows = []
    for entry in results:
        row = [entry["scenario"], entry["budget"], "sim" if entry["simulated"] else "real"]
        for policy in policies:
            figures = entry["policies"][policy]
            row.append(f"{ms(figures['wait_us'])} / {ms(figures['span_us'])}")
        for policy in policies:
            row.append(f"{100 * entry['policies'][policy]['utilisation']:.0f}%")
        if entry["simulated"]:
            row += ["1.00"] * len(policies) + ["-"]
        else:
            work_us = entry_profiled_work_us(entry, store, workers)
            row += [f"{entry['policies'][p]['busy_us'] / work_us:.2f}" for p in policies]
            row.append("/".join(f"{entry['policies'][p].get('loadavg_after', 0):.1f}"
                                for p in policies))
        rows.append(row)
    return rows


def sweep_plot(sweep: list[dict[str, Any]], scenarios: Sequence[str], budgets: Sequence[str],
               policies: Sequence[str], path: Path) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(len(budgets), len(scenarios), squeeze=False,
                                figsize=(3.2 * len(scenarios), 2.6 * len(budgets)))
    for row, budget in enumerate(budgets):
        for column, scenario in enumerate(scenarios):
            axis = axes[row][column]
            entries = sorted((e for e in sweep if e["scenario"] == scenario
                              and e["budget"] == budget), key=lambda e: e["load"]["rho"])
            for policy in policies:
                axis.plot([e["load"]["rho"] for e in entries],
                          [(e["policies"][policy]["mean_us"] or 0) / 1e6 for e in entries],
                          marker="o", markersize=3, label=policy)
            axis.set_yscale("log")
            axis.set_title(f"{scenario}, {budget}", fontsize=9)
            if row == len(budgets) - 1:
                axis.set_xlabel("offered load rho")
            if column == 0:
                axis.set_ylabel("mean response (s)")
            axis.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    figure.suptitle("Simulated mean job response vs offered load (scale-1 zoo profiles)",
                    fontsize=10)
    figure.tight_layout()
    atomic_write_bytes(path, figure_png(figure))


def gain_plot(results: list[dict[str, Any]], policies: Sequence[str], path: Path) -> None:
    plt = pyplot()
    others = [p for p in policies if p != "masa"]
    modes = [m for m in (True, False) if any(e["simulated"] is m for e in results)]
    figure, axes = plt.subplots(len(modes), 1, squeeze=False,
                                figsize=(max(6.0, 0.55 * len(results) / len(modes) + 2), 3.2
                                         * len(modes)))
    for row, simulated in enumerate(modes):
        axis = axes[row][0]
        entries = [e for e in results if e["simulated"] is simulated]
        x = np.arange(len(entries))
        width = 0.8 / max(1, len(others))
        for index, other in enumerate(others):
            ratios = [(e["policies"]["masa"]["mean_us"] or 0) / (e["policies"][other]["mean_us"]
                                                                 or 1) for e in entries]
            axis.bar(x + (index - (len(others) - 1) / 2) * width, ratios, width,
                     label=f"masa / {other}")
        axis.set_yscale("log")
        axis.axhline(1, color="black", linewidth=0.6)
        axis.axhline(0.7, color="tab:red", linestyle=":", linewidth=0.8,
                     label="paper: -30% vs bulk (0.7)")
        axis.axhline(0.1, color="tab:purple", linestyle=":", linewidth=0.8,
                     label="paper: -90% (stochastic I)")
        axis.set_xticks(x, [f"{e['scenario']}\n{e['budget']}" for e in entries], fontsize=6)
        axis.set_ylabel("masa mean / other mean (log)")
        axis.set_title("simulated" if simulated else "real", fontsize=9)
        axis.legend(fontsize=7)
    figure.tight_layout()
    atomic_write_bytes(path, figure_png(figure))


def write_markdown(path: Path, args: argparse.Namespace, command: str,
                   results: list[dict[str, Any]], sweep: list[dict[str, Any]],
                   policies: Sequence[str], elapsed_s: float,
                   diagnosis: Sequence[Sequence[dict[str, Any]]] = ()) -> None:
    lines = [
        "# Policy comparison: Masa vs Bulk vs DeepEye (issue 3, section 6)",
        "",
        f"Produced by `{command}` in {elapsed_s / 60:.1f} min of runs"
        + (f"; this page rendered from its JSON by `python benchmarks/%s "
           f"{' '.join(sys.argv[1:])}`." % "bench_compare.py" if args.from_json else "."),
        "",
        f"Machine: {machine_note()}",
        "",
        f"Store: `{args.store}`. The zoo models are structure/cost replicas of the paper's "
        "networks with random weights (docs/zoo.md): their sizes and compute are the "
        "originals', their outputs are meaningless. Durations in simulation are the "
        "store's profiled LOAD/EXEC times; real runs execute the ONNX Runtime stages on "
        f"{args.workers} worker threads with the arrival times in real time.",
        "",
        "Load: arrivals are set from the offered load rho = arrival rate x expected job "
        "work / workers, job work being the profiled LOAD + EXEC time of the job's "
        "networks; `intensity` is the paper's traffic intensity (rate x mean network "
        "time, LOAD included) for the same rate. Real task durations differ from the "
        "profile (0.4-2.4x here, see busy/profiled and the diagnosis tables), so a real "
        "run's actual load differs from its nominal rho.",
        "",
        "Columns: mean job response (arrival to last network finished) per policy; "
        "`masa vs X` = masa mean / X mean - 1 (negative: Masa faster); peak reserved = "
        "the ledger's peak (memory-oblivious Bulk/DeepEye reserve too, so their "
        "over-budget peaks show); peak measured = anonymous memory above the run's "
        "baseline + loaded weights (real runs only); over-commits = progress-rule "
        "dispatches above the budget.",
        "",
        *analysis_lines(args),
        f"## Headline: rho = {args.rho}",
        "",
        markdown_table(result_header(policies), result_rows(results, policies)),
        "",
        "Paper (as quoted in issue 3): " + "; ".join(f"{k}: {v}" for k, v in PAPER_GAIN.items())
        + ".",
        "",
        "### Where the time goes: mean wait / mean span per job (ms), utilisation",
        "",
        "wait = arrival to the job's first task start; span = first start to finish. "
        "busy/profiled = the run's summed task durations over the profiled LOAD + EXEC "
        "time of the same jobs: how much slower tasks ran than profiled (contention for "
        "the shared cores), so a real run's effective load is about rho x this factor. "
        "load avg = the machine's 1-minute load average after each policy's run.",
        "",
        markdown_table(["scenario", "budget", "mode"] + [f"{p} wait/span" for p in policies]
                       + [f"{p} util" for p in policies]
                       + [f"{p} busy/profiled" for p in policies] + ["load avg"],
                       phase_rows(results, policies, Path(args.store), args.workers)),
        "",
    ]
    if sweep:
        sweep_rows = []
        for entry in sweep:
            by_policy = entry["policies"]
            masa_mean = by_policy["masa"]["mean_us"]
            sweep_rows.append(
                [entry["scenario"], entry["budget"], f"{entry['load']['rho']:.2f}",
                 f"{entry['load']['intensity']:.2f}", str(entry["jobs"])]
                + [ms(by_policy[p]["mean_us"]) for p in policies]
                + [pct(gain_pct(masa_mean, by_policy[p]["mean_us"]))
                   for p in policies if p != "masa"]
                + [f"{by_policy[p]['makespan_us'] / 1e6:.1f}" for p in policies])
        lines += [
            "## Simulated sweep over the offered load",
            "",
            "![sweep](bench-compare-sweep.png)",
            "",
            markdown_table(["scenario", "budget", "rho", "intensity", "jobs"]
                           + [f"{p} mean ms" for p in policies]
                           + [f"masa vs {p}" for p in policies if p != "masa"]
                           + [f"{p} makespan s" for p in policies], sweep_rows),
            "",
        ]
    lines += ["![gains](bench-compare-gains.png)", ""]
    for rows in diagnosis:
        lines += [
            "## Diagnosis: real vs simulated on the same jobs",
            "",
            f"Produced by `{rows[0]['command']}`." if rows and "command" in rows[0] else "",
            "",
            "load x / exec x = summed real task durations over their profiled durations; "
            "2 / 1 / 0 busy = seconds during which two, one or no task ran.",
            "",
            markdown_table(["scenario", "budget", "jobs", "rho", "policy", "mode", "mean ms",
                            "makespan s", "load x", "exec x", "2 busy s", "1 busy s",
                            "0 busy s", "peak rsv MiB", "load avg"], diagnosis_rows(rows)),
            "",
        ]
    atomic_write_text(path, "\n".join(lines[:1] + kept_grid_section(path) + lines[1:]))


def kept_grid_section(path: Path) -> list[str]:
    """benchmarks/bench_grid.py's section of the page, kept when this rewrites it."""
    page = path.read_text() if path.is_file() else ""
    start, end = "<!-- grid:start -->", "<!-- grid:end -->"
    if start not in page or end not in page:
        return []
    return ["", page[page.index(start):page.index(end) + len(end)]]


def analysis_lines(args: argparse.Namespace) -> list[str]:
    """The --analysis Markdown (the interpretation), placed before the tables."""
    if args.analysis and Path(args.analysis).is_file():
        return [Path(args.analysis).read_text().rstrip(), "", "# The figures", ""]
    return []


def print_entry(entry: dict[str, Any], policies: Sequence[str]) -> None:
    by_policy = entry["policies"]
    masa_mean = by_policy.get("masa", {}).get("mean_us")
    parts = [f"{p} {ms(by_policy[p]['mean_us'])} ms" for p in policies]
    gains = [f"vs {p} {pct(gain_pct(masa_mean, by_policy[p]['mean_us']))}"
             for p in policies if p != "masa"]
    peaks = [f"{p} {mib(by_policy[p]['peak_reserved_bytes'])}/"
             f"{mib(by_policy[p]['peak_measured_bytes'])} MiB" for p in policies]
    print(f"{entry['scenario']:<12} {entry['budget']:>6} {'sim' if entry['simulated'] else 'real'}"
          f" jobs={entry['jobs']} rho={entry['load']['rho']:.2f}: {', '.join(parts)}; "
          f"{', '.join(gains)}; peak rsv/meas {', '.join(peaks)}", flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="prepared, profiled zoo")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rho", type=float, default=0.7,
                        help="offered load of the headline runs (default 0.7)")
    parser.add_argument("--sweep", default="0.3,0.5,0.7,0.9,1.1",
                        help="offered loads of the simulated sweep ('' to skip)")
    parser.add_argument("--sim-jobs", type=int, default=200,
                        help="jobs per simulated headline run (default 200)")
    parser.add_argument("--sweep-jobs", type=int, default=100,
                        help="jobs per simulated sweep run (default 100)")
    parser.add_argument("--real-jobs", type=int, default=None,
                        help=f"jobs per real run (default per scenario: {REAL_JOBS})")
    parser.add_argument("--simulate-only", action="store_true", help="skip the real runs")
    parser.add_argument("--out", type=Path, default=Path("docs/bench-compare.md"))
    parser.add_argument("--json", type=Path, default=None,
                        help="also write every run's figures as JSON here")
    parser.add_argument("--analysis", type=Path, default=None,
                        help="Markdown appended to the doc (the interpretation, written "
                             "after looking at the figures)")
    parser.add_argument("--diagnose", default=None, metavar="SCENARIO:BUDGET:JOBS",
                        help="run that case real and simulated under every policy and "
                             "tabulate task slowdowns and concurrency (added to --json)")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="rebuild the doc and plots from a --json file of an earlier "
                             "run instead of running (to add --analysis afterwards)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    diagnose_rho = args.rho  # the headline rho below may come from the JSON file
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        command, elapsed_s = saved["command"], saved["elapsed_s"]
        results, sweep = saved["results"], saved["sweep"]
        saved_args = saved["args"]
        diagnosis = saved.get("diagnosis", [])
        args.store, args.rho, args.workers = saved_args["store"], saved_args["rho"], \
            saved_args["workers"]
        scenarios = list(dict.fromkeys(e["scenario"] for e in results + sweep))
        budgets = list(dict.fromkeys(e["budget"] for e in results + sweep))
    else:
        command = "python benchmarks/bench_compare.py " + " ".join(
            sys.argv[1:] if argv is None else argv)
        scenarios = [s for s in args.scenarios.split(",") if s]
        budgets = [b for b in args.budgets.split(",") if b]
        started_s = time.perf_counter()
        results, sweep = run_all(args, scenarios, policies, budgets)
        elapsed_s = time.perf_counter() - started_s
        diagnosis = []
    if args.diagnose:
        scenario, budget, count = args.diagnose.split(":")
        rows = diagnose(Path(args.store), scenario, budget, diagnose_rho, int(count),
                        args.workers, policies)
        rows[0]["command"] = "python benchmarks/bench_compare.py " + " ".join(
            sys.argv[1:] if argv is None else argv)
        diagnosis.append(rows)
    if args.json and (args.diagnose or not args.from_json):
        atomic_write_text(args.json, json.dumps(
            {"command": command, "elapsed_s": elapsed_s,
             "args": {"store": str(args.store), "rho": args.rho, "workers": args.workers},
             "results": results, "sweep": sweep, "diagnosis": diagnosis}, indent=1))
    docs = args.out.parent
    if sweep:
        sweep_plot(sweep, scenarios, budgets, policies, docs / "bench-compare-sweep.png")
    gain_plot(results, policies, docs / "bench-compare-gains.png")
    write_markdown(args.out, args, command, results, sweep, policies, elapsed_s, diagnosis)
    print(f"wrote {args.out} ({elapsed_s / 60:.1f} min of runs)")
    return 0


def run_all(args: argparse.Namespace, scenarios: Sequence[str], policies: Sequence[str],
            budgets: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The headline runs (simulated, then real) and the simulated sweep."""
    sweep_loads = [float(x) for x in args.sweep.split(",") if x]
    results: list[dict[str, Any]] = []
    sweep: list[dict[str, Any]] = []
    modes = [True] if args.simulate_only else [True, False]
    for scenario in scenarios:
        for simulated in modes:
            count = args.sim_jobs if simulated else (args.real_jobs or REAL_JOBS[scenario])
            workload, jobs, info = scenario_jobs(args.store, scenario, args.rho, count,
                                                 args.workers)
            prepared = prepare_run(scenario_path(scenario), args.store, "oblivious", jobs=jobs)
            if not simulated:
                warm_page_cache(args.store, workload.networks)
            for budget in budgets:
                entry = {"scenario": scenario, "budget": budget, "simulated": simulated,
                         "jobs": len(jobs), "load": dataclasses.asdict(info),
                         "policies": run_policies(prepared, policies,
                                                  parse_memory_bytes(budget), args.workers,
                                                  simulated)}
                results.append(entry)
                print_entry(entry, policies)
        for rho in sweep_loads:
            workload, jobs, info = scenario_jobs(args.store, scenario, rho, args.sweep_jobs,
                                                 args.workers)
            prepared = prepare_run(scenario_path(scenario), args.store, "oblivious", jobs=jobs)
            for budget in budgets:
                entry = {"scenario": scenario, "budget": budget, "simulated": True,
                         "jobs": len(jobs), "load": dataclasses.asdict(info),
                         "policies": run_policies(prepared, policies,
                                                  parse_memory_bytes(budget), args.workers,
                                                  True)}
                sweep.append(entry)
                print_entry(entry, policies)
    return results, sweep


if __name__ == "__main__":
    sys.exit(main())
