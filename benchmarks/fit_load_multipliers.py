"""The LOADs' own CPU multipliers, fitted on the runs where the CPU binds and checked.

docs/bench-contention.md traced small at 512 MiB / 0.7 with its LOADs: a LOAD beside
another LOAD took about 2.2x its time alone, where the simulator charged every task
one multiplier beside another and each network's LOAD factor as its LOADs ran (mostly
beside other tasks: `bench_device.fit_load_over_exec`). This script fits the model
masa.runtime.virtual.DeviceModel has for that: a LOAD's work is its profiled time x
its network's pinned LOAD factor x the run's host probe (together h f) x a scale a
for the time alone; it runs at 1/m_LL of its speed while another LOAD runs and at
1/m_LE while only EXECs do. Summed over a network's LOADs in a run, with the shares
of their time spent alone (S_A), beside a LOAD (S_LL) and beside an EXEC (S_LE),
the run's LOAD time per profiled time r satisfies

    h f / r = S_A / a + S_LL / (a m_LL) + S_LE / (a m_LE),

linear in 1/a, 1/(a m_LL) and 1/(a m_LE) (masa.report.contention.fit_load_multipliers):
least squares over every network of every run that read each stage file about once
(`bench_device.is_cached`; a thrashing run's LOADs wait for the card) and loaded
every stage it ran (Masa keeping stages loaded skips most LOADs), each run weighing
one, its networks by their LOAD time. The real runs record r per network
(past its first instances), not the shares: those come from the run simulated with
the current setting (its Chrome trace; with four workers a LOAD beside a LOAD and an
EXEC counts as beside a LOAD, as the simulator charges it), so the fit is repeated
with the setting it found.

The grid's runs hardly tell m_LL apart from a: Bulk's LOADs run beside its other
LOADs or alone, so their shares alone and beside a LOAD move together, and few LOADs
of any policy run alone (11-18% of their time). Fitted free on the 2026-11-28 runs,
with the shares from two simulations of them (the model as pinned before and
--alone-scale 0.51 --beside-load 2.2 --beside-exec 1.9), the three figures moved
apart (a 0.88 and 0.96, m_LL 1.40 and 1.25, m_LE 1.13 and 1.02: the policies' LOAD
times pin one relation between them, not all three), where the traces measure m_LL
directly; held at 2.2, a and m_LE stayed (0.64, 1.63 and 1.61). So m_LL is held at
what the traces of docs/bench-contention.md measured, each LOAD against Bulk's LOADs
alone (`traced_beside_load`: the mean over the policies whose LOADs spent at least a
third of their time beside another LOAD; --fit-beside-load fits it too), and a and
m_LE are fitted.

Each policy's run in each cell where the CPU binds since the latest
`CPU_REPEAT_EPOCHS` start (as the page counts them) is simulated with the setting,
and its mean compared with the real one. Without --fit it checks the setting given
(or pinned); with --save the fitted setting is pinned (then `bench_device.py
--resimulate` and `--doc-only`).

    python benchmarks/fit_load_multipliers.py --fit 2 [--save] [--only small]
    python benchmarks/fit_load_multipliers.py --alone-scale 0.51 --beside-load 2.2 \\
        --beside-exec 1.9
    python benchmarks/fit_load_multipliers.py --execs   # the EXECs' multipliers, printed
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bench_contention as contention_bench
import bench_device as device_bench
import numpy as np

from masa.report.contention import (
    LoadShares,
    beside_shares,
    fit_load_multipliers,
    load_shares_by_network,
    task_spans,
)


@dataclass(frozen=True)
class Setting:
    """The LOADs' scale alone and their multipliers beside a LOAD and beside an EXEC."""

    alone_scale: float
    beside_load: float
    beside_exec: float

    def on(self, pin: Any) -> Any:
        return replace(pin, load_alone_scale=self.alone_scale,
                       load_beside_load_multiplier=self.beside_load,
                       load_beside_exec_multiplier=self.beside_exec)

    def __str__(self) -> str:
        return (f"alone x{self.alone_scale}, beside a LOAD x{self.beside_load}, "
                f"beside an EXEC x{self.beside_exec}")


