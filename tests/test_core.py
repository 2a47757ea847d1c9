"""The pure core: transition table, memory ledger, locks, failures, cancels, gates."""

from __future__ import annotations

import pytest
from sched_graphs import chain_network, merge, single

from masa.common.errors import UserError
from masa.runtime.registry import make_policy
from masa.sched.core import (
    TERMINAL,
    TRANSITIONS,
    GroupStatus,
    MemoryLedger,
    SchedulerError,
    TaskState,
    add_tasks,
    arrive,
    cancel_group,
    fail_group,
    finish,
    forget_group,
    gate_group,
    group_status,
    is_finished,
    new_state,
    open_group,
    select,
    take_events,
)
from masa.sched.taskgraph import Lock, Task, TaskGraph, TaskKind


def test_transition_table_terminal_states_have_no_exit() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
    assert TaskState.RUNNING in TRANSITIONS[TaskState.READY]
    assert TaskState.RUNNING not in TRANSITIONS[TaskState.PENDING]


def test_ledger_never_negative_and_budget_enforced() -> None:
    ledger = MemoryLedger(100)
    ledger.reserve(60)
    with pytest.raises(SchedulerError):
        ledger.reserve(41)
    ledger.reserve(41, allow_over_budget=True)
    assert ledger.reserved_bytes == 101 and ledger.peak_reserved_bytes == 101
    ledger.release(101)
    with pytest.raises(SchedulerError):
        ledger.release(1)
    assert ledger.reserved_bytes == 0


def test_new_state_rejects_bad_input() -> None:
    with pytest.raises(UserError, match="policy"):
        new_state(1, 100, make_policy("fifo"))
    with pytest.raises(UserError, match="workers"):
        new_state(0, 100, make_policy("masa-noplan"))


def test_locks_reserved_at_dispatch_released_after_last_consumer() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, chain_network(0, 0, [100, 200], exec_bytes=7, output_bytes=3))
    ledger = state.ledger
    [dispatch] = select(state)
    assert dispatch.task_id == "j0/n0/s0/load" and ledger.reserved_bytes == 100
    finished = finish(state, "j0/n0/s0/load")
    assert finished.released_locks == [] and ledger.reserved_bytes == 100
    # EXEC s0 (7 working + 3 output) goes before LOAD s1: exec first.
    assert [d.task_id for d in select(state)] == ["j0/n0/s0/exec"]
    assert ledger.reserved_bytes == 110
    finished = finish(state, "j0/n0/s0/exec")
    # The resident lock of s0 ends with its EXEC; the output lock waits for EXEC s1.
    assert [lock.lock_id for lock in finished.released_locks] == ["j0/n0/s0/load#resident"]
    assert finished.released_bytes == 107 and ledger.reserved_bytes == 3
    assert [d.task_id for d in select(state)] == ["j0/n0/s1/load"]
    finish(state, "j0/n0/s1/load")
    select(state)
    finished = finish(state, "j0/n0/s1/exec")
    assert sorted(lock.lock_id for lock in finished.released_locks) == [
        "j0/n0/s0/exec#outputs", "j0/n0/s1/exec#outputs", "j0/n0/s1/load#resident"]
    assert ledger.reserved_bytes == 0 and is_finished(state)
    assert finished.ended_groups == [("j0/n0", GroupStatus.DONE)]


def test_failed_task_fails_its_group_and_releases_everything() -> None:
    state = new_state(2, 1000, make_policy("masa-noplan"))
    add_tasks(state, merge([chain_network(0, 0, [10, 500, 500]),
                            chain_network(0, 1, [20, 600])]))
    running = {d.task_id for d in select(state)}
    assert running == {"j0/n0/s0/load", "j0/n1/s0/load"}
    # LOAD s1 of n0 is ready (start_after satisfied) but not dispatched: no worker.
    finished = finish(state, "j0/n0/s0/load", ok=False)
    assert finished.status is TaskState.FAILED
    assert finished.newly_failed_groups == ["j0/n0"]
    assert set(finished.newly_cancelled) == {
        "j0/n0/s0/exec", "j0/n0/s1/load", "j0/n0/s1/exec", "j0/n0/s2/load", "j0/n0/s2/exec"}
    assert finished.to_terminate == []
    assert finished.ended_groups == [("j0/n0", GroupStatus.FAILED)]
    assert group_status(state, "j0/n1") is GroupStatus.ACTIVE
    # Only n1's LOAD s0 still holds memory.
    assert state.ledger.reserved_bytes == 20
    finish(state, "j0/n1/s0/load")
    while not is_finished(state):
        for dispatch in select(state):
            finish(state, dispatch.task_id)
    assert state.ledger.reserved_bytes == 0
    assert group_status(state, "j0/n1") is GroupStatus.DONE


