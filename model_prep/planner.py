"""The stage planner: which node goes into which stage, what crosses the cuts, in what order.

Pure: plain records in (`NodeRecord`, one per graph node, which
model_prep.onnx_graph reads from an ONNX graph), plain data out (`StageLayout`,
one per stage); no onnx, numpy, files or clocks, so the cut rule is tested on
hand-made records. model_prep.stage_files turns the layouts into stage files.

The cut rule (docs/manifest.md, "How a model is cut"):
- A *constant* tensor is an initializer (also one listed as a graph input, as
  IR < 4 models do), a `Constant` output, or the output of a deterministic
  standard operator whose inputs are all constant (`ConstantOfShape` weights,
  `Unsqueeze`d batch-norm scales). Constant-producing nodes are not scheduled:
  they are copied into every stage that reads their output, so a weight and
  the nodes that make it always live in the stage that uses it.
- A stage starts at every *weighted* operator (Conv, ConvTranspose, Gemm,
  MatMul, LSTM, GRU, RNN, ... with a constant operand) and takes the
  weightless operators that follow it: a weightless node joins the latest
  stage among its producers; weightless nodes fed only by graph inputs join
  their earliest consumer. Stages are numbered in the order of their weighted
  operators, so every edge goes forward and the stage list is a topological
  order of the stage DAG (skip connections, branches, concatenations).
- A cut is refused, and the two stages beside it merged (with a note saying
  why), when it would carry more than `max_cut_tensors` live tensors or a
  tensor whose type shape inference could not determine.
- With `min_stage_weight_bytes` (`--min-stage-bytes`), consecutive stages are
  merged until each holds at least that many weight bytes: every stage costs a
  session, a run call and (on x86) a layout reorder of its input and output,
  which on a net of many tiny convolutions (GoogleNet: 58 stages of 0.4 MiB on
  average) is a visible share of the run time. A contiguous range of a
  topological order is always a valid stage. Off by default: one weighted
  operator per stage.
- Control flow (If, Loop, Scan) stays whole: the node and its subgraphs go into
  one stage, and outer tensors its subgraphs reference become stage inputs.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from masa.common.errors import UserError
from masa.common.graphs import topological_order

STANDARD_DOMAINS = ("", "ai.onnx")
# Never folded into a constant: copying one into several stages would give
# each copy different values.
NONDETERMINISTIC_OPS = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli",
})
DEFAULT_MAX_CUT_TENSORS = 8


@dataclass(frozen=True)
class NodeRecord:
    """One node of the graph, as much of it as the cut rule needs."""

    label: str  # how notes name it: "Conv 'conv1'", or "Conv #3" when unnamed
    op_type: str
    domain: str = ""
    reads: tuple[str, ...] = ()  # explicit inputs, then outer names its subgraphs read; unique
    outputs: tuple[str, ...] = ()  # the names it writes (never "")
    kind: str | None = None  # "conv" / "fc" when its operator type carries weights
    control_flow: bool = False  # it has subgraphs (If, Loop, Scan): never cut inside
    subgraph_kinds: tuple[str, ...] = ()  # kinds of the weighted operators in its subgraphs
    subgraph_nodes: int = 0  # nodes in its subgraphs, nested ones included
    implicit_inputs: tuple[str, ...] = ()  # the outer names its subgraphs read
    subgraph_weight_bytes: int = 0  # initializers and Constant tensors inside its subgraphs


@dataclass
class GraphAnalysis:
    """The facts the cut rule needs, computed in one walk over the node list."""

    order: list[int]  # node indices, topologically sorted (stable: file order if sorted)
    constant_nodes: set[int]
    constant_names: set[str]
    producer: dict[str, int]  # name -> producing node (every node)
    runtime_inputs: list[str]  # graph inputs that are not initializers


@dataclass
class StagePlan:
    """Which compute nodes (indices into the node list) form one stage."""

    nodes: list[int]
    weighted: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StageLayout:
    """One planned stage: what its file holds and what the manifest says of it."""

    stage_id: str
    nodes: tuple[int, ...]  # its compute nodes, in topological order
    constant_nodes: tuple[int, ...]  # nodes making the constants it reads, same order
    initializers: frozenset[str]  # initializers it reads, or its constant nodes start from
    inputs: tuple[str, ...]  # tensors it reads from the job input or earlier stages
    outputs: tuple[str, ...]  # tensors later stages or the job read
    producers: tuple[str, ...]  # ids of the stages whose outputs it reads
    op_types: tuple[str, ...]  # distinct operator types, in graph order
    layer_type: str  # conv | fc | other
    weight_bytes: int
    weighted_count: int  # weighted operators in it (1 unless merged)
    note: str | None  # why it is larger than one weighted operator


def analyse(nodes: Sequence[NodeRecord], initializers: Collection[str],
            graph_inputs: Sequence[str]) -> GraphAnalysis:
    """Topological order, constants and producers; UserError if the graph has a cycle."""
    runtime_inputs = [name for name in graph_inputs if name not in initializers]
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.outputs:
            producer[name] = index
    edges = {(producer[name], index) for index, node in enumerate(nodes)
             for name in node.reads if name in producer and producer[name] != index}
    order = topological_order(list(range(len(nodes))), edges)
    if order is None:
        raise UserError("the model's graph has a cycle: expected an acyclic node graph")
    constant_names = set(initializers)
    constant_nodes: set[int] = set()
    for index in order:
        node = nodes[index]
        standard = node.domain in STANDARD_DOMAINS
        if standard and node.op_type == "Constant":
            is_constant = True
        else:
            is_constant = (
                standard and bool(node.reads) and not node.control_flow
                and node.op_type not in NONDETERMINISTIC_OPS
                and all(name in constant_names for name in node.reads)
            )
        if is_constant:
            constant_nodes.add(index)
            constant_names.update(node.outputs)
    return GraphAnalysis(order, constant_nodes, constant_names, producer, runtime_inputs)


def plan_network(
    nodes: Sequence[NodeRecord],
    analysis: GraphAnalysis,
    graph_outputs: Sequence[str],
    constant_bytes: Mapping[str, int],
    typed: Collection[str],
    max_cut_tensors: int = DEFAULT_MAX_CUT_TENSORS,
    min_stage_weight_bytes: int = 0,
) -> list[StageLayout]:
    """Every stage, in a topological order of the stage DAG.

    `constant_bytes`: the byte size of each constant tensor (0 or absent when
    unknown); `typed`: the tensors whose type is known (a cut never carries
    any other).
    """
    plans = plan_stages(nodes, analysis, constant_bytes, typed, max_cut_tensors,
                        min_stage_weight_bytes)
    return lay_out(nodes, analysis, plans, graph_outputs, constant_bytes)


# --------------------------------------------------------------- grouping


def _is_weighted(node: NodeRecord, constant_names: Collection[str]) -> bool:
    if node.control_flow:
        return bool(node.subgraph_kinds)
    return node.kind is not None and any(name in constant_names for name in node.reads)


def plan_stages(
    nodes: Sequence[NodeRecord],
    analysis: GraphAnalysis,
    constant_bytes: Mapping[str, int],
    typed: Collection[str],
    max_cut_tensors: int = DEFAULT_MAX_CUT_TENSORS,
    min_stage_weight_bytes: int = 0,
) -> list[StagePlan]:
    """Group compute nodes into stages (see the module docstring for the rule)."""
    compute = [i for i in analysis.order if i not in analysis.constant_nodes]
    stage_of, weighted_nodes = _first_stages(nodes, analysis, compute)
    if not weighted_nodes:
        note = "no weighted operator: the whole graph is one stage"
        return [StagePlan(nodes=compute, weighted=[], notes=[note])]
    consumers: dict[int, list[int]] = {i: [] for i in compute}
    for index in compute:
        for name in nodes[index].reads:
            source = analysis.producer.get(name)
            if source is not None and source in consumers:
                consumers[source].append(index)
    # Nodes fed only by graph inputs (a leading Transpose) join their earliest
    # consumer rather than forming a weightless stage of their own.
    for index in reversed(compute):
        if stage_of[index] == -1:
            later = [stage_of[c] for c in consumers[index] if stage_of[c] >= 0]
            stage_of[index] = min(later, default=0)

    forbidden = _forbidden_cuts(nodes, analysis, compute, stage_of, consumers, typed,
                                len(weighted_nodes), max_cut_tensors)
    if min_stage_weight_bytes > 0:
        _merge_light_stages(nodes, analysis, weighted_nodes, constant_bytes, forbidden,
                            min_stage_weight_bytes)
    return _group(nodes, analysis, compute, stage_of, weighted_nodes, forbidden)


def _first_stages(nodes: Sequence[NodeRecord], analysis: GraphAnalysis, compute: list[int]
                  ) -> tuple[dict[int, int], list[int]]:
    """One stage per weighted node; a weightless node in its latest producer's (-1: none)."""
    stage_of: dict[int, int] = {}
    weighted_nodes: list[int] = []
    for index in compute:
        node = nodes[index]
        if _is_weighted(node, analysis.constant_names):
            stage_of[index] = len(weighted_nodes)
            weighted_nodes.append(index)
            continue
        sources = [stage_of[analysis.producer[n]] for n in node.reads
                   if n in analysis.producer and analysis.producer[n] in stage_of]
        stage_of[index] = max(sources, default=-1)
    return stage_of, weighted_nodes


