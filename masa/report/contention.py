"""How much longer a task runs beside another: CPU contention read from a run's trace.

This module owns one diagnostic of the simulator's CPU model (docs/bench-contention.md).
The simulator times an EXEC as its stage's time alone, stretched by one multiplier
for the part of its work done while another worker runs a task
(masa.runtime.virtual.DeviceModel.shared_cpu_multiplier). A run's Chrome trace
(masa.report.report.chrome_trace) says, for every EXEC, how long it took and which
share of that time another worker spent on an EXEC or a LOAD. Given each stage's time
alone, the multiplier follows from a regression that the simulator's own model makes
exact: a task whose work W runs alone for t_alone and beside another for t_beside at
1/m of its speed has W = t_alone + t_beside / m, so with d = t_alone + t_beside and
s = t_beside / d,

    1 - W / d = s * (1 - 1 / m),

linear in the shares. The times alone may come from another run (Bulk's, whose
EXECs run alone) in which every EXEC ran a times faster; then W is a times the
reference and

    1 - W_ref / d = (1 - 1 / a) + s * (1 - 1 / m) / a.

Fitted with a share beside an EXEC and a share beside a LOAD, weighted by the
stage's time alone (long tasks count as long): the constant c0 gives a = 1 / (1 - c0)
and each share's coefficient c gives m = 1 / (1 - c / (1 - c0)).
LOADs are read the same way (`beside_shares(spans, kind="load")`): their time per
profiled time in each context (`time_ratio_by_context`), alone, mostly beside an EXEC,
mostly beside a LOAD, says whether a policy's LOADs cost what the simulator charges.
Where only a run's total LOAD time per network is known (the grid's records), the same
form summed over a network's LOADs, with the shares from the run simulated, fits the
LOADs' own scale alone and multipliers (`fit_load_multipliers`).
Pure: lists of numbers in, numbers out.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ALONE_SHARE = 0.05  # a task that ran beside another task for less than this ran alone
MIN_ALONE_RUNS = 5  # a stage's time alone is the median of at least this many tasks


@dataclass(frozen=True)
class TaskSpan:
    """One task of a trace: its stage, kind ("load" or "exec"), worker and times (us)."""

    network: str
    stage_id: str
    kind: str
    worker: int
    start_us: int
    duration_us: int

    @property
    def stage(self) -> tuple[str, str]:
        return self.network, self.stage_id

    @property
    def end_us(self) -> int:
        return self.start_us + self.duration_us


@dataclass(frozen=True)
class BesideShares:
    """A task and the shares of its time another worker spent on an EXEC, on a LOAD."""

    task: TaskSpan
    beside_exec: float
    beside_load: float


@dataclass(frozen=True)
class ContentionFit:
    """The multipliers beside an EXEC and beside a LOAD (1.0: no slowdown; None where
    no fitted task ran beside that kind) and of every task alike (`alone`: against the
    times alone the fit was given), the share of the fitted tasks' time spent beside
    each kind of task, and how many tasks it used (`execs`: EXECs, or LOADs when the
    shares were of LOADs)."""

    alone: float
    beside_exec: float | None
    beside_load: float | None
    share_beside_exec: float
    share_beside_load: float
    execs: int


def task_spans(trace: Mapping | Sequence) -> list[TaskSpan]:
    """The LOADs and EXECs of a Chrome trace (complete events named "KIND net/stage")."""
    events = trace.get("traceEvents", []) if isinstance(trace, Mapping) else trace
    spans = []
    for event in events:
        if event.get("ph") != "X" or event.get("cat") not in ("load", "exec"):
            continue
        network, _, stage_id = event["name"].split(" ", 1)[1].partition("/")
        spans.append(TaskSpan(network, stage_id, event["cat"], int(event["tid"]),
                              int(event["ts"]), int(event["dur"])))
    return sorted(spans, key=lambda span: (span.start_us, span.worker))


def beside_shares(spans: Sequence[TaskSpan], kind: str = "exec") -> list[BesideShares]:
    """Every task of `kind` ("exec" or "load") with the shares of its time the other
    workers spent on EXECs and LOADs (a worker runs one task at a time, so its tasks are
    sorted by their ends too)."""
    by_worker: dict[int, list[TaskSpan]] = {}
    for span in spans:
        by_worker.setdefault(span.worker, []).append(span)
    ends = {worker: [span.end_us for span in tasks] for worker, tasks in by_worker.items()}
    shares = []
    for span in spans:
        if span.kind != kind or span.duration_us <= 0:
            continue
        overlap = {"exec": 0, "load": 0}
        for worker, tasks in by_worker.items():
            if worker == span.worker:
                continue
            index = bisect.bisect_right(ends[worker], span.start_us)
            while index < len(tasks) and tasks[index].start_us < span.end_us:
                other = tasks[index]
                overlap[other.kind] += (min(span.end_us, other.end_us)
                                        - max(span.start_us, other.start_us))
                index += 1
        shares.append(BesideShares(span, overlap["exec"] / span.duration_us,
                                   overlap["load"] / span.duration_us))
    return shares


def alone_times_us(shares: Iterable[BesideShares]) -> dict[tuple[str, str], float]:
    """Each stage's EXEC time alone: the median over its EXECs that ran (almost) alone,
    for the stages with at least MIN_ALONE_RUNS of them."""
    alone: dict[tuple[str, str], list[int]] = {}
    for share in shares:
        if context_of(share) == "alone":
            alone.setdefault(share.task.stage, []).append(share.task.duration_us)
    return {stage: float(statistics.median(times)) for stage, times in alone.items()
            if len(times) >= MIN_ALONE_RUNS}


def fit_contention(shares: Iterable[BesideShares],
                   alone_us: Mapping[tuple[str, str], float]) -> ContentionFit | None:
    """The multipliers (alone, beside an EXEC, beside a LOAD) that explain the tasks'
    times given each stage's time alone (`alone_us`; tasks of other stages are left
    out), by weighted least squares on the module's linear form. A kind no task ran
    beside is left out of the fit (its multiplier None); None without tasks beside
    either kind."""
    rows = [(share.beside_exec, share.beside_load,
             1 - alone_us[share.task.stage] / share.task.duration_us,
             alone_us[share.task.stage])
            for share in shares if share.task.stage in alone_us]
    if not rows:
        return None
    table = np.array(rows, dtype=float)
    shares_x, stretch_y, weights = table[:, :2], table[:, 2], table[:, 3]
    beside = [i for i in range(2) if shares_x[:, i].sum() > 0]
    if not beside:
        return None
    root = np.sqrt(weights)
    design = np.column_stack([np.ones(len(rows)), shares_x[:, beside]])
    coefficients, *_ = np.linalg.lstsq(design * root[:, None], stretch_y * root, rcond=None)
    alone_c = min(float(coefficients[0]), 0.99)
    multipliers: list[float | None] = [None, None]
    for i, c in zip(beside, coefficients[1:], strict=True):
        multipliers[i] = 1 / (1 - min(float(c) / (1 - alone_c), 0.99))
    share_exec, share_load = (float(np.average(shares_x[:, i], weights=weights))
                              for i in range(2))
    return ContentionFit(1 / (1 - alone_c), *multipliers, share_exec, share_load, len(rows))


def context_of(share: BesideShares) -> str:
    """Where a task ran: "alone" (beside another task for under ALONE_SHARE of its
    time), else "beside_exec" or "beside_load", whichever took more of its time."""
    if share.beside_exec + share.beside_load < ALONE_SHARE:
        return "alone"
    return "beside_exec" if share.beside_exec >= share.beside_load else "beside_load"


def time_ratio_by_context(shares: Iterable[BesideShares],
                          profiled_us: Mapping[tuple[str, str], float]
                          ) -> dict[str, tuple[float, int]]:
    """Per context (`context_of`): the tasks' time over their stages' profiled time
    (sums, so long tasks count as long) and how many tasks; stages without a profiled
    time are left out."""
    sums: dict[str, list[float]] = {}
    for share in shares:
        profiled = profiled_us.get(share.task.stage, 0)
        if profiled <= 0:
            continue
        total = sums.setdefault(context_of(share), [0.0, 0.0, 0])
        total[0] += share.task.duration_us
        total[1] += profiled
        total[2] += 1
    return {context: (took / profiled, int(count))
            for context, (took, profiled, count) in sorted(sums.items())}


@dataclass(frozen=True)
class LoadShares:
    """A network's LOADs in a run: the shares of their time spent alone, beside a LOAD
    (while any other worker ran one) and beside EXECs only, and that time (us)."""

    alone: float
    beside_load: float
    beside_exec: float
    duration_us: float


def load_shares_by_network(shares: Iterable[BesideShares], skip_first: int = 0
                           ) -> dict[str, LoadShares]:
    """Per network, its LOADs' shares of time by what ran beside them, as the simulator
    charges them (beside a LOAD whenever one runs beside, so with more than two workers
    the overlaps are capped at the task's time), past each stage's first `skip_first`
    LOADs (those read their file from storage)."""
    seen: dict[tuple[str, str], int] = {}
    sums: dict[str, list[float]] = {}
    for share in sorted(shares, key=lambda share: share.task.start_us):
        seen[share.task.stage] = seen.get(share.task.stage, 0) + 1
        if seen[share.task.stage] <= skip_first:
            continue
        beside_load = min(1.0, share.beside_load)
        beside_exec = min(1.0 - beside_load, share.beside_exec)
        duration_us = share.task.duration_us
        total = sums.setdefault(share.task.network, [0.0, 0.0, 0.0, 0.0])
        total[0] += duration_us * (1 - beside_load - beside_exec)
        total[1] += duration_us * beside_load
        total[2] += duration_us * beside_exec
        total[3] += duration_us
    return {network: LoadShares(alone / took, beside_load / took, beside_exec / took, took)
            for network, (alone, beside_load, beside_exec, took) in sorted(sums.items())
            if took > 0}


def fit_load_multipliers(rows: Iterable[tuple[LoadShares, float, float]],
                         beside_load: float | None = None
                         ) -> tuple[float, float, float] | None:
    """The LOADs' scale alone and multipliers beside a LOAD and beside an EXEC that
    explain, for each row (a network's LOADs in one run: their shares, their time per
    unit of reference work r, a weight), r given the shares. A LOAD of work W that runs
    at 1/m of its speed for each share s of its time has W = d (s_A + s_LL / m_LL +
    s_LE / m_LE) / a over all its LOADs, so

        1 / r = s_A / a + s_LL / (a m_LL) + s_LE / (a m_LE),

    linear in the three reciprocals: weighted least squares. Where LOADs alone are
    few, the shares alone and beside a LOAD move together (a policy whose LOADs run
    beside each other) and only their sum is known: `beside_load` holds m_LL (measured
    elsewhere) and fits the other two. None when a coefficient comes out not positive
    (the shares do not tell the contexts apart)."""
    table = np.array([(shares.alone, shares.beside_load, shares.beside_exec, 1 / ratio, weight)
                      for shares, ratio, weight in rows], dtype=float)
    if len(table) < 3:
        return None
    root = np.sqrt(table[:, 4])
    if beside_load is None:
        design = table[:, :3]
    else:
        design = np.column_stack([table[:, 0] + table[:, 1] / beside_load, table[:, 2]])
    coefficients, *_ = np.linalg.lstsq(design * root[:, None], table[:, 3] * root, rcond=None)
    if min(coefficients) <= 0:
        return None
    alone_c, exec_c = float(coefficients[0]), float(coefficients[-1])
    load_multiplier = (alone_c / float(coefficients[1]) if beside_load is None
                       else beside_load)
    return 1 / alone_c, load_multiplier, alone_c / exec_c