def test_failure_lists_other_running_tasks_of_the_group_to_terminate() -> None:
    state = new_state(2, 1000, make_policy("masa-noplan"))
    add_tasks(state, chain_network(0, 0, [10, 10]))
    assert {d.task_id for d in select(state)} == {"j0/n0/s0/load", "j0/n0/s1/load"}
    finished = finish(state, "j0/n0/s1/load", ok=False)
    assert finished.to_terminate == ["j0/n0/s0/load"]
    assert state.ledger.reserved_bytes == 10  # s0 still running, holds its lock
    stopped = finish(state, "j0/n0/s0/load", ok=False)
    assert stopped.status is TaskState.CANCELLED  # stopped on purpose, not a new failure
    assert stopped.newly_failed_groups == []
    assert stopped.ended_groups == [("j0/n0", GroupStatus.FAILED)]
    assert state.ledger.reserved_bytes == 0 and is_finished(state)


def test_cancel_group_releases_memory_of_finished_loads() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, chain_network(0, 0, [100, 100]))
    select(state)
    finish(state, "j0/n0/s0/load")
    assert state.ledger.reserved_bytes == 100
    assert cancel_group(state, "j0/n0", "not needed") == []
    events = take_events(state)
    # The session of the finished LOAD must be unloaded by the executor.
    assert [lock.lock_id for lock in events.released_locks] == ["j0/n0/s0/load#resident"]
    assert set(events.newly_cancelled) == {"j0/n0/s0/exec", "j0/n0/s1/load", "j0/n0/s1/exec"}
    assert events.ended_groups == [("j0/n0", GroupStatus.CANCELLED)]
    assert state.ledger.reserved_bytes == 0 and select(state) == []
    assert take_events(state).released_locks == []  # each event is reported once


def test_fail_group_while_running_ends_after_the_running_task() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, chain_network(0, 0, [40]))
    select(state)
    assert fail_group(state, "j0/n0", "bad input shape") == ["j0/n0/s0/load"]
    assert take_events(state).ended_groups == []
    finished = finish(state, "j0/n0/s0/load", ok=True)
    assert finished.status is TaskState.DONE
    assert finished.ended_groups == [("j0/n0", GroupStatus.FAILED)]
    assert state.ledger.reserved_bytes == 0


def test_cancelling_an_upstream_group_cancels_dependent_groups() -> None:
    upstream = chain_network(0, 0, [10])
    downstream = chain_network(0, 1, [10])
    # The downstream network's first LOAD waits for the upstream's EXEC.
    edge = TaskGraph(tasks=(), precedence=(("j0/n0/s0/exec", "j0/n1/s0/load"),))
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, merge([upstream, downstream, edge]))
    cancel_group(state, "j0/n0", "skipped")
    assert group_status(state, "j0/n1") is GroupStatus.CANCELLED
    assert is_finished(state) and state.ledger.reserved_bytes == 0


def test_gate_keeps_tasks_pending_until_opened() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    gate_group(state, "j0/n1")  # before the group exists
    add_tasks(state, merge([chain_network(0, 0, [10]), chain_network(0, 1, [1])]))
    assert state.tasks["j0/n1/s0/load"].state is TaskState.PENDING
    order: list[str] = []
    for _ in range(2):
        [dispatch] = select(state)
        order.append(dispatch.task_id)
        finish(state, dispatch.task_id)
    assert select(state) == []
    open_group(state, "j0/n1")
    while not is_finished(state):
        for dispatch in select(state):
            order.append(dispatch.task_id)
            finish(state, dispatch.task_id)
    assert order == ["j0/n0/s0/load", "j0/n0/s0/exec", "j0/n1/s0/load", "j0/n1/s0/exec"]


