"""`masa prepare --ort-optimize`: stages cut from ONNX Runtime's optimised graph.

The optimised stage chain must compute what the ORIGINAL model computes, its
manifest must describe the optimised graph truthfully (layer types, weight
bytes, the blocked tensors crossing the cuts), record what it was optimised
for, and refuse a dynamic input dim it cannot type with one clear line.
"""

from __future__ import annotations

import hashlib
import logging
import platform
from collections import Counter
from dataclasses import replace
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
import yaml
from onnx import numpy_helper

from masa.cli.main import main
from masa.common.errors import UserError, ValidationError
from model_prep.manifest import (
    MANIFEST_NAME,
    VERIFIED_NAME,
    OrtOptimization,
    load_manifest,
    manifest_from_dict,
    manifest_to_dict,
    ort_mismatch,
    write_manifest,
)
from model_prep.optimize import current_optimization
from model_prep.split import split_model
from model_prep.verify import run_stages, verify_network
from workloads.zoo import save_model

pytestmark = [pytest.mark.real, pytest.mark.slow]

# ONNX Runtime's NCHWc layout transformer runs on x86 only.
X86 = platform.machine() in ("x86_64", "AMD64", "i686")


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _tree(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def _stage_domains(manifest) -> Counter[str]:
    found: Counter[str] = Counter()
    for stage in manifest.stages:
        found.update(n.domain for n in onnx.load(str(manifest.stage_path(stage))).graph.node)
    return found


def _check_manifest_describes_stage_files(manifest) -> None:
    """Weight bytes are the stage files' initializers; boundary tensors are what runs."""
    for stage in manifest.stages:
        stage_model = onnx.load(str(manifest.stage_path(stage)))
        initializer_bytes = sum(numpy_helper.to_array(t).nbytes
                                for t in stage_model.graph.initializer)
        assert stage.weight_bytes == initializer_bytes, stage.stage_id
    boundary = [spec for stage in manifest.stages for spec in stage.outputs]
    feeds = {spec.name: _rng(3).standard_normal(spec.shape).astype(np.float32)
             for spec in manifest.inputs}
    values = run_stages(manifest, feeds, keep=[spec.name for spec in boundary])
    for spec in boundary:
        assert values[spec.name].shape == spec.shape, spec.name
        assert values[spec.name].nbytes == spec.size_bytes, spec.name


def test_skip_connection_and_concat_equal_the_original_model(tmp_path: Path) -> None:
    path = models.save(models.residual_branches(_rng()), tmp_path, "resbranch")
    plain = split_model(path, tmp_path / "plain", "resbranch", ort_optimize=False)
    optimized = split_model(path, tmp_path / "optimized", "resbranch", ort_optimize=True,
                            scratch_dir=tmp_path)
    # One weighted operator per stage still: same stages, same kinds.
    assert [s.layer_type for s in optimized.stages] == [s.layer_type for s in plain.stages]
    assert optimized.ort_optimized == current_optimization()
    assert plain.ort_optimized is None
    # The skip Add became a fused Sum input of the second residual conv: a
    # stage with two producers still.
    assert any(len(s.producers) >= 2 for s in optimized.stages)
    if X86:
        assert _stage_domains(optimized)["com.microsoft.nchwc"] > 0
        # A blocked tensor crosses a cut: the 8-channel stem output padded to the block.
        assert any(spec.shape[1] != 8 and spec.shape[2:] == (16, 16)
                   for s in optimized.stages for spec in s.outputs if len(spec.shape) == 4)
    result = verify_network(optimized, path, _rng())
    assert result.ok and result.outputs[0].max_abs_diff <= 1e-6 * result.outputs[0].max_abs_output
    _check_manifest_describes_stage_files(optimized)
    # Nothing but the network is left where the optimised model was made.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["optimized", "plain",
                                                         "resbranch.onnx"]


@pytest.mark.parametrize("builder", sorted(models.ALL_BUILDERS))
def test_every_weight_placement_and_graph_shape(tmp_path: Path, builder: str) -> None:
    """Constant nodes, IR 3 inputs, ConstantOfShape, control flow, ...: same stages."""
    path = models.save(models.ALL_BUILDERS[builder](_rng(1)), tmp_path, builder)
    shapes = {"x": [2, 4, 8]} if builder == "matmul_attention" else None
    plain = split_model(path, tmp_path / "plain", builder, shapes, ort_optimize=False)
    optimized = split_model(path, tmp_path / "opt", builder, shapes, ort_optimize=True)
    if builder == "contrib_op":
        # The probe types the Gelu output onnx cannot, so that cut is made now.
        assert [s.layer_type for s in optimized.stages] == ["conv"] * 3
        assert plain.stages[-1].note and not any(s.note for s in optimized.stages)
    else:
        assert [s.layer_type for s in optimized.stages] == [s.layer_type
                                                            for s in plain.stages]
    assert load_manifest(optimized.directory) == optimized
    assert verify_network(optimized, path, _rng()).ok


