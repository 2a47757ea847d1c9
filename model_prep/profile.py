"""The per-stage profiler: load time, exec time and memory of every stage, measured exactly.

This module owns how a stage's cost is measured (docs/profiling.md explains the
method and its caveats). `profile_network` profiles the stages of a prepared
network one at a time in a fresh worker process and returns one
`StageProfile` per stage plus the `RuntimeBase` the worker paid once.

Per stage, in the worker (model_prep.profile_worker, which runs there):
- load peak: `create_session(path)` (file read + session creation) observed
  by both peak methods below; the session is dropped;
- load time and resident size: one more load that nobody observes (the busy
  sampler slows loads), then the RSS increase that stays after gc + trim;
- exec peak: the first run on a freshly loaded session, which is what the
  scheduler runs (load, one exec, unload); exec time: median of `runs` further
  runs after that warm-up, on the tensors the stage really receives: those
  of one run of the whole stage chain (model_prep.sample_run).
Every memory figure is an increase over the RSS just before the operation,
measured after `release_memory()` so freed-but-cached heap is not counted.

Peaks are measured two ways at once. The kernel's exact VmHWM, reset through
/proc/self/clear_refs before each operation (masa.common.procmem). And a sampling
thread reading the worker's /proc/PID/statm as fast as it can; that thread
lives in the *supervising* process because ONNX Runtime holds the GIL during
session creation, so a sampling thread inside the worker would be frozen for
exactly the load it should observe. The supervisor and worker handshake around
each observed operation so the sampler is already running when it starts, and
the supervisor asks for the operation again (keeping the largest figures)
while the sampler was descheduled for longer than a limit. Where clear_refs is
not permitted the VmHWM figures fall back to the sampled peak, and the log
says so.

Isolation: `isolation="recycle"` (default) profiles every stage in one worker,
dropping the session and trimming the heap between stages; `"process"` starts
one worker per stage. Both pay the runtime base (imports + a throwaway first
session) before measuring anything, and both run with glibc's mmap threshold
pinned (model_prep.session.pin_malloc_threshold), without which a recycled worker's
history changed load peaks by up to 1x the weights; docs/profiling.md compares
the two.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from masa.common.errors import RunFailed, UserError
from model_prep.manifest import NetworkManifest, RuntimeBase, SessionAlternative, StageProfile
from model_prep.profile_worker import WORKER_COMMAND, StageJob
from model_prep.session import WARMUP_MODEL_PATH

log = logging.getLogger(__name__)

ISOLATION_MODES = ("recycle", "process")
DEFAULT_RUNS = 5
# Timestamps kept for the median sampling interval; the ring lives in the
# supervisor, so its size never shows in the worker's RSS.
_SAMPLE_RING = 1 << 16

ProgressCallback = Callable[[int, int, str], None]  # (stages done, total, stage id)


class ProfileError(RunFailed):
    """A stage could not be profiled (ONNX Runtime failed on it, the worker died): one
    line, exit 1. Bad arguments to `profile_network` are plain UserErrors (exit 2)."""


# ------------------------------------------------------------------ supervisor


@dataclass(frozen=True)
class SampledPeak:
    """What the statm sampler saw during one phase."""

    peak_bytes: int  # largest RSS sampled
    median_interval_us: float  # over the last (up to 65536) samples
    max_gap_us: float  # longest time between two samples: longer gaps can miss a spike
    samples: int


class StatmSampler:
    """A thread that polls /proc/PID/statm of another process as fast as it can.

    `begin()` starts a sampling phase and returns once the first sample is
    taken (so the operation the caller starts next is fully observed);
    `end()` stops it after one more sample and returns what was seen (so what
    the process did before the call is observed). Between phases the thread
    blocks on an event and uses no CPU.
    """

    def __init__(self, pid: int) -> None:
        self._fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
        self._page_bytes = os.sysconf("SC_PAGE_SIZE")
        self._go = threading.Event()
        self._started = threading.Event()
        self._done = threading.Event()
        self._active = False
        self._closing = False
        self._result = SampledPeak(0, 0.0, 0.0, 0)
        self._thread = threading.Thread(target=self._loop, name=f"statm-{pid}", daemon=True)
        self._thread.start()

    def begin(self) -> None:
        self._active = True
        self._started.clear()
        self._done.clear()
        self._go.set()
        self._started.wait()

    def end(self) -> SampledPeak:
        self._active = False
        self._done.wait()
        return self._result

    def close(self) -> None:
        self._closing = True
        self._active = False
        self._go.set()
        self._thread.join()
        os.close(self._fd)

    def _loop(self) -> None:
        fd, pread, clock = self._fd, os.pread, time.perf_counter_ns
        ring = [0] * _SAMPLE_RING
        mask = _SAMPLE_RING - 1
        while True:
            self._go.wait()
            self._go.clear()
            if self._closing:
                return
            peak_pages = 0
            count = 0
            max_gap_ns = 0
            last_ns = clock()
            try:
                # The hot loop: one pread, one split, two compares. Anything more
                # lengthens the interval and can miss a short allocation spike.
                while True:
                    # Read before the sample, so that the last sample is taken after
                    # end() was called: whatever the other process did before the
                    # caller's end() is seen even if this thread was descheduled.
                    active = self._active
                    pages = int(pread(fd, 96, 0).split()[1])
                    now_ns = clock()
                    ring[count & mask] = now_ns
                    if now_ns - last_ns > max_gap_ns:
                        max_gap_ns = now_ns - last_ns
                    last_ns = now_ns
                    count += 1
                    if pages > peak_pages:
                        peak_pages = pages
                    if count == 1:
                        max_gap_ns = 0
                        self._started.set()
                    if not active:
                        break
            except (OSError, IndexError, ValueError):
                self._started.set()  # the worker exited; end() reports what was seen
            kept = min(count, _SAMPLE_RING)
            interval_us = 0.0
            if kept >= 2:
                first = count - kept
                stamps = [ring[(first + i) & mask] for i in range(kept)]
                interval_us = statistics.median(
                    b - a for a, b in zip(stamps, stamps[1:], strict=False)) / 1000.0
            self._result = SampledPeak(peak_pages * self._page_bytes, interval_us,
                                       max_gap_ns / 1000.0, count)
            self._done.set()


class _Worker:
    """One worker process and the supervisor's side of the handshake protocol."""

    def __init__(self, throwaway_path: str, kernel_peak: bool, sample: bool) -> None:
        # A plain `python -c` child rather than multiprocessing's spawn: spawn
        # re-imports the caller's __main__ (pytest, a benchmark with onnx...),
        # so the worker's RSS, the runtime base, would depend on the caller.
        parent_sock, child_sock = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", WORKER_COMMAND, str(child_sock.fileno()),
                 throwaway_path, "1" if kernel_peak else "0"],
                pass_fds=[child_sock.fileno()], env=env, stdin=subprocess.DEVNULL,
            )
        finally:
            child_sock.close()
        self._conn = multiprocessing.connection.Connection(parent_sock.detach())
        self.sampler = StatmSampler(self.process.pid) if sample else None
        try:
            message = self._receive("starting the profiling worker")
        except ProfileError:
            self.close()
            raise
        if message[0] == "error":
            self.close()
            raise ProfileError(f"profiling worker failed to start: {message[1]}")
        self.runtime_base: RuntimeBase = message[1]
        self.kernel_peak_exact: bool = message[2]
        if not self.kernel_peak_exact and self.sampler is None:
            # No clear_refs here: the sampler is the only peak left, so it runs.
            self.sampler = StatmSampler(self.process.pid)
        self.observed_phases = 0  # sampled loads and execs
        self.gapped_phases = 0  # ... where every attempt had a gap over the limit

    def profile(self, job: StageJob) -> tuple[StageProfile, bool]:
        """Profile one stage; returns its profile and whether VmHWM was exact."""
        self._conn.send(("stage", job, self.sampler is not None))
        phases: dict[str, _PhaseRecord] = {}
        while True:
            message = self._receive(f"stage {job.stage_id!r} ({job.path})")
            kind = message[0]
            if kind == "begin":
                assert self.sampler is not None
                self.sampler.begin()
                self._conn.send("go")
            elif kind == "end":
                assert self.sampler is not None
                _, phase, base_rss, exact_increase = message
                record = phases.setdefault(phase, _PhaseRecord())
                seen = self.sampler.end()
                record.add(seen, base_rss, exact_increase)
                # A long gap means the sampler thread was descheduled (other
                # processes on the machine) and may have missed the peak:
                # observe the operation again and keep the largest figures.
                again = seen.max_gap_us > job.gap_limit_us and \
                    record.attempts < job.sample_attempts
                self._conn.send("again" if again else "done")
            elif kind == "error":
                raise ProfileError(f"{job.path}: profiling stage {job.stage_id!r} failed: "
                                   f"{message[1]}")
            elif kind == "result":
                for phase, record in phases.items():
                    self.observed_phases += 1
                    if record.min_gap_us > job.gap_limit_us:
                        self.gapped_phases += 1
                        log.debug("stage %s %s: the sampler was descheduled for up to "
                                  "%.1f ms in every one of %d attempts", job.stage_id, phase,
                                  record.min_gap_us / 1000, record.attempts)
                return _build_profile(message[1], phases, job), message[2]

    def _receive(self, doing: str) -> Any:
        # A dead worker (the OOM killer's SIGKILL, a crash in ORT) closes its
        # end of the socket: recv ends with EOFError instead of hanging.
        try:
            return self._conn.recv()
        except (EOFError, ConnectionResetError):
            pass
        code = self.process.wait()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
        hint = " (out of memory?)" if code == -9 else ""
        raise ProfileError(f"profiling worker {how}{hint} while {doing}")

    def close(self, kill: bool = False) -> None:
        """Stop the worker: politely between stages, or (kill) mid-stage after an error."""
        if self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                try:
                    self._conn.send(("quit",))
                except OSError:
                    pass
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.sampler is not None:
            self.sampler.close()
        self._conn.close()


