"""`masa run`, `masa compare` and `masa infer`: running workloads from the command line.

Registering the parsers imports only argparse and the policy registry, so
`masa run --help` stays small; a handler imports the runtime (ONNX Runtime)
when it runs.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from masa.common.argtypes import (
    MEMORY_HELP,
    memory_budget,
    memory_size,
    output_file,
    positive_int,
)
from masa.common.atomic import atomic_save_png, atomic_write_bytes
from masa.common.errors import UserError, writing
from masa.common.output import add_json_flag, print_json
from masa.common.units import format_bytes
from masa.runtime.registry import KEEPING_POLICIES, POLICY_NAMES, keep_loaded_for

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import numpy as np

    from masa.runtime.runner import PreparedRun, RunOutcome, RunSettings

MEMORY_SOURCES = ("model", "measured")
DEFAULT_MEMORY_BYTES = 512 * 2**20
CONTEXT_MODES = ("oblivious", "wait", "preempt")


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, type=Path,
                        help="store of prepared networks (masa prepare / masa zoo)")
    parser.add_argument("--memory", type=memory_budget, default=None,
                        help="memory budget, a size with a unit: 512MiB, 1GiB (default 512MiB; "
                             "with --device the device's memory cap less the runtime's "
                             f"measured base); {MEMORY_HELP}; at least what the largest "
                             "task needs alone")
    parser.add_argument("--device", metavar="NAME|FILE",
                        help="run each policy on an emulated device (a preset such as "
                             "pi4-2g, or a device YAML; needs root and cgroups): memory cap, "
                             "storage throttle, cold page cache (docs/device-emulation.md)")
    parser.add_argument("--workers", type=positive_int, default=2,
                        help="worker threads (default 2)")
    parser.add_argument("--context", default="oblivious", choices=CONTEXT_MODES,
                        help="context-aware execution (default oblivious)")
    parser.add_argument("--simulate", action="store_true",
                        help="discrete-event simulation with the profiled durations")
    parser.add_argument("--memory-source", default="measured", choices=MEMORY_SOURCES,
                        help="free memory from the ledger alone (model), or reconciled with "
                             "the process's measured memory before every decision (measured, "
                             "the default): what the process holds beyond the ledger "
                             "shrinks the budget the scheduler sees")
    parser.add_argument("--jobs", type=positive_int, default=None,
                        help="number of jobs: run only the first N of the workload")
    parser.add_argument("--read-ahead", type=memory_size, default=None, metavar="SIZE",
                        help="masa only: bound the stages loaded ahead of their EXEC to this "
                             "many resident bytes (one stage is always allowed; default: as "
                             "memory allows). Where a slow card binds and the store holds "
                             "copied weights, 128MiB leaves the page cache room; with "
                             "zero-copy stages it is no gain (docs/scheduling.md, "
                             "Read-ahead)")
    parser.add_argument("--keep-cached", type=memory_size, default=None, metavar="SIZE",
                        help="real runs: keep at most SIZE of unloaded stages' files in the "
                             "page cache, the first unloaded, and drop the others at their "
                             "unload, so that jobs cycling through more stage files than "
                             "the cache holds find the first ones cached (docs/scheduling.md, "
                             "Keeping stage files cached; default: the kernel decides)")
    parser.add_argument("--keep-loaded", type=memory_size, default=None, metavar="SIZE",
                        help="masa and masa-noplan: keep loaded stages (their sessions and "
                             "weights, counted in the budget) between jobs within SIZE and the "
                             "budget, so the next job's LOAD of such a stage costs nothing: all "
                             "of them while they fit, else those that save the most LOAD time "
                             "per byte; the least recently kept are unloaded when a task needs "
                             "the memory "
                             "(docs/scheduling.md, Kept loaded stages; default: the budget; "
                             "0: off, every job loads its stages as in the paper)")
    add_json_flag(parser, "the report")


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run", help="run a workload under one policy",
        description="Run a workload (YAML file or packaged scenario name) and write a "
                    "report and a Chrome trace. Exit 1 when a job failed or the policy "
                    "went over the budget while other tasks ran.")
    run.add_argument("workload", help="workload YAML, or a packaged scenario name")
    run.add_argument("--policy", default="masa", choices=POLICY_NAMES)
    _add_run_options(run)
    run.add_argument("--report", type=output_file,
                     help="write the report JSON here (on SIGINT/SIGTERM: the partial report, "
                          "then exit 130/143)")
    run.add_argument("--trace", type=output_file, help="write a Chrome trace (Perfetto) here")
    run.set_defaults(handler=run_command)

    compare = subparsers.add_parser(
        "compare", help="run a workload under several policies and compare",
        description="Run the same workload under each policy; print one table with "
                    "Masa's relative gains. Exit 1 when a job failed under any policy.")
    compare.add_argument("workload", help="workload YAML, or a packaged scenario name")
    compare.add_argument("--policies", default="masa,bulk,deepeye",
                         help="comma-separated policies (default masa,bulk,deepeye)")
    _add_run_options(compare)
    compare.add_argument("--plot", type=output_file,
                         help="write a PNG bar chart here (needs masa[plot])")
    compare.add_argument("--report", type=output_file,
                         help="write all reports as one JSON here (on SIGINT/SIGTERM: those "
                              "done and the partial one)")
    compare.set_defaults(handler=compare_command)

    infer = subparsers.add_parser(
        "infer", help="run one network on one input through the layer scheduler",
        description="Run one prepared network on an input (.npy for a single-input "
                    "network, .npz with named arrays otherwise) and write its outputs. "
                    "Exit 1 when the network failed.")
    infer.add_argument("--store", required=True, type=Path)
    infer.add_argument("--model", required=True, help="network name in the store")
    infer.add_argument("--input", required=True, type=Path, help=".npy or .npz input")
    infer.add_argument("--out", required=True, type=output_file,
                       help=".npz file for the outputs")
    infer.add_argument("--policy", default="masa", choices=POLICY_NAMES)
    infer.add_argument("--memory", type=memory_budget, default=memory_budget("256MiB"),
                       help=f"memory budget, a size with a unit (default 256MiB); {MEMORY_HELP}")
    infer.add_argument("--workers", type=positive_int, default=1)
    add_json_flag(infer, "the outputs' names, dtypes and shapes")
    infer.set_defaults(handler=infer_command)


def _settings(args: argparse.Namespace, policy: str) -> RunSettings:
    from masa.runtime.runner import RunSettings

    budget_bytes = DEFAULT_MEMORY_BYTES if args.memory is None else args.memory
    settings = RunSettings(policy=policy, workers=args.workers,
                           memory_budget_bytes=budget_bytes,
                           memory_source=getattr(args, "memory_source", "measured"),
                           read_ahead_bytes=getattr(args, "read_ahead", None),
                           keep_cached_bytes=getattr(args, "keep_cached", None),
                           keep_loaded_bytes=keep_loaded_for(
                               policy, getattr(args, "keep_loaded", None), budget_bytes))
    settings.check()
    if settings.keep_cached_bytes is not None and getattr(args, "simulate", False):
        log.warning("--keep-cached: a simulation does not model it (the page cache's "
                    "contents are the simulator's own); it applies to real runs only")
    return settings


def _check_keep_loaded(args: argparse.Namespace) -> None:
    """`masa run` with a baseline and --keep-loaded above 0 is a usage error (`masa
    compare` runs the baselines beside a keeping masa as the paper defines them)."""
    if getattr(args, "keep_loaded", None) and args.policy not in KEEPING_POLICIES:
        raise UserError(f"--keep-loaded: policy {args.policy!r} does not keep stages; "
                        f"expected one of {', '.join(KEEPING_POLICIES)}")


def _prepare(args: argparse.Namespace) -> PreparedRun:
    from masa.runtime.runner import prepare_run

    return prepare_run(args.workload, args.store, args.context, job_limit=args.jobs)


def _describe(outcome: RunOutcome) -> str:
    mode = "simulated" if outcome.simulated else "real"
    return (f"{mode} run, {len(outcome.jobs)} jobs, context {outcome.context}, "
            f"memory budget {format_bytes(outcome.settings.memory_budget_bytes)}")


def run_command(args: argparse.Namespace) -> int:
    from masa.report.report import format_table, outcome_report, outcome_trace, write_json
    from masa.runtime.runner import execute

    _check_keep_loaded(args)
    if getattr(args, "device", None):
        return _run_on_device(args)
    settings = _settings(args, args.policy)
    prepared = _prepare(args)
    _check_budget(prepared, settings)
    try:
        outcome = execute(prepared, settings, simulate=args.simulate)
    except KeyboardInterrupt as interruption:  # SIGINT/SIGTERM: report what ran, then exit
        _write_partial(args, interruption, lambda report: report)
        raise
    report = outcome_report(outcome, {"workload": str(args.workload)})
    if args.json:
        print_json(report)
    else:
        print(_describe(outcome))
        print(format_table(report))
        for group, error in sorted(outcome.errors.items()):
            print(f"failed: {group}: {error}")
    if args.report:
        with writing(args.report, "the report"):
            write_json(args.report, report)
    if args.trace:
        with writing(args.trace, "the trace"):
            write_json(args.trace, outcome_trace(outcome))
    return 1 if _failed(report) else 0


def _check_budget(prepared: PreparedRun, settings: RunSettings) -> None:
    from masa.runtime.runner import check_budget

    check_budget(prepared.graph, settings.memory_budget_bytes)


def _write_partial(args: argparse.Namespace, interruption: KeyboardInterrupt,
                   document: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """An interrupted run's report (marked partial) into --report and --trace, when the
    run had started (masa.common.signals); `document` wraps the report for the file."""
    from masa.report.report import outcome_report, outcome_trace, write_json
    from masa.runtime.runner import RunOutcome

    outcome = getattr(interruption, "partial", None)
    if not isinstance(outcome, RunOutcome):
        return
    report = outcome_report(outcome, {"workload": str(args.workload)})
    summary = report["summary"]
    print(f"interrupted by {outcome.interrupted}: {summary['jobs_interrupted']} of "
          f"{summary['jobs']} jobs did not finish", file=sys.stderr)
    if args.report:
        with writing(args.report, "the partial report"):
            write_json(args.report, document(report))
        print(f"partial report written to {args.report}", file=sys.stderr)
    if getattr(args, "trace", None):
        with writing(args.trace, "the partial trace"):
            write_json(args.trace, outcome_trace(outcome))


def _failed(report: dict[str, Any]) -> bool:
    """A job failed, or a memory-aware policy broke the progress rule (or, on an
    emulated device, the run was killed)."""
    summary = report["summary"]
    return bool(summary["jobs_failed"] or summary["progress_rule_violations"]
                or report.get("status", "finished") != "finished")


def _run_on_device(args: argparse.Namespace) -> int:
    """`masa run --device`: the run in a child process on the emulated device."""
    from masa.cli.emulated import emulated_policy_report, prepare_for_device
    from masa.report.report import format_emulation, format_table, write_json

    plan, prepared = prepare_for_device(args)
    report = emulated_policy_report(args, plan, args.policy, prepared)
    if args.json:
        print_json(report)
    else:
        if report["status"] == "finished":
            print(format_table(report))
        print(format_emulation(report))
    if args.report:
        write_json(args.report, report)
    if args.trace and report["status"] != "finished":
        print(f"--trace: not written: the run was {report['status']}", file=sys.stderr)
    return 1 if _failed(report) else 0


def _compare_on_device(args: argparse.Namespace, policies: list[str]) -> int:
    """`masa compare --device`: each policy in its own child on the emulated device."""
    from masa.cli.emulated import emulated_policy_report, prepare_for_device
    from masa.report.report import format_emulation, write_json

    plan, prepared = prepare_for_device(args)
    reports = {policy: emulated_policy_report(args, plan, policy, prepared)
               for policy in policies}
    document = {"workload": str(args.workload), "device": plan.device.as_dict(),
                "reports": reports}
    if args.json:
        print_json(document)
    else:
        mode = "simulated" if getattr(args, "simulate", False) else "real"
        print(f"{args.workload}: {mode} runs of {len(prepared.jobs)} jobs on device "
              f"{plan.device.name}, context {args.context}")
        print(compare_reports(reports))
        for policy, report in reports.items():
            print(f"{policy}: {format_emulation(report)}")
    if args.plot:
        plot_comparison(reports, args.plot, f"{args.workload} on {plan.device.name}")
    if args.report:
        write_json(args.report, document)
    return 1 if any(_failed(report) for report in reports.values()) else 0


def compare_reports(reports: dict[str, dict[str, Any]]) -> str:
    """One table of the policies' figures, with Masa's gain over each other policy."""
    header = (f"{'policy':<9} {'mean ms':>9} {'p50 ms':>9} {'p95 ms':>9} {'makespan s':>11} "
              f"{'peak reserved':>14} {'peak measured':>14} {'anon':>10} {'weights':>10} "
              f"{'util':>5} {'failed':>6}")
    lines = [header, "-" * len(header)]
    for policy, report in reports.items():
        summary = report["summary"]
        if report.get("status", "finished") != "finished":  # no figures to show or average
            lines.append(f"{policy:<9} {report['status'].upper()} after "
                         f"{summary.get('ended_at_s')} s, "
                         f"{summary.get('jobs_finished_before_end')} of {summary['jobs']} "
                         f"jobs finished: {summary.get('reason')}")
            continue
        stats = summary["response_us"]
        lines.append(
            f"{policy:<9} {_ms(stats['mean']):>9} {_ms(stats['p50']):>9} "
            f"{_ms(stats['p95']):>9} {summary['makespan_us'] / 1e6:>11.3f} "
            f"{format_bytes(summary['peak_reserved_bytes']):>14} "
            f"{_size(summary.get('peak_measured_bytes')):>14} "
            f"{_size(summary.get('peak_anonymous_bytes')):>10} "
            f"{_size(summary.get('peak_stage_file_bytes')):>10} "
            f"{100 * summary['worker_utilisation']:>4.0f}% {summary['jobs_failed']:>6}")
    masa_mean = reports.get("masa", {}).get("summary", {}).get("response_us", {}).get("mean")
    if masa_mean:
        for policy, report in reports.items():
            other = report["summary"]["response_us"]["mean"]
            if policy != "masa" and other and report.get("status", "finished") == "finished":
                gain = 100 * (masa_mean / other - 1)
                lines.append(f"masa vs {policy}: mean response {gain:+.1f}%")
    return "\n".join(lines)


def _ms(value_us: float | None) -> str:
    return "-" if value_us is None else f"{value_us / 1000:.1f}"


def _size(memory_bytes: int | None) -> str:
    return "-" if memory_bytes is None else format_bytes(memory_bytes)


def _pyplot() -> Any:
    """matplotlib's pyplot (Agg), or a one-line error naming the extra to install."""
    try:
        import matplotlib
    except ModuleNotFoundError as error:
        if error.name != "matplotlib":  # installed but broken: the real error, not this
            raise
        raise UserError("--plot needs matplotlib: pip install 'masa[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_comparison(reports: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Bar chart: mean and p95 response per policy, and peak reserved memory."""
    plt = _pyplot()
    policies = list(reports)
    means = [(reports[p]["summary"]["response_us"]["mean"] or 0) / 1000 for p in policies]
    p95s = [(reports[p]["summary"]["response_us"]["p95"] or 0) / 1000 for p in policies]
    peaks = [(reports[p]["summary"]["peak_reserved_bytes"] or 0) / 2**20 for p in policies]
    budget_mib = max((r["memory_budget_bytes"] or 0) for r in reports.values()) / 2**20
    # A killed run has no figures: its bars stay empty and its label says why.
    policies = [p if reports[p].get("status", "finished") == "finished"
                else f"{p}\n({reports[p]['status']})" for p in policies]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    x = list(range(len(policies)))
    left.bar([i - 0.2 for i in x], means, 0.4, label="mean")
    left.bar([i + 0.2 for i in x], p95s, 0.4, label="p95")
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
    try:
        with writing(path, "the plot"):
            atomic_save_png(figure, path)
    finally:
        plt.close(figure)


def parse_policies(text: str) -> list[str]:
    policies = [p.strip() for p in text.split(",") if p.strip()]
    for policy in policies:
        if policy not in POLICY_NAMES:
            raise UserError(f"--policies: expected names from {', '.join(POLICY_NAMES)}, "
                            f"got {policy!r}")
    if not policies:
        raise UserError("--policies: expected at least one policy name")
    return policies


def compare_command(args: argparse.Namespace) -> int:
    from masa.report.report import outcome_report, write_json
    from masa.runtime.runner import execute

    policies = parse_policies(args.policies)
    if getattr(args, "device", None):
        return _compare_on_device(args, policies)
    prepared = _prepare(args)
    _check_budget(prepared, _settings(args, policies[0]))
    reports: dict[str, dict[str, Any]] = {}
    description = ""
    for policy in policies:
        try:
            outcome = execute(prepared, _settings(args, policy), simulate=args.simulate)
        except KeyboardInterrupt as interruption:  # the reports so far, and the partial one
            _write_partial(args, interruption, lambda report, policy=policy: {
                "workload": str(args.workload), "partial": True,
                "reports": {**reports, policy: report}})
            raise
        reports[policy] = outcome_report(outcome, {"workload": str(args.workload)})
        description = _describe(outcome)
    document = {"workload": str(args.workload), "reports": reports}
    if args.json:
        print_json(document)
    else:
        print(f"{args.workload}: {description}")
        print(compare_reports(reports))
    if args.plot:
        plot_comparison(reports, args.plot, f"{args.workload}: {description}")
    if args.report:
        with writing(args.report, "the report"):
            write_json(args.report, document)
    return 1 if any(_failed(report) for report in reports.values()) else 0


def infer_command(args: argparse.Namespace) -> int:
    import numpy as np

    from masa.runtime.runner import run_network
    from model_prep.feeds import load_feeds

    settings = _settings(args, args.policy)
    outputs = run_network(args.store, args.model, load_feeds(args.input), settings)
    buffer = io.BytesIO()
    np.savez(buffer, **outputs)
    with writing(args.out, "the outputs"):
        atomic_write_bytes(args.out, buffer.getvalue())
    _print_outputs(outputs, args.json)
    return 0


def _print_outputs(outputs: dict[str, np.ndarray], as_json: bool) -> None:
    if as_json:
        print_json({"outputs": {name: {"dtype": str(value.dtype), "shape": list(value.shape)}
                                 for name, value in outputs.items()}})
        return
    for name, value in outputs.items():
        print(f"{name}: {value.dtype} {'x'.join(map(str, value.shape))}")
