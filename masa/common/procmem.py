"""Reading this process's memory from /proc: current RSS, and the kernel's peak.

`reset_peak()` writes 5 to /proc/self/clear_refs, which resets VmHWM (the
high-water mark of RSS); `peak_rss_bytes()` then reads the exact peak since the
reset. VmHWM is per process, so a peak is exact for one operation only when
nothing else in the process allocates meanwhile (offline profiling).
"""

from __future__ import annotations

import os

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
