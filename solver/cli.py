"""`masa-optimal`: solve a scheduling instance to optimality and compare the heuristic.

The imperative shell around solver.model: reads an instance (JSON file, a
`--random` spec, or a workload YAML plus a store), runs the `masa` policy in
the simulator on exactly that instance (its schedule is checked and becomes
the solver's hint), solves with CP-SAT, checks the solver's schedule with the
same checker, and prints or emits as JSON the status, optimal (or best and
bound) makespan, heuristic makespan, their ratio, solve time and schedule.
Optionally draws a Gantt chart with the memory profile.

Exit codes: 0 a schedule was found (OPTIMAL or FEASIBLE), 1 none was found
(INFEASIBLE proven by the solver, or UNKNOWN at the time limit), 2 bad input or
a structurally infeasible instance (a task or lock alone larger than memory,
cyclic precedence).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from masa.common.atomic import atomic_save_png
from masa.common.errors import UserError
from masa.common.units import parse_memory_bytes
from masa.sched.taskgraph import ScheduledTask
from solver.instance import (
    Instance,
    check_feasible,
    load_instance,
    parse_random_spec,
    random_instance,
    write_instance,
)
from solver.model import (
    DIRECTIONS,
    FORMULATIONS,
    OBJECTIVES,
    PROOF_MAX_TASKS,
    SEARCHES,
    SET_TIMES_MAX_TASKS,
    SolveOptions,
    SolveResult,
    response_sum,
    schedule_makespan,
    serial_schedule,
    solve_instance,
)


@dataclass(frozen=True)
class Evaluation:
    """The solver's result next to the heuristic's on the same instance."""

    instance: Instance
    result: SolveResult
    heuristic_schedule: tuple[ScheduledTask, ...] | None  # None: simulator unavailable
    hint_source: str  # masa / bulk / serial: whose schedule hinted the solver ("" none)
    heuristic_over_commits: tuple[str, ...]  # tasks run over budget (progress rule)
    heuristic_problems: tuple[str, ...]  # checker findings beyond those over-commits
    solver_problems: tuple[str, ...]  # checker findings on the solver schedule (expect none)
    checker_available: bool
    policy: str = "masa"  # the heuristic compared: a masa.sched.policies name

    @property
    def heuristic_makespan_us(self) -> int | None:
        if self.heuristic_schedule is None:
            return None
        return schedule_makespan(self.heuristic_schedule)

    @property
    def heuristic_objective(self) -> int | None:
        if self.heuristic_schedule is None:
            return None
        if self.result.objective == "makespan":
            return schedule_makespan(self.heuristic_schedule)
        return response_sum(self.instance.graph, self.heuristic_schedule)

    @property
    def ratio(self) -> float | None:
        """Heuristic objective / best solver objective (the optimum when proven)."""
        heuristic, best = self.heuristic_objective, self.result.objective_value
        if heuristic is None or not best:
            return None
        return heuristic / best

    @property
    def ratio_max(self) -> float | None:
        """Heuristic objective / proven bound: the ratio to the optimum is at most this."""
        heuristic, bound = self.heuristic_objective, self.result.bound
        if heuristic is None or not bound:
            return None
        return heuristic / bound


def _optional(module: str, name: str) -> Any:
    """A function from a module another engineer owns, or None if it has not landed."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def run_heuristic(instance: Instance, policy: str = "masa"
                  ) -> tuple[tuple[ScheduledTask, ...], tuple[str, ...]] | None:
    """A policy (by default `masa`) in the simulator on exactly this instance.

    Returns its schedule and the tasks it over-committed memory for (the
    progress rule: run the smallest task when nothing fits and no worker is
    busy), or None when the simulator is unavailable.
    """
    simulate_graph = _optional("masa.runtime.virtual", "simulate_graph")
    if simulate_graph is None:
        return None
    result = simulate_graph(instance.graph, policy=policy, workers=instance.workers,
                            memory_budget_bytes=instance.memory)
    over_commits = tuple(item.task_id for item in getattr(result, "over_commits", ()))
    return tuple(result.schedule), over_commits


def check(instance: Instance, schedule: Sequence[ScheduledTask],
          allowed_over_commits: Sequence[str] = ()) -> list[str] | None:
    """masa.sched.checker's findings on a schedule ([] = valid), or None if unavailable."""
    check_schedule = _optional("masa.sched.checker", "check_schedule")
    if check_schedule is None:
        return None
    return list(check_schedule(instance.graph, list(schedule), workers=instance.workers,
                               memory_budget_bytes=instance.memory,
                               allowed_over_commits=allowed_over_commits))


