"""The ONNX splitter: one model in, per-layer stage files and a manifest out.

This module owns how a network is cut into stages (docs/manifest.md describes
the result). `split_model` reads the model once, runs shape inference once and
walks the node list once; it never calls `onnx.utils.extract_model`, which
re-reads and re-infers the whole model for every stage.

The cut rule:
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
- With `ort_optimize` (`--ort-optimize`) the graph cut is the one ONNX Runtime
  optimises the model into (model_prep.optimize): its weighted operators are
  contrib ones (com.microsoft.nchwc Conv, FusedConv, FusedGemm, ...,
  `CONTRIB_WEIGHTED_OPS`), and the tensors crossing the cuts are those the
  whole model passes on, NCHWc-blocked ones included. The manifest then
  records the onnxruntime version, machine and graph level (`ort_optimized`).

Dynamic dimensions stay dynamic unless `input_shapes` fixes them. Stages whose
weights exceed the protobuf limit are written with external data.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, helper, shape_inference

from masa.common.errors import UserError
from model_prep.manifest import (
    MANIFEST_NAME,
    NetworkManifest,
    Stage,
    TensorSpec,
    sha256_file,
    write_manifest,
)

log = logging.getLogger(__name__)

# Weighted operator -> layer type. A node counts as weighted only when one of
# its operands is constant: MatMul of two activations (attention) is not.
WEIGHTED_OPS: dict[str, str] = {
    "Conv": "conv", "ConvTranspose": "conv", "ConvInteger": "conv", "QLinearConv": "conv",
    "DeformConv": "conv",
    "Gemm": "fc", "MatMul": "fc", "MatMulInteger": "fc", "QLinearMatMul": "fc",
    "LSTM": "fc", "GRU": "fc", "RNN": "fc",
}
# ONNX Runtime's weighted contrib operators, by (domain, op type): what an
# optimised graph holds instead of Conv / Gemm / MatMul (x86 NCHWc convolutions,
# convolutions and Gemms with a fused activation, quantised kernels).
CONTRIB_WEIGHTED_OPS: dict[tuple[str, str], str] = {
    ("com.microsoft.nchwc", "Conv"): "conv",
    ("com.microsoft", "FusedConv"): "conv", ("com.microsoft", "NhwcConv"): "conv",
    ("com.microsoft", "NhwcFusedConv"): "conv", ("com.microsoft", "QLinearConv"): "conv",
    ("com.microsoft", "FusedGemm"): "fc", ("com.microsoft", "FusedMatMul"): "fc",
    ("com.microsoft", "QGemm"): "fc", ("com.microsoft", "MatMulIntegerToFloat"): "fc",
    ("com.microsoft", "DynamicQuantizeMatMul"): "fc", ("com.microsoft", "MatMulNBits"): "fc",
    ("com.microsoft", "DynamicQuantizeLSTM"): "fc",
}
STANDARD_DOMAINS = ("", "ai.onnx")
# Never folded into a constant: copying one into several stages would give
# each copy different values.
NONDETERMINISTIC_OPS = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli",
})
DEFAULT_MAX_CUT_TENSORS = 8
# Protobuf refuses messages of 2 GiB and more; keep a margin for the graph itself.
DEFAULT_EXTERNAL_DATA_BYTES = 1_800_000_000
# Initializers at least this large are left out of the copy that shape
# inference sees (they become typed inputs): inference then copies kilobytes,
# not the weights. Shape-carrying tensors are far smaller.
_SKELETON_INITIALIZER_BYTES = 64 * 1024
UNKNOWN_RANK = "*"  # TensorSpec.shape of a tensor whose rank is unknown
UNKNOWN_DIM = "?"  # a dim that is neither a number nor a named symbol
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

SplitProgress = Callable[[int, int, str], None]  # (stages written, total, stage id)


# --------------------------------------------------------------- loading


def load_model(model_path: str | Path) -> onnx.ModelProto:
    """Read and sanity-check an ONNX file (with its external data); UserError if bad."""
    path = check_model_file(model_path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise UserError(f"{path}: not a valid ONNX model: cannot parse it "
                        f"({one_line(exc)}); truncated or not ONNX?") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise UserError(f"{path}: not an ONNX model: expected an IR version, a graph and "
                        "opset imports (truncated or not ONNX?)")
    if not model.graph.output:
        raise UserError(f"{path}: at 'graph.output': expected at least one graph output "
                        "(truncated or invalid model?)")
    _check_structure(model.graph, path)
    try:  # a no-op unless some tensors live in external data files
        external_data_helper.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read its external data: {one_line(exc)}") from None
    return model


def check_model_file(model_path: str | Path) -> Path:
    """The path, if it names an existing file; UserError otherwise."""
    path = Path(model_path)
    if not path.exists():
        raise UserError(f"{path}: no such file (expected an ONNX model)")
    if not path.is_file():
        raise UserError(f"{path}: not a file (expected an ONNX model)")
    return path


def _check_structure(graph: onnx.GraphProto, path: Path) -> None:
    """Every name a node reads must be defined before it (catches truncated files)."""
    problems: list[str] = []
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    for index, node in enumerate(graph.node):
        for slot, name in enumerate(node.input):
            if name and name not in defined:
                problems.append(f"{path}: at 'graph.node[{index}].input[{slot}]': {name!r} is "
                                "not produced by any earlier node, initializer or graph input")
        for name in _implicit_inputs(node):
            if name not in defined:
                problems.append(f"{path}: at 'graph.node[{index}]' ({node.op_type}): its "
                                f"subgraph reads {name!r}, which is defined nowhere before it")
        for name in node.output:
            if name and name in defined:
                problems.append(f"{path}: at 'graph.node[{index}].output': {name!r} is "
                                "defined twice")
            defined.add(name)
    for index, output in enumerate(graph.output):
        if output.name not in defined:
            problems.append(f"{path}: at 'graph.output[{index}]': {output.name!r} is not "
                            "produced by any node")
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise UserError(problems[0] + more + "; truncated or invalid model?")


# --------------------------------------------------------------- shapes


def parse_input_shape(text: str) -> tuple[str, list[int | str]]:
    """'data=1x3x224x224' -> ('data', [1, 3, 224, 224]); a non-number dim stays symbolic."""
    name, sep, dims_text = text.rpartition("=")
    if not sep or not name or not dims_text:
        raise UserError(f"--input-shape {text!r}: expected NAME=DIMS such as "
                        "data=1x3x224x224")
    dims: list[int | str] = []
    for dim in dims_text.split("x"):
        dim = dim.strip()
        if re.fullmatch(r"[0-9]+", dim):
            if int(dim) == 0:
                raise UserError(f"--input-shape {text!r}: expected positive dims, got 0")
            dims.append(int(dim))
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", dim):
            dims.append(dim)
        else:
            raise UserError(f"--input-shape {text!r}: expected dims separated by 'x', each "
                            f"a positive integer or a symbol name, got {dim!r}")
    return name, dims


def apply_input_shapes(
    graph: onnx.GraphProto, input_shapes: Mapping[str, Sequence[int | str]], source: str,
    runtime_inputs: Sequence[str],
) -> None:
    by_name = {i.name: i for i in graph.input if i.name in runtime_inputs}
    for name, dims in input_shapes.items():
        if name not in by_name:
            raise UserError(f"--input-shape {name}: {source} has no input {name!r} "
                            f"(its inputs: {', '.join(runtime_inputs) or 'none'})")
        tensor_type = by_name[name].type.tensor_type
        if tensor_type.HasField("shape") and len(tensor_type.shape.dim) != len(dims):
            declared = "x".join(_dim_text(d) for d in tensor_type.shape.dim)
            raise UserError(f"--input-shape {name}: expected {len(tensor_type.shape.dim)} dims "
                            f"like {source}'s input {declared}, got {len(dims)} "
                            f"({'x'.join(str(d) for d in dims)})")
        tensor_type.ClearField("shape")
        for dim in dims:
            new_dim = tensor_type.shape.dim.add()
            if isinstance(dim, int):
                new_dim.dim_value = dim
            else:
                new_dim.dim_param = dim
    if input_shapes:
        # Declared output and intermediate shapes were for the old input shape
        # (CenterFace declares batch 10 at 32x32): let inference recompute them.
        del graph.value_info[:]
        for output in graph.output:
            if output.type.HasField("tensor_type"):
                output.type.tensor_type.ClearField("shape")


def _dim_text(dim: onnx.TensorShapeProto.Dimension) -> str:
    if dim.HasField("dim_value"):
        return str(dim.dim_value)
    return dim.dim_param or UNKNOWN_DIM


def infer_types(
    model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int | str]], source: str,
    runtime_inputs: Sequence[str],
) -> tuple[dict[str, onnx.TypeProto], onnx.GraphProto]:
    """Shape inference once, on a copy without the large weights.

    Returns the type of every name inference could type, and the skeleton's
    graph (its inputs and outputs carry the fixed and inferred shapes).
    """
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    source_graph, graph = model.graph, skeleton.graph
    graph.name = source_graph.name
    graph.node.extend(source_graph.node)
    graph.input.extend(source_graph.input)
    graph.output.extend(source_graph.output)
    graph.value_info.extend(source_graph.value_info)
    graph.sparse_initializer.extend(source_graph.sparse_initializer)
    listed = {i.name for i in graph.input}
    for tensor in source_graph.initializer:
        if tensor_bytes_estimate(tensor) < _SKELETON_INITIALIZER_BYTES:
            graph.initializer.append(tensor)
        elif tensor.name not in listed:
            graph.input.append(helper.make_tensor_value_info(
                tensor.name, tensor.data_type, list(tensor.dims)))
    apply_input_shapes(graph, input_shapes, source, runtime_inputs)
    try:
        inferred = shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False,
                                                data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as exc:
        raise UserError(f"{source}: shape inference failed: {one_line(exc)}") from None
    types: dict[str, onnx.TypeProto] = {}
    for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(
            inferred.graph.output):
        if value.type.WhichOneof("value") is not None:
            types[value.name] = value.type
    for tensor in model.graph.initializer:
        types.setdefault(tensor.name, helper.make_tensor_type_proto(tensor.data_type,
                                                                    list(tensor.dims)))
    return types, inferred.graph


def tensor_bytes_estimate(tensor: onnx.TensorProto) -> int:
    count = int(np.prod(tensor.dims)) if tensor.dims else 1
    return count * _itemsize(tensor.data_type)


def _itemsize(elem_type: int) -> int:
    try:
        return int(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except (KeyError, TypeError, ValueError):
        return 0


def _dtype_name(elem_type: int) -> str:
    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def tensor_spec(name: str, value_type: onnx.TypeProto | None) -> TensorSpec:
    """The manifest's view of a typed tensor: dtype, dims (str when dynamic), bytes."""
    if value_type is None or value_type.WhichOneof("value") != "tensor_type":
        kind = value_type.WhichOneof("value") if value_type is not None else None
        return TensorSpec(name=name, dtype=kind or "unknown", shape=(UNKNOWN_RANK,),
                          size_bytes=None)
    tensor_type = value_type.tensor_type
    dtype = _dtype_name(tensor_type.elem_type) if tensor_type.elem_type else "unknown"
    if not tensor_type.HasField("shape"):
        return TensorSpec(name=name, dtype=dtype, shape=(UNKNOWN_RANK,), size_bytes=None)
    shape: tuple[int | str, ...] = tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or UNKNOWN_DIM)
        for d in tensor_type.shape.dim
    )
    itemsize = _itemsize(tensor_type.elem_type) if tensor_type.elem_type else 0
    static = all(isinstance(d, int) for d in shape)
    size_bytes = int(np.prod(shape, dtype=np.int64)) * itemsize if static and itemsize else None
    return TensorSpec(name=name, dtype=dtype, shape=shape, size_bytes=size_bytes)


