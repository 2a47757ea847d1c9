"""Small hand-made task graphs for the scheduling tests (core, policies, simulator).

Networks are built the way masa.sched.jobs builds them (LOAD/EXEC per stage, a
resident lock from LOAD to EXEC, an output lock from EXEC to its consumers, the
LOAD order rule as start_after), but from plain numbers, with no manifests.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from masa.sched.taskgraph import Lock, Task, TaskGraph, TaskKind
from solver.instance import Instance


def single(task_id: str, kind: TaskKind, memory_bytes: int, *, duration_us: int = 10,
           order: tuple[int, ...] = (), group: str = "g", lock_bytes: int = 0,
           layer_type: str = "other") -> TaskGraph:
    """One task, optionally opening a lock on itself of `lock_bytes`."""
    task = Task(task_id, kind, duration_us, memory_bytes, order=order, group=group,
                layer_type=layer_type)
    locks = (Lock(f"{task_id}#lock", task_id, (task_id,), lock_bytes),) if lock_bytes else ()
    return TaskGraph(tasks=(task,), locks=locks)


def chain_network(
    job: int,
    network: int,
    resident_bytes: Sequence[int],
    *,
    exec_bytes: int = 5,
    output_bytes: int = 5,
    load_us: int = 100,
    exec_us: int = 50,
    release_us: int = 0,
    layer_types: Sequence[str] | None = None,
    load_order_rule: bool = True,
    prefix: str = "",
) -> TaskGraph:
    """A chain of stages; stage i keeps resident_bytes[i] from its LOAD to its EXEC."""
    group = f"{prefix}j{job}/n{network}"
    tasks: list[Task] = []
    precedence: list[tuple[str, str]] = []
    locks: list[Lock] = []
    start_after: list[tuple[str, str]] = []
    for stage, resident in enumerate(resident_bytes):
        layer_type = layer_types[stage] if layer_types else "conv"
        load_id, exec_id = f"{group}/s{stage}/load", f"{group}/s{stage}/exec"
        common = dict(release_us=release_us, order=(job, network, stage), group=group,
                      job_id=job, network=f"n{network}", stage_id=f"s{stage}",
                      layer_type=layer_type)
        tasks.append(Task(load_id, TaskKind.LOAD, load_us, 0, **common))
        tasks.append(Task(exec_id, TaskKind.EXEC, exec_us, exec_bytes, **common))
        precedence.append((load_id, exec_id))
        locks.append(Lock(f"{load_id}#resident", load_id, (exec_id,), resident))
        if stage + 1 < len(resident_bytes):
            consumer = f"{group}/s{stage + 1}/exec"
            precedence.append((exec_id, consumer))
            locks.append(Lock(f"{exec_id}#outputs", exec_id, (consumer,), output_bytes))
            if load_order_rule:
                start_after.append((load_id, f"{group}/s{stage + 1}/load"))
        else:
            locks.append(Lock(f"{exec_id}#outputs", exec_id, (exec_id,), output_bytes))
    return TaskGraph(tuple(tasks), tuple(precedence), tuple(locks), tuple(start_after))


def merge(graphs: Sequence[TaskGraph]) -> TaskGraph:
    tasks: list[Task] = []
    precedence: list[tuple[str, str]] = []
    locks: list[Lock] = []
    start_after: list[tuple[str, str]] = []
    for graph in graphs:
        tasks += graph.tasks
        precedence += graph.precedence
        locks += graph.locks
        start_after += graph.start_after
    return TaskGraph(tuple(tasks), tuple(precedence), tuple(locks), tuple(start_after))


def random_workload(seed: int, *, jobs: int = 4, max_networks: int = 3,
                    max_stages: int = 5, interval_us: int = 300) -> TaskGraph:
    """Seeded random jobs of chain networks with conv/fc stages and staggered arrivals."""
    rng = np.random.default_rng(seed)
    graphs: list[TaskGraph] = []
    for job in range(jobs):
        for network in range(int(rng.integers(1, max_networks + 1))):
            stages = int(rng.integers(1, max_stages + 1))
            conv_stages = int(rng.integers(0, stages + 1))
            graphs.append(chain_network(
                job, network,
                [int(x) for x in rng.integers(5, 60, size=stages)],
                exec_bytes=int(rng.integers(1, 20)),
                output_bytes=int(rng.integers(0, 10)),
                load_us=int(rng.integers(10, 200)),
                exec_us=int(rng.integers(5, 100)),
                release_us=job * interval_us,
                layer_types=["conv"] * conv_stages + ["fc"] * (stages - conv_stages),
            ))
    return merge(graphs)


def solver_instance(tasks: Sequence[Task], *, workers: int, memory: int,
                    precedence: tuple[tuple[str, str], ...] = (),
                    locks: tuple[Lock, ...] = ()) -> Instance:
    """A solver instance (unit time and memory) from hand-written tasks."""
    graph = TaskGraph(tasks=tuple(tasks), precedence=precedence, locks=locks)
    return Instance(graph=graph, workers=workers, memory=memory, time_unit="unit",
                    memory_unit="unit", name="test")
