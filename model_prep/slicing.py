"""Slicing: a weighted operator too large for one stage becomes several, then a Concat.

This module owns the graph rewrite behind `masa prepare --max-stage-bytes SIZE`
(and `--target-memory SIZE`, which derives that size from a memory budget).
A stage's LOAD must fit in the budget next to what else runs; one huge fully
connected layer (EmotionNet's fc6: 288 MiB of weights) makes that stage a
serial section of every schedule, or impossible under a small budget. As
FlexNN (MobiCom 2024) does, an operator whose constant weights exceed the
limit is cut along its *output* dimension into K slices that each read the
whole input and compute a disjoint block of the outputs:

- Gemm: B's output-feature axis (axis 0 with transB=1, else axis 1), C sliced
  along its last axis when it spans the outputs (a scalar C is shared);
- MatMul with a constant 2-D right operand: B's columns;
- Conv with group = 1: the weight's output channels (axis 0) and the bias.

The slices' outputs are joined as a chain, ``Z1 = Y1``, ``Zi = Concat(Zi-1, Yi)``,
so every cut between two slice stages carries only the input and the partial
result (two tensors), whatever K is; the last Concat writes the original
output name, so the rest of the graph is unchanged. The stage planner then
makes each slice a stage of its own (each is a weighted operator) and the
scheduler loads and runs them like any stage.

Each output element is the same dot product over the same inputs as before,
so the outputs equal the unsliced model's up to the kernel's summation order:
tests/test_slicing.py checks max|diff| <= 1e-5 x max|output| (the `masa verify`
rule) and measured 0 on its Gemm/MatMul/Conv models. Refused, and left whole
(with a reason in the returned notes): weights that are not initializers
(Constant nodes), a grouped Conv, a Gemm bias computed at run time, operators
whose output dimension is smaller than the number of slices needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from masa.common.errors import UserError

SLICEABLE_OPS = ("Gemm", "MatMul", "Conv")
# --target-memory B: a stage's weights at most B / TARGET_FRACTION. Loading a
# copied fc stage peaks at about 2x its weights (1x when mapped), so two workers
# loading the largest stages at once take at most a quarter of the budget, and
# masa keeps its pinned stages (masa.sched.keeping) in the rest. With B / 4 (until
# 2026-11-28) those two LOADs could take the whole budget and nothing was pinned:
# in simulation, copied weights at 512 MiB, every operator above 32 MiB sliced
# made masa 0.41x Bulk in mixed against 0.77x above 128 MiB, with the same EXEC
# time (9.1 against 8.7 s for 100 jobs), 10% less LOAD time and 0.8% more
# resident memory (docs/scheduling.md, "Kept loaded stages").
TARGET_FRACTION = 16
# Beyond this many slices per operator, the per-stage overheads (a session,
# a run call, the input read again) outweigh what a smaller stage buys.
MAX_SLICES = 64


@dataclass(frozen=True)
class SliceNote:
    """What happened to one oversized operator."""

    node: str  # "Gemm 'fc6'"
    weight_bytes: int
    slices: int  # 1: left whole (see reason)
    reason: str = ""


def max_stage_bytes_for_target(target_memory_bytes: int) -> int:
    """The slicing limit derived from a memory budget (see TARGET_FRACTION)."""
    if target_memory_bytes <= 0:
        raise UserError(f"--target-memory: expected a positive size, got {target_memory_bytes}")
    return max(1, target_memory_bytes // TARGET_FRACTION)


def _label(node: onnx.NodeProto, index: int) -> str:
    return f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} #{index}"


def _out_axis(node: onnx.NodeProto) -> tuple[int, int, int]:
    """(input index of the sliced weight, its axis to cut, the output's concat axis)."""
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 1, 0 if trans_b else 1, 1
    if node.op_type == "MatMul":
        return 1, 1, -1
    return 1, 0, 1  # Conv: weight (M, C, kH, kW), output (N, M, H, W)


def _refusal(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto], parts: int) -> str:
    """Why this operator cannot be sliced ("" when it can)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in SLICEABLE_OPS:
        return "not a Gemm, MatMul or Conv"
    if len(node.input) < 2 or node.input[1] not in weights:
        return "its weight is not an initializer"
    weight = weights[node.input[1]]
    if node.op_type == "MatMul" and len(weight.dims) != 2:
        return "MatMul weight is not 2-D"
    if node.op_type == "Conv" and any(a.name == "group" and a.i != 1 for a in node.attribute):
        return "grouped Conv"
    if len(node.input) > 2 and node.input[2] and node.input[2] not in weights:
        return "its bias is computed at run time"
    _, axis, _ = _out_axis(node)
    if weight.dims[axis] < parts:
        return f"{weight.dims[axis]} outputs, fewer than the {parts} slices needed"
    if parts > MAX_SLICES:
        return f"{parts} slices needed, more than {MAX_SLICES}"
    return ""


def _parts(node: onnx.NodeProto, weights: dict[str, onnx.TensorProto], weight_bytes: int,
           max_stage_bytes: int) -> int:
    """Slices needed so that the largest (ceil(outputs / K) outputs) holds at most the limit."""
    parts = math.ceil(weight_bytes / max_stage_bytes)
    if len(node.input) < 2 or node.input[1] not in weights:
        return parts
    outputs = weights[node.input[1]].dims[_out_axis(node)[1]]
    per_slice = weight_bytes * 1.0 / max(1, outputs)
    outputs_per_slice = int(max_stage_bytes // per_slice)
    if outputs_per_slice < 1:
        return outputs + 1  # one output alone exceeds the limit: refused
    return max(parts, math.ceil(outputs / outputs_per_slice))


def _slice_bias(bias: np.ndarray, bounds: Sequence[int], index: int) -> np.ndarray:
    """A bias block for slice `index`; biases that do not span the outputs are shared."""
    if bias.ndim == 0 or bias.shape[-1] == 1:
        return bias
    return bias[..., bounds[index]:bounds[index + 1]]


def _slice_node(node: onnx.NodeProto, index: int, parts: int,
                weights: dict[str, onnx.TensorProto]) -> tuple[list[onnx.NodeProto],
                                                               list[onnx.TensorProto]]:
    """The K slice nodes and the Concat chain replacing `node`, and their weights."""
    weight_index, axis, concat_axis = _out_axis(node)
    weight = numpy_helper.to_array(weights[node.input[weight_index]])
    bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    bias = numpy_helper.to_array(weights[bias_name]) if bias_name else None
    bounds = [int(b) for b in np.linspace(0, weight.shape[axis], parts + 1).round()]
    base = node.name or f"{node.op_type.lower()}{index}"
    nodes: list[onnx.NodeProto] = []
    tensors: list[onnx.TensorProto] = []
    joined = ""
    for part in range(parts):
        block = np.take(weight, range(bounds[part], bounds[part + 1]), axis=axis)
        weight_name = f"{node.input[weight_index]}__slice{part}"
        tensors.append(numpy_helper.from_array(np.ascontiguousarray(block), weight_name))
        inputs = [node.input[0], weight_name]
        if bias is not None:
            inputs.append(f"{bias_name}__slice{part}")
            tensors.append(numpy_helper.from_array(
                np.ascontiguousarray(_slice_bias(bias, bounds, part)), inputs[-1]))
        output = f"{node.output[0]}__slice{part}"
        sliced = helper.make_node(node.op_type, inputs, [output], name=f"{base}__slice{part}",
                                  domain=node.domain)
        sliced.attribute.extend(node.attribute)
        nodes.append(sliced)
        if part == 0:
            joined = output
            continue
        target = node.output[0] if part == parts - 1 else f"{node.output[0]}__upto{part}"
        nodes.append(helper.make_node("Concat", [joined, output], [target],
                                      name=f"{base}__concat{part}", axis=concat_axis))
        joined = target
    return nodes, tensors


def slice_model(model: onnx.ModelProto, max_stage_bytes: int
                ) -> tuple[onnx.ModelProto, list[SliceNote]]:
    """A copy of `model` with every sliceable operator whose constant inputs hold
    more than `max_stage_bytes` split into ceil(weights / limit) slices.

    Only top-level nodes are considered (control-flow subgraphs stay whole).
    Weights must be loaded (not external references). Returns the new model
    and one note per operator over the limit (sliced or why not).
    """
    if max_stage_bytes <= 0:
        raise UserError(f"--max-stage-bytes: expected a positive size, got {max_stage_bytes}")
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    notes: list[SliceNote] = []
    new_nodes: list[onnx.NodeProto] = []
    new_weights: list[onnx.TensorProto] = []
    replaced: set[str] = set()
    for index, node in enumerate(graph.node):
        weight_bytes = sum(_tensor_bytes(weights[name]) for name in node.input
                           if name in weights)
        if node.op_type not in SLICEABLE_OPS or weight_bytes <= max_stage_bytes:
            new_nodes.append(node)
            continue
        parts = _parts(node, weights, weight_bytes, max_stage_bytes)
        reason = _refusal(node, weights, parts)
        notes.append(SliceNote(_label(node, index), weight_bytes, 1 if reason else parts,
                               reason))
        if reason:
            new_nodes.append(node)
            continue
        nodes, tensors = _slice_node(node, index, parts, weights)
        new_nodes += nodes
        new_weights += tensors
        replaced.update(name for name in node.input[1:] if name in weights)
    if not new_weights:
        return model, notes
    still_read = {name for node in new_nodes for name in node.input}
    sliced = onnx.ModelProto()
    sliced.CopyFrom(model)
    del sliced.graph.node[:]
    sliced.graph.node.extend(new_nodes)
    dropped = replaced - still_read
    kept = [t for t in graph.initializer if t.name not in dropped]
    del sliced.graph.initializer[:]
    sliced.graph.initializer.extend(kept + new_weights)
    # IR < 4 lists initializers as graph inputs too.
    inputs = [value for value in graph.input if value.name not in dropped]
    del sliced.graph.input[:]
    sliced.graph.input.extend(inputs)
    return sliced, notes


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    elements = math.prod(tensor.dims)
    itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return elements * itemsize
