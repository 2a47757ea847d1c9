"""Where a cell's CPU time goes on the emulated device: each policy's run under perf.

bench_contention.py finds that the executor's loop takes about a third of a core in
the light cell under every policy, and that Masa's workers wait for a core where
Bulk's do not. This benchmark says what that CPU time is. Each policy runs one
bench_device.py cell for real on the emulated device (the same jobs, cap, card and
cold cache) while `perf record -a -g` samples every CPU; the samples of the run's
process are split into its loop (the main thread), its workers and its other threads,
and inside the kernel by the system call or page fault that entered it
(masa.report.cpu_profile). Each thread group's time on a CPU and waiting for one
(the emulation's schedstat sampler) is kept beside it.

    sudo python benchmarks/bench_cpu_profile.py [--cell 'light|1024MiB|rho0.7|60s|w2|wait']
    python benchmarks/bench_cpu_profile.py --doc-only   # re-render from the JSON

Needs root, cgroups (masa.runtime.emulation) and perf (linux-perf / linux-tools).
Writes docs/bench-data/cpu-profile.json (one entry per invocation, appended) and
docs/bench-cpu-profile.md.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_device as device_bench

from masa.common.libc import WORKER_THREAD_PREFIX
from masa.report.cpu_profile import parse_perf_script, run_threads
from masa.runtime.emulation import check_emulation, run_emulated

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "bench-data" / "cpu-profile.json"
DOC = ROOT / "docs" / "bench-cpu-profile.md"
DEFAULT_CELL = "light|1024MiB|rho0.7|60s|w2|wait"
POLICIES = ("bulk", "masa", "deepeye")
SAMPLE_HZ = 199  # a prime, so sampling does not beat with a periodic task
SHOWN = 6  # kernel entries and user objects named per thread group

ANALYSIS = """\
## Reading

Written by hand on 2026-11-28 (session 37) from the light cell's entry above; the
tables are regenerated from the JSON, this text is not.

- **The three policies spend their CPU alike; Masa's threads wait for it.** The loop
  ran 13.7-17.1 s on a CPU over the 60 s of arrivals, about half of it in the kernel,
  the workers 52.8-58.8 s, a third in the kernel. Masa's workers waited 13.7 s for a
  CPU against DeepEye's 8.2 s and Bulk's 2.4 s, and its loop 9.6 s against Bulk's
  2.0 s: as bench-contention.md found from schedstat alone, Bulk leaves a core idle
  for the loop and Masa does not. perf's seconds and schedstat's agree within 5%.
