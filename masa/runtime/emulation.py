"""Emulating a small device: each policy's run in a child process inside fresh cgroups.

This module owns everything about running under a `Device`
(masa.runtime.device) on a bigger Linux machine:

- `check_emulation(device, store)`: what the emulation needs (root, the memory
  controller, blkio/io for a storage throttle, cpuset, the store's block
  device, swap when the device has some), as one UserError naming what is
  missing (exit 2);
- `DeviceCgroups`: one fresh cgroup per controller (cgroup v1: memory, blkio,
  cpuset hierarchies; v2: one cgroup), detected from /proc/self/mountinfo and
  /proc/self/cgroup. Memory cap (`memory.limit_in_bytes` / `memory.max`), swap
  cap (`memory.memsw.limit_in_bytes` = cap + swap / `memory.swap.max`), read
  and write throttles on the store's disk (`blkio.throttle.*_bps_device` /
  `io.max`), a CPU set of `cores` CPUs. Names are `masa-emu-PID-N`; groups a
  dead process left behind are removed when the next emulation starts;
- `run_emulated`: starts `python -m masa.cli.emulation_child` inside the
  groups (the child joins them before it executes anything, so Python's and ONNX
  Runtime's own memory counts against the cap), samples the groups while it runs
  (anonymous, page cache and swap bytes; the child's major faults and bytes read
  from /proc/PID), and reports an OOM kill (exit signal plus the cgroup's OOM
  counter) with the time and the jobs finished before it. The groups are removed
  in every case: normal end, kill, Ctrl-C, SIGTERM (a SIGKILLed parent takes the
  child with it through PR_SET_PDEATHSIG; the next run removes the empty groups).

`evict_files` drops files from the page cache (posix_fadvise DONTNEED), which
the child does after its start-up checks and before the first job, so that
every LOAD reads from the (throttled) storage as on a freshly booted device.
The CPU's speed, thermal throttling and the device's page-cache policy are not
emulated.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from masa.common.errors import UserError
from masa.common.libc import WORKER_THREAD_PREFIX
from masa.common.procmem import drop_cached
from masa.runtime.device import Device

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PREFIX = "masa-emu-"
_SAMPLE_INTERVAL_S = 0.05
_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


# ------------------------------------------------------------------ discovery


@dataclass(frozen=True)
class CgroupLayout:
    """Where this process's cgroups are, per controller: the parent of the new groups."""

    version: int
    parents: dict[str, Path]  # controller -> directory (v2: every controller -> one)


def _mounts(mountinfo: str) -> tuple[dict[str, Path], Path | None]:
    """v1 mount point per controller, and the v2 mount point (if any)."""
    v1: dict[str, Path] = {}
    v2 = None
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2":
            v2 = Path(fields[4])
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                v1[option] = Path(fields[4])
    return v1, v2


