"""Scheduling instances: the JSON format, its validation, and a seeded random generator.

An instance is a `masa.sched.taskgraph.TaskGraph` plus the two resources it is
scheduled on: `workers` identical workers and a `memory` budget. The JSON form
(docs/instance-format.md) is that graph serialised with integer durations (the
instance's time unit, microseconds for graphs built from profiles) and integer
memory (bytes for profiled graphs). This module owns:

- `instance_from_dict` / `load_instance`: validation with every problem and its
  JSON path (masa.common.errors.ErrorCollector), raising UserError;
- `instance_to_dict` / `write_instance`: the reverse, written atomically;
- `infeasibility_reasons`: structural reasons no schedule can exist (a task or
  lock alone larger than memory, cyclic precedence), reported before solving;
- `random_instance`: layered networks with load/exec(/unload) tasks drawn from
  a seeded numpy Generator, with knobs for memory tightness and load/exec
  time ratio (Raspberry-Pi-like loads that dominate).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from masa.common.atomic import atomic_write_text
from masa.common.errors import ErrorCollector, UserError, one_line
from masa.common.graphs import ancestors, find_cycle
from masa.sched.taskgraph import Lock, ScheduledTask, Task, TaskGraph, TaskKind

INSTANCE_KINDS = tuple(kind.value for kind in TaskKind)


@dataclass(frozen=True)
class Instance:
    """A task graph plus the resources it must fit: `workers` and `memory` (units)."""

    graph: TaskGraph
    workers: int
    memory: int  # budget in `memory_unit`
    time_unit: str = "us"
    memory_unit: str = "bytes"
    name: str = ""
    # Free-form provenance (generator parameters, source workload): not used by solving.
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_tasks(self) -> int:
        return len(self.graph.tasks)

    def with_resources(self, *, workers: int | None = None, memory: int | None = None
                       ) -> Instance:
        """The same graph on other resources (the CLI's --workers and --memory)."""
        return replace(self,
                       workers=self.workers if workers is None else workers,
                       memory=self.memory if memory is None else memory)


def graph_to_instance(graph: TaskGraph, *, workers: int, memory_bytes: int,
                      name: str = "") -> Instance:
    """An instance from a scheduler task graph (durations in us, memory in bytes)."""
    return Instance(graph=graph, workers=workers, memory=memory_bytes,
                    time_unit="us", memory_unit="bytes", name=name)


# ---------------------------------------------------------------- JSON -> Instance

def instance_from_dict(raw: Any, source: str = "<instance>") -> Instance:
    """Validate a decoded instance; raise UserError listing every problem with its path."""
    errors = ErrorCollector(source)
    if not isinstance(raw, dict):
        errors.add("", f"expected a JSON object with workers, memory and tasks, got {_kind(raw)}")
        errors.raise_if_any()
    workers = errors.get(raw, "workers", int, "")
    if workers is not None and workers < 1:
        errors.add("workers", f"expected an integer >= 1, got {workers}")
    memory = errors.get(raw, "memory", int, "")
    if memory is not None and memory < 0:
        errors.add("memory", f"expected an integer >= 0, got {memory}")
    time_unit = errors.get(raw, "time_unit", str, "", required=False, default="us")
    memory_unit = errors.get(raw, "memory_unit", str, "", required=False, default="bytes")
    name = errors.get(raw, "name", str, "", required=False, default="")
    meta = errors.get(raw, "meta", dict, "", required=False, default={})
    known_keys = {"workers", "memory", "tasks", "precedence", "locks", "start_after",
                  "time_unit", "memory_unit", "name", "meta"}
    for key in sorted(set(raw) - known_keys):
        errors.add(key, f"unknown field (expected one of {', '.join(sorted(known_keys))})")

    tasks = _tasks_from_raw(errors, raw.get("tasks"), "tasks" in raw)
    ids = {task.task_id for task in tasks}
    precedence = _pairs_from_raw(errors, raw.get("precedence", []), "precedence", ids)
    start_after = _pairs_from_raw(errors, raw.get("start_after", []), "start_after", ids)
    locks = _locks_from_raw(errors, raw.get("locks", []), ids)
    errors.raise_if_any()
    graph = TaskGraph(tasks=tuple(tasks), precedence=tuple(precedence), locks=tuple(locks),
                      start_after=tuple(start_after))
    cycle = find_cycle([task.task_id for task in tasks], graph.precedence)
    if cycle:
        errors.add("precedence", "cyclic precedence: " + " -> ".join(cycle))
        errors.raise_if_any()
    return Instance(graph=graph, workers=workers, memory=memory, time_unit=time_unit,
                    memory_unit=memory_unit, name=name, meta=dict(meta))


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), repr(value))