class _PhaseRecord:
    """The sampled attempts at one phase (load or exec) of one stage."""

    def __init__(self) -> None:
        self.attempts = 0
        self.sampled_increase_bytes = 0
        self.exact_increase_bytes = 0
        self.intervals_us: list[float] = []
        self.min_gap_us = float("inf")

    def add(self, seen: SampledPeak, base_rss: int, exact_increase: int) -> None:
        self.attempts += 1
        self.sampled_increase_bytes = max(self.sampled_increase_bytes,
                                          seen.peak_bytes - base_rss)
        self.exact_increase_bytes = max(self.exact_increase_bytes, exact_increase)
        if seen.samples > 1:
            self.intervals_us.append(seen.median_interval_us)
        self.min_gap_us = min(self.min_gap_us, seen.max_gap_us)


def _build_profile(
    measured: dict[str, Any], phases: dict[str, _PhaseRecord], job: StageJob
) -> StageProfile:
    exact = measured["kernel_peak"]
    figures = {}
    for phase in ("load", "exec"):
        record = phases.get(phase)
        if record is None:  # sampling off: only the exact figure exists
            figures[phase] = (measured[f"{phase}_peak_bytes"],) * 2
        else:
            sampled = max(0, record.sampled_increase_bytes)
            # Without clear_refs the "exact" figure is the sampled one (fallback).
            figures[phase] = (record.exact_increase_bytes if exact else sampled, sampled)
    intervals = [i for record in phases.values() for i in record.intervals_us]
    # The peak comes from the observed loads, the resident size from another
    # (timed) load: they can differ by a page or two, but a load's peak holds at
    # least what it leaves resident (a 5 KB stage measured 12 KiB peak, 16 KiB kept).
    # Resident includes the weight pages the first run mapped in; the LOAD read
    # them into the page cache, where RSS does not see them until a run maps them.
    resident, mapped = measured["resident_bytes"], measured["mapped_bytes"]
    load_peak, sampled_load_peak = (max(figure, resident) for figure in figures["load"])
    exec_peak, sampled_exec_peak = (max(0, figure - mapped) for figure in figures["exec"])
    return StageProfile(
        load_time_us=measured["load_time_us"],
        exec_time_us=measured["exec_time_us"],
        exec_runs=job.runs,
        load_peak_bytes=load_peak,
        resident_bytes=resident,
        exec_peak_bytes=exec_peak,
        sampled_load_peak_bytes=sampled_load_peak,
        sampled_exec_peak_bytes=sampled_exec_peak,
        sampling_interval_us=round(statistics.median(intervals), 3) if intervals else 0.0,
        mapped_bytes=measured["mapped_bytes"],
    )


