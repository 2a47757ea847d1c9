"""Tensor types: fixed input shapes, one shape inference, and the manifest's view of a tensor.

This module owns what the plain split and the ORT-optimised split
(model_prep.optimize) both need to know about tensors: `parse_input_shape` and
`apply_input_shapes` (`--input-shape`), `infer_types` (shape inference once,
on a copy without the large weights), `tensor_spec` (dtype, dims with
dynamic ones as strings, exact bytes) and `tensor_bytes_estimate`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, shape_inference

from masa.common.errors import UserError, one_line
from model_prep.manifest import TensorSpec

# Initializers at least this large are left out of the copy that shape
# inference sees (they become typed inputs): inference then copies kilobytes,
# not the weights. Shape-carrying tensors are far smaller.
_SKELETON_INITIALIZER_BYTES = 64 * 1024
UNKNOWN_RANK = "*"  # TensorSpec.shape of a tensor whose rank is unknown
UNKNOWN_DIM = "?"  # a dim that is neither a number nor a named symbol


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
    """Fix the dims of the named runtime inputs in place; UserError for a name or rank
    the model does not have."""
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
    # A negative dim_value (-1 in PaddleOCR exports) means "dynamic", as in ORT.
    shape: tuple[int | str, ...] = tuple(
        d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
        else (d.dim_param or UNKNOWN_DIM)
        for d in tensor_type.shape.dim
    )
    itemsize = _itemsize(tensor_type.elem_type) if tensor_type.elem_type else 0
    static = all(isinstance(d, int) for d in shape)
    size_bytes = int(np.prod(shape, dtype=np.int64)) * itemsize if static and itemsize else None
    return TensorSpec(name=name, dtype=dtype, shape=shape, size_bytes=size_bytes)


def has_known_type(value_type: onnx.TypeProto | None) -> bool:
    """Whether shape inference found the element type (or the kind of a non-tensor)."""
    if value_type is None:
        return False
    kind = value_type.WhichOneof("value")
    if kind == "tensor_type":
        return value_type.tensor_type.elem_type != 0
    return kind is not None
