"""`masa workload`: check a workload file, print the jobs it generates, list scenarios.

This module owns the command line around workloads.schema: `check` validates a
file (against a store when given) and summarises its job graph, arrivals and
traffic intensity; `jobs` prints the generated jobs; `scenarios` lists the
packaged scenario files. A file argument may also name a packaged scenario.
Invalid files raise UserError, which the CLI turns into one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from model_prep.manifest import NetworkManifest, load_store_network
from workloads.arrivals import US_PER_S, mean_network_time_s, traffic_intensity
from workloads.conditions import Condition
from workloads.schema import (
    Workload,
    generate_jobs,
    list_scenarios,
    load_workload,
    resolve_workload_path,
    scenario_path,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "workload",
        help="check a workload file, print its jobs, list the packaged scenarios",
        description="Validate workload YAML files (docs/workload-format.md) and show what "
        "they generate. FILE may be a path or the name of a packaged scenario.",
    )
    commands = parser.add_subparsers(dest="workload_command", metavar="ACTION", required=True)

    check = commands.add_parser("check", help="validate a workload and summarise it")
    check.add_argument("file", metavar="FILE", help="workload YAML, or a scenario name")
    check.add_argument("--store", type=Path, default=None,
                       help="store of prepared networks: check names and outputs, resolve "
                       "'intensity:' and print the traffic intensity")
    check.set_defaults(handler=run_check)

    jobs = commands.add_parser("jobs", help="print the jobs a workload generates")
    jobs.add_argument("file", metavar="FILE", help="workload YAML, or a scenario name")
    jobs.add_argument("--store", type=Path, default=None,
                      help="store of prepared networks (needed when the file sets intensity)")
    jobs.add_argument("--limit", type=int, default=20,
                      help="print at most this many jobs (default 20; 0 for all)")
    jobs.add_argument("--json", action="store_true", help="print JSON lines instead of a table")
    jobs.set_defaults(handler=run_jobs)

    scenarios = commands.add_parser("scenarios", help="list the packaged scenario files")
    scenarios.set_defaults(handler=run_scenarios)


def _load(args: argparse.Namespace) -> tuple[Workload, dict[str, NetworkManifest]]:
    workload = load_workload(resolve_workload_path(args.file), store_dir=args.store)
    manifests = {}
    if args.store is not None:
        manifests = {name: load_store_network(args.store, name, check_files=False)
                     for name in workload.networks}
    return workload, manifests


def _describe_condition(condition: Condition) -> str:
    if condition.kind == "probability":
        return f"probability {condition.probability:g} (label of {condition.network})"
    if condition.kind == "call":
        return f"call {condition.call}"
    tensor = f"{condition.network}.{condition.output or '<only output>'}"
    if condition.column is not None:
        tensor += f"[..., {condition.column}]"
    if condition.kind == "argmax_in":
        return f"argmax of {tensor} in {list(condition.class_ids)}"
    if condition.kind == "count_above":
        return f"at least {condition.min_count} of {tensor} > {condition.threshold:g}"
    return f"{condition.kind.replace('_', ' ')} {condition.threshold:g} on {tensor}"


def _describe_arrivals(workload: Workload) -> str:
    arrival = workload.arrivals
    if arrival.kind == "periodic" and arrival.interval_us is not None:
        detail = f"every {arrival.interval_us / 1000:g} ms"
    elif arrival.kind == "normal" and arrival.mean_us is not None:
        std_us = arrival.std_us if arrival.std_us is not None else (
            (arrival.cv or 0.0) * arrival.mean_us)
        detail = f"gaps ~ N({arrival.mean_us / 1000:g} ms, {std_us / 1000:g} ms) clipped at 0"
    elif arrival.kind == "poisson" and arrival.rate_per_s is not None:
        detail = f"{arrival.rate_per_s:g} per second"
    elif arrival.kind == "trace":
        detail = "explicit times"
    else:
        detail = "rate set by intensity (needs --store)"
    return f"{arrival.kind}, {detail}, {arrival.count} jobs, seed {arrival.seed}"


def run_check(args: argparse.Namespace) -> int:
    workload, manifests = _load(args)
    print(f"{workload.source}: valid ({workload.name})")
    if workload.description:
        print(f"  {workload.description}")
    print("networks:")
    for node in workload.nodes:
        line = f"  {node.name}"
        if node.after:
            line += f" after {', '.join(node.after)}"
        if node.when:
            line += " when " + " and ".join(_describe_condition(c) for c in node.when)
        if node.transform is not None:
            line += f"; input {node.transform.call or node.transform.kind}"
        print(line)
    composition = workload.composition
    if composition.kind == "subset":
        print(f"composition: subset of {composition.min_size}..{composition.max_size}")
    else:
        print(f"composition: {composition.kind}")
    print(f"input: {workload.input.path or workload.input.kind}")
    print(f"arrivals: {_describe_arrivals(workload)}")
    rate_per_s = workload.arrivals.mean_rate_per_s
    if manifests:
        mean_s = mean_network_time_s(manifests, workload.networks)
        print(f"mean network time (load + exec): {mean_s * 1000:.1f} ms")
        if rate_per_s:
            intensity = traffic_intensity(rate_per_s, manifests, workload.networks)
            print(f"traffic intensity: {intensity:.3f} at {rate_per_s:.3f} jobs/s")
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    workload, _ = _load(args)
    jobs = generate_jobs(workload)
    shown = jobs if args.limit <= 0 else jobs[: args.limit]
    if args.json:
        for job in shown:
            print(json.dumps({"job_id": job.job_id, "arrival_us": job.arrival_us,
                              "networks": list(job.networks)}))
        return 0
    print(f"{'job':>5}  {'arrival_s':>10}  networks")
    for job in shown:
        print(f"{job.job_id:>5}  {job.arrival_us / US_PER_S:>10.3f}  {', '.join(job.networks)}")
    if len(shown) < len(jobs):
        print(f"... {len(jobs) - len(shown)} more (--limit 0 shows all)")
    return 0


def run_scenarios(args: argparse.Namespace) -> int:
    for name in list_scenarios():
        workload = load_workload(scenario_path(name))
        print(f"{name:12s} {workload.description}")
    print(f"(files in {scenario_path(list_scenarios()[0]).parent})")
    return 0