# Prepacking (and graph level ALL) makes a private copy of a stage's weights at
# load time. A stage is loaded, run once and unloaded per job, so the copy must
# pay for itself within that one run: it is kept only where the load plus one
# run is this much faster with it than with the weights left mapped.
PREPACK_MIN_GAIN = 0.10


def choose_session(mapped: StageProfile, prepacked: StageProfile) -> tuple[StageProfile, bool]:
    """The profile of the session option a stage should use, and whether it prepacks.

    `mapped`: measured without prepacking (weights stay mapped); `prepacked`:
    with it. The chosen profile keeps the other's figures as its `alternative`.
    """
    mapped_job_us = mapped.load_time_us + mapped.exec_time_us
    prepacked_job_us = prepacked.load_time_us + prepacked.exec_time_us
    if prepacked_job_us < mapped_job_us * (1 - PREPACK_MIN_GAIN):
        return replace(prepacked, alternative=_alternative(mapped, prepack=False)), True
    return replace(mapped, alternative=_alternative(prepacked, prepack=True)), False


def _alternative(profile: StageProfile, prepack: bool) -> SessionAlternative:
    return SessionAlternative(
        prepack=prepack, load_time_us=profile.load_time_us, exec_time_us=profile.exec_time_us,
        load_peak_bytes=profile.load_peak_bytes, resident_bytes=profile.resident_bytes,
        exec_peak_bytes=profile.exec_peak_bytes)


