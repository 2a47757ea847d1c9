"""The one place that creates ONNX Runtime sessions and gives their memory back.

Profiling (model_prep) and execution (masa executors) must measure the same
thing, so both create every session through `create_session`, with the options
from `session_options`:

- one intra-op thread by default: parallelism comes from Masa's worker pool,
  and several multi-threaded sessions on 2 cores slow each other 6-10x;
- intra-op spinning off: idle spinning threads of many live sessions steal the
  cores the other workers need;
- CPU memory arena off: memory is returned when a run ends, so reserved and
  measured memory stay comparable (cost not measurable, see ENGINEERING-NOTES);
- sessions are created from a file path, never from bytes (from bytes ORT keeps
  a second copy of the weights).

A stage's LOAD goes through `load_stage`, with the session option its manifest
chose (`Stage.prepack`, decided per stage by the profiler):
- prepack=False: `session.disable_prepacking=1` and graph level EXTENDED, so
  weights in a page-aligned data file (model_prep.stage_files, load mode
  "mmap") stay mapped instead of copied (level ALL turns conv weights into
  blocked NCHWc copies even without prepacking). `load_stage` then reads the
  data file's pages into the page cache itself (`read_in`), so the storage I/O
  happens in the LOAD and the EXEC runs on resident pages. An executor loads
  through `load_stage_locked` instead, which also locks those pages in memory
  (`lock_in`) until the stage is unloaded, so that they are still resident
  when its EXEC comes;
- prepack=True: ONNX Runtime's defaults (level ALL, prepacked weights): a
  private copy of the weights, worth it where the profiler measured that the
  copy pays for itself in one run.

`create_session` also pins glibc's mmap threshold (`pin_malloc_threshold`), so
a stage's memory figures do not depend on what the process loaded before.

`release_memory` must follow the last reference to a session: ORT's memory only
goes back after the Python handle dies, `gc.collect()` runs and glibc trims its
heap (otherwise 5-26 MiB of freed heap stays resident).
"""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from masa.common.libc import LIBC, MAP_FAILED, MAP_SHARED, PROT_READ
from masa.common.procmem import cachestat_bytes, drop_cached, resident_pages

DEFAULT_INTRA_OP_THREADS = 1
# A tiny Conv+Relu+Flatten+Gemm model (x: 1x3x8x8 -> y: 1x8; tests/test_zero_copy.py
# rebuilds it). Its first session and run pay ONNX Runtime's one-time setup
# (environment, kernel registries, thread pools), so that no stage's figures do.
WARMUP_MODEL_PATH = Path(__file__).with_name("warmup.onnx")
WARMUP_INPUT_SHAPE = (1, 3, 8, 8)


def session_options(intra_op_threads: int = DEFAULT_INTRA_OP_THREADS) -> ort.SessionOptions:
    """Session options shared by the profiler and every executor."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


def stage_session_options(prepack: bool = True,
                          intra_op_threads: int = DEFAULT_INTRA_OP_THREADS) -> ort.SessionOptions:
    """`session_options`, without prepacking and at graph level EXTENDED unless prepack."""
    options = session_options(intra_op_threads)
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return options


def create_session(
    model_path: str | Path, intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
    prepack: bool = True,
) -> ort.InferenceSession:
    """An InferenceSession on the CPU, created from a path with the shared options."""
    return ort.InferenceSession(
        str(model_path),
        sess_options=stage_session_options(prepack, intra_op_threads),
        providers=["CPUExecutionProvider"],
    )


def load_stage(
    model_path: str | Path, prepack: bool, mapped_bytes: int,
    intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
) -> ort.InferenceSession:
    """A stage's LOAD: its session, with mapped weights read in from storage."""
    session = create_session(model_path, intra_op_threads, prepack)
    if mapped_bytes and not prepack:
        read_in(f"{model_path}.data")
    return session


def load_stage_locked(
    model_path: str | Path, prepack: bool, mapped_bytes: int,
    intra_op_threads: int = DEFAULT_INTRA_OP_THREADS,
) -> tuple[ort.InferenceSession, LockedPages | None]:
    """An executor's LOAD: `load_stage`, with the mapped weights locked in memory
    until the caller unlocks them (at the stage's unload); None: nothing to lock,
    or the kernel refused the lock (the weights are then only read in).

    Either way the weights' pages already cached are locked before anything is
    read (`hold_cached`): mapped weights are locked before the session is created,
    copied ones are held only while it reads them."""
    data_path = f"{model_path}.data"
    if not mapped_bytes or prepack:
        held = hold_cached(data_path)
        try:
            return create_session(model_path, intra_op_threads, prepack), None
        finally:
            if held is not None:
                held.unlock()
    locked = lock_in(data_path)
    try:
        return create_session(model_path, intra_op_threads, prepack), locked
    except BaseException:
        if locked is not None:
            locked.unlock()
        raise


