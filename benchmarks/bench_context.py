"""Context-aware execution: oblivious vs CA-wait vs CA-preempt (issue 4, section 5).

Owns the context-aware benchmark: the paper's light scenario (FaceNet ->
AgeNet, GenderNet) and heavy scenario (TinyYOLO -> FaceNet -> AgeNet,
GenderNet, EmotionNet; MemNet independent), with every `probability:` label
set to 0, 0.25, 0.5, 0.75 and 1, at budgets 512 MiB and 1 GiB, under policy
masa with contexts oblivious, wait and preempt, simulated (many jobs) and real
(few jobs). It prints and writes (docs/bench-context.md, a PNG) the mean job
response ("makespan per job": arrival to the job's last network done, skipped
or aborted), and for preempt the work wasted on aborted networks (LOAD + EXEC
time, summary.wasted_us, and the bytes those networks had loaded).

Labels are seeded Bernoulli draws keyed by (job, upstream network) and compared
with the probability, so raising p only adds runs (the same jobs, the same
draws). In heavy, FaceNet runs with probability p and each of AgeNet, GenderNet
and EmotionNet with p^2 (they share FaceNet's draw).

Load: arrivals are set from the offered load rho of the *oblivious* workload
(see bench_compare.py): the same arrival times for every context and p. An
"isolated" simulated row (rho 0.05: jobs never overlap) separates each job's own
latency from queueing.

Run:  python benchmarks/bench_context.py --store /work/zoo1
      python benchmarks/bench_context.py --store /tmp/benchstore --simulate-only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_compare import (
    analysis_lines,
    figure_png,
    machine_note,
    markdown_table,
    mib,
    ms,
    pyplot,
    run_policies,
    scenario_jobs,
    warm_page_cache,
)

from masa.common.atomic import atomic_write_bytes, atomic_write_text
from masa.common.units import parse_memory_bytes
from masa.runtime.runner import prepare_run
from workloads.generation import scenario_path, with_label_probability

SCENARIOS = ("light", "heavy")
PROBABILITIES = (0.0, 0.25, 0.5, 0.75, 1.0)
BUDGETS = ("512MiB", "1GiB")
CONTEXTS = ("oblivious", "wait", "preempt")
REAL_JOBS = {"light": 6, "heavy": 4}
ISOLATED_RHO = 0.05


def run_case(store: Path, scenario: str, jobs: list, context: str, probability: float,
             budget: str, workers: int, simulated: bool) -> dict[str, Any]:
    """One masa run of the scenario's jobs under `context` with every label at p."""
    prepared = prepare_run(scenario_path(scenario), store, context, jobs=jobs)
    prepared = dataclasses.replace(
        prepared, workload=with_label_probability(prepared.workload, probability))
    return run_policies(prepared, ["masa"], parse_memory_bytes(budget), workers,
                        simulated, keep_groups=True)["masa"]


def unneeded_work(by_context: dict[str, dict[str, Any]]) -> dict[str, int] | None:
    """Preempt's work on networks the labels made unnecessary.

    The set comes from the wait run of the same jobs and p (the same seeded
    draws): every network it skipped. Counts what preempt spent on them
    whatever its report calls them (aborted, or done when a downstream finished
    before its upstream's verdict), unlike summary.wasted_us, which counts
    aborted networks only.
    """
    if "wait" not in by_context or "preempt" not in by_context:
        return None
    skipped = [g for g, (status, _, _) in by_context["wait"]["groups"].items()
               if status == "skipped"]
    preempt = by_context["preempt"]["groups"]
    return {
        "networks": len(skipped),
        "work_us": sum(preempt[g][1] for g in skipped),
        "loaded_bytes": sum(preempt[g][2] for g in skipped),
        "reported_done": sum(1 for g in skipped if preempt[g][0] == "done"),
    }