def test_gating_a_ready_task_withdraws_it_from_the_policy() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, merge([single("small", TaskKind.LOAD, 1, group="a"),
                            single("big", TaskKind.LOAD, 50, group="b")]))
    gate_group(state, "a")
    assert state.tasks["small"].state is TaskState.PENDING
    assert [d.task_id for d in select(state)] == ["big"]
    finish(state, "big")
    open_group(state, "a")
    assert [d.task_id for d in select(state)] == ["small"]


def test_tasks_wait_for_arrival() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, single("x", TaskKind.EXEC, 1), arrived=False)
    assert select(state) == []
    arrive(state, ["x"])
    assert [d.task_id for d in select(state)] == ["x"]


def test_add_tasks_rejects_duplicates_unknown_ids_and_cycles() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, single("x", TaskKind.EXEC, 1))
    with pytest.raises(SchedulerError, match="duplicate"):
        add_tasks(state, single("x", TaskKind.EXEC, 1))
    a = Task("a", TaskKind.EXEC, 1, 1)
    b = Task("b", TaskKind.EXEC, 1, 1)
    with pytest.raises(SchedulerError, match="unknown"):
        add_tasks(state, TaskGraph(tasks=(a,), precedence=(("nope", "a"),)))
    with pytest.raises(SchedulerError, match="cyclic"):
        add_tasks(state, TaskGraph(tasks=(a, b), precedence=(("a", "b"),),
                                   start_after=(("b", "a"),)))
    with pytest.raises(SchedulerError, match="lock"):
        add_tasks(state, TaskGraph(tasks=(a,), locks=(Lock("l", "a", ("zz",), 1),)))


def test_finish_of_a_task_that_is_not_running_is_an_error() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, single("x", TaskKind.EXEC, 1))
    with pytest.raises(SchedulerError):
        finish(state, "x")
    select(state)
    finish(state, "x")
    with pytest.raises(SchedulerError):
        finish(state, "x")


def test_online_job_may_depend_on_earlier_finished_task() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    add_tasks(state, single("first", TaskKind.EXEC, 1))
    select(state)
    finish(state, "first")
    later = Task("later", TaskKind.EXEC, 1, 1)
    add_tasks(state, TaskGraph(tasks=(later,), precedence=(("first", "later"),)))
    assert [d.task_id for d in select(state)] == ["later"]


def test_forgetting_ended_groups_keeps_a_long_running_state_small() -> None:
    state = new_state(2, 200, make_policy("masa-noplan"))
    peak_tasks = 0
    for job in range(50):
        add_tasks(state, merge([chain_network(job, 0, [40, 30]), chain_network(job, 1, [20])]))
        for _ in range(3):  # run part of the work, then the next job arrives
            for dispatch in select(state):
                finish(state, dispatch.task_id)
        _forget_ended(state)
        peak_tasks = max(peak_tasks, len(state.tasks))
    while not is_finished(state):
        for dispatch in select(state):
            finish(state, dispatch.task_id)
    assert _forget_ended(state) > 0
    assert state.tasks == {} and state.groups == {} and state.locks == {}
    assert peak_tasks < 60 and state.ledger.reserved_bytes == 0


def test_forget_group_refuses_live_groups_and_groups_others_wait_for() -> None:
    state = new_state(1, 1000, make_policy("masa-noplan"))
    edge = TaskGraph(tasks=(), precedence=(("j0/n0/s0/exec", "j0/n1/s0/load"),))
    add_tasks(state, merge([chain_network(0, 0, [10]), chain_network(0, 1, [10]), edge]))
    assert not forget_group(state, "j0/n0")  # not ended
    for _ in range(2):
        [dispatch] = select(state)
        finish(state, dispatch.task_id)
    assert group_status(state, "j0/n0") is GroupStatus.DONE
    assert not forget_group(state, "j0/n1")  # not ended
    # n0 has ended, but n1's LOAD depends on n0's EXEC and has not ended yet.
    assert forget_group(state, "j0/n0") is False
    for _ in range(2):
        [dispatch] = select(state)
        finish(state, dispatch.task_id)
    assert forget_group(state, "j0/n0") and forget_group(state, "j0/n1")


def _forget_ended(state) -> int:  # noqa: ANN001
    ended = [name for name, info in state.groups.items() if info.ended]
    return sum(forget_group(state, name) for name in ended)
