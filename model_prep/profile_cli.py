"""`masa profile DIR/NAME`: (re)profile a prepared network and rewrite its manifest.

This module owns the command line around model_prep.profile: it loads and
validates the manifest (stage files must match their sha256), profiles every
stage, prints the stage table (or, with `--json`, one JSON document) and
writes the manifest back atomically with the new profiles and runtime base.
Nothing is written when profiling fails. Exit codes (masa.cli.main):
1 when profiling a stage fails (ProfileError) or the manifest cannot be
written after all (a full disk), 2 for bad input such as a stage file that
does not match its sha256, or a manifest that cannot be rewritten (a
read-only store: refused before profiling, unless --dry-run).
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from masa.common.argtypes import positive_int
from masa.common.errors import UserError, writing
from masa.common.output import add_json_flag, print_json
from masa.common.progress import ProgressBar
from masa.common.units import format_bytes
from model_prep.feeds import bind_feeds, load_feeds
from model_prep.manifest import MANIFEST_NAME, NetworkManifest, load_manifest, write_manifest
from model_prep.profile import DEFAULT_RUNS, ISOLATION_MODES, profile_network

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure load time, exec time and peak memory of every stage of a prepared network",
        description="Profile every stage of a prepared network, one stage at a time in a "
        "fresh worker process, and rewrite DIR/NAME/manifest.yaml with the profiles. "
        "See docs/profiling.md for the method and what each figure means.",
    )
    parser.add_argument("network", metavar="DIR/NAME",
                        help="the prepared network's directory (holds manifest.yaml)")
    parser.add_argument("--runs", type=positive_int, default=DEFAULT_RUNS,
                        help=f"timed runs per stage; exec time is their median "
                        f"(default {DEFAULT_RUNS})")
    parser.add_argument("--isolation", choices=ISOLATION_MODES, default="recycle",
                        help="recycle: one worker cleaned between stages (default); "
                        "process: a fresh worker process per stage (slower)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random sample input the stages run on first, of "
                             "the shapes the manifest's sample records (default 0)")
    parser.add_argument("--sample-input", metavar="X.npz|X.npy",
                        help="run the stages on this input instead, and profile each stage "
                             "on what it receives")
    parser.add_argument("--no-sample", dest="sample", action="store_false",
                        help="skip the statm sampling thread (kernel VmHWM peaks only)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the profile table but leave the manifest untouched")
    add_json_flag(parser, "every stage's profile and the runtime base")
    parser.set_defaults(handler=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    network_dir = Path(args.network)
    manifest = load_manifest(network_dir)
    if not args.dry_run:
        _check_writable(network_dir / MANIFEST_NAME)  # before minutes of profiling
    feeds = bind_feeds(manifest, load_feeds(args.sample_input)) if args.sample_input else None
    progress = _Progress(manifest.name, quiet=getattr(args, "quiet", False))
    try:
        profiles, runtime_base = profile_network(
            manifest, runs=args.runs, isolation=args.isolation, seed=args.seed,
            sample=args.sample, progress=progress, sample_feeds=feeds,
        )
    finally:
        progress.close()
    profiled = manifest.with_profiles(profiles, runtime_base)
    if args.dry_run:
        log.info("dry run: %s left untouched", network_dir / MANIFEST_NAME)
    else:
        with writing(network_dir / MANIFEST_NAME, "the manifest"):  # a full disk: exit 1
            write_manifest(profiled, network_dir / MANIFEST_NAME)
        log.info("wrote %s", network_dir / MANIFEST_NAME)
    if args.json:
        print_json(profile_document(profiled, written=not args.dry_run))
        return 0
    for line in profile_table(profiled):
        print(line)
    base = runtime_base
    print(f"runtime base: process {format_bytes(base.process_rss_bytes)}, first session "
          f"+{format_bytes(base.first_session_bytes)} in "
          f"{base.first_session_time_us / 1000:.1f} ms")
    return 0


def _check_writable(manifest_path: Path) -> None:
    """UserError now when the manifest could not be rewritten after profiling (a
    read-only store: the atomic write needs the folder and the file writable)."""
    folder = manifest_path.parent
    if not os.access(folder, os.W_OK | os.X_OK) or not os.access(manifest_path, os.W_OK):
        raise UserError(f"{manifest_path}: cannot rewrite the manifest (read-only store or "
                        "permission denied); nothing profiled (use --dry-run to profile "
                        "without writing)")
    try:  # os.access ignores a read-only mount for root on some systems: try it
        probe = tempfile.NamedTemporaryFile(dir=folder, prefix=".masa-profile-", delete=True)
    except OSError as exc:
        raise UserError(f"{manifest_path}: cannot rewrite the manifest: "
                        f"{exc.strerror or exc}; nothing profiled (use --dry-run to profile "
                        "without writing)") from None
    probe.close()


def profile_document(manifest: NetworkManifest, written: bool) -> dict[str, Any]:
    """The `--json` form: per stage its profile (as in the manifest), and the runtime base."""
    return {
        "network": manifest.name,
        "directory": str(manifest.directory),
        "manifest_written": written,
        "runtime_base": asdict(manifest.runtime_base) if manifest.runtime_base else None,
        "stages": [
            {"id": stage.stage_id, "layer_type": stage.layer_type,
             "weight_bytes": stage.weight_bytes,
             "profile": asdict(stage.profile) if stage.profile else None}
            for stage in manifest.stages
        ],
    }


def profile_table(manifest: NetworkManifest) -> Iterable[str]:
    """One line per stage: times in ms, memory in MiB (VmHWM, and sampled in brackets)."""
    yield (f"{'stage':<16} {'layer':<5} {'weights':>8} {'load ms':>8} {'exec ms':>8} "
           f"{'load peak':>16} {'resident':>8} {'exec peak':>16}")
    for stage in manifest.stages:
        profile = stage.profile
        head = f"{stage.stage_id[:16]:<16} {stage.layer_type:<5} {_mib(stage.weight_bytes):>8}"
        if profile is None:
            yield f"{head} {'(not profiled)':>8}"
            continue
        # sampling_interval_us 0: not sampled, the sampled fields repeat VmHWM.
        sampled = profile.sampling_interval_us > 0
        yield (f"{head} {profile.load_time_us / 1000:>8.2f} {profile.exec_time_us / 1000:>8.2f} "
               f"{_pair(profile.load_peak_bytes, profile.sampled_load_peak_bytes, sampled):>16} "
               f"{_mib(profile.resident_bytes):>8} "
               f"{_pair(profile.exec_peak_bytes, profile.sampled_exec_peak_bytes, sampled):>16}")


def _mib(memory_bytes: int) -> str:
    return f"{memory_bytes / 2**20:.2f}"


def _pair(exact_bytes: int, sampled_bytes: int, sampled: bool) -> str:
    return f"{_mib(exact_bytes)} ({_mib(sampled_bytes)})" if sampled else _mib(exact_bytes)


class _Progress:
    """The shared progress bar on a terminal, else one log line per stage."""

    def __init__(self, name: str, quiet: bool) -> None:
        self.name = name
        self.bar = ProgressBar(f"profile {name}", enabled=False if quiet else None)

    def __call__(self, done: int, total: int, stage_id: str) -> None:
        if self.bar.enabled:
            self.bar.update(done, total, stage_id)
        else:
            log.info("profiled %s/%s (%d/%d)", self.name, stage_id, done, total)

    def close(self) -> None:
        self.bar.close()
