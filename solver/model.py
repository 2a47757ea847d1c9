"""The CP-SAT model of the Masa scheduling problem, and one CP-SAT solve of it.

Owns the constraint model, written in the order of OR-Tools' samples: the
data (`_Data`), the variables (`_Variables`; `_var` suffixes name CP-SAT
variables), the constraints (one `_add_*` function each), the objective,
the search strategy and hint carried by the model, and one solve
(`solve_model`), whose outcome is read back as plain integers. Two
formulations:

- "cumulative" (default): one fixed-size interval per task in one cumulative
  of capacity `workers` (identical workers), and one memory cumulative over
  the tasks' direct memory and the lock intervals
  [start(from), max(end(until...))). Concrete workers are assigned
  afterwards (solver.schedules.assign_workers).
  Precedence is finish-to-start; start_after is start-to-start, except the
  LOAD order rule (LOAD -> LOAD), a rule of the heuristic only, which the
  model leaves out (solver.instance.model_start_after).
- "paper": the paper's assignment variables X[t][w] with one optional interval
  per task and worker and a no-overlap per worker, same memory cumulative.

Always: the bound makespan >= ceil(work / workers); a hint (a complete,
feasible schedule) also bounds the objective from above. Strategies that run
several solves or change the instance (time reversal, lower-bound probing,
decomposition, list-schedule hints) are solver.search's.

No threads, clocks or I/O here beyond CP-SAT's own search workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from masa.sched.taskgraph import ScheduledTask, Task, TaskGraph, TaskKind
from solver.analysis import (
    conflict_cliques,
    heads_and_tails,
    identical_groups,
    static_lower_bound,
    swappable_groups,
)
from solver.instance import Instance, ancestor_sets, closing_tasks, model_start_after
from solver.options import SolveOptions
from solver.schedules import job_releases, schedule_makespan

_Hint = dict[str, ScheduledTask]


@dataclass(frozen=True)
class ModelSolution:
    """What one CP-SAT solve found, in the solved instance's own time."""

    status: str  # CP-SAT's status name: OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN
    starts: dict[str, int] | None  # task -> start; None without a solution
    workers: dict[str, int]  # task -> worker (paper formulation only, else empty)
    objective_bound: float  # CP-SAT's best bound on the objective (with an objective)
    wall_time_s: float
    deterministic_time: float


def solve_model(instance: Instance, options: SolveOptions, hint: _Hint | None = None, *,
                deadline: int | None = None, at_least: int = 0, set_times: bool = False
                ) -> ModelSolution:
    """One CP-SAT solve of the instance's model.

    deadline: seek any schedule ending by then instead of minimising;
    at_least: a proven lower bound on the makespan; set_times: carry the
    set-times decision strategy (see SolveOptions.search).
    """
    data = _data(instance, options, hint, deadline, at_least)
    model, variables = _build(data, set_times)
    solver = _solver(options, set_times)
    status = solver.solve(model)
    name = solver.status_name(status)
    if name == "MODEL_INVALID":
        raise AssertionError(f"CP-SAT rejected the model: {model.validate()}")
    starts: dict[str, int] | None = None
    workers: dict[str, int] = {}
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts = {tid: solver.value(var) for tid, var in variables.start_vars.items()}
        workers = {tid: next(w for w, x_var in enumerate(row_vars)
                             if solver.boolean_value(x_var))
                   for tid, row_vars in variables.worker_vars.items()}
    return ModelSolution(status=name, starts=starts, workers=workers,
                         objective_bound=solver.best_objective_bound,
                         wall_time_s=solver.wall_time,
                         deterministic_time=solver.response_proto.deterministic_time)


def _build(data: _Data, set_times: bool) -> tuple[cp_model.CpModel, _Variables]:
    """The model, in the samples' order; the order of creation is CP-SAT's input
    order too, so it is kept stable (the same instance gives the same search)."""
    options = data.options
    model = cp_model.CpModel()
    model.name = data.instance.name or "masa"
    variables = _new_variables(model, data)
    _add_workers(model, data, variables)
    _add_memory(model, data, variables)
    _add_precedences(model, data, variables)
    _add_makespan_bounds(model, data, variables)
    if options.redundant:
        _add_redundant(model, data, variables)
    if set_times:
        _add_set_times_strategy(model, data, variables)
    if options.symmetry_breaking:
        _add_symmetry_breaking(model, data, variables)
    job_end_vars = _add_objective(model, data, variables)
    if data.hint is not None:
        _add_hint(model, data, variables, job_end_vars)
    return model, variables