def cgroup_layout(proc_root: str = "/proc") -> CgroupLayout | None:
    """The cgroup parents for new groups: v1 when its memory controller is mounted."""
    try:
        mountinfo = Path(f"{proc_root}/self/mountinfo").read_text()
        membership = Path(f"{proc_root}/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1, v2 = _mounts(mountinfo)
    paths: dict[str, str] = {}
    for line in membership:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for controller in controllers.split(","):
            paths[controller] = path
        if hierarchy == "0" and controllers == "":
            paths["unified"] = path
    if "memory" in v1:
        parents = {c: v1[c] / paths.get(c, "/").lstrip("/")
                   for c in ("memory", "blkio", "cpuset") if c in v1}
        return CgroupLayout(1, parents)
    if v2 is None:
        return None
    parent = v2 / paths.get("unified", "/").lstrip("/")
    try:
        available = (parent / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    names = {"memory": "memory", "blkio": "io", "cpuset": "cpuset"}
    return CgroupLayout(2, {c: parent for c, name in names.items() if name in available})


def block_device(path: Path) -> str | None:
    """'MAJ:MIN' of the whole disk holding `path` (throttles apply to disks), or None."""
    st_dev = os.stat(path).st_dev
    number = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    sysfs = Path("/sys/dev/block") / number
    if not sysfs.exists():
        return None
    if (sysfs / "partition").exists():
        try:
            return (sysfs.resolve().parent / "dev").read_text().strip()
        except OSError:
            return None
    return number


def _swap_total_bytes() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("SwapTotal:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass(frozen=True)
class EmulationPlan:
    device: Device
    layout: CgroupLayout
    disk: str | None  # MAJ:MIN of the store's disk, when the storage is throttled
    cpus: str | None  # cpuset, e.g. "0-1"


def check_emulation(device: Device, store: Path) -> EmulationPlan:
    """What the device needs here, or a one-line UserError naming what is missing."""
    where = f"--device {device.name}"
    if os.geteuid() != 0:
        raise UserError(f"{where}: emulating a device needs root (it creates cgroups); "
                        "run as root or leave out --device")
    layout = cgroup_layout()
    if layout is None or "memory" not in layout.parents:
        raise UserError(f"{where}: no memory cgroup controller is mounted under "
                        f"{CGROUP_ROOT} (cgroup v1 memory or v2 with memory enabled)")
    if not os.access(layout.parents["memory"], os.W_OK):
        raise UserError(f"{where}: cannot create cgroups in {layout.parents['memory']}")
    disk = None
    if device.read_bytes_per_s or device.write_bytes_per_s:
        if "blkio" not in layout.parents:
            raise UserError(f"{where}: throttling storage needs the "
                            f"{'blkio' if layout.version == 1 else 'io'} cgroup controller, "
                            "which is not available")
        disk = block_device(store)
        if disk is None:
            raise UserError(f"{where}: the store {store} is on no block device (a tmpfs or "
                            "overlay?), so its reads cannot be throttled: move the store "
                            "to a disk or give the device no storage bandwidth")
    if device.swap_bytes > _swap_total_bytes():
        raise UserError(f"{where}: the device has {device.swap_bytes} bytes of swap but "
                        f"this machine has {_swap_total_bytes()}: enable a swap file "
                        "(mkswap, swapon) or set swap: 0")
    cpus = None
    if "cpuset" in layout.parents:
        available = _parse_cpus(_read(layout.parents["cpuset"] / _cpuset_file(layout, "cpus")))
        cpus = _format_cpus(available[:device.cores]) if available else None
    return EmulationPlan(device, layout, disk, cpus)


def _cpuset_file(layout: CgroupLayout, what: str) -> str:
    return f"cpuset.{what}" if layout.version == 1 else f"cpuset.{what}.effective"


def _parse_cpus(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            low, high = part.split("-")
            cpus.extend(range(int(low), int(high) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


def _format_cpus(cpus: list[int]) -> str:
    return ",".join(str(cpu) for cpu in cpus)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# ------------------------------------------------------------------ the groups


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_groups(layout: CgroupLayout) -> list[Path]:
    """Remove the empty `masa-emu-PID-*` groups of processes that no longer run."""
    removed = []
    for parent in set(layout.parents.values()):
        for group in parent.glob(f"{GROUP_PREFIX}*"):
            try:
                pid = int(group.name.removeprefix(GROUP_PREFIX).split("-")[0])
            except ValueError:
                continue
            if not _pid_alive(pid):
                with contextlib.suppress(OSError):
                    group.rmdir()
                    removed.append(group)
    return removed


_counter = iter(range(1, 1 << 30))


class DeviceCgroups:
    """The fresh cgroups of one emulated run; `remove()` deletes them (idempotent)."""

    def __init__(self, plan: EmulationPlan) -> None:
        self.plan = plan
        layout = plan.layout
        name = f"{GROUP_PREFIX}{os.getpid()}-{next(_counter)}"
        self.dirs: dict[str, Path] = {c: parent / name for c, parent in layout.parents.items()}
        self.created: list[Path] = []
        try:
            self._create()
        except OSError as error:
            self.remove()
            raise UserError(f"--device {plan.device.name}: cannot set up the cgroups: "
                            f"{error.strerror or error} ({getattr(error, 'filename', '')})"
                            ) from None

    @property
    def memory_dir(self) -> Path:
        return self.dirs["memory"]

    def _create(self) -> None:
        layout, device = self.plan.layout, self.plan.device
        if layout.version == 2:
            parent = layout.parents["memory"]
            wanted = " ".join(f"+{n}" for n in ("memory", "io", "cpuset")
                              if n in _read(parent / "cgroup.controllers").split())
            (parent / "cgroup.subtree_control").write_text(wanted)
        for directory in dict.fromkeys(self.dirs.values()):
            directory.mkdir()
            self.created.append(directory)
        cap = device.memory_cap_bytes
        memory = self.memory_dir
        if layout.version == 1:
            (memory / "memory.limit_in_bytes").write_text(str(cap))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                (memory / "memory.memsw.limit_in_bytes").write_text(str(cap + device.swap_bytes))
            if device.swap_bytes == 0:
                (memory / "memory.swappiness").write_text("0")
        else:
            (memory / "memory.max").write_text(str(cap))
            if (memory / "memory.swap.max").exists():
                (memory / "memory.swap.max").write_text(str(device.swap_bytes))
        self._throttle()
        if self.plan.cpus is not None and "cpuset" in self.dirs:
            cpuset = self.dirs["cpuset"]
            if layout.version == 1:  # v1 needs both before a task may join
                parent_mems = _read(layout.parents["cpuset"] / "cpuset.mems").strip()
                (cpuset / "cpuset.mems").write_text(parent_mems)
            (cpuset / "cpuset.cpus").write_text(self.plan.cpus)

    def _throttle(self) -> None:
        device, disk = self.plan.device, self.plan.disk
        if disk is None:
            return
        if self.plan.layout.version == 1:
            blkio = self.dirs["blkio"]
            if device.read_bytes_per_s:
                (blkio / "blkio.throttle.read_bps_device").write_text(
                    f"{disk} {device.read_bytes_per_s}")
            if device.write_bytes_per_s:
                (blkio / "blkio.throttle.write_bps_device").write_text(
                    f"{disk} {device.write_bytes_per_s}")
            return
        limits = [f"rbps={device.read_bytes_per_s}" if device.read_bytes_per_s else "",
                  f"wbps={device.write_bytes_per_s}" if device.write_bytes_per_s else ""]
        (self.dirs["blkio"] / "io.max").write_text(f"{disk} {' '.join(filter(None, limits))}")

    def unthrottle(self) -> None:
        """Lift the storage throttle: a killed child blocked on throttled reads (a large
        readahead queued at a few hundred kB/s) then dies at once instead of after them."""
        disk = self.plan.disk
        if disk is None or "blkio" not in self.dirs:
            return
        with contextlib.suppress(OSError):
            if self.plan.layout.version == 1:
                for name in ("read", "write"):
                    path = self.dirs["blkio"] / f"blkio.throttle.{name}_bps_device"
                    if path.exists():
                        path.write_text(f"{disk} 0")  # 0 removes the rule
            else:
                (self.dirs["blkio"] / "io.max").write_text(f"{disk} rbps=max wbps=max")

    def join_files(self) -> list[str]:
        """The files a process writes its pid into to join every group."""
        return [str(directory / "cgroup.procs") for directory in dict.fromkeys(self.dirs.values())]

    def memory_stat(self) -> dict[str, int]:
        values: dict[str, int] = {}
        for line in _read(self.memory_dir / "memory.stat").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                values[parts[0]] = int(parts[1])
        return values

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.plan.layout.version == 1 else "memory.events"
        for line in _read(self.memory_dir / name).splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def peak_usage_bytes(self) -> int | None:
        name = ("memory.max_usage_in_bytes" if self.plan.layout.version == 1
                else "memory.peak")
        text = _read(self.memory_dir / name).strip()
        return int(text) if text.isdigit() else None

    def remove(self) -> None:
        """rmdir every group (retried for up to 5 s each: a killed child leaves them a
        moment later, longer on a loaded machine)."""
        for directory in reversed(self.created):
            for _ in range(250):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            else:
                log.warning("could not remove cgroup %s", directory)
        self.created = []


# ------------------------------------------------------------------ page cache


def evict_files(paths: Iterable[str | Path]) -> int:
    """Drop the files' pages from the page cache (pages no one maps); their bytes.

    Each file is written back first: the kernel keeps dirty pages on
    POSIX_FADV_DONTNEED, so a store prepared moments before (its pages still
    dirty under a busy disk) would otherwise start partly warm."""
    return sum(drop_cached(path, write_back=True) for path in paths)


# ------------------------------------------------------------------ one emulated run


@dataclass
class EmulatedRun:
    """What one run on the emulated device did (bytes, seconds since the run began)."""

    device: dict[str, Any]
    status: str  # "finished", "killed" or "failed"
    reason: str | None = None  # why it was killed or failed
    returncode: int | None = None
    error_code: int | None = None  # the child's exit code for an error before the run
    run_time_s: float | None = None  # from the first job's start to the end or the kill
    jobs_finished: list[tuple[int, int]] = field(default_factory=list)  # (job id, end us)
    memory_budget_bytes: int | None = None
    runtime_base_bytes: int | None = None  # the child's memory before its first job
    evicted_bytes: int = 0
    oom_kills: int = 0
    peak_cgroup_bytes: int | None = None  # the kernel's peak of the memory cgroup
    peak_anonymous_bytes: int = 0  # sampled
    peak_page_cache_bytes: int = 0  # sampled
    peak_swap_bytes: int = 0  # sampled
    major_faults: int = 0  # the child's, last sample
    bytes_read: int = 0  # the child's read_bytes (storage), last sample
    # Per thread name (masa.runtime.threads names its workers, grouped here as
    # "masa-worker", its memory sampler and planner; the loop keeps the process's
    # name): [seconds on a CPU, seconds runnable but waiting for one], each thread's
    # last sample (the kernel's schedstat).
    thread_cpu_s: dict[str, list[float]] = field(default_factory=dict)
    cgroups: list[str] = field(default_factory=list)
    report: dict[str, Any] | None = None  # the child's report (masa.report) when it finished

    def as_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document.pop("report")
        document["jobs_finished"] = [list(item) for item in self.jobs_finished]
        return document


def _proc_counters(pid: int) -> tuple[int | None, int | None]:
    """(major faults, bytes read from storage) of a live process, or Nones."""
    faults = read = None
    stat = _read(Path(f"/proc/{pid}/stat"))
    if stat:
        faults = int(stat.rpartition(")")[2].split()[9])
    for line in _read(Path(f"/proc/{pid}/io")).splitlines():
        if line.startswith("read_bytes:"):
            read = int(line.split()[1])
    return faults, read


def _thread_times(pid: int) -> dict[int, tuple[str, int, int]]:
    """Each live thread of `pid`: (its name, ns on a CPU, ns waiting for one)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        run_wait = _read(task / "schedstat").split()[:2]
        name = _read(task / "comm").strip()
        if len(run_wait) == 2 and name:  # else the thread ended meanwhile
            found[int(task.name)] = (name, int(run_wait[0]), int(run_wait[1]))
    return found


class _Sampler:
    """The group's memory and the child's counters, sampled while it runs."""

    def __init__(self, groups: DeviceCgroups, run: EmulatedRun, pid: int) -> None:
        self.groups, self.run, self.pid = groups, run, pid
        self.threads: dict[int, tuple[str, int, int]] = {}  # last sample of each thread
        v1 = groups.plan.layout.version == 1
        self.keys = (("total_rss", "total_cache", "total_swap") if v1
                     else ("anon", "file", "swap"))

    def sample(self) -> None:
        stat = self.groups.memory_stat()
        anon, cache, swap = (stat.get(key, 0) for key in self.keys)
        if self.groups.plan.layout.version == 2:
            swap = int(_read(self.groups.memory_dir / "memory.swap.current").strip() or 0)
        run = self.run
        run.peak_anonymous_bytes = max(run.peak_anonymous_bytes, anon)
        run.peak_page_cache_bytes = max(run.peak_page_cache_bytes, cache)
        run.peak_swap_bytes = max(run.peak_swap_bytes, swap)
        faults, read = _proc_counters(self.pid)
        if faults is not None:
            run.major_faults = faults
        if read is not None:
            run.bytes_read = read
        self.threads.update(_thread_times(self.pid))

    def thread_seconds(self) -> dict[str, list[float]]:
        """EmulatedRun.thread_cpu_s from the threads' last samples."""
        by_name: dict[str, list[float]] = {}
        for name, run_ns, wait_ns in self.threads.values():
            group = WORKER_THREAD_PREFIX if name.startswith(WORKER_THREAD_PREFIX) else name
            seconds = by_name.setdefault(group, [0.0, 0.0])
            seconds[0] += run_ns / 1e9
            seconds[1] += wait_ns / 1e9
        return {name: [round(run_s, 3), round(wait_s, 3)]
                for name, (run_s, wait_s) in sorted(by_name.items())}


def _child_preexec(join_files: list[str]) -> None:
    """In the child, before exec: join the groups; die with the parent."""
    for name in join_files:
        with open(name, "w") as procs:
            procs.write(str(os.getpid()))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM (unless someone handles it already) ends the wait like Ctrl-C, with 143,
    so the clean-up below still runs."""
    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(143)

    installed = False
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGTERM, handler)
            installed = True
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM inside the block are only noted, and raised again after it.

    Python runs signal handlers in the main thread whichever thread the kernel
    chose, so swapping the handlers (not the signal mask, which is per thread)
    keeps them out of the block."""
    pending: list[int] = []
    try:
        previous = {signum: signal.signal(signum, lambda number, _: pending.append(number))
                    for signum in _STOP_SIGNALS}
    except ValueError:  # not the main thread: nothing to defer
        previous = {}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in pending:
            os.kill(os.getpid(), signum)  # now, to the handler that was there


def run_emulated(plan: EmulationPlan, spec: dict[str, Any]) -> EmulatedRun:
    """Run `spec` (masa.cli.emulation_child's input) on the emulated device."""
    remove_stale_groups(plan.layout)
    # The CPUs the run really gets: the device's core count, capped by this machine's.
    run = EmulatedRun(device={**plan.device.as_dict(), "cpus": plan.cpus}, status="failed")
    with tempfile.TemporaryDirectory(prefix="masa-emu-") as scratch:
        paths = {name: Path(scratch, name) for name in ("spec.json", "progress", "report")}
        paths["spec.json"].write_text(json.dumps({
            **spec, "progress_path": str(paths["progress"]),
            "report_path": str(paths["report"]),
            "memory_cap_bytes": plan.device.memory_cap_bytes,
            "cold_cache": plan.device.cold_cache}))
        groups = DeviceCgroups(plan)
        run.cgroups = [str(d) for d in dict.fromkeys(groups.dirs.values())]
        child = None
        try:
            with _sigterm_as_exit():
                # Ctrl-C while the child is being started would leave it unknown to
                # the clean-up below: the signals wait until `child` is set.
                with _signals_deferred():
                    child = subprocess.Popen(
                        [sys.executable, "-m", "masa.cli.emulation_child",
                         str(paths["spec.json"])],
                        preexec_fn=lambda: _child_preexec(groups.join_files()),
                        start_new_session=True)
                log.debug("emulated run: child %d started in %s", child.pid,
                          ", ".join(run.cgroups))
                _watch(child, groups, run)
        finally:
            if child is not None and child.poll() is None:
                groups.unthrottle()
                child.kill()
                child.wait()
            groups.remove()
        _read_progress(paths["progress"], run)
        if run.status == "finished" and paths["report"].exists():
            run.report = json.loads(paths["report"].read_text())
    return run


def _watch(child: subprocess.Popen, groups: DeviceCgroups, run: EmulatedRun) -> None:
    """Sample until the child exits; then classify how it ended."""
    sampler = _Sampler(groups, run, child.pid)
    while True:
        sampler.sample()
        try:
            child.wait(timeout=_SAMPLE_INTERVAL_S)
            break
        except subprocess.TimeoutExpired:
            continue
    ended_s = time.monotonic()
    run.thread_cpu_s = sampler.thread_seconds()
    run.returncode = child.returncode
    run.oom_kills = groups.oom_kills()
    run.peak_cgroup_bytes = groups.peak_usage_bytes()
    run.run_time_s = ended_s  # made relative to the run's start by _read_progress
    if child.returncode == 0:
        run.status = "finished"
    elif child.returncode == -signal.SIGKILL:
        run.status = "killed"
        run.reason = ("out of memory: the cgroup's OOM killer ended it"
                      if run.oom_kills else "killed by SIGKILL")
    else:
        run.status = "failed"
        run.reason = f"the run exited with status {child.returncode}"


def _read_progress(path: Path, run: EmulatedRun) -> None:
    """The child's progress lines: `begin MONOTONIC_S BUDGET BASE EVICTED`, `job ID END_US`,
    `end MONOTONIC_S PEAK_BYTES` (-1: no peak read), `error CODE MESSAGE`. The end
    line, where there is one, bounds the run's time and memory: what the child does
    after it (writing its report and trace) is not the run."""
    begin_s = None
    for line in _read(path).splitlines():
        parts = line.split()
        if parts[:1] == ["begin"] and len(parts) == 5:
            begin_s = float(parts[1])
            run.memory_budget_bytes, run.runtime_base_bytes, run.evicted_bytes = (
                int(parts[2]), int(parts[3]), int(parts[4]))
        elif parts[:1] == ["job"] and len(parts) == 3:
            run.jobs_finished.append((int(parts[1]), int(parts[2])))
        elif parts[:1] == ["end"] and len(parts) == 3 and run.status == "finished":
            run.run_time_s = float(parts[1])
            if int(parts[2]) >= 0:
                run.peak_cgroup_bytes = int(parts[2])
        elif parts[:1] == ["error"] and len(parts) >= 3:
            run.error_code, run.reason = int(parts[1]), line.split(" ", 2)[2]
    if run.run_time_s is not None:
        run.run_time_s = None if begin_s is None else round(run.run_time_s - begin_s, 3)
