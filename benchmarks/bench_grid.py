"""The issue-14 grid: Masa vs its earlier forms vs Bulk vs DeepEye, in simulation.

Owns the acceptance grid of issue 14: scenarios small, mixed, lifelogging,
stochastic1, stochastic2 x budgets 512 MiB, 1 GiB, 2 GiB x offered load 0.3,
0.7, 0.9, 1.1, simulated on the profiled costs of one or more stores (the
arrivals and offered load come from benchmarks/bench_compare.py's
`scenario_jobs`, so rho means the same as there). For each cell it reports
the mean, p90 and p99 job response of every policy, the least mean any schedule
could reach (a lower bound, memory ignored), Masa's progress-rule
over-commits and every policy's peak reserved memory, and says where Masa
(the default policy, job order, batch plan and kept loaded stages included) wins
and loses against the best baseline and against `masa-greedy`
(MasaPolicy(job_order=False): the masa of before issue 14); `masa-nopin` (masa
keeping stages only while all the jobs load fit), `masa-nokeep` (masa
with every job loading its stages, the paper's task model), `masa-noplan` (masa
without its batch plan) and `masa-q1`, `masa-q2`, `masa-q3` (masa whose job order
engages from the first, second or third job with work whatever the page cache
holds, `queue_jobs`; 3 is masa's short-queue rule before 2026-11-27 with two
workers; docs/scheduling.md, "When the job order engages") can be added as columns
(`--policies`). It writes its tables and a PNG into docs/bench-compare.md, between
the grid markers (the rest of that page is left as it is).

Run (one process; about 1-3 s per simulated run on a shared core):
    python benchmarks/bench_grid.py --store mmap=/tmp/zoo1 --store copy=/tmp/zoo1-copy \
        --json docs/bench-data/grid.json
    python benchmarks/bench_grid.py --from-json docs/bench-data/grid.json   # re-render
    python benchmarks/bench_grid.py --store copy=/tmp/zoo1-copy --scaling   # 2 vs 4 workers
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from bench_compare import figure_png, markdown_table, pyplot, scenario_jobs

from masa.common.atomic import atomic_write_bytes, atomic_write_text
from masa.common.units import parse_memory_bytes
from masa.runtime.planning import BatchPlanningPolicy
from masa.runtime.registry import make_policy, weights_copied
from masa.runtime.runner import prepare_run
from masa.runtime.virtual import simulate_graph
from masa.sched.core import Policy
from masa.sched.policies import MasaPolicy
from masa.sched.taskgraph import TaskGraph
from solver.analysis import mean_response_lower_bound_us
from workloads.generation import scenario_path

SCENARIOS = ("small", "mixed", "lifelogging", "stochastic1", "stochastic2")
BUDGETS = ("512MiB", "1GiB", "2GiB")
RHOS = (0.3, 0.7, 0.9, 1.1)
BASELINES = ("bulk", "deepeye")
# Each takes whether the store's LOADs copy their weights (registry.weights_copied),
# which turns masa's batch plan off as `masa run` does.
POLICIES: dict[str, Callable[[bool], Policy]] = {
    # `masa run`'s default: loaded stages kept between jobs while every stage the jobs
    # load fits in the budget (the core bounds KEEP_ALL_BYTES by the budget).
    "masa": lambda copied: make_policy("masa", copied_weights=copied,
                                       keep_loaded_bytes=KEEP_ALL_BYTES),
    # masa keeping stages only while all the jobs load fit (before 2026-11-28): none
    # once they do not, where masa keeps its pinned stages (masa.sched.keeping).
    "masa-nopin": lambda copied: make_policy("masa", copied_weights=copied,
                                             keep_loaded_bytes=KEEP_ALL_BYTES, pin_stages=False),
    # masa as the paper's task model has it: every job loads its stages (--keep-loaded 0).
    "masa-nokeep": lambda copied: make_policy("masa", copied_weights=copied),
    "masa-greedy": lambda copied: MasaPolicy(job_order=False),
    "masa-noplan": lambda copied: make_policy("masa-noplan"),
    "masa-q1": lambda copied: BatchPlanningPolicy(plan_batches=not copied, queue_jobs=1),
    "masa-q2": lambda copied: BatchPlanningPolicy(plan_batches=not copied, queue_jobs=2),
    "masa-q3": lambda copied: BatchPlanningPolicy(plan_batches=not copied, queue_jobs=3),
    "bulk": lambda copied: make_policy("bulk"),
    "deepeye": lambda copied: make_policy("deepeye"),
}
KEEP_ALL_BYTES = 2**62
START, END = "<!-- grid:start -->", "<!-- grid:end -->"
MIB = 2**20


def job_responses_us(graph: TaskGraph, schedule: Sequence[Any],
                     arrivals: dict[int, int]) -> np.ndarray:
    """Each job's response: arrival to the end of its last task."""
    job_of = {task.task_id: task.job_id for task in graph.tasks}
    finish: dict[int, int] = {}
    for entry in schedule:
        job = job_of[entry.task_id]
        finish[job] = max(finish.get(job, 0), entry.end_us)
    return np.array([finish[job] - arrivals[job] for job in arrivals if job in finish],
                    dtype=float)


