"""The profiling worker process: what it measures, one stage at a time, for model_prep.profile.

model_prep.profile (the supervisor) starts `python -c WORKER_COMMAND` and sends
it one `StageJob` per stage over a socket; this module is everything that runs
on the worker's side. It imports only NumPy, ONNX Runtime (through
model_prep.session), masa.common.procmem and the manifest's records, so the
runtime base it reports is what an executor's worker pays, not what the
preparator (onnx) pays.

Per stage (docs/profiling.md), with the session option of the job
(`StageJob.prepack`): the load peak of `load_stage(path, ...)`,
observed by the supervisor's sampler and by the kernel's VmHWM; the load time
and resident size from one more load nobody observes (the busy sampler slows
loads); the exec peak of the first run of a fresh session; the median of
`runs` timed runs after warm-up, on the tensors the stage received in prepare's
sample run (model_prep.sample_run). Every memory figure is an increase over the
RSS just before the operation, measured after `release_memory()`. Weight
pages a run maps in from the stage's data file (file-backed RSS growth over
the first run) count as resident from the load on, not as exec memory: the
LOAD reads them in and they stay until the stage is unloaded.
"""

from __future__ import annotations

import multiprocessing.connection
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from masa.common.errors import one_line
from masa.common.procmem import peak_rss_bytes, reset_peak, resident_split, rss_bytes
from model_prep.manifest import RuntimeBase, TensorSpec
from model_prep.session import (
    WARMUP_INPUT_SHAPE,
    create_session,
    load_stage,
    pin_malloc_threshold,
    read_fresh,
    release_memory,
)

WORKER_COMMAND = ("import sys; from model_prep.profile_worker import worker_entry; "
                  "worker_entry(sys.argv[1:])")


@dataclass(frozen=True)
class StageJob:
    """What the worker needs to profile one stage (picklable, no manifest objects)."""

    stage_id: str
    path: str
    inputs: tuple[TensorSpec, ...]
    runs: int
    warmup_runs: int
    seed: tuple[int, int]  # (user seed, stage index): same inputs in either isolation mode
    sample_attempts: int
    gap_limit_us: float
    prepack: bool = True  # the session option measured (model_prep.session.load_stage)
    mapped_bytes: int = 0  # weight bytes in the stage's data file
    # The tensors the stage really receives (model_prep.sample_run: an .npz of its
    # inputs in order); None: seeded random tensors of the declared shapes.
    inputs_path: str | None = None


def worker_entry(argv: list[str]) -> None:
    """`python -c` entry point: argv is (socket fd, throwaway model path, kernel peak 0/1)."""
    # Ctrl-C is the supervisor's to handle: it closes or kills this worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = multiprocessing.connection.Connection(int(argv[0]))
    try:
        _worker_main(conn, argv[1], argv[2] == "1")
    except (EOFError, OSError):
        pass  # the supervisor is gone or closed the connection: nothing to report to
    finally:
        conn.close()


def _worker_main(conn: Any, throwaway_path: str, kernel_peak: bool) -> None:
    try:
        base, exact = _measure_runtime_base(throwaway_path, kernel_peak)
    except Exception as exc:  # reported to the supervisor, which raises ProfileError
        conn.send(("error", _one_line(exc)))
        return
    conn.send(("base", base, exact))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message[0] == "quit":
            return
        _, job, handshake = message
        try:
            measured = _measure_stage(job, conn if handshake else None, kernel_peak and exact)
        except Exception as exc:
            conn.send(("error", _one_line(exc)))
            continue
        conn.send(("result", measured, kernel_peak and exact))


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"


def _measure_runtime_base(throwaway_path: str, kernel_peak: bool) -> tuple[RuntimeBase, bool]:
    # Pinned before anything is measured, so the first session and every stage
    # see the same allocator behaviour (model_prep.session.pin_malloc_threshold).
    pin_malloc_threshold()
    release_memory()
    process_rss = rss_bytes()
    exact = reset_peak() if kernel_peak else False
    start_ns = time.perf_counter_ns()
    session = create_session(throwaway_path)
    first_session_time_us = (time.perf_counter_ns() - start_ns) // 1000
    # One run too: the first run initialises per-process kernel state that
    # would otherwise land in the first stage's exec figures.
    session.run(None, {"x": np.zeros(WARMUP_INPUT_SHAPE, dtype=np.float32)})
    del session
    release_memory()
    first_session = max(0, rss_bytes() - process_rss)
    return RuntimeBase(process_rss, first_session, int(first_session_time_us)), exact


