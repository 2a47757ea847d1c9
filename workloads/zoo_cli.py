"""`masa zoo`: build the paper's networks as replicas and prepare them into a store.

This module owns only the command line: parsing, the summary table and its
JSON form (--json), and the exit code. Building is workloads.zoo; splitting,
verifying, profiling and progress bars are model_prep (prepare_network).

Exit codes follow masa.cli.main: 0 every network built; 1 the arguments were
fine but preparing some network failed (masa.common.errors.RunFailed, e.g. a
--verify mismatch): the others are still built and reported; 2 bad usage or
input (UserError: unknown name, bad scale, unusable store), which stops at
once; 3 internal error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from masa.common.errors import EXIT_FAILED, RunFailed, UserError
from masa.common.output import print_json
from masa.common.units import format_bytes
from model_prep.manifest import NetworkManifest
from model_prep.prepare_cli import add_load_mode_argument, add_slicing_arguments, max_stage_bytes
from workloads.zoo import ZOO_NAMES, ZOO_SPECS, check_names, check_scale, write_zoo


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number with 0 < S <= 1, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number with 0 < S <= 1, got {text}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "zoo",
        help="build the paper's nine networks (random-weight replicas) into a store",
        description=(
            "Build architecture replicas of the Masa paper's networks (structure and cost "
            "only, random weights: not trained models), split each into per-layer stages "
            "and profile them, writing STORE/NAME/manifest.yaml and STORE/NAME/stages/. "
            f"Networks: {', '.join(ZOO_NAMES)}. See docs/zoo.md."),
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="networks to build (default: all nine)")
    parser.add_argument("--store", required=True, metavar="DIR",
                        help="store directory (created if missing)")
    parser.add_argument("--scale", type=_scale, default=1.0, metavar="S",
                        help="channel-width scale, 0 < S <= 1 (default 1: the paper's sizes; "
                             "0.1 gives models of 0.2-4 MiB)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument("--no-profile", action="store_true",
                        help="split only; profile later with `masa profile STORE/NAME`")
    parser.add_argument("--verify", action="store_true",
                        help="run each network's stage chain and its whole model on one random "
                             "input and fail unless the outputs agree")
    parser.add_argument("--runs", type=int, default=None, metavar="N",
                        help="timed runs per stage when profiling (profiler default)")
    add_load_mode_argument(parser)
    add_slicing_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON document")
    parser.set_defaults(handler=run_zoo)


def _network_row(manifest: NetworkManifest) -> dict[str, Any]:
    """One network's line of the summary, as plain data."""
    stages = manifest.stages
    exec_us = (sum(s.profile.exec_time_us for s in stages if s.profile)
               if manifest.profiled else None)
    return {
        "name": manifest.name,
        "paper_name": ZOO_SPECS[manifest.name].paper_name,
        "stages": len(stages),
        "conv_stages": sum(s.layer_type == "conv" for s in stages),
        "fc_stages": sum(s.layer_type == "fc" for s in stages),
        "weight_bytes": sum(s.weight_bytes for s in stages),
        "exec_ms": None if exec_us is None else exec_us / 1000,
    }


def _print_table(args: argparse.Namespace, scale: float, rows: list[dict[str, Any]],
                 failed: dict[str, str], slice_above_bytes: int) -> None:
    print(f"{'network':<11} {'paper':<11} {'stages':>6} {'conv':>4} {'fc':>3} "
          f"{'weights':>10} {'exec ms':>8}")
    for row in rows:
        exec_text = f"{row['exec_ms']:8.1f}" if row["exec_ms"] is not None else f"{'-':>8}"
        print(f"{row['name']:<11} {row['paper_name']:<11} {row['stages']:>6} "
              f"{row['conv_stages']:>4} {row['fc_stages']:>3} "
              f"{format_bytes(row['weight_bytes']):>10} {exec_text}")
    if args.verify and not failed:
        print("verify: every network's stages reproduce its whole model")
    sliced = (f", operators above {format_bytes(slice_above_bytes)} of weights sliced"
              if slice_above_bytes else "")
    print(f"store: {args.store} (scale {scale:g}, seed {args.seed}, load mode "
          f"{args.load_mode}{sliced}; random weights, not trained models)")


def run_zoo(args: argparse.Namespace) -> int:
    names = check_names(args.names) if args.names else list(ZOO_NAMES)
    scale = check_scale(args.scale)
    if args.runs is not None and args.runs < 1:
        raise UserError(f"--runs: expected a positive integer, got {args.runs}")
    slice_above_bytes = max_stage_bytes(args)
    # None: progress bars when stderr is a terminal, unless the user asked for quiet.
    show_progress = False if getattr(args, "quiet", False) else None
    rows: list[dict[str, Any]] = []
    failed: dict[str, str] = {}
    # One network at a time, so that a failed run (a --verify mismatch) is
    # reported and the rest are still built; bad input (UserError) stops at once.
    for name in names:
        try:
            (manifest,) = write_zoo(args.store, [name], scale, profile=not args.no_profile,
                                    seed=args.seed, profile_runs=args.runs,
                                    verify=args.verify, show_progress=show_progress,
                                    load_mode=args.load_mode,
                                    max_stage_bytes=slice_above_bytes)
        except RunFailed as error:
            failed[name] = str(error)
            print(f"masa zoo: {name}: {error}", file=sys.stderr)
            continue
        rows.append(_network_row(manifest))
    if args.json:
        print_json({
            "store": str(args.store), "scale": scale, "seed": args.seed,
            "profiled": not args.no_profile, "verify": bool(args.verify),
            "load_mode": args.load_mode, "max_stage_bytes": slice_above_bytes,
            "networks": rows,
            "failed": [{"name": name, "error": error} for name, error in failed.items()],
        })
    else:
        _print_table(args, scale, rows, failed, slice_above_bytes)
    return EXIT_FAILED if failed else 0