@dataclass(frozen=True)
class SimulatedRun:
    """A recorded run simulated with a setting: its mean's error against the real one
    and, per network, the shares of its LOADs' time alone, beside a LOAD and beside an
    EXEC and their total time (us)."""

    record: dict[str, Any]
    simulated_mean_ms: float
    shares_by_network: dict[str, LoadShares]
    # ... and its EXECs' (`--execs`): alone, beside a LOAD, beside EXECs only
    exec_shares_by_network: dict[str, LoadShares]

    @property
    def error(self) -> float:
        return self.simulated_mean_ms / self.record["real"]["mean_ms"] - 1


def cpu_bound_runs(pin: Any, only: str) -> list[dict[str, Any]]:
    """Each policy's run in each grid cell where the CPU binds, as the page counts them
    (bench_device._by_cell: the latest run, its real mean averaged over its repeats),
    made since the latest epoch, its memory estimates as profiled; keys starting with
    `only`."""
    cells = {cell.key: cell for cell in device_bench.grid()}
    by_cell = device_bench._by_cell(device_bench.current(
        device_bench.load_results(device_bench.RESULTS), pin))
    return [record for key, runs in sorted(by_cell.items()) for _, record in sorted(runs.items())
            if key in cells and key.startswith(only) and cells[key].memory_scale == 1.0
            and record["started"] >= device_bench.CPU_REPEAT_EPOCHS[-1]
            and device_bench.bound_by(record) == "cpu"]


def simulate_runs(records: Sequence[dict[str, Any]], pin: Any, args: argparse.Namespace,
                  scratch: Path, prepared: dict[str, Any]) -> list[SimulatedRun]:
    cells = {cell.key: cell for cell in device_bench.grid()}
    runs = []
    for index, record in enumerate(records):
        cell = cells[record["key"]]
        store = device_bench.store_of(cell, args)
        if cell.key not in prepared:
            workload = device_bench.board_workload(cell, store, scratch, pin)
            prepared[cell.key] = device_bench.prepare_run(workload, store, cell.context)
        device, base_bytes = device_bench.recorded_device(record, cell)
        trace_path = scratch / f"trace-{index}.json"
        trace_path.unlink(missing_ok=True)
        simulated = device_bench.simulate(
            device_bench.simulated_policy(record), prepared[cell.key], device, base_bytes,
            cell, pin, device_bench.host_scale_of(record, pin),
            cache_first=record.get("cache_first", False), calibrated_only=True,
            trace_path=trace_path,
            record_bytes_per_task=device_bench.record_bytes_of(record))["simulated_cpu"]
        spans = task_spans(json.loads(trace_path.read_text())) if trace_path.is_file() else []
        shares = load_shares_by_network(beside_shares(spans, kind="load"),
                                        skip_first=device_bench.CACHED_AFTER)
        exec_shares = load_shares_by_network(beside_shares(spans, kind="exec"))
        runs.append(SimulatedRun(record, simulated["mean_ms"], shares, exec_shares))
    return runs


