"""Random solver instances carry the LOAD order rule of real job graphs.

masa.sched.jobs gives every job graph start_after edges LOAD(s-1) -> LOAD(s); the
random generator of solver.instance mirrors it, so the `masa` heuristic is
measured on the graphs it schedules in production. Without the rule the
smallest-first policy loads light later stages before the stage they wait
for and, at tight budgets, has to over-commit memory (progress rule).
"""

from __future__ import annotations

import pytest

from masa.runtime.registry import make_policy
from masa.runtime.virtual import simulate_graph
from masa.sched.checker import check_schedule
from solver.instance import RandomSpec, instance_from_dict, instance_to_dict, random_instance

pytestmark = pytest.mark.solver


def test_random_instance_orders_the_loads_of_each_network() -> None:
    instance = random_instance(RandomSpec(networks=3, layers=4, seed=5))
    pairs = set(instance.graph.start_after)
    assert len(pairs) == 3 * 3
    assert ("n1.s2.load", "n1.s3.load") in pairs
    unordered = random_instance(RandomSpec(networks=3, layers=4, seed=5, load_order=False))
    assert unordered.graph.start_after == ()
    assert unordered.graph.tasks == instance.graph.tasks  # same costs either way
    # The rule survives the JSON format.
    assert set(instance_from_dict(instance_to_dict(instance)).graph.start_after) == pairs


@pytest.mark.parametrize("tightness", [1.2, 1.6])
def test_masa_stays_within_tight_budgets_on_random_instances(tightness: float) -> None:
    over_budget_without_rule = 0
    for seed in range(30):
        spec = RandomSpec(networks=2 + seed % 3, layers=2 + seed % 7, seed=1000 + seed,
                          workers=2 + seed % 2, tightness=tightness,
                          load_ratio=1.0 if seed % 2 == 0 else 4.0)
        instance = random_instance(spec)
        result = simulate_graph(instance.graph, policy=make_policy("masa"),
                                workers=instance.workers, memory_budget_bytes=instance.memory)
        assert result.over_commits == (), instance.name
        assert check_schedule(instance.graph, list(result.schedule), workers=instance.workers,
                              memory_budget_bytes=instance.memory) == [], instance.name
        # The default plans a batch only where its plan beats greedy masa's own run.
        greedy = simulate_graph(instance.graph, policy=make_policy("masa-noplan"),
                                workers=instance.workers, memory_budget_bytes=instance.memory)
        assert result.makespan_us <= greedy.makespan_us, instance.name
        unordered = random_instance(RandomSpec(**{**spec.__dict__, "load_order": False}))
        over_budget_without_rule += bool(simulate_graph(
            unordered.graph, policy=make_policy("masa-noplan"), workers=instance.workers,
            memory_budget_bytes=instance.memory).over_commits)
    if tightness == 1.2:
        # What the rule is for: without it greedy masa over-commits on the same instances.
        assert over_budget_without_rule > 0