# Linux >= 5.14: fault every page of a mapping in, reading from storage as needed,
# without copying anything into the process.
_MADV_POPULATE_READ = 22


def read_in(path: str | Path) -> int:
    """Bring a file's pages into the page cache before it is used; its size in bytes.

    Maps the file, populates the mapping and unmaps it again: the pages stay in
    the page cache (charged to the process's memory cgroup, shared with ONNX
    Runtime's own mapping of the same file, which then only takes minor
    faults), and nothing is copied. Where MADV_POPULATE_READ is missing (older
    kernels) it touches one byte per page instead.
    """
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return 0
        with mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) as view:
            try:
                view.madvise(_MADV_POPULATE_READ)
            except (OSError, ValueError):
                _touch_pages(view, size)
    return size


def read_fresh(path: str | Path) -> int:
    """Drop the file from the page cache and read it back whole, as a LOAD that
    finds it missing reads it (`lock_in`: 1 MiB preads); its size in bytes, 0 if
    it cannot be opened. Pages another process maps or locks stay as they are.

    How a file's pages were cached sets what mapping them costs later: read
    this way the kernel caches them in large folios, read a page at a time in
    4 KiB ones, and then locking, unmapping and first-run faults cost up to 10x
    more (FaceNet's 144 MiB fc stage on this
    host: a LOAD 19.4 ms instead of 2.3 ms, its session's release 15 ms
    instead of 0.8; docs/profiling.md). The profiler reads every stage file
    this way first, so that a profile does not depend on the page cache's past.
    """
    size = drop_cached(path, write_back=True)
    if size:
        _read_ranges(path, ((0, size),))
    return size


class LockedPages:
    """A file mapped and its pages locked in memory (mlock) until `unlock()`.

    Pages a LOAD read in are page cache that nothing has used twice. Under the
    memory cap the kernel reclaims those first, before the pages of stages that
    have already run (used twice, so on its active list): a stage loaded ahead of
    its EXEC then read its weights again, from storage, inside the EXEC
    (emulated Pi 4 at 512 MiB: Masa's EXECs took 20-49x their profiled time,
    docs/bench-device.md). Locked, they cannot be reclaimed; the ledger has
    counted them as the stage's memory since its LOAD, so locking them asks for
    nothing the budget has not granted.
    """

    def __init__(self, address: int, size_bytes: int) -> None:
        self._address: int | None = address
        self.size_bytes = size_bytes

    @property
    def locked(self) -> bool:
        return self._address is not None

    def unlock(self) -> None:
        """Unmap the file, which unlocks its pages (they stay cached until reclaimed)."""
        # Forget the address first: unmapping twice could unmap whatever the kernel
        # has mapped there since (an interrupt may land between the two lines).
        address, self._address = self._address, None
        if address is not None and LIBC is not None:
            LIBC.munmap(ctypes.c_void_p(address), ctypes.c_size_t(self.size_bytes))

    def __del__(self) -> None:  # a dropped holder must not keep memory locked
        self.unlock()


def lock_in(path: str | Path) -> LockedPages | None:
    """Read a file's pages in and keep them locked in memory (`LockedPages`).

    The pages already in the page cache are locked first, then the rest: mlock
    faults every page in, reading from storage as needed, like `read_in`. None
    where nothing is locked: an empty file, or the kernel refused (a process
    without CAP_IPC_LOCK may lock only RLIMIT_MEMLOCK bytes, `ulimit -l`, often
    8 MiB); the file is then read in as `read_in` does.
    """
    mapping = _map_locking_cached(path)
    if mapping is None:
        read_in(path)
        return None
    if mapping.size_bytes == 0:
        return None
    _read_ranges(path, mapping.missing)
    # Nothing missing: the runs locked were the whole file (no second walk of it).
    if mapping.locked and (not mapping.missing or _mlock(mapping.address, mapping.size_bytes)):
        return LockedPages(mapping.address, mapping.size_bytes)
    LIBC.munmap(ctypes.c_void_p(mapping.address), ctypes.c_size_t(mapping.size_bytes))
    read_in(path)
    return None


