"""The workload data model: frozen dataclasses a loaded workload file becomes.

Owns what a workload *is* once validated (docs/workload-format.md): the job
graph's nodes (`NetworkNode`) with their `when:` predicates (`Condition`) and
`input:` transforms (`Transform`), the job input (`InputSpec`), and the
`Workload` that ties them to its arrival process and composition (defined with
their generators in workloads.arrivals). Also the few vocabularies every
other workloads module shares: the predicate and transform kinds, the shape of
upstream outputs, and the tags that keep a workload's seeded random streams
apart.

Nothing here reads files, validates or draws random numbers: workloads.loader
builds these objects, workloads.generation, workloads.conditions and
workloads.inputs interpret them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workloads.arrivals import Arrival, Composition

WORKLOAD_FORMAT = 1
PREDICATE_KINDS = ("max_above", "any_above", "count_above", "argmax_in", "probability", "call")
TENSOR_PREDICATE_KINDS = ("max_above", "any_above", "count_above", "argmax_in")
TRANSFORM_KINDS = ("crop_best_box", "call")
BOX_COORDS = ("pixels", "normalized")
# Every random draw keyed by a workload's seed also carries one of these tags,
# so condition draws and random inputs never share random numbers.
CONDITION_STREAM = 1
INPUT_STREAM = 2

# Outputs of finished upstream networks: {network: {tensor name: array}}.
UpstreamOutputs = Mapping[str, Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class Condition:
    """One `when:` predicate. A network runs when all of its conditions hold."""

    kind: str  # one of PREDICATE_KINDS
    network: str  # the upstream network it reads (or whose label is drawn)
    output: str | None = None  # tensor name; None: the upstream's only output
    threshold: float | None = None
    min_count: int = 1  # count_above
    class_ids: tuple[int, ...] = ()  # argmax_in
    column: int | None = None  # read only this index of the last axis (a score column)
    probability: float | None = None
    call: str | None = None  # "plugin:func", a function of a loaded plugin


@dataclass(frozen=True)
class Transform:
    """A downstream network's `input:` derivation from the job input and upstream outputs."""

    kind: str  # one of TRANSFORM_KINDS
    network: str | None = None  # upstream whose outputs hold the boxes
    boxes: str | None = None  # tensor [..., N, 4] (x1, y1, x2, y2), or [..., N, >=5] with score
    scores: str | None = None  # tensor [..., N]; None: column 4 of `boxes`
    coords: str = "pixels"  # pixels of the job input, or normalized to [0, 1]
    margin: float = 0.0  # grow the box by this fraction of its size on every side
    call: str | None = None  # "plugin:func", a function of a loaded plugin


@dataclass(frozen=True)
class NetworkNode:
    """One network of the job graph."""

    name: str
    after: tuple[str, ...] = ()  # upstream networks
    when: tuple[Condition, ...] = ()  # all must hold (after every upstream finished)
    transform: Transform | None = None  # None: the network gets the job input


@dataclass(frozen=True)
class InputSpec:
    """The job input: random data of each model's input shape, or one file."""

    kind: str  # "random" or "file"
    path: Path | None = None
    array: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Workload:
    name: str
    source: Path
    nodes: tuple[NetworkNode, ...]  # in network order: upstreams before downstreams
    input: InputSpec
    arrivals: Arrival
    composition: Composition = Composition()
    intensity: float | None = None  # traffic intensity the arrival rate was set from
    description: str = ""

    @property
    def networks(self) -> tuple[str, ...]:
        """The network order: file order, moved only where an upstream came later."""
        return tuple(node.name for node in self.nodes)

    @property
    def seed(self) -> int:
        return self.arrivals.seed

    @property
    def rate_resolved(self) -> bool:
        return self.arrivals.kind == "trace" or self.arrivals.mean_rate_per_s is not None

    @property
    def context_aware(self) -> bool:
        return any(node.after for node in self.nodes)

    def node(self, network: str) -> NetworkNode:
        for node in self.nodes:
            if node.name == network:
                return node
        raise KeyError(network)

    def downstreams(self, network: str) -> tuple[str, ...]:
        """Networks that depend on `network`, directly or transitively, in network order."""
        reached = {network}
        for node in self.nodes:  # network order is topological: one pass suffices
            if any(upstream in reached for upstream in node.after):
                reached.add(node.name)
        return tuple(name for name in self.networks if name in reached and name != network)