def _has_known_type(value_type: onnx.TypeProto | None) -> bool:
    if value_type is None:
        return False
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        return value_type.tensor_type.elem_type != 0
    return kind is not None


# --------------------------------------------------------------- graph analysis


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attribute.graphs)
    return graphs


def _implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names a node's subgraphs read (If/Loop/Scan bodies), in first-use order."""
    found: dict[str, None] = {}
    for graph in _subgraphs(node):
        for name in _graph_outer_refs(graph):
            found.setdefault(name)
    return list(found)


def _graph_outer_refs(graph: onnx.GraphProto) -> list[str]:
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    refs: dict[str, None] = {}
    for node in graph.node:
        for name in list(node.input) + _implicit_inputs(node):
            if name and name not in defined:
                refs.setdefault(name)
        defined.update(node.output)
    for output in graph.output:
        if output.name not in defined:
            refs.setdefault(output.name)
    return list(refs)


def _subgraph_node_count(node: onnx.NodeProto) -> int:
    return sum(len(g.node) + sum(_subgraph_node_count(n) for n in g.node)
               for g in _subgraphs(node))


def weighted_kind(node: onnx.NodeProto) -> str | None:
    """'conv' or 'fc' for an operator type that carries weights (when one of its
    operands is constant), None for the rest."""
    if node.domain in STANDARD_DOMAINS:
        return WEIGHTED_OPS.get(node.op_type)
    return CONTRIB_WEIGHTED_OPS.get((node.domain, node.op_type))