def fit_execs(runs: Sequence[SimulatedRun], pin: Any) -> None:
    """Print the EXECs' scale alone and multipliers beside a LOAD and beside an EXEC
    that best explain the runs' EXEC time per network (the LOADs' model applied to
    EXECs: `fit_load_multipliers`, their factors alone x the run's probe as the
    reference), and how far each policy's EXECs are from it and from the pinned model
    (alone 1.0, one multiplier beside any task): nothing is pinned."""
    rows: list[tuple[str, str, LoadShares, float, float]] = []
    for run in runs:
        record = run.record
        ratios = record["real"].get("exec_ratio_by_network") or {}
        exec_factors, _, _ = pin.simulator_cpu(device_bench.host_scale_of(record, pin),
                                               record.get("store", "mmap"))
        shares = run.exec_shares_by_network
        networks = [n for n in ratios if n in shares and n in exec_factors]
        total_us = sum(shares[n].duration_us for n in networks)
        rows += [(record["policy"], record["key"], shares[n], ratios[n] / exec_factors[n],
                  shares[n].duration_us / total_us) for n in networks]
    fitted = fit_load_multipliers([(shares, ratio, weight)
                                   for _, _, shares, ratio, weight in rows])
    if fitted is None:
        raise SystemExit("the runs' EXEC shares do not tell the contexts apart")
    alone, beside_load, beside_exec = fitted
    shared = pin.shared_cpu_multiplier
    print(f"EXECs fitted on {len(runs)} runs: alone x{alone:.3f}, beside a LOAD "
          f"x{beside_load:.3f}, beside an EXEC x{beside_exec:.3f} (pinned: alone x1.0, "
          f"beside any task x{shared})")

    def predicted(shares: LoadShares, alone: float, beside_load: float,
                  beside_exec: float) -> float:
        return 1 / (shares.alone / alone + shares.beside_load / (alone * beside_load)
                    + shares.beside_exec / (alone * beside_exec))

    for policy in sorted({row[0] for row in rows}):
        own = [row for row in rows if row[0] == policy]
        weights = [row[4] for row in own]
        off = {label: np.average([ratio / predicted(shares, *model) - 1
                                  for _, _, shares, ratio, _ in own], weights=weights)
               for label, model in (("fitted", fitted), ("pinned", (1.0, shared, shared)))}
        print(f"  {policy}: its EXEC time over the fitted model's {off['fitted']:+.1%}, over "
              f"the pinned model's {off['pinned']:+.1%}; by cell, over the fitted model's:")
        for key in sorted({row[1] for row in own}):
            cell = [row for row in own if row[1] == key]
            errors = [ratio / predicted(shares, *fitted) - 1 for _, _, shares, ratio, _ in cell]
            print(f"    {key}: {np.average(errors, weights=[row[4] for row in cell]):+.1%}")


TRACED_SHARE_BESIDE_LOAD = 1 / 3  # a policy's traced fit of m_LL counts from this share


def traced_beside_load(path: Path = contention_bench.DATA) -> tuple[float, str]:
    """A LOAD's multiplier beside another LOAD as the latest traced cell measured it
    (its LOADs' fits against Bulk's LOADs alone: the mean over the policies whose
    LOADs spent at least TRACED_SHARE_BESIDE_LOAD of their time beside a LOAD), and
    where it comes from."""
    entries = [entry for entry in json.loads(path.read_text()) if entry.get("loads")]
    if not entries:
        raise SystemExit(f"{path}: no traced cell has its LOADs' fits: run "
                         "bench_contention.py --cell 'small|512MiB|rho0.7|60s|w2|oblivious'")
    fits = entries[-1]["loads"]["real"]["fits"]
    found = {policy: fit["beside_load"] for policy, fit in fits.items()
             if fit["beside_load"] and fit["share_beside_load"] >= TRACED_SHARE_BESIDE_LOAD}
    if not found:
        raise SystemExit(f"{path}: no policy's LOADs ran beside a LOAD for a third of "
                         "their time in the latest traced cell")
    value = round(float(np.mean(list(found.values()))), 3)
    return value, (f"m_LL the mean of {', '.join(f'{p} {v:.2f}x' for p, v in found.items())} "
                   f"traced in {entries[-1]['cell']} (docs/bench-contention.md)")


def fit(runs: Sequence[SimulatedRun], pin: Any, beside_load: float | None
        ) -> tuple[Setting, int]:
    """The setting that best explains the cached runs' LOAD times per network, given
    the shares their simulations found (`beside_load`: m_LL held), and how many runs
    it used."""
    base = replace(pin, load_alone_scale=1.0)
    rows = []
    used = 0
    for run in runs:
        record = run.record
        ratios = record["real"].get("load_ratio_by_network") or {}
        if not device_bench.is_cached(record) or record.get("keep_loaded"):
            continue  # LOADs waiting for the card; LOADs of stages kept loaded
        _, load_factors, _ = base.simulator_cpu(device_bench.host_scale_of(record, pin))
        networks = [network for network in ratios
                    if network in run.shares_by_network and network in load_factors]
        total_us = sum(run.shares_by_network[network].duration_us for network in networks)
        if not total_us:
            continue
        used += 1
        rows += [(run.shares_by_network[network], ratios[network] / load_factors[network],
                  run.shares_by_network[network].duration_us / total_us)
                 for network in networks]
    fitted = fit_load_multipliers(rows, beside_load)
    if fitted is None:
        raise SystemExit(f"fit_load_multipliers: {used} cached runs with LOAD times do not "
                         "tell a LOAD alone, beside a LOAD and beside an EXEC apart")
    return Setting(*(round(value, 3) for value in fitted)), used


