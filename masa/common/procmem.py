"""Reading a process's memory: current RSS, its split, the kernel's peak, and its cgroup.

This module owns every reading of process memory, none of which needs more
than the standard library and psutil:

- `rss_bytes()` and `resident_split()`: one short read of /proc/self/statm
  (kept open), cheap enough for every scheduling decision; the split is anonymous (heap,
  tensors, ONNX Runtime arenas) versus file-backed (statm's `shared`: RssFile +
  RssShmem, mapped libraries and model files);
- `reset_peak()` writes 5 to /proc/self/clear_refs, which resets VmHWM (the
  high-water mark of RSS); `peak_rss_bytes()` then reads the exact peak since the
  reset. VmHWM is per process, so a peak is exact for one operation only when
  nothing else in the process allocates meanwhile;
- `process_memory_bytes()`: the full split through psutil (smaps_rollup), for
  reports;
- `page_cache_bytes(path)`: how much of a file is in memory (cachestat, or
  mincore; `cachestat_bytes(fd, size)` the cachestat part alone, for an open
  file), for the stage data files a LOAD maps: those pages are the stage's
  weights, held for it whether or not the process has touched them yet, and a
  memory cgroup is charged for them; `files_cached_bytes(paths)` the same over a
  LOAD's files before it starts (what it finds without reading storage);
  `drop_cached(path)` drops a file's pages from it (posix_fadvise DONTNEED: only
  pages nothing maps or locks);
- the process's memory cgroup (v1 or v2): `find_memory_cgroup`,
  `read_cgroup_memory` and `CgroupMeter` (usage at the start of a run, its peak
  and OOM kills over the run). The root cgroup is never reported: its figures
  are the whole machine's.

Readers take the /proc and cgroup roots as parameters so tests can point them
at a fake tree.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import psutil

from masa.common.libc import LIBC, MAP_FAILED, MAP_SHARED, PROT_READ

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
PROC_ROOT = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages: anything this large is unlimited.
_V1_UNLIMITED_BYTES = 2**62


def rss_bytes() -> int:
    """Resident set size now, from /proc/self/statm (cheap: one short read)."""
    return resident_split().resident_bytes


class ResidentSplit(NamedTuple):
    """Resident memory by kind, in bytes; the two add up to the RSS."""

    anonymous_bytes: int
    file_backed_bytes: int

    @property
    def resident_bytes(self) -> int:
        return self.anonymous_bytes + self.file_backed_bytes


# This process's /proc/self/statm, kept open: (the pid that opened it, its fd).
_own_statm: tuple[int, int] | None = None
_own_statm_lock = threading.Lock()


def _read_own_statm() -> bytes:
    """/proc/self/statm through a descriptor kept open (a forked child opens its own).
    A positional read skips the path walk of an open and the close: in a run, where
    the memory sampler and every decision read it, 21 us against 70 (measured)."""
    global _own_statm
    opened = _own_statm
    if opened is None or opened[0] != os.getpid():
        with _own_statm_lock:
            opened = _own_statm
            if opened is None or opened[0] != os.getpid():
                fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
                _own_statm = opened = (os.getpid(), fd)
    return os.pread(opened[1], 256, 0)


def resident_split(proc_root: str | Path = PROC_ROOT, pid: int | str = "self") -> ResidentSplit:
    """Anonymous and file-backed resident bytes from one read of /proc/PID/statm.

    statm's fields are pages: size resident shared text lib data dt; `shared`
    is RssFile + RssShmem, the rest of `resident` is anonymous.
    """
    if proc_root == PROC_ROOT and pid == "self":
        fields = _read_own_statm().split()
    else:
        with open(f"{proc_root}/{pid}/statm", "rb") as statm:
            fields = statm.read().split()
    resident, shared = int(fields[1]), int(fields[2])
    return ResidentSplit((resident - shared) * _PAGE_BYTES, shared * _PAGE_BYTES)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_rss_bytes() -> int:
    """VmHWM: peak RSS since process start or the last `reset_peak()`."""
    return _status_kib("VmHWM") * 1024


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS. False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def process_memory_bytes(pid: int | None = None) -> dict[str, int]:
    """A process's memory by kind, through psutil: resident (rss), of it anonymous and
    file-backed (`shared`: RssFile + RssShmem), unique (uss), proportional (pss), swap.

    Reads /proc/PID/smaps_rollup (a few ms for a large process): for reports and
    metrics, not for the scheduler's per-decision reading (`resident_split`).
    """
    info = psutil.Process(pid).memory_full_info()
    return {"rss": info.rss, "anonymous": info.rss - info.shared, "file_backed": info.shared,
            "uss": info.uss, "pss": getattr(info, "pss", 0), "swap": getattr(info, "swap", 0)}


_RESIDENT_BIT = bytes(byte & 1 for byte in range(256))  # a translate() table


class _CachestatRange(ctypes.Structure):
    _fields_ = (("offset", ctypes.c_uint64), ("length", ctypes.c_uint64))


class _Cachestat(ctypes.Structure):
    _fields_ = (("nr_cache", ctypes.c_uint64), ("nr_dirty", ctypes.c_uint64),
                ("nr_writeback", ctypes.c_uint64), ("nr_evicted", ctypes.c_uint64),
                ("nr_recently_evicted", ctypes.c_uint64))


# cachestat(2), Linux >= 6.5: the same number on every architecture (a syscall
# added after the tables were unified).
_SYS_CACHESTAT = 451


def drop_cached(path: str | Path, write_back: bool = False) -> int:
    """Drop the file's pages from the page cache, except those a process maps or
    locks (posix_fadvise DONTNEED); its size in bytes, 0 if it cannot be opened.
    `write_back` first writes dirty pages, which DONTNEED would keep: a file
    written moments before."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        if write_back:
            os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def page_cache_bytes(path: str | Path) -> int | None:
    """Bytes of the file `path` in memory (the page cache) now; None where neither
    cachestat(2) nor mincore(2) is available. Reading it faults nothing in.

    cachestat takes about 0.2 ms for a 288 MiB file; mincore, the fallback for
    kernels before 6.5, about 8 ms (it fills a byte per page).
    """
    if LIBC is None:
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        cached = cachestat_bytes(fd, size)
        return cached if cached is not None else _mincore_bytes(fd, size)
    finally:
        os.close(fd)


