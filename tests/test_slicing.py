"""Slicing oversized weighted operators (model_prep.slicing, `masa prepare --max-stage-bytes`).

Models are built with onnx.helper and seeded weights; outputs of the sliced
model (whole and split into stages) are compared with the unsliced model's
within the `masa verify` tolerance (1e-5 x max|output|).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from masa.common.errors import UserError
from masa.runtime.runner import load_manifests
from masa.sched.jobs import JobSpec, build_job_graph
from model_prep.prepare_cli import prepare_network
from model_prep.slicing import max_stage_bytes_for_target, slice_model
from model_prep.verify import verify_network

TOLERANCE = 1e-5  # relative to max|output|, as `masa verify`


def _weights(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)


def conv_fc_model(rng: np.random.Generator, *, trans_b: int = 1, group: int = 1,
                  bias_2d: bool = False) -> onnx.ModelProto:
    """Conv (16 channels) -> Relu -> Flatten -> Gemm (40 outputs) -> MatMul (30)."""
    image = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    gemm_weight = (_weights(rng, "gw", 40, 16 * 8 * 8) if trans_b
                   else _weights(rng, "gw", 16 * 8 * 8, 40))
    bias = _weights(rng, "gb", 1, 40) if bias_2d else _weights(rng, "gb", 40)
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         group=group),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["g"], name="fc", transB=trans_b,
                         alpha=0.5, beta=2.0),
        helper.make_node("MatMul", ["g", "mw"], ["y"], name="mm"),
    ]
    inits = [_weights(rng, "cw", 16, 4 // group, 3, 3), _weights(rng, "cb", 16), gemm_weight,
             bias, _weights(rng, "mw", 40, 30)]
    graph = helper.make_graph(nodes, "conv_fc", [image], [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, feed: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": feed})[0]


@pytest.mark.parametrize(("trans_b", "bias_2d"), [(1, False), (0, False), (1, True)])
@pytest.mark.parametrize(("limit_bytes", "expected"), [
    # conv 2,368 B, fc 164,000 B, mm 4,800 B of weights and biases
    (2_000, {"Conv": 2, "Gemm": 1, "MatMul": 3}),  # fc would need 82 slices of 40 outputs
    (20_000, {"Conv": 1, "Gemm": 10, "MatMul": 1}),  # 4 outputs of 4,100 B each
])
def test_sliced_model_computes_the_unsliced_outputs(trans_b: int, bias_2d: bool,
                                                    limit_bytes: int,
                                                    expected: dict[str, int]) -> None:
    rng = np.random.default_rng(3)
    model = conv_fc_model(rng, trans_b=trans_b, bias_2d=bias_2d)
    sliced, notes = slice_model(model, limit_bytes)
    onnx.checker.check_model(sliced)
    ops = [node.op_type for node in sliced.graph.node]
    assert {op: ops.count(op) for op in expected} == expected
    assert ops.count("Concat") == sum(expected.values()) - len(expected)
    assert all(note.reason or note.slices > 1 for note in notes)
    # Each slice holds at most the limit (a slice's bias is counted with it).
    weights = {t.name: t for t in sliced.graph.initializer}
    for node in sliced.graph.node:
        if "__slice" in node.name:
            assert sum(numpy_helper.to_array(weights[n]).nbytes
                       for n in node.input if n in weights) <= limit_bytes
    feed = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = _run(model, feed)
    assert np.abs(_run(sliced, feed) - want).max() <= TOLERANCE * np.abs(want).max()


def test_grouped_conv_and_small_operators_are_left_whole() -> None:
    model = conv_fc_model(np.random.default_rng(4), group=2)
    sliced, notes = slice_model(model, 1_000)
    reasons = {note.node: note.reason for note in notes}
    assert reasons["Conv 'conv'"] == "grouped Conv"
    assert "fewer than" in reasons["Gemm 'fc'"]  # 164,000 B / 1,000 B > 40 outputs
    assert [node.op_type for node in sliced.graph.node].count("Conv") == 1
    unchanged, none = slice_model(model, 10**9)
    assert unchanged is model and none == []


def test_limits_must_be_positive() -> None:
    model = conv_fc_model(np.random.default_rng(5))
    with pytest.raises(UserError, match="--max-stage-bytes"):
        slice_model(model, 0)
    with pytest.raises(UserError, match="--target-memory"):
        max_stage_bytes_for_target(0)
    assert max_stage_bytes_for_target(512 * 2**20) == 32 * 2**20


def test_prepared_slices_are_stages_the_task_graph_schedules(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    model_path = tmp_path / "net.onnx"
    onnx.save_model(conv_fc_model(rng), str(model_path))
    whole = prepare_network(model_path, tmp_path / "store", "whole", profile=False)
    prepared = prepare_network(model_path, tmp_path / "store", "sliced", profile=False,
                               max_stage_weight_bytes=50_000)
    assert len(whole.manifest.stages) == 3
    # fc (164,000 B) -> 4 slices; conv and mm fit.
    assert len(prepared.manifest.stages) == 6
    assert max(stage.weight_bytes for stage in prepared.manifest.stages) <= 50_000
    result = verify_network(prepared.manifest, model_path, np.random.default_rng(0))
    assert result.ok
    manifests = load_manifests(tmp_path / "store", ["sliced"])
    graph = build_job_graph(JobSpec(0, 0, ("sliced",)), manifests, ["sliced"])
    loads = [t for t in graph.tasks if t.kind.value == "load"]
    assert len(loads) == 6


def test_a_budget_below_a_layer_names_the_slicing_that_fits_it(tmp_path: Path) -> None:
    """`masa run` refuses a budget below the largest LOAD's need; where that LOAD is a
    layer slicing can split, the error says so, and preparing the network with
    --target-memory at that budget makes the same budget acceptable."""
    from masa.runtime.runner import check_budget

    rng = np.random.default_rng(8)
    model_path = tmp_path / "net.onnx"
    onnx.save_model(conv_fc_model(rng), str(model_path))
    prepare_network(model_path, tmp_path / "store", "whole", profile=False, load_mode="copy")
    graph = build_job_graph(JobSpec(0, 0, ("whole",)),
                            load_manifests(tmp_path / "store", ["whole"]), ["whole"])
    largest_bytes = max(graph.footprint_bytes(t.task_id) for t in graph.tasks)
    budget_bytes = (largest_bytes * 3 // 4) // 1024 * 1024
    with pytest.raises(UserError, match=rf"prepare whole again with --target-memory "
                                        rf"{budget_bytes // 1024}KiB"):
        check_budget(graph, budget_bytes)
    prepare_network(model_path, tmp_path / "store", "sliced", profile=False, load_mode="copy",
                    max_stage_weight_bytes=max_stage_bytes_for_target(budget_bytes))
    sliced = build_job_graph(JobSpec(0, 0, ("sliced",)),
                             load_manifests(tmp_path / "store", ["sliced"]), ["sliced"])
    check_budget(sliced, budget_bytes)
