"""`masa optimal` (also `masa-optimal`): solve an instance to optimality, compare a heuristic.

The imperative shell around solver.evaluation: reads an instance (a JSON
file, a `--random` spec, or a workload YAML plus a store), evaluates it
(the heuristic in the simulator, then CP-SAT, both schedules checked),
prints the result as text or as one JSON document on stdout, and optionally
draws a Gantt chart. `register(subparsers)` adds the subcommand to the
`masa` command (masa.cli.main), which owns the process: logging, and the
mapping of errors to exit codes.

Exit codes: 0 a schedule was found and both schedules passed the checker;
1 no schedule was found (INFEASIBLE proven by the solver, or UNKNOWN at the
time limit), or the heuristic's or the solver's schedule failed the
checker; 2 bad usage or input, or a structurally infeasible instance (a task
or lock alone larger than memory, cyclic precedence); 3 internal error.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

from masa.common.argtypes import duration_s, positive_int
from masa.common.errors import EXIT_FAILED, EXIT_OK, UserError, writing
from masa.common.output import print_json
from masa.common.units import parse_memory_bytes
from masa.runtime.registry import POLICY_NAMES, make_policy
from masa.sched.jobs import build_workload_graph
from model_prep.manifest import load_store_network
from solver.evaluation import Evaluation, evaluate, evaluation_to_dict, format_evaluation
from solver.gantt import write_gantt
from solver.instance import (
    Instance,
    graph_to_instance,
    load_instance,
    parse_random_spec,
    random_instance,
    write_instance,
)
from solver.options import DIRECTIONS, FORMULATIONS, OBJECTIVES, SEARCHES, SolveOptions
from solver.search import PROOF_MAX_TASKS, SET_TIMES_MAX_TASKS
from workloads.generation import generate_jobs
from workloads.loader import load_workload

DESCRIPTION = ("Solve a Masa scheduling instance to optimality with CP-SAT and compare "
               "a heuristic policy (in the simulator) on the same instance.")
EPILOG = ("Exit codes: 0 schedule found and checked, 1 none found (INFEASIBLE or UNKNOWN) "
          "or a schedule failed the checker, 2 bad input or structurally infeasible "
          "instance, 3 internal error.")


def heuristic_policies() -> tuple[str, ...]:
    """The registry's memory-aware policies: worth comparing with the optimum (bulk
    and deepeye ignore the budget, so their schedules are no valid comparison on
    tight instances)."""
    return tuple(name for name in POLICY_NAMES if make_policy(name).memory_aware)


def register(subparsers: argparse._SubParsersAction) -> None:
    """`masa optimal ...`; `masa-optimal` is the same command (masa.cli.main.optimal_main)."""
    parser = subparsers.add_parser("optimal", help="optimal schedule (CP-SAT) vs the "
                                   "heuristic on an instance", description=DESCRIPTION,
                                   epilog=EPILOG)
    _add_input_arguments(parser)
    _add_solver_arguments(parser)
    _add_output_arguments(parser)
    parser.set_defaults(handler=handle)


def _add_input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("instance", nargs="?", metavar="INSTANCE",
                        help="instance JSON (docs/instance-format.md) or workload YAML "
                             "(with --store)")
    parser.add_argument("--random", metavar="KEY=VALUE,...",
                        help="generate a seeded random instance instead, e.g. "
                             "networks=2,layers=4,seed=1,tightness=1.2,load_ratio=4,"
                             "unload=1,identical=0,release_gap=0,workers=2")
    parser.add_argument("--store", metavar="DIR", help="store of prepared networks "
                        "(for a workload YAML)")
    parser.add_argument("--jobs", type=positive_int, metavar="N",
                        help="workload YAML only: solve the first N jobs (default: all)")
    parser.add_argument("--workers", type=positive_int, help="override the number of workers")
    parser.add_argument("--memory", help="override the memory budget (instance units; "
                        "sizes such as 512MiB when the unit is bytes)")
    policies = heuristic_policies()
    parser.add_argument("--policy", default="masa", choices=policies,
                        help=f"the heuristic to compare, one of {', '.join(policies)} "
                             "(default masa; masa.runtime.registry)")


def _add_solver_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--time-limit", type=duration_s, default=60.0, metavar="S",
                        help="solver wall-time limit, e.g. 60 or 90s (default 60 s)")
    parser.add_argument("--dtime-limit", type=float, default=None, metavar="D",
                        help="solver limit in CP-SAT deterministic time (work units, about "
                             "seconds on an idle core): with --search-workers 1, the same "
                             "result on a loaded machine (default: none)")
    parser.add_argument("--search-workers", type=positive_int, default=os.cpu_count() or 1,
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
    parser.add_argument("--no-hint", action="store_true",
                        help="do not hint the solver (by default: the best schedule within "
                             "budget among the heuristic's, bulk's, a serial one and the "
                             "solver's own list schedules)")
    parser.add_argument("--plain", action="store_true",
                        help="plain model: no symmetry breaking, redundant constraints, "
                             "decomposition, list-schedule hints, set-times or backward "
                             "search, or probing (for comparison)")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON document")
    parser.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of the "
                        "solver's schedule (needs matplotlib)")
    parser.add_argument("--write-instance", metavar="JSON",
                        help="also write the (generated or overridden) instance as JSON")


# ---------------------------------------------------------------- the command

def handle(args: argparse.Namespace) -> int:
    options = _options(args)
    instance = _instance_from_args(args)
    if args.write_instance:
        with writing(args.write_instance, "the instance"):  # a full disk: exit 1
            write_instance(instance, args.write_instance)
    evaluation = evaluate(instance, options, use_hint=not args.no_hint, policy=args.policy)
    if args.json:
        print_json(evaluation_to_dict(evaluation))
    else:
        print(format_evaluation(evaluation))
    if args.gantt and evaluation.result.schedule:
        write_gantt(instance, evaluation.result.schedule, args.gantt,
                    title=f"{instance.name}: {evaluation.result.status} "
                          f"makespan {evaluation.result.makespan_us}")
    return _exit_code(evaluation)


def _exit_code(evaluation: Evaluation) -> int:
    if not evaluation.result.schedule or not evaluation.passed_checks:
        return EXIT_FAILED
    return EXIT_OK


def _options(args: argparse.Namespace) -> SolveOptions:
    if args.time_limit <= 0 or (args.dtime_limit is not None and args.dtime_limit <= 0):
        raise UserError("--time-limit and --dtime-limit must be > 0")
    if args.direction == "backward" and args.objective != "makespan":
        raise UserError("--direction backward: reading a schedule backwards keeps its "
                        "makespan, not response times; use it with --objective makespan")
    options = SolveOptions(time_limit_s=args.time_limit, search_workers=args.search_workers,
                           seed=args.seed, formulation=args.formulation,
                           objective=args.objective, search=args.search,
                           direction=args.direction, probe=not args.no_probe,
                           list_hints=not args.no_hint)
    if args.dtime_limit is not None:
        options = replace(options, max_deterministic_time=args.dtime_limit)
    if args.plain:
        options = replace(options, symmetry_breaking=False, redundant=False, decompose=False,
                          list_hints=False, search="default", direction="forward",
                          probe=False)
    return options


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