# ---------------------------------------------------------------- data

@dataclass(frozen=True)
class _Data:
    instance: Instance
    options: SolveOptions
    hint: _Hint | None  # a complete feasible schedule, by task id
    deadline: int | None  # seek a schedule ending by then (no objective)
    at_least: int  # proven lower bound on the makespan (0: none)
    duration: dict[str, int]
    horizon: int  # latest release plus all the work: no optimal schedule ends later
    head: dict[str, int]  # earliest start
    tail: dict[str, int]  # longest path from the task's start to the end
    ancestors: dict[str, set[str]]

    @property
    def graph(self) -> TaskGraph:
        return self.instance.graph

    @property
    def tasks(self) -> tuple[Task, ...]:
        return self.instance.graph.tasks


def _data(instance: Instance, options: SolveOptions, hint: _Hint | None,
          deadline: int | None, at_least: int) -> _Data:
    tasks = instance.graph.tasks
    duration = {task.task_id: task.duration_us for task in tasks}
    horizon = max((task.release_us for task in tasks), default=0) + sum(duration.values())
    head, tail = heads_and_tails(instance.graph)
    return _Data(instance=instance, options=options, hint=hint, deadline=deadline,
                 at_least=at_least, duration=duration, horizon=horizon, head=head, tail=tail,
                 ancestors=ancestor_sets(instance.graph))


# ---------------------------------------------------------------- variables

@dataclass
class _Variables:
    start_vars: dict[str, cp_model.IntVar]
    interval_vars: dict[str, cp_model.IntervalVar]  # fixed size: the task's duration
    makespan_var: cp_model.IntVar
    lock_interval_vars: list[cp_model.IntervalVar]
    lock_demands: list[int]
    lock_size_vars: list[tuple[int, cp_model.IntVar]]  # (memory, size) for the energy bound
    # The paper formulation's X[task][worker] (made by _add_workers), else empty.
    worker_vars: dict[str, list[cp_model.IntVar]] = field(default_factory=dict)


def _new_variables(model: cp_model.CpModel, data: _Data) -> _Variables:
    """One start and a fixed-size interval per task, the makespan, the lock intervals."""
    start_vars: dict[str, cp_model.IntVar] = {}
    interval_vars: dict[str, cp_model.IntervalVar] = {}
    for task in data.tasks:
        tid = task.task_id
        duration = data.duration[tid]
        if data.options.redundant:  # heads and tails tighten the domains
            low, high = data.head[tid], data.horizon - data.tail[tid]
        else:
            low, high = task.release_us, data.horizon - duration
        start_vars[tid] = model.new_int_var(low, max(low, high), f"start_{tid}")
        interval_vars[tid] = model.new_fixed_size_interval_var(
            start_vars[tid], duration, f"interval_{tid}")
    makespan_var = model.new_int_var(0, data.horizon, "makespan")
    variables = _Variables(start_vars=start_vars, interval_vars=interval_vars,
                           makespan_var=makespan_var, lock_interval_vars=[], lock_demands=[],
                           lock_size_vars=[])
    _new_lock_variables(model, data, variables)
    return variables


def _new_lock_variables(model: cp_model.CpModel, data: _Data, variables: _Variables) -> None:
    """A lock holds its memory over [start(from), max(end(until...))): one interval each."""
    horizon = data.horizon
    for lock in data.graph.locks:
        if lock.memory_bytes == 0:
            continue
        start_var = variables.start_vars[lock.from_task]
        # An until-task that precedes another one never ends the lock: left out.
        until = closing_tasks(lock, data.ancestors)
        ends = [variables.start_vars[u] + data.duration[u] for u in until]
        # Held at least until `from` itself ends (masa.sched.checker's rule too);
        # implied when every `until` task descends from `from` (the usual case).
        if not all(lock.from_task in data.ancestors[u] for u in until):
            ends.append(start_var + data.duration[lock.from_task])
        end: cp_model.LinearExprT
        if len(ends) == 1:
            end = ends[0]
        else:
            end = model.new_int_var(0, horizon, f"lock_end_{lock.lock_id}")
            model.add_max_equality(end, ends)
        size_var = model.new_int_var(0, horizon, f"lock_size_{lock.lock_id}")
        model.add(size_var == end - start_var)
        variables.lock_interval_vars.append(
            model.new_interval_var(start_var, size_var, end, f"lock_{lock.lock_id}"))
        variables.lock_demands.append(lock.memory_bytes)
        variables.lock_size_vars.append((lock.memory_bytes, size_var))


# ---------------------------------------------------------------- constraints