def _tasks_from_raw(errors: ErrorCollector, raw: Any, present: bool) -> list[Task]:
    if not present:
        errors.add("tasks", "missing field, expected a list of tasks")
        return []
    if not isinstance(raw, list):
        errors.add("tasks", f"expected a list of tasks, got {_kind(raw)}")
        return []
    tasks: list[Task] = []
    seen: set[str] = set()
    allowed = {"id", "kind", "duration", "memory", "release", "job", "group", "network",
               "stage", "layer_type", "order"}
    for index, item in enumerate(raw):
        path = f"tasks[{index}]"
        if not isinstance(item, dict):
            errors.add(path, f"expected an object with id, kind, duration and memory, "
                             f"got {_kind(item)}")
            continue
        for key in sorted(set(item) - allowed):
            errors.add(f"{path}.{key}", f"unknown field (expected one of "
                                        f"{', '.join(sorted(allowed))})")
        task_id = errors.get(item, "id", str, path)
        kind_text = errors.get(item, "kind", str, path)
        duration = errors.get(item, "duration", int, path)
        memory = errors.get(item, "memory", int, path)
        release = errors.get(item, "release", int, path, required=False, default=0)
        job = errors.get(item, "job", int, path, required=False, default=0)
        group = errors.get(item, "group", str, path, required=False, default="")
        network = errors.get(item, "network", str, path, required=False, default="")
        stage = errors.get(item, "stage", str, path, required=False, default="")
        layer_type = errors.get(item, "layer_type", str, path, required=False, default="other")
        order = errors.get(item, "order", list, path, required=False, default=[])
        if task_id is not None:
            if not task_id:
                errors.add(f"{path}.id", "expected a non-empty string")
            elif task_id in seen:
                errors.add(f"{path}.id", f"duplicate task id {task_id!r}")
            seen.add(task_id)
        kind = None
        if kind_text is not None:
            if kind_text in INSTANCE_KINDS:
                kind = TaskKind(kind_text)
            else:
                errors.add(f"{path}.kind", f"expected one of {', '.join(INSTANCE_KINDS)}, "
                                           f"got {kind_text!r}")
        for key, value in (("duration", duration), ("memory", memory), ("release", release),
                           ("job", job)):
            if value is not None and value < 0:
                errors.add(f"{path}.{key}", f"expected an integer >= 0, got {value}")
        if order and not all(isinstance(x, int) and not isinstance(x, bool) for x in order):
            errors.add(f"{path}.order", f"expected a list of integers, got {order!r}")
        if None in (task_id, kind, duration, memory, release, job) or not task_id:
            continue
        tasks.append(Task(task_id=task_id, kind=kind, duration_us=duration,
                          memory_bytes=memory, release_us=release, order=tuple(order or ()),
                          group=group or "", job_id=job, network=network or "",
                          stage_id=stage or "", layer_type=layer_type or "other"))
    return tasks