def profile_network(
    manifest: NetworkManifest,
    runs: int = DEFAULT_RUNS,
    *,
    warmup_runs: int = 1,
    isolation: str = "recycle",
    seed: int = 0,
    sample: bool = True,
    sample_attempts: int = 3,
    gap_limit_us: float = 1000.0,
    kernel_peak: bool = True,
    stage_ids: Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
    stage_inputs: Mapping[str, Path] | None = None,
    sample_feeds: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, StageProfile], RuntimeBase]:
    """Profile every stage (or `stage_ids`) of a prepared network, one at a time.

    runs: timed runs per stage (exec time is their median), after `warmup_runs`
    untimed runs (at least 1: the first run is the one whose peak is measured).
    isolation: "recycle" (one worker, cleaned between stages) or "process"
    (a fresh worker process per stage). sample: also run the statm sampler;
    an observed operation is repeated (up to `sample_attempts` times in all)
    while the sampler saw a gap longer than `gap_limit_us` between samples,
    and the largest figures are kept.
    kernel_peak: use VmHWM via clear_refs (False forces the sampled fallback).
    stage_inputs: {stage id: .npz of the tensors it received in the sample run}
    (model_prep.sample_run); None runs the stages once here on `sample_feeds`
    (default: a seeded random input of the shapes the manifest's sample had),
    so every stage is measured on the tensors it really receives either way.
    Returns ({stage id: profile}, runtime base of the worker; the median over
    workers with isolation="process").
    """
    _check_arguments(runs, warmup_runs, isolation, sample_attempts, kernel_peak, sample)
    with tempfile.TemporaryDirectory(prefix="masa-sample-") as temp_dir:
        if stage_inputs is None:
            stage_inputs = _run_sample(manifest, seed, Path(temp_dir), sample_feeds)
        jobs = _stage_jobs(manifest, stage_ids, runs, warmup_runs, seed, sample_attempts,
                           gap_limit_us, stage_inputs)
        throwaway_path = str(WARMUP_MODEL_PATH)
        tally = _profile_jobs(jobs, throwaway_path, isolation, kernel_peak, sample, progress)
    if not tally.bases:  # nothing to profile: still report what a worker costs
        worker = _Worker(throwaway_path, kernel_peak, False)
        tally.bases.append(worker.runtime_base)
        worker.close()
    if tally.gapped_phases:
        # Not a failure: VmHWM is the figure that counts. It says how far the
        # sampled figures (the paper's method) can be trusted on this machine.
        log.info("statm sampler: in %d of %d observed loads/execs every attempt had a gap "
                 "over %.1f ms between samples (busy machine); sampled peaks there may be low",
                 tally.gapped_phases, tally.observed_phases, gap_limit_us / 1000)
    return tally.profiles, _median_base(tally.bases)


def _run_sample(manifest: NetworkManifest, seed: int, save_dir: Path,
                feeds: Mapping[str, np.ndarray] | None) -> dict[str, Path]:
    """Each stage's real inputs, from one run of the chain (ProfileError if it fails)."""
    from model_prep.sample_run import recorded_sample_feeds, run_sample  # onnx: offline only

    if feeds is None:
        feeds = recorded_sample_feeds(manifest, seed)
    try:
        return run_sample(manifest, feeds, save_dir).stage_inputs
    except RunFailed as exc:
        raise ProfileError(f"cannot run the stages on a sample input to profile them: "
                           f"{exc}") from None


