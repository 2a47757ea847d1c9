"""Context-aware execution: which downstream networks of a job run, are skipped or aborted.

This module owns the decisions of the paper's context-aware modes, as pure
code shared by the simulator and the real executor:

- ``oblivious``: every network of a job runs; `after:` and `when:` are ignored.
- ``wait`` (CA-wait): a downstream network's tasks are gated (not even its
  LOADs become ready) until all its upstreams of the same job have ended; then
  its condition is evaluated on their outputs: it is opened, or it and every
  transitive downstream are *skipped*.
- ``preempt`` (CA-preempt): downstream networks run as soon as resources allow
  (the task-graph builder adds the rule that a downstream's first EXEC never
  starts before its upstream's first EXEC). When all upstreams have ended and
  the condition does not hold, the downstream and every transitive downstream
  are *aborted*: pending tasks cancelled, running ones stopped, memory released.

An upstream that failed, was skipped or aborted makes its downstreams
unnecessary as well. The controller only decides; the executor (or simulator)
applies the decisions through a `GroupControl` and supplies a `decide`
function that evaluates the condition (on real outputs, or by the seeded
`probability:` draw in simulation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from masa.sched.core import GroupStatus
from masa.sched.jobs import group_id

CONTEXT_MODES = ("oblivious", "wait", "preempt")


class GroupControl(Protocol):
    """What the controller may do to the scheduler (SimulationControl matches it)."""

    def open(self, group: str) -> None: ...
    def cancel(self, group: str, reason: str) -> None: ...


# decide(job_id, network, upstream_outputs) -> True when the network is needed,
# given that all its upstreams in the job have finished successfully;
# upstream_outputs maps network -> output name -> array (empty in simulation).
UpstreamOutputs = Mapping[str, Mapping[str, Any]]
Decide = Callable[[int, str, UpstreamOutputs], bool]


def parse_group(group: str) -> tuple[int, str]:
    """'j3/facenet' -> (3, 'facenet')."""
    job_part, network = group.split("/", 1)
    return int(job_part[1:]), network


@dataclass
class ContextController:
    """Per-run bookkeeping of the context-aware decisions (plain data, no I/O)."""

    mode: str
    upstreams: Mapping[str, tuple[str, ...]]  # network -> its upstream networks
    decide: Decide
    # job_id -> networks of that job
    job_networks: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # group -> "skipped" / "aborted"
    outcome: dict[str, str] = field(default_factory=dict)
    ended: dict[str, GroupStatus] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in CONTEXT_MODES:
            raise ValueError(f"unknown context mode {self.mode!r}")
        self.downstreams: dict[str, list[str]] = {}
        for network, ups in self.upstreams.items():
            for upstream in ups:
                self.downstreams.setdefault(upstream, []).append(network)

    @property
    def active(self) -> bool:
        return self.mode != "oblivious" and any(self.upstreams.values())

    def register_job(self, job_id: int, networks: Iterable[str]) -> list[str]:
        """Record a job's networks; return the groups to gate before its tasks arrive
        (CA-wait: every network with an upstream in the job)."""
        networks = tuple(networks)
        self.job_networks[job_id] = networks
        if self.mode != "wait":
            return []
        return [group_id(job_id, network) for network in networks
                if self._upstreams_in_job(job_id, network)]

    def group_ended(self, group: str, status: GroupStatus, control: GroupControl,
                    upstream_outputs: UpstreamOutputs | None = None) -> list[str]:
        """A network instance ended: decide the fate of its direct downstreams.

        upstream_outputs: the outputs of the job's finished networks (real runs).
        Returns the groups newly found unnecessary (skipped or aborted), including
        any that already finished under CA-preempt: their results must be
        discarded.
        """
        self.ended[group] = status
        if not self.active:
            return []
        job_id, network = parse_group(group)
        doomed: list[str] = []
        for downstream in self.downstreams.get(network, ()):
            down_group = group_id(job_id, downstream)
            if downstream not in self.job_networks.get(job_id, ()) or down_group in self.outcome:
                continue
            down_status = self.ended.get(down_group)
            if down_status is not None and down_status is not GroupStatus.DONE:
                continue  # it failed or was cancelled on its own: nothing to decide
            ups = self._upstreams_in_job(job_id, downstream)
            statuses = [self.ended.get(group_id(job_id, up)) for up in ups]
            if any(s is None for s in statuses):
                continue  # another upstream is still running
            if all(s is GroupStatus.DONE for s in statuses) and self.decide(job_id, downstream,
                                                                     upstream_outputs or {}):
                if down_status is None:
                    # Lifts the CA-wait gate; in CA-preempt it tells the executor
                    # that the upstream outputs a derived input needs are there.
                    control.open(down_group)
                continue
            reason = (f"upstream {network!r} did not complete"
                      if any(s is not GroupStatus.DONE for s in statuses)
                      else "condition did not hold")
            doomed += self._cancel_with_downstreams(job_id, downstream, reason, control)
        return doomed

    def _cancel_with_downstreams(self, job_id: int, network: str, reason: str,
                                 control: GroupControl) -> list[str]:
        """Skip or abort a network and its transitive downstreams; returns those labelled.

        Under CA-preempt a downstream may already have finished before its
        upstream's verdict: it is aborted all the same (its results discarded,
        its work counted as wasted). One that failed on its own stays failed.
        """
        label = "skipped" if self.mode == "wait" else "aborted"
        doomed = [group_id(job_id, name)
                  for name in [network] + self._transitive_downstreams(job_id, network)]
        labelled = [group for group in doomed
                    if group not in self.outcome
                    and self.ended.get(group, GroupStatus.DONE) is GroupStatus.DONE]
        for group in labelled:
            self.outcome[group] = label
        for group in labelled:
            if group not in self.ended:
                why = (reason if group == doomed[0]
                       else f"upstream {network!r} is not needed")
                control.cancel(group, why)
        return labelled

    def _transitive_downstreams(self, job_id: int, network: str) -> list[str]:
        in_job = self.job_networks.get(job_id, ())
        found: list[str] = []
        frontier = [network]
        while frontier:
            current = frontier.pop()
            for downstream in self.downstreams.get(current, ()):
                if downstream in in_job and downstream not in found:
                    found.append(downstream)
                    frontier.append(downstream)
        return found

    def _upstreams_in_job(self, job_id: int, network: str) -> list[str]:
        in_job = self.job_networks.get(job_id, ())
        return [up for up in self.upstreams.get(network, ()) if up in in_job]

    def forget_job(self, job_id: int) -> None:
        """Drop what is kept about an ended job (a long-running service calls this)."""
        for network in self.job_networks.pop(job_id, ()):
            group = group_id(job_id, network)
            self.outcome.pop(group, None)
            self.ended.pop(group, None)

    def network_status(self, group: str, core_status: str) -> str:
        """done / failed / skipped / aborted / cancelled, for reports."""
        return self.outcome.get(group, core_status)
