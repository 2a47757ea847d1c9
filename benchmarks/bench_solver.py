"""Benchmark of the CP-SAT solver against the `masa` and `masa-plan` heuristics (issue 5).

Sections (run all, or name some on the command line):
- fig13a: the paper's Fig. 13(a) experiment, two 4-layer networks with load,
  exec and unload tasks (24 tasks), workers 1..6: optimal vs heuristic.
- random: 50 seeded random instances of 16-48 tasks at three memory
  tightnesses: heuristic/optimal ratio, median and worst, and the worst case.
- scaling: memory-tight instances of growing size, 60 s each: proven or gap;
  the solver without backward search and probing, and the plain model (no
  symmetry breaking, redundant constraints, cumulative flags), alongside at
  the sizes where it matters.
- proofs: fifteen 80-task memory-tight instances of two shapes, 60 s each:
  how many are proven optimal.

Prints its figures and writes docs/bench-solver.md plus PNG plots. Timings
were taken on a 2-core machine shared with other jobs: solve times are upper
bounds of what the solver needs alone.

    python benchmarks/bench_solver.py [fig13a] [random] [scaling] [proofs] [--quick]
    python benchmarks/bench_solver.py report   # Markdown from bench-solver.json only
    python benchmarks/bench_solver.py heuristics   # after a policy change: both
        # heuristics again on the fig13a and random instances, against the stored optima
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from masa.common.atomic import atomic_write_text
from solver.evaluation import Evaluation, check, evaluate, run_heuristic
from solver.gantt import write_gantt
from solver.instance import Instance, RandomSpec, random_instance
from solver.options import SolveOptions
from solver.schedules import schedule_makespan

DOCS = Path(__file__).resolve().parent.parent / "docs"
RESULTS = DOCS / "bench-solver.json"  # raw figures, so sections can be rerun separately
SEARCH_WORKERS = 2


def _evaluate(instance: Instance, time_limit_s: float, policy: str = "masa",
              heuristic_run: Any = None, **overrides: Any) -> Evaluation:
    options = SolveOptions(time_limit_s=time_limit_s, search_workers=SEARCH_WORKERS, seed=0)
    return evaluate(instance, replace(options, **overrides), policy=policy,
                    heuristic_run=heuristic_run)


def _heuristic_fields(instance: Instance, best: int | None, bound: int | None,
                      planned: Any = None, plan_s: float | None = None) -> dict[str, Any]:
    """The heuristics' makespans on `instance` (masa, the default; masa-noplan, its
    greedy rule alone; masa-plan) and their ratios to `best` (and masa's to `bound`);
    `planned`: masa-plan's run if already made, in `plan_s` seconds."""
    if planned is None:
        start_s = time.perf_counter()
        planned = run_heuristic(instance, "masa-plan")
        plan_s = time.perf_counter() - start_s
    start_s = time.perf_counter()
    default = run_heuristic(instance, "masa")
    masa_s = time.perf_counter() - start_s
    greedy = run_heuristic(instance, "masa-noplan")
    fields: dict[str, Any] = {"plan_s": round(plan_s or 0.0, 2), "masa_s": round(masa_s, 3)}
    for (schedule, over_commits), makespan_key, prefix in ((default, "heuristic", ""),
                                                           (greedy, "greedy", "greedy_"),
                                                           (planned, "plan", "plan_")):
        makespan = schedule_makespan(schedule)
        fields |= {makespan_key: makespan,
                   f"{prefix}over_commits": len(over_commits),
                   f"{prefix}ratio": makespan / best if best else None,
                   f"{makespan_key}_check": check(instance, schedule, over_commits) or []}
    fields["ratio_max"] = fields["heuristic"] / bound if bound else None
    return fields


def rerun_heuristics(results: dict[str, Any]) -> None:
    """The heuristics again on the stored fig13a and random instances (after a policy
    change), against the optima stored with them: no solving."""
    for section, spec_of in (
            ("fig13a", lambda row: _fig13a_spec(row["load_ratio"], row["workers"])),
            ("random", lambda row: RandomSpec(**row["spec"]))):
        for row in results.get(section, {}).get("rows", []):
            instance = random_instance(spec_of(row))
            assert instance.name == row["instance"], (instance.name, row["instance"])
            row |= _heuristic_fields(instance, row["best"], row["bound"])
            print(f"{section} {row['instance']}: masa {row['heuristic']} "
                  f"({_fmt(row['ratio'])}) masa-plan {row['plan']} "
                  f"({_fmt(row['plan_ratio'])})", flush=True)


def _evaluate_both(instance: Instance, time_limit_s: float) -> dict[str, Any]:
    """The solver (hinted by masa-plan's schedule) next to both heuristics: a row."""
    start_s = time.perf_counter()
    planned = run_heuristic(instance, "masa-plan")
    plan_s = time.perf_counter() - start_s
    evaluation = _evaluate(instance, time_limit_s, policy="masa-plan", heuristic_run=planned)
    result = evaluation.result
    # masa (greedy) is the first heuristic of every table; masa-plan hinted the solver.
    return _row(evaluation) | _heuristic_fields(instance, result.makespan_us, result.bound,
                                                planned, plan_s)


def _row(evaluation: Evaluation) -> dict[str, Any]:
    result = evaluation.result
    return {"instance": evaluation.instance.name, "tasks": evaluation.instance.num_tasks,
            "workers": evaluation.instance.workers, "memory": evaluation.instance.memory,
            "status": result.status, "best": result.makespan_us, "bound": result.bound,
            "gap": result.gap, "time_s": round(result.solve_time_s, 2),
            "dtime": round(result.deterministic_time, 2), "load": round(os.getloadavg()[0], 1),
            "heuristic": evaluation.heuristic_makespan_us,
            "over_commits": len(evaluation.heuristic_over_commits),
            "ratio": evaluation.ratio, "ratio_max": evaluation.ratio_max,
            "hint": result.hint_used, "solver_check": list(evaluation.solver_problems)}


def _fig13a_spec(load_ratio: float, workers: int) -> RandomSpec:
    """The paper's Fig. 13(a) setting: two 4-layer networks with unload tasks."""
    return RandomSpec(networks=2, layers=4, seed=1, workers=workers, tightness=1.5,
                      load_ratio=load_ratio, unload=True)


def bench_fig13a(quick: bool) -> dict[str, Any]:
    rows = []
    for load_ratio in (1.0, 4.0):
        for workers in range(1, 7):
            instance = random_instance(_fig13a_spec(load_ratio, workers))
            row = _evaluate_both(instance, 10.0 if quick else 60.0) | {"load_ratio": load_ratio}
            rows.append(row)
            print(f"fig13a load_ratio={load_ratio} workers={workers}: {row['status']} "
                  f"opt={row['best']} masa={row['heuristic']} ({_fmt(row['ratio'])}) "
                  f"masa-plan={row['plan']} ({_fmt(row['plan_ratio'])}) "
                  f"over_commits={row['over_commits']} {row['time_s']} s", flush=True)
            if load_ratio == 4.0 and workers == 2:  # the worst case of masa here
                _gantts(instance, "bench-solver-fig13a",
                        f"Fig. 13(a) instance, load ratio 4, {workers} workers")
    return {"rows": rows}


TIGHTNESS = {"tight": 1.2, "medium": 1.6, "loose": 4.0}


def _random_specs(count: int) -> list[RandomSpec]:
    """`count` instance shapes of 16-48 tasks, cycling networks, layers, workers, loads."""
    shapes = [(n, layers) for n in (2, 3, 4) for layers in range(2, 9)
              if 16 <= n * layers * 2 <= 48]
    specs = []
    for index in range(count):
        networks, layers = shapes[index % len(shapes)]
        specs.append(RandomSpec(networks=networks, layers=layers, seed=1000 + index,
                                workers=2 + index % 2, load_ratio=(1.0, 4.0)[index // 2 % 2]))
    return specs


def bench_random(quick: bool) -> dict[str, Any]:
    count = 10 if quick else 50
    rows = []
    for label, tightness in TIGHTNESS.items():
        for spec in _random_specs(count):
            instance = random_instance(replace(spec, tightness=tightness))
            row = _evaluate_both(instance, 5.0 if quick else 20.0) | {
                "tightness": label, "spec": spec.__dict__ | {"tightness": tightness}}
            rows.append(row)
            print(f"random {label} {instance.name} ({row['tasks']} tasks, "
                  f"{row['workers']} workers): {row['status']} opt={row['best']} "
                  f"masa={row['heuristic']} ({_fmt(row['ratio'])}) masa-plan={row['plan']} "
                  f"({_fmt(row['plan_ratio'])}, planned in {row['plan_s']} s) "
                  f"over={row['over_commits']} {row['time_s']} s", flush=True)
    return {"rows": rows}


SCALING_SHAPES = [(2, 6), (3, 6), (4, 6), (4, 8), (4, 10), (5, 12), (6, 14), (8, 15)]


def _scaling_specs(quick: bool) -> list[tuple[str, RandomSpec, tuple[str, ...]]]:
    """(family, spec, models to run) for the scaling table."""
    specs: list[tuple[str, RandomSpec, tuple[str, ...]]] = []
    for networks, layers in SCALING_SHAPES[:4] if quick else SCALING_SHAPES:
        tasks = networks * layers * 2
        for seed in (1, 2) if tasks <= 80 else (1,):
            spec = RandomSpec(networks=networks, layers=layers, seed=seed, tightness=1.2)
            compare = 48 <= tasks <= 80 and seed == 1
            specs.append(("distinct", spec, SCALING_MODELS if compare else ("full",)))
    for networks, layers in ((4, 10), (8, 15)):
        base = RandomSpec(networks=networks, layers=layers, seed=1, tightness=1.2)
        models = ("full", "plain") if networks * layers <= 40 else ("full",)
        # The same networks in every job (a burst of identical jobs).
        specs.append(("identical", replace(base, identical=True), models))
        # Jobs arriving one by one at ~80% load: decomposition by release time.
        work = sum(t.duration_us for t in random_instance(base).graph.tasks)
        gap = round(1.25 * work / networks / base.workers)
        specs.append(("arrivals", replace(base, release_gap=gap), models))
    return specs


# The models compared: `full` = the defaults (backward set-times search and
# lower-bound probing up to PROOF_MAX_TASKS tasks, list-schedule hints,
# redundant constraints, symmetry breaking, decomposition); `forward` = the
# same without backward search and probing (the solver before them);
# `plain` = the heuristic's (or a serial) hint and nothing else.
SCALING_MODELS = ("full", "forward", "plain")
_MODEL_OVERRIDES: dict[str, dict[str, Any]] = {
    "full": {},
    "forward": {"direction": "forward", "probe": False},
    "plain": {"symmetry_breaking": False, "redundant": False, "decompose": False,
              "list_hints": False, "search": "default", "direction": "forward",
              "probe": False},
}


def _scaling_row(section: str, family: str, spec: RandomSpec, model: str,
                 time_limit_s: float) -> dict[str, Any]:
    instance = random_instance(spec)
    work = sum(t.duration_us for t in instance.graph.tasks)
    evaluation = _evaluate(instance, time_limit_s, **_MODEL_OVERRIDES[model])
    row = _row(evaluation) | {
        "model": model, "seed": spec.seed, "family": family,
        "shape": f"{spec.networks}x{spec.layers}",
        "work_bound": -(-work // instance.workers),
        "start_ub": evaluation.result.hint_objective,
        "hint_source": evaluation.hint_source, "probes": evaluation.result.probes,
        "direction": evaluation.result.direction}
    print(f"{section} {family} {model} {instance.name} ({row['tasks']} tasks): "
          f"{row['status']} best={row['best']} bound={row['bound']} "
          f"start_ub={row['start_ub']} gap={row['gap']} {row['time_s']} s "
          f"probes={row['probes']} dtime={row['dtime']} load={row['load']}", flush=True)
    return row


def bench_scaling(quick: bool) -> dict[str, Any]:
    return {"rows": [_scaling_row("scaling", family, spec, model, 10.0 if quick else 60.0)
                     for family, spec, models in _scaling_specs(quick) for model in models]}


# 80-task memory-tight instances (the target size) of two shapes:
# four 10-layer networks and eight 5-layer ones, ten and five seeds.
PROOF_SHAPES = ((4, 10, range(1, 11)), (8, 5, range(1, 6)))
PROOF_FORWARD_SEEDS = 3  # the solver before backward search and probing, for comparison


def bench_proofs(quick: bool) -> dict[str, Any]:
    rows = []
    for networks, layers, seeds in PROOF_SHAPES:
        for seed in list(seeds)[:2] if quick else seeds:
            spec = RandomSpec(networks=networks, layers=layers, seed=seed, tightness=1.2)
            models = ("full", "forward") if (networks, layers) == (4, 10) and \
                seed <= PROOF_FORWARD_SEEDS else ("full",)
            rows += [_scaling_row("proofs", "distinct", spec, model, 10.0 if quick else 60.0)
                     for model in models]
    return {"rows": rows}


# ---------------------------------------------------------------- report

def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _fig13a_md(data: dict[str, Any]) -> list[str]:
    lines = ["## Paper Fig. 13(a): two 4-layer networks, load/exec/unload (24 tasks)", "",
             "Random layer costs (seed 1), memory budget 1.5x the largest single need, "
             "load times ~ exec times (load_ratio 1) or Raspberry-Pi-like loads "
             "(load_ratio 4). `masa` = the default policy (greedy, with a light plan "
             "for a batch arriving at an empty executor), `masa-noplan` = its greedy rule "
             "alone (the default before), `masa-plan` = masa's memory "
             "rules in an order planned by local search (masa.runtime.planning); `over` = tasks "
             "masa ran over budget (progress rule).", "",
             "| load ratio | workers | status | optimal | masa | ratio | masa-noplan | ratio "
             "| masa-plan | ratio | over | solve s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| {row['load_ratio']:g} | {row['workers']} | {row['status']} | "
                     f"{_fmt(row['best'])} | {_fmt(row['heuristic'])} | "
                     f"{_fmt(row['ratio'])} | {_fmt(row.get('greedy'))} | "
                     f"{_fmt(row.get('greedy_ratio'))} | {_fmt(row.get('plan'))} | "
                     f"{_fmt(row.get('plan_ratio'))} | {row['over_commits']} | "
                     f"{row['time_s']} |")
    for key, name, over_key in (("ratio", "masa", "over_commits"),
                                ("greedy_ratio", "masa-noplan", "greedy_over_commits"),
                                ("plan_ratio", "masa-plan", "plan_over_commits")):
        valid = [r[key] for r in data["rows"] if r.get(key) and r["status"] == "OPTIMAL"
                 and not r.get(over_key)]
        if valid:
            lines += ["", f"Worst ratio of {name} (within budget): {max(valid):.3f} "
                          f"(paper's heuristic: 1.22 at 4 workers)."]
    lines += ["", "Load ratio 4, 2 workers (masa's worst case here):", "",
              "![optimal](bench-solver-fig13a-optimal.png)",
              "![masa](bench-solver-fig13a-heuristic.png)",
              "![masa-plan](bench-solver-fig13a-plan.png)", ""]
    return lines


def _ratios(rows: list[dict[str, Any]], key: str, over_key: str) -> list[float]:
    """Ratios over the proven instances where the heuristic stayed within the budget."""
    return [r[key] for r in rows if r["status"] == "OPTIMAL" and r.get(key)
            and not r[over_key]]


def _random_md(data: dict[str, Any]) -> list[str]:
    rows = data["rows"]
    lines = ["## Optimality ratio on seeded random instances (16-48 tasks)", "",
             "Per tightness: budget = tightness x the largest single need. Ratio = "
             "heuristic makespan / optimal makespan over the instances where the solver "
             "proved optimality and the heuristic stayed within the budget. "
             "Targets: masa-plan median <= 1.05, worst <= 1.15 (issue 5); the default "
             "policy median <= 1.10, worst <= 1.25 (issue 14). The solver's hint is "
             "masa-plan's schedule (or a better list schedule of the solver's own). `masa` "
             "is the default policy as it is now (docs/scheduling.md): greedy, with its "
             "job order, plus a light plan of a batch that arrives at an empty executor "
             "(all of these instances), followed only where it beats the greedy rule; "
             "`masa ms` is its median time per instance, plan included, in the simulator. "
             "`masa-noplan` is the greedy rule alone (the default before). "
             "`python benchmarks/bench_solver.py heuristics` re-runs the heuristics on "
             "the stored instances against the stored optima after a policy change.", "",
             "| tightness | instances | proven | masa over budget | masa median | masa worst "
             "| masa ms | masa-noplan median | masa-noplan worst "
             "| masa-plan median | masa-plan worst | median plan s | median solve s "
             "| max solve s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, tightness in TIGHTNESS.items():
        subset = [r for r in rows if r["tightness"] == label]
        if not subset:
            continue
        proven = [r for r in subset if r["status"] == "OPTIMAL"]
        greedy = _ratios(subset, "ratio", "over_commits")
        noplan = _ratios(subset, "greedy_ratio", "greedy_over_commits")
        planned = _ratios(subset, "plan_ratio", "plan_over_commits")
        over = sum(1 for r in subset if r["over_commits"])
        times = [r["time_s"] for r in subset]
        plan_times = [r["plan_s"] for r in subset if "plan_s" in r]
        masa_ms = [1000 * r["masa_s"] for r in subset if "masa_s" in r]
        lines.append(f"| {label} ({tightness:g}) | {len(subset)} | {len(proven)} | {over} | "
                     f"{_fmt(statistics.median(greedy) if greedy else None)} | "
                     f"{_fmt(max(greedy) if greedy else None)} | "
                     f"{_fmt(statistics.median(masa_ms) if masa_ms else None, 1)} | "
                     f"{_fmt(statistics.median(noplan) if noplan else None)} | "
                     f"{_fmt(max(noplan) if noplan else None)} | "
                     f"{_fmt(statistics.median(planned) if planned else None)} | "
                     f"{_fmt(max(planned) if planned else None)} | "
                     f"{_fmt(statistics.median(plan_times) if plan_times else None, 2)} | "
                     f"{statistics.median(times):.2f} | {max(times):.2f} |")
    for key, over_key, name, makespan_key in (
            ("ratio", "over_commits", "masa", "heuristic"),
            ("greedy_ratio", "greedy_over_commits", "masa-noplan", "greedy"),
            ("plan_ratio", "plan_over_commits", "masa-plan", "plan")):
        valid = [r for r in rows if r["status"] == "OPTIMAL" and r.get(key)
                 and not r.get(over_key)]
        if not valid:
            continue
        worst = max(valid, key=lambda r: r[key])
        heuristic = worst[makespan_key]
        lines += ["", f"Worst case of {name}: `{worst['instance']}` ({worst['tasks']} tasks, "
                      f"{worst['workers']} workers, memory {worst['memory']}): optimal "
                      f"{worst['best']}, {name} {heuristic}, ratio {worst[key]:.3f}. "
                      f"Reproduce with `masa-optimal --policy {name} --random "
                      + ",".join(f"{k}={int(v) if isinstance(v, bool) else v}"
                                 for k, v in worst["spec"].items())
                      + " --gantt out.png`."]
    lines += ["", "masa's worst case:", "",
              "![worst optimal](bench-solver-worst-optimal.png)",
              "![worst masa](bench-solver-worst-heuristic.png)",
              "![worst masa-plan](bench-solver-worst-plan.png)", ""]
    return lines


def _scaling_md(data: dict[str, Any]) -> list[str]:
    lines = ["## Memory-tight instances (tightness 1.2) of growing size, 60 s limit", "",
             "`full` = this solver with its defaults: list-schedule hints "
             "(solver/list_schedule.py: serial schedule generation with several priority "
             "rules and forward-backward improvement, the best one checked by "
             "masa.sched.checker), symmetry breaking, conflict-clique no-overlaps, energy and "
             "release bounds, stronger cumulative propagation, decomposition by release "
             "time, and up to 128 tasks (solver.search.PROOF_MAX_TASKS) backward set-times "
             "search and lower-bound probing; `forward` = the same without backward search "
             "and probing (set-times search forward up to 64 tasks, CP-SAT's default "
             "portfolio above: the solver before them); `plain` = the heuristic's (or a "
             "serial) hint and none of the rest.", "",
             "Families: `distinct` = different random networks, all released at 0; "
             "`identical` = copies of one network (symmetry breaking applies); "
             "`arrivals` = one network per job, jobs released at ~80% load "
             "(decomposition by release time applies).", "",
             "`work` = the work bound ceil(work / workers); `start` = the upper bound the "
             "solve started from (its hint's makespan); `dtime` = CP-SAT deterministic "
             "time (load-independent work units); `load` = the machine's 1-minute load "
             "average when the solve ended (2 cores).", "",
             "| family | tasks | seed | model | status | work | start | best | bound | gap "
             "| solve s | dtime | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        lines.append(f"| {row.get('family', 'distinct')} | {row['tasks']} | {row['seed']} | "
                     f"{row['model']} | {row['status']} | {_fmt(row.get('work_bound'))} | "
                     f"{_fmt(row.get('start_ub'))} | "
                     f"{_fmt(row['best'])} | {_fmt(row['bound'])} | "
                     f"{_fmt(row['gap'] * 100 if row['gap'] is not None else None, 1)}% | "
                     f"{row['time_s']} | {row.get('dtime', '-')} | {row.get('load', '-')} |")
    lines.append("")
    for family in ("distinct", "identical", "arrivals"):
        proven = [r["tasks"] for r in data["rows"] if r["model"] == "full"
                  and r["status"] == "OPTIMAL" and r.get("family", "distinct") == family]
        lines.append(f"- largest `{family}` instance proven optimal within 60 s: "
                     f"{max(proven) if proven else 'none'} tasks")
    lines.append("")
    return lines


def _proofs_md(data: dict[str, Any]) -> list[str]:
    rows = data["rows"]
    lines = ["## 80-task memory-tight instances: proven within 60 s?", "",
             "Tightness 1.2, 2 workers, loads ~ execs, all released at 0; four "
             "10-layer networks (seeds 1-10) and eight 5-layer ones (seeds 1-5). "
             "`full` = the defaults, `forward` = without backward search and probing "
             "(as in the `scaling` table); `probes` = CP-SAT feasibility solves "
             "(deadlines from the static bound up) before any minimising.", "",
             "| shape | seed | model | status | work | start | best | bound | gap | solve s "
             "| probes | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['shape']} | {row['seed']} | {row['model']} | {row['status']} | "
                     f"{_fmt(row['work_bound'])} | {_fmt(row['start_ub'])} | "
                     f"{_fmt(row['best'])} | {_fmt(row['bound'])} | "
                     f"{_fmt(row['gap'] * 100 if row['gap'] is not None else None, 1)}% | "
                     f"{row['time_s']} | {row['probes']} | {row['load']} |")
    lines.append("")
    for shape in dict.fromkeys(row["shape"] for row in rows):
        for model in SCALING_MODELS:
            subset = [r for r in rows if r["shape"] == shape and r["model"] == model]
            if not subset:
                continue
            proven = [r for r in subset if r["status"] == "OPTIMAL"]
            times = sorted(r["time_s"] for r in proven)
            above = sum(1 for r in proven if r["best"] > r["work_bound"])
            lines.append(
                f"- {shape}, `{model}`: {len(proven)} of {len(subset)} proven optimal "
                + (f"(solve {times[0]}-{times[-1]} s, median "
                   f"{statistics.median(times):.1f} s; {above} of them above the work bound)"
                   if proven else "") + ".")
    lines.append("")
    return lines


def _gantts(instance: Instance, prefix: str, title: str) -> None:
    """Gantt charts of the optimal, masa and masa-plan schedules of one instance."""
    runs = {policy: run_heuristic(instance, policy) for policy in ("masa", "masa-plan")}
    evaluation = _evaluate(instance, 30.0, policy="masa-plan", heuristic_run=runs["masa-plan"])
    write_gantt(instance, evaluation.result.schedule, DOCS / f"{prefix}-optimal.png",
                title=f"{title}: optimal makespan {evaluation.result.makespan_us}")
    for policy, suffix in (("masa", "heuristic"), ("masa-plan", "plan")):
        run = runs[policy]
        assert run is not None
        write_gantt(instance, run[0], DOCS / f"{prefix}-{suffix}.png",
                    title=f"{title}: {policy} makespan {schedule_makespan(run[0])}")


def _worst_gantts(data: dict[str, Any]) -> None:
    valid = [r for r in data["rows"] if r["ratio"] and not r["over_commits"]
             and r["status"] == "OPTIMAL"]
    if valid:
        worst = max(valid, key=lambda r: r["ratio"])
        _gantts(random_instance(RandomSpec(**worst["spec"])), "bench-solver-worst",
                worst["instance"])


def write_report(results: dict[str, Any]) -> None:
    lines = ["# Solver benchmark: optimal vs the masa heuristic", "",
             "Generated by `python benchmarks/bench_solver.py` (raw figures in "
             "bench-solver.json). CP-SAT 9.15, "
             f"{SEARCH_WORKERS} search workers, on a 2-core machine shared with other "
             "engineers' jobs at the time: solve times are pessimistic.", ""]
    if "fig13a" in results:
        lines += _fig13a_md(results["fig13a"])
    if "random" in results:
        lines += _random_md(results["random"])
    if "scaling" in results:
        lines += _scaling_md(results["scaling"])
    if "proofs" in results:
        lines += _proofs_md(results["proofs"])
    lines += DISCUSSION
    atomic_write_text(DOCS / "bench-solver.md", "\n".join(lines) + "\n")


DISCUSSION: list[str] = [
    "## Why the greedy heuristic falls short, and what planning buys",
    "",
    "The random instances carry the LOAD order rule that masa.sched.jobs puts into "
    "every real job graph (LOAD(s) starts no earlier than LOAD(s-1)); the solver "
    "ignores it, so the optimum is a bound for every policy. Before the "
    "generator had the rule, `masa` loaded light later stages before the stage "
    "they wait for and over-committed memory on 32 of the 150 instances; with "
    "it, on none (tests/test_random_instances.py).",
    "",
    "The greedy rule alone (`masa-noplan`) is 1.1-1.5x the optimum on tight and "
    "medium budgets. The worst cases share one pattern: smallest "
    "memory first loads the light first-stage (conv) layers of every network "
    "early; their resident weights and outputs stay locked until the matching "
    "execs, while the heavy fc loads, which need about twice their weights "
    "while loading, come last. By then the memory left over admits one heavy "
    "load at a time and the tail of the schedule runs on one worker. The "
    "optimum starts the long, heavy loads first, overlaps them with the execs of "
    "the layers already loaded and keeps memory almost full. No fixed priority "
    "rule fixes this: smallest-first, largest-first, longest-first, critical "
    "path and network order, with and without the admission rule, all stayed "
    "at medians of 1.13-1.24 on the tight instances (measured while building "
    "masa-plan).",
    "",
    "What does fix it cheaply is choosing among whole orders, not priorities: the "
    "default `masa` decodes, for a batch that arrives at an empty executor, "
    "masa.runtime.planning's rule-based orders (critical path, masa's own, "
    "network by network in arrival order and lightest, heaviest or longest network "
    "first) in both decoder modes, takes 20 annealing steps from the best, and follows "
    "the result only if it beats greedy masa's decode of the same batch. Measured on "
    "the 137 proven instances: the five older rule orders alone gave a tight median "
    "of 1.112 (worst 1.261); with the three network orders 1.074 (1.250); 20 steps "
    "1.074 (1.227); 40 steps 1.074 (1.239); 100 steps with the five older orders 1.080 "
    "(1.161) at 91 ms per instance. Made with nothing running and nothing held, the "
    "plan is exact (the run is its decode), so `masa` is never slower than "
    "`masa-noplan` on these instances (tests/test_random_instances.py). Each "
    "decision stays O(log n) for the greedy rule (median 4-6 us at 1,000 ready "
    "tasks, docs/bench-decision.md); the plan is made once per batch, on a "
    "background thread in real runs.",
    "",
    "`masa-plan` (masa.runtime.planning, docs/scheduling.md) keeps masa's memory rules "
    "but dispatches in a planned order: simulated annealing over dispatch "
    "orders, each decoded by running the policy in the simulator, so the plan is "
    "exactly what runs. It meets the targets on these instances (table above). "
    "Where it still falls short, the cause is the search space, not the search "
    "alone: the optimum may load a later stage of a network before an earlier "
    "one, which the LOAD order rule forbids (e.g. random-n2-l4-s1000 at 1.2: the "
    "optimum, 61, loads n0.s3 before n0.s1; masa-plan's best is 65), and a "
    "dispatching policy only starts tasks at events. Its cost is the `plan s` "
    "column (about 100,000 task decodes per plan): fine for a batch of networks "
    "arriving together, too much to rerun for every one of thousands of queued "
    "jobs, which is why the default online policy plans only light, once per batch "
    "at an empty executor.",
    "",
    "On the solver: tight instances are hard because the optimum is a few "
    "percent above the static bound (work shared by the workers), and CP-SAT's own "
    "bound barely moves from it while it minimises. Two changes settle most "
    "80-task instances (`proofs` table: 8 of 15 proven within 60 s, none by the "
    "solver without them). (1) Backward search: the idle time of a tight schedule "
    "sits at its end (the 48-task seed-1 optimum, 176 against a work bound of "
    "173, idles 7 units on one worker during its last two execs and nowhere "
    "else), and set-times search settles the earliest starts first; so the "
    "solver solves the instance's mirror (solver.instance.mirrored: time "
    "reversed, precedences turned around, each lock from its until-task to its "
    "from-task) and reads the schedule backwards. Without probing this alone "
    "proved the 48-task seed-1 instance in 5 s instead of 22-42 s and 64-task "
    "ones in 12-34 s. (2) Lower-bound probing: asking for any schedule ending by "
    "T, T = static bound, +1, ..., makes the deadline a hard constraint, so every "
    "start has a tight window: on 80-task seed 2, deadlines 293-297 were refuted "
    "in 0.7-7 s each and a schedule of the optimum 298 found in 10-23 s over five "
    "CP-SAT seeds, where minimising proved 298 once, after 99 s. One unit at a "
    "time, not bisecting: a deadline above the optimum (299) was not met faster. "
    "Both apply up to 128 tasks (solver.search.PROOF_MAX_TASKS); above, no probe "
    "settles and backward search found worse schedules (one 60-s run each: 168 "
    "tasks 677 against 656, 240 tasks 1013 against 983), so larger instances keep "
    "the forward configuration (set-times forward up to 64 tasks, CP-SAT's "
    "portfolio above). List-schedule hints (serial schedule generation with "
    "several priority rules and forward-backward improvement, checked by "
    "masa.sched.checker) give the starting upper bound (`start`).",
    "",
    "Found on the way: with 2 workers and subsolvers limited to default_lp and "
    "fixed, CP-SAT's log shows one full subsolver, default_lp (plus its "
    "first-solution and interleaved subsolvers); the `fixed` worker never ran, so "
    "set-times search works through the decision strategy default_lp follows. "
    "Running both as full subsolvers (num_full_subsolvers=2) met the 298 deadline "
    "in 5.5-25 s over five seeds against 9.6-23 s: not kept.",
    "",
    "Tried and not kept: CP-SAT portfolios chosen by `subsolvers` and "
    "objective_lb_search / shaving (earlier, forward; bound stayed at the work "
    "bound); dropping the clique no-overlaps, timetable edge finding, the overload "
    "checker or the energy bound (64 tasks, backward: each within run-to-run "
    "noise or slower); fixed,fixed / fixed,no_lp / fixed,max_lp / "
    "fixed,pseudo_costs subsolver pairs (64-task seed 1 no longer proven in 60 s); "
    "hint values in the set-times solves (64 tasks: 28-34 s against 22-25 s with "
    "the hint as an upper bound only: the probes carry no hint); a fractional "
    "matching bound on pairs of tasks that fit together (exactly the work bound "
    "at 48-80 tasks), memory energy with minimum lock lengths and a clique flow "
    "bound (never above the work bound).",
    "",
    "Scaling, honestly: memory-tight instances up to 64 tasks were proven in "
    "0.1-9 s; at 80 tasks 8 of 15 in 4-30 s, the rest left with gaps of "
    "0.3-12% (seed 8: 293 against 292). Which instances are proven varies "
    "between runs: parallel search is not deterministic and the machine was "
    "shared. At 120 tasks probing raises the bound (448 to 458) but no proof; at "
    "168-240 tasks the gap is 11-12% and 23% on 240 identical networks. The "
    "`arrivals` instances are proven through decomposition, but their merged "
    "segments have several releases, so they are solved forwards, and the `full` "
    "model took 45 s at 80 tasks where `plain` took 0.8 s (left alone).",
    "",
]


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    sections = [a for a in argv if not a.startswith("--")] or [
        "fig13a", "random", "scaling", "proofs"]
    results: dict[str, Any] = {}
    if RESULTS.exists():
        results = json.loads(RESULTS.read_text())
    if sections == ["report"]:  # rewrite the Markdown from the saved figures only
        write_report(results)
        return 0
    if sections == ["heuristics"]:
        rerun_heuristics(results)
        atomic_write_text(RESULTS, json.dumps(results, indent=1) + "\n")
        _worst_gantts(results["random"])
        write_report(results)
        print(f"wrote {DOCS / 'bench-solver.md'}")
        return 0
    for name in sections:
        results[name] = {"fig13a": bench_fig13a, "random": bench_random,
                         "scaling": bench_scaling, "proofs": bench_proofs}[name](quick)
        atomic_write_text(RESULTS, json.dumps(results, indent=1) + "\n")
        if name == "random":
            _worst_gantts(results[name])
        write_report(results)
    print(f"wrote {DOCS / 'bench-solver.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