def run_all(args: argparse.Namespace, scenarios: Sequence[str], budgets: Sequence[str],
            probabilities: Sequence[float], contexts: Sequence[str]) -> list[dict[str, Any]]:
    """Every (scenario, mode, load, budget, p, context) run; oblivious once per p-sweep
    (it ignores the labels), its figures repeated for every p."""
    results: list[dict[str, Any]] = []
    modes: list[tuple[bool, float]] = [] if args.real_only else [(True, args.rho)]
    if not args.real_only and args.isolated_jobs > 0:
        modes.append((True, ISOLATED_RHO))
    if not args.simulate_only:
        modes.append((False, args.rho))
    for scenario in scenarios:
        for simulated, rho in modes:
            if simulated:
                count = args.sim_jobs if rho == args.rho else args.isolated_jobs
            else:
                count = args.real_jobs or REAL_JOBS[scenario]
            workload, jobs, info = scenario_jobs(args.store, scenario, rho, count,
                                                 args.workers)
            if not simulated:
                warm_page_cache(args.store, workload.networks)
            for budget in budgets:
                oblivious: dict[str, Any] | None = None
                for probability in probabilities:
                    repeats = 1 if simulated else args.repeats
                    runs: dict[str, list[dict[str, Any]]] = {}
                    for _ in range(repeats):  # contexts in rotation: drift hits all alike
                        for context in contexts:
                            if context == "oblivious" and oblivious is not None:
                                continue
                            runs.setdefault(context, []).append(run_case(
                                args.store, scenario, jobs, context, probability, budget,
                                args.workers, simulated))
                    by_context = {context: median_run(runs[context]) for context in runs}
                    if "oblivious" in by_context:
                        oblivious = dict(by_context["oblivious"])
                    elif oblivious is not None:
                        by_context["oblivious"] = oblivious
                    by_context = {context: by_context[context] for context in contexts}
                    unneeded = unneeded_work(by_context)
                    for figures in by_context.values():
                        figures.pop("groups", None)  # kept only for unneeded_work
                    entry = {"scenario": scenario, "budget": budget, "simulated": simulated,
                             "repeats": repeats,
                             "isolated": rho == ISOLATED_RHO, "jobs": len(jobs),
                             "probability": probability, "load": dataclasses.asdict(info),
                             "contexts": by_context, "preempt_unneeded": unneeded}
                    results.append(entry)
                    print_entry(entry, contexts)
    return results


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median mean response, with every run's mean attached."""
    ordered = sorted(runs, key=lambda run: run["mean_us"] or 0.0)
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["mean_us_runs"] = [run["mean_us"] for run in runs]
    return chosen


def mode_name(entry: dict[str, Any]) -> str:
    if not entry["simulated"]:
        repeats = entry.get("repeats", 1)
        return "real" if repeats == 1 else f"real, median of {repeats}"
    return "sim isolated" if entry["isolated"] else f"sim, rho {entry['load']['rho']:.2f}"


def print_entry(entry: dict[str, Any], contexts: Sequence[str]) -> None:
    figures = entry["contexts"]
    parts = [f"{c} {ms(figures[c]['mean_us'])} ms" for c in contexts]
    preempt = figures.get("preempt")
    wasted = "" if preempt is None else (
        f"; preempt wasted {preempt['wasted_us'] / 1e6:.2f} s, "
        f"{mib(preempt['aborted_loaded_bytes'])} MiB loaded, status {preempt['network_status']}")
    unneeded = entry.get("preempt_unneeded")
    if unneeded:
        wasted += (f"; unneeded by labels: {unneeded['networks']} nets, "
                   f"{unneeded['work_us'] / 1e6:.2f} s, {unneeded['reported_done']} reported done")
    print(f"{entry['scenario']:<6} {entry['budget']:>6} {mode_name(entry):<12} "
          f"jobs={entry['jobs']} p={entry['probability']:.2f}: {', '.join(parts)}{wasted}",
          flush=True)


def table_rows(results: list[dict[str, Any]], contexts: Sequence[str]) -> list[list[str]]:
    rows = []
    for entry in results:
        figures = entry["contexts"]
        means = {c: figures[c]["mean_us"] for c in contexts}
        best = min((c for c in contexts if means[c] is not None), key=lambda c: means[c],
                   default="-")
        row = [entry["scenario"], entry["budget"], mode_name(entry), str(entry["jobs"]),
               f"{entry['probability']:.2f}"]
        row += [ms(means[c]) + spread(figures[c]) for c in contexts]
        row.append(best)
        if "preempt" in figures:
            preempt = figures["preempt"]
            status = preempt["network_status"]
            row += [f"{preempt['wasted_us'] / 1e6 / entry['jobs']:.2f}",
                    mib(preempt["aborted_loaded_bytes"] / entry["jobs"]),
                    str(status.get("aborted", 0))]
            unneeded = entry.get("preempt_unneeded")
            row += ["-"] * 3 if not unneeded else [
                f"{unneeded['work_us'] / 1e6 / entry['jobs']:.2f}",
                mib(unneeded["loaded_bytes"] / entry["jobs"]),
                str(unneeded["reported_done"])]
        if "wait" in figures:
            row.append(str(figures["wait"]["network_status"].get("skipped", 0)))
        row += [mib(figures[c]["peak_reserved_bytes"]) for c in contexts]
        row += [mib(figures[c]["peak_measured_bytes"]) for c in contexts]
        row.append("/".join(str(figures[c]["over_commits"]) for c in contexts))
        rows.append(row)
    return rows


def spread(figures: dict[str, Any]) -> str:
    """' (min-max)' of repeated runs' means, in ms."""
    runs = [m for m in figures.get("mean_us_runs", []) if m is not None]
    if len(runs) < 2:
        return ""
    return f" ({min(runs) / 1000:.0f}-{max(runs) / 1000:.0f})"


