"""Which loaded stages stay loaded between jobs when not all of them fit.

Owns the choice of pinned stages (`pinned_stages`) and the per-stage record it
reads (`StageUse`). masa.sched.core keeps every loaded stage while all the stages
the jobs load fit in the keep bound; past that, keeping each stage until memory
is needed is LRU on a cycle larger than the cache: every kept stage is evicted
just before its next use. Instead the core keeps a fixed set, the stages that
save the most LOAD time per byte they hold, counted by how often the jobs load
them, while the rest still find room to load: every worker may load the largest
of the other stages at once beside the pinned ones. Pure: plain data in and out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Stage = tuple[str, str]  # (network, stage_id)


@dataclass(slots=True)
class StageUse:
    """A stage as the jobs load it (from its LOAD tasks)."""

    load_us: int  # the LOAD's profiled duration: what a kept copy saves per use
    resident_bytes: int  # what a loaded (or kept) copy holds
    footprint_bytes: int  # what its LOAD reserves while it runs (resident + direct)
    recent_loads: float = 0.0  # LOADs added lately (halved as jobs go by: `age_uses`)

    def saved_us_per_byte(self) -> float:
        """What keeping the stage is worth: LOAD time saved per resident byte held."""
        return self.load_us * self.recent_loads / max(1, self.resident_bytes)


def pinned_stages(uses: Mapping[Stage, StageUse], keep_bytes: int, budget_bytes: int,
                  workers: int, exec_bytes: int = 0) -> frozenset[Stage]:
    """The stages to keep loaded: the longest run of stages, by LOAD time saved per
    resident byte (load_us x recent_loads / resident_bytes, highest first), whose
    resident bytes stay within `keep_bytes` and, plus `workers` x the largest LOAD
    footprint among the others plus `exec_bytes` (the largest EXEC footprint, which
    masa's headroom rule keeps room for), within `budget_bytes`: every worker can
    still load one of the others. Greedy by value density, as for a knapsack; empty
    when nothing fits that way. (Measured on the simulated grid with 32 MiB slices:
    room for 1.5 LOADs instead of `workers` = 2 pinned more and made lifelogging and
    stochastic II at 512 MiB 1.6-1.7x slower; room for 3 or 4 pinned less and was up
    to 27% slower.)"""
    ranked = sorted(uses.items(), key=lambda item: (-item[1].saved_us_per_byte(), item[0]))
    # largest_after[i]: the largest LOAD footprint among ranked[i:], the unpinned ones.
    largest_after = [0] * (len(ranked) + 1)
    for index in range(len(ranked) - 1, -1, -1):
        largest_after[index] = max(largest_after[index + 1], ranked[index][1].footprint_bytes)
    chosen = 0
    pinned_bytes = 0
    for index in range(len(ranked) + 1):
        if (pinned_bytes <= keep_bytes
                and pinned_bytes + workers * largest_after[index] + exec_bytes <= budget_bytes):
            chosen = index
        if index < len(ranked):
            pinned_bytes += ranked[index][1].resident_bytes
    return frozenset(stage for stage, _ in ranked[:chosen])


def age_uses(uses: Mapping[Stage, StageUse]) -> None:
    """Halve every stage's recent LOAD count, so the jobs of late weigh most (a
    daemon whose workload changes pins what it runs now)."""
    for use in uses.values():
        use.recent_loads /= 2