def _add_workers(model: cp_model.CpModel, data: _Data, variables: _Variables) -> None:
    """At most `workers` tasks at once: one cumulative, or the paper's X[t][w]."""
    workers = data.instance.workers
    if data.options.formulation == "paper":
        variables.worker_vars = _add_worker_assignment(model, data, variables)
    elif workers == 1:
        model.add_no_overlap(list(variables.interval_vars.values()))
    else:
        model.add_cumulative(list(variables.interval_vars.values()),
                             [1] * len(data.tasks), workers)


def _add_worker_assignment(model: cp_model.CpModel, data: _Data, variables: _Variables
                           ) -> dict[str, list[cp_model.IntVar]]:
    """The paper's formulation: each task on exactly one worker, no overlap per worker."""
    workers = data.instance.workers
    worker_vars: dict[str, list[cp_model.IntVar]] = {}
    per_worker: list[list[cp_model.IntervalVar]] = [[] for _ in range(workers)]
    for index, task in enumerate(data.tasks):
        tid = task.task_id
        # Symmetry between workers: relabel them by their first task in
        # instance order, so task i uses one of workers 0..i.
        usable = min(workers, index + 1) if data.options.symmetry_breaking else workers
        row_vars = [model.new_bool_var(f"x_{tid}_{w}") for w in range(usable)]
        worker_vars[tid] = row_vars
        model.add_exactly_one(row_vars)
        for w, present_var in enumerate(row_vars):
            per_worker[w].append(model.new_optional_fixed_size_interval_var(
                variables.start_vars[tid], data.duration[tid], present_var,
                f"interval_{tid}_w{w}"))
    for worker_intervals in per_worker:
        model.add_no_overlap(worker_intervals)
    return worker_vars


def _add_memory(model: cp_model.CpModel, data: _Data, variables: _Variables) -> None:
    """Direct memory while a task runs plus the locks' memory, within the budget."""
    needing = [t for t in data.tasks if t.memory_bytes > 0]
    intervals = [variables.interval_vars[t.task_id] for t in needing]
    demands = [t.memory_bytes for t in needing]
    if intervals or variables.lock_interval_vars:
        model.add_cumulative(intervals + variables.lock_interval_vars,
                             demands + variables.lock_demands, data.instance.memory)


def _add_precedences(model: cp_model.CpModel, data: _Data, variables: _Variables) -> None:
    """Finish to start; start to start for the start_after pairs of the model (not
    the heuristic's LOAD order rule); releases are in the start domains."""
    start_vars = variables.start_vars
    for before, after in data.graph.precedence:
        model.add(start_vars[after] >= start_vars[before] + data.duration[before])
    for before, after in model_start_after(data.graph):
        model.add(start_vars[after] >= start_vars[before])


def _add_makespan_bounds(model: cp_model.CpModel, data: _Data, variables: _Variables) -> None:
    makespan_var = variables.makespan_var
    for task in data.tasks:
        model.add(makespan_var >= variables.start_vars[task.task_id] + data.duration[task.task_id])
    model.add(makespan_var >= math.ceil(sum(data.duration.values()) / data.instance.workers))
    if data.at_least:
        model.add(makespan_var >= data.at_least)


def _add_redundant(model: cp_model.CpModel, data: _Data, variables: _Variables) -> None:
    """Implied constraints that prune: the static bound, conflict cliques, memory energy."""
    makespan_var = variables.makespan_var
    model.add(makespan_var >= static_lower_bound(data.instance))
    # Tasks that can never overlap (memory or precedence): disjunctions.
    for clique in conflict_cliques(data.graph, data.instance.memory, limit=len(data.tasks)):
        model.add_no_overlap([variables.interval_vars[t] for t in clique])
    # Memory energy: what is held, integrated over time, fits under the budget.
    energy = sum(t.memory_bytes * data.duration[t.task_id] for t in data.tasks)
    if variables.lock_size_vars or energy:
        model.add(sum(m * size_var for m, size_var in variables.lock_size_vars) + energy
                  <= data.instance.memory * makespan_var)


def _add_symmetry_breaking(model: cp_model.CpModel, data: _Data, variables: _Variables
                           ) -> None:
    """Order interchangeable networks by the start of one task position."""
    hint = data.hint
    classes = swappable_groups(data.graph, identical_groups(data.graph), data.options.objective)
    for groups in classes:
        # Any one task position may be ordered across interchangeable
        # networks; order them as the hint does so the hint stays feasible.
        anchor = 0
        if hint is not None:
            groups = sorted(groups, key=lambda g: (hint[g[anchor]].start_us, g[anchor]))
        for first, second in zip(groups, groups[1:], strict=False):
            model.add(variables.start_vars[first[anchor]]
                      <= variables.start_vars[second[anchor]])


