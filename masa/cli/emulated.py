"""`masa run --device` and `masa compare --device`: runs on an emulated small device.

Each policy's run is a child process in fresh cgroups (masa.runtime.emulation);
this module turns the command's options into the child's spec, the child's
outcome (or its kill) into a report, and prints it. The parent prepares the
run first (start-up checks, one-line errors for bad input) and pins each
network's version, so every policy of a comparison runs the same versions.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

from masa.common.errors import EXIT_USAGE, RunFailed, UserError
from masa.report.report import emulated_report
from masa.runtime.device import Device, load_device
from masa.runtime.emulation import EmulationPlan, check_emulation, run_emulated
from masa.runtime.runner import PreparedRun, prepare_run


def device_plan(args: argparse.Namespace) -> tuple[Device, EmulationPlan]:
    """The device of `--device` and what emulating it needs here (or a UserError)."""
    if getattr(args, "simulate", False):
        raise UserError("--device emulates a device for a real run; the simulator does not "
                        "model devices yet: leave out --simulate or --device")
    device = load_device(args.device)
    return device, check_emulation(device, args.store)


def _spec(args: argparse.Namespace, policy: str, prepared: PreparedRun,
          meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": str(args.workload), "store": str(args.store), "context": args.context,
        "job_limit": args.jobs, "plugins": list(getattr(args, "plugin", []) or []),
        "log_level": logging.getLogger().getEffectiveLevel(),
        "network_versions": prepared.network_versions,
        "meta": meta,  # of the report the child writes
        "settings": {"policy": policy, "workers": args.workers,
                     "memory_budget_bytes": args.memory,
                     "memory_source": getattr(args, "memory_source", "measured")},
    }


def emulated_policy_report(args: argparse.Namespace, plan: EmulationPlan, policy: str,
                           prepared: PreparedRun) -> dict[str, Any]:
    """One policy's run on the device, as a report (status finished / killed)."""
    meta = {"workload": str(args.workload), "device": plan.device.name}
    run = run_emulated(plan, _spec(args, policy, prepared, meta))
    if run.status == "failed" and run.error_code is not None:
        error = UserError if run.error_code == EXIT_USAGE else RunFailed
        raise error(run.reason)
    if run.status == "failed":
        raise RunFailed(f"{policy} on device {plan.device.name}: {run.reason}")
    return emulated_report(run.as_dict(), run.report, policy=policy, workers=args.workers,
                           jobs=len(prepared.jobs), meta=meta)


def prepare_for_device(args: argparse.Namespace) -> tuple[EmulationPlan, PreparedRun]:
    _, plan = device_plan(args)
    prepared = prepare_run(args.workload, args.store, args.context, job_limit=args.jobs)
    return plan, prepared