def _forbidden_cuts(
    nodes: Sequence[NodeRecord],
    analysis: GraphAnalysis,
    compute: list[int],
    stage_of: dict[int, int],
    consumers: dict[int, list[int]],
    typed: Collection[str],
    stage_count: int,
    max_cut_tensors: int,
) -> dict[int, str]:
    """Cuts (after stage k, k -> k+1) that must not be made, with the reason."""
    live_count = [0] * max(stage_count - 1, 0)
    untyped: dict[int, str] = {}
    for index in compute:
        for name in nodes[index].outputs:
            readers = {stage_of[c] for c in consumers[index] if name in nodes[c].reads}
            first, last = stage_of[index], max(readers, default=stage_of[index])
            for cut in range(first, last):
                live_count[cut] += 1
                if name not in typed:
                    untyped.setdefault(cut, name)
    # The job's inputs are held too, from the start until their last reader.
    for name in analysis.runtime_inputs:
        readers = {stage_of[c] for c in compute if name in nodes[c].reads}
        for cut in range(0, max(readers, default=0)):
            live_count[cut] += 1
    forbidden: dict[int, str] = {}
    for cut, count in enumerate(live_count):
        if count > max_cut_tensors:
            forbidden[cut] = (f"the cut would carry {count} live tensors "
                              f"(limit {max_cut_tensors})")
        elif cut in untyped:
            forbidden[cut] = (f"shape inference could not type {untyped[cut]!r}, which "
                              "would cross the cut")
    return forbidden


