"""Reading a process's memory: current RSS and the kernel's peak from /proc, by kind via psutil.

`reset_peak()` writes 5 to /proc/self/clear_refs, which resets VmHWM (the
high-water mark of RSS); `peak_rss_bytes()` then reads the exact peak since the
reset. VmHWM is per process, so a peak is exact for one operation only when
nothing else in the process allocates meanwhile (offline profiling).
"""

from __future__ import annotations

import os

import psutil

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size now, from /proc/self/statm (cheap: one short read)."""
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


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
    metrics, not for the scheduler's per-decision reading (`rss_bytes`).
    """
    info = psutil.Process(pid).memory_full_info()
    return {"rss": info.rss, "anonymous": info.rss - info.shared, "file_backed": info.shared,
            "uss": info.uss, "pss": getattr(info, "pss", 0), "swap": getattr(info, "swap", 0)}
