"""What the splitter reads from an ONNX graph: node records for the planner, structure checks.

This module owns the protobuf side of graph analysis: which operator types
carry weights (`WEIGHTED_OPS`, and ONNX Runtime's contrib operators in
`CONTRIB_WEIGHTED_OPS`), what a node's subgraphs (If, Loop, Scan bodies) read
from the outer scope and hold, and `node_records`, which turns a GraphProto
into the plain `NodeRecord`s model_prep.planner plans stages from.
`check_structure` refuses graphs that read names nothing defines (truncated
files).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from masa.common.errors import UserError
from model_prep.planner import STANDARD_DOMAINS, GraphAnalysis, NodeRecord, analyse
from model_prep.shapes import tensor_bytes_estimate

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


def read_graph(graph: onnx.GraphProto) -> tuple[list[NodeRecord], GraphAnalysis]:
    """The planner's records of every node, and its analysis (UserError on a cycle)."""
    records = node_records(graph)
    return records, analyse(records, initializer_names(graph), [i.name for i in graph.input])


def initializer_names(graph: onnx.GraphProto) -> set[str]:
    names = {t.name for t in graph.initializer}
    names |= {t.values.name for t in graph.sparse_initializer}
    return names


def node_records(graph: onnx.GraphProto) -> list[NodeRecord]:
    """One `NodeRecord` per node, in file order (a record's index is the node's)."""
    records: list[NodeRecord] = []
    for index, node in enumerate(graph.node):
        implicit = implicit_inputs(node)
        records.append(NodeRecord(
            label=node_label(node, index),
            op_type=node.op_type,
            domain=node.domain,
            reads=tuple(dict.fromkeys([n for n in node.input if n] + implicit)),
            outputs=tuple(n for n in node.output if n),
            kind=weighted_kind(node),
            control_flow=bool(subgraphs(node)),
            subgraph_kinds=tuple(subgraph_weighted_types(node)),
            subgraph_nodes=subgraph_node_count(node),
            implicit_inputs=tuple(implicit),
            subgraph_weight_bytes=subgraph_weight_bytes(node),
        ))
    return records


def node_label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"


def weighted_kind(node: onnx.NodeProto) -> str | None:
    """'conv' or 'fc' for an operator type that carries weights (when one of its
    operands is constant), None for the rest."""
    if node.domain in STANDARD_DOMAINS:
        return WEIGHTED_OPS.get(node.op_type)
    return CONTRIB_WEIGHTED_OPS.get((node.domain, node.op_type))


# --------------------------------------------------------------- subgraphs


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs: list[onnx.GraphProto] = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attribute.graphs)
    return graphs


def implicit_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names a node's subgraphs read (If/Loop/Scan bodies), in first-use order."""
    found: dict[str, None] = {}
    for graph in subgraphs(node):
        for name in _graph_outer_refs(graph):
            found.setdefault(name)
    return list(found)


def _graph_outer_refs(graph: onnx.GraphProto) -> list[str]:
    defined = {i.name for i in graph.input} | initializer_names(graph)
    refs: dict[str, None] = {}
    for node in graph.node:
        for name in list(node.input) + implicit_inputs(node):
            if name and name not in defined:
                refs.setdefault(name)
        defined.update(node.output)
    for output in graph.output:
        if output.name not in defined:
            refs.setdefault(output.name)
    return list(refs)


def subgraph_node_count(node: onnx.NodeProto) -> int:
    return sum(len(g.node) + sum(subgraph_node_count(n) for n in g.node)
               for g in subgraphs(node))


def subgraph_weighted_types(node: onnx.NodeProto) -> list[str]:
    types: list[str] = []
    for graph in subgraphs(node):
        for inner in graph.node:
            kind = weighted_kind(inner)
            if kind is not None:
                types.append(kind)
            types.extend(subgraph_weighted_types(inner))
    return types


def subgraph_weight_bytes(node: onnx.NodeProto) -> int:
    total = 0
    for graph in subgraphs(node):
        total += sum(tensor_bytes_estimate(t) for t in graph.initializer)
        for inner in graph.node:
            if inner.op_type == "Constant":
                for attribute in inner.attribute:
                    if attribute.type == onnx.AttributeProto.TENSOR:
                        total += tensor_bytes_estimate(attribute.t)
            total += subgraph_weight_bytes(inner)
    return total


# --------------------------------------------------------------- structure


def check_structure(graph: onnx.GraphProto, path: Path) -> None:
    """Every name a node reads must be defined before it (catches truncated files)."""
    problems: list[str] = []
    defined = {i.name for i in graph.input} | initializer_names(graph)
    for index, node in enumerate(graph.node):
        for slot, name in enumerate(node.input):
            if name and name not in defined:
                problems.append(f"{path}: at 'graph.node[{index}].input[{slot}]': {name!r} is "
                                "not produced by any earlier node, initializer or graph input")
        for name in implicit_inputs(node):
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
