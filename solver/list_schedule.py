"""Quick list schedules of an instance: upper bounds and hints for the CP-SAT solver.

Owns a serial schedule-generation scheme (serial SGS) for the Masa task
model and the priority rules it is run with. Tasks are placed one at a
time, each at the earliest instant where its worker, direct memory and the
locks it opens fit, given everything placed so far (so a later task may
fill an earlier hole). A lock whose until-tasks are not all placed yet is
held "to infinity"; placing its last until-task cuts it back to its real
end. A LOAD is placed together with the EXEC that closes its lock, the load
as late as still lets that exec start at its earliest: a load started early
only holds its weights longer.

Why here and not the `masa` policy: on memory-tight instances the online
heuristic over-commits memory (its schedule is then no valid hint) or
leaves a poor upper bound, and CP-SAT's own first solutions are far from
the optimum; a few dozen list schedules cost well under a second.

Pure code: no clocks, threads or I/O; randomised rules draw from a seeded
numpy Generator, so the result depends only on the instance and the seed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

import numpy as np

from masa.sched.taskgraph import ScheduledTask, TaskKind
from solver.analysis import heads_and_tails
from solver.instance import Instance, mirrored, model_start_after, spanning_locks
from solver.schedules import schedule_makespan, with_workers

_INF = math.inf
# Forward-backward improvement is tried on this many of the best schedules.
_JUSTIFIED = 4


class _Profile:
    """Worker and memory usage as step functions over [0, inf).

    Segment i covers [times[i], times[i + 1]) (the last one runs to infinity).
    """

    def __init__(self) -> None:
        self.times: list[int] = [0]
        self.busy: list[int] = [0]
        self.memory: list[int] = [0]

    def _split(self, time: int) -> int:
        """Index of the segment that starts at `time` (created if needed)."""
        index = bisect.bisect_right(self.times, time) - 1
        if self.times[index] == time:
            return index
        self.times.insert(index + 1, time)
        self.busy.insert(index + 1, self.busy[index])
        self.memory.insert(index + 1, self.memory[index])
        return index + 1

    def add(self, start: int, end: float, memory: int, busy: int) -> None:
        if end <= start:
            return
        first = self._split(start)
        last = len(self.times) if end == _INF else self._split(int(end))
        for index in range(first, last):
            self.memory[index] += memory
            self.busy[index] += busy

    def _range(self, start: int, end: float) -> range:
        first = bisect.bisect_right(self.times, start) - 1
        last = len(self.times) if end == _INF else bisect.bisect_left(self.times, end)
        return range(first, last)

    def max_memory(self, start: int, end: float) -> int:
        if end <= start:
            return 0
        return max(self.memory[i] for i in self._range(start, end))

    def max_busy(self, start: int, end: float) -> int:
        if end <= start:
            return 0
        return max(self.busy[i] for i in self._range(start, end))

    def candidates(self, earliest: int) -> list[int]:
        """`earliest` and every breakpoint after it: the only starts worth trying."""
        index = bisect.bisect_right(self.times, earliest)
        return [earliest] + self.times[index:]


class _Builder:
    """One run of the serial SGS; `order_key` ranks the eligible tasks (lowest first)."""

    def __init__(self, instance: Instance, order_key: Callable[[str], tuple]) -> None:
        graph = instance.graph
        self.graph = graph
        self.workers = instance.workers
        self.budget = instance.memory
        self.key = order_key
        self.duration = {t.task_id: t.duration_us for t in graph.tasks}
        self.direct = {t.task_id: t.memory_bytes for t in graph.tasks}
        self.release = {t.task_id: t.release_us for t in graph.tasks}
        self.preds: dict[str, list[str]] = {t.task_id: [] for t in graph.tasks}
        for before, after in graph.precedence:
            self.preds[after].append(before)
        # Start-to-start predecessors the model keeps (not the LOAD order rule).
        self.start_preds: dict[str, list[str]] = {t.task_id: [] for t in graph.tasks}
        for before, after in model_start_after(graph):
            self.start_preds[after].append(before)
        self.opens: dict[str, list[int]] = {t.task_id: [] for t in graph.tasks}
        self.closes: dict[str, list[int]] = {t.task_id: [] for t in graph.tasks}
        for index, lock in enumerate(graph.locks):
            if lock.memory_bytes:
                self.opens[lock.from_task].append(index)
                for until in lock.until_tasks:
                    self.closes[until].append(index)
        self.profile = _Profile()
        self.start: dict[str, int] = {}
        # Lock index -> the end it currently has in the profile (inf while open).
        self.lock_end: dict[int, float] = {}

    # ---- locks
    def _lock_final_end(self, index: int) -> float:
        """The lock's end if every task it depends on is placed, else inf."""
        lock = self.graph.locks[index]
        ids = (lock.from_task, *lock.until_tasks)
        if any(t not in self.start for t in ids):
            return _INF
        return max(self.start[t] + self.duration[t] for t in ids)

    def _commit(self, task_id: str, start: int) -> None:
        self.start[task_id] = start
        end = start + self.duration[task_id]
        self.profile.add(start, end, self.direct[task_id], 1 if end > start else 0)
        for index in self.opens[task_id]:
            final = self._lock_final_end(index)
            self.profile.add(start, final, self.graph.locks[index].memory_bytes, 0)
            self.lock_end[index] = final
        for index in self.closes[task_id]:
            if index not in self.lock_end or self.lock_end[index] != _INF:
                continue
            final = self._lock_final_end(index)
            if final != _INF:
                lock = self.graph.locks[index]
                # Held to infinity so far: give back everything after its real end.
                self.profile.add(int(final), _INF, -lock.memory_bytes, 0)
                self.lock_end[index] = final

    def _opened_memory(self, task_id: str) -> int:
        return sum(self.graph.locks[i].memory_bytes for i in self.opens[task_id])

    def _fits(self, task_id: str, start: int, *, opened_until: float = _INF,
              extra: int = 0) -> bool:
        """Can `task_id` start at `start`? Its locks held until `opened_until`,
        `extra` memory held beside it while it runs."""
        end = start + self.duration[task_id]
        opened = self._opened_memory(task_id)
        if end > start:
            if self.profile.max_busy(start, end) + 1 > self.workers:
                return False
            if (self.profile.max_memory(start, end) + self.direct[task_id] + opened + extra
                    > self.budget):
                return False
        return not (opened and self.profile.max_memory(end, opened_until) + opened
                    > self.budget)

    def _earliest(self, task_id: str) -> int:
        return max([self.release[task_id]] + [
            self.start[p] + self.duration[p] for p in self.preds[task_id]] + [
            self.start[p] for p in self.start_preds[task_id]])

    def place(self, task_id: str) -> bool:
        for start in self.profile.candidates(self._earliest(task_id)):
            if self._fits(task_id, start):
                self._commit(task_id, start)
                return True
        return False

    def place_pair(self, load: str, run: str, lock_memory: int) -> bool:
        """Place `load` and the task `run` that closes its lock, load just in time."""
        earliest_load = self._earliest(load)
        earliest_run = max([self.release[run], earliest_load + self.duration[load]] + [
            self.start[p] + self.duration[p] for p in self.preds[run] if p != load] + [
            self.start[p] for p in self.start_preds[run]])
        load_d = self.duration[load]
        # The exec starts at its earliest, at a breakpoint, or right after a
        # load that starts at a breakpoint.
        run_starts = set(self.profile.candidates(earliest_run))
        run_starts.update(t + load_d for t in self.profile.times if t + load_d > earliest_run)
        for run_start in sorted(run_starts):
            # `run` holds the load's lock while it runs (plus its own needs).
            if not self._fits(run, run_start, extra=lock_memory):
                continue
            latest = run_start - load_d
            tries = {latest, earliest_load}
            tries.update(t for t in self.profile.times if earliest_load <= t <= latest)
            tries.update(t - load_d for t in self.profile.times
                         if earliest_load <= t - load_d <= latest)
            for load_start in sorted(tries, reverse=True):
                # The lock must fit from the load's start until `run` ends; the
                # further left, the more it must fit, so stop at the first miss.
                lock_from = load_start + load_d
                if (lock_from < run_start and self.profile.max_memory(lock_from, run_start)
                        + lock_memory > self.budget):
                    break
                if self._fits(load, load_start, opened_until=run_start):
                    self._commit(load, load_start)
                    self._commit(run, run_start)
                    return True
        return False

    def run(self) -> dict[str, int] | None:
        graph = self.graph
        succ: dict[str, list[str]] = {t.task_id: [] for t in graph.tasks}
        for before, after in graph.precedence:
            succ[before].append(after)
        # A task becomes eligible once its predecessors of both kinds are placed.
        unlocks = {t: list(children) for t, children in succ.items()}
        for before, after in model_start_after(graph):
            unlocks[before].append(after)
        waiting = {t: len(p) + len(self.start_preds[t]) for t, p in self.preds.items()}
        # A lock-opening task with one lock-closing successor goes with it.
        partner: dict[str, tuple[str, int]] = {}
        for task_id, indices in self.opens.items():
            if graph.by_id[task_id].kind != TaskKind.LOAD or not indices:
                continue
            closers = {u for i in indices for u in graph.locks[i].until_tasks}
            if len(closers) == 1:
                (closer,) = closers
                if closer in succ[task_id]:
                    partner[task_id] = (closer, sum(graph.locks[i].memory_bytes
                                                    for i in indices))
        eligible = {t for t, n in waiting.items() if n == 0}

        def ready_pair(task_id: str) -> bool:
            closer = partner[task_id][0]
            return all(p == task_id or p in self.start
                       for p in self.preds[closer] + self.start_preds[closer])

        while eligible:
            # Defer a load until its exec could follow it (otherwise its
            # lock would stay open), unless nothing else can go.
            usable = [t for t in eligible if t not in partner or ready_pair(t)] or list(eligible)
            task_id = min(usable, key=self.key)
            placed = [task_id]
            if task_id in partner and ready_pair(task_id):
                closer, memory = partner[task_id]
                if not self.place_pair(task_id, closer, memory):
                    return None
                placed.append(closer)
            elif not self.place(task_id):
                return None
            for done in placed:
                eligible.discard(done)
                for child in unlocks[done]:
                    waiting[child] -= 1
                    if waiting[child] == 0 and child not in self.start:
                        eligible.add(child)
        if len(self.start) != len(graph.tasks):
            return None
        return self.start