def run_cell(graph: TaskGraph, arrivals: dict[int, int], policy: str, budget_bytes: int,
             workers: int, copied_weights: bool = False) -> dict[str, Any]:
    result = simulate_graph(graph, policy=POLICIES[policy](copied_weights), workers=workers,
                            memory_budget_bytes=budget_bytes)
    responses = job_responses_us(graph, result.schedule, arrivals)
    return {"mean_us": float(responses.mean()),
            "p90_us": float(np.percentile(responses, 90)),
            "p99_us": float(np.percentile(responses, 99)),
            "makespan_us": result.makespan_us,
            "over_commits": len(result.over_commits),
            "peak_reserved_bytes": result.peak_reserved_bytes}


def run_grid(store: Path, label: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    cells = []
    for scenario in args.scenarios:
        for rho in args.rhos:
            _, jobs, info = scenario_jobs(store, scenario, rho, args.jobs, 2)
            prepared = prepare_run(scenario_path(scenario), store, "oblivious", jobs=jobs)
            arrivals = {job.job_id: job.arrival_us for job in jobs}
            # No schedule's mean is lower, whatever the budget (solver.analysis).
            bound_us = mean_response_lower_bound_us(prepared.graph, args.workers)
            for budget in args.budgets:
                started_s = time.perf_counter()
                figures = {policy: run_cell(prepared.graph, arrivals, policy,
                                            parse_memory_bytes(budget), args.workers,
                                            weights_copied(prepared.manifests))
                           for policy in args.policies}
                cells.append({"store": label, "scenario": scenario, "budget": budget,
                              "rho": rho, "jobs": len(jobs), "workers": args.workers,
                              "intensity": info.intensity, "bound_us": bound_us,
                              "policies": figures})
                print(f"{label} {scenario} {budget} rho {rho}: " + ", ".join(
                    f"{p} {f['mean_us'] / 1e3:.0f} ms ({f['over_commits']} oc)"
                    for p, f in figures.items())
                    + f" [{time.perf_counter() - started_s:.1f} s]", flush=True)
    return cells


def verdict(cell: dict[str, Any]) -> dict[str, Any]:
    """Masa against the best baseline and against masa-greedy in one cell."""
    figures = cell["policies"]
    budget_bytes = parse_memory_bytes(cell["budget"])
    present = [b for b in BASELINES if b in figures]
    best = min(present, key=lambda b: figures[b]["mean_us"])
    within = all(figures[b]["peak_reserved_bytes"] <= budget_bytes for b in present)
    ratio = figures["masa"]["mean_us"] / figures[best]["mean_us"]
    greedy = figures.get("masa-greedy")
    return {"best": best, "ratio": ratio, "baselines_within_budget": within,
            "vs_greedy": None if greedy is None else figures["masa"]["mean_us"]
            / greedy["mean_us"],
            "vs_bulk": figures["masa"]["mean_us"] / figures["bulk"]["mean_us"]
            if "bulk" in figures else None,
            # Masa's mean against the least any schedule could reach (None: not recorded).
            "vs_bound": figures["masa"]["mean_us"] / cell["bound_us"]
            if cell.get("bound_us") else None}


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * (ratio - 1):+.0f}%"