def test_large_model_path_external_weights(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Models past protobuf's cap go through external data files, probe included."""
    import model_prep.optimize as optimize

    monkeypatch.setattr(optimize, "DEFAULT_EXTERNAL_DATA_BYTES", 1)
    path = models.save(models.residual_branches(_rng(2)), tmp_path, "big")
    # --input-shape makes it write the changed model (as external data) for ORT.
    optimized = split_model(path, tmp_path / "opt", "big", {"x": [1, 3, 16, 16]},
                            ort_optimize=True, scratch_dir=tmp_path)
    assert verify_network(optimized, path, _rng()).ok
    _check_manifest_describes_stage_files(optimized)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.onnx", "opt"]


def test_inception_replica_with_contrib_convolutions(tmp_path: Path) -> None:
    """GoogleNet's replica (Inception concats): nchwc Conv and FusedConv are conv stages."""
    path = tmp_path / "googlenet.onnx"
    save_model("googlenet", path, scale=0.05, seed=0)
    optimized = split_model(path, tmp_path / "g", "googlenet", ort_optimize=True)
    kinds = Counter(s.layer_type for s in optimized.stages)
    assert kinds == Counter({"conv": 57, "fc": 1})  # the paper's Table 1 counts
    if X86:
        domains = _stage_domains(optimized)
        assert domains["com.microsoft.nchwc"] > 0
    assert any("Concat" in s.op_types and len(s.inputs) >= 4 for s in optimized.stages)
    result = verify_network(optimized, path, _rng())
    assert result.ok, result.summary()
    _check_manifest_describes_stage_files(optimized)


def test_manifest_field_round_trips_and_old_manifests_load(tmp_path: Path) -> None:
    path = models.save(models.conv_chain(_rng()), tmp_path, "chain")
    optimized = split_model(path, tmp_path / "opt", "chain", ort_optimize=True)
    reloaded = load_manifest(tmp_path / "opt")
    assert reloaded == optimized
    assert reloaded.ort_optimized == OrtOptimization(
        onnxruntime=optimized.ort_optimized.onnxruntime, machine=platform.machine(),
        graph_level="ORT_ENABLE_ALL")
    plain = split_model(path, tmp_path / "plain", "chain", ort_optimize=False)
    raw = yaml.safe_load((tmp_path / "plain" / MANIFEST_NAME).read_text())
    assert "ort_optimized" not in raw  # plain manifests are written as before
    assert load_manifest(tmp_path / "plain").ort_optimized is None
    assert manifest_to_dict(plain) == raw


@pytest.mark.parametrize(("field", "bad", "expected"), [
    ("graph_level", "FASTEST", "at 'ort_optimized.graph_level': expected one of"),
    ("machine", 64, "at 'ort_optimized.machine': expected a string"),
    ("onnxruntime", "", "at 'ort_optimized.onnxruntime': expected a non-empty string"),
    ("threads", 1, "at 'ort_optimized.threads': unknown field"),
])
def test_malformed_field_is_reported_with_its_path(
    tmp_path: Path, field: str, bad: object, expected: str
) -> None:
    path = models.save(models.conv_chain(_rng()), tmp_path, "chain")
    manifest = split_model(path, tmp_path / "opt", "chain", ort_optimize=True)
    raw = manifest_to_dict(manifest)
    raw["ort_optimized"][field] = bad
    raw["stages"][0]["layer_type"] = "pool"  # every problem is reported, not the first
    with pytest.raises(ValidationError) as caught:
        manifest_from_dict(raw, "m.yaml", tmp_path / "opt")
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems
    assert any("stages[0].layer_type" in problem for problem in caught.value.problems)
    raw["ort_optimized"] = "yes"
    with pytest.raises(ValidationError, match="at 'ort_optimized': expected a mapping"):
        manifest_from_dict(raw, "m.yaml", tmp_path / "opt")


def test_other_runtime_or_machine_logs_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    optimization = current_optimization()
    assert ort_mismatch(optimization, optimization.onnxruntime, optimization.machine) is None
    assert "machine x86_64, this is aarch64" in ort_mismatch(
        OrtOptimization("1.31.1", "x86_64", "ORT_ENABLE_ALL"), "1.31.1", "aarch64")
    path = models.save(models.conv_chain(_rng()), tmp_path, "chain")
    manifest = split_model(path, tmp_path / "same", "chain", ort_optimize=True)
    with caplog.at_level(logging.WARNING, logger="model_prep.manifest"):
        load_manifest(tmp_path / "same")
    assert not caplog.records
    moved = tmp_path / "moved"
    split_model(path, moved, "chain", ort_optimize=True)
    old = OrtOptimization("0.9.0", manifest.ort_optimized.machine, "ORT_ENABLE_ALL")
    write_manifest(replace(load_manifest(moved), ort_optimized=old), moved / MANIFEST_NAME)
    with caplog.at_level(logging.WARNING, logger="model_prep.manifest"):
        load_manifest(moved)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "onnxruntime 0.9.0, this is" in message and "--ort-optimize" in message


def test_cli_prepare_profile_and_verify_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = models.save(models.residual_branches(_rng(1)), tmp_path, "res")
    store = tmp_path / "store"
    code = main(["prepare", str(path), "--store", str(store), "--ort-optimize", "--verify",
                 "--runs", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "vs whole model: match" in out and "ONNX Runtime's optimised graph" in out
    manifest = load_manifest(store / "res")
    assert manifest.ort_optimized is not None and manifest.profiled
    assert all(s.profile.exec_time_us > 0 for s in manifest.stages)
    # The store holds the network only: no optimised model, no scratch directory.
    assert [p.name for p in store.iterdir()] == ["res"]
    assert sorted(p.name for p in (store / "res").iterdir()) == [VERIFIED_NAME, MANIFEST_NAME,
                                                                 "stages"]
    assert main(["verify", str(store / "res")]) == 0
    assert "match" in capsys.readouterr().out


def test_dynamic_dim_needs_input_shape(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = models.save(models.residual_branches(_rng(), batch="N"), tmp_path, "dyn")
    store = tmp_path / "store"
    chain_path = models.save(models.conv_chain(_rng()), tmp_path, "chain")
    assert main(["prepare", str(chain_path), "--store", str(store), "--no-profile"]) == 0
    capsys.readouterr()
    before = _tree(store)
    code = main(["prepare", str(path), "--store", str(store), "--no-profile",
                 "--ort-optimize"])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("masa: error:"), err
    assert "input 'x' has dynamic dims (Nx3x16x16)" in lines[0]
    assert "pass --input-shape x=1x3x16x16" in lines[0]
    assert _tree(store) == before
    code = main(["prepare", str(path), "--store", str(store), "--no-profile",
                 "--ort-optimize", "--input-shape", "x=2x3x16x16", "--verify"])
    assert code == 0, capsys.readouterr().err
    assert load_manifest(store / "dyn").inputs[0].shape == (2, 3, 16, 16)


def test_mmap_mode_cuts_the_optimised_graph_when_the_input_dims_are_fixed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Not told: optimised in load mode mmap with fixed dims, as given otherwise."""
    fixed = models.save(models.residual_branches(_rng()), tmp_path, "fixed")
    dynamic = models.save(models.residual_branches(_rng(), batch="N"), tmp_path, "dyn")
    assert split_model(fixed, tmp_path / "a", "a").ort_optimized == current_optimization()
    assert split_model(fixed, tmp_path / "b", "b", load_mode="copy").ort_optimized is None
    assert split_model(dynamic, tmp_path / "c", "c").ort_optimized is None
    given = split_model(dynamic, tmp_path / "d", "d", {"x": [1, 3, 16, 16]})
    assert given.ort_optimized == current_optimization()
    symbolic = split_model(dynamic, tmp_path / "e", "e", {"x": ["B", 3, 16, 16]})
    assert symbolic.ort_optimized is None
    # Mapped stages of the optimised graph: no BatchNorm left for a session to
    # fold into a private copy of the weights; the outputs are the model's.
    assert verify_network(given, dynamic, _rng()).ok


def test_a_model_onnx_runtime_cannot_optimise_is_split_as_given_unless_asked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = models.conv_chain(_rng())
    model.opset_import[0].version = 1  # onnx can read it; ONNX Runtime refuses the opset
    path = models.save(model, tmp_path, "old")
    with pytest.raises(UserError, match="--ort-optimize: ONNX Runtime cannot load the model"):
        split_model(path, tmp_path / "asked", "asked", ort_optimize=True)
    with caplog.at_level(logging.WARNING, logger="model_prep.split"):
        plain = split_model(path, tmp_path / "auto", "auto")
    assert plain.ort_optimized is None and plain.stages
    assert "splitting the model as given" in caplog.text
