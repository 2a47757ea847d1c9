"""`masa prepare` runs the stages on a sample, fixes the cut tensors' shapes, profiles on them.

Hand-built models reproduce what broke profiling on real detection and OCR
models (issue 13): a Reshape whose target is computed from an upstream `Shape`
in an earlier stage (random integers there are not a shape), an LSTM fed
through it (its input shape unknown to shape inference), control flow (If,
Loop, Scan) kept whole in one stage. Real models from wheels are
tests/test_wheel_models.py's.
"""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from masa.cli.main import main
from masa.common.errors import RunFailed, UserError
from model_prep.manifest import TensorSpec, load_manifest
from model_prep.prepare_cli import prepare_network
from model_prep.sample_run import SAMPLE_DIM, Observed, SampleRun, sample_feeds
from model_prep.stage_shapes import check_stages_load, settle_shapes
from model_prep.verify import run_whole_model

pytestmark = [pytest.mark.real, pytest.mark.profile, pytest.mark.slow]

HIDDEN = 6


def _weights(rng: np.random.Generator, name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def computed_reshape_lstm(width: int | str = "width") -> onnx.ModelProto:
    """Conv -> (Shape -> Gather -> Concat: a Reshape target) | Conv -> Reshape -> LSTM -> Gemm.

    The Reshape target is computed in the first stage and read in the second:
    an int64 tensor crosses the cut. The LSTM reads the Reshape's output, a
    sequence as long as the input is wide.
    """
    rng = np.random.default_rng(0)
    inits = [_weights(rng, "w1", 4, 1, 3, 3), _weights(rng, "w2", 4, 4, 3, 3),
             _weights(rng, "W", 1, 4 * HIDDEN, 16), _weights(rng, "R", 1, 4 * HIDDEN, HIDDEN),
             _weights(rng, "B", 1, 8 * HIDDEN), _weights(rng, "w_fc", 3, HIDDEN),
             _ints("axis3", [3]), _ints("one_minus", [1, -1]), _ints("zero", [0])]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c1"], ["c1_shape"], name="shape"),
        helper.make_node("Gather", ["c1_shape", "axis3"], ["seq"], name="seq_len"),
        helper.make_node("Concat", ["seq", "one_minus"], ["target"], name="target", axis=0),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c2"], ["t2"], name="time_first", perm=[3, 0, 1, 2]),
        helper.make_node("Reshape", ["t2", "target"], ["seq_in"], name="reshape"),
        helper.make_node("LSTM", ["seq_in", "W", "R", "B"], ["", "h_last"], name="lstm",
                         hidden_size=HIDDEN),
        helper.make_node("Squeeze", ["h_last", "zero"], ["h"], name="squeeze"),
        helper.make_node("Gemm", ["h", "w_fc"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "computed_reshape_lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return _make(graph)


def _make(graph: onnx.GraphProto) -> onnx.ModelProto:
    """The model, its outputs typed by shape inference (the checker wants a shape)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", models.OPSET)],
                              ir_version=models.IR_VERSION)
    inferred = onnx.shape_inference.infer_shapes(model)
    for output, typed in zip(model.graph.output, inferred.graph.output, strict=True):
        if typed.type.tensor_type.HasField("shape"):
            output.type.CopyFrom(typed.type)
    onnx.checker.check_model(model)
    return model


def _prepare(tmp_path: Path, model: onnx.ModelProto, name: str, **kwargs: object):
    path = models.save(model, tmp_path, name)
    kwargs.setdefault("profile_runs", 1)
    kwargs.setdefault("show_progress", False)
    return path, prepare_network(path, tmp_path / "store", name, **kwargs).manifest


def _infer(tmp_path: Path, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    np.savez(tmp_path / "x.npz", **feeds)
    out = tmp_path / "y.npz"
    assert main(["-q", "infer", "--store", str(tmp_path / "store"), "--model", name,
                 "--input", str(tmp_path / "x.npz"), "--out", str(out)]) == 0
    with np.load(out) as outputs:
        return {key: outputs[key] for key in outputs.files}


def _assert_matches_whole(tmp_path: Path, model_path: Path, name: str,
                          feeds: dict[str, np.ndarray]) -> None:
    manifest = load_manifest(tmp_path / "store" / name)
    whole = run_whole_model(model_path, manifest, feeds)
    staged = _infer(tmp_path, name, feeds)
    for output, expected in whole.items():
        scale = max(1e-12, float(np.max(np.abs(expected))))
        assert np.max(np.abs(staged[output] - expected)) <= 1e-5 * scale, output


def test_computed_reshape_and_lstm_profile_on_real_tensors(tmp_path: Path) -> None:
    model_path, manifest = _prepare(tmp_path, computed_reshape_lstm(), "ocr")
    assert manifest.profiled and len(manifest.stages) == 4
    first, second = manifest.stages[0], manifest.stages[1]
    # The Reshape target crosses the cut: the profiler fed it the real [width, 1, -1]...
    target = next(t for t in first.outputs if t.name == "target")
    assert target.dtype == "int64" and target.shape == (3,) and target.sample_shape == (3,)
    assert "Reshape" in second.op_types and "target" in [t.name for t in second.inputs]
    # ...and the dims that follow the input's width stay dynamic, the others are fixed.
    c1 = next(t for t in first.outputs if t.name == "c1")
    assert c1.shape[:3] == (1, 4, 4) and isinstance(c1.shape[3], str)
    assert c1.sample_shape == (1, 4, 4, SAMPLE_DIM)
    lstm = next(s for s in manifest.stages if "LSTM" in s.op_types)
    (seq_in,) = lstm.inputs
    assert seq_in.shape[1:] == (1, 16) and isinstance(seq_in.shape[0], str)
    (h,) = lstm.outputs  # the squeezed last hidden state
    assert h.shape == (1, HIDDEN) and h.size_bytes == HIDDEN * 4
    assert manifest.sample is not None and manifest.sample.source == "random"
    assert dict(manifest.sample.shapes) == {"x": (1, 1, 4, SAMPLE_DIM)}
    # The stage files say the same: fixed dims are numbers now.
    lstm_file = onnx.load(str(manifest.stage_path(lstm)))
    dims = lstm_file.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, HIDDEN]
    assert load_manifest(manifest.directory) == manifest  # the new fields round-trip
    # Any width still runs, and gives the whole model's outputs.
    rng = np.random.default_rng(7)
    for width in (5, 23):
        x = rng.standard_normal((1, 1, 4, width), dtype=np.float32)
        _assert_matches_whole(tmp_path, model_path, "ocr", {"x": x})


def test_fixed_input_dims_fix_every_cut_tensor(tmp_path: Path) -> None:
    model_path, manifest = _prepare(tmp_path, computed_reshape_lstm(width=12), "fixed",
                                    ort_optimize=False)
    for stage in manifest.stages:
        for spec in stage.inputs + stage.outputs:
            assert all(isinstance(d, int) for d in spec.shape), (stage.stage_id, spec)
            assert spec.shape == spec.sample_shape and spec.size_bytes is not None
        stage_file = onnx.load(str(manifest.stage_path(stage)), load_external_data=False)
        for value in list(stage_file.graph.input) + list(stage_file.graph.output):
            dims = value.type.tensor_type.shape.dim
            assert all(d.HasField("dim_value") for d in dims), (stage.stage_id, value.name)
    x = np.random.default_rng(1).standard_normal((1, 1, 4, 12), dtype=np.float32)
    _assert_matches_whole(tmp_path, model_path, "fixed", {"x": x})


def test_sample_input_file_is_used_and_recorded(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A model that only runs at one width: the random 64-wide sample fails (exit 2,
    saying what to do); the user's sample works and the manifest records it."""
    model = computed_reshape_lstm()
    fixed_target = numpy_helper.from_array(np.array([1, 4 * 4 * 9], dtype=np.int64), "flat")
    model.graph.initializer.append(fixed_target)
    model.graph.node.append(helper.make_node("Reshape", ["c1_copy", "flat"], ["flat_out"],
                                             name="needs_width_9"))
    model.graph.node.insert(1, helper.make_node("Identity", ["c1"], ["c1_copy"]))
    model.graph.output.append(helper.make_tensor_value_info("flat_out", TensorProto.FLOAT,
                                                            [1, 144]))
    path = models.save(model, tmp_path, "narrow")
    store = tmp_path / "store"
    code = main(["-q", "prepare", str(path), "--store", str(store), "--runs", "1"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and not (store / "narrow").exists() and "\n" not in error
    assert "the model fails on the sample input (random: x 1x1x4x64)" in error
    assert "--sample-input FILE.npz" in error
    sample = tmp_path / "sample.npz"
    x = np.random.default_rng(2).standard_normal((1, 1, 4, 9), dtype=np.float32)
    np.savez(sample, x=x)
    assert main(["-q", "prepare", str(path), "--store", str(store), "--runs", "1",
                 "--sample-input", str(sample), "--json"]) == 0
    manifest = load_manifest(store / "narrow")
    assert manifest.sample is not None and manifest.sample.source == str(sample.resolve())
    assert dict(manifest.sample.shapes) == {"x": (1, 1, 4, 9)}
    flat = next(t for t in manifest.outputs if t.name == "flat_out")
    assert flat.shape == (1, 144)  # the probe run (width 41) failed: fixed from the sample
    _assert_matches_whole(tmp_path, path, "narrow", {"x": x})


def test_a_sample_the_whole_model_fails_on_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = models.save(computed_reshape_lstm(width=12), tmp_path, "m")
    sample = tmp_path / "bad.npz"
    np.savez(sample, x=np.zeros((1, 1, 4, 12), dtype=np.float64))
    code = main(["prepare", str(path), "--store", str(tmp_path / "store"),
                 "--sample-input", str(sample)])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "expected dtype float32" in error and "\n" not in error


def test_control_flow_stays_whole_and_profiles(tmp_path: Path) -> None:
    for name, model, feeds in _control_flow_models():
        model_path, manifest = _prepare(tmp_path, model, name)
        assert manifest.profiled
        holder = [s for s in manifest.stages
                  if {"If", "Loop", "Scan"} & set(s.op_types)]
        assert len(holder) == 1, name
        for case in feeds:
            _assert_matches_whole(tmp_path, model_path, name, case)


def _control_flow_models() -> list[tuple[str, onnx.ModelProto, list[dict[str, np.ndarray]]]]:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6), dtype=np.float32)
    cases: list[tuple[str, onnx.ModelProto, list[dict[str, np.ndarray]]]] = [
        ("if_model", models.control_flow(np.random.default_rng(0)),
         [{"x": x, "flag": np.array(flag)} for flag in (True, False)])]
    # Loop: h <- tanh(h @ w_loop) `trips` times, w_loop read from the outer graph.
    inits = [_weights(rng, "w_in", 6, 8), _weights(rng, "w_loop", 8, 8),
             _weights(rng, "w_out", 8, 3)]
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "w_loop"], ["m"]),
         helper.make_node("Tanh", ["m"], ["h_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h0"], name="fc_in"),
             helper.make_node("Loop", ["trips", "", "h0"], ["h_final"], name="loop",
                              body=body),
             helper.make_node("MatMul", ["h_final", "w_out"], ["y"], name="fc_out")]
    loop = _make(helper.make_graph(
        nodes, "loop_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
         helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits))
    cases.append(("loop_model", loop, [{"x": x, "trips": np.array(n, dtype=np.int64)}
                                       for n in (1, 4)]))
    # Scan: a running sum over the rows of the first layer's output.
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "row"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["row_out"])],
        "scan_body",
        [helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [8]),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [8]),
         helper.make_tensor_value_info("row_out", TensorProto.FLOAT, [8])])
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h0"], name="fc_in"),
             helper.make_node("Scan", ["acc0", "h0"], ["total", "sums"], name="scan",
                              body=body, num_scan_inputs=1),
             helper.make_node("MatMul", ["sums", "w_out"], ["y"], name="fc_out")]
    scan = _make(helper.make_graph(
        nodes, "scan_model", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        inits[:1] + inits[2:] + [numpy_helper.from_array(np.zeros(8, dtype=np.float32),
                                                         "acc0")]))
    cases.append(("scan_model", scan, [{"x": rng.standard_normal((n, 6), dtype=np.float32)}
                                       for n in (3, 7)]))
    return cases