def hold_cached(path: str | Path) -> LockedPages | None:
    """Lock the file's pages that are in the page cache now, reading nothing, until
    `unlock()`: for a LOAD that reads its weights (and copies them). None where
    nothing was locked (no such file, nothing cached, or the kernel refused).

    Under a memory cap a LOAD's reads need room, and the kernel reclaims the
    oldest pages first: in a file last used a job ago, the LOAD's own pages that
    it has not reached yet are among them, so it read them again, and a stage
    loaded beside it lost the pages it was about to lock. Measured on the
    emulated Pi 4 (mixed at 512 MiB, 2026-11-26): EmotionNet's 288 MiB fc6 file,
    122 MiB of it missing when its LOAD began, was read whole.
    """
    if not os.path.isfile(path):
        return None
    mapping = _map_locking_cached(path)
    if mapping is None or mapping.size_bytes == 0:
        return None
    held = LockedPages(mapping.address, mapping.size_bytes)
    if not mapping.locked or not mapping.any_cached:
        held.unlock()
        return None
    return held


@dataclass(frozen=True)
class _Mapping:
    address: int
    size_bytes: int
    locked: bool  # every run of cached pages was locked (or there was none)
    any_cached: bool
    missing: tuple[tuple[int, int], ...] = ()  # (begin, end) byte ranges not cached


# Held while a LOAD locks the pages it found cached; `_read_ranges` waits for it
# between chunks. Under a memory cap every page read reclaims the oldest pages,
# and a file last used a job ago is among them: on the emulated Pi a LOAD that
# began beside another one's read found its 64 MiB file cached, but the read
# evicted the pages faster than mlock walked them, and the lock read 53-64 MiB
# of them again in 2.4-3.2 s (lifelogging at 1 GiB, four of eight such LOADs).
_LOCKING_CACHED = threading.Lock()


def _map_locking_cached(path: str | Path) -> _Mapping | None:
    """Map the file and lock the runs of its pages already in the page cache (mincore:
    no I/O). None where it cannot be mapped or libc lacks mlock."""
    if LIBC is None or not hasattr(LIBC, "mlock"):
        return None
    with _LOCKING_CACHED:
        return _map_and_lock_resident(path)


def _map_and_lock_resident(path: str | Path) -> _Mapping | None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        address = LIBC.mmap(None, size, PROT_READ, MAP_SHARED, fd, 0) if size else 0
        whole_file_cached = bool(size) and cachestat_bytes(fd, size) == size
    finally:
        os.close(fd)
    if size == 0:
        return _Mapping(0, 0, True, False)
    if address is None or address == MAP_FAILED:
        return None
    if whole_file_cached:
        # Where the CPU binds every LOAD finds its file cached: one mlock, without
        # mincore's byte per page, a lock per run and a second whole-file lock,
        # which made its lock_in 2x slower (agenet's 37 MiB conv: 3.7 ms instead of
        # 1.8) and a small job's 21 LOADs 1.5x (32 ms instead of 21-22; 2026-11-27).
        return _Mapping(address, size, _mlock(address, size), True)
    resident = resident_pages(address, size)
    if resident is None:  # unknown: the caller reads and locks it all
        return _Mapping(address, size, True, False, ((0, size),))
    runs = _page_runs(rb"\x01+", resident, size)
    locked = all(_mlock(address + begin, end - begin) for begin, end in runs)
    return _Mapping(address, size, locked, bool(runs), _page_runs(rb"\x00+", resident, size))


def _page_runs(pattern: bytes, pages: bytes, size: int) -> tuple[tuple[int, int], ...]:
    """The byte ranges of the runs of pages matching `pattern` (mincore bytes)."""
    return tuple((run.start() * mmap.PAGESIZE, min(size, run.end() * mmap.PAGESIZE))
                 for run in re.finditer(pattern, pages))


def _read_ranges(path: str | Path, ranges: tuple[tuple[int, int], ...],
                 chunk_bytes: int = 1 << 20) -> None:
    """Read these byte ranges of the file into the page cache (pread, into one
    reused buffer: nothing is kept), giving way between chunks to any LOAD that
    is locking its cached pages (`_LOCKING_CACHED`)."""
    if not ranges:
        return
    buffer = memoryview(bytearray(chunk_bytes))
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for begin, end in ranges:
            offset = begin
            while offset < end:
                with _LOCKING_CACHED:
                    pass
                got = os.preadv(fd, [buffer[:min(chunk_bytes, end - offset)]], offset)
                if got <= 0:
                    break
                offset += got
    finally:
        os.close(fd)


def _mlock(address: int, size_bytes: int) -> bool:
    return LIBC.mlock(ctypes.c_void_p(address), ctypes.c_size_t(size_bytes)) == 0


def _touch_pages(view: mmap.mmap, size: int) -> None:
    if hasattr(mmap, "MADV_WILLNEED"):
        view.madvise(mmap.MADV_WILLNEED)  # start reading ahead while we fault pages in
    for offset in range(0, size, mmap.PAGESIZE):
        view[offset]