def table_header(contexts: Sequence[str]) -> list[str]:
    header = ["scenario", "budget", "mode", "jobs", "p"]
    header += [f"{c} mean ms" for c in contexts]
    header.append("best")
    if "preempt" in contexts:
        header += ["preempt wasted s/job", "preempt aborted MiB/job", "aborted nets",
                   "preempt unneeded work s/job", "unneeded loaded MiB/job",
                   "unneeded but reported done"]
    if "wait" in contexts:
        header.append("wait skipped nets")
    header += [f"{c} peak rsv MiB" for c in contexts]
    header += [f"{c} peak meas MiB" for c in contexts]
    header.append("over-commits " + "/".join(contexts))
    return header


def plot(results: list[dict[str, Any]], scenarios: Sequence[str], budgets: Sequence[str],
         contexts: Sequence[str], path: Path) -> None:
    plt = pyplot()
    columns = [(s, b) for s in scenarios for b in budgets]
    figure, axes = plt.subplots(2, len(columns), squeeze=False,
                                figsize=(3.4 * len(columns), 7.5))
    styles: dict[str, Any] = {}
    patterns = ["-", ":", "--", "-.", (0, (1, 3)), (0, (5, 1))]
    for entry in results:
        styles.setdefault(mode_name(entry), patterns[len(styles) % len(patterns)])
    colours = {"oblivious": "tab:gray", "wait": "tab:blue", "preempt": "tab:orange"}
    for column, (scenario, budget) in enumerate(columns):
        top, bottom = axes[0][column], axes[1][column]
        for mode, style in styles.items():
            entries = sorted((e for e in results if e["scenario"] == scenario
                              and e["budget"] == budget and mode_name(e) == mode),
                             key=lambda e: e["probability"])
            if not entries:
                continue
            xs = [e["probability"] for e in entries]
            for context in contexts:
                top.plot(xs, [(e["contexts"][context]["mean_us"] or 0) / 1e6 for e in entries],
                         linestyle=style, marker="o", markersize=3, color=colours.get(context),
                         label=f"{context} ({mode})")
            if "preempt" in contexts:
                bottom.plot(xs, [e["contexts"]["preempt"]["wasted_us"] / 1e6 / e["jobs"]
                                 for e in entries], linestyle=style, marker="o", markersize=3,
                            color="tab:orange", label=f"wasted_us ({mode})")
                bottom.plot(xs, [(e.get("preempt_unneeded") or {}).get("work_us", 0) / 1e6
                                 / e["jobs"] for e in entries], linestyle=style, marker="x",
                            markersize=4, color="tab:red", label=f"unneeded work ({mode})")
        top.set_yscale("log")  # overloaded runs sit 100x above the others
        top.set_title(f"{scenario}, {budget}", fontsize=9)
        top.set_ylabel("mean job response (s)")
        bottom.set_ylabel("preempt wasted work (s/job)")
        bottom.set_xlabel("label probability p")
        for axis in (top, bottom):
            axis.tick_params(labelsize=7)
    handles, labels = [], []
    for axis in (axes[0][0], axes[1][0]):  # every mode appears in the first column
        more_handles, more_labels = axis.get_legend_handles_labels()
        handles += more_handles
        labels += more_labels
    figure.legend(handles, labels, loc="lower center", ncol=5, fontsize=7)
    figure.suptitle("Context-aware execution (policy masa): oblivious / CA-wait / CA-preempt",
                    fontsize=10)
    figure.tight_layout(rect=(0, 0.2, 1, 1))
    atomic_write_bytes(path, figure_png(figure))