def _check_arguments(runs: int, warmup_runs: int, isolation: str, sample_attempts: int,
                     kernel_peak: bool, sample: bool) -> None:
    if runs < 1:
        raise UserError(f"profile: --runs expected a positive integer, got {runs}")
    if warmup_runs < 1:
        raise UserError(f"profile: warm-up runs expected a positive integer, got {warmup_runs}")
    if isolation not in ISOLATION_MODES:
        raise UserError(f"profile: isolation expected one of {', '.join(ISOLATION_MODES)}, "
                        f"got {isolation!r}")
    if sample_attempts < 1:
        raise UserError(f"profile: sample attempts expected a positive integer, "
                        f"got {sample_attempts}")
    if not kernel_peak and not sample:
        raise UserError("profile: with the kernel peak off, the sampler must be on")


def _stage_jobs(manifest: NetworkManifest, stage_ids: Sequence[str] | None, runs: int,
                warmup_runs: int, seed: int, sample_attempts: int, gap_limit_us: float,
                stage_inputs: Mapping[str, Path]) -> list[StageJob]:
    """One job per selected stage, in manifest order; UserError for unknown or missing ones."""
    stages = list(manifest.stages)
    if stage_ids is not None:
        known = {stage.stage_id for stage in stages}
        unknown = [s for s in stage_ids if s not in known]
        if unknown:
            raise UserError(f"profile: unknown stage id(s) {', '.join(map(repr, unknown))} "
                            f"in network {manifest.name!r}")
        wanted = set(stage_ids)
        stages = [stage for stage in stages if stage.stage_id in wanted]
    selected = {stage.stage_id for stage in stages}
    jobs = []
    for index, stage in enumerate(manifest.stages):
        if stage.stage_id in selected:
            path = manifest.stage_path(stage).resolve()
            if not path.is_file():
                raise UserError(f"{path}: stage file of {manifest.name}/{stage.stage_id} "
                                "does not exist")
            # A stage with mapped weights is measured without prepacking first
            # (and with it too: `_profile_jobs`); any other with ORT's defaults.
            jobs.append(StageJob(stage.stage_id, str(path), stage.inputs, runs, warmup_runs,
                                 (seed, index), sample_attempts, gap_limit_us,
                                 prepack=stage.mapped_bytes == 0,
                                 mapped_bytes=stage.mapped_bytes,
                                 inputs_path=str(stage_inputs[stage.stage_id])))
    return jobs


@dataclass
class _Tally:
    """What the workers of one `profile_network` call measured and saw."""

    profiles: dict[str, StageProfile] = field(default_factory=dict)
    bases: list[RuntimeBase] = field(default_factory=list)
    observed_phases: int = 0
    gapped_phases: int = 0
    warned: bool = False

    def retire(self, worker: _Worker) -> None:
        """Count what a worker saw, and stop it politely (between stages)."""
        self.observed_phases += worker.observed_phases
        self.gapped_phases += worker.gapped_phases
        worker.close()


def _profile_jobs(jobs: list[StageJob], throwaway_path: str, isolation: str,
                  kernel_peak: bool, sample: bool, progress: ProgressCallback | None
                  ) -> _Tally:
    tally = _Tally()
    worker: _Worker | None = None
    try:
        for done, job in enumerate(jobs):
            if worker is None:
                worker = _Worker(throwaway_path, kernel_peak, sample)
                tally.bases.append(worker.runtime_base)
            profile, exact = worker.profile(job)
            if job.mapped_bytes:
                prepacked, _ = worker.profile(replace(job, prepack=True))
                profile, _ = choose_session(profile, prepacked)
            if kernel_peak and not exact and not tally.warned:
                log.warning("/proc/self/clear_refs is not permitted here: peak figures "
                            "fall back to the sampled peak (statm polling), which can "
                            "miss short spikes")
                tally.warned = True
            tally.profiles[job.stage_id] = profile
            log.debug("stage %s: %s", job.stage_id, profile)
            if isolation == "process":
                tally.retire(worker)
                worker = None
            if progress is not None:
                progress(done + 1, len(jobs), job.stage_id)
    except BaseException:
        if worker is not None:  # possibly mid-stage: do not wait for it
            worker.close(kill=True)
            worker = None
        raise
    finally:
        if worker is not None:
            tally.retire(worker)
    return tally


def _median_base(bases: list[RuntimeBase]) -> RuntimeBase:
    return RuntimeBase(
        process_rss_bytes=int(statistics.median(b.process_rss_bytes for b in bases)),
        first_session_bytes=int(statistics.median(b.first_session_bytes for b in bases)),
        first_session_time_us=int(statistics.median(b.first_session_time_us for b in bases)),
    )