def _subgraph_weighted_types(node: onnx.NodeProto) -> list[str]:
    types: list[str] = []
    for graph in _subgraphs(node):
        for inner in graph.node:
            kind = weighted_kind(inner)
            if kind is not None:
                types.append(kind)
            types.extend(_subgraph_weighted_types(inner))
    return types


def _subgraph_weight_bytes(node: onnx.NodeProto) -> int:
    total = 0
    for graph in _subgraphs(node):
        total += sum(tensor_bytes_estimate(t) for t in graph.initializer)
        for inner in graph.node:
            if inner.op_type == "Constant":
                for attribute in inner.attribute:
                    if attribute.type == onnx.AttributeProto.TENSOR:
                        total += tensor_bytes_estimate(attribute.t)
            total += _subgraph_weight_bytes(inner)
    return total


def _node_label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"


@dataclass
class StagePlan:
    """Which compute nodes (indices into the graph's node list) form one stage."""

    nodes: list[int]
    weighted: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class GraphAnalysis:
    """The facts the cut rule needs, computed in one walk over the node list."""

    order: list[int]  # node indices, topologically sorted (stable)
    constant_nodes: set[int]
    constant_names: set[str]
    reads: dict[int, list[str]]  # node -> names it reads (explicit, then implicit)
    producer: dict[str, int]  # name -> producing node (every node)
    runtime_inputs: list[str]  # graph inputs that are not initializers