def _merge_light_stages(
    nodes: Sequence[NodeRecord],
    analysis: GraphAnalysis,
    weighted_nodes: list[int],
    constant_bytes: Mapping[str, int],
    forbidden: dict[int, str],
    min_stage_weight_bytes: int,
) -> None:
    """Forbid the cuts after stages lighter than `min_stage_weight_bytes` (in place)."""
    group_bytes = 0
    for cut, index in enumerate(weighted_nodes[:-1]):
        group_bytes += sum(constant_bytes.get(name, 0) for name in nodes[index].reads
                           if name in analysis.constant_names)
        if cut in forbidden:
            continue
        if group_bytes < min_stage_weight_bytes:
            forbidden[cut] = (f"merged with the next stage: fewer than "
                              f"{min_stage_weight_bytes} weight bytes (--min-stage-bytes)")
        else:
            group_bytes = 0


def _group(
    nodes: Sequence[NodeRecord],
    analysis: GraphAnalysis,
    compute: list[int],
    stage_of: dict[int, int],
    weighted_nodes: list[int],
    forbidden: dict[int, str],
) -> list[StagePlan]:
    """Merge the stages beside every forbidden cut; note why, and where control flow is."""
    stage_count = len(weighted_nodes)
    position = {node: rank for rank, node in enumerate(analysis.order)}
    group_of = [0] * stage_count
    for cut in range(stage_count - 1):
        group_of[cut + 1] = group_of[cut] + (0 if cut in forbidden else 1)
    plans = [StagePlan(nodes=[]) for _ in range(group_of[-1] + 1)]
    for index in sorted(compute, key=position.__getitem__):
        plans[group_of[stage_of[index]]].nodes.append(index)
    for stage, index in enumerate(weighted_nodes):
        plans[group_of[stage]].weighted.append(index)
    for cut, reason in sorted(forbidden.items()):
        plans[group_of[cut]].notes.append(
            f"not cut after {nodes[weighted_nodes[cut]].label}: {reason}")
    for plan in plans:
        for index in plan.nodes:
            node = nodes[index]
            if node.control_flow:
                plan.notes.append(
                    f"control flow {node.label} stays whole with its "
                    f"{node.subgraph_nodes} subgraph nodes"
                    + (f"; its subgraphs read outer tensors {', '.join(node.implicit_inputs)}"
                       if node.implicit_inputs else ""))
    return plans


# --------------------------------------------------------------- layout


