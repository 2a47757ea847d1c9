"""The solver next to a heuristic on the same instance: the comparison `masa optimal` reports.

Owns running a policy (masa.runtime.registry) in the simulator on exactly
the instance, checking every schedule with masa.sched.checker, choosing the
solver's hint among the schedules that fit the budget, and the report of
the comparison (a dict for JSON, lines of text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from masa.runtime.registry import make_policy
from masa.runtime.virtual import simulate_graph
from masa.sched.checker import check_schedule
from masa.sched.taskgraph import ScheduledTask
from solver.instance import Instance, check_feasible, without_load_order
from solver.options import SolveOptions, SolveResult
from solver.schedules import objective_value, response_sum, schedule_makespan, serial_schedule
from solver.search import solve_instance

HeuristicRun = tuple[tuple[ScheduledTask, ...], tuple[str, ...]]  # (schedule, over-commits)


@dataclass(frozen=True)
class Evaluation:
    """The solver's result next to the heuristic's on the same instance."""

    instance: Instance
    result: SolveResult
    heuristic_schedule: tuple[ScheduledTask, ...]
    hint_source: str  # masa / bulk / serial: whose schedule hinted the solver ("" none)
    heuristic_over_commits: tuple[str, ...]  # tasks run over budget (progress rule)
    heuristic_problems: tuple[str, ...]  # checker findings beyond those over-commits
    solver_problems: tuple[str, ...]  # checker findings on the solver schedule (expect none)
    policy: str = "masa"  # the heuristic compared: a masa.runtime.registry name

    @property
    def heuristic_makespan_us(self) -> int:
        return schedule_makespan(self.heuristic_schedule)

    @property
    def heuristic_objective(self) -> int:
        return objective_value(self.result.objective, self.instance.graph,
                               self.heuristic_schedule)

    @property
    def ratio(self) -> float | None:
        """Heuristic objective / best solver objective (the optimum when proven)."""
        best = self.result.objective_value
        return self.heuristic_objective / best if best else None

    @property
    def ratio_max(self) -> float | None:
        """Heuristic objective / proven bound: the ratio to the optimum is at most this."""
        bound = self.result.bound
        return self.heuristic_objective / bound if bound else None

    @property
    def passed_checks(self) -> bool:
        """Both schedules passed masa.sched.checker (the heuristic's up to its over-commits)."""
        return not self.heuristic_problems and not self.solver_problems


def run_heuristic(instance: Instance, policy: str = "masa") -> HeuristicRun:
    """A policy (by default `masa`) in the simulator on exactly this instance.

    Returns its schedule and the tasks it over-committed memory for (the
    progress rule: run the smallest task when nothing fits and no worker is
    busy; or any dispatch of a memory-oblivious policy).
    """
    result = simulate_graph(instance.graph, policy=make_policy(policy),
                            workers=instance.workers, memory_budget_bytes=instance.memory)
    return tuple(result.schedule), tuple(item.task_id for item in result.over_commits)


def check(instance: Instance, schedule: Sequence[ScheduledTask],
          allowed_over_commits: Sequence[str] = ()) -> list[str]:
    """masa.sched.checker's findings on a schedule ([] = valid)."""
    return check_schedule(instance.graph, list(schedule), workers=instance.workers,
                          memory_budget_bytes=instance.memory,
                          allowed_over_commits=allowed_over_commits)


def evaluate(instance: Instance, options: SolveOptions, *, use_hint: bool = True,
             policy: str = "masa", heuristic_run: HeuristicRun | None = None) -> Evaluation:
    """A heuristic (`masa` by default), then the solver hinted with the best schedule
    within budget. heuristic_run: that policy's `run_heuristic` result, if the
    caller already has it (masa-plan plans for about a second)."""
    check_feasible(instance)
    # The solver ignores the LOAD order rule (a rule of the heuristic only): its
    # hints and its schedule are checked against everything else.
    unordered = replace(instance, graph=without_load_order(instance.graph))
    heuristic, over_commits = (run_heuristic(instance, policy) if heuristic_run is None
                               else heuristic_run)
    # Checked allowing its recorded over-commits: anything else is a bug.
    heuristic_problems = check(instance, heuristic, over_commits)
    hint_source, hint = "", None
    if use_hint:
        candidates: list[tuple[str, Sequence[ScheduledTask]]] = []
        # Only a schedule within the budget may serve as hint and upper bound.
        if not heuristic_problems and not over_commits:
            candidates.append((policy, heuristic))
        hint_source, hint = _best_hint(instance, options, unordered, candidates)
    result = solve_instance(instance, options, hint=hint)
    solver_problems = check(unordered, result.schedule) if result.schedule else []
    return Evaluation(instance=instance, result=result, heuristic_schedule=heuristic,
                      hint_source=hint_source, heuristic_over_commits=over_commits,
                      heuristic_problems=tuple(heuristic_problems),
                      solver_problems=tuple(solver_problems), policy=policy)


def _best_hint(instance: Instance, options: SolveOptions, unordered: Instance,
               candidates: list[tuple[str, Sequence[ScheduledTask]]]
               ) -> tuple[str, tuple[ScheduledTask, ...] | None]:
    """(source, schedule) of the best candidate that fits the budget, ("", None) if none.

    Large tight instances may find no solution at all without a hint, and a
    poor hint leaves CP-SAT far from the optimum: the candidates (the
    heuristic's) are joined by bulk's (one network at a time) and a serial one.
    """
    bulk, bulk_over_commits = run_heuristic(instance, "bulk")
    if not bulk_over_commits:
        candidates = [*candidates, ("bulk", bulk)]
    candidates = [*candidates, ("serial", serial_schedule(instance.graph))]
    valid = [(name, schedule) for name, schedule in candidates
             if check(unordered, schedule) == []]
    if not valid:
        return "", None
    source, best = min(valid, key=lambda item: objective_value(
        options.objective, instance.graph, item[1]))
    return source, tuple(best)


# ---------------------------------------------------------------- report

def evaluation_to_dict(evaluation: Evaluation, *, with_schedule: bool = True) -> dict[str, Any]:
    result = evaluation.result
    instance = evaluation.instance
    raw: dict[str, Any] = {
        "instance": instance.name,
        "tasks": instance.num_tasks,
        "workers": instance.workers,
        "memory": instance.memory,
        "time_unit": instance.time_unit,
        "memory_unit": instance.memory_unit,
        "status": result.status,
        "objective": result.objective,
        "formulation": result.formulation,
        "optimal_makespan": result.makespan_us if result.proven and
        result.objective == "makespan" else None,
        "best_makespan": result.makespan_us,
        "optimal_response_sum": result.response_sum_us if result.proven and
        result.objective == "response" else None,
        "best_response_sum": result.response_sum_us,
        "objective_value": result.objective_value,
        "bound": result.bound,
        "gap": result.gap,
        "policy": evaluation.policy,
        "heuristic_makespan": evaluation.heuristic_makespan_us,
        "heuristic_response_sum": response_sum(instance.graph, evaluation.heuristic_schedule),
        "ratio": evaluation.ratio,
        "ratio_max": None if result.proven else evaluation.ratio_max,
        "solve_time_s": round(result.solve_time_s, 3),
        "deterministic_time": round(result.deterministic_time, 3),
        "segments": result.segments,
        "direction": result.direction,
        "probes": result.probes,
        "hint_used": result.hint_used,
        "hint_source": evaluation.hint_source,
        "heuristic_over_commits": list(evaluation.heuristic_over_commits),
        "heuristic_check": list(evaluation.heuristic_problems),
        "solver_check": list(evaluation.solver_problems),
        # Always true since the checker is a plain import; kept so that readers
        # of earlier reports keep working.
        "checker_available": True,
    }
    if with_schedule:
        raw["schedule"] = [{"id": item.task_id, "worker": item.worker, "start": item.start_us,
                            "end": item.end_us} for item in result.schedule]
    return raw


def format_evaluation(evaluation: Evaluation) -> str:
    result = evaluation.result
    instance = evaluation.instance
    unit = instance.time_unit
    lines = [f"instance: {instance.name} ({instance.num_tasks} tasks, {instance.workers} "
             f"workers, memory {instance.memory} {instance.memory_unit})",
             f"status: {result.status} ({result.formulation}, objective {result.objective}, "
             f"{result.solve_time_s:.2f} s, {result.segments} segment(s), "
             f"{result.direction}, {result.probes} probe(s), "
             f"hint {evaluation.hint_source or 'none'})"]
    what = "makespan" if result.objective == "makespan" else "response_sum"
    if result.proven:
        lines.append(f"optimal_{what}: {result.objective_value} {unit}")
    elif result.objective_value is not None:
        lines.append(f"best_{what}: {result.objective_value} {unit} "
                     f"(bound {result.bound}, gap {100 * (result.gap or 0):.1f}%)")
    else:
        lines.append(f"no schedule found (bound {result.bound})")
    lines.append(f"heuristic_{what}: {evaluation.heuristic_objective} {unit} "
                 f"(policy {evaluation.policy})")
    if evaluation.ratio is not None:
        extra = "" if result.proven else f" (at most {evaluation.ratio_max:.3f})"
        lines.append(f"ratio: {evaluation.ratio:.3f}{extra}")
    if evaluation.heuristic_over_commits:
        lines.append(f"heuristic over-committed memory for "
                     f"{len(evaluation.heuristic_over_commits)} task(s) (progress rule): "
                     f"{', '.join(evaluation.heuristic_over_commits[:5])}; its schedule "
                     "exceeds the budget, so it is no valid hint or comparison")
    lines += [f"heuristic schedule check: {problem}" for problem in evaluation.heuristic_problems]
    lines += [f"solver schedule check: {problem}" for problem in evaluation.solver_problems]
    if result.schedule:
        lines.append("schedule (task worker start end):")
        lines += [f"  {item.task_id} {item.worker} {item.start_us} {item.end_us}"
                  for item in result.schedule]
    return "\n".join(lines)