def analyse_graph(graph: onnx.GraphProto) -> GraphAnalysis:
    initializer_names = {t.name for t in graph.initializer}
    initializer_names |= {t.values.name for t in graph.sparse_initializer}
    runtime_inputs = [i.name for i in graph.input if i.name not in initializer_names]
    reads: dict[int, list[str]] = {}
    producer: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        names = [n for n in node.input if n] + _implicit_inputs(node)
        reads[index] = list(dict.fromkeys(names))
        for name in node.output:
            if name:
                producer[name] = index
    order = _topological_order(len(graph.node), reads, producer)
    constant_names = set(initializer_names)
    constant_nodes: set[int] = set()
    for index in order:
        node = graph.node[index]
        standard = node.domain in STANDARD_DOMAINS
        if standard and node.op_type == "Constant":
            is_constant = True
        else:
            is_constant = (
                standard and bool(reads[index]) and not _subgraphs(node)
                and node.op_type not in NONDETERMINISTIC_OPS
                and all(name in constant_names for name in reads[index])
            )
        if is_constant:
            constant_nodes.add(index)
            constant_names.update(n for n in node.output if n)
    return GraphAnalysis(order, constant_nodes, constant_names, reads, producer, runtime_inputs)


def _topological_order(count: int, reads: dict[int, list[str]], producer: dict[str, int]
                       ) -> list[int]:
    """Kahn's algorithm, always taking the lowest index: file order when already sorted."""
    consumers: dict[int, list[int]] = {i: [] for i in range(count)}
    waiting = [0] * count
    for index in range(count):
        sources = {producer[n] for n in reads[index] if n in producer and producer[n] != index}
        waiting[index] = len(sources)
        for source in sources:
            consumers[source].append(index)
    ready = [i for i in range(count) if waiting[i] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for consumer in consumers[index]:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                heapq.heappush(ready, consumer)
    if len(order) != count:
        raise UserError("the model's graph has a cycle: expected an acyclic node graph")
    return order


def _is_weighted(node: onnx.NodeProto, reads: list[str], constant_names: set[str]) -> bool:
    if _subgraphs(node):
        return bool(_subgraph_weighted_types(node))
    return weighted_kind(node) is not None and any(name in constant_names for name in reads)


def plan_stages(
    graph: onnx.GraphProto,
    analysis: GraphAnalysis,
    types: Mapping[str, onnx.TypeProto],
    max_cut_tensors: int = DEFAULT_MAX_CUT_TENSORS,
    min_stage_weight_bytes: int = 0,
) -> list[StagePlan]:
    """Group compute nodes into stages (see the module docstring for the rule)."""
    compute = [i for i in analysis.order if i not in analysis.constant_nodes]
    position = {node: rank for rank, node in enumerate(analysis.order)}
    stage_of: dict[int, int] = {}
    weighted_nodes: list[int] = []
    for index in compute:
        node = graph.node[index]
        if _is_weighted(node, analysis.reads[index], analysis.constant_names):
            stage_of[index] = len(weighted_nodes)
            weighted_nodes.append(index)
            continue
        sources = [stage_of[analysis.producer[n]] for n in analysis.reads[index]
                   if n in analysis.producer and analysis.producer[n] in stage_of]
        stage_of[index] = max(sources, default=-1)
    if not weighted_nodes:
        note = "no weighted operator: the whole graph is one stage"
        return [StagePlan(nodes=compute, weighted=[], notes=[note])]
    consumers: dict[int, list[int]] = {i: [] for i in compute}
    for index in compute:
        for name in analysis.reads[index]:
            source = analysis.producer.get(name)
            if source is not None and source in consumers:
                consumers[source].append(index)
    # Nodes fed only by graph inputs (a leading Transpose) join their earliest
    # consumer rather than forming a weightless stage of their own.
    for index in reversed(compute):
        if stage_of[index] == -1:
            later = [stage_of[c] for c in consumers[index] if stage_of[c] >= 0]
            stage_of[index] = min(later, default=0)

    stage_count = len(weighted_nodes)
    forbidden = _forbidden_cuts(graph, analysis, compute, stage_of, consumers, types,
                                stage_count, max_cut_tensors)
    if min_stage_weight_bytes > 0:
        group_bytes = 0
        for cut, index in enumerate(weighted_nodes[:-1]):
            group_bytes += sum(_constant_bytes(name, graph, types)
                               for name in analysis.reads[index]
                               if name in analysis.constant_names)
            if cut in forbidden:
                continue
            if group_bytes < min_stage_weight_bytes:
                forbidden[cut] = (f"merged with the next stage: fewer than "
                                  f"{min_stage_weight_bytes} weight bytes (--min-stage-bytes)")
            else:
                group_bytes = 0
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
            f"not cut after {_node_label(graph.node[weighted_nodes[cut]], weighted_nodes[cut])}"
            f": {reason}")
    for plan in plans:
        for index in plan.nodes:
            node = graph.node[index]
            if _subgraphs(node):
                plan.notes.append(
                    f"control flow {_node_label(node, index)} stays whole with its "
                    f"{_subgraph_node_count(node)} subgraph nodes"
                    + (f"; its subgraphs read outer tensors {', '.join(_implicit_inputs(node))}"
                       if _implicit_inputs(node) else ""))
    return plans