def report(runs: Sequence[SimulatedRun], setting: Setting, verbose: bool) -> None:
    """Print each run's error (when `verbose`) and the count within 30%."""
    for run in runs if verbose else ():
        record = run.record
        print(f"{record['key']:46} {record['policy']:7} real "
              f"{record['real']['mean_ms'] / 1e3:7.2f} s, simulated "
              f"{run.simulated_mean_ms / 1e3:7.2f} s ({run.error:+.0%}; recorded "
              f"{record['simulated_cpu']['mean_ms'] / 1e3:.2f} s)", flush=True)
    within = sum(abs(run.error) <= 0.3 for run in runs)
    median = float(np.median([run.error for run in runs]))
    print(f"{setting}: within 30% {within} of {len(runs)} runs, median {median:+.0%}",
          flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alone-scale", type=float, default=None)
    parser.add_argument("--beside-load", type=float, default=None)
    parser.add_argument("--beside-exec", type=float, default=None)
    parser.add_argument("--fit", type=int, default=0, metavar="ITERATIONS",
                        help="fit the setting this many times, each on the shares the "
                             "last one's simulations found")
    parser.add_argument("--fit-beside-load", action="store_true",
                        help="fit m_LL too instead of holding it at the traced value")
    parser.add_argument("--save", action="store_true", help="pin the fitted setting")
    parser.add_argument("--execs", action="store_true",
                        help="fit the EXECs' multipliers alone, beside a LOAD and beside an "
                             "EXEC the same way and print them (nothing pinned)")
    parser.add_argument("--only", default="", help="cells whose key starts with this")
    parser.add_argument("--cache", type=Path, default=device_bench.DEFAULT_CACHE)
    parser.add_argument("--copy-cache", type=Path, default=None)
    parser.add_argument("--pin", type=Path, default=device_bench.PINNED)
    args = parser.parse_args(argv)
    if args.save and not args.fit:
        parser.error("--save pins a fitted setting: give --fit")
    pin = device_bench.pinned_stores(args)
    setting = Setting(
        args.alone_scale if args.alone_scale is not None else pin.load_alone_scale,
        args.beside_load if args.beside_load is not None
        else pin.load_beside_load_multiplier or pin.shared_cpu_multiplier,
        args.beside_exec if args.beside_exec is not None
        else pin.load_beside_exec_multiplier or pin.shared_cpu_multiplier)
    start = setting
    records = cpu_bound_runs(pin, args.only)
    held, held_source = (None, "m_LL fitted too") if args.fit_beside_load else (
        traced_beside_load() if args.fit else (None, ""))
    with tempfile.TemporaryDirectory(prefix="fit-load-") as scratch:
        prepared: dict[str, Any] = {}
        runs = simulate_runs(records, setting.on(pin), args, Path(scratch), prepared)
        if args.execs:
            fit_execs(runs, pin)
            return 0
        for _ in range(args.fit):
            report(runs, setting, verbose=False)
            setting, used = fit(runs, pin, held)
            print(f"fitted on {used} cached runs: {setting}", flush=True)
            runs = simulate_runs(records, setting.on(pin), args, Path(scratch), prepared)
        report(runs, setting, verbose=True)
    if args.save:
        pin = replace(setting.on(pin), load_multipliers_source=(
            f"fitted on the LOAD times of the {used} runs where the CPU binds, made since "
            f"{device_bench.CPU_REPEAT_EPOCHS[-1]}, that read each stage file about once "
            f"and loaded every stage they ran, "
            f"given the shares of their time alone and beside each kind of task in their "
            f"simulations, {held_source} ({datetime.now(UTC).date()}; "
            f"benchmarks/fit_load_multipliers.py --fit {args.fit} from {start})"))
        pin.save(args.pin)
        print(f"pinned in {args.pin}; now bench_device.py --resimulate", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