def _random_inputs(inputs: Sequence[TensorSpec], seed: tuple[int, int]) -> dict[str, Any]:
    """Seeded random tensors of the stage's input shapes (dynamic dims -> 1)."""
    rng = np.random.default_rng(list(seed))
    feeds: dict[str, Any] = {}
    for spec in inputs:
        shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in spec.shape)
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            value = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        elif dtype.kind in "iu":
            # Small non-negative integers are valid indices and counts.
            value = rng.integers(0, 2, size=shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.random(shape) < 0.5
        else:
            raise ValueError(f"input {spec.name!r} has dtype {spec.dtype}, which the "
                             "profiler cannot generate")
        feeds[spec.name] = value
    return feeds


def _sample_inputs(job: StageJob) -> dict[str, Any]:
    """The stage's inputs from the sample run, by position (npz keys are arr_0...)."""
    assert job.inputs_path is not None
    with np.load(job.inputs_path, allow_pickle=False) as saved:
        arrays = [saved[f"arr_{index}"] for index in range(len(job.inputs))]
    return {spec.name: value for spec, value in zip(job.inputs, arrays, strict=True)}


def _measure_stage(job: StageJob, conn: Any | None, kernel_peak: bool) -> dict[str, Any]:
    # Cached as a run's first read caches them, whatever the page cache held
    # before (a store just written, a file partly evicted): model_prep.session.read_fresh.
    for path in (job.path, f"{job.path}.data"):
        read_fresh(path)
    stage = _StageMeasurement(job, conn, kernel_peak)
    load_time_us, load_peak, resident = stage.load()
    feeds = _sample_inputs(job) if job.inputs_path else _random_inputs(job.inputs, job.seed)
    exec_peak = stage.first_run(feeds)
    # The run's file-backed growth: weight pages of the data file it mapped in.
    mapped = stage.mapped_in_bytes
    exec_time_us = stage.timed_runs(feeds)
    feeds.clear()  # drop the inputs before the final trim
    release_memory()
    return {
        "load_time_us": int(load_time_us),
        "exec_time_us": exec_time_us,
        "load_peak_bytes": load_peak,
        "resident_bytes": resident + mapped,
        "exec_peak_bytes": exec_peak,  # raw: model_prep.profile takes `mapped` out
        "mapped_bytes": mapped,
        "kernel_peak": kernel_peak,
    }



class _StageMeasurement:
    """The measurements of one stage; `conn` (the supervisor's sampler) None: unsampled."""

    def __init__(self, job: StageJob, conn: Any | None, kernel_peak: bool) -> None:
        self.job = job
        self.conn = conn
        self.kernel_peak = kernel_peak
        # The only reference to the stage's live session, so that dropping it
        # here (reload, the end of the timed runs) really frees it.
        self.session: Any = None
        self.mapped_in_bytes = 0  # file-backed growth over the last first run

    def load(self) -> tuple[int, int, int]:
        """(load time us, load peak bytes, resident bytes); leaves a loaded session."""
        if self.conn is not None:
            # The observed loads give both peak figures of the same operations. The
            # sampler busy-polls from another core and slowed loads by 15-20% in
            # tests, so the load time and resident size come from one more load
            # that nobody watches.
            load_peak = self._observed("load", self._new_session)
            load_time_us, load_base, _ = self._timed_load()
        else:
            load_time_us, load_base, load_peak = self._timed_load()
        release_memory()
        return load_time_us, load_peak, max(0, rss_bytes() - load_base)

    def first_run(self, feeds: dict[str, Any]) -> int:
        """The exec peak: that of the first run of a fresh session.

        The scheduler runs each loaded stage once, and kernels allocate some
        memory lazily on their first run only. So a repeated observation needs
        a fresh session (`_reload`).
        """
        if self.conn is not None:
            return self._observed("exec", lambda: self._run_once(feeds), self._reload)
        release_memory()
        exec_base = rss_bytes()
        if self.kernel_peak:
            reset_peak()
        outputs = self._run_once(feeds)
        exec_peak = self._peak_increase(exec_base)
        del outputs
        return exec_peak

    def _run_once(self, feeds: dict[str, Any]) -> Any:
        file_before = resident_split().file_backed_bytes
        outputs = self.session.run(None, feeds)
        self.mapped_in_bytes = max(0, resident_split().file_backed_bytes - file_before)
        return outputs

    def _new_session(self) -> Any:
        return load_stage(self.job.path, self.job.prepack, self.job.mapped_bytes)

    def timed_runs(self, feeds: dict[str, Any]) -> int:
        """Median run time in us after the warm-up runs; drops the session."""
        session, self.session = self.session, None
        for _ in range(self.job.warmup_runs - 1):
            session.run(None, feeds)
        durations_ns = []
        for _ in range(self.job.runs):
            start_ns = time.perf_counter_ns()
            outputs = session.run(None, feeds)
            durations_ns.append(time.perf_counter_ns() - start_ns)
            del outputs
        del session
        return int(statistics.median(durations_ns) // 1000)

    def _peak_increase(self, base: int) -> int:
        return max(0, peak_rss_bytes() - base) if self.kernel_peak else 0

    def _observed(self, phase: str, operation: Callable[[], Any],
                  prepare_again: Callable[[], None] | None = None) -> int:
        """Run `operation` under the supervisor's sampler, again (after
        `prepare_again`) while it asks; the largest VmHWM increase seen."""
        conn = self.conn
        assert conn is not None
        largest = 0
        while True:
            release_memory()
            base = rss_bytes()
            conn.send(("begin", phase, base))
            conn.recv()
            if self.kernel_peak:
                reset_peak()
            result = operation()
            increase = self._peak_increase(base)
            largest = max(largest, increase)
            conn.send(("end", phase, base, increase))
            del result
            if conn.recv() != "again":
                return largest
            if prepare_again is not None:
                prepare_again()

    def _timed_load(self) -> tuple[int, int, int]:
        """(duration us, base RSS, VmHWM increase) of one load, kept as the session."""
        release_memory()
        base = rss_bytes()
        if self.kernel_peak:
            reset_peak()
        start_ns = time.perf_counter_ns()
        self.session = self._new_session()
        duration_us = (time.perf_counter_ns() - start_ns) // 1000
        return duration_us, base, self._peak_increase(base)

    def _reload(self) -> None:
        self.session = None
        release_memory()
        self.session = self._new_session()