def list_schedules(instance: Instance, *, seed: int = 0
                   ) -> list[tuple[str, tuple[ScheduledTask, ...]]]:
    """Schedules of the instance from several priority rules, as (rule name, schedule).

    Rules: longest remaining path first (`tail`), largest memory need first
    (`memory`), network by network in instance order (`network`), and
    randomised tails (tail times a factor in [0.5, 1.5) from a Generator
    seeded by `seed`; `random0`, `random1`, ...). A rule whose run gets stuck
    (locks left open fill the memory) yields nothing. Workers are numbered by
    interval colouring. Every schedule respects precedence, releases, workers
    and memory by construction; callers that use one as an upper bound should
    still check it (masa.sched.checker). The best few (by makespan) are then
    improved by forward-backward passes, added as `<rule>+fbi` when better.
    """
    graph = instance.graph
    if not graph.tasks:
        return []
    tail = heads_and_tails(graph)[1]
    spanning = spanning_locks(graph)
    need = {t.task_id: t.memory_bytes + sum(graph.locks[i].memory_bytes
                                            for i in spanning[t.task_id])
            for t in graph.tasks}
    position = {t.task_id: i for i, t in enumerate(graph.tasks)}
    rules: list[tuple[str, Callable[[str], tuple]]] = [
        ("tail", lambda t: (-tail[t], -need[t], position[t])),
        ("memory", lambda t: (-need[t], -tail[t], position[t])),
        ("network", lambda t: (graph.by_id[t].order, position[t])),
    ]
    # About as many placements in all as 64 runs on 80 tasks: cheap.
    samples = max(4, min(64, 5000 // len(graph.tasks)))
    rng = np.random.default_rng(seed)
    for sample in range(samples):
        factor = dict(zip(graph.by_id, rng.uniform(0.5, 1.5, len(graph.tasks)), strict=True))
        rules.append((f"random{sample}",
                      lambda t, f=factor: (-tail[t] * f[t], position[t])))
    found: list[tuple[str, tuple[ScheduledTask, ...]]] = []
    for name, key in rules:
        starts = _Builder(instance, key).run()
        if starts is not None:
            found.append((name, _as_schedule(instance, starts)))
    # Forward-backward improvement of the best few (makespan): cheap, and on
    # tight instances it closes much of the gap the priority rules leave.
    reverse = mirrored(instance)
    if reverse is not None:
        ranked = sorted(found, key=lambda item: schedule_makespan(item[1]))[:_JUSTIFIED]
        for name, schedule in ranked:
            improved = _forward_backward(instance, reverse, schedule)
            if improved is not None:
                found.append((f"{name}+fbi", improved))
    return found


def _as_schedule(instance: Instance, starts: dict[str, int]) -> tuple[ScheduledTask, ...]:
    ends = {t: s + instance.graph.by_id[t].duration_us for t, s in starts.items()}
    return with_workers(starts, ends, instance.workers)


def _forward_backward(instance: Instance, reverse: Instance,
                      schedule: Sequence[ScheduledTask], rounds: int = 3
                      ) -> tuple[ScheduledTask, ...] | None:
    """Double justification: re-run the SGS backwards by latest end first, then
    forwards by earliest start first, keeping the best schedule; None if no gain."""
    best = tuple(schedule)
    current = best
    position = {t.task_id: i for i, t in enumerate(instance.graph.tasks)}
    for _ in range(rounds):
        end = {item.task_id: item.end_us for item in current}
        backward = _Builder(reverse, lambda t, e=end: (-e[t], position[t])).run()
        if backward is None:
            break
        finish = max(s + reverse.graph.by_id[t].duration_us for t, s in backward.items())
        start = {t: finish - s - reverse.graph.by_id[t].duration_us
                 for t, s in backward.items()}
        forward = _Builder(instance, lambda t, b=start: (b[t], position[t])).run()
        if forward is None:
            break
        current = _as_schedule(instance, forward)
        if schedule_makespan(current) >= schedule_makespan(best):
            break
        best = current
    return best if schedule_makespan(best) < schedule_makespan(schedule) else None


def best_list_schedule(instance: Instance, objective: Callable[[Sequence[ScheduledTask]], int],
                       *, seed: int = 0) -> tuple[str, tuple[ScheduledTask, ...]] | None:
    """The list schedule with the lowest `objective` (ties: first rule), or None."""
    found = list_schedules(instance, seed=seed)
    if not found:
        return None
    return min(found, key=lambda item: objective(item[1]))