def test_no_profile_loads_every_stage_and_names_one_that_does_not(tmp_path: Path) -> None:
    _, manifest = _prepare(tmp_path, computed_reshape_lstm(), "quick", profile=False)
    assert manifest.sample is None and not manifest.profiled
    check_stages_load(manifest)
    broken = manifest.stages[2]
    manifest.stage_path(broken).write_bytes(b"not an onnx model")
    with pytest.raises(RunFailed, match=f"cannot load stage '{broken.stage_id}'"):
        check_stages_load(manifest)


def test_no_profile_refuses_an_operator_onnx_runtime_lacks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Split fine, unloadable: prepare used to report success for such stages."""
    model = computed_reshape_lstm(width=12)
    model.opset_import.append(helper.make_opsetid("masa.unknown", 1))
    node = model.graph.node[-1]
    node.op_type, node.domain = "Mystery", "masa.unknown"
    node.ClearField("attribute")
    path = tmp_path / "mystery.onnx"
    onnx.save(model, str(path))
    code = main(["prepare", str(path), "--store", str(tmp_path / "store"), "--no-profile"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "Mystery" in error and "\n" not in error
    assert not (tmp_path / "store" / "mystery").exists()


def _spec(name: str, dtype: str, *shape: int | str) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape), None)


def test_settle_refuses_what_cannot_be_fixed(tmp_path: Path) -> None:
    _, manifest = _prepare(tmp_path, computed_reshape_lstm(), "net", profile=False)
    feeds, record = sample_feeds(manifest, 0)
    names = [t.name for s in manifest.stages for t in s.outputs] + ["x"]
    sample = SampleRun({n: Observed("float32", (1, 4)) for n in names})
    sample.tensors["target"] = Observed("int64", (3,))
    wrong_type = SampleRun(dict(sample.tensors))
    wrong_type.tensors["c1"] = Observed("float64", (1, 4))
    with pytest.raises(UserError, match="'c1' is declared float32 but the sample run gave "
                                        "float64"):
        settle_shapes(manifest, wrong_type, None, record)
    probe = SampleRun(dict(sample.tensors))
    probe.tensors["h"] = Observed("float32", (1, 4, 1))
    with pytest.raises(UserError, match="'h' has rank 2 on the sample input and 3 on the "
                                        "probe input"):
        settle_shapes(manifest, sample, probe, record)
    assert feeds["x"].shape == (1, 1, 4, SAMPLE_DIM)


def test_masa_profile_reprofiles_on_the_recorded_sample(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sample = _write(tmp_path / "s.npy", (1, 1, 4, 11))
    _prepare(tmp_path, computed_reshape_lstm(), "again", profile=False, sample_input=sample)
    network = tmp_path / "store" / "again"
    recorded = load_manifest(network).sample
    assert recorded is not None and dict(recorded.shapes) == {"x": (1, 1, 4, 11)}
    assert main(["profile", str(network), "--runs", "1", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert len(document["stages"]) == 4
    assert load_manifest(network).profiled
    assert main(["profile", str(network), "--runs", "1", "--sample-input", str(sample)]) == 0
    assert main(["profile", str(network), "--sample-input", str(tmp_path / "none.npz")]) == 2


def _write(path: Path, shape: tuple[int, ...]) -> Path:
    np.save(path, np.random.default_rng(3).standard_normal(shape, dtype=np.float32))
    return path


def test_ort_optimised_light_model_asks_only_for_its_image(tmp_path: Path) -> None:
    """IR 3: ONNX Runtime's optimised graph still lists the ConstantOfShape shapes it
    folded as inputs; a network must not ask `masa infer` for them."""
    light = importlib.resources.files("onnx").joinpath("backend", "test", "data", "light")
    path = Path(str(light.joinpath("light_squeezenet.onnx")))
    manifest = prepare_network(path, tmp_path / "store", "squeezenet", profile=False,
                               show_progress=False).manifest
    assert manifest.ort_optimized is not None
    assert [spec.name for spec in manifest.inputs] == ["data_0"]
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    (scores,) = _infer(tmp_path, "squeezenet", {"data_0": x}).values()
    assert scores.shape == (1, 1000, 1, 1) and abs(float(scores.sum()) - 1.0) < 1e-3