def grid_rows(cells: Sequence[dict[str, Any]], policies: Sequence[str]) -> list[list[str]]:
    rows = []
    for cell in cells:
        figures = cell["policies"]
        judged = verdict(cell)
        row = [cell["scenario"], cell["budget"], f"{cell['rho']:.1f}"]
        row += [f"{figures[p]['mean_us'] / 1e3:.0f}" for p in policies]
        row.append("-" if judged["vs_bound"] is None else
                   f"{cell['bound_us'] / 1e3:.0f} ({judged['vs_bound']:.2f}x)")
        row += [f"{figures['masa']['p90_us'] / 1e3:.0f} / {figures['masa']['p99_us'] / 1e3:.0f}",
                f"{figures[judged['best']]['p90_us'] / 1e3:.0f} / "
                f"{figures[judged['best']]['p99_us'] / 1e3:.0f}",
                f"{judged['best']} {_pct(judged['ratio'])}"
                + ("" if judged["baselines_within_budget"] else " (over budget)"),
                _pct(judged["vs_greedy"]),
                f"{figures['masa']['over_commits']}",
                " / ".join(f"{figures[p]['peak_reserved_bytes'] / MIB:.0f}" for p in policies)]
        rows.append(row)
    return rows


def summary_lines(cells: Sequence[dict[str, Any]]) -> list[str]:
    """Where Masa wins and loses, counted over a store's cells."""
    judged = [(cell, verdict(cell)) for cell in cells]
    wins = [c for c, v in judged if v["ratio"] <= 1.0]
    loses_5 = [(c, v) for c, v in judged if v["ratio"] > 1.05]
    honest = [(c, v) for c, v in judged if v["baselines_within_budget"]]
    honest_losses = [(c, v) for c, v in honest if v["ratio"] > 1.0]
    over = [c for c in cells if c["policies"]["masa"]["over_commits"]]
    greedy = [v["vs_greedy"] for _, v in judged if v["vs_greedy"] is not None]
    bulk_targets = [(c, v) for c, v in judged if c["rho"] in (0.7, 0.9)
                    and c["budget"] in ("512MiB", "1GiB") and v["vs_bulk"] is not None]
    lines = [
        f"- Masa's mean response at most the best baseline's: {len(wins)} of {len(cells)} cells;"
        f" worse by more than 5%: {len(loses_5)}"
        + (" (" + "; ".join(f"{c['scenario']} {c['budget']} rho {c['rho']}: "
                            f"{_pct(v['ratio'])} vs {v['best']}" for c, v in loses_5) + ")"
           if loses_5 else "") + ".",
        f"- Cells where both baselines stay within the budget: {len(honest)}; Masa loses in "
        f"{len(honest_losses)} of them"
        + (" (" + "; ".join(f"{c['scenario']} {c['budget']} rho {c['rho']} "
                            f"{_pct(v['ratio'])}" for c, v in honest_losses) + ")"
           if honest_losses else "") + ".",
        f"- Cells with a progress-rule over-commit by Masa: {len(over)}"
        + (" (" + ", ".join(f"{c['scenario']} {c['budget']} rho {c['rho']}: "
                            f"{c['policies']['masa']['over_commits']}" for c in over) + ")"
           if over else "") + ".",
    ]
    if greedy:
        better = sum(r < 0.995 for r in greedy)
        worse = [r for r in greedy if r > 1.005]
        lines.append(f"- Against today's greedy masa: better in {better} cells, within 0.5% in "
                     f"{len(greedy) - better - len(worse)}, worse in {len(worse)}"
                     + (f" (at most {_pct(max(worse))})" if worse else "")
                     + f"; geometric mean ratio {float(np.exp(np.mean(np.log(greedy)))):.2f}.")
    if bulk_targets:
        lines.append(_bulk_target_line(bulk_targets))
    bounded = [v["vs_bound"] for _, v in judged if v["vs_bound"] is not None]
    if bounded:
        lines.append(f"- Masa's mean / the bound (the least mean any schedule loading every "
                     "job's stages could reach, memory ignored): median "
                     f"{float(np.median(bounded)):.2f}x, "
                     f"within 1.25x in {sum(r <= 1.25 for r in bounded)} of {len(bounded)} "
                     "cells.")
    return lines


