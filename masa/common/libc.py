"""The C library through ctypes: one handle, with the prototypes Masa calls.

This module owns Masa's only `ctypes.CDLL` of libc. `LIBC` is None where no C
library loads; a function libc lacks (mallopt, malloc_trim and mincore outside
glibc) is simply absent from it, so callers test `hasattr` and fall back.
Pointer-sized arguments get prototypes here: without them ctypes passes Python
ints as 32-bit C ints and truncates addresses and sizes above 2 GiB.
"""

from __future__ import annotations

import ctypes
import ctypes.util

PROT_READ = 1
MAP_SHARED = 1
MAP_FAILED = ctypes.c_void_p(-1).value


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    prototypes = {
        "mmap": (ctypes.c_void_p, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_int, ctypes.c_long)),
        "munmap": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_size_t)),
        "mlock": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_size_t)),
        "mincore": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)),
    }
    for name, (restype, argtypes) in prototypes.items():
        function = getattr(libc, name, None)
        if function is not None:
            function.restype, function.argtypes = restype, argtypes
    return libc


LIBC = _load_libc()


PR_SET_NAME = 15
THREAD_NAME_BYTES = 15  # the kernel keeps a thread's name in 16 bytes with its NUL
# The executor's worker threads are named WORKER_THREAD_PREFIX-N (masa.runtime.threads);
# per-thread readers (the emulation's schedstat sampler, masa.report.cpu_profile)
# group them by this prefix.
WORKER_THREAD_PREFIX = "masa-worker"


def name_this_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel (/proc/PID/task/TID/comm, top -H,
    schedstat readers), truncated to THREAD_NAME_BYTES: Python's thread names stay
    inside Python. A no-op where libc or prctl is missing."""
    prctl = getattr(LIBC, "prctl", None)
    if prctl is not None:
        prctl(PR_SET_NAME, name.encode()[:THREAD_NAME_BYTES], 0, 0, 0)