def _forbidden_cuts(
    graph: onnx.GraphProto,
    analysis: GraphAnalysis,
    compute: list[int],
    stage_of: dict[int, int],
    consumers: dict[int, list[int]],
    types: Mapping[str, onnx.TypeProto],
    stage_count: int,
    max_cut_tensors: int,
) -> dict[int, str]:
    """Cuts (after stage k, k -> k+1) that must not be made, with the reason."""
    live_count = [0] * max(stage_count - 1, 0)
    untyped: dict[int, str] = {}
    for index in compute:
        for name in graph.node[index].output:
            if not name:
                continue
            readers = {stage_of[c] for c in consumers[index] if name in analysis.reads[c]}
            first, last = stage_of[index], max(readers, default=stage_of[index])
            for cut in range(first, last):
                live_count[cut] += 1
                if not _has_known_type(types.get(name)):
                    untyped.setdefault(cut, name)
    # The job's inputs are held too, from the start until their last reader.
    for name in analysis.runtime_inputs:
        readers = {stage_of[c] for c in compute if name in analysis.reads[c]}
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


# --------------------------------------------------------------- writing


@dataclass
class _StageFile:
    stage: Stage
    model: onnx.ModelProto


def _build_stage(
    model: onnx.ModelProto,
    analysis: GraphAnalysis,
    plan: StagePlan,
    stage_id: str,
    stage_of_node: Mapping[int, str],
    needed_outside: set[str],
    types: Mapping[str, onnx.TypeProto],
    output_types: Mapping[str, onnx.TypeProto],
) -> tuple[onnx.ModelProto, Stage]:
    graph = model.graph
    produced: set[str] = set()
    for index in plan.nodes:
        produced.update(n for n in graph.node[index].output if n)
    inputs: dict[str, None] = {}
    constants_read: dict[str, None] = {}
    producers: dict[str, None] = {}
    for index in plan.nodes:
        for name in analysis.reads[index]:
            if name in produced:
                continue
            if name in analysis.constant_names:
                constants_read.setdefault(name)
            else:
                inputs.setdefault(name)
                source = analysis.producer.get(name)
                if source is not None and source in stage_of_node:
                    producers.setdefault(stage_of_node[source])
    # Constants closure: the Constant/ConstantOfShape/... nodes that make the
    # constants this stage reads, and the initializers they start from.
    constant_nodes: set[int] = set()
    initializer_names: set[str] = set()
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
            pending.extend(analysis.reads[source])
        else:
            initializer_names.add(name)
    outputs = [n for index in plan.nodes for n in graph.node[index].output
               if n and n in needed_outside]

    position = {node: rank for rank, node in enumerate(analysis.order)}
    node_list = [graph.node[i] for i in sorted(constant_nodes, key=position.__getitem__)]
    node_list += [graph.node[i] for i in plan.nodes]
    initializers = [t for t in graph.initializer if t.name in initializer_names]
    sparse = [t for t in graph.sparse_initializer if t.values.name in initializer_names]

    def value_info(name: str, table: Mapping[str, onnx.TypeProto]) -> onnx.ValueInfoProto:
        info = onnx.ValueInfoProto(name=name)
        if name in table:
            info.type.CopyFrom(table[name])
        return info

    # Filled in place: building a separate GraphProto and copying it in would
    # copy every weight twice.
    stage_model = onnx.ModelProto(
        ir_version=model.ir_version, producer_name="masa-prepare",
        producer_version=model.producer_version, domain=model.domain,
        model_version=model.model_version,
    )
    stage_model.opset_import.extend(model.opset_import)
    stage_model.functions.extend(model.functions)
    stage_graph = stage_model.graph
    stage_graph.name = f"{graph.name or 'graph'}_{stage_id}"
    stage_graph.node.extend(node_list)
    stage_graph.input.extend(value_info(n, types) for n in inputs)
    if model.ir_version < 4:
        # IR < 4 requires every initializer to be listed as a graph input too;
        # ONNX Runtime still treats them as constants, not runtime inputs.
        stage_graph.input.extend(value_info(t.name, types) for t in initializers)
    stage_graph.output.extend(value_info(n, output_types) for n in outputs)
    stage_graph.initializer.extend(initializers)
    stage_graph.sparse_initializer.extend(sparse)
    internal = [n for node in node_list for n in node.output
                if n and n not in outputs and n in types]
    stage_graph.value_info.extend(value_info(n, types) for n in internal)

    weight_bytes = sum(_constant_bytes(name, graph, types) for name in constants_read)
    weight_bytes += sum(_subgraph_weight_bytes(graph.node[i]) for i in plan.nodes)
    layer_type = _layer_type(graph, plan, analysis, types)
    op_types = tuple(dict.fromkeys(graph.node[i].op_type for i in plan.nodes))
    stage = Stage(
        stage_id=stage_id, file=f"stages/{stage_id}.onnx", sha256="", op_types=op_types,
        layer_type=layer_type,
        inputs=tuple(tensor_spec(n, types.get(n)) for n in inputs),
        outputs=tuple(tensor_spec(n, output_types.get(n)) for n in outputs),
        producers=tuple(producers), weight_bytes=weight_bytes,
        note="; ".join(plan.notes) or None,
    )
    return stage_model, stage