def _bulk_target_line(targets: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> str:
    """Masa at most 0.3x Bulk's mean at rho 0.7-0.9 and 512 MiB-1 GiB: where it
    is not, whether any schedule of the paper's task graph could be (0.3x Bulk's mean
    above the bound); kept stages skip LOADs, which that bound counts."""
    worst = max(targets, key=lambda cv: cv[1]["vs_bulk"])
    missed = [(c, v) for c, v in targets if v["vs_bulk"] > 0.3]
    line = (f"- Masa / Bulk at rho 0.7-0.9 and 512 MiB-1 GiB: at most {worst[1]['vs_bulk']:.2f}x"
            f" ({worst[0]['scenario']} {worst[0]['budget']} rho {worst[0]['rho']}); above "
            f"0.3x in {len(missed)} of {len(targets)} cells")
    if not missed:
        return line + "."
    parts = []
    for cell, judged in missed:
        bulk_us = cell["policies"]["bulk"]["mean_us"]
        bound_us = cell.get("bound_us")
        reach = ""
        if bound_us is not None:
            reach = (" (no schedule loading every job's stages can: bound "
                     if 0.3 * bulk_us < bound_us else " (bound ") \
                + f"{bound_us / bulk_us:.2f}x)"
        parts.append(f"{cell['scenario']} {cell['budget']} rho {cell['rho']}: "
                     f"{judged['vs_bulk']:.2f}x{reach}")
    return line + " (" + "; ".join(parts) + ")."


def grid_plot(cells: Sequence[dict[str, Any]], path: Path) -> None:
    """Heat maps of Masa / best baseline and Masa / greedy masa, one row per store."""
    plt = pyplot()
    stores = list(dict.fromkeys(c["store"] for c in cells))
    figure, axes = plt.subplots(len(stores), 2, squeeze=False,
                                figsize=(12, 2.6 * len(stores) + 0.6))
    for row, store in enumerate(stores):
        mine = [c for c in cells if c["store"] == store]
        scenarios = list(dict.fromkeys(c["scenario"] for c in mine))
        columns = list(dict.fromkeys((c["budget"], c["rho"]) for c in mine))
        for column, key in enumerate(("ratio", "vs_greedy")):
            grid = np.full((len(scenarios), len(columns)), np.nan)
            for cell in mine:
                value = verdict(cell)[key]
                if value is not None:
                    grid[scenarios.index(cell["scenario"]),
                         columns.index((cell["budget"], cell["rho"]))] = np.log2(value)
            axis = axes[row][column]
            image = axis.imshow(grid, cmap="RdYlGn_r", vmin=-3, vmax=3, aspect="auto")
            axis.set_yticks(range(len(scenarios)), scenarios, fontsize=7)
            axis.set_xticks(range(len(columns)), [f"{b}\n{r}" for b, r in columns], fontsize=6)
            for (i, j), value in np.ndenumerate(grid):
                if not np.isnan(value):
                    axis.text(j, i, f"{2 ** value:.2f}", ha="center", va="center", fontsize=6)
            axis.set_title(f"{store}: masa / "
                           + ("best baseline" if key == "ratio" else "greedy masa"), fontsize=9)
            figure.colorbar(image, ax=axis, label="log2 ratio")
    figure.tight_layout()
    atomic_write_bytes(path, figure_png(figure))


def scaling_lines(cells: Sequence[dict[str, Any]]) -> list[str]:
    """2 -> 4 workers on the same arrivals: mean response change per policy."""
    rows = []
    keys = sorted({(c["store"], c["scenario"], c["budget"], c["rho"]) for c in cells})
    # The policies run with both worker counts (a 2-worker grid may have more).
    policies = [p for p in next((c["policies"] for c in cells if c["workers"] == 4), {})
                if all(p in c["policies"] for c in cells)]
    for key in keys:
        by_workers = {c["workers"]: c for c in cells
                      if (c["store"], c["scenario"], c["budget"], c["rho"]) == key}
        if 2 not in by_workers or 4 not in by_workers:
            continue
        row = [*key[:3], f"{key[3]:.1f}"]
        for policy in policies:
            two = by_workers[2]["policies"][policy]["mean_us"]
            four = by_workers[4]["policies"][policy]["mean_us"]
            row.append(f"{two / 1e3:.0f} -> {four / 1e3:.0f} ({100 * (four / two - 1):+.0f}%)")
        rows.append(row)
    return [markdown_table(["store", "scenario", "budget", "rho (2 workers)"]
                           + [f"{p} mean ms, 2 -> 4 workers" for p in policies], rows)]


def section(saved: dict[str, Any], png_name: str, analysis: str = "") -> str:
    cells = saved["cells"]
    policies = saved["policies"]
    lines = [START, "", "## The issue-14 grid (simulation): job order, slicing, 2 -> 4 workers",
             "", f"Produced by `{saved['command']}` ({saved['elapsed_s'] / 60:.1f} min); "
             "re-rendered with `python benchmarks/bench_grid.py --from-json "
             "docs/bench-data/grid.json --analysis docs/bench-data/grid-analysis.md` (the "
             "figures and this page's analysis, kept in the repository).", "",
             "Each cell simulates the same jobs (offered load rho as in the tables below: "
             "arrival rate x expected profiled job work / 2 workers) under every policy on "
             "the store's profiled costs. `masa` is the default policy after issue 14 (the job "
             "order engages once more jobs than workers have work; a job of several "
             "networks that finds the executor empty runs in a planned order; loaded "
             "stages are kept between jobs, all of them while they fit in the budget, "
             "else the pinned ones, docs/scheduling.md \"Kept loaded stages\"); "
             "`masa-nopin` keeps nothing once they do not fit (masa before 2026-11-28); "
             "`masa-nokeep` is masa "
             "with every job loading its stages, as in the paper's task model; "
             "`masa-noplan` is masa without the batch plan; `masa-greedy` is masa "
             "before all three (`MasaPolicy(job_order=False)`). Columns: mean response per "
             "policy (ms); the bound: the least mean any schedule of the paper's task graph "
             "(every job loads its stages) could reach on these jobs, memory "
             "ignored (each job alone: its longest chain of tasks and its work over the "
             "workers; all jobs: shortest remaining work first on one machine as fast as the "
             "workers together; `solver.analysis.mean_response_lower_bound_us`), and Masa's "
             "mean over it (below 1 where kept stages skip LOADs); p90 / p99 of Masa and of "
             "the best baseline (the faster of Bulk and "
             "DeepEye); Masa vs that baseline (`(over budget)`: a baseline's reserved peak "
             "exceeded the budget, which this emulation does not penalise); Masa vs greedy "
             "masa; Masa's progress-rule over-commits; peak reserved MiB per policy.", "",
             f"![grid]({png_name})", ""]
    if analysis:
        lines += [analysis.rstrip(), ""]
    for store, path in saved["stores"].items():
        mine = [c for c in cells if c["store"] == store and c["workers"] == 2
                and set(policies) <= set(c["policies"])]
        if not mine:
            continue
        lines += [f"### Store `{store}` ({path}), {mine[0]['jobs']} jobs per cell", "",
                  *summary_lines(mine), "",
                  markdown_table(["scenario", "budget", "rho"]
                                 + [f"{p} mean ms" for p in policies]
                                 + ["bound ms (masa / bound)", "masa p90 / p99 ms",
                                    "best baseline p90 / p99 ms",
                                    "masa vs best baseline", "masa vs greedy",
                                    "masa over-commits",
                                    "peak rsv MiB " + " / ".join(policies)],
                                 grid_rows(mine, policies)), ""]
    scaling = [c for c in cells if c["workers"] == 4]
    if scaling:
        lines += ["### Workers: 2 -> 4 on the same arrivals", "",
                  *scaling_lines([c for c in cells if any(
                      (s["store"], s["scenario"], s["budget"], s["rho"])
                      == (c["store"], c["scenario"], c["budget"], c["rho"]) for s in scaling)]),
                  ""]
    lines.append(END)
    return "\n".join(lines)


def write_doc(doc: Path, text: str) -> None:
    """Replace the grid section of the page (or put it after the title)."""
    page = doc.read_text() if doc.is_file() else "# Policy comparison\n"
    if START in page and END in page:
        page = page[:page.index(START)] + text + page[page.index(END) + len(END):]
    else:
        title_end = page.index("\n") + 1
        page = page[:title_end] + "\n" + text + "\n" + page[title_end:]
    atomic_write_text(doc, page)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", action="append", default=[], metavar="LABEL=DIR",
                        help="a prepared, profiled zoo (repeatable)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    parser.add_argument("--rhos", default=",".join(str(r) for r in RHOS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--jobs", type=int, default=100, help="jobs per cell (default 100)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--scaling", action="store_true",
                        help="also run every cell with 4 workers on the same arrivals")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--merge-json", type=Path, default=None,
                        help="add this earlier --json file's cells to the page")
    parser.add_argument("--from-json", type=Path, default=None, help="re-render only")
    parser.add_argument("--out", type=Path, default=Path("docs/bench-compare.md"))
    parser.add_argument("--analysis", type=Path, default=None,
                        help="Markdown placed before the tables (the interpretation)")
    args = parser.parse_args(argv)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    args.budgets = [b for b in args.budgets.split(",") if b]
    args.rhos = [float(r) for r in args.rhos.split(",") if r]
    args.policies = [p for p in args.policies.split(",") if p]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
    else:
        stores = dict(item.split("=", 1) for item in args.store)
        started_s = time.perf_counter()
        cells: list[dict[str, Any]] = []
        for label, path in stores.items():
            cells += run_grid(Path(path), label, args)
            if args.scaling:
                four = argparse.Namespace(**{**vars(args), "workers": 4})
                cells += run_grid(Path(path), label, four)
        saved = {"command": "python benchmarks/bench_grid.py " + " ".join(
                     sys.argv[1:] if argv is None else argv),
                 "elapsed_s": time.perf_counter() - started_s, "stores": stores,
                 "policies": args.policies, "cells": cells}
        if args.json:
            atomic_write_text(args.json, json.dumps(saved, indent=1))
    if args.merge_json:
        earlier = json.loads(args.merge_json.read_text())
        saved = {**saved, "stores": {**earlier["stores"], **saved["stores"]},
                 "cells": earlier["cells"] + saved["cells"],
                 "command": f"{earlier['command']}; {saved['command']}",
                 "elapsed_s": earlier["elapsed_s"] + saved["elapsed_s"]}
    png = args.out.parent / "bench-compare-grid.png"
    grid_plot([c for c in saved["cells"] if c["workers"] == 2
               and set(saved["policies"]) <= set(c["policies"])], png)
    analysis = args.analysis.read_text() if args.analysis else ""
    write_doc(args.out, section(saved, png.name, analysis))
    for store in saved["stores"]:
        mine = [c for c in saved["cells"] if c["store"] == store and c["workers"] == 2
                and set(saved["policies"]) <= set(c["policies"])]
        if mine:
            print(store, *summary_lines(mine), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
