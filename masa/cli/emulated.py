"""`masa run --device` and `masa compare --device`: runs on an emulated small device.

Each policy's run is a child process in fresh cgroups (masa.runtime.emulation);
this module turns the command's options into the child's spec, the child's
outcome (or its kill) into a report, and prints it. The parent prepares the
run first (start-up checks, one-line errors for bad input) and pins each
network's version, so every policy of a comparison runs the same versions.

With `--simulate` the same device is simulated instead (masa.runtime.virtual's
DeviceModel: storage bandwidth, page cache, predicted kills); the report has
the same shape, its `emulation` block marked `simulated`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from masa.common.errors import EXIT_USAGE, RunFailed, UserError
from masa.common.units import format_bytes
from masa.report.report import emulated_report, outcome_report, outcome_trace, write_json
from masa.runtime.device import (
    RUN_RECORD_BYTES_PER_TASK,
    Device,
    assumed_runtime_base_bytes,
    load_device,
)
from masa.runtime.emulation import CgroupLayout, EmulationPlan, check_emulation, run_emulated
from masa.runtime.registry import KEEPING_POLICIES, keep_loaded_for
from masa.runtime.runner import (
    PreparedRun,
    RunOutcome,
    RunSettings,
    prepare_run,
    simulate_run,
)
from masa.runtime.virtual import DeviceModel, SimulationResult, StageStorage
from model_prep.manifest import NetworkManifest

log = logging.getLogger(__name__)


def device_plan(args: argparse.Namespace) -> tuple[Device, EmulationPlan]:
    """The device of `--device` and what emulating it needs here (or a UserError)."""
    device = load_device(args.device)
    if getattr(args, "simulate", False):  # no cgroups: the simulator models the device
        return device, EmulationPlan(device, CgroupLayout(0, {}), None, None)
    return device, check_emulation(device, args.store)


def _spec(args: argparse.Namespace, policy: str, prepared: PreparedRun,
          meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": str(args.workload), "store": str(args.store), "context": args.context,
        "job_limit": args.jobs, "plugins": list(getattr(args, "plugin", []) or []),
        "log_level": logging.getLogger().getEffectiveLevel(),
        "network_versions": prepared.network_versions,
        "meta": meta,  # of the report the child writes
        # The child writes the trace of a finished run (a killed one leaves none).
        "trace_path": str(args.trace) if getattr(args, "trace", None) else None,
        "settings": {"policy": policy, "workers": args.workers,
                     "memory_budget_bytes": args.memory,
                     "memory_source": getattr(args, "memory_source", "measured"),
                     "read_ahead_bytes": getattr(args, "read_ahead", None),
                     "keep_cached_bytes": getattr(args, "keep_cached", None),
                     "keep_loaded_bytes": _child_keep_loaded_bytes(args, policy)},
    }


def _child_keep_loaded_bytes(args: argparse.Namespace, policy: str) -> int | None:
    """--keep-loaded for the child: 0 for a policy that does not keep; None (the
    default) the child resolves to its budget, which may be the device's cap less
    the runtime's base that only the child measures."""
    return getattr(args, "keep_loaded", None) if policy in KEEPING_POLICIES else 0


def emulated_policy_report(args: argparse.Namespace, plan: EmulationPlan, policy: str,
                           prepared: PreparedRun) -> dict[str, Any]:
    """One policy's run on the device, as a report (status finished / killed)."""
    meta = {"workload": str(args.workload), "device": plan.device.name}
    if getattr(args, "simulate", False):
        base_bytes = assumed_runtime_base_bytes(len(prepared.graph.tasks))
        budget_bytes = args.memory or plan.device.default_budget_bytes(base_bytes)
        settings = RunSettings(policy=policy, workers=args.workers,
                               memory_budget_bytes=budget_bytes,
                               memory_source=getattr(args, "memory_source", "measured"),
                               read_ahead_bytes=getattr(args, "read_ahead", None),
                               keep_loaded_bytes=keep_loaded_for(
                                   policy, getattr(args, "keep_loaded", None), budget_bytes))
        return simulated_device_report(prepared, settings, device_model(
            prepared.manifests, plan.device, base_bytes), plan.device, meta,
            trace_path=getattr(args, "trace", None))
    run = run_emulated(plan, _spec(args, policy, prepared, meta))
    if run.status == "failed" and run.error_code is not None:
        error = UserError if run.error_code == EXIT_USAGE else RunFailed
        raise error(run.reason)
    if run.status == "failed":
        raise RunFailed(f"{policy} on device {plan.device.name}: {run.reason}")
    return emulated_report(run.as_dict(), run.report, policy=policy, workers=args.workers,
                           jobs=len(prepared.jobs), meta=meta)


def measure_runtime_base(plan: EmulationPlan, args: argparse.Namespace,
                         prepared: PreparedRun) -> int:
    """The runtime's own memory for this workload (Python, ONNX Runtime, masa, the
    manifests and task graph), measured by a child in the plan's groups that stops
    before the first job; what a device's cap must hold besides the budget."""
    meta = {"workload": str(args.workload), "device": plan.device.name}
    spec = {**_spec(args, "masa", prepared, meta), "measure_only": True}
    run = run_emulated(plan, spec)
    if run.runtime_base_bytes is None:
        raise RunFailed(f"could not measure the runtime's base on device "
                        f"{plan.device.name}: {run.reason or run.status}")
    return run.runtime_base_bytes


