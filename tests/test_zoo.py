"""Tests of the model zoo (workloads/zoo.py) and `masa zoo`.

Scale-1 models are never materialised here (EmotionNet alone is 377 MiB): their
size is checked from the builders' dry-mode parameter count, which is itself
checked against the materialised initializers at small scales.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest

from masa.common.errors import UserError
from model_prep.manifest import VERIFIED_NAME
from model_prep.session import create_session
from workloads.zoo import (
    MIB,
    ZOO_NAMES,
    ZOO_SPECS,
    build_model,
    layer_counts,
    parameter_count,
    save_model,
    weight_bytes,
    write_zoo,
)

pytestmark = [pytest.mark.real, pytest.mark.slow]

SMALL_SCALE = 0.1


def _initializer_elements(model: onnx.ModelProto) -> int:
    return sum(math.prod(t.dims) for t in model.graph.initializer)


def _op_count(model: onnx.ModelProto, op_type: str) -> int:
    return sum(1 for node in model.graph.node if node.op_type == op_type)


def test_zoo_has_the_nine_networks_of_the_paper() -> None:
    assert sorted(spec.paper_name for spec in ZOO_SPECS.values()) == sorted(
        ["AgeNet", "GenderNet", "FaceNet", "SoS", "GoogleNet", "TinyYOLO", "EmotionNet",
         "MemNet", "SceneNet"])
    assert ZOO_NAMES == tuple(ZOO_SPECS)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_scale_one_size_is_within_ten_percent_of_table_1(name: str) -> None:
    spec = ZOO_SPECS[name]
    weight_mib = weight_bytes(name, 1.0) / MIB
    assert abs(weight_mib / spec.paper_storage_mib - 1) <= 0.10, (name, weight_mib)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_built_graph_has_the_table_1_conv_and_fc_layers(name: str) -> None:
    spec = ZOO_SPECS[name]
    model = build_model(name, scale=0.05)
    assert (_op_count(model, "Conv"), _op_count(model, "Gemm")) == (
        spec.conv_layers, spec.fc_layers)
    assert _op_count(model, "MatMul") == 0
    assert layer_counts(name, 1.0) == (spec.conv_layers, spec.fc_layers)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_small_model_runs_in_onnx_runtime(name: str, tmp_path: Path) -> None:
    spec = ZOO_SPECS[name]
    path = save_model(name, tmp_path / f"{name}.onnx", scale=SMALL_SCALE, seed=3)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 13
    declared = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert tuple(declared) == spec.input_shape
    # The dry count (used for the scale-1 size check) equals what was materialised,
    # and the file is the weights plus a little graph structure.
    elements = _initializer_elements(model)
    assert elements == parameter_count(name, SMALL_SCALE)
    file_bytes = path.stat().st_size
    assert elements * 4 <= file_bytes <= elements * 4 * 1.02 + 64 * 1024
    session = create_session(path)
    data = np.random.default_rng(0).standard_normal(spec.input_shape, dtype=np.float32)
    (output,) = session.run(None, {"data": data})
    declared_out = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert output.shape == tuple(declared_out)
    assert model.graph.output[0].name == spec.output_name
    assert np.isfinite(output).all()
    assert float(np.abs(output).max()) > 0
    if spec.output_name == "prob":
        np.testing.assert_allclose(output.sum(axis=-1), 1.0, rtol=1e-4)


def test_known_output_shapes() -> None:
    shapes = {}
    for name in ("tinyyolo", "sos", "scenenet", "memnet", "agenet", "gendernet"):
        model = build_model(name, scale=0.05)
        shapes[name] = tuple(d.dim_value for d in
                             model.graph.output[0].type.tensor_type.shape.dim)
    assert shapes == {"tinyyolo": (1, 125, 13, 13), "sos": (1, 5), "scenenet": (1, 205),
                      "memnet": (1, 1), "agenet": (1, 8), "gendernet": (1, 2)}


def test_weights_are_seeded_and_differ_between_seeds_and_networks() -> None:
    first = build_model("agenet", scale=0.05, seed=7)
    again = build_model("agenet", scale=0.05, seed=7)
    other_seed = build_model("agenet", scale=0.05, seed=8)
    other_net = build_model("gendernet", scale=0.05, seed=7)

    def conv1(model: onnx.ModelProto) -> np.ndarray:
        weights = {t.name: t for t in model.graph.initializer}
        return onnx.numpy_helper.to_array(weights["conv1.weight"])

    assert first.SerializeToString() == again.SerializeToString()
    assert not np.array_equal(conv1(first), conv1(other_seed))
    assert not np.array_equal(conv1(first), conv1(other_net))


def test_scale_shrinks_widths_and_small_scales_give_a_few_megabytes() -> None:
    for name in ZOO_NAMES:
        sizes = [parameter_count(name, s) for s in (0.1, 0.25, 0.5, 1.0)]
        assert sizes == sorted(sizes) and len(set(sizes)) == 4, name
        assert weight_bytes(name, 0.25) <= 25 * MIB, name
    # the class count is not scaled: a width scale never changes what a net outputs
    model = build_model("scenenet", scale=0.02)
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 205]


@pytest.mark.parametrize("scale", [0, -0.5, 1.5, float("nan")])
def test_bad_scale_is_a_user_error(scale: float) -> None:
    with pytest.raises(UserError, match="scale"):
        build_model("agenet", scale=scale)


def test_unknown_name_is_a_user_error_listing_the_zoo() -> None:
    with pytest.raises(UserError, match="agenet") as error:
        build_model("resnet50")
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------- write_zoo and `masa zoo`


def _store_entries(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir())


def test_write_zoo_splits_into_stages_that_equal_the_whole_model(tmp_path: Path) -> None:
    from model_prep.manifest import sha256_file
    from model_prep.verify import verify_network

    store = tmp_path / "store"
    names = ["googlenet", "tinyyolo", "emotionnet"]
    manifests = write_zoo(store, names, scale=0.05, profile=False, seed=1)
    assert [m.name for m in manifests] == names
    assert _store_entries(store) == sorted(names)  # no staging directory left behind
    for manifest in manifests:
        spec = ZOO_SPECS[manifest.name]
        layer_types = [stage.layer_type for stage in manifest.stages]
        # one stage per weighted layer: the scheduler sees the paper's layers
        assert (layer_types.count("conv"), layer_types.count("fc")) == (
            spec.conv_layers, spec.fc_layers)
        assert manifest.inputs[0].shape == spec.input_shape
        source = Path(manifest.source_path)
        assert source == (store / manifest.name / "source.onnx").resolve()
        assert sha256_file(source) == manifest.source_sha256
        result = verify_network(manifest, source, np.random.default_rng(0))
        assert result.ok
        assert not manifest.profiled


def test_write_zoo_profiles_every_stage(tmp_path: Path) -> None:
    (manifest,) = write_zoo(tmp_path, ["agenet"], scale=0.05, profile=True, seed=0,
                            profile_runs=2)
    assert manifest.profiled and manifest.runtime_base is not None
    for stage in manifest.stages:
        assert stage.profile is not None
        assert stage.profile.exec_time_us > 0
        assert stage.profile.exec_runs == 2


def test_write_zoo_replaces_a_network_and_leaves_nothing_else(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (first,) = write_zoo(store, ["gendernet"], scale=0.05, profile=False, seed=1)
    (second,) = write_zoo(store, ["gendernet"], scale=0.05, profile=False, seed=2,
                          verify=True)
    assert second.source_sha256 != first.source_sha256
    assert _store_entries(store) == ["gendernet"]  # no staging or old copy left
    assert _store_entries(store / "gendernet") == [VERIFIED_NAME, "manifest.yaml", "source.onnx",
                                                   "stages"]


def test_write_zoo_failing_to_prepare_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_zoo(store, ["agenet"], scale=0.05, profile=False)
    squatter = store / "tinyyolo"  # not a prepared network: must not be replaced
    squatter.mkdir()
    (squatter / "notes.txt").write_text("mine")
    before = {p.relative_to(store): p.read_bytes() for p in store.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match="tinyyolo"):
        write_zoo(store, ["agenet", "tinyyolo"], scale=0.05, profile=False, seed=5)
    after = {p.relative_to(store): p.read_bytes() for p in store.rglob("*") if p.is_file()}
    # agenet (done before the failure) was rebuilt with the new seed; nothing else changed
    assert {k for k in after if k.parts[0] != "agenet"} == {
        k for k in before if k.parts[0] != "agenet"}
    assert after[Path("tinyyolo/notes.txt")] == b"mine"
    assert _store_entries(store) == ["agenet", "tinyyolo"]


def test_write_zoo_into_a_file_is_a_user_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "store"
    not_a_dir.write_text("x")
    with pytest.raises(UserError, match="store"):
        write_zoo(not_a_dir, ["agenet"], scale=0.05, profile=False)


def test_masa_zoo_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from masa.cli.main import main

    store = tmp_path / "store"
    code = main(["zoo", "--store", str(store), "--scale", "0.05", "--no-profile",
                 "AgeNet", "sos"])
    out = capsys.readouterr().out
    assert code == 0
    assert _store_entries(store) == ["agenet", "sos"]
    assert "random weights" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:3]}
    assert rows["agenet"][2:5] == ["6", "3", "3"] and rows["sos"][2:5] == ["8", "5", "3"]


def test_masa_zoo_json_and_exit_1_when_a_network_fails(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from masa.cli.main import main
    from masa.common.errors import RunFailed
    from workloads import zoo_cli

    store = tmp_path / "store"
    assert main(["zoo", "--store", str(store), "--scale", "0.05", "--no-profile", "--json",
                 "agenet"]) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = report["networks"]
    assert (row["name"], row["stages"], row["conv_stages"], row["fc_stages"]) == (
        "agenet", 6, 3, 3)
    # Stages cut from ONNX Runtime's optimised graph (load mode mmap, fixed dims): its
    # NCHWc weights pad channels to the block size and folded batch norms add biases
    # (+11% at this scale with onnxruntime 1.32, above the 1.1 bound this test had).
    dry_bytes = weight_bytes("agenet", 0.05)
    assert dry_bytes <= row["weight_bytes"] <= 1.2 * dry_bytes
    assert row["exec_ms"] is None
    assert report["failed"] == [] and report["scale"] == 0.05

    real_write_zoo = zoo_cli.write_zoo

    def failing_for_sos(store_dir, names, *args, **kwargs):  # a --verify mismatch on sos
        if list(names) == ["sos"]:
            raise RunFailed("--verify failed for network 'sos'")
        return real_write_zoo(store_dir, names, *args, **kwargs)

    monkeypatch.setattr(zoo_cli, "write_zoo", failing_for_sos)
    code = main(["zoo", "--store", str(store), "--scale", "0.05", "--no-profile", "--json",
                 "sos", "gendernet"])
    captured = capsys.readouterr()
    assert code == 1
    report = json.loads(captured.out)
    assert [r["name"] for r in report["networks"]] == ["gendernet"]  # built despite sos
    assert report["failed"] == [{"name": "sos", "error": "--verify failed for network 'sos'"}]
    assert "sos: --verify failed" in captured.err and "Traceback" not in captured.err


def test_masa_zoo_slices_and_copies_as_masa_prepare_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--load-mode copy and --max-stage-bytes reach the stages: EmotionNet's fc
    layers come out in slices no larger than the limit, and --verify checks the
    sliced chain against the whole model."""
    import json

    from masa.cli.main import main
    from model_prep.manifest import load_manifest

    limit_bytes = 256 * 1024
    args = ["zoo", "--store", str(tmp_path / "whole"), "--scale", "0.05", "--no-profile",
            "--json", "emotionnet"]
    assert main(args) == 0
    whole = load_manifest(tmp_path / "whole" / "emotionnet")
    assert max(s.weight_bytes for s in whole.stages) > limit_bytes
    assert json.loads(capsys.readouterr().out)["max_stage_bytes"] == 0
    sliced_store = tmp_path / "sliced"
    assert main(["zoo", "--store", str(sliced_store), "--scale", "0.05", "--no-profile",
                 "--verify", "--load-mode", "copy", "--max-stage-bytes", "256KiB",
                 "--json", "emotionnet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["load_mode"], report["max_stage_bytes"]) == ("copy", limit_bytes)
    sliced = load_manifest(sliced_store / "emotionnet")
    assert sliced.load_mode == "copy" and len(sliced.stages) > len(whole.stages)
    assert max(s.weight_bytes for s in sliced.stages) <= limit_bytes


@pytest.mark.parametrize("argv, expected", [
    (["resnet"], "unknown network"),
    (["--max-stage-bytes", "0", "agenet"], "--max-stage-bytes: expected a positive size"),
    (["--target-memory", "1GiB", "--max-stage-bytes", "1MiB", "agenet"], "not allowed with"),
    (["--load-mode", "zip", "agenet"], "invalid choice"),
    (["--scale", "0", "agenet"], "0 < S <= 1"),
    (["--scale", "1.5", "agenet"], "0 < S <= 1"),
    (["--scale", "big", "agenet"], "0 < S <= 1"),
])
def test_masa_zoo_bad_arguments_exit_2_with_one_line(
        argv: list[str], expected: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from masa.cli.main import main

    store = tmp_path / "store"
    try:
        code = main(["zoo", "--store", str(store), "--no-profile", *argv])
    except SystemExit as exit_:  # argparse rejects a malformed option itself
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert "Traceback" not in err
    assert not store.exists()


@pytest.mark.parametrize("scale", [0.03, 0.05, 0.07])
def test_grouped_convolutions_stay_valid_at_odd_scales(scale):
    """AlexNet-family grouped convs need input widths divisible by the group."""
    import numpy as np
    import onnxruntime as ort

    for name in ("facenet", "sos", "memnet", "scenenet"):
        model = build_model(name, scale=scale)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        spec = session.get_inputs()[0]
        session.run(None, {spec.name: np.zeros(spec.shape, dtype=np.float32)})