def _constant_bytes(name: str, graph: onnx.GraphProto, types: Mapping[str, onnx.TypeProto]
                    ) -> int:
    spec = tensor_spec(name, types.get(name))
    return spec.size_bytes or 0


def _layer_type(graph: onnx.GraphProto, plan: StagePlan, analysis: GraphAnalysis,
                types: Mapping[str, onnx.TypeProto]) -> str:
    """conv / fc by the weighted operators' kind; a mixed stage by the heavier kind."""
    weight_by_kind: dict[str, int] = {}
    for index in plan.weighted:
        node = graph.node[index]
        kind = weighted_kind(node)
        kinds = [kind] if kind is not None else _subgraph_weighted_types(node)
        weight = sum(_constant_bytes(n, graph, types) for n in analysis.reads[index]
                     if n in analysis.constant_names) + _subgraph_weight_bytes(node)
        for kind in kinds:
            weight_by_kind[kind] = weight_by_kind.get(kind, 0) + weight + 1
    if not weight_by_kind:
        return "other"
    return max(sorted(weight_by_kind), key=weight_by_kind.__getitem__)


def _save_stage(stage_model: onnx.ModelProto, path: Path, external_data_bytes: int) -> str:
    """Write one stage file (fsynced: the directory rename must not outrun it); its sha256."""
    weights = sum(tensor_bytes_estimate(t) for t in stage_model.graph.initializer)
    if weights >= external_data_bytes:
        onnx.save_model(stage_model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=f"{path.name}.data",
                        size_threshold=1024)
        for written in (path, path.with_name(f"{path.name}.data")):
            with open(written, "rb+") as handle:
                os.fsync(handle.fileno())
        return sha256_file(path)
    data = stage_model.SerializeToString()
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return hashlib.sha256(data).hexdigest()