def _objective(instance: Instance, options: SolveOptions,
               schedule: Sequence[ScheduledTask]) -> int:
    if options.objective == "makespan":
        return schedule_makespan(schedule)
    return response_sum(instance.graph, schedule)


def evaluate(instance: Instance, options: SolveOptions, *, use_hint: bool = True,
             policy: str = "masa",
             heuristic_run: tuple[tuple[ScheduledTask, ...], tuple[str, ...]] | None = None
             ) -> Evaluation:
    """A heuristic (`masa` by default), then the solver hinted with the best schedule
    within budget. heuristic_run: that policy's `run_heuristic` result, if the
    caller already has it (masa-plan plans for about a second)."""
    check_feasible(instance)
    # The solver ignores start_after (a rule of the heuristic only): its hints
    # and its schedule are checked against everything else.
    unordered = replace(instance, graph=replace(instance.graph, start_after=()))
    simulated = heuristic_run if heuristic_run is not None else run_heuristic(instance, policy)
    heuristic_problems: list[str] = []
    heuristic, over_commits = simulated if simulated is not None else (None, ())
    hint = None
    if heuristic is not None:
        # Checked allowing its recorded over-commits: anything else is a bug.
        found = check(instance, heuristic, over_commits)
        heuristic_problems = found or []
        # Only a schedule within the budget may serve as hint and upper bound.
        if found is not None and not found and not over_commits and use_hint:
            hint = heuristic
    hint_source = policy if hint is not None else ""
    if use_hint:
        # Large tight instances may find no solution at all without a hint, and
        # a poor hint leaves CP-SAT far from the optimum: take the best of the
        # schedules that fit the budget (masa's, bulk's, one task at a time).
        candidates: list[tuple[str, Sequence[ScheduledTask]]] = []
        if hint is not None:
            candidates.append((policy, hint))
        bulk = run_heuristic(instance, "bulk")
        if bulk is not None and not bulk[1]:
            candidates.append(("bulk", bulk[0]))
        candidates.append(("serial", serial_schedule(instance.graph)))
        valid = [(name, schedule) for name, schedule in candidates
                 if check(unordered, schedule) == []]
        if valid:
            hint_source, best = min(
                valid, key=lambda item: _objective(instance, options, item[1]))
            hint = tuple(best)
    result = solve_instance(instance, options, hint=hint)
    solver_problems = check(unordered, result.schedule) if result.schedule else []
    return Evaluation(instance=instance, result=result, heuristic_schedule=heuristic,
                      hint_source=hint_source, heuristic_over_commits=over_commits,
                      heuristic_problems=tuple(heuristic_problems),
                      solver_problems=tuple(solver_problems or ()),
                      checker_available=_optional("masa.sched.checker", "check_schedule") is not None,
                      policy=policy)


# ---------------------------------------------------------------- output

def evaluation_to_dict(evaluation: Evaluation, *, with_schedule: bool = True) -> dict[str, Any]:
    result = evaluation.result
    instance = evaluation.instance
    raw: dict[str, Any] = {
        "instance": instance.name,
        "tasks": instance.num_tasks,
        "workers": instance.workers,
        "memory": instance.memory,
        "time_unit": instance.time_unit,
        "memory_unit": instance.memory_unit,
        "status": result.status,
        "objective": result.objective,
        "formulation": result.formulation,
        "optimal_makespan": result.makespan_us if result.proven and
        result.objective == "makespan" else None,
        "best_makespan": result.makespan_us,
        "optimal_response_sum": result.response_sum_us if result.proven and
        result.objective == "response" else None,
        "best_response_sum": result.response_sum_us,
        "objective_value": result.objective_value,
        "bound": result.bound,
        "gap": result.gap,
        "policy": evaluation.policy,
        "heuristic_makespan": evaluation.heuristic_makespan_us,
        "heuristic_response_sum": None if evaluation.heuristic_schedule is None else
        response_sum(instance.graph, evaluation.heuristic_schedule),
        "ratio": evaluation.ratio,
        "ratio_max": None if result.proven else evaluation.ratio_max,
        "solve_time_s": round(result.solve_time_s, 3),
        "deterministic_time": round(result.deterministic_time, 3),
        "segments": result.segments,
        "direction": result.direction,
        "probes": result.probes,
        "hint_used": result.hint_used,
        "hint_source": evaluation.hint_source,
        "heuristic_over_commits": list(evaluation.heuristic_over_commits),
        "heuristic_check": list(evaluation.heuristic_problems),
        "solver_check": list(evaluation.solver_problems),
        "checker_available": evaluation.checker_available,
    }
    if with_schedule:
        raw["schedule"] = [{"id": item.task_id, "worker": item.worker, "start": item.start_us,
                            "end": item.end_us} for item in result.schedule]
    return raw


