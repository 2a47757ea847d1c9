"""The one registry of scheduling policies: every list of policy names derives from it.

`make_policy(name)` gives a fresh policy object for one scheduler state
(policies keep per-run heaps, so they are never shared between runs).
`make_policy(name, real_time=True)` is for a loop on the wall clock (the real
executor, the daemon): `masa` and `masa-plan` then search on a background thread
with a time budget and dispatch by masa's greedy rule until their plan is ready,
so the loop never waits for a search. The simulator and the solver benchmark plan
inline, deterministically. Close such a policy with `close_policy`.
"""

from __future__ import annotations

from collections.abc import Callable

from masa.common.errors import UserError
from masa.runtime.planning import BatchPlanningPolicy, PlanningPolicy, ThreadPlanner
from masa.sched.core import Policy
from masa.sched.policies import BulkPolicy, DeepEyePolicy, MasaPolicy

# "masa" is Algorithm 1 with the admission, headroom and job order rules
# (docs/scheduling.md), plus a light plan for a batch arriving at an idle executor;
# "masa-noplan" is the same without the plan (the default before issue 14's batch plan);
# "masa-paper" is Algorithm 1 exactly as the paper states it, for comparison;
# "masa-plan" keeps masa's memory rules but dispatches in an order planned by
# local search at each arrival (masa.runtime.planning).
POLICY_FACTORIES: dict[str, Callable[[], Policy]] = {
    "masa": BatchPlanningPolicy,
    "masa-noplan": MasaPolicy,
    "masa-paper": lambda: MasaPolicy(admission=False, headroom=False),
    "masa-plan": PlanningPolicy,
    "bulk": BulkPolicy,
    "deepeye": DeepEyePolicy,
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICY_FACTORIES)


def make_policy(name: str, real_time: bool = False,
                read_ahead_bytes: int | None = None) -> Policy:
    """A fresh policy by name; an unknown name is a UserError. `read_ahead_bytes`
    bounds masa's read-ahead window (MasaPolicy); the other policies ignore it."""
    factory = POLICY_FACTORIES.get(name)
    if factory is None:
        raise UserError(f"policy: expected one of {', '.join(POLICY_NAMES)}, got {name!r}")
    if real_time and factory is PlanningPolicy:
        return PlanningPolicy(planner=ThreadPlanner())
    if factory is BatchPlanningPolicy:
        return BatchPlanningPolicy(planner=ThreadPlanner() if real_time else None,
                                   read_ahead_bytes=read_ahead_bytes)
    if factory is MasaPolicy and read_ahead_bytes is not None:
        return MasaPolicy(read_ahead_bytes=read_ahead_bytes)
    return factory()


def policy_stats(policy: Policy) -> dict[str, int]:
    """What a policy counted in a run (masa's batch plans, masa-plan's plans), for the
    report's meta; {} for a policy that counts nothing."""
    stats = getattr(policy, "stats", None)
    return dict(stats()) if stats is not None else {}


def close_policy(policy: Policy) -> None:
    """Stop what a policy runs besides the loop (masa-plan's background search)."""
    close = getattr(policy, "close", None)
    if close is not None:
        close()
