"""Small hand-built ONNX test models (onnx.helper, seeded random weights).

Each builder returns a checked `onnx.ModelProto` covering one thing a splitter
or executor must handle: where the weights live (initializers, Constant nodes,
IR 3 initializers listed as graph inputs, ConstantOfShape), multi-output
stages, skip connections and branches, control flow reading outer tensors,
model-local functions in a custom domain, an ONNX Runtime contrib op that
onnx cannot type, LSTM, MatMul with and without a weight operand, a wide
fan-out, dynamic batch dims. Any engineer's tests may
import them; `save` writes one to a file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # what onnxruntime 1.18+ loads; the onnx wheel's default may be newer


def save(model: onnx.ModelProto, directory: str | Path, name: str) -> Path:
    """Check and write `model` as directory/name.onnx; return the path."""
    onnx.checker.check_model(model)
    path = Path(directory) / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path


def _weights(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.3
             ) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], initializers: list[onnx.TensorProto],
           name: str, *, ir_version: int = IR_VERSION, opset: int = OPSET,
           extra_opsets: tuple[tuple[str, int], ...] = (),
           functions: list[onnx.FunctionProto] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v)
                                                 for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=ir_version,
                              functions=functions or [], producer_name="masa-tests")
    # Outputs are declared without shapes; inference fills them in (the checker
    # wants a shape on every graph output).
    inferred = onnx.shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    onnx.checker.check_model(model)
    return model


def _image(name: str, batch: int | str = 1, channels: int = 3, size: int = 16
           ) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, channels, size, size])


def _float_out(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def conv_chain(rng: np.random.Generator, batch: int | str = 1) -> onnx.ModelProto:
    """Conv-Relu-Conv-Relu-GAP-Flatten-Gemm with initializer weights: 3 stages."""
    inits = [_weights(rng, "w1", 8, 3, 3, 3), _weights(rng, "b1", 8),
             _weights(rng, "w2", 16, 8, 3, 3), _weights(rng, "b2", 16),
             _weights(rng, "w3", 10, 16), _weights(rng, "b3", 10)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1),
    ]
    return _model(nodes, [_image("x", batch)], [_float_out("y")], inits, "conv_chain")


def constant_node_weights(rng: np.random.Generator) -> onnx.ModelProto:
    """The conv chain with every weight in a Constant node (PaddleOCR-style exports)."""
    chain = conv_chain(rng)
    constants = [helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t)
                 for t in chain.graph.initializer]
    nodes = constants + list(chain.graph.node)
    return _model(nodes, list(chain.graph.input), list(chain.graph.output), [],
                  "constant_nodes")


def ir3_initializer_inputs(rng: np.random.Generator) -> onnx.ModelProto:
    """IR 3 / opset 9: every initializer is also listed as a graph input."""
    inits = [_weights(rng, "w1", 4, 3, 3, 3), _weights(rng, "w2", 6, 4, 1, 1),
             _weights(rng, "w3", 5, 6 * 16 * 16), _weights(rng, "b3", 5)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
        helper.make_node("Flatten", ["c2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1),
    ]
    inputs = [_image("x")] + [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                              for t in inits]
    return _model(nodes, inputs, [_float_out("y")], inits, "ir3_inputs", ir_version=3,
                  opset=9)


def constant_of_shape_weights(rng: np.random.Generator) -> onnx.ModelProto:
    """Weights generated at run time, as in the onnx wheel's light models.

    conv2's weight is ConstantOfShape(shape initializer) * a random scale, so
    the stage that uses it must carry the ConstantOfShape node, the Mul, the
    shape initializer and the scale.
    """
    shape = numpy_helper.from_array(np.array([6, 4, 3, 3], dtype=np.int64), "w2_shape")
    inits = [_weights(rng, "w1", 4, 3, 3, 3), shape,
             _weights(rng, "w2_scale", 6, 4, 3, 3)]
    fill = helper.make_tensor("fill", TensorProto.FLOAT, [1], [0.5])
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("ConstantOfShape", ["w2_shape"], ["w2_base"], name="make_w2",
                         value=fill),
        helper.make_node("Mul", ["w2_base", "w2_scale"], ["w2"], name="scale_w2"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    return _model(nodes, [_image("x")], [_float_out("y")], inits, "constant_of_shape")


def multi_output_stage(rng: np.random.Generator) -> onnx.ModelProto:
    """The first stage has three outputs: two Split halves and a graph output."""
    inits = [_weights(rng, "w1", 8, 3, 3, 3), _weights(rng, "w2", 5, 4, 1, 1),
             _weights(rng, "w3", 7, 4, 1, 1),
             numpy_helper.from_array(np.array([4, 4], dtype=np.int64), "halves")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["features"], name="relu1"),
        helper.make_node("Split", ["features", "halves"], ["a", "b"], name="split", axis=1),
        helper.make_node("Conv", ["a", "w2"], ["y1"], name="conv_a"),
        helper.make_node("Conv", ["b", "w3"], ["y2"], name="conv_b"),
    ]
    outputs = [_float_out("features"), _float_out("y1"), _float_out("y2")]
    return _model(nodes, [_image("x")], outputs, inits, "multi_output")


def residual_branches(rng: np.random.Generator, batch: int | str = 1) -> onnx.ModelProto:
    """A ResNet-style skip connection and an Inception-style branch + Concat."""
    inits = [_weights(rng, "w0", 8, 3, 3, 3), _weights(rng, "wa", 8, 8, 3, 3),
             _weights(rng, "wb", 8, 8, 3, 3), _weights(rng, "wc", 4, 8, 1, 1),
             _weights(rng, "wd", 4, 8, 3, 3), _weights(rng, "wy", 3, 16 * 8 * 8),
             numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "flat")]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="stem_relu"),
        helper.make_node("Conv", ["r0", "wa"], ["ca"], name="res_a", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["ca"], ["ra"], name="res_a_relu"),
        helper.make_node("Conv", ["ra", "wb"], ["cb"], name="res_b", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["cb", "r0"], ["sum"], name="skip_add"),
        helper.make_node("Relu", ["sum"], ["rs"], name="res_relu"),
        helper.make_node("Conv", ["rs", "wc"], ["bc"], name="branch_1x1"),
        helper.make_node("Conv", ["rs", "wd"], ["bd"], name="branch_3x3", pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["rs"], ["bp"], name="branch_pool", kernel_shape=[3, 3],
                         pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Concat", ["bc", "bd", "bp"], ["cat"], name="concat", axis=1),
        helper.make_node("MaxPool", ["cat"], ["pooled"], name="pool", kernel_shape=[2, 2],
                         strides=[2, 2]),
        helper.make_node("Reshape", ["pooled", "flat"], ["flattened"], name="reshape"),
        helper.make_node("Gemm", ["flattened", "wy"], ["y"], name="head", transB=1),
    ]
    return _model(nodes, [_image("x", batch)], [_float_out("y")], inits, "residual_branches")


def control_flow(rng: np.random.Generator) -> onnx.ModelProto:
    """An If whose branches read an outer activation and an outer weight."""
    inits = [_weights(rng, "w_in", 6, 8), _weights(rng, "w_then", 8, 8),
             _weights(rng, "w_out", 8, 4)]
    then_graph = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w_then"], ["then_out"], name="then_matmul")],
        "then", [], [_float_out("then_out")])
    else_graph = helper.make_graph(
        [helper.make_node("Relu", ["h"], ["else_out"], name="else_relu")],
        "else", [], [_float_out("else_out")])
    nodes = [
        helper.make_node("MatMul", ["x", "w_in"], ["h"], name="fc_in"),
        helper.make_node("If", ["flag"], ["branch"], name="choose", then_branch=then_graph,
                         else_branch=else_graph),
        helper.make_node("Tanh", ["branch"], ["t"], name="tanh"),
        helper.make_node("MatMul", ["t", "w_out"], ["y"], name="fc_out"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
              helper.make_tensor_value_info("flag", TensorProto.BOOL, [])]
    return _model(nodes, inputs, [_float_out("y")], inits, "control_flow")


CUSTOM_DOMAIN = "masa.test"


def custom_function(rng: np.random.Generator) -> onnx.ModelProto:
    """A model-local function in a custom domain (ORT inlines it) between two convs."""
    scale_shift = helper.make_function(
        CUSTOM_DOMAIN, "ScaleShift", ["v"], ["out"],
        [helper.make_node("Constant", [], ["two"], value_float=2.0),
         helper.make_node("Mul", ["v", "two"], ["doubled"]),
         helper.make_node("Sigmoid", ["doubled"], ["out"])],
        opset_imports=[helper.make_opsetid("", OPSET)],
    )
    inits = [_weights(rng, "w1", 4, 3, 3, 3), _weights(rng, "w2", 2, 4, 3, 3)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("ScaleShift", ["c1"], ["s1"], name="custom", domain=CUSTOM_DOMAIN),
        helper.make_node("Conv", ["s1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    return _model(nodes, [_image("x")], [_float_out("y")], inits, "custom_function",
                  extra_opsets=((CUSTOM_DOMAIN, 1),), functions=[scale_shift])


def lstm_head(rng: np.random.Generator) -> onnx.ModelProto:
    """LSTM (weights W, R, B) then a Gemm on the last hidden state: two fc stages."""
    hidden, features, steps = 6, 5, 4
    inits = [_weights(rng, "W", 1, 4 * hidden, features), _weights(rng, "R", 1, 4 * hidden,
                                                                   hidden),
             _weights(rng, "B", 1, 8 * hidden), _weights(rng, "w_fc", 3, hidden),
             numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0")]
    nodes = [
        helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h_last"], name="lstm",
                         hidden_size=hidden),
        helper.make_node("Squeeze", ["h_last", "axis0"], ["h"], name="squeeze"),
        helper.make_node("Gemm", ["h", "w_fc"], ["y"], name="fc", transB=1),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 2, features])]
    return _model(nodes, inputs, [_float_out("y")], inits, "lstm_head")


def matmul_attention(rng: np.random.Generator) -> onnx.ModelProto:
    """MatMul with a weight (a stage) and MatMul of two activations (not a stage)."""
    inits = [_weights(rng, "wq", 8, 8), _weights(rng, "wv", 8, 3)]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="project"),
        helper.make_node("Transpose", ["x"], ["xt"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "xt"], ["scores"], name="scores"),
        helper.make_node("Softmax", ["scores"], ["attention"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["attention", "x"], ["mixed"], name="mix"),
        helper.make_node("MatMul", ["mixed", "wv"], ["y"], name="value"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])]
    return _model(nodes, inputs, [_float_out("y")], inits, "matmul_attention")


def wide_fanout(rng: np.random.Generator, branches: int = 12) -> onnx.ModelProto:
    """One input into `branches` parallel 1x1 convs, all concatenated at the end.

    Cutting between the branches would carry up to `branches` live tensors.
    """
    inits = [_weights(rng, f"w{k}", 2, 3, 1, 1) for k in range(branches)]
    nodes = [helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], name=f"branch{k}")
             for k in range(branches)]
    nodes.append(helper.make_node("Concat", [f"c{k}" for k in range(branches)], ["y"],
                                  name="concat", axis=1))
    return _model(nodes, [_image("x", size=8)], [_float_out("y")], inits, "wide_fanout")


def weightless(rng: np.random.Generator) -> onnx.ModelProto:
    """No weighted operator at all: the whole graph is one stage."""
    bias = _weights(rng, "bias", 1, 3, 1, 1)
    nodes = [helper.make_node("Add", ["x", "bias"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    return _model(nodes, [_image("x", size=4)], [_float_out("y")], [bias], "weightless")


def contrib_op(rng: np.random.Generator) -> onnx.ModelProto:
    """An ONNX Runtime contrib op (com.microsoft Gelu) that onnx cannot type.

    Shape inference leaves the Gelu output untyped, so the cut after it is
    refused and its stage merged with the next.
    """
    inits = [_weights(rng, "w1", 4, 3, 3, 3), _weights(rng, "w2", 4, 4, 3, 3),
             _weights(rng, "w3", 2, 4, 3, 3)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Gelu", ["c2"], ["g2"], name="gelu", domain="com.microsoft"),
        helper.make_node("Conv", ["g2", "w3"], ["y"], name="conv3", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "contrib_op", [_image("x")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                             [1, 2, 16, 16])], inits)
    model = helper.make_model(graph, ir_version=IR_VERSION, producer_name="masa-tests",
                              opset_imports=[helper.make_opsetid("", OPSET),
                                             helper.make_opsetid("com.microsoft", 1)])
    onnx.checker.check_model(model)
    return model


ALL_BUILDERS = {
    "conv_chain": conv_chain,
    "constant_nodes": constant_node_weights,
    "ir3_inputs": ir3_initializer_inputs,
    "constant_of_shape": constant_of_shape_weights,
    "multi_output": multi_output_stage,
    "residual_branches": residual_branches,
    "control_flow": control_flow,
    "custom_function": custom_function,
    "lstm_head": lstm_head,
    "matmul_attention": matmul_attention,
    "wide_fanout": wide_fanout,
    "weightless": weightless,
    "contrib_op": contrib_op,
}