def lay_out(
    nodes: Sequence[NodeRecord],
    analysis: GraphAnalysis,
    plans: Sequence[StagePlan],
    graph_outputs: Sequence[str],
    constant_bytes: Mapping[str, int],
) -> list[StageLayout]:
    """Stage ids, the tensors crossing each cut, and each stage's inputs and weights."""
    width = max(3, len(str(len(plans) - 1)))
    stage_ids = [f"s{index:0{width}d}" for index in range(len(plans))]
    stage_of_node = {node: stage_ids[k] for k, plan in enumerate(plans) for node in plan.nodes}
    needed_outside = set(graph_outputs)
    for k, plan in enumerate(plans):
        for index in plan.nodes:
            for name in nodes[index].reads:
                source = analysis.producer.get(name)
                if source is not None and stage_of_node.get(source) not in (None, stage_ids[k]):
                    needed_outside.add(name)
    position = {node: rank for rank, node in enumerate(analysis.order)}
    return [_lay_out_stage(nodes, analysis, plan, stage_ids[k], stage_of_node, needed_outside,
                           constant_bytes, position)
            for k, plan in enumerate(plans)]


def _lay_out_stage(
    nodes: Sequence[NodeRecord],
    analysis: GraphAnalysis,
    plan: StagePlan,
    stage_id: str,
    stage_of_node: Mapping[int, str],
    needed_outside: Collection[str],
    constant_bytes: Mapping[str, int],
    position: Mapping[int, int],
) -> StageLayout:
    produced = {name for index in plan.nodes for name in nodes[index].outputs}
    inputs: dict[str, None] = {}
    constants_read: dict[str, None] = {}
    producers: dict[str, None] = {}
    for index in plan.nodes:
        for name in nodes[index].reads:
            if name in produced:
                continue
            if name in analysis.constant_names:
                constants_read.setdefault(name)
            else:
                inputs.setdefault(name)
                source = analysis.producer.get(name)
                if source is not None and source in stage_of_node:
                    producers.setdefault(stage_of_node[source])
    constant_nodes, initializers = _constant_closure(nodes, analysis, constants_read)
    weight_bytes = sum(constant_bytes.get(name, 0) for name in constants_read)
    weight_bytes += sum(nodes[i].subgraph_weight_bytes for i in plan.nodes)
    return StageLayout(
        stage_id=stage_id,
        nodes=tuple(plan.nodes),
        constant_nodes=tuple(sorted(constant_nodes, key=position.__getitem__)),
        initializers=frozenset(initializers),
        inputs=tuple(inputs),
        outputs=tuple(name for index in plan.nodes for name in nodes[index].outputs
                      if name in needed_outside),
        producers=tuple(producers),
        op_types=tuple(dict.fromkeys(nodes[i].op_type for i in plan.nodes)),
        layer_type=_layer_type(nodes, analysis, plan, constant_bytes),
        weight_bytes=weight_bytes,
        weighted_count=len(plan.weighted),
        note="; ".join(plan.notes) or None,
    )


def _constant_closure(nodes: Sequence[NodeRecord], analysis: GraphAnalysis,
                      constants_read: Collection[str]) -> tuple[set[int], set[str]]:
    """The Constant/ConstantOfShape/... nodes that make the constants a stage reads,
    and the initializers they start from (or the stage reads directly)."""
    constant_nodes: set[int] = set()
    initializers: set[str] = set()
    pending = list(constants_read)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        source = analysis.producer.get(name)
        if source is not None and source in analysis.constant_nodes:
            constant_nodes.add(source)
            pending.extend(nodes[source].reads)
        else:
            initializers.add(name)
    return constant_nodes, initializers


def _layer_type(nodes: Sequence[NodeRecord], analysis: GraphAnalysis, plan: StagePlan,
                constant_bytes: Mapping[str, int]) -> str:
    """conv / fc by the weighted operators' kind; a mixed stage by the heavier kind."""
    weight_by_kind: dict[str, int] = {}
    for index in plan.weighted:
        node = nodes[index]
        kinds = [node.kind] if node.kind is not None else list(node.subgraph_kinds)
        weight = sum(constant_bytes.get(name, 0) for name in node.reads
                     if name in analysis.constant_names) + node.subgraph_weight_bytes
        for kind in kinds:
            weight_by_kind[kind] = weight_by_kind.get(kind, 0) + weight + 1
    if not weight_by_kind:
        return "other"
    return max(sorted(weight_by_kind), key=weight_by_kind.__getitem__)
