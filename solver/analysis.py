"""What is known about an instance before any search: bounds, symmetries, conflicts.

Owns the static facts the CP-SAT model adds as redundant constraints and the
search starts from: heads and tails of every task (earliest start, longest
path to the end), the static lower bounds on the makespan and on the jobs'
mean response (from the work, and from a device's storage), the classes of
interchangeable networks (for symmetry breaking) and cliques of tasks that
can never overlap (for redundant no-overlaps). Pure functions of the graph.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Mapping, Sequence
from itertools import pairwise

from masa.common.graphs import topological_order
from masa.sched.taskgraph import TaskGraph, TaskKind
from solver.instance import Instance, ancestor_sets, model_start_after, spanning_locks
from solver.schedules import job_releases


def heads_and_tails(graph: TaskGraph) -> tuple[dict[str, int], dict[str, int]]:
    """Earliest start (releases + chains) and tail (longest path to a sink incl. itself)."""
    order = topological_order([task.task_id for task in graph.tasks], graph.precedence)
    if order is None:
        raise ValueError("heads_and_tails needs acyclic precedence")
    predecessors: dict[str, list[str]] = {t: [] for t in order}
    successors: dict[str, list[str]] = {t: [] for t in order}
    for before, after in graph.precedence:
        predecessors[after].append(before)
        successors[before].append(after)
    head: dict[str, int] = {}
    for task_id in order:
        task = graph.by_id[task_id]
        head[task_id] = max([task.release_us] + [
            head[p] + graph.by_id[p].duration_us for p in predecessors[task_id]])
    tail: dict[str, int] = {}
    for task_id in reversed(order):
        tail[task_id] = graph.by_id[task_id].duration_us + max(
            [tail[s] for s in successors[task_id]], default=0)
    return head, tail


def static_lower_bound(instance: Instance) -> int:
    """The makespan no schedule can beat, from work and paths alone.

    The work bound ceil(work / workers); for each release r, r plus the work
    released at or after r shared by the workers; the longest chain of
    precedences from a release.
    """
    graph = instance.graph
    head, tail = heads_and_tails(graph)
    bound = max((head[t] + tail[t] for t in head), default=0)
    for release in {task.release_us for task in graph.tasks}:
        late_work = sum(t.duration_us for t in graph.tasks if t.release_us >= release)
        bound = max(bound, release + math.ceil(late_work / instance.workers))
    return bound


def mean_response_lower_bound_us(graph: TaskGraph, workers: int) -> float:
    """The mean job response (release to the end of its last task) no schedule beats.

    The larger of two relaxations, both without memory limits:
    - each job alone: at least its longest chain of precedences from its release,
      and its work shared by the workers; the mean over jobs;
    - work: the workers as one preemptive machine `workers` times as fast that
      ignores precedences, serving the job with the least remaining work first
      (SRPT, which minimises the sum of responses on one machine). Whatever the
      workers run in an interval, that machine can run too, so no schedule's
      sum is lower.
    """
    if not graph.tasks:
        return 0.0
    releases = job_releases(graph)
    head, tail = heads_and_tails(graph)
    path_us: dict[int, int] = dict.fromkeys(releases, 0)
    work_us: dict[int, int] = dict.fromkeys(releases, 0)
    for task in graph.tasks:
        job = task.job_id
        path_us[job] = max(path_us[job], head[task.task_id] + tail[task.task_id] - releases[job])
        work_us[job] += task.duration_us
    alone_us = sum(max(path_us[job], work_us[job] / workers) for job in releases)
    return max(alone_us, _srpt_response_sum_us(releases, work_us, workers)) / len(releases)


def _srpt_response_sum_us(releases: dict[int, int], work_us: dict[int, int],
                          speed: int) -> float:
    """Sum of responses of shortest-remaining-work-first on one machine of `speed`."""
    arrivals = sorted((releases[job], work_us[job] / speed) for job in releases)
    waiting: list[tuple[float, int]] = []  # (remaining time at `speed`, release)
    now = 0.0
    total = 0.0
    index = 0
    while index < len(arrivals) or waiting:
        if not waiting:
            now = max(now, arrivals[index][0])
        while index < len(arrivals) and arrivals[index][0] <= now:
            release, remaining = arrivals[index]
            heapq.heappush(waiting, (remaining, release))
            index += 1
        remaining, release = heapq.heappop(waiting)
        next_arrival = arrivals[index][0] if index < len(arrivals) else math.inf
        if now + remaining <= next_arrival:  # it finishes before anything else arrives
            now += remaining
            total += now - release
        else:  # run it until the next arrival, then choose again
            heapq.heappush(waiting, (remaining - (next_arrival - now), release))
            now = next_arrival
    return total


def least_missing_bytes(requests: Sequence[tuple[int, Hashable, int]],
                        room_bytes: int) -> int:
    """The fewest bytes that `requests` (time_us, item, item_bytes) must find missing from
    a cache of `room_bytes` that starts empty, whatever it keeps and evicts: offline
    caching in the bit model, where a request may find part of its item cached.

    The cache changes only at requests, so what helps a request is the part of its
    item kept since the item's previous request; each such interval (previous, this]
    holds its kept bytes at every request time inside it, and at each time the kept
    bytes fit in the room. Taking intervals by their right end and keeping as much of
    each as still fits is optimal for this packing (an exchange argument: a later-ending
    interval that shares a time with it also holds every later time of it, so a byte
    moved to the earlier-ending one never takes room the other would not), so the
    result is exact for the relaxation. A request's own item need not fit beside the
    kept bytes: a network is loaded one stage at a time.
    """
    times = sorted({time_us for time_us, _, _ in requests})
    index = {time_us: position for position, time_us in enumerate(times)}
    by_item: dict[Hashable, list[tuple[int, int]]] = {}
    for time_us, item, item_bytes in requests:
        by_item.setdefault(item, []).append((time_us, item_bytes))
    missing_bytes = 0
    intervals: list[tuple[int, int, int]] = []  # (first, end) point slice, item bytes
    for item_requests in by_item.values():
        item_requests.sort()
        missing_bytes += item_requests[0][1]  # the cache starts empty
        for (before_us, _), (time_us, item_bytes) in pairwise(item_requests):
            if time_us > before_us:  # requests at the same instant share one read
                intervals.append((index[before_us] + 1, index[time_us] + 1, item_bytes))
    room = [room_bytes] * len(times)
    for first, end, item_bytes in sorted(intervals, key=lambda interval: interval[1]):
        kept_bytes = min(item_bytes, min(room[first:end]))
        for point in range(first, end):
            room[point] -= kept_bytes
        missing_bytes += item_bytes - kept_bytes
    return missing_bytes


def stage_file_requests(graph: TaskGraph, file_bytes: Mapping[tuple[str, str], int]
                        ) -> list[tuple[int, str, int]]:
    """What each job asks of storage: (its release, a network it loads, the bytes of that
    network's stage files there, `file_bytes` by (network, stage_id)), one per network
    of each job (a job that runs a network twice reads its files once)."""
    releases = job_releases(graph)
    stages: dict[tuple[int, str], set[str]] = {}
    for task in graph.tasks:
        if task.kind is TaskKind.LOAD:
            stages.setdefault((task.job_id, task.network), set()).add(task.stage_id)
    return [(releases[job], network, sum(file_bytes[(network, stage)] for stage in ids))
            for (job, network), ids in sorted(stages.items())]


def storage_mean_response_lower_bound_us(requests: Sequence[tuple[int, Hashable, int]],
                                         job_count: int, room_bytes: int,
                                         read_bytes_per_s: float) -> float:
    """The mean job response no policy beats on a device whose storage reads at most
    `read_bytes_per_s`, whose page cache and process share `room_bytes`, and whose
    cache starts cold; `requests` are (arrival_us, network, bytes), one per network of
    each of `job_count` jobs, its bytes those of its stage files (no more than a loaded
    copy holds, if a policy may keep stages loaded instead).

    A job cannot end before the bytes of its networks' stage files that were not in
    memory at its arrival have been read, at no more than the storage's rate, so its
    response is at least those bytes over the rate; the sum over jobs is at least
    `least_missing_bytes`. It holds for policies that read a stage file only to load it
    for a job that has arrived (masa, bulk and deepeye); one that guessed the next
    jobs and read their files ahead could do better.
    """
    if job_count == 0:
        return 0.0
    missing_bytes = least_missing_bytes(requests, room_bytes)
    return missing_bytes * 1e6 / read_bytes_per_s / job_count


# ---------------------------------------------------------------- symmetry

def identical_groups(graph: TaskGraph) -> list[list[list[str]]]:
    """Classes of interchangeable networks: each class a list of groups, each a task list.

    Two groups (network instances) are interchangeable when their tasks, taken
    in instance order, match position by position (kind, duration, memory,
    release, job-free) with the same internal precedences, start_after pairs the
    model keeps and locks, and none of those connects them to any other group
    (a network's final outputs, kept until its job ends, link it to the job's
    other networks). Swapping two such
    groups maps every schedule to another one with the same makespan.
    """
    members: dict[str, list[str]] = {}
    for task in graph.tasks:
        if task.group:
            members.setdefault(task.group, []).append(task.task_id)
    crossing, internal_edges, internal_locks = _group_links(graph, members)
    signatures: dict[Hashable, list[list[str]]] = {}
    for group, task_ids in members.items():
        if group in crossing:
            continue
        position = {task_id: index for index, task_id in enumerate(task_ids)}
        tasks = tuple((graph.by_id[t].kind, graph.by_id[t].duration_us,
                       graph.by_id[t].memory_bytes, graph.by_id[t].release_us)
                      for t in task_ids)
        edges = tuple(sorted((position[a], position[b], kind)
                             for a, b, kind in internal_edges[group]))
        locks = tuple(sorted((position[f], tuple(sorted(position[u] for u in until)), m)
                             for f, until, m in internal_locks[group]))
        signatures.setdefault((tasks, edges, locks), []).append(task_ids)
    return [groups for groups in signatures.values() if len(groups) > 1]


_GroupLocks = dict[str, list[tuple[str, tuple[str, ...], int]]]


def _group_links(graph: TaskGraph, members: dict[str, list[str]]
                 ) -> tuple[set[str], dict[str, list[tuple[str, str, str]]], _GroupLocks]:
    """Groups linked to another group, and each group's internal edges and locks."""
    group_of = {task.task_id: task.group for task in graph.tasks}
    crossing: set[str] = set()
    internal_edges: dict[str, list[tuple[str, str, str]]] = {g: [] for g in members}
    edges = [(before, after, "precedence") for before, after in graph.precedence]
    edges += [(before, after, "start_after") for before, after in model_start_after(graph)]
    for before, after, kind in edges:
        if group_of[before] != group_of[after]:
            crossing |= {group_of[before], group_of[after]}
        elif group_of[before]:
            internal_edges[group_of[before]].append((before, after, kind))
    internal_locks: _GroupLocks = {g: [] for g in members}
    for lock in graph.locks:
        groups = {group_of[t] for t in (lock.from_task, *lock.until_tasks)}
        if len(groups) > 1:
            crossing |= groups
        elif group_of[lock.from_task]:
            internal_locks[group_of[lock.from_task]].append(
                (lock.from_task, lock.until_tasks, lock.memory_bytes))
    return crossing, internal_edges, internal_locks


def swappable_groups(graph: TaskGraph, classes: list[list[list[str]]], objective: str
                     ) -> list[list[list[str]]]:
    """The classes whose groups may be swapped without changing the objective.

    Makespan: all of them. Sum of job response times: swapping two groups of
    different jobs moves work between jobs, which is harmless only when each
    is its job's only group; otherwise only groups of the same job are swapped.
    """
    if objective == "makespan":
        return classes
    groups_of_job: dict[int, set[str]] = {}
    for task in graph.tasks:
        groups_of_job.setdefault(task.job_id, set()).add(task.group)
    result: list[list[list[str]]] = []
    for groups in classes:
        jobs = [graph.by_id[g[0]].job_id for g in groups]
        if len(set(jobs)) == len(jobs) and all(len(groups_of_job[j]) == 1 for j in jobs):
            result.append(groups)
            continue
        by_job: dict[int, list[list[str]]] = {}
        for job, group in zip(jobs, groups, strict=True):
            by_job.setdefault(job, []).append(group)
        result += [same_job for same_job in by_job.values() if len(same_job) > 1]
    return result


# ---------------------------------------------------------------- conflicts

def conflict_cliques(graph: TaskGraph, memory: int, limit: int | None = None
                     ) -> list[list[str]]:
    """Groups of tasks no two of which can ever run at the same time.

    Two tasks conflict when one must precede the other, or when the memory
    necessarily held while both run exceeds the budget: their direct memory
    plus every lock that spans each of them whatever the schedule (opened by
    the task or an ancestor, closed by the task or a descendant). Cliques of
    the conflict graph, grown greedily from the largest needs, become
    redundant no-overlap constraints: with a tight budget they carry the
    disjunctive reasoning (edge finding, LP cuts) that the memory cumulative,
    whose lock intervals have variable size, propagates only weakly.
    """
    ancestors = ancestor_sets(graph)
    spanning = spanning_locks(graph, ancestors)
    need = _needs(graph, spanning)
    neighbours = _conflicts(graph, memory, ancestors, spanning, need)
    by_need = sorted(neighbours, key=lambda t: (-need[t], -graph.by_id[t].duration_us, t))
    cliques: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    for seed in by_need:
        clique = [seed]
        common = set(neighbours[seed])
        for other in sorted(common, key=lambda t: (-graph.by_id[t].duration_us, t)):
            if other in common:
                clique.append(other)
                common &= neighbours[other]
        key = frozenset(clique)
        # A clique that only restates one precedence chain adds nothing.
        if len(clique) >= 3 and key not in seen and not _is_chain(clique, ancestors):
            seen.add(key)
            cliques.append(clique)
        if limit is not None and len(cliques) >= limit:
            break
    return cliques


def _needs(graph: TaskGraph, spanning: dict[str, set[int]]) -> dict[str, int]:
    """Memory each task holds while it runs, whatever the schedule (see conflict_cliques)."""
    return {tid: graph.by_id[tid].memory_bytes + sum(graph.locks[i].memory_bytes for i in locks)
            for tid, locks in spanning.items()}


def _conflicts(graph: TaskGraph, memory: int, ancestors: dict[str, set[str]],
               spanning: dict[str, set[int]], need: dict[str, int]) -> dict[str, set[str]]:
    """The conflict graph over the tasks that take time, as neighbour sets."""
    lock_memory = [lock.memory_bytes for lock in graph.locks]
    candidates = [t.task_id for t in graph.tasks if t.duration_us > 0]

    def conflict(a: str, b: str) -> bool:
        if a in ancestors[b] or b in ancestors[a]:
            return True
        shared = sum(lock_memory[i] for i in spanning[a] & spanning[b])
        return need[a] + need[b] - shared > memory

    return {a: {b for b in candidates if b != a and conflict(a, b)} for a in candidates}


def _is_chain(task_ids: list[str], ancestors: dict[str, set[str]]) -> bool:
    return all(a in ancestors[b] or b in ancestors[a]
               for i, a in enumerate(task_ids) for b in task_ids[i + 1:])
