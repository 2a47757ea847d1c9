"""A property-based state machine over the core: add, arrive, select, finish, gate, open, cancel.

After every step the ledger must equal the direct memory of the running tasks
plus the memory of the locks that are held and not yet released, the worker
count must add up, and a memory-aware policy may only have gone over the
budget under the progress rule (never a "violation").
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sched_graphs import chain_network

from masa.runtime.registry import make_policy
from masa.sched.core import (
    TaskState,
    add_tasks,
    arrive,
    cancel_group,
    finish,
    gate_group,
    new_state,
    open_group,
    select,
)

WORKERS = 2  # stages up to 140 bytes against 100: the progress rule gets exercised
BUDGET_BYTES = 100


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.policy_name = "masa"
        self.state = new_state(WORKERS, BUDGET_BYTES, make_policy(self.policy_name))
        self.jobs = 0
        self.waiting: list[list[str]] = []  # jobs added, not yet arrived
        self.groups: list[str] = []

    @rule(stages=st.lists(st.integers(0, 140), min_size=1, max_size=4),
          exec_bytes=st.integers(0, 30), arrived=st.booleans())
    def add(self, stages: list[int], exec_bytes: int, arrived: bool) -> None:
        graph = chain_network(self.jobs, 0, stages, exec_bytes=exec_bytes, output_bytes=3)
        self.jobs += 1
        add_tasks(self.state, graph, arrived=arrived)
        if not arrived:
            self.waiting.append([task.task_id for task in graph.tasks])
        self.groups.append(graph.tasks[0].group)

    @precondition(lambda self: self.waiting)
    @rule(index=st.integers(0, 100))
    def arrive_one(self, index: int) -> None:
        arrive(self.state, self.waiting.pop(index % len(self.waiting)))

    @rule()
    def dispatch(self) -> None:
        select(self.state)

    @precondition(lambda self: self.state.running_count > 0)
    @rule(index=st.integers(0, 100), ok=st.booleans())
    def finish_one(self, index: int, ok: bool) -> None:
        running = sorted(tid for tid, info in self.state.tasks.items()
                         if info.state is TaskState.RUNNING)
        finish(self.state, running[index % len(running)], ok)

    @precondition(lambda self: self.groups)
    @rule(index=st.integers(0, 100), action=st.sampled_from(["gate", "open", "cancel"]))
    def control(self, index: int, action: str) -> None:
        group = self.groups[index % len(self.groups)]
        if action == "gate":
            gate_group(self.state, group)
        elif action == "open":
            open_group(self.state, group)
        else:
            cancel_group(self.state, group, "cancelled by the test")

    @invariant()
    def ledger_equals_running_tasks_plus_held_locks(self) -> None:
        state = self.state
        running = [info for info in state.tasks.values() if info.state is TaskState.RUNNING]
        direct = sum(info.task.memory_bytes for info in running)
        locked = sum(lock.lock.memory_bytes for lock in state.locks.values()
                     if lock.held and not lock.released)
        assert state.ledger.reserved_bytes == direct + locked
        assert state.running_count == len(running)
        assert len(state.free_workers) + len(running) == WORKERS

    @invariant()
    def over_the_budget_only_under_the_progress_rule(self) -> None:
        assert all(o.reason == "progress" for o in self.state.over_commits)


CoreMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                         deadline=None)
TestCore = CoreMachine.TestCase
