"""What a solve is asked for (SolveOptions) and what it answers (SolveResult).

Owns the solver's options, their allowed values and their validation, and
the result record every solve returns. The result's status (OPTIMAL,
FEASIBLE, INFEASIBLE, UNKNOWN) is data, never an exception. Times in a
result are in the instance's time unit.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from masa.sched.taskgraph import ScheduledTask

FORMULATIONS = ("cumulative", "paper")
OBJECTIVES = ("makespan", "response")
SEARCHES = ("auto", "set_times", "default")
DIRECTIONS = ("auto", "forward", "backward")


@dataclass(frozen=True)
class SolveOptions:
    # Both limits are totals, shared by every CP-SAT call of one solve (segments
    # of a decomposition, probes). The deterministic time is CP-SAT's count of
    # work units (not seconds: one unit took 3-6 s of one core on the 2-core
    # development machine); it does not depend on the machine's load, so with
    # one search worker and a fixed seed a solve bounded by it alone is
    # reproducible. Unlimited by default.
    time_limit_s: float = 10.0
    max_deterministic_time: float = math.inf
    search_workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    seed: int = 0
    formulation: str = "cumulative"  # one of FORMULATIONS
    objective: str = "makespan"  # one of OBJECTIVES; "response" = sum of job response times
    symmetry_breaking: bool = True  # order identical networks (and workers, paper form.)
    redundant: bool = True  # energy and release-window bounds, tightened domains
    decompose: bool = True  # split by release time when earlier jobs finish in time
    # Also hint with the best of several quick list schedules (solver.list_schedule)
    # when it beats the given hint: a better start and upper bound on tight instances.
    list_hints: bool = True
    # "set_times": the model carries a decision strategy (starts, earliest
    # first; execs first on ties) and CP-SAT's full subsolvers are limited to
    # default_lp and fixed. On 2 workers CP-SAT runs one of them, default_lp,
    # whose integer branching then follows the strategy, beside its
    # first-solution and interleaved neighbourhood searches (CP-SAT's log).
    # On tight instances this completes proofs the default portfolio does
    # not (48 tasks, forward: proven in 30-60 s where the default was not at
    # 60 s). Forward, it found worse schedules than the default portfolio
    # above solver.search.SET_TIMES_MAX_TASKS tasks (80 tasks: 324 against
    # 292 in 60 s); backward it was as good or better at 80-168 tasks, within
    # 1% at 240. "default": CP-SAT's own portfolio. "auto": set_times when
    # searching backwards, and forwards up to SET_TIMES_MAX_TASKS tasks.
    search: str = "auto"  # one of SEARCHES
    # "backward": solve the instance's mirror (solver.instance.mirrored: time
    # running backwards) and read its schedule backwards, so the search
    # branches from the end of the schedule first. On memory-tight instances
    # the idle time sits at the end (the last loads' exec chains run with
    # the other worker idle), and set-times search from the end settles it
    # first (measured: 48 tasks proven in ~5 s instead of 22-42 s, 80 tasks
    # proven in 60 s where forward never was; benchmarks/bench_solver.py).
    # "auto": backward for the makespan objective on up to
    # solver.search.PROOF_MAX_TASKS tasks when the mirror exists (one common
    # release, single-until locks), forward otherwise.
    direction: str = "auto"  # one of DIRECTIONS
    # Makespan objective, up to PROOF_MAX_TASKS tasks: lower-bound probing
    # before minimising (solver.search).
    probe: bool = True


def validate_options(options: SolveOptions) -> None:
    """Raise ValueError naming the first option outside its allowed values."""
    for name, allowed in (("formulation", FORMULATIONS), ("objective", OBJECTIVES),
                          ("search", SEARCHES), ("direction", DIRECTIONS)):
        if getattr(options, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}")
    if options.direction == "backward" and options.objective != "makespan":
        raise ValueError("direction 'backward' keeps the makespan, not response times: "
                         "use it with the makespan objective")
    if options.time_limit_s <= 0 or options.max_deterministic_time <= 0:
        raise ValueError("time_limit_s and max_deterministic_time must be > 0")


@dataclass(frozen=True)
class SolveResult:
    """The outcome of one solve. Times are in the instance's time unit."""

    status: str  # OPTIMAL / FEASIBLE / INFEASIBLE / UNKNOWN
    objective: str
    formulation: str
    makespan_us: int | None  # of the best schedule found (None without one)
    response_sum_us: int | None  # sum over jobs of (last end - job release)
    objective_value: int | None  # makespan or response sum, whichever was minimised
    bound: int | None  # proven lower bound on the objective
    solve_time_s: float  # CP-SAT wall time, summed over segments
    schedule: tuple[ScheduledTask, ...] = ()
    segments: int = 1  # independent release-time segments solved
    hint_used: bool = False
    # CP-SAT's deterministic time (work units, see SolveOptions): comparable
    # across runs on a loaded machine, unlike solve_time_s.
    deterministic_time: float = 0.0
    # Objective of the hint the solve started from (the given one or a better
    # list schedule): the upper bound before search. None without a hint.
    hint_objective: int | None = None
    direction: str = "forward"  # the direction the (last) model was solved in
    probes: int = 0  # lower-bound probes run before (or instead of) minimising

    @property
    def proven(self) -> bool:
        return self.status == "OPTIMAL"

    @property
    def gap(self) -> float | None:
        """(best - bound) / best; 0.0 when proven, None without a solution."""
        if self.objective_value is None or self.bound is None:
            return None
        if self.objective_value == 0:
            return 0.0
        return max(0.0, (self.objective_value - self.bound) / self.objective_value)
