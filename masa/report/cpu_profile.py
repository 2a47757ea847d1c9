"""Where a run's CPU time goes, by thread and, inside the kernel, by what entered it.

This module owns the reading of a system-wide `perf record -g` of one real run
(benchmarks/bench_cpu_profile.py, docs/bench-cpu-profile.md): `perf script -F
comm,pid,tid,ip,sym,dso` prints one sample per block, a header line (thread name,
pid/tid) and its call chain, innermost frame first, each frame ending in its object
in parentheses (`[kernel.kallsyms]` for the kernel). The executor names its threads
(masa.common.libc.name_this_thread: masa-worker-N, masa-sampler, masa-plan) and its
loop runs on the process's main thread, so one run's samples split into the loop's,
the workers' and the rest. A sample whose innermost frame is in the kernel is charged
to the system call that entered it (`__x64_sys_munmap`) or to a page fault, else to
the kernel function at the chain's root; a user sample to its innermost object.
Pure: text in, counts out.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from masa.common.libc import WORKER_THREAD_PREFIX

KERNEL_OBJECT = "[kernel.kallsyms]"
PAGE_FAULT = "page fault"
_HEADER = re.compile(r"^(\S.*?)\s+(\d+)/(\d+)\b")


@dataclass(frozen=True)
class PerfSample:
    comm: str  # the thread's name
    pid: int
    tid: int
    frames: tuple[tuple[str, str], ...]  # (symbol, object), innermost first


@dataclass(frozen=True)
class ThreadCpu:
    """One group of threads' samples: how many, how many in the kernel, by entry."""

    samples: int
    kernel_samples: int
    kernel_by_entry: dict[str, int]  # system call or page fault -> samples
    user_by_object: dict[str, int]  # shared object (its file name) -> samples

    def as_dict(self) -> dict[str, object]:
        return {"samples": self.samples, "kernel_samples": self.kernel_samples,
                "kernel_by_entry": self.kernel_by_entry, "user_by_object": self.user_by_object}


def parse_perf_script(lines: Iterable[str]) -> list[PerfSample]:
    """The samples of `perf script -F comm,pid,tid,ip,sym,dso` output."""
    samples: list[PerfSample] = []
    header: tuple[str, int, int] | None = None
    frames: list[tuple[str, str]] = []
    for line in [*lines, ""]:
        if not line.strip():
            if header is not None:
                samples.append(PerfSample(*header, tuple(frames)))
            header, frames = None, []
        elif not line[0].isspace():
            match = _HEADER.match(line)
            header = (match.group(1), int(match.group(2)), int(match.group(3))) if match \
                else None
        elif header is not None:
            frames.append(_frame(line))
    return samples


def _frame(line: str) -> tuple[str, str]:
    """(symbol without its offset, object's file name) of `  addr sym+0x1f (object)`."""
    text = line.strip()
    head, _, tail = text.rpartition(" (")
    where = tail[:-1] if tail.endswith(")") else ""
    symbol = head.split(None, 1)[1] if " " in head else ""
    return symbol.split("+0x")[0], where.rsplit("/", 1)[-1]


def kernel_entry(frames: Sequence[tuple[str, str]]) -> str:
    """What brought a kernel sample into the kernel: its system call, a page fault, or
    the outermost kernel function (an interrupt, the idle loop)."""
    kernel = [symbol for symbol, where in frames if where == KERNEL_OBJECT]
    for symbol in reversed(kernel):  # outermost first: the call under the entry code
        if symbol.startswith("__x64_sys_") or symbol.startswith("__arm64_sys_"):
            return symbol.split("_sys_", 1)[1]
    if "exc_page_fault" in kernel or "do_page_fault" in kernel:
        return PAGE_FAULT
    return kernel[-1] if kernel else "?"


def thread_cpu(samples: Iterable[PerfSample]) -> ThreadCpu:
    """Count a group of samples: kernel ones by entry, user ones by object."""
    kernel: collections.Counter[str] = collections.Counter()
    user: collections.Counter[str] = collections.Counter()
    count = 0
    for sample in samples:
        count += 1
        if sample.frames and sample.frames[0][1] == KERNEL_OBJECT:
            kernel[kernel_entry(sample.frames)] += 1
        elif sample.frames:
            user[sample.frames[0][1]] += 1
    return ThreadCpu(count, sum(kernel.values()), dict(kernel.most_common()),
                     dict(user.most_common()))


def run_threads(samples: Sequence[PerfSample]) -> dict[str, ThreadCpu]:
    """The run's process (the one whose threads are named masa-worker-N): its loop (the
    main thread), its workers together, and its other threads by name; empty where no
    worker was sampled."""
    pids = collections.Counter(s.pid for s in samples if s.comm.startswith(WORKER_THREAD_PREFIX))
    if not pids:
        return {}
    pid = pids.most_common(1)[0][0]
    mine = [s for s in samples if s.pid == pid]
    groups: dict[str, list[PerfSample]] = {"loop": [], "workers": []}
    for sample in mine:
        name = ("loop" if sample.tid == pid else "workers"
                if sample.comm.startswith(WORKER_THREAD_PREFIX) else sample.comm)
        groups.setdefault(name, []).append(sample)
    return {name: thread_cpu(group) for name, group in groups.items()}
