"""`masa run`, `masa compare` and `masa infer`: running workloads from the command line."""

from __future__ import annotations

import argparse
import io
import logging
from pathlib import Path
from typing import Any

import numpy as np

from masa.common.atomic import atomic_save_png, atomic_write_bytes
from masa.common.errors import UserError
from masa.common.units import format_bytes, parse_memory_bytes
from masa.report.report import format_table, write_json
from masa.runtime.runner import (
    POLICIES,
    PreparedRun,
    RunOutcome,
    RunSettings,
    execute,
    outcome_report,
    outcome_trace,
    prepare_run,
)
from masa.runtime.threads import MEMORY_SOURCES, RealExecutor, RealRunConfig
from masa.sched.jobs import JobSpec, build_job_graph, group_id
from model_prep.manifest import load_store_network
from model_prep.verify import bind_feeds, load_feeds

log = logging.getLogger(__name__)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=Path,
                        help="store of prepared networks (masa prepare / masa zoo)")
    parser.add_argument("--memory", default="512MiB",
                        help="memory budget, e.g. 512MiB, 1GiB (default 512MiB)")
    parser.add_argument("--workers", type=int, default=2, help="worker threads (default 2)")
    parser.add_argument("--context", default="oblivious",
                        choices=("oblivious", "wait", "preempt"),
                        help="context-aware execution (default oblivious)")
    parser.add_argument("--simulate", action="store_true",
                        help="discrete-event simulation with the profiled durations")
    parser.add_argument("--memory-source", default="model", choices=MEMORY_SOURCES,
                        help="free memory from the ledger only (model) or reconciled "
                             "with measured process memory (measured)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="run only the first N jobs of the workload")


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run", help="run a workload under one policy",
        description="Run a workload (YAML file or packaged scenario name) and write a "
                    "report and a Chrome trace.")
    run.add_argument("workload", help="workload YAML, or a packaged scenario name")
    run.add_argument("--policy", default="masa", choices=POLICIES)
    _add_run_options(run)
    run.add_argument("--report", type=Path, help="write the report JSON here")
    run.add_argument("--trace", type=Path, help="write a Chrome trace (Perfetto) here")
    run.set_defaults(handler=run_command)

    compare = subparsers.add_parser(
        "compare", help="run a workload under several policies and compare",
        description="Run the same workload under each policy; print one table with "
                    "Masa's relative gains.")
    compare.add_argument("workload", help="workload YAML, or a packaged scenario name")
    compare.add_argument("--policies", default="masa,bulk,deepeye",
                         help="comma-separated policies (default masa,bulk,deepeye)")
    _add_run_options(compare)
    compare.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    compare.add_argument("--report", type=Path, help="write all reports as one JSON here")
    compare.set_defaults(handler=compare_command)

    infer = subparsers.add_parser(
        "infer", help="run one network on one input through the layer scheduler",
        description="Run one prepared network on an input (.npy for a single-input "
                    "network, .npz with named arrays otherwise) and write its outputs.")
    infer.add_argument("--store", required=True, type=Path)
    infer.add_argument("--model", required=True, help="network name in the store")
    infer.add_argument("--input", required=True, type=Path, help=".npy or .npz input")
    infer.add_argument("--out", required=True, type=Path, help=".npz file for the outputs")
    infer.add_argument("--policy", default="masa", choices=POLICIES)
    infer.add_argument("--memory", default="256MiB", help="memory budget (default 256MiB)")
    infer.add_argument("--workers", type=int, default=1)
    infer.set_defaults(handler=infer_command)


def _settings(args: argparse.Namespace, policy: str) -> RunSettings:
    settings = RunSettings(policy=policy, workers=args.workers,
                           memory_budget_bytes=parse_memory_bytes(args.memory, "--memory"),
                           memory_source=getattr(args, "memory_source", "model"))
    settings.check()
    return settings


def _prepare(args: argparse.Namespace) -> PreparedRun:
    if args.jobs is not None and args.jobs < 1:
        raise UserError(f"--jobs: expected a positive integer, got {args.jobs}")
    return prepare_run(args.workload, args.store, args.context, job_limit=args.jobs)


def _describe(outcome: RunOutcome) -> str:
    mode = "simulated" if outcome.simulated else "real"
    return (f"{mode} run, {len(outcome.jobs)} jobs, context {outcome.context}, "
            f"memory budget {format_bytes(outcome.settings.memory_budget_bytes)}")


def run_command(args: argparse.Namespace) -> int:
    settings = _settings(args, args.policy)
    prepared = _prepare(args)
    outcome = execute(prepared, settings, simulate=args.simulate)
    report = outcome_report(outcome, {"workload": str(args.workload)})
    print(_describe(outcome))
    print(format_table(report))
    for group, error in sorted(outcome.errors.items()):
        print(f"failed: {group}: {error}")
    if args.report:
        write_json(args.report, report)
    if args.trace:
        write_json(args.trace, outcome_trace(outcome))
    return 1 if report["summary"]["jobs_failed"] else 0