def format_evaluation(evaluation: Evaluation) -> str:
    raw = evaluation_to_dict(evaluation, with_schedule=False)
    result = evaluation.result
    unit = evaluation.instance.time_unit
    lines = [f"instance: {raw['instance']} ({raw['tasks']} tasks, {raw['workers']} workers, "
             f"memory {raw['memory']} {raw['memory_unit']})",
             f"status: {result.status} ({result.formulation}, objective {result.objective}, "
             f"{result.solve_time_s:.2f} s, {result.segments} segment(s), "
             f"{result.direction}, {result.probes} probe(s), "
             f"hint {evaluation.hint_source or 'none'})"]
    what = "makespan" if result.objective == "makespan" else "response_sum"
    if result.proven:
        lines.append(f"optimal_{what}: {result.objective_value} {unit}")
    elif result.objective_value is not None:
        lines.append(f"best_{what}: {result.objective_value} {unit} "
                     f"(bound {result.bound}, gap {100 * (result.gap or 0):.1f}%)")
    else:
        lines.append(f"no schedule found (bound {result.bound})")
    if evaluation.heuristic_schedule is None:
        lines.append("heuristic: unavailable (masa.runtime.virtual not installed)")
    else:
        lines.append(f"heuristic_{what}: {evaluation.heuristic_objective} {unit} "
                     f"(policy {evaluation.policy})")
        if evaluation.ratio is not None:
            extra = "" if result.proven else f" (at most {evaluation.ratio_max:.3f})"
            lines.append(f"ratio: {evaluation.ratio:.3f}{extra}")
        if evaluation.heuristic_over_commits:
            lines.append(f"heuristic over-committed memory for "
                         f"{len(evaluation.heuristic_over_commits)} task(s) (progress rule): "
                         f"{', '.join(evaluation.heuristic_over_commits[:5])}; its schedule "
                         "exceeds the budget, so it is no valid hint or comparison")
        for problem in evaluation.heuristic_problems:
            lines.append(f"heuristic schedule check: {problem}")
    for problem in evaluation.solver_problems:
        lines.append(f"solver schedule check: {problem}")
    if result.schedule:
        lines.append("schedule (task worker start end):")
        lines += [f"  {item.task_id} {item.worker} {item.start_us} {item.end_us}"
                  for item in result.schedule]
    return "\n".join(lines)


def memory_profile(instance: Instance, schedule: Sequence[ScheduledTask]
                   ) -> list[tuple[int, int]]:
    """(time, memory held from then on) steps: direct memory plus active locks."""
    by_id = {item.task_id: item for item in schedule}
    deltas: dict[int, int] = {}
    for item in schedule:
        memory = instance.graph.by_id[item.task_id].memory_bytes
        if memory and item.end_us > item.start_us:
            deltas[item.start_us] = deltas.get(item.start_us, 0) + memory
            deltas[item.end_us] = deltas.get(item.end_us, 0) - memory
    for lock in instance.graph.locks:
        start = by_id[lock.from_task].start_us
        end = max([by_id[u].end_us for u in lock.until_tasks] + [start])
        if lock.memory_bytes and end > start:
            deltas[start] = deltas.get(start, 0) + lock.memory_bytes
            deltas[end] = deltas.get(end, 0) - lock.memory_bytes
    level = 0
    steps: list[tuple[int, int]] = []
    for time_us in sorted(deltas):
        level += deltas[time_us]
        steps.append((time_us, level))
    return steps