def _pairs_from_raw(errors: ErrorCollector, raw: Any, key: str, ids: set[str]
                    ) -> list[tuple[str, str]]:
    if not isinstance(raw, list):
        errors.add(key, f"expected a list of [before, after] pairs, got {_kind(raw)}")
        return []
    pairs: list[tuple[str, str]] = []
    for index, item in enumerate(raw):
        path = f"{key}[{index}]"
        if (not isinstance(item, list) or len(item) != 2
                or not all(isinstance(x, str) for x in item)):
            errors.add(path, f"expected a pair [before, after] of task ids, got {item!r}")
            continue
        ok = True
        for position, task_id in enumerate(item):
            if task_id not in ids:
                errors.add(f"{path}[{position}]", f"unknown task {task_id!r}")
                ok = False
        if item[0] == item[1]:
            errors.add(path, f"task {item[0]!r} cannot precede itself")
            ok = False
        if ok:
            pairs.append((item[0], item[1]))
    return pairs


def _locks_from_raw(errors: ErrorCollector, raw: Any, ids: set[str]) -> list[Lock]:
    if not isinstance(raw, list):
        errors.add("locks", f"expected a list of locks, got {_kind(raw)}")
        return []
    locks: list[Lock] = []
    lock_ids: set[str] = set()
    for index, item in enumerate(raw):
        path = f"locks[{index}]"
        if not isinstance(item, dict):
            errors.add(path, f"expected an object with from, until and memory, got {_kind(item)}")
            continue
        for key in sorted(set(item) - {"id", "from", "until", "memory"}):
            errors.add(f"{path}.{key}", "unknown field (expected id, from, until, memory)")
        from_task = errors.get(item, "from", str, path)
        until_raw = errors.get(item, "until", (str, list), path)
        memory = errors.get(item, "memory", int, path)
        lock_id = errors.get(item, "id", str, path, required=False, default=f"lock{index}")
        if from_task is not None and from_task not in ids:
            errors.add(f"{path}.from", f"unknown task {from_task!r}")
            from_task = None
        until: list[str] = []
        if isinstance(until_raw, str):
            until_raw = [until_raw]
        if isinstance(until_raw, list):
            if not until_raw:
                errors.add(f"{path}.until", "expected a task id or a non-empty list of task ids")
            for position, task_id in enumerate(until_raw):
                if not isinstance(task_id, str) or task_id not in ids:
                    errors.add(f"{path}.until[{position}]", f"unknown task {task_id!r}")
                else:
                    until.append(task_id)
        if memory is not None and memory < 0:
            errors.add(f"{path}.memory", f"expected an integer >= 0, got {memory}")
        if lock_id in lock_ids:
            errors.add(f"{path}.id", f"duplicate lock id {lock_id!r}")
        lock_ids.add(lock_id)
        if from_task is None or not until or memory is None or memory < 0:
            continue
        if isinstance(until_raw, list) and len(until) != len(until_raw):
            continue
        locks.append(Lock(lock_id=lock_id, from_task=from_task, until_tasks=tuple(until),
                          memory_bytes=memory))
    return locks


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (Python's reader accepts them)."""
    raise ValueError(f"{name} is not a JSON number")


def load_instance(path: str | Path) -> Instance:
    """Read and validate an instance JSON file (UserError names file and field)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"{source}: cannot read instance: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"{source}: not a text file (expected a JSON instance)") from None
    try:
        raw = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise UserError(f"{source}: line {error.lineno} column {error.colno}: "
                        f"invalid JSON: {error.msg}") from None
    except ValueError as error:  # an integer of more than 4300 digits, NaN, Infinity
        raise UserError(f"{source}: invalid JSON: {one_line(error)}") from None
    except RecursionError:
        raise UserError(f"{source}: invalid JSON: nested too deeply") from None
    instance = instance_from_dict(raw, source)
    return replace(instance, name=instance.name or Path(path).stem)


# ---------------------------------------------------------------- Instance -> JSON

def instance_to_dict(instance: Instance) -> dict[str, Any]:
    """The JSON form; optional fields are written only when they differ from defaults."""
    tasks: list[dict[str, Any]] = []
    for task in instance.graph.tasks:
        item: dict[str, Any] = {"id": task.task_id, "kind": task.kind.value,
                                "duration": task.duration_us, "memory": task.memory_bytes}
        optional = (("release", task.release_us, 0), ("job", task.job_id, 0),
                    ("group", task.group, ""), ("network", task.network, ""),
                    ("stage", task.stage_id, ""), ("layer_type", task.layer_type, "other"),
                    ("order", list(task.order), []))
        for key, value, default in optional:
            if value != default:
                item[key] = value
        tasks.append(item)
    raw: dict[str, Any] = {}
    if instance.name:
        raw["name"] = instance.name
    raw.update({"workers": instance.workers, "memory": instance.memory,
                "time_unit": instance.time_unit, "memory_unit": instance.memory_unit,
                "tasks": tasks,
                "precedence": [list(pair) for pair in instance.graph.precedence],
                "locks": [{"id": lock.lock_id, "from": lock.from_task,
                           "until": lock.until_tasks[0] if len(lock.until_tasks) == 1
                           else list(lock.until_tasks),
                           "memory": lock.memory_bytes} for lock in instance.graph.locks]})
    if instance.graph.start_after:
        raw["start_after"] = [list(pair) for pair in instance.graph.start_after]
    if instance.meta:
        raw["meta"] = instance.meta
    return raw


def write_instance(instance: Instance, path: str | Path) -> None:
    atomic_write_text(path, json.dumps(instance_to_dict(instance), indent=1) + "\n")


# ---------------------------------------------------------------- start_after

def is_load_order(graph: TaskGraph, pair: tuple[str, str]) -> bool:
    """Whether a start_after pair is the LOAD order rule (LOAD -> LOAD), which
    restricts only the heuristic; the solver ignores it."""
    return all(graph.by_id[task_id].kind is TaskKind.LOAD for task_id in pair)


def model_start_after(graph: TaskGraph) -> tuple[tuple[str, str], ...]:
    """The start_after pairs that are part of the model and that the solver keeps:
    all but the LOAD order rule (e.g. the EXEC that opens a network instance's
    inputs lock starts first among the EXECs reading a network input)."""
    return tuple(pair for pair in graph.start_after if not is_load_order(graph, pair))


def without_load_order(graph: TaskGraph) -> TaskGraph:
    """The graph the solver schedules and its schedules are checked against:
    the LOAD order rule dropped, every other start_after kept."""
    kept = model_start_after(graph)
    return graph if len(kept) == len(graph.start_after) else replace(graph, start_after=kept)


def closing_tasks(lock: Lock, ancestors: dict[str, set[str]]) -> tuple[str, ...]:
    """The until-tasks that decide when the lock ends, in any schedule: those that
    are no ancestor of another until-task (an ancestor always ends first)."""
    until = set(lock.until_tasks)
    return tuple(u for u in dict.fromkeys(lock.until_tasks)
                 if not any(u in ancestors[other] for other in until if other != u))


# ---------------------------------------------------------------- time reversal

def mirrored(instance: Instance) -> Instance | None:
    """The instance with time running backwards, or None if it has no exact mirror.

    A schedule of the mirror read backwards (`mirror_schedule`) is a schedule
    of the original with the same makespan, and the other way round:
    precedence turns around, and a lock held from start(from) to end(until)
    is held from the mirrored start of `until` to the mirrored end of `from`.
    That needs every lock to end with one until-task (`closing_tasks`), its
    from-task or one descending from it (true of every graph the random
    generator builds, and of masa.sched.jobs graphs of one-network jobs whose
    networks have one final stage), no start_after the solver keeps (a
    start-to-start rule turns into an end-to-end one), and one common release
    (the mirror starts at 0; add it back). The heuristic-only LOAD order rule
    is dropped, as the solver drops it.
    """
    graph = instance.graph
    if len({task.release_us for task in graph.tasks}) > 1 or model_start_after(graph):
        return None
    ancestors = ancestor_sets(graph)
    closing: list[str] = []
    for lock in graph.locks:
        last = closing_tasks(lock, ancestors)
        if len(last) != 1 or lock.from_task not in ancestors[last[0]] | {last[0]}:
            return None
        closing.append(last[0])
    mirror = TaskGraph(
        tasks=tuple(replace(task, release_us=0) for task in graph.tasks),
        precedence=tuple((after, before) for before, after in graph.precedence),
        locks=tuple(Lock(lock.lock_id, last, (lock.from_task,), lock.memory_bytes)
                    for lock, last in zip(graph.locks, closing, strict=True)))
    return replace(instance, graph=mirror)


def mirror_schedule(schedule: Iterable[ScheduledTask], end_us: int) -> list[ScheduledTask]:
    """Read a schedule backwards from `end_us`: [s, e) becomes [end_us - e, end_us - s).

    Its own inverse with the same `end_us`: the original's makespan (its
    common release plus the mirror's makespan, going back).
    """
    return [ScheduledTask(item.task_id, item.worker, end_us - item.end_us,
                          end_us - item.start_us) for item in schedule]


# ---------------------------------------------------------------- feasibility

def ancestor_sets(graph: TaskGraph) -> dict[str, set[str]]:
    """For each task, every task that must end before it starts (transitive precedence)."""
    return ancestors([task.task_id for task in graph.tasks], graph.precedence)


def spanning_locks(graph: TaskGraph, ancestors: dict[str, set[str]] | None = None
                   ) -> dict[str, set[int]]:
    """For each task, the indices of the locks held across its whole run, in any schedule.

    A lock spans a task when it is opened by the task or one of its ancestors
    (so it is held from before the task starts) and closed by the task or one
    of its descendants (so it is held until after the task ends).
    """
    ancestors = ancestor_sets(graph) if ancestors is None else ancestors
    spanning: dict[str, set[int]] = {task.task_id: set() for task in graph.tasks}
    for index, lock in enumerate(graph.locks):
        closers = set(lock.until_tasks)
        for task in graph.tasks:
            tid = task.task_id
            opened = lock.from_task == tid or lock.from_task in ancestors[tid]
            if opened and (tid in closers or any(tid in ancestors[u] for u in closers)):
                spanning[tid].add(index)
    return spanning


def held_during(graph: TaskGraph, task_id: str,
                spanning: dict[str, set[int]] | None = None) -> int:
    """Memory that must be held while `task_id` runs, whatever the schedule.

    Its own direct memory plus every lock spanning it (see `spanning_locks`):
    those it opens or closes, and e.g. a stage's resident weights while an
    earlier task of the same chain runs between its load and its exec.
    """
    spanning = spanning_locks(graph) if spanning is None else spanning
    return graph.by_id[task_id].memory_bytes + sum(
        graph.locks[index].memory_bytes for index in spanning[task_id])


def infeasibility_reasons(instance: Instance) -> list[str]:
    """Reasons no schedule can exist, each naming the task or lock; [] if none found.

    These are necessary conditions only; CP-SAT may still prove INFEASIBLE for
    subtler reasons (reported as a status, not as an error).
    """
    graph = instance.graph
    unit = instance.memory_unit
    cycle = find_cycle([task.task_id for task in graph.tasks], graph.precedence)
    if cycle:
        return ["cyclic precedence: " + " -> ".join(cycle)]
    reasons: list[str] = []
    for lock in graph.locks:
        if lock.memory_bytes > instance.memory:
            reasons.append(f"lock {lock.lock_id!r} ({lock.from_task} until "
                           f"{', '.join(lock.until_tasks)}) holds {lock.memory_bytes} {unit}, "
                           f"more than the memory budget {instance.memory} {unit}")
    spanning = spanning_locks(graph)
    for task in graph.tasks:
        need = held_during(graph, task.task_id, spanning)
        if need > instance.memory:
            reasons.append(f"task {task.task_id!r} needs {need} {unit} while it runs "
                           f"(direct {task.memory_bytes} plus the locks held across it), "
                           f"more than the memory budget {instance.memory} {unit}")
    return reasons


def check_feasible(instance: Instance) -> None:
    """Raise UserError (one line) if the instance is structurally infeasible."""
    reasons = infeasibility_reasons(instance)
    if reasons:
        more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
        where = instance.name or "instance"
        raise UserError(f"{where}: infeasible: {reasons[0]}{more}")


def minimum_memory(graph: TaskGraph) -> int:
    """The smallest budget that passes `infeasibility_reasons` (largest single need)."""
    spanning = spanning_locks(graph)
    needs = [held_during(graph, task.task_id, spanning) for task in graph.tasks]
    needs += [lock.memory_bytes for lock in graph.locks]
    return max(needs, default=0)


# ---------------------------------------------------------------- random generator

@dataclass(frozen=True)
class RandomSpec:
    """Parameters of `random_instance` (the CLI's --random key=value list)."""

    networks: int = 2
    layers: int = 4
    seed: int = 1
    workers: int = 2
    # Budget = ceil(tightness * the largest single need). 1.0 is the least
    # feasible budget; ~1.2 is memory-tight (hard), >= 5 is effectively loose.
    tightness: float = 1.5
    # Mean load duration / mean exec duration. Raspberry Pi SD-card loads
    # dominate execution: use load_ratio=4 or more for Pi-like instances.
    load_ratio: float = 1.0
    unload: bool = False  # add an UNLOAD task per stage (the paper's 3 task kinds)
    identical: bool = False  # every network a copy of the first (symmetric instance)
    release_gap: int = 0  # network i (job i) is released at i * release_gap
    # LOAD(s) starts no earlier than LOAD(s-1) starts: the LOAD order rule that
    # masa.sched.jobs puts into every real job graph (start_after; the solver ignores
    # it, only the heuristic obeys it). Off: loads in any order, as in format 1
    # instances written before the rule existed.
    load_order: bool = True

    @property
    def tasks_per_network(self) -> int:
        return self.layers * (3 if self.unload else 2)


def parse_random_spec(text: str) -> RandomSpec:
    """'networks=2,layers=4,seed=1' -> RandomSpec; UserError naming a bad key or value."""
    fields = {name: type(value) for name, value in RandomSpec().__dict__.items()}
    values: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise UserError(f"--random: at {part!r}: expected key=value with key one of "
                            f"{', '.join(fields)}")
        kind = fields[key]
        try:
            if kind is bool:
                if value.strip().lower() not in ("0", "1", "true", "false", "yes", "no"):
                    raise ValueError(value)
                values[key] = value.strip().lower() in ("1", "true", "yes")
            else:
                values[key] = kind(value)
        except ValueError:
            raise UserError(f"--random: at {key!r}: expected {kind.__name__}, got {value!r}"
                            ) from None
    spec = RandomSpec(**values)
    for key in ("networks", "layers", "workers"):
        if getattr(spec, key) < 1:
            raise UserError(f"--random: at {key!r}: expected an integer >= 1")
    if spec.tightness < 1.0:
        raise UserError("--random: at 'tightness': expected a number >= 1.0 "
                        "(below 1 no schedule fits)")
    if spec.load_ratio <= 0 or spec.release_gap < 0:
        raise UserError("--random: load_ratio must be > 0 and release_gap >= 0")
    return spec


def _random_layers(rng: np.random.Generator, layers: int, load_ratio: float
                   ) -> list[dict[str, int | str]]:
    """Per-layer costs of one network: convs (light weights, long execs) then FCs."""
    conv_layers = max(1, math.ceil(layers * 0.6)) if layers > 1 else 1
    result: list[dict[str, int | str]] = []
    for index in range(layers):
        conv = index < conv_layers
        weights = int(rng.integers(1, 11)) if conv else int(rng.integers(15, 41))
        exec_d = int(rng.integers(4, 16)) if conv else int(rng.integers(1, 5))
        working = int(rng.integers(2, 9)) if conv else int(rng.integers(1, 4))
        output = int(rng.integers(1, 6)) if conv else int(rng.integers(1, 3))
        # Load time grows with the weights (file read + session creation).
        load_d = max(1, round(load_ratio * (2 + weights * 0.4) * float(rng.uniform(0.7, 1.3))))
        result.append({"type": "conv" if conv else "fc", "weights": weights, "exec": exec_d,
                       "working": working, "output": output, "load": load_d,
                       "unload": int(rng.integers(1, 3))})
    return result


def random_instance(spec: RandomSpec) -> Instance:
    """Layered networks as a task graph, drawn from numpy's Generator seeded by spec.seed.

    Per stage s of network n: LOAD (direct memory = the weights' transient copy,
    lock of the resident weights until EXEC ends, or until UNLOAD ends when
    unload tasks are on), EXEC (working memory while it runs, lock of its
    output until the next stage's EXEC ends), optional UNLOAD. Precedence:
    LOAD(s) -> EXEC(s), EXEC(s-1) -> EXEC(s), EXEC(s) -> UNLOAD(s); with
    spec.load_order, start_after LOAD(s-1) -> LOAD(s) as in masa.sched.jobs.
    """
    rng = np.random.default_rng(spec.seed)
    first = _random_layers(rng, spec.layers, spec.load_ratio)
    tasks: list[Task] = []
    precedence: list[tuple[str, str]] = []
    locks: list[Lock] = []
    start_after: list[tuple[str, str]] = []
    for net in range(spec.networks):
        layers = first if (spec.identical or net == 0) else _random_layers(
            rng, spec.layers, spec.load_ratio)
        group = f"n{net}"
        release = net * spec.release_gap
        for index, layer in enumerate(layers):
            stage = f"s{index + 1}"
            load, run, unload = (f"{group}.{stage}.load", f"{group}.{stage}.exec",
                                 f"{group}.{stage}.unload")
            common = {"release_us": release, "group": group, "job_id": net,
                      "network": group, "stage_id": stage, "layer_type": str(layer["type"])}
            tasks.append(Task(load, TaskKind.LOAD, int(layer["load"]), int(layer["weights"]),
                              order=(net, index, 0), **common))
            tasks.append(Task(run, TaskKind.EXEC, int(layer["exec"]), int(layer["working"]),
                              order=(net, index, 1), **common))
            precedence.append((load, run))
            weights_until = run
            if spec.unload:
                tasks.append(Task(unload, TaskKind.UNLOAD, int(layer["unload"]), 0,
                                  order=(net, index, 2), **common))
                precedence.append((run, unload))
                weights_until = unload
            locks.append(Lock(f"{group}.{stage}.weights", load, (weights_until,),
                              int(layer["weights"])))
            if index > 0:
                previous = f"{group}.s{index}.exec"
                precedence.append((previous, run))
                if spec.load_order:
                    start_after.append((f"{group}.s{index}.load", load))
                locks.append(Lock(f"{group}.s{index}.output", previous, (run,),
                                  int(layers[index - 1]["output"])))
    graph = TaskGraph(tasks=tuple(tasks), precedence=tuple(precedence), locks=tuple(locks),
                      start_after=tuple(start_after))
    memory = math.ceil(spec.tightness * minimum_memory(graph))
    name = (f"random-n{spec.networks}-l{spec.layers}-s{spec.seed}-t{spec.tightness:g}"
            f"{'-u' if spec.unload else ''}{'-i' if spec.identical else ''}")
    return Instance(graph=graph, workers=spec.workers, memory=memory, time_unit="unit",
                    memory_unit="unit", name=name, meta={"random": spec.__dict__.copy()})