def warm_up(intra_op_threads: int = DEFAULT_INTRA_OP_THREADS) -> None:
    """Create, run once and drop the warm-up session (ORT's one-time setup), then trim."""
    session = create_session(WARMUP_MODEL_PATH, intra_op_threads)
    session.run(None, {"x": np.zeros(WARMUP_INPUT_SHAPE, dtype=np.float32)})
    del session
    release_memory()


# glibc mallopt(M_MMAP_THRESHOLD): setting it also turns off its dynamic growth.
_M_MMAP_THRESHOLD = -3
_M_TRIM_THRESHOLD = -1  # free() returns the heap's top to the OS once it exceeds this
MMAP_THRESHOLD_BYTES = 128 * 1024
EXECUTOR_MMAP_THRESHOLD_BYTES = 1 << 20
_pinned_threshold_bytes: int | None = None


def pin_malloc_threshold(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold (idempotent); False where libc has no mallopt.

    By default glibc raises the threshold to the size of the largest freed
    mmapped block (up to 32 MiB). After one stage is unloaded, the next load's
    large buffers then come from the heap and stay resident when freed: the
    same 4.5 MiB conv stage peaked at 26.5 instead of 22.5 MiB on every load
    after the first, in one process. Pinned, every large buffer is mmapped and
    returned on free, so a recycled profiling worker measures every stage as a
    fresh process would.

    The profiler's worker pins it at 128 KiB. Executors pin it at
    EXECUTOR_MMAP_THRESHOLD_BYTES instead: at 128 KiB every buffer over 128 KiB
    is mapped and paged in again on every run, which made a stage chain 1.5x
    slower than the whole model on GoogleNet and 1.3x on TinyYOLO (CPU time).
    Left dynamic, the threshold climbs and each worker thread's heap arena keeps
    the large activations of the stages it ran: on the demo workload the
    process then measured 1.6-1.9x the memory its ledger reserved (24-26 MiB
    anonymous at a 15 MiB reservation), against 0.95-1.1x pinned at 1 MiB,
    which cost 1-12% of a stage chain's CPU time (TinyYOLO, GoogLeNet,
    EmotionNet at scale 0.5, measured on a busy machine). Measured again at
    scale 1 on a quiet host (2026-11-28, each stage on a fresh session, run
    once, no trim), EXEC CPU per chain against the freed heap the process then
    keeps at its peak: at 1 MiB TinyYOLO 42.7 ms, EmotionNet 76.6, FaceNet 22.2,
    AgeNet 12.1, keeping 3.8 MiB; at 8 MiB 37.3, 71.6, 21.7, 11.2, keeping 21.3
    MiB; at 16-64 MiB 33.9-34.0, 70.1-70.6, 22.1, 11.3-11.5, keeping 21.7-24.5
    MiB. So up to a fifth of a conv network's EXEC time is faulting in fresh
    activations, and saving it takes some 20 MiB per worker outside the ledger.
    """
    global _pinned_threshold_bytes
    if _pinned_threshold_bytes == threshold_bytes:
        return True
    if LIBC is None or not hasattr(LIBC, "mallopt"):
        return False
    if LIBC.mallopt(_M_MMAP_THRESHOLD, threshold_bytes) != 1:
        return False
    _pinned_threshold_bytes = threshold_bytes
    return True


def keep_freed_heap(trim_threshold_bytes: int) -> bool:
    """Let free() keep up to trim_threshold_bytes at the heap's top (glibc
    M_TRIM_THRESHOLD) instead of returning it at once; False where libc has no
    mallopt. With the mmap threshold pinned the trim threshold stays at glibc's
    128 KiB, so buffers of a few hundred KiB freed and allocated again (an HTTP
    body read in 256 KiB pieces) fault their pages in afresh every time: a 600 KB
    POST took 2.4-3.4 ms instead of 1.5 ms in a bare aiohttp server (p50 of four
    and two runs)."""
    if LIBC is None or not hasattr(LIBC, "mallopt"):
        return False
    return bool(LIBC.mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes) == 1)


def release_memory(collect: bool = True) -> None:
    """Collect garbage and return freed heap pages to the OS (glibc malloc_trim).

    collect=False skips the full gc pass (~40 ms in a process that imported
    onnx): enough when the caller knows the freed objects had no reference
    cycles, as with a session dropped from a dict by its only owner.
    """
    if collect:
        gc.collect()
    if LIBC is not None and hasattr(LIBC, "malloc_trim"):
        LIBC.malloc_trim(0)