- **About 30% of the run's CPU is the price of Masa's memory discipline, under every
  policy.** Locking each LOAD's mapped weights (mlock: 15-16% of the workers'
  samples), unmapping them and the session's own mapping at the release (munmap:
  25-27% of the loop's), returning freed heap after a release (madvise, the
  malloc_trim of masa.runtime.threads: 8-13% of the loop's) and faulting pages in
  (page faults: 10-11% of the workers', 8-9% of the loop's; in Masa's first perf run
  of the cell, not kept, about two in five of the workers' were fresh anonymous
  memory, the activations each EXEC maps anew since glibc's mmap threshold is pinned
  at 1 MiB and hands every larger buffer back at free,
  model_prep.session.pin_malloc_threshold, and about one in three the weights
  through the session's own mapping of its file). For
  Masa that is 22.4 s of 75.9 s, for Bulk 21.3 of 69.4. Each guards a budget: locked
  weights cannot be reclaimed before their EXEC, returned memory is not held beyond
  the ledger. Where the cap leaves room for every stage file beside the budget none
  of it would be needed, but the grid's caps are the budget plus the runtime's base,
  so no cell has that room.
- **One more run of the cell, another mean.** DeepEye's run here took 1.77 s, below
  its four recorded runs (3.1-5.3 s) and 7% under the calibrated simulation's 1.9 s;
  Masa's 3.17 s and Bulk's 8.59 s fall inside and below theirs (2.2-3.4 s,
  10.0-13.1 s). These runs are not in bench-device.jsonl (perf sampled them).
- **Since 3e695af the loop trims less** (2026-11-28, session 38; the profile above is
  of daace0d, where the loop returned freed heap after every release). Runs now keep
  up to min(4 MiB, budget / 64) of it, as the daemon did
  (masa.runtime.threads.default_heap_slack_bytes). In four runs of this cell each
  way, alternating, on the emulated device (not recorded), Masa's loop spent
  14.2-15.6 s on a CPU instead of 17.1-17.7 s, its workers 53.4-56.6 s instead of
  57.4-58.8 s, and its mean response was 1.8-2.3 s instead of 2.3-3.1 s; in the
  two runs each way that recorded it, its measured peak rose from 263.4-263.6 MiB
  to 268.0-270.1 MiB (reserved 354 MiB, budget 1 GiB).
  This profile was not run again.
"""


def profile_cell(cell: Any, policies: Sequence[str], args: argparse.Namespace, pin: Any
                 ) -> dict[str, Any]:
    """The cell's run of each policy under perf (the runtime's base measured once)."""
    store = device_bench.store_of(cell, args)
    with tempfile.TemporaryDirectory(prefix="bench-cpu-profile-") as scratch_dir:
        scratch = Path(scratch_dir)
        workload = device_bench.board_workload(cell, store, scratch, pin)
        base_bytes = device_bench.measure_base(cell, store, workload)
        runs = [profiled_run(cell, policy, (store, workload, base_bytes), scratch, args.hz)
                for policy in policies]
    return {"cell": cell.key, "commit": device_bench._commit(), "sample_hz": args.hz,
            "started": datetime.now(UTC).isoformat(timespec="seconds"), "runs": runs}


def profiled_run(cell: Any, policy: str, where: tuple[Path, Path, int], scratch: Path,
                 hz: int) -> dict[str, Any]:
    """One real run of `policy` while perf samples every CPU; its samples by thread."""
    store, workload, base_bytes = where
    budget_bytes = cell.budget_mib * device_bench.MIB
    device = device_bench.board(base_bytes + budget_bytes)
    plan = check_emulation(device, store)
    data = scratch / f"perf-{policy}.data"
    perf = subprocess.Popen(["perf", "record", "-a", "-g", "-F", str(hz), "-q", "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        run = run_emulated(plan, device_bench._spec(cell, workload, store, policy, budget_bytes))
    finally:
        perf.send_signal(signal.SIGINT)  # perf writes its file on SIGINT
        _, perf_errors = perf.communicate(timeout=120)
    if run.status != "finished":
        raise SystemExit(f"{cell.key} {policy}: the real run {run.status} ({run.reason})")
    if perf.returncode not in (0, -signal.SIGINT):
        raise SystemExit(f"perf record failed ({perf.returncode}): {perf_errors.decode()[-300:]}")
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
                            capture_output=True, text=True, check=True)
    threads = run_threads(parse_perf_script(script.stdout.splitlines()))
    mean_ms = device_bench._stats(run.report)["mean_ms"] if run.report else None
    print(f"{cell.key} {policy}: mean response {mean_ms} ms; "
          + "; ".join(f"{name} {group.samples / hz:.1f} s on a CPU "
                      f"({100 * group.kernel_samples / max(1, group.samples):.0f}% kernel)"
                      for name, group in threads.items() if name in ("loop", "workers")),
          flush=True)
    return {"policy": policy, "mean_ms": mean_ms,
            "threads": {name: group.as_dict() for name, group in threads.items()},
            "schedstat_s": run.thread_cpu_s}


def render(entries: Sequence[dict[str, Any]]) -> str:
    lines = ["# Where the CPU time goes: one cell under perf", "",
             device_bench.one_cell_provenance("bench_cpu_profile.py", DATA,
                                              "root, cgroups and perf")
             + "Each policy ran the cell once for real on the emulated device "
             "(bench_device.py's jobs, cap, card and cold cache) while `perf record -a -g` "
             "sampled every CPU. A thread group's seconds are its samples over the "
             "sampling rate; a kernel sample is named by the system call or page fault "
             "that entered the kernel, a user sample by the object it ran in. On a CPU / "
             "waiting: the same threads' schedstat, sampled by the emulation "
             "(EmulatedRun.thread_cpu_s).", ""]
    for entry in entries:
        lines += [f"## {entry['cell']} ({entry['started']}, commit {entry['commit']}, "
                  f"{entry['sample_hz']} Hz)", "",
                  "| policy | mean response | threads | on a CPU (perf) | kernel | "
                  "kernel, by entry | user, by object | on a CPU / waiting (schedstat) |",
                  "|---|---|---|---|---|---|---|---|"]
        for run in entry["runs"]:
            lines += _run_rows(run, entry["sample_hz"])
        lines.append("")
    return "\n".join(lines) + "\n" + ANALYSIS


def _run_rows(run: dict[str, Any], hz: int) -> list[str]:
    rows = []
    schedstat = run.get("schedstat_s") or {}
    names = {"loop": "python", "workers": WORKER_THREAD_PREFIX}
    for name in ("loop", "workers"):
        group = run["threads"].get(name)
        if group is None:
            continue
        samples = max(1, group["samples"])
        kernel = ", ".join(f"{entry} {100 * count / samples:.0f}%" for entry, count
                           in list(group["kernel_by_entry"].items())[:SHOWN])
        user = ", ".join(f"{_short(obj)} {100 * count / samples:.0f}%" for obj, count
                         in list(group["user_by_object"].items())[:SHOWN // 2])
        on_cpu, waiting = schedstat.get(names[name], [None, None])
        rows.append(f"| {run['policy']} | {_ms(run.get('mean_ms'))} | {name} | "
                    f"{group['samples'] / hz:.1f} s | "
                    f"{100 * group['kernel_samples'] / samples:.0f}% | {kernel} | {user} | "
                    f"{_s(on_cpu)} / {_s(waiting)} |")
    return rows


def _short(obj: str) -> str:
    """A shared object's name without its ABI tags (onnxruntime_pybind11_state.so)."""
    stem, _, _ = obj.partition(".cpython")
    return stem if stem != obj else obj


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value / 1000:.2f} s"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = device_bench.one_cell_parser(__doc__, DEFAULT_CELL, POLICIES, DATA)
    parser.add_argument("--hz", type=int, default=SAMPLE_HZ, help="samples per second per CPU")
    args = parser.parse_args(argv)
    if not args.doc_only and shutil.which("perf") is None:
        parser.error("perf is not installed (linux-perf or linux-tools): nothing samples")
    return device_bench.one_cell_main(
        parser, args, DATA, DOC, render,
        lambda cell, pin: profile_cell(cell, args.policies, args, pin))


if __name__ == "__main__":
    raise SystemExit(main())