def default_network_name(model_path: str | Path) -> str:
    """The model file's stem, with characters a directory name should not have replaced."""
    stem = Path(model_path).stem
    name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-")
    return name or "network"


def check_network_name(name: str) -> str:
    if not _NAME_PATTERN.fullmatch(name):
        raise UserError(f"--name {name!r}: expected letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit")
    return name


def split_model(
    model_path: str | Path,
    out_dir: str | Path,
    name: str,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    *,
    max_cut_tensors: int = DEFAULT_MAX_CUT_TENSORS,
    min_stage_weight_bytes: int = 0,
    external_data_bytes: int = DEFAULT_EXTERNAL_DATA_BYTES,
    progress: SplitProgress | None = None,
    ort_optimize: bool = False,
    scratch_dir: str | Path | None = None,
) -> NetworkManifest:
    """Split MODEL into `out_dir/stages/*.onnx` and write `out_dir/manifest.yaml`.

    `out_dir` is the network directory itself (created; must be absent or
    empty); `masa prepare` passes a temporary directory and renames it into
    the store afterwards. `input_shapes` fixes input dims ({name: [1, 3, 224,
    224]}; a string dim stays symbolic). With `ort_optimize`, the graph split
    is ONNX Runtime's optimised version of the model (model_prep.optimize),
    made in a temporary directory under `scratch_dir` (default: the system's)
    that is gone when this returns. Returns the manifest (without profiles),
    whose `directory` is `out_dir`.
    """
    check_network_name(name)
    if max_cut_tensors < 1:
        raise UserError(f"--max-cut-tensors: expected a positive integer, got {max_cut_tensors}")
    model_path = Path(model_path)
    source = str(model_path)
    model = load_model(model_path)
    analysis = analyse_graph(model.graph)
    ort_optimized = None
    if ort_optimize:
        # Lazy: the plain split needs no onnxruntime.
        from model_prep.optimize import current_optimization, optimize_for_split

        ort_optimized = current_optimization()
        model = optimize_for_split(model, dict(input_shapes or {}), source,
                                   analysis.runtime_inputs, scratch_dir, model_path)
        analysis = analyse_graph(model.graph)
        input_shapes = None  # applied before optimising
    types, inferred_graph = infer_types(model, dict(input_shapes or {}), source,
                                        analysis.runtime_inputs)
    graph = model.graph
    graph_outputs = [o.name for o in graph.output]
    for output in graph_outputs:
        if output in analysis.constant_names:
            raise UserError(f"{source}: graph output {output!r} is a constant: expected every "
                            "output to be computed from the inputs")
    # Graph outputs keep their declared type where inference found nothing.
    output_types = dict(types)
    for output in inferred_graph.output:
        if output.type.WhichOneof("value") is not None:
            output_types[output.name] = output.type

    if min_stage_weight_bytes < 0:
        raise UserError(f"--min-stage-bytes: expected a non-negative size, got "
                        f"{min_stage_weight_bytes}")
    plans = plan_stages(graph, analysis, types, max_cut_tensors, min_stage_weight_bytes)
    width = max(3, len(str(len(plans) - 1)))
    stage_ids = [f"s{index:0{width}d}" for index in range(len(plans))]
    stage_of_node = {node: stage_ids[k] for k, plan in enumerate(plans) for node in plan.nodes}
    needed_outside = set(graph_outputs)
    for k, plan in enumerate(plans):
        for index in plan.nodes:
            for tensor_name in analysis.reads[index]:
                source_node = analysis.producer.get(tensor_name)
                if source_node is not None and stage_of_node.get(source_node) not in (
                        None, stage_ids[k]):
                    needed_outside.add(tensor_name)

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir}: expected an empty or new directory for the network")
    (out_dir / "stages").mkdir(parents=True, exist_ok=True)
    stages: list[Stage] = []
    for k, plan in enumerate(plans):
        stage_model, stage = _build_stage(model, analysis, plan, stage_ids[k], stage_of_node,
                                          needed_outside, types, output_types)
        path = out_dir / stage.file
        sha256 = _save_stage(stage_model, path, external_data_bytes)
        stages.append(replace(stage, sha256=sha256))
        if progress is not None:
            progress(k + 1, len(plans), stage.stage_id)

    manifest = NetworkManifest(
        name=name,
        source_path=str(model_path.resolve()),
        source_sha256=sha256_file(model_path),
        ir_version=model.ir_version,
        opsets=tuple((o.domain, o.version) for o in model.opset_import),
        inputs=tuple(tensor_spec(n, types.get(n)) for n in analysis.runtime_inputs),
        outputs=tuple(tensor_spec(n, output_types.get(n)) for n in graph_outputs),
        stages=tuple(stages),
        directory=out_dir,
        ort_optimized=ort_optimized,
    )
    write_manifest(manifest, out_dir / MANIFEST_NAME)
    log.info("split %s%s into %d stages (%d weighted operators)", source,
             " (ORT-optimised)" if ort_optimize else "", len(stages),
             sum(len(p.weighted) for p in plans))
    return manifest


def stage_summary(manifest: NetworkManifest) -> Iterable[str]:
    """Lines of a human-readable stage table (for `masa prepare` and the demo)."""
    from masa.common.units import format_bytes

    yield f"{'stage':<8} {'type':<5} {'weights':>10} {'out':>10}  operators"
    for stage in manifest.stages:
        out_bytes = [t.size_bytes for t in stage.outputs]
        out_text = (format_bytes(sum(b for b in out_bytes if b is not None))
                    if out_bytes and None not in out_bytes else "dynamic")
        ops = ",".join(stage.op_types)
        yield (f"{stage.stage_id:<8} {stage.layer_type:<5} {format_bytes(stage.weight_bytes):>10} "
               f"{out_text:>10}  {ops[:60]}{' *' if stage.note else ''}")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