def prepare_for_device(args: argparse.Namespace) -> tuple[EmulationPlan, PreparedRun]:
    device, plan = device_plan(args)
    prepared = prepare_run(args.workload, args.store, args.context, job_limit=args.jobs)
    room_bytes = device.default_budget_bytes(assumed_runtime_base_bytes(
        len(prepared.graph.tasks)))
    if args.memory is not None and args.memory > room_bytes:
        # Allowed (an experiment may want it), but the cap, not the budget, then binds.
        log.warning("--memory %s is above what device %s leaves the scheduler (its %s cap "
                    "less the runtime's base, about %s): a run may be killed",
                    format_bytes(args.memory), device.name,
                    format_bytes(device.memory_cap_bytes), format_bytes(room_bytes))
    return plan, prepared


# ------------------------------------------------------------ simulated devices


def stage_storage(manifests: Mapping[str, NetworkManifest]) -> dict[tuple[str, str],
                                                                     StageStorage]:
    """Each stage's files on disk (what a cold LOAD reads) and its mapped weight bytes
    (zero-copy stages without prepacking: their pages stay in the page cache)."""
    storage = {}
    for name, manifest in manifests.items():
        for stage in manifest.stages:
            file_bytes = sum(path.stat().st_size for path in manifest.stage_files(stage)
                             if path.is_file())
            storage[(name, stage.stage_id)] = StageStorage(file_bytes, stage.loaded_mapped_bytes)
    return storage


def device_model(manifests: Mapping[str, NetworkManifest], device: Device,
                 runtime_base_bytes: int, cpu_factor: float = 1.0,
                 cpu_factor_by_network: Mapping[str, float] | None = None,
                 shared_cpu_multiplier: float = 1.0, dispatch_us: int = 0,
                 load_cpu_factor_by_network: Mapping[str, float] | None = None,
                 shared_cpu_while_running: bool = False,
                 record_bytes_per_task: int = RUN_RECORD_BYTES_PER_TASK) -> DeviceModel:
    return DeviceModel(memory_cap_bytes=device.memory_cap_bytes,
                       runtime_base_bytes=runtime_base_bytes,
                       read_bytes_per_s=device.read_bytes_per_s,
                       stages=stage_storage(manifests), cold_cache=device.cold_cache,
                       cpu_factor=cpu_factor,
                       cpu_factor_by_network=dict(cpu_factor_by_network or {}),
                       load_cpu_factor_by_network=dict(load_cpu_factor_by_network or {}),
                       shared_cpu_multiplier=shared_cpu_multiplier,
                       shared_cpu_while_running=shared_cpu_while_running,
                       dispatch_us=dispatch_us, record_bytes_per_task=record_bytes_per_task)


def simulate_on_device(prepared: PreparedRun, settings: RunSettings,
                       model: DeviceModel) -> tuple[RunOutcome, SimulationResult]:
    """The workload simulated on the device, context-aware conditions included (decided
    as a simulation decides them: label probabilities drawn per job, output conditions
    assumed to hold)."""
    outcome, result = simulate_run(prepared, settings, device=model)
    outcome.network_versions = prepared.network_versions
    return outcome, result


def simulated_device_report(prepared: PreparedRun, settings: RunSettings, model: DeviceModel,
                            device: Device, meta: Mapping[str, Any],
                            trace_path: str | Path | None = None) -> dict[str, Any]:
    """A simulated run on the device as a report shaped like an emulated run's: killed
    (predicted, with the time and the jobs finished before) or finished. `trace_path`:
    where to write the Chrome trace of a finished run (a predicted kill writes none)."""
    outcome, result = simulate_on_device(prepared, settings, model)
    predicted = result.device
    assert predicted is not None
    killed_us = predicted.killed_at_us
    emulation = {
        "device": device.as_dict(), "simulated": True,
        "status": "finished" if killed_us is None else "killed",
        "reason": None if killed_us is None else (
            "predicted out of memory: the runtime's base and the anonymous memory held "
            "exceed the cap"),
        "returncode": None, "error_code": None,
        "run_time_s": round((result.makespan_us if killed_us is None else killed_us) / 1e6, 3),
        "jobs_finished": [list(item) for item in predicted.jobs_finished_before_kill],
        "memory_budget_bytes": settings.memory_budget_bytes,
        "runtime_base_bytes": model.runtime_base_bytes, "evicted_bytes": 0,
        "oom_kills": 0 if killed_us is None else 1,
        "peak_cgroup_bytes": min(model.memory_cap_bytes, predicted.peak_anonymous_bytes
                                 + predicted.peak_page_cache_bytes),
        "peak_anonymous_bytes": predicted.peak_anonymous_bytes,
        "peak_page_cache_bytes": predicted.peak_page_cache_bytes, "peak_swap_bytes": 0,
        "major_faults": 0, "bytes_read": predicted.bytes_read,
        "thrash_bytes": predicted.thrash_bytes, "load_hits": predicted.load_hits,
        "load_misses": predicted.load_misses, "cgroups": [],
        "stage_file_bytes_loaded": predicted.stage_file_bytes_loaded,
        "stage_file_bytes_cached_at_load": predicted.stage_file_bytes_cached_at_load,
    }
    report = outcome_report(outcome, meta) if killed_us is None else None
    if trace_path is not None and killed_us is None:
        write_json(trace_path, outcome_trace(outcome))
    return emulated_report(emulation, report, policy=settings.policy,
                           workers=settings.workers, jobs=len(prepared.jobs), meta=meta)