def compare_reports(reports: dict[str, dict[str, Any]]) -> str:
    """One table of the policies' figures, with Masa's gain over each other policy."""
    header = (f"{'policy':<9} {'mean ms':>9} {'p50 ms':>9} {'p95 ms':>9} {'makespan s':>11} "
              f"{'peak reserved':>14} {'peak measured':>14} {'util':>5} {'failed':>6}")
    lines = [header, "-" * len(header)]
    for policy, report in reports.items():
        summary = report["summary"]
        stats = summary["response_us"]
        measured = summary["peak_measured_bytes"]
        lines.append(
            f"{policy:<9} {_ms(stats['mean']):>9} {_ms(stats['p50']):>9} "
            f"{_ms(stats['p95']):>9} {summary['makespan_us'] / 1e6:>11.3f} "
            f"{format_bytes(summary['peak_reserved_bytes']):>14} "
            f"{'-' if measured is None else format_bytes(measured):>14} "
            f"{100 * summary['worker_utilisation']:>4.0f}% {summary['jobs_failed']:>6}")
    masa_mean = reports.get("masa", {}).get("summary", {}).get("response_us", {}).get("mean")
    if masa_mean:
        for policy, report in reports.items():
            other = report["summary"]["response_us"]["mean"]
            if policy != "masa" and other:
                gain = 100 * (masa_mean / other - 1)
                lines.append(f"masa vs {policy}: mean response {gain:+.1f}%")
    return "\n".join(lines)


def _ms(value_us: float | None) -> str:
    return "-" if value_us is None else f"{value_us / 1000:.1f}"


def plot_comparison(reports: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Bar chart: mean and p95 response per policy, and peak reserved memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(reports)
    means = [(reports[p]["summary"]["response_us"]["mean"] or 0) / 1000 for p in policies]
    p95s = [(reports[p]["summary"]["response_us"]["p95"] or 0) / 1000 for p in policies]
    peaks = [reports[p]["summary"]["peak_reserved_bytes"] / 2**20 for p in policies]
    budget_mib = next(iter(reports.values()))["memory_budget_bytes"] / 2**20
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    x = np.arange(len(policies))
    left.bar(x - 0.2, means, 0.4, label="mean")
    left.bar(x + 0.2, p95s, 0.4, label="p95")
    left.set_xticks(x, policies)
    left.set_ylabel("job response time (ms)")
    left.legend()
    right.bar(x, peaks, 0.5, color="tab:gray")
    right.axhline(budget_mib, color="tab:red", linestyle="--", label="budget")
    right.set_xticks(x, policies)
    right.set_ylabel("peak reserved memory (MiB)")
    right.legend()
    figure.suptitle(title)
    figure.tight_layout()
    atomic_save_png(figure, path)
    plt.close(figure)


def compare_command(args: argparse.Namespace) -> int:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for policy in policies:
        if policy not in POLICIES:
            raise UserError(f"--policies: expected names from {', '.join(POLICIES)}, "
                            f"got {policy!r}")
    prepared = _prepare(args)
    reports: dict[str, dict[str, Any]] = {}
    description = ""
    for policy in policies:
        outcome = execute(prepared, _settings(args, policy), simulate=args.simulate)
        reports[policy] = outcome_report(outcome, {"workload": str(args.workload)})
        description = _describe(outcome)
    print(f"{args.workload}: {description}")
    print(compare_reports(reports))
    if args.plot:
        plot_comparison(reports, args.plot, f"{args.workload}: {description}")
    if args.report:
        write_json(args.report, {"workload": str(args.workload), "reports": reports})
    return 0


def run_network(store: Path, name: str, feeds: dict[str, np.ndarray], settings: RunSettings
                ) -> dict[str, np.ndarray]:
    """One network, one input, through the layer scheduler (real executor)."""
    manifest = load_store_network(store, name)
    bound = bind_feeds(manifest, feeds)
    job = JobSpec(job_id=0, arrival_us=0, networks=(name,))
    graph = build_job_graph(job, {name: manifest}, [name])
    executor = RealExecutor(
        graph, {name: manifest}, {0: 0}, lambda job_id, network, upstream: bound,
        RealRunConfig(workers=settings.workers, memory_budget_bytes=settings.memory_budget_bytes,
                      policy=settings.policy),
    )
    result = executor.run()
    group = group_id(0, name)
    if result.group_status.get(group) != "done":
        raise UserError(f"network {name!r} failed: {result.errors.get(group, 'unknown error')}")
    return result.outputs[group]


def infer_command(args: argparse.Namespace) -> int:
    settings = RunSettings(policy=args.policy, workers=args.workers,
                           memory_budget_bytes=parse_memory_bytes(args.memory, "--memory"))
    settings.check()
    outputs = run_network(args.store, args.model, load_feeds(args.input), settings)
    buffer = io.BytesIO()
    np.savez(buffer, **outputs)
    atomic_write_bytes(args.out, buffer.getvalue())
    for name, value in outputs.items():
        print(f"{name}: {value.dtype} {'x'.join(map(str, value.shape))}")
    return 0
