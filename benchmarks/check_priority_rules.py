"""Fixed LOAD priorities against the optimum: can a greedy rule meet issue 14's target?

Issue 14 asks the default policy for a median ratio to the optimum of at most
1.10 (worst 1.25) on bench_solver's 150 random instances. `masa` orders LOADs by
footprint, smallest first. This script replays every instance the solver proved
optimal (optima from docs/bench-solver.json, no solving) under masa's memory rules
(EXECs first, a task starts only if it fits, headroom kept, the progress rule) with
the LOADs taken in other fixed orders, the first one that fits, and prints median
and worst ratio per tightness. A scan per decision, O(ready tasks): a check of
what the orders reach, not a policy to ship.

    python benchmarks/check_priority_rules.py
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from masa.runtime.virtual import simulate_graph
from masa.sched.core import SchedulerState, TaskInfo, TaskState
from masa.sched.policies import MasaPolicy
from masa.sched.taskgraph import TaskKind
from solver.instance import RandomSpec, random_instance

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "bench-solver.json"

SortKey = Callable[["FixedLoadOrder", SchedulerState, TaskInfo], tuple[Any, ...]]


def _tail_us(state: SchedulerState) -> dict[str, int]:
    """Each task's longest path to the end of the graph, its own duration included."""
    tails: dict[str, int] = {}

    def tail(task_id: str) -> int:
        if task_id not in tails:
            info = state.tasks[task_id]
            tails[task_id] = info.task.duration_us + max(
                (tail(successor) for successor in info.successors), default=0)
        return tails[task_id]

    for task_id in state.tasks:
        tail(task_id)
    return tails


def _network_left_us(state: SchedulerState, info: TaskInfo) -> int:
    """Profiled time of the tasks of the task's network that have not started."""
    return sum(other.task.duration_us for other in state.tasks.values()
               if other.task.group == info.task.group
               and other.state in (TaskState.PENDING, TaskState.READY))


class FixedLoadOrder(MasaPolicy):
    """masa's memory rules; ready EXECs by footprint, then the first LOAD in `key`
    order that fits (headroom kept)."""

    def __init__(self, key: SortKey) -> None:
        super().__init__(job_order=False)
        self.key = key
        self.tail_us: dict[str, int] = {}
        self._ready: set[str] = set()

    def on_ready(self, state: SchedulerState, info: TaskInfo) -> None:
        super().on_ready(state, info)
        self._ready.add(info.task.task_id)

    def on_started(self, state: SchedulerState, info: TaskInfo) -> None:
        super().on_started(state, info)
        self._ready.discard(info.task.task_id)

    def pick(self, state: SchedulerState) -> str | None:
        if not self.tail_us:  # the instances are released at once: the graph is whole
            self.tail_us = _tail_us(state)
        free_bytes = state.ledger.free_bytes()
        ready = [state.tasks[task_id] for task_id in self._ready
                 if state.tasks[task_id].state is TaskState.READY]
        execs = sorted((info for info in ready if info.task.kind is not TaskKind.LOAD),
                       key=lambda info: (info.footprint_bytes, info.task.order))
        loads = sorted((info for info in ready if info.task.kind is TaskKind.LOAD),
                       key=lambda info: self.key(self, state, info))
        for info in execs:
            if info.footprint_bytes <= free_bytes:
                return info.task.task_id
        for info in loads:
            if self._load_fits(state, info.task.task_id, info.footprint_bytes, free_bytes, 0):
                return info.task.task_id
        if state.running_count == 0 and (execs or loads):  # the progress rule
            return min(execs or loads,
                       key=lambda info: (info.footprint_bytes, info.task.order)).task.task_id
        return None


RULES: dict[str, SortKey] = {
    "smallest first (each LOAD tested, no job order)":
        lambda policy, state, info: (info.footprint_bytes, info.task.order),
    "largest first": lambda policy, state, info: (-info.footprint_bytes, info.task.order),
    "longest first": lambda policy, state, info: (-info.task.duration_us, info.task.order),
    "network order": lambda policy, state, info: (info.task.order,),
    "longest path to the end":
        lambda policy, state, info: (-policy.tail_us[info.task.task_id], info.task.order),
    "shortest remaining network":
        lambda policy, state, info: (_network_left_us(state, info), info.task.order),
    "longest remaining network":
        lambda policy, state, info: (-_network_left_us(state, info), info.task.order),
}


def ratios(make_policy: Callable[[], Any], rows: list[dict[str, Any]]) -> list[float]:
    """Makespan / optimum of each row's instance under the policy."""
    found = []
    for row in rows:
        instance = random_instance(RandomSpec(**row["spec"]))
        result = simulate_graph(instance.graph, policy=make_policy(), workers=instance.workers,
                                memory_budget_bytes=instance.memory)
        assert not result.over_commits, (row["instance"], "over budget")
        found.append(result.makespan_us / row["best"])
    return found


def _cells(found: list[float], rows: list[dict[str, Any]]) -> list[str]:
    """Median / worst per tightness."""
    cells = []
    for label in ("tight", "medium", "loose"):
        subset = [ratio for ratio, row in zip(found, rows, strict=True)
                  if row["tightness"] == label]
        cells.append(f"{statistics.median(subset):.3f} / {max(subset):.3f}")
    return cells


def main(argv: list[str]) -> int:
    rows = [row for row in json.loads(RESULTS.read_text())["random"]["rows"]
            if row["status"] == "OPTIMAL"]
    policies: dict[str, Callable[[], Any]] = {"masa (the default)": MasaPolicy}
    policies |= {name: (lambda key=key: FixedLoadOrder(key)) for name, key in RULES.items()}
    print(f"{len(rows)} proven instances; ratio to the optimum, median / worst")
    print("| LOAD order | " + " | ".join(["tight", "medium", "loose"]) + " |")
    print("|---|---|---|---|")
    by_rule = {}
    for name, make_policy in policies.items():
        by_rule[name] = ratios(make_policy, rows)
        print(f"| {name} | " + " | ".join(_cells(by_rule[name], rows)) + " |", flush=True)
    # A portfolio: each instance's best fixed order (what planning by these rules reaches).
    best = [min(column) for column in zip(*by_rule.values(), strict=True)]
    print("| the best of these per instance | " + " | ".join(_cells(best, rows)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
