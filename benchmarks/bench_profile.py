"""Benchmark of the per-stage profiler: isolation modes and the two peak methods.

For each zoo network (split, not profiled, into a temporary store) it profiles
every stage twice, with `isolation="recycle"` (one worker, cleaned between
stages) and `isolation="process"` (a fresh worker per stage), and reports:
- wall time of each mode;
- the largest per-stage difference between the modes in load peak, resident
  size and exec peak (how much a recycled worker's history leaks in);
- how often the sampled peak (statm polling) agrees with the kernel's VmHWM
  within 10% or 1 MiB, and the largest miss;
- the load peak / weight ratio of conv and fc stages.
It prints the table and writes it to docs/profile-bench.md.

    python benchmarks/bench_profile.py [--scale 1.0] [--runs 3] [NAMES ...]

Sampling agreement depends on how busy the machine is (the sampling thread is
descheduled when other processes want the cores): the load average is printed
with the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from masa.common.atomic import atomic_write_text
from model_prep.manifest import NetworkManifest, StageProfile
from model_prep.profile import profile_network
from workloads.zoo import write_zoo

MIB = 1 << 20
DEFAULT_NAMES = ("agenet", "googlenet", "tinyyolo", "facenet")
OUTPUT = Path(__file__).resolve().parents[1] / "docs" / "profile-bench.md"


def _agrees(exact_bytes: int, sampled_bytes: int) -> bool:
    return abs(exact_bytes - sampled_bytes) <= max(0.10 * exact_bytes, MIB)


def _max_diff_mib(a: dict[str, StageProfile], b: dict[str, StageProfile], field: str) -> float:
    return max(abs(getattr(a[k], field) - getattr(b[k], field)) for k in a) / MIB


def _ratio(manifest: NetworkManifest, profiles: dict[str, StageProfile], layer: str) -> str:
    ratios = [profiles[s.stage_id].load_peak_bytes / s.weight_bytes
              for s in manifest.stages if s.layer_type == layer and s.weight_bytes >= MIB]
    return f"{statistics.median(ratios):.1f}" if ratios else "-"


def bench_network(manifest: NetworkManifest, runs: int) -> dict[str, str]:
    timings_s = {}
    results = {}
    for isolation in ("recycle", "process"):
        start_s = time.perf_counter()
        results[isolation], _ = profile_network(manifest, runs=runs, isolation=isolation)
        timings_s[isolation] = time.perf_counter() - start_s
    recycled, fresh = results["recycle"], results["process"]
    phases = [(p.load_peak_bytes, p.sampled_load_peak_bytes) for p in recycled.values()] + \
        [(p.exec_peak_bytes, p.sampled_exec_peak_bytes) for p in recycled.values()]
    agreeing = sum(_agrees(exact, sampled) for exact, sampled in phases)
    worst_miss_mib = max(exact - sampled for exact, sampled in phases) / MIB
    intervals = [p.sampling_interval_us for p in recycled.values() if p.sampling_interval_us]
    return {
        "network": manifest.name,
        "stages": str(len(manifest.stages)),
        "weights MiB": f"{sum(s.weight_bytes for s in manifest.stages) / MIB:.1f}",
        "recycle s": f"{timings_s['recycle']:.1f}",
        "process s": f"{timings_s['process']:.1f}",
        "max Δ load peak MiB": f"{_max_diff_mib(recycled, fresh, 'load_peak_bytes'):.2f}",
        "max Δ resident MiB": f"{_max_diff_mib(recycled, fresh, 'resident_bytes'):.2f}",
        "max Δ exec peak MiB": f"{_max_diff_mib(recycled, fresh, 'exec_peak_bytes'):.2f}",
        "sampled agrees": f"{agreeing}/{len(phases)}",
        "worst miss MiB": f"{max(0.0, worst_miss_mib):.2f}",
        "interval us": f"{statistics.median(intervals):.1f}" if intervals else "-",
        "load peak/weights conv": _ratio(manifest, recycled, "conv"),
        "load peak/weights fc": _ratio(manifest, recycled, "fc"),
    }


def markdown_table(rows: list[dict[str, str]]) -> str:
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row[h] for h in header) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(DEFAULT_NAMES))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="masa-bench-profile-") as store:
        manifests = write_zoo(store, args.names, scale=args.scale, profile=False)
        for manifest in manifests:
            row = bench_network(manifest, args.runs)
            print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
            rows.append(row)
    load_after = os.getloadavg()[0]
    table = markdown_table(rows)
    print(table)
    text = (
        "# Profiler benchmark\n\n"
        "Generated by `python benchmarks/bench_profile.py "
        f"--scale {args.scale} --runs {args.runs} {' '.join(args.names)}`"
        f" on {platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]};"
        f" load average {load_before:.1f} before, {load_after:.1f} after"
        " (other processes compete with the sampling thread).\n\n"
        "Columns: wall time of profiling every stage with one recycled worker and with a"
        " fresh process per stage; the largest per-stage difference between the two modes;"
        " load/exec phases whose sampled peak is within 10% or 1 MiB of the kernel VmHWM,"
        " and the largest amount the sampler missed; median sampling interval; median load"
        " peak / weight bytes of conv and fc stages with at least 1 MiB of weights."
        " See docs/profiling.md.\n\n"
        + table + "\n"
    )
    atomic_write_text(args.output, text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
