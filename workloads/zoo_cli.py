"""`masa zoo`: build the paper's networks as replicas and prepare them into a store.

This module owns only the command line: parsing, progress display and the
summary table. Building is workloads.zoo; splitting and profiling are
model_prep.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from masa.errors import UserError
from masa.units import format_bytes
from workloads.zoo import ZOO_NAMES, ZOO_SPECS, check_names, check_scale, write_zoo

log = logging.getLogger(__name__)


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
    parser.add_argument("--runs", type=int, default=None, metavar="N",
                        help="timed runs per stage when profiling (profiler default)")
    parser.set_defaults(handler=run_zoo)


def run_zoo(args: argparse.Namespace) -> int:
    names = check_names(args.names) if args.names else list(ZOO_NAMES)
    scale = check_scale(args.scale)
    if args.runs is not None and args.runs < 1:
        raise UserError(f"--runs: expected a positive integer, got {args.runs}")
    quiet = getattr(args, "quiet", False)
    split_bar, profile_bar = _progress_bars(quiet)
    try:
        manifests = write_zoo(args.store, names, scale, profile=not args.no_profile,
                              seed=args.seed, profile_runs=args.runs,
                              split_progress=split_bar, profile_progress=profile_bar)
    finally:
        for bar in (split_bar, profile_bar):
            if bar is not None:
                bar.close()
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
    print(f"store: {args.store} (scale {scale:g}, seed {args.seed}; random weights, "
          "not trained models)")
    return 0


class _ZooBar:
    """Adapts masa.progress.ProgressBar to (network, done, total, item) callbacks."""

    def __init__(self, verb: str):
        from masa.progress import ProgressBar

        self._verb = verb
        self._factory = ProgressBar
        self._bar: Any = None
        self._network = ""

    def __call__(self, network: str, done: int, total: int, item: str) -> None:
        if network != self._network:
            self.close()
            self._network = network
            self._bar = self._factory(f"{self._verb} {network}")
        self._bar.update(done, total, item)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _progress_bars(quiet: bool) -> tuple[_ZooBar | None, _ZooBar | None]:
    if quiet:
        return None, None
    try:
        import masa.progress  # noqa: F401  (written by another part; optional here)
    except ImportError:
        return None, None
    return _ZooBar("split"), _ZooBar("profile")
