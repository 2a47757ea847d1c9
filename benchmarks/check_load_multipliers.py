"""What if LOADs had their own multipliers: the runs where the CPU binds simulated again.

docs/bench-contention.md traced small at 512 MiB / 0.7 with its LOADs: a LOAD beside
another LOAD took about 2.2x its time alone (fitted against Bulk's LOADs alone: Bulk
2.25x, DeepEye 2.16x), where the pinned simulator charges every task 1.117x beside
another and fits each network's LOAD factor on runs whose LOADs mostly ran beside
others. This script re-simulates each policy's run in the cells where the CPU binds since
the latest `CPU_REPEAT_EPOCHS` start, as the page counts them, as recorded, with the
LOADs' factors alone scaled by --alone-scale and charged --beside-load and
--beside-exec (masa.runtime.virtual.DeviceModel), and prints each run's real mean,
the simulation's now and as recorded, and how many are within 30%. Nothing is
written: a check of a model, not a fit to pin.

    python benchmarks/check_load_multipliers.py --alone-scale 0.51 --beside-load 2.2 \\
        --beside-exec 1.9 [--only small]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_device as device_bench

from masa.runtime.virtual import DeviceModel


def with_load_multipliers(model: DeviceModel, alone_scale: float, beside_load: float,
                          beside_exec: float) -> DeviceModel:
    """The pinned calibrated model with the LOADs' factors alone scaled and their own
    multipliers beside a LOAD and beside an EXEC."""
    return dataclasses.replace(
        model, load_cpu_factor_by_network={network: factor * alone_scale for network, factor
                                           in model.load_cpu_factor_by_network.items()},
        load_beside_load_multiplier=beside_load, load_beside_exec_multiplier=beside_exec)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alone-scale", type=float, required=True)
    parser.add_argument("--beside-load", type=float, required=True)
    parser.add_argument("--beside-exec", type=float, required=True)
    parser.add_argument("--only", default="", help="cells whose key starts with this")
    parser.add_argument("--cache", type=Path, default=device_bench.DEFAULT_CACHE)
    parser.add_argument("--copy-cache", type=Path, default=None)
    parser.add_argument("--pin", type=Path, default=device_bench.PINNED)
    args = parser.parse_args(argv)
    pin = device_bench.pinned_stores(args)
    cells = {cell.key: cell for cell in device_bench.grid()}
    errors = []
    with tempfile.TemporaryDirectory(prefix="check-load-") as scratch:
        prepared: dict[str, Any] = {}
        for record in cpu_bound_runs(pin, args.only):
            cell = cells[record["key"]]
            store = device_bench.store_of(cell, args)
            if cell.key not in prepared:
                workload = device_bench.board_workload(cell, store, Path(scratch), pin)
                prepared[cell.key] = device_bench.prepare_run(workload, store, cell.context)
            device, base_bytes = device_bench.recorded_device(record, cell)
            simulated = device_bench.simulate(
                device_bench.simulated_policy(record), prepared[cell.key], device, base_bytes,
                cell, pin, device_bench.host_scale_of(record, pin),
                cache_first=record.get("cache_first", False), calibrated_only=True,
                adjust=lambda model: with_load_multipliers(
                    model, args.alone_scale, args.beside_load, args.beside_exec)
            )["simulated_cpu"]
            real_ms, now_ms = record["real"]["mean_ms"], simulated["mean_ms"]
            errors.append(now_ms / real_ms - 1)
            print(f"{cell.key:46} {record['policy']:7} real {real_ms / 1e3:7.2f} s, simulated "
                  f"{now_ms / 1e3:7.2f} s ({errors[-1]:+.0%}; recorded "
                  f"{record['simulated_cpu']['mean_ms'] / 1e3:.2f} s), LOAD time per profiled "
                  f"{record['real']['load_ratio']:.2f} / {simulated['load_ratio']:.2f}",
                  flush=True)
    print(f"within 30%: {sum(abs(error) <= 0.3 for error in errors)} of {len(errors)} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
