"""`masa workload`: check a workload file, print the jobs it generates, list scenarios.

This module owns the command line around workloads.loader and
workloads.generation: `check` validates a file (against a store when given)
and summarises its job graph, arrivals and traffic intensity; `jobs` prints
the generated jobs; `scenarios` lists the packaged scenario files. A file
argument may also name a packaged scenario. `check` and `scenarios` print one
JSON document with --json, `jobs` one JSON line per job.

Exit codes follow masa.cli.main: 0 ok; 2 for an invalid file (a UserError,
one line on stderr; `check --json` also prints the problems as JSON); 3 for
an internal error. Nothing here runs anything that can fail after a valid
input, so 1 is never returned.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from masa.common.errors import UserError, ValidationError
from masa.common.output import print_json
from model_prep.manifest import NetworkManifest, load_store_network
from workloads.arrivals import US_PER_S, mean_network_time_s, traffic_intensity
from workloads.generation import (
    SCENARIO_DIR,
    generate_jobs,
    list_scenarios,
    resolve_workload_path,
    scenario_path,
)
from workloads.loader import load_workload
from workloads.model import Condition, Workload


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
    check.add_argument("--json", action="store_true",
                       help="print the summary (or the problems) as one JSON document")
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
    scenarios.add_argument("--json", action="store_true", help="print one JSON document")
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


def _traffic(workload: Workload, manifests: dict[str, NetworkManifest]
             ) -> tuple[float | None, float | None, float | None]:
    """(mean network time in s, arrival rate per s, traffic intensity); None where unknown."""
    rate_per_s = workload.arrivals.mean_rate_per_s
    if not manifests:
        return None, rate_per_s, None
    mean_s = mean_network_time_s(manifests, workload.networks)
    intensity = (traffic_intensity(rate_per_s, manifests, workload.networks)
                 if rate_per_s else None)
    return mean_s, rate_per_s, intensity


def _print_check(workload: Workload, manifests: dict[str, NetworkManifest]) -> None:
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
    mean_s, rate_per_s, intensity = _traffic(workload, manifests)
    if mean_s is not None:
        print(f"mean network time (load + exec): {mean_s * 1000:.1f} ms")
    if intensity is not None and rate_per_s is not None:
        print(f"traffic intensity: {intensity:.3f} at {rate_per_s:.3f} jobs/s")


def _without_none(obj: Any, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    return {key: value for key, value in dataclasses.asdict(obj).items()
            if value is not None and key not in drop}


def _condition_json(condition: Condition) -> dict[str, Any]:
    # min_count and class_ids always have values; show them only where they mean something.
    drop = tuple(key for key, kind in (("min_count", "count_above"), ("class_ids", "argmax_in"))
                 if condition.kind != kind)
    return _without_none(condition, drop=drop) | {"text": _describe_condition(condition)}


def _check_json(workload: Workload, manifests: dict[str, NetworkManifest]) -> dict[str, Any]:
    """What the text summary shows, as plain data (times in the units their names say)."""
    mean_s, rate_per_s, intensity = _traffic(workload, manifests)
    transform_drop = ("coords", "margin")  # only crop_best_box uses them
    return {
        "source": str(workload.source),
        "valid": True,
        "name": workload.name,
        "description": workload.description,
        "networks": [
            {"name": node.name, "after": list(node.after),
             "when": [_condition_json(c) for c in node.when],
             "input": None if node.transform is None else _without_none(
                 node.transform, drop=transform_drop if node.transform.kind == "call" else ())}
            for node in workload.nodes
        ],
        "composition": (_without_none(workload.composition)
                        if workload.composition.kind == "subset"
                        else {"kind": workload.composition.kind}),
        "input": {"kind": workload.input.kind,
                  "path": None if workload.input.path is None else str(workload.input.path)},
        "arrivals": _without_none(workload.arrivals) | {
            "mean_rate_per_s": rate_per_s, "text": _describe_arrivals(workload)},
        "intensity": workload.intensity,
        "mean_network_time_ms": None if mean_s is None else mean_s * 1000,
        "traffic_intensity": intensity,
    }


def run_check(args: argparse.Namespace) -> int:
    try:
        workload, manifests = _load(args)
    except UserError as error:
        if args.json:
            problems = error.problems if isinstance(error, ValidationError) else [str(error)]
            print_json({"source": str(resolve_workload_path(args.file)), "valid": False,
                         "problems": problems})
        raise  # the one-line message on stderr and exit code 2 come from masa.cli.main
    if args.json:
        print_json(_check_json(workload, manifests))
    else:
        _print_check(workload, manifests)
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
    described = {name: load_workload(scenario_path(name)).description
                 for name in list_scenarios()}
    if args.json:
        print_json({"directory": str(SCENARIO_DIR),
                     "scenarios": [{"name": name, "description": description}
                                   for name, description in described.items()]})
        return 0
    for name, description in described.items():
        print(f"{name:12s} {description}")
    print(f"(files in {SCENARIO_DIR})")
    return 0
