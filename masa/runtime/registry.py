"""The one registry of scheduling policies: every list of policy names derives from it.

`make_policy(name)` gives a fresh policy object for one scheduler state
(policies keep per-run heaps, so they are never shared between runs).
`make_policy(name, real_time=True)` is for a loop on the wall clock (the real
executor, the daemon): `masa` and `masa-plan` then search on a background thread
with a time budget and dispatch by masa's greedy rule until their plan is ready,
so the loop never waits for a search. The simulator and the solver benchmark plan
inline, deterministically. Close such a policy with `close_policy`.
`make_policy(name, copied_weights=True)` is for a store whose LOADs copy the
weights out of the stage files (`weights_copied`): `masa` then plans no batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from masa.common.errors import UserError
from masa.runtime.planning import BatchPlanningPolicy, PlanningPolicy, ThreadPlanner
from masa.sched.core import Policy
from masa.sched.policies import BulkPolicy, DeepEyePolicy, MasaPolicy
from model_prep.manifest import NetworkManifest

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
# The policies that may keep loaded stages between jobs (`keep_loaded_bytes`).
KEEPING_POLICIES: tuple[str, ...] = ("masa", "masa-noplan")


def keep_loaded_for(policy: str, keep_loaded_bytes: int | None, budget_bytes: int) -> int:
    """The bound on kept loaded stages for `policy`: `keep_loaded_bytes` as asked, the
    memory budget when nothing was asked (the default of `masa run` and `masa serve`:
    keep while every stage the jobs load fits in the budget), and 0 for the policies
    that do not keep (the baselines run as the paper defines them)."""
    if policy not in KEEPING_POLICIES:
        return 0
    return budget_bytes if keep_loaded_bytes is None else keep_loaded_bytes


def make_policy(name: str, real_time: bool = False, read_ahead_bytes: int | None = None,
                copied_weights: bool = False, cache_first: bool = True,
                keep_loaded_bytes: int = 0, pin_stages: bool = True) -> Policy:
    """A fresh policy by name; an unknown name is a UserError. `read_ahead_bytes`
    bounds masa's read-ahead window (MasaPolicy); `copied_weights` (the store's LOADs
    copy their weights, `weights_copied`) turns off masa's batch plan; `cache_first`
    False turns off masa's cached-stages-first rule; `keep_loaded_bytes` keeps loaded
    stages between jobs within that many bytes (masa.sched.core), `pin_stages` False
    keeps none once not all fit (masa.sched.keeping). `masa-paper`, `masa-plan` and
    the baselines ignore all five."""
    factory = POLICY_FACTORIES.get(name)
    if factory is None:
        raise UserError(f"policy: expected one of {', '.join(POLICY_NAMES)}, got {name!r}")
    if real_time and factory is PlanningPolicy:
        return PlanningPolicy(planner=ThreadPlanner())
    if factory is BatchPlanningPolicy:
        return BatchPlanningPolicy(planner=ThreadPlanner() if real_time else None,
                                   plan_batches=not copied_weights,
                                   read_ahead_bytes=read_ahead_bytes, cache_first=cache_first,
                                   keep_loaded_bytes=keep_loaded_bytes, pin_stages=pin_stages)
    if factory is MasaPolicy:
        return MasaPolicy(read_ahead_bytes=read_ahead_bytes, cache_first=cache_first,
                          keep_loaded_bytes=keep_loaded_bytes, pin_stages=pin_stages)
    return factory()


def weights_copied(manifests: Mapping[str, NetworkManifest]) -> bool:
    """Whether most of the networks' weights are copied out of their stage files at
    LOAD (load mode copy, or prepacked stages) rather than mapped. A copied stage's
    weights are memory the page cache loses while the stage is held, so on a device
    whose cap is the budget plus the runtime, what is loaded ahead decides which
    stage files stay cached for the next job (docs/scheduling.md, "Batch plan")."""
    copied_bytes = mapped_bytes = 0
    for manifest in manifests.values():
        for stage in manifest.stages:
            if stage.loaded_mapped_bytes:
                mapped_bytes += stage.loaded_mapped_bytes
            else:
                copied_bytes += stage.weight_bytes
    return copied_bytes > mapped_bytes


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