def write_markdown(path: Path, args: argparse.Namespace, command: str,
                   results: list[dict[str, Any]], contexts: Sequence[str],
                   elapsed_s: float) -> None:
    loads = {}
    for entry in results:
        loads.setdefault((entry["scenario"], mode_name(entry)), entry["load"])
    load_rows = [[scenario, mode, f"{load['rho']:.2f}", f"{load['intensity']:.2f}",
                  f"{1 / load['rate_per_s']:.2f}", f"{load['job_work_us'] / 1e6:.2f}"]
                 for (scenario, mode), load in loads.items()]
    lines = [
        "# Context-aware execution: oblivious vs CA-wait vs CA-preempt (issue 4, section 5)",
        "",
        f"Produced by `{command}` in {elapsed_s / 60:.1f} min of runs"
        + (f"; this page rendered from its JSON by `python benchmarks/%s "
           f"{' '.join(sys.argv[1:])}`." % "bench_context.py" if args.from_json else "."),
        "",
        f"Machine: {machine_note()}",
        "",
        f"Store: `{args.store}`. The zoo models are structure/cost replicas of the paper's "
        "networks with random weights (docs/zoo.md): sizes and compute are the originals', "
        "outputs are meaningless, so the labels are the scenario files' `probability:` "
        "conditions (seeded Bernoulli draws per job and upstream network), swept over p. "
        "In heavy, FaceNet runs with probability p and AgeNet/GenderNet/EmotionNet with p^2 "
        "(they read FaceNet's draw). Policy masa, "
        f"{args.workers} workers, in simulation the store's profiled durations.",
        "",
        "Load: the same arrival times for every context and p, set from the offered load "
        "rho of the oblivious workload (arrival rate x profiled LOAD+EXEC work of one job / "
        "workers); `sim isolated` uses rho 0.05 so that jobs never overlap (each job's own "
        "latency, no queueing).",
        "",
        markdown_table(["scenario", "mode", "rho", "intensity", "inter-arrival s",
                        "oblivious job work s"], load_rows),
        "",
        "Columns: mean job response (arrival to the last of its networks done, skipped "
        "or aborted) per context; best = lowest mean; preempt wasted = LOAD + EXEC time "
        "spent on networks later aborted (report summary.wasted_us) per job, and the "
        "bytes those networks had loaded per job; aborted nets / skipped nets = network "
        "instances aborted (preempt) / skipped (wait) over all jobs; peak reserved (ledger) "
        "and peak measured (anonymous above the baseline + loaded weights, real runs); "
        "over-commits = progress-rule dispatches above the budget.",
        "",
        *analysis_lines(args),
        "![context](bench-context.png)",
        "",
        markdown_table(table_header(contexts), table_rows(results, contexts)),
        "",
    ]
    atomic_write_text(path, "\n".join(lines))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", type=Path, required=True, help="prepared, profiled zoo")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    parser.add_argument("--probabilities", default=",".join(str(p) for p in PROBABILITIES))
    parser.add_argument("--contexts", default=",".join(CONTEXTS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rho", type=float, default=0.6,
                        help="offered load of the oblivious workload (default 0.6)")
    parser.add_argument("--sim-jobs", type=int, default=200, help="jobs per simulated run")
    parser.add_argument("--isolated-jobs", type=int, default=40,
                        help="jobs per isolated (rho 0.05) simulated run (0: none)")
    parser.add_argument("--real-jobs", type=int, default=None,
                        help=f"jobs per real run (default per scenario: {REAL_JOBS})")
    parser.add_argument("--simulate-only", action="store_true", help="skip the real runs")
    parser.add_argument("--real-only", action="store_true", help="skip the simulated runs")
    parser.add_argument("--repeats", type=int, default=1,
                        help="real runs per case (contexts in rotation); the median run "
                             "is reported with the min-max of all (default 1)")
    parser.add_argument("--out", type=Path, default=Path("docs/bench-context.md"))
    parser.add_argument("--json", type=Path, default=None,
                        help="also write every run's figures as JSON here")
    parser.add_argument("--analysis", type=Path, default=None,
                        help="Markdown appended to the doc (the interpretation)")
    parser.add_argument("--from-json", default=None,
                        help="rebuild the doc and plot from --json files (comma-separated; "
                             "their results are concatenated) instead of running")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    contexts = [c for c in args.contexts.split(",") if c]
    if args.from_json:
        files = [json.loads(Path(name).read_text()) for name in args.from_json.split(",")]
        command = "`, then `".join(saved["command"] for saved in files)
        elapsed_s = sum(saved["elapsed_s"] for saved in files)
        results = [entry for saved in files for entry in saved["results"]]
        args.store, args.workers = files[0]["args"]["store"], files[0]["args"]["workers"]
        scenarios = list(dict.fromkeys(e["scenario"] for e in results))
        budgets = list(dict.fromkeys(e["budget"] for e in results))
    else:
        command = "python benchmarks/bench_context.py " + " ".join(
            sys.argv[1:] if argv is None else argv)
        scenarios = [s for s in args.scenarios.split(",") if s]
        budgets = [b for b in args.budgets.split(",") if b]
        probabilities = [float(p) for p in args.probabilities.split(",") if p]
        started_s = time.perf_counter()
        results = run_all(args, scenarios, budgets, probabilities, contexts)
        elapsed_s = time.perf_counter() - started_s
        if args.json:
            atomic_write_text(args.json, json.dumps(
                {"command": command, "elapsed_s": elapsed_s,
                 "args": {"store": str(args.store), "workers": args.workers},
                 "results": results}, indent=1))
    plot(results, scenarios, budgets, contexts, args.out.parent / "bench-context.png")
    write_markdown(args.out, args, command, results, contexts, elapsed_s)
    print(f"wrote {args.out} ({elapsed_s / 60:.1f} min of runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
