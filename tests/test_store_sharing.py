"""Sharing a store: cheap start-up checks, one prepare per name, runs pin their versions.

Covers model_prep.manifest's start-up checks (stage and data files checked by
size, modification time and inode against the last full check; full hashes on
`masa verify`), model_prep.store_lock's prepare lock, and the runner's pinning
of each network's version (issue 13, part 5).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from masa.cli.main import main as masa_main
from masa.common.errors import UserError, ValidationError
from masa.runtime.runner import RunSettings, execute, prepare_run
from model_prep import manifest as manifest_module
from model_prep.manifest import VERIFIED_NAME, load_manifest
from model_prep.prepare_cli import prepare_network
from model_prep.store_lock import RETIRED_PREFIX, prepare_lock

SIZE = 256  # 256 KiB weights per layer: in the mmap data files


def fc_model(seed: int, layers: int = 2, size: int = SIZE) -> onnx.ModelProto:
    """x (1 x size) -> `layers` MatMul+Relu; seeded random weights."""
    rng = np.random.default_rng(seed)
    nodes, initializers, current = [], [], "x"
    for index in range(layers):
        weight = f"w{index}"
        initializers.append(numpy_helper.from_array(
            (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32), weight))
        nodes.append(helper.make_node("MatMul", [current, weight], [f"m{index}"]))
        current = f"r{index}" if index < layers - 1 else "y"
        nodes.append(helper.make_node("Relu", [f"m{index}"], [current]))
    graph = helper.make_graph(
        nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    onnx.checker.check_model(model)
    return model


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save_model(model, str(path))
    return path


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    prepare_network(_save(fc_model(1), tmp_path / "a.onnx"), tmp_path / "store", "net",
                    profile=False)
    return tmp_path / "store"


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    hashed: list[str] = []
    original = manifest_module.sha256_file

    def counting(path: str | Path) -> str:
        hashed.append(str(path))
        return original(path)

    monkeypatch.setattr(manifest_module, "sha256_file", counting)
    return hashed


def test_a_run_start_reads_no_stage_file_but_verify_hashes_all(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = load_manifest(store / "net", check_files=False)
    assert all(s.data_sha256 is not None for s in manifest.stages)  # mmap data files
    assert (store / "net" / VERIFIED_NAME).is_file()  # recorded by prepare
    hashed = _count_hashes(monkeypatch)
    load_manifest(store / "net")
    assert hashed == []  # size, mtime and inode matched: nothing read
    load_manifest(store / "net", full_check=True)
    assert len(hashed) == 2 * len(manifest.stages)  # every stage file and data file


def test_a_changed_data_file_is_found(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = load_manifest(store / "net")
    data = store / "net" / manifest.stages[1].data_file
    stat = data.stat()
    content = bytearray(data.read_bytes())
    content[-1] ^= 0xFF  # same size; the modification time put back
    data.write_bytes(bytes(content))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    load_manifest(store / "net")  # a stat check cannot see it (documented) ...
    with pytest.raises(ValidationError, match=r"stages\[1\]\.data_sha256.*does not match"):
        load_manifest(store / "net", full_check=True)  # ... a full check does
    assert masa_main(["verify", str(store / "net")]) == 2
    data.write_bytes(bytes(content) + b"\0")  # a size change is seen at start
    hashed = _count_hashes(monkeypatch)
    with pytest.raises(ValidationError, match="data_sha256"):
        load_manifest(store / "net")
    assert hashed == [str(data)]  # only the changed file was read


def test_a_second_prepare_of_the_same_name_fails_clearly(
        store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _save(fc_model(2), tmp_path / "b.onnx")
    with prepare_lock(store, "net"):
        work = store / ".prepare~net~busy"  # the first prepare's work folder
        work.mkdir()
        with pytest.raises(UserError, match=r"another `masa prepare` of 'net' is running "
                                            rf"\(pid {os.getpid()}\)"):
            prepare_network(model, store, "net", profile=False)
        code = masa_main(["prepare", str(model), "--store", str(store), "--name", "net",
                          "--no-profile"])
        assert code == 2
        assert "another `masa prepare` of 'net'" in capsys.readouterr().err
        assert work.is_dir()  # not deleted under the first one's feet
        prepare_network(model, store, "other", profile=False)  # other names go ahead
    prepare_network(model, store, "net", profile=False)  # free again
    assert not work.exists()  # now it is a stale folder, and removed


def _outputs(store: Path, tmp_path: Path) -> np.ndarray:
    """Run one job of `net` for real and return its output."""
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [net]\ninput: random\n"
                        "arrivals: {kind: periodic, interval_ms: 1, count: 1, seed: 3}\n")
    prepared = prepare_run(workload, store)
    outcome = execute(prepared, RunSettings(workers=1, memory_budget_bytes=64 << 20,
                                            keep_outputs=True), simulate=False)
    return outcome.outputs["j0/net"]["y"]


def test_a_run_keeps_the_version_it_pinned(store: Path, tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    before = _outputs(store, tmp_path)
    prepared = prepare_run(workload, store)
    pinned = prepared.network_versions["net"]
    # Prepared again, with other weights, after the run started and before it loads.
    prepare_network(_save(fc_model(2), tmp_path / "b.onnx"), store, "net", profile=False)
    retired = list(store.glob(f"{RETIRED_PREFIX}net~*"))
    assert len(retired) == 1  # the pinned version is kept while the run holds it
    outcome = execute(prepared, RunSettings(workers=1, memory_budget_bytes=64 << 20,
                                            keep_outputs=True), simulate=False)
    assert outcome.network_status == {"j0/net": "done"}
    assert outcome.network_versions == {"net": pinned}
    np.testing.assert_array_equal(outcome.outputs["j0/net"]["y"], before)
    after = _outputs(store, tmp_path)  # a new run takes the new version
    assert not np.array_equal(after, before)
    for pin in prepared.pins:
        pin.close()
    prepare_network(_save(fc_model(3), tmp_path / "c.onnx"), store, "net", profile=False)
    assert not list(store.glob(f"{RETIRED_PREFIX}net~*"))  # no run pins it any more
    assert (store / "net").is_dir()