def cachestat_bytes(fd: int, size: int) -> int | None:
    """Bytes of the open file `fd` (`size` bytes long) in the page cache now, by
    cachestat(2); None where the kernel (before 6.5) or libc lacks it."""
    if LIBC is None:
        return None
    stat = _Cachestat()
    whole_file = _CachestatRange(0, 0)  # length 0: to the end of the file
    if LIBC.syscall(_SYS_CACHESTAT, fd, ctypes.byref(whole_file), ctypes.byref(stat), 0) != 0:
        return None
    return min(size, stat.nr_cache * _PAGE_BYTES)


def files_cached_bytes(paths: Iterable[str | Path]) -> tuple[int, int | None]:
    """The files' total size and how many of those bytes are in the page cache now
    (None where that cannot be read): what a read of them finds without storage."""
    total_bytes, cached_bytes = 0, 0
    for path in paths:
        total_bytes += os.stat(path).st_size
        if cached_bytes is not None:
            found = page_cache_bytes(path)
            cached_bytes = None if found is None else cached_bytes + found
    return total_bytes, cached_bytes


def resident_pages(address: int, size: int) -> bytes | None:
    """One byte per page of the mapping at `address` (`size` bytes long): 1 where the
    page is in memory, else 0 (mincore); None where mincore is missing or refused."""
    if LIBC is None or not hasattr(LIBC, "mincore"):
        return None
    vector = (ctypes.c_ubyte * -(-size // _PAGE_BYTES))()
    if LIBC.mincore(address, size, vector) != 0:
        return None
    # Bit 0 of each byte: the page is resident (the other bits are reserved).
    return bytes(vector).translate(_RESIDENT_BIT)


def _mincore_bytes(fd: int, size: int) -> int | None:
    if size == 0:
        return 0
    address = LIBC.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0)
    if address is None or address == MAP_FAILED:
        return None
    try:
        pages = resident_pages(address, size)
        return None if pages is None else min(size, pages.count(1) * _PAGE_BYTES)
    finally:
        LIBC.munmap(address, size)


# ---------------------------------------------------------------- memory cgroup


@dataclass(frozen=True)
class MemoryCgroup:
    """A process's memory cgroup: its version (1 or 2), path and directory of files."""

    version: int
    path: str  # as in /proc/PID/cgroup, e.g. /system.slice/masa.service
    directory: Path


@dataclass(frozen=True)
class CgroupReading:
    """One reading of a memory cgroup's files (bytes; None where a file is absent)."""

    usage_bytes: int
    peak_bytes: int | None  # v1 memory.max_usage_in_bytes, v2 memory.peak
    limit_bytes: int | None  # None: unlimited
    anonymous_bytes: int | None  # v1 memory.stat total_rss, v2 anon
    file_bytes: int | None  # v1 memory.stat total_cache, v2 file
    oom_kills: int | None  # v1 memory.oom_control oom_kill, v2 memory.events oom_kill


def find_memory_cgroup(proc_root: str | Path = PROC_ROOT, cgroup_root: str | Path = CGROUP_ROOT,
                       pid: int | str = "self") -> MemoryCgroup | None:
    """The memory cgroup a process is in; None in the root cgroup or without a memory
    controller (also when its directory is not visible under `cgroup_root`).

    A v1 line `N:...memory...:/path` wins over the v2 line `0::/path` (hybrid
    hierarchies mount v2 without the memory controller). The v2 root has no
    memory.current; a cgroup namespace's root (a container) has one and counts.
    """
    try:
        lines = Path(f"{proc_root}/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        if line.count(":") < 2:
            continue
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            directory = Path(cgroup_root, "memory", path.lstrip("/"))
            if path == "/" or not (directory / "memory.usage_in_bytes").is_file():
                return None
            return MemoryCgroup(1, path, directory)
        if hierarchy == "0" and controllers == "":
            unified = path
    if unified is None:
        return None
    directory = Path(cgroup_root, unified.lstrip("/"))
    if not (directory / "memory.current").is_file():
        return None
    return MemoryCgroup(2, unified, directory)


def _read_int(path: Path) -> int | None:
    """An integer file; None when absent, unreadable or not a number ("max": unlimited)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_keyed(path: Path) -> dict[str, int]:
    """A `key value` per line file (memory.stat, memory.events, memory.oom_control)."""
    values: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    return values


def read_cgroup_memory(cgroup: MemoryCgroup) -> CgroupReading:
    """Usage, peak, limit, anonymous / file split and OOM kills of a memory cgroup."""
    directory = cgroup.directory
    if cgroup.version == 1:
        stat = _read_keyed(directory / "memory.stat")
        limit = _read_int(directory / "memory.limit_in_bytes")
        return CgroupReading(
            usage_bytes=_read_int(directory / "memory.usage_in_bytes") or 0,
            peak_bytes=_read_int(directory / "memory.max_usage_in_bytes"),
            limit_bytes=None if limit is None or limit >= _V1_UNLIMITED_BYTES else limit,
            anonymous_bytes=stat.get("total_rss", stat.get("rss")),
            file_bytes=stat.get("total_cache", stat.get("cache")),
            oom_kills=_read_keyed(directory / "memory.oom_control").get("oom_kill"))
    stat = _read_keyed(directory / "memory.stat")
    return CgroupReading(
        usage_bytes=_read_int(directory / "memory.current") or 0,
        peak_bytes=_read_int(directory / "memory.peak"),
        limit_bytes=_read_int(directory / "memory.max"),  # "max" reads as None
        anonymous_bytes=stat.get("anon"),
        file_bytes=stat.get("file"),
        oom_kills=_read_keyed(directory / "memory.events").get("oom_kill"))


def cgroup_members(cgroup: MemoryCgroup) -> list[int]:
    """Process ids directly in the cgroup (cgroup.procs); [] when unreadable."""
    try:
        return [int(pid) for pid in (cgroup.directory / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


@dataclass(frozen=True)
class CgroupRunMemory:
    """A memory cgroup's figures over one run, in bytes (absolute, the whole cgroup's)."""

    version: int
    path: str
    usage_at_begin_bytes: int
    usage_after_bytes: int
    # Since the run began when peak_since_begin, else since the cgroup was created.
    peak_usage_bytes: int | None
    peak_since_begin: bool
    limit_bytes: int | None  # None: unlimited
    anonymous_after_bytes: int | None
    file_after_bytes: int | None
    oom_kills: int | None  # OOM kills in the cgroup during the run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class CgroupMeter:
    """A memory cgroup over one run: its usage when the run began, the peak since, OOM kills.

    The peak is reset at `begin()` only where that disturbs no other reader: v1
    resets memory.max_usage_in_bytes for everyone, so only when this process is
    the cgroup's only member (and may write the file); v2 (Linux 6.12+) resets
    memory.peak for one open file descriptor, which the meter keeps until
    `finish()`. Otherwise the peak is the cgroup's since its creation
    (`peak_since_begin` False).
    """

    def __init__(self, cgroup: MemoryCgroup, pid: int | None = None) -> None:
        self.cgroup = cgroup
        self.pid = os.getpid() if pid is None else pid
        self._begin: CgroupReading | None = None
        self._peak_fd: int | None = None
        self._peak_reset = False

    def begin(self) -> None:
        self.close()
        self._peak_reset = self._reset_peak()
        self._begin = read_cgroup_memory(self.cgroup)

    def finish(self) -> CgroupRunMemory:
        """The run's figures; closes what `begin()` kept open."""
        end = read_cgroup_memory(self.cgroup)
        begin = self._begin or end
        peak = end.peak_bytes
        if self._peak_fd is not None:
            peak = _pread_int(self._peak_fd)
        self.close()
        oom_kills = (None if end.oom_kills is None or begin.oom_kills is None
                     else end.oom_kills - begin.oom_kills)
        return CgroupRunMemory(
            version=self.cgroup.version, path=self.cgroup.path,
            usage_at_begin_bytes=begin.usage_bytes, usage_after_bytes=end.usage_bytes,
            peak_usage_bytes=peak, peak_since_begin=self._peak_reset and peak is not None,
            limit_bytes=end.limit_bytes, anonymous_after_bytes=end.anonymous_bytes,
            file_after_bytes=end.file_bytes, oom_kills=oom_kills)

    def close(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None

    def _reset_peak(self) -> bool:
        if self.cgroup.version == 1:
            if cgroup_members(self.cgroup) != [self.pid]:
                return False  # the peak is shared with other processes: leave it
            try:
                (self.cgroup.directory / "memory.max_usage_in_bytes").write_text("0")
                return True
            except OSError:
                return False
        try:
            fd = os.open(self.cgroup.directory / "memory.peak", os.O_RDWR)
        except OSError:  # before Linux 6.12 memory.peak is read-only
            return False
        # Only a kernel file (size 0) resets per descriptor; never write into a
        # regular file that merely has the name.
        if os.fstat(fd).st_size != 0 or not _write_reset(fd) or _pread_int(fd) is None:
            os.close(fd)
            return False
        self._peak_fd = fd
        return True


def _write_reset(fd: int) -> bool:
    try:
        os.write(fd, b"reset\n")
        return True
    except OSError:
        return False


def _pread_int(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 64, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return None
