"""`masa demo`: prepare a scaled zoo and compare Masa, Bulk and DeepEye on it, for real.

The demo builds scaled-down replicas of four of the paper's networks, splits
and profiles them, prints their stage tables, then runs one multi-network
workload (every image through AgeNet, GenderNet, TinyYOLO and FaceNet) on real
ONNX Runtime workers under a memory budget far below what the networks need
together, once per policy, and prints the comparison. Everything is computed
here, nothing is downloaded.

Where it can (root and a writable memory cgroup), the demo runs each policy on
a small emulated device (masa.runtime.emulation), so that what Masa is for
shows: a board whose memory cap kills what exceeds it and whose SD card is slow
and cold. The default device, "demo", is a Raspberry Pi 4's storage and cores
(the pi4-1g preset) with its memory scaled down to the demo's networks: the
runtime's measured base plus the budget plus headroom, less than what Bulk
needs to hold the largest network whole. On it the demo runs AgeNet, GenderNet,
FaceNet and EmotionNet (the paper's mixed scenario plus GenderNet), sliced and
loaded with copied weights so that the cap binds on them. `--device NAME|FILE`
picks another device, `--no-device` runs as without cgroups; where emulation
is not possible the demo says why in one line and runs as before.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from masa.cli.run import compare_reports, plot_comparison
from masa.common.argtypes import memory_size, positive_int
from masa.common.atomic import atomic_write_text
from masa.common.errors import UserError
from masa.common.units import format_bytes
from masa.report.report import format_emulation, outcome_report, write_json
from masa.runtime.device import Device, load_device
from masa.runtime.emulation import EmulationPlan, check_emulation
from masa.runtime.registry import keep_loaded_for
from masa.runtime.runner import PreparedRun, RunSettings, execute, prepare_run
from masa.sched.jobs import stage_costs
from model_prep.manifest import NetworkManifest
from model_prep.summary import stage_summary
from workloads.zoo import write_zoo

DEMO_NETWORKS = ("agenet", "gendernet", "tinyyolo", "facenet")
DEMO_POLICIES = ("masa", "bulk", "deepeye")

# On an emulated device: EmotionNet is the network that does not fit a small board
# whole (the paper's mixed scenario); TinyYOLO's 416x416 activations would make one
# task need most of a demo-sized board, so it is left out there.
DEVICE_NETWORKS = ("agenet", "gendernet", "facenet", "emotionnet")
DEMO_DEVICE = "demo"  # the demo-sized board, computed from the demo's needs
DEMO_BOARD = "pi4-1g"  # whose storage and cores the demo board has
# The demo board's cap above the runtime's base: the budget plus headroom for what
# no profile sees (heap not yet returned, the allocations of several live sessions).
DEVICE_HEADROOM = 0.5
DEVICE_HEADROOM_MIN_BYTES = 8 * 2**20


def register(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo", help="prepare a scaled zoo and compare the policies on it",
        description="Build, split and profile scaled replicas of AgeNet, GenderNet, "
                    "TinyYOLO and FaceNet, then run a multi-network workload under a tight "
                    "memory budget with Masa, Bulk and DeepEye on real ONNX Runtime workers.")
    demo.add_argument("--store", type=Path,
                      help="keep the prepared networks here (default: a temporary directory)")
    demo.add_argument("--scale", type=float, default=0.25,
                      help="channel-width scale of the zoo replicas (default 0.25)")
    demo.add_argument("--jobs", type=positive_int, default=8,
                      help="number of jobs: one image each (default 8)")
    demo.add_argument("--interval-ms", type=float, default=100.0,
                      help="time between image arrivals (default 100 ms)")
    demo.add_argument("--memory", type=memory_size, default=None,
                      help="memory budget (default: 30%% of what the networks need together, "
                           "at least 1.25x what the largest task holds)")
    demo.add_argument("--workers", type=positive_int, default=2)
    where = demo.add_mutually_exclusive_group()
    where.add_argument("--device", metavar="NAME|FILE",
                       help="run each policy on this emulated device: 'demo' (the default "
                            "when root and cgroups allow it: a Pi 4's SD card and cores, its "
                            "memory scaled to the demo), a preset such as pi3b-1g, or a "
                            "device YAML (docs/device-emulation.md)")
    where.add_argument("--no-device", action="store_true",
                       help="run the policies in this process, no emulated device")
    demo.add_argument("--plot", type=Path, help="write the comparison as a PNG")
    demo.add_argument("--report", type=Path, help="write the three reports as JSON")
    demo.set_defaults(handler=demo_command)


def network_need_bytes(manifest: NetworkManifest) -> int:
    """Memory to hold a whole network loaded at once: every stage resident, plus
    the largest transient (load or exec) on top."""
    costs = [stage_costs(stage) for stage in manifest.stages]
    resident = sum(cost.resident_bytes + cost.output_bytes for cost in costs)
    transient = max(max(cost.load_transient_bytes, cost.exec_bytes) for cost in costs)
    return resident + transient


# What no profile sees (Python objects, heap not yet returned, the allocations of
# many live sessions: about 1-3 MiB at the demo's scale) still counts against the
# budget in a real run (memory source "measured"), so the budget leaves room for it
# beside the largest task: a quarter of that task's footprint.
UNMODELLED_ALLOWANCE = 0.25


def demo_budget_bytes(prepared: PreparedRun, need_bytes: int) -> int:
    """30% of what the networks need loaded together, but room for the largest task
    with what it holds (its own memory, the locks it opens, a job's inputs) and the
    unmodelled allowance: otherwise every job would run that task under the progress
    rule, alone, over the budget."""
    largest_bytes = largest_footprint_bytes(prepared)
    return max(int(0.3 * need_bytes), int((1 + UNMODELLED_ALLOWANCE) * largest_bytes))


def largest_footprint_bytes(prepared: PreparedRun) -> int:
    """The most one task needs when it starts: its footprint (its own memory and the
    locks it opens) plus, as a margin for what is already held then (its stage's
    session, upstream outputs), its network instance's input bytes."""
    graph = prepared.graph
    inputs_bytes = {graph.task(lock.from_task).group: lock.memory_bytes
                    for lock in graph.locks if lock.lock_id.endswith("/inputs")}
    return max(graph.footprint_bytes(task.task_id) + inputs_bytes.get(task.group, 0)
               for task in graph.tasks)


def demo_command(args: argparse.Namespace) -> int:
    owned = args.store is None
    store = Path(tempfile.mkdtemp(prefix="masa-demo-")) if owned else args.store
    try:
        return _demo(args, store)
    finally:
        if owned:
            shutil.rmtree(store, ignore_errors=True)


def _demo(args: argparse.Namespace, store: Path) -> int:
    started_s = time.perf_counter()
    device_name = _device_wanted(args, store)
    networks = DEVICE_NETWORKS if device_name else DEMO_NETWORKS
    options: dict[str, object] = {}
    if device_name:  # copied weights: the cap binds on them (mapped ones are evicted)
        options = {"load_mode": "copy", "max_stage_bytes": device_stage_bytes(args.scale)}
    print(f"Preparing {', '.join(networks)} (scale {args.scale}, random weights) "
          f"in {store} ...")
    manifests = write_zoo(store, list(networks), scale=args.scale, profile=True, **options)
    for manifest in manifests:
        print()
        for line in stage_summary(manifest):
            print(line)
    need_bytes = sum(network_need_bytes(m) for m in manifests)
    workload_path = store / "demo-workload.yaml"
    atomic_write_text(workload_path, (
        "name: demo\n"
        f"description: every image through {len(networks)} networks\n"
        f"graph: [{', '.join(networks)}]\n"
        "input: random\n"
        f"arrivals: {{kind: periodic, interval_ms: {args.interval_ms}, "
        f"count: {args.jobs}, seed: 1}}\n"
    ))
    prepared = prepare_run(workload_path, store)
    budget_bytes = args.memory if args.memory else demo_budget_bytes(prepared, need_bytes)
    print(f"\nThe {len(networks)} networks need {format_bytes(need_bytes)} loaded together; "
          f"the budget is {format_bytes(budget_bytes)}. {args.jobs} images, one every "
          f"{args.interval_ms:g} ms, {args.workers} workers, real ONNX Runtime execution"
          f"{' on an emulated device' if device_name else ''}:\n")
    if device_name:
        reports, device = _device_reports(args, device_name, store, prepared, budget_bytes)
    else:
        reports, device = _local_reports(args, prepared, budget_bytes), None
    if args.plot:
        plot_comparison(reports, args.plot, "masa demo" + (f" on {device.name}"
                                                            if device else ""))
    if args.report:
        write_json(args.report, {"workload": "demo", "memory_budget_bytes": budget_bytes,
                                 "device": device.as_dict() if device else None,
                                 "reports": reports})
    print(f"\nDemo finished in {time.perf_counter() - started_s:.1f} s.")
    return 0


def _local_reports(args: argparse.Namespace, prepared: PreparedRun,
                   budget_bytes: int) -> dict[str, dict]:
    """Today's demo: each policy in this process, no cgroups."""
    reports = {}
    for policy in DEMO_POLICIES:
        settings = RunSettings(policy=policy, workers=args.workers,
                               memory_budget_bytes=budget_bytes,
                               keep_loaded_bytes=keep_loaded_for(policy, None, budget_bytes))
        reports[policy] = outcome_report(execute(prepared, settings, simulate=False),
                                         {"workload": "demo"})
    print(compare_reports(reports))
    print("\nReserved memory is the ledger's: every stage's session and weights, its "
          "working memory, the tensors between stages, each job's inputs and kept "
          "outputs. Masa keeps it within the budget (beyond it only when one task alone "
          "does not fit and nothing else runs); Bulk and DeepEye ignore the budget. "
          "Measured memory is what the process really held above its baseline, sampled "
          "at every decision and every 2 ms: anonymous memory (sessions, tensors, Python "
          "objects, heap not yet returned) plus the loaded stages' weights in memory (the "
          "mapped weight files' pages in the page cache, held from each LOAD on); "
          "'anon' and 'weights' are the two parts' own peaks. Real runs schedule against "
          "it too: what the ledger does not hold shrinks the budget Masa sees "
          "(--memory-source measured, the default).")
    return reports


# ------------------------------------------------------------ on an emulated device


def device_stage_bytes(scale: float) -> int:
    """Largest stage on a demo device: 32 MiB at scale 1 (fc weights grow with the
    square of the width scale), so that no single task needs most of the board."""
    return max(256 * 1024, int(32 * 2**20 * scale * scale))


def demo_board(cap_bytes: int) -> Device:
    """The demo-sized board: a Pi 4's SD card and cores, a memory cap of `cap_bytes`."""
    board = load_device(DEMO_BOARD)
    return Device(name=DEMO_DEVICE, description=f"{board.description}, memory scaled "
                  "down to the demo's networks", memory_bytes=cap_bytes, reserved_bytes=0,
                  read_bytes_per_s=board.read_bytes_per_s,
                  write_bytes_per_s=board.write_bytes_per_s, swap_bytes=0,
                  cores=board.cores, cold_cache=True, source=board.source)


def demo_cap_bytes(base_bytes: int, budget_bytes: int) -> int:
    return base_bytes + budget_bytes + max(int(DEVICE_HEADROOM * budget_bytes),
                                           DEVICE_HEADROOM_MIN_BYTES)


def _device_wanted(args: argparse.Namespace, store: Path) -> str | None:
    """The device to run on, or None: asked for (an error if it cannot be emulated),
    or the demo board when root and cgroups allow it (one line saying why not)."""
    if args.no_device:
        return None
    name = args.device or DEMO_DEVICE
    device = demo_board(2**30) if name == DEMO_DEVICE else load_device(name)
    store.mkdir(parents=True, exist_ok=True)
    try:
        check_emulation(device, store)
    except UserError as error:
        if args.device:
            raise
        print(f"Not emulating a small device ({error}); the policies run in this "
              "process, on this machine's memory and storage.")
        return None
    return name


def _device_reports(args: argparse.Namespace, name: str, store: Path,
                    prepared: PreparedRun, budget_bytes: int) -> tuple[dict[str, dict], Device]:
    from masa.cli.emulated import emulated_policy_report, measure_runtime_base

    spec_args = argparse.Namespace(
        workload=store / "demo-workload.yaml", store=store, context="oblivious", jobs=None,
        plugin=[], workers=args.workers, memory=budget_bytes, memory_source="measured")
    device = demo_board(4 * 2**30) if name == DEMO_DEVICE else load_device(name)
    base_bytes = measure_runtime_base(check_emulation(device, store), spec_args, prepared)
    if name == DEMO_DEVICE:
        device = demo_board(demo_cap_bytes(base_bytes, budget_bytes))
    plan = check_emulation(device, store)
    _describe_device(plan, base_bytes, budget_bytes, device_stage_bytes(args.scale))
    need_bytes = max(network_need_bytes(m) for m in prepared.manifests.values())
    if device.memory_cap_bytes > base_bytes + 2 * need_bytes:
        print(f"This device's cap holds the demo's largest network ({format_bytes(need_bytes)} "
              "loaded whole) easily: no policy can be killed here, the baselines can only "
              "exceed the budget. The default device, 'demo', is sized to the demo.\n")
    reports = {policy: emulated_policy_report(spec_args, plan, policy, prepared)
               for policy in DEMO_POLICIES}
    print(compare_reports(reports))
    for policy, report in reports.items():
        print(f"\n{policy}: {format_emulation(report)}")
    print()
    for line in device_verdicts(reports, budget_bytes, device.memory_cap_bytes):
        print(line)
    return reports, device


def _describe_device(plan: EmulationPlan, base_bytes: int, budget_bytes: int,
                     stage_bytes: int) -> None:
    device = plan.device
    read = device.read_bytes_per_s
    cpus = len(plan.cpus.split(",")) if plan.cpus else os.cpu_count()
    print(f"Device {device.name} ({device.description}): memory cap "
          f"{format_bytes(device.memory_cap_bytes)} = runtime base {format_bytes(base_bytes)} "
          f"(measured) + budget {format_bytes(budget_bytes)} + "
          f"{format_bytes(device.memory_cap_bytes - base_bytes - budget_bytes)} headroom; "
          f"storage reads {'unthrottled' if not read else f'{read / 1e6:g} MB/s'}, "
          f"{'cold' if device.cold_cache else 'warm'} page cache, {device.cores} cores "
          f"(run on {cpus} CPUs), no swap.")
    print("Emulated: the cap (a memory cgroup: whoever exceeds it is killed, as on a "
          "board without swap), the storage bandwidth (a blkio throttle on the store's "
          "disk), a cold page cache (the store's files evicted before the first job), the "
          "CPU count (a CPU set, at most this machine's). Not emulated: the CPU's speed (a "
          "Pi's cores are several times slower than this machine's), thermal throttling, "
          "the board's kernel. Stages are sliced "
          f"at {format_bytes(stage_bytes)} of weights and copy their weights into "
          "memory, so the cap binds on them (zero-copy stages would be evicted and read "
          "again instead: a thrash, not a kill).\n")


def device_verdicts(reports: dict[str, dict], budget_bytes: int,
                    cap_bytes: int) -> list[str]:
    """One line per policy: killed (when, jobs done), or its peaks against budget and cap."""
    lines = []
    for policy, report in reports.items():
        summary, emulation = report["summary"], report["emulation"]
        if report["status"] != "finished":
            who = policy if policy == "masa" else f"masa vs {policy}: {policy}"
            lines.append(f"{who} {report['status'].upper()} after "
                         f"{summary.get('ended_at_s')} s, "
                         f"{summary.get('jobs_finished_before_end')} of {summary['jobs']} "
                         f"jobs finished ({summary.get('reason')})")
            continue
        reserved = summary["peak_reserved_bytes"]
        within = "within" if reserved <= budget_bytes else "OVER"
        lines.append(f"{policy}: finished {summary['jobs'] - summary['jobs_failed']} of "
                     f"{summary['jobs']} jobs, mean response "
                     f"{summary['response_us']['mean'] / 1e3:.0f} ms; peak reserved "
                     f"{format_bytes(reserved)} {within} its budget "
                     f"{format_bytes(budget_bytes)}; cgroup peak "
                     f"{format_bytes(emulation['peak_cgroup_bytes'] or 0)} (anonymous "
                     f"{format_bytes(emulation['peak_anonymous_bytes'])}, the rest page "
                     f"cache) of the cap {format_bytes(cap_bytes)}; read "
                     f"{format_bytes(emulation['bytes_read'])} from storage")
    return lines
