"""Where the simulator's CPU time per task is off on the emulated device: one cell traced.

bench_device.py compares each run's mean response with the calibrated simulation's
and its EXEC time per network; this benchmark looks inside one cell, task by task.
Each policy runs the cell for real on the emulated device (as bench_device.py's
runs: the same jobs, cap, card and cold cache) with a Chrome trace, and the
calibrated simulation of the same run writes its trace too. From each trace
(masa.report.contention):

- each stage's EXEC time alone (the median over its EXECs that ran while no other
  worker ran a task) against its profiled time: the profiler times warm runs of a
  session, the scheduler runs every loaded stage once, on a fresh session;
- the multipliers beside another worker's EXEC and beside its LOAD that explain the
  EXECs' times given those times alone (Bulk's trace gives them: its EXECs run
  alone), next to the simulator's, read back from its own trace the same way.

    sudo python benchmarks/bench_contention.py [--cell 'light|1024MiB|rho0.7|60s|w2|wait']
    python benchmarks/bench_contention.py --doc-only   # re-render from the JSON

Needs root and cgroups (masa.runtime.emulation), as bench_device.py. Writes
docs/bench-data/contention.json (one entry per invocation, appended: the runs'
figures and the analysis; the traces themselves are not kept) and
docs/bench-contention.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_device as device_bench
import numpy as np

from masa.common.atomic import atomic_write_text
from masa.report.contention import (
    BesideShares,
    alone_times_us,
    beside_shares,
    fit_contention,
    task_spans,
)
from masa.runtime.emulation import check_emulation, run_emulated

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "bench-data" / "contention.json"
DOC = ROOT / "docs" / "bench-contention.md"
DEFAULT_CELL = "light|1024MiB|rho0.7|60s|w2|wait"
POLICIES = ("bulk", "masa", "deepeye")  # Bulk first: its EXECs alone are the reference
MIN_PROFILED_US = 300  # shorter stages (a last fc of a few us) say more about timers


def trace_cell(cell: Any, policies: Sequence[str], args: argparse.Namespace, pin: Any
               ) -> dict[str, Any]:
    """The cell's runs of `policies`, each real and simulated, with their EXECs' shares
    beside other tasks (the runtime's base measured once, as bench_device.py does)."""
    store = device_bench.store_of(cell, args)
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as scratch_dir:
        scratch = Path(scratch_dir)
        workload = device_bench.cell_workload(
            cell, store, scratch,
            device_bench.load_device(device_bench.BOARD).read_bytes_per_s or 1,
            pin.cpu_factor_by_network)
        prepared = device_bench.prepare_run(workload, store, cell.context)
        base_bytes = device_bench.measure_base(cell, store, workload)
        traced = [traced_run(cell, policy, prepared, (store, workload, base_bytes), pin,
                             scratch) for policy in policies]
    profiled_us = {(name, stage.stage_id): stage.profile.exec_time_us
                   for name, manifest in prepared.manifests.items()
                   for stage in manifest.stages if stage.profile}
    return {"cell": cell.key, "base_mib": round(base_bytes / device_bench.MIB, 1),
            "runs": [run for run, _ in traced],
            **analyse({run["policy"]: shares for run, shares in traced}, profiled_us)}


def traced_run(cell: Any, policy: str, prepared: Any, where: tuple[Path, Path, int],
               pin: Any, scratch: Path
               ) -> tuple[dict[str, Any], dict[str, list[BesideShares]]]:
    """One real run of `policy` on the cell's emulated device with its trace, and the
    calibrated simulation's trace (host speed probed before and after the run): their
    figures, and per side (real, simulated) the EXECs' shares beside other tasks.
    `where`: the store, the cell's workload file and the measured runtime base."""
    store, workload, base_bytes = where
    budget_bytes = cell.budget_mib * device_bench.MIB
    device = device_bench.board(base_bytes + budget_bytes)
    spec = device_bench._spec(cell, workload, store, policy, budget_bytes)
    spec["trace_path"] = str(scratch / f"real-{policy}.json")
    load_before, probe_before = os.getloadavg()[0], device_bench.host_cpu_scale(store)
    run = run_emulated(check_emulation(device, store), spec)
    if run.status != "finished":
        raise SystemExit(f"{cell.key} {policy}: the real run {run.status} ({run.reason})")
    probes = [probe_before, device_bench.host_cpu_scale(store)]
    meta = {"workload": cell.scenario, **device_bench._profiled_us_by_network(prepared)}
    real = device_bench.emulated_report(run.as_dict(), run.report, policy=policy,
                                        workers=cell.workers, jobs=len(prepared.jobs))
    real.setdefault("meta", {}).update(meta)
    model = device_bench.calibrated_model(prepared, device, base_bytes, cell, pin,
                                          float(np.mean(probes)))
    if model is None:
        raise SystemExit("the pinned profile has no calibrated CPU factors to simulate with")
    settings = device_bench.cell_settings(cell, device_bench.ran_rule(policy, run.report or {}),
                                          device_bench.ran_cache_first(run.report or {}))
    sim_trace = scratch / f"sim-{policy}.json"
    simulated = device_bench.simulated_device_report(prepared, settings, model, device, meta,
                                                     trace_path=sim_trace)
    sides = {"real": _figures(real), "simulated": _figures(simulated)}
    print(f"{cell.key} {policy}: mean response real {sides['real']['mean_ms']} ms, "
          f"simulated {sides['simulated']['mean_ms']} ms", flush=True)
    shares = {side: beside_shares(task_spans(json.loads(Path(path).read_text())))
              for side, path in (("real", spec["trace_path"]), ("simulated", sim_trace))}
    return ({"policy": policy, "commit": device_bench._commit(),
             "started": datetime.now(UTC).isoformat(timespec="seconds"),
             "load_before": round(load_before, 2), "host_cpu_scale": probes,
             "sides": sides}, shares)


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    stats = device_bench._stats(report)
    return {"mean_ms": stats["mean_ms"], "exec_ratio_by_network": stats["exec_ratio_by_network"]}


def analyse(shares: dict[str, dict[str, list[BesideShares]]],
            profiled_us: dict[tuple[str, str], int]) -> dict[str, Any]:
    """Per side (real, simulated): each stage's time alone in Bulk's run over its profiled
    time, and per policy the multipliers fitted against those times alone."""
    found: dict[str, Any] = {}
    for side in ("real", "simulated"):
        alone = {stage: us for stage, us in alone_times_us(shares["bulk"][side]).items()
                 if profiled_us.get(stage, 0) >= MIN_PROFILED_US}
        fits = {}
        for policy, by_side in shares.items():
            fit = fit_contention(by_side[side], alone)
            fits[policy] = None if fit is None else fit.__dict__
        found[side] = {"alone_over_profiled": {
            f"{n}/{s}": [profiled_us[n, s], round(us / profiled_us[n, s], 3)]
            for (n, s), us in sorted(alone.items())}, "fits": fits}
    return found


# ------------------------------------------------------------------ the page


ANALYSIS = """\
## Reading (written 2026-11-28 from the light cell's runs on 6fd9b06; not regenerated)

- **Every EXEC is a first run.** The profiler times the median of warm runs of a
  session (model_prep/profile_worker.py); a Masa, Bulk or DeepEye run loads a stage and
  runs it once. Alone, in Bulk's run, a network's first stage (the 227x227 image in,
  large activations out) takes about 1.5x its profiled time and the fc stages whose
  weights are mapped 1.3-1.6x, while the convolutions in between take 0.9-1.1x and
  FaceNet's largest fc (144 MiB mapped) 0.7x. The simulator charges one factor per
  network (their mean over the network's stages, fitted on Bulk's runs), so each
  network's total is right for Bulk and each stage's share of it is not.
- **Beside another task an EXEC is slower than the simulator charges, and by how
  much depends on the policy.** Against those times alone, DeepEye's EXECs take
  about 1.4-1.5x beside another worker's EXEC or LOAD, Masa's 1.2-1.3x; the
  simulator charges 1.146x for both (its multiplier is the median of whole-run
  ratios, which include the time an EXEC ran alone: a lower bound, as
  bench_device.py's `fit_contention` says). DeepEye's lanes put the conv stages of one
  network beside the fc stages of another, the pairs that slow each other most;
  Masa's beside pairs are more often an EXEC and a short LOAD.
- **Why DeepEye in light is the simulator's largest miss where memory does not
  bind.** Its conv lane runs near saturation there, so its mean is set by how fast the
  cold start's backlog drains; EXECs 10-20% slower than simulated (the per-network
  EXEC ratios above) double the real mean. One multiplier for every pair cannot fit
  both policies: raising it to 1.2 or 1.25 for all brings DeepEye in light closer
  and overestimates Masa in small by 1.6-2.3x (`/tmp` experiment, 2026-11-28). A
  model of contention per pair of stages (memory-bound fc and first stages beside
  each other) is what the traces call for; it is not built.
"""


def render(entries: Sequence[dict[str, Any]]) -> str:
    lines = ["# Contention, task by task: where the simulator's CPU time is off", "",
             "Written by `benchmarks/bench_contention.py` from "
             "docs/bench-data/contention.json (regenerate: `python "
             "benchmarks/bench_contention.py --doc-only`; run again: `sudo python "
             "benchmarks/bench_contention.py --cell KEY`, root and cgroups needed). "
             "Each policy ran the cell once for real on the emulated device with a "
             "Chrome trace; the calibrated simulation of the same run wrote its own. "
             "A stage's time alone is the median of its EXECs that ran while no other "
             "worker ran a task, in Bulk's run (its EXECs run alone); the multipliers "
             "are fitted on each run's EXECs against those times (masa.report.contention; "
             "the simulator's are read back from its trace the same way, a check of "
             "the method: tests/test_contention.py recovers a charged multiplier within "
             "0.01).", ""]
    for entry in entries:
        lines += _cell_lines(entry)
    return "\n".join(lines + ["", ANALYSIS])


def _cell_lines(entry: dict[str, Any]) -> list[str]:
    runs, found = entry["runs"], entry
    lines = [f"## {entry['cell']}, {runs[0]['started'][:16].replace('T', ' ')} UTC", "",
             "Runs: " + "; ".join(
                 f"{run['policy']} on {run['commit']} ({run['started']}, load "
                 f"{run['load_before']}, host {run['host_cpu_scale'][0]:.3f}-"
                 f"{run['host_cpu_scale'][1]:.3f}x the profile)" for run in runs)
             + f"; runtime base {entry['base_mib']} MiB.", "",
             "| policy | mean response, real / simulated | EXEC time per profiled, "
             "real / simulated | EXEC time beside an EXEC, a LOAD (real) | multiplier "
             "alone (against Bulk's), real / simulated | beside an EXEC | beside a LOAD |",
             "|---|---|---|---|---|---|---|"]
    for run in runs:
        real, sim = run["sides"]["real"], run["sides"]["simulated"]
        fit_real = found["real"]["fits"].get(run["policy"])
        fit_sim = found["simulated"]["fits"].get(run["policy"])
        ratios = ", ".join(
            f"{network} {ratio:.2f} / {sim['exec_ratio_by_network'].get(network, 0):.2f}"
            for network, ratio in sorted(real["exec_ratio_by_network"].items()))
        lines.append(
            f"| {run['policy']} | {real['mean_ms'] / 1e3:.2f} / {sim['mean_ms'] / 1e3:.2f} s "
            f"| {ratios} | {_share(fit_real)} | {_fitted(fit_real, fit_sim, 'alone')} "
            f"| {_fitted(fit_real, fit_sim, 'beside_exec')} "
            f"| {_fitted(fit_real, fit_sim, 'beside_load')} |")
    lines += ["", "Each stage's EXEC time alone per profiled (warm) time, in Bulk's run:", "",
              "| stage | profiled | real | simulated |", "|---|---|---|---|"]
    simulated = found["simulated"]["alone_over_profiled"]
    for stage, (profiled_us, ratio) in found["real"]["alone_over_profiled"].items():
        lines.append(f"| {stage} | {profiled_us / 1e3:.1f} ms | {ratio:.2f}x "
                     f"| {_x((simulated.get(stage) or [0, None])[1])} |")
    return lines + [""]


def _share(fit: dict[str, Any] | None) -> str:
    if fit is None:
        return "-"
    return f"{fit['share_beside_exec']:.0%}, {fit['share_beside_load']:.0%}"


def _fitted(real: dict[str, Any] | None, sim: dict[str, Any] | None, name: str) -> str:
    return f"{_x(real and real[name])} / {_x(sim and sim[name])}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default=DEFAULT_CELL, help="bench_device.py's cell key")
    parser.add_argument("--policies", type=lambda t: [p for p in t.split(",") if p],
                        default=list(POLICIES), help="comma-separated; bulk is needed "
                        "(its EXECs alone are the reference)")
    parser.add_argument("--cache", type=Path, default=device_bench.DEFAULT_CACHE)
    parser.add_argument("--copy-cache", type=Path, default=None)
    parser.add_argument("--pin", type=Path, default=device_bench.PINNED)
    parser.add_argument("--doc-only", action="store_true",
                        help="re-render the page from docs/bench-data/contention.json")
    args = parser.parse_args(argv)
    entries = json.loads(DATA.read_text()) if DATA.exists() else []
    if not args.doc_only:
        if "bulk" not in args.policies:
            parser.error("--policies: bulk is needed (its EXECs alone are the reference)")
        cells = {cell.key: cell for cell in device_bench.grid()}
        if args.cell not in cells:
            parser.error(f"--cell: {args.cell!r} is not a cell of bench_device.py's grid")
        pin = device_bench.pinned_stores(args)
        entry = trace_cell(cells[args.cell], ["bulk"] + [p for p in args.policies
                                                         if p != "bulk"], args, pin)
        entries.append(entry)
        atomic_write_text(DATA, json.dumps(entries) + "\n")
    if not entries:
        parser.error(f"{DATA}: no traced cell yet (run without --doc-only, as root)")
    atomic_write_text(DOC, render(entries))
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