def write_gantt(instance: Instance, schedule: Sequence[ScheduledTask], path: str | Path,
                title: str = "") -> None:
    """Gantt chart of the schedule per worker, with the memory profile under it (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"load": "tab:blue", "exec": "tab:orange", "unload": "tab:green"}
    figure, (gantt, memory) = plt.subplots(
        2, 1, figsize=(11, 2.2 + 0.45 * instance.workers), sharex=True,
        gridspec_kw={"height_ratios": [max(1, instance.workers), 2]})
    for item in schedule:
        task = instance.graph.by_id[item.task_id]
        gantt.barh(item.worker, item.end_us - item.start_us, left=item.start_us, height=0.8,
                   color=colours.get(task.kind.value, "grey"), edgecolor="black", linewidth=0.4)
        if item.end_us - item.start_us > 0:
            gantt.text((item.start_us + item.end_us) / 2, item.worker,
                       task.group or task.task_id, ha="center", va="center", fontsize=6)
    gantt.set_yticks(range(instance.workers))
    gantt.set_yticklabels([f"worker {w}" for w in range(instance.workers)])
    gantt.invert_yaxis()
    gantt.set_title(title or instance.name)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    gantt.legend(handles, list(colours), loc="upper right", fontsize=7)
    steps = memory_profile(instance, schedule)
    if steps:
        times = [t for t, _ in steps]
        levels = [level for _, level in steps]
        memory.step(times, levels, where="post", label="held")
    memory.axhline(instance.memory, color="red", linestyle="--", label="budget")
    memory.set_ylabel(f"memory ({instance.memory_unit})")
    memory.set_xlabel(f"time ({instance.time_unit})")
    memory.legend(loc="upper right", fontsize=7)
    figure.tight_layout()
    atomic_save_png(figure, path)
    plt.close(figure)


# ---------------------------------------------------------------- command line

def _instance_from_args(args: argparse.Namespace) -> Instance:
    if args.random is not None:
        if args.instance:
            raise UserError("give either INSTANCE or --random, not both")
        instance = random_instance(parse_random_spec(args.random))
    elif not args.instance:
        raise UserError("missing INSTANCE (a .json instance, or a workload .yaml with "
                        "--store), or --random key=value,...")
    elif Path(args.instance).suffix.lower() in (".yaml", ".yml"):
        instance = _workload_instance(args)
    else:
        instance = load_instance(args.instance)
    memory = None
    if args.memory is not None:
        if instance.memory_unit == "bytes":
            memory = parse_memory_bytes(args.memory, "--memory")
        else:
            try:
                memory = int(args.memory)
            except ValueError:
                raise UserError(f"--memory: expected an integer in the instance's unit "
                                f"({instance.memory_unit}), got {args.memory!r}") from None
    return instance.with_resources(workers=args.workers, memory=memory)


def _workload_instance(args: argparse.Namespace) -> Instance:
    """A workload YAML plus a store's profiles, through the scheduler's graph builder.

    Context-oblivious (every network of every job runs): the solver has no
    notion of conditions. Durations are in microseconds, memory in bytes.
    """
    if not args.store:
        raise UserError(f"{args.instance}: a workload file needs --store DIR "
                        "(the prepared networks and their profiles)")
    if args.memory is None or args.workers is None:
        raise UserError(f"{args.instance}: give --workers and --memory for a workload")
    from masa.sched.jobs import build_workload_graph
    from model_prep.manifest import load_store_network
    from solver.instance import graph_to_instance
    from workloads.schema import generate_jobs, load_workload

    workload = load_workload(args.instance, Path(args.store))
    jobs = generate_jobs(workload)
    if args.jobs is not None:
        jobs = jobs[:args.jobs]
    manifests = {name: load_store_network(args.store, name, check_files=False)
                 for name in workload.networks}
    graph = build_workload_graph(jobs, manifests, workload.networks)
    return graph_to_instance(graph, workers=args.workers,
                             memory_bytes=parse_memory_bytes(args.memory, "--memory"),
                             name=f"{workload.name or Path(args.instance).stem}-"
                                  f"{len(jobs)}jobs")


# Memory-aware policies worth comparing with the optimum (bulk and deepeye ignore
# the budget, so their schedules are no valid comparison on tight instances).
HEURISTIC_POLICIES = ("masa", "masa-plan", "masa-paper")
DESCRIPTION = ("Solve a Masa scheduling instance to optimality with CP-SAT and compare "
               "the masa heuristic (simulator) on the same instance.")
EPILOG = ("Exit codes: 0 schedule found, 1 none found (INFEASIBLE or UNKNOWN), 2 bad input "
          "or structurally infeasible instance.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="masa-optimal", description=DESCRIPTION,
                                     epilog=EPILOG)
    _add_arguments(parser)
    return parser


def register(subparsers: argparse._SubParsersAction) -> None:
    """`masa optimal ...`: the same command inside the `masa` CLI."""
    parser = subparsers.add_parser("optimal", help="optimal schedule (CP-SAT) vs the "
                                   "masa heuristic on an instance", description=DESCRIPTION,
                                   epilog=EPILOG)
    _add_arguments(parser)
    parser.set_defaults(handler=handle)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("instance", nargs="?", metavar="INSTANCE",
                        help="instance JSON (docs/instance-format.md) or workload YAML "
                             "(with --store)")
    parser.add_argument("--random", metavar="KEY=VALUE,...",
                        help="generate a seeded random instance instead, e.g. "
                             "networks=2,layers=4,seed=1,tightness=1.2,load_ratio=4,"
                             "unload=1,identical=0,release_gap=0,workers=2")
    parser.add_argument("--store", metavar="DIR", help="store of prepared networks "
                        "(for a workload YAML)")
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="workload YAML only: solve the first N jobs (default: all)")
    parser.add_argument("--workers", type=int, help="override the number of workers")
    parser.add_argument("--memory", help="override the memory budget (instance units; "
                        "sizes such as 512MiB when the unit is bytes)")
    parser.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                        help="solver time limit in seconds (default 60)")
    parser.add_argument("--search-workers", type=int, default=os.cpu_count() or 1,
                        metavar="N", help="CP-SAT search workers (default: number of cores)")
    parser.add_argument("--seed", type=int, default=0, help="CP-SAT random seed")
    parser.add_argument("--formulation", choices=FORMULATIONS, default="cumulative",
                        help="cumulative (default, fast) or paper (assignment variables)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="makespan",
                        help="makespan (default) or response (sum of job response times)")
    parser.add_argument("--search", choices=SEARCHES, default="auto",
                        help="set_times (CP-SAT's LP search branches on the starts, "
                             "earliest first), default (CP-SAT's own portfolio) or auto "
                             "(default: set_times when searching backwards, and forwards "
                             f"up to {SET_TIMES_MAX_TASKS} tasks)")
    parser.add_argument("--direction", choices=DIRECTIONS, default="auto",
                        help="forward, backward (solve the time-reversed instance, so the "
                             "search starts from the end of the schedule) or auto (default: "
                             "backward for the makespan objective on up to "
                             f"{PROOF_MAX_TASKS} tasks when the instance has one common "
                             "release)")
    parser.add_argument("--no-probe", action="store_true",
                        help="minimise the makespan directly (by default, schedules ending "
                             "by the lower bound, then by one more, ... are asked for first)")
    parser.add_argument("--policy", default="masa", choices=HEURISTIC_POLICIES,
                        help="the heuristic to compare: masa (default, greedy), masa-plan "
                             "(masa's rules in an order planned by local search) or "
                             "masa-paper (Algorithm 1 as published)")
    parser.add_argument("--no-hint", action="store_true",
                        help="do not hint the solver (by default: the best schedule within "
                             "budget among masa's, bulk's, a serial one and the solver's "
                             "own list schedules)")
    parser.add_argument("--plain", action="store_true",
                        help="plain model: no symmetry breaking, redundant constraints, "
                             "decomposition, list-schedule hints, set-times or backward "
                             "search, or probing (for comparison)")
    parser.add_argument("--json", action="store_true", help="emit the result as JSON")
    parser.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of the "
                        "optimal schedule")
    parser.add_argument("--write-instance", metavar="JSON",
                        help="also write the (generated or overridden) instance as JSON")


def handle(args: argparse.Namespace) -> int:
    if args.workers is not None and args.workers < 1:
        raise UserError("--workers: expected an integer >= 1")
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs: expected an integer >= 1")
    if args.time_limit <= 0 or args.search_workers < 1:
        raise UserError("--time-limit must be > 0 and --search-workers >= 1")
    if args.direction == "backward" and args.objective != "makespan":
        raise UserError("--direction backward: reading a schedule backwards keeps its "
                        "makespan, not response times; use it with --objective makespan")
    instance = _instance_from_args(args)
    if args.write_instance:
        write_instance(instance, args.write_instance)
    options = SolveOptions(time_limit_s=args.time_limit, search_workers=args.search_workers,
                           seed=args.seed, formulation=args.formulation,
                           objective=args.objective, search=args.search,
                           direction=args.direction, probe=not args.no_probe,
                           list_hints=not args.no_hint)
    if args.plain:
        options = replace(options, symmetry_breaking=False, redundant=False, decompose=False,
                          list_hints=False, search="default", direction="forward",
                          probe=False)
    evaluation = evaluate(instance, options, use_hint=not args.no_hint, policy=args.policy)
    if args.json:
        print(json.dumps(evaluation_to_dict(evaluation), indent=1))
    else:
        print(format_evaluation(evaluation))
    if args.gantt and evaluation.result.schedule:
        write_gantt(instance, evaluation.result.schedule, args.gantt,
                    title=f"{instance.name}: {evaluation.result.status} "
                          f"makespan {evaluation.result.makespan_us}")
    return 0 if evaluation.result.schedule else 1


def main(argv: Sequence[str] | None = None) -> int:
    from masa.cli.main import configure_logging, run_handler

    parser = build_parser()
    parser.set_defaults(handler=handle)
    args = parser.parse_args(argv)
    configure_logging(0, True)
    return run_handler(parser, args, "masa-optimal")


if __name__ == "__main__":
    sys.exit(main())
