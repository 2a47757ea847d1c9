"""`masa zoo`: build the paper's networks as replicas and prepare them into a store.

This module owns only the command line: parsing and the summary table.
Building is workloads.zoo; splitting, verifying, profiling and progress bars
are model_prep (prepare_network).
"""

from __future__ import annotations

import argparse
from typing import Any

from masa.common.errors import UserError
from masa.common.units import format_bytes
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
    parser.set_defaults(handler=run_zoo)


def run_zoo(args: argparse.Namespace) -> int:
    names = check_names(args.names) if args.names else list(ZOO_NAMES)
    scale = check_scale(args.scale)
    if args.runs is not None and args.runs < 1:
        raise UserError(f"--runs: expected a positive integer, got {args.runs}")
    # None: progress bars when stderr is a terminal, unless the user asked for quiet.
    show_progress = False if getattr(args, "quiet", False) else None
    manifests = write_zoo(args.store, names, scale, profile=not args.no_profile,
                          seed=args.seed, profile_runs=args.runs, verify=args.verify,
                          show_progress=show_progress)
    header = (f"{'network':<11} {'paper':<11} {'stages':>6} {'conv':>4} {'fc':>3} "
              f"{'weights':>10} {'exec ms':>8}")
    print(header)
    for manifest in manifests:
        stages = manifest.stages
        exec_text = (f"{sum(s.profile.exec_time_us for s in stages if s.profile) / 1000:8.1f}"
                     if manifest.profiled else f"{'-':>8}")
        print(f"{manifest.name:<11} {ZOO_SPECS[manifest.name].paper_name:<11} {len(stages):>6} "
              f"{sum(s.layer_type == 'conv' for s in stages):>4} "
              f"{sum(s.layer_type == 'fc' for s in stages):>3} "
              f"{format_bytes(sum(s.weight_bytes for s in stages)):>10} {exec_text}")
    if args.verify:
        print("verify: every network's stages reproduce its whole model")
    print(f"store: {args.store} (scale {scale:g}, seed {args.seed}; random weights, "
          "not trained models)")
    return 0
