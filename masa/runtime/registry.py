"""The one registry of scheduling policies: every list of policy names derives from it.

`make_policy(name)` gives a fresh policy object for one scheduler state
(policies keep per-run heaps, so they are never shared between runs).
"""

from __future__ import annotations

from collections.abc import Callable

from masa.common.errors import UserError
from masa.runtime.planning import PlanningPolicy
from masa.sched.core import Policy
from masa.sched.policies import BulkPolicy, DeepEyePolicy, MasaPolicy

# "masa" is Algorithm 1 with the admission and headroom rules (docs/scheduling.md);
# "masa-paper" is Algorithm 1 exactly as the paper states it, for comparison;
# "masa-plan" keeps masa's memory rules but dispatches in an order planned by
# local search at each arrival (masa.runtime.planning).
POLICY_FACTORIES: dict[str, Callable[[], Policy]] = {
    "masa": MasaPolicy,
    "masa-paper": lambda: MasaPolicy(admission=False, headroom=False),
    "masa-plan": PlanningPolicy,
    "bulk": BulkPolicy,
    "deepeye": DeepEyePolicy,
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICY_FACTORIES)


def make_policy(name: str) -> Policy:
    """A fresh policy by name; an unknown name is a UserError."""
    factory = POLICY_FACTORIES.get(name)
    if factory is None:
        raise UserError(f"policy: expected one of {', '.join(POLICY_NAMES)}, got {name!r}")
    return factory()