# ---------------------------------------------------------------- objective

def _add_objective(model: cp_model.CpModel, data: _Data, variables: _Variables
                   ) -> list[tuple[cp_model.IntVar, list[str]]]:
    """Minimise the makespan or the response sum, or (with a deadline) only meet it.

    Returns the response objective's job-end variables with their tasks (for the hint).
    """
    if data.deadline is not None:
        # A release-time segment that only has to be done before the next one,
        # or a probe: any schedule ending by the deadline.
        model.add(variables.makespan_var <= data.deadline)
        return []
    if data.options.objective == "makespan":
        model.minimize(variables.makespan_var)
        return []
    job_tasks: dict[int, list[str]] = {}
    for task in data.tasks:
        job_tasks.setdefault(task.job_id, []).append(task.task_id)
    job_end_vars: list[tuple[cp_model.IntVar, list[str]]] = []
    for job, ids in sorted(job_tasks.items()):
        job_end_var = model.new_int_var(0, data.horizon, f"job_end_{job}")
        model.add_max_equality(job_end_var, [variables.start_vars[t] + data.duration[t]
                                             for t in ids])
        job_end_vars.append((job_end_var, ids))
    offset = sum(job_releases(data.graph).values())
    model.minimize(sum(var for var, _ in job_end_vars) - offset)
    return job_end_vars


# ---------------------------------------------------------------- search

def _add_set_times_strategy(model: cp_model.CpModel, data: _Data, variables: _Variables
                            ) -> None:
    """Branch on starts, earliest first (see SolveOptions.search)."""
    # Ties (equal earliest starts): execs first, as the masa policy does
    # (they free memory), then instance order. Measured on a 48-task
    # tight instance: proven at ~10 dtime; instance order alone was not
    # proven at 20.
    order = sorted(data.tasks, key=lambda task: task.kind != TaskKind.EXEC)
    model.add_decision_strategy([variables.start_vars[t.task_id] for t in order],
                                cp_model.CHOOSE_LOWEST_MIN, cp_model.SELECT_MIN_VALUE)


def _add_hint(model: cp_model.CpModel, data: _Data, variables: _Variables,
              job_end_vars: list[tuple[cp_model.IntVar, list[str]]]) -> None:
    """The hint as CP-SAT's starting solution, and its makespan as an upper bound."""
    hint = data.hint
    assert hint is not None
    for job_end_var, ids in job_end_vars:
        model.add_hint(job_end_var, max(hint[t].end_us for t in ids))
    for task in data.tasks:
        model.add_hint(variables.start_vars[task.task_id], hint[task.task_id].start_us)
    model.add_hint(variables.makespan_var, schedule_makespan(hint.values()))
    if variables.worker_vars:
        # Workers relabelled by first use, as _add_worker_assignment's symmetry
        # breaking numbers them.
        first_seen: dict[int, int] = {}
        for task in data.tasks:
            first_seen.setdefault(hint[task.task_id].worker, len(first_seen))
        for tid, row_vars in variables.worker_vars.items():
            label = first_seen[hint[tid].worker]
            for w, present_var in enumerate(row_vars):
                model.add_hint(present_var, w == label)
    if data.options.objective == "makespan":
        model.add(variables.makespan_var <= schedule_makespan(hint.values()))


def _solver(options: SolveOptions, set_times: bool) -> cp_model.CpSolver:
    """CP-SAT with the options' limits, workers and seed."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.01, options.time_limit_s)
    solver.parameters.num_search_workers = max(1, options.search_workers)
    solver.parameters.random_seed = options.seed
    if math.isfinite(options.max_deterministic_time):
        solver.parameters.max_deterministic_time = max(0.001, options.max_deterministic_time)
    if set_times and options.search_workers >= 2:
        # See SolveOptions.search: on 2 workers only default_lp runs as a full
        # subsolver, following the decision strategy.
        solver.parameters.subsolvers.extend(["default_lp", "fixed"])
    if options.redundant:
        # Stronger cumulative reasoning: the memory cumulative is where tight
        # instances are decided (measured: 36 tasks at tightness 1.2 proven in
        # ~9 s instead of not at all in 20 s).
        solver.parameters.use_timetable_edge_finding_in_cumulative = True
        solver.parameters.use_overload_checker_in_cumulative = True
        solver.parameters.use_hard_precedences_in_cumulative = True
    return solver
