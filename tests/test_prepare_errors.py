"""Bad input to `masa prepare` / `masa verify`: one clear line, exit 2, store untouched.

A check that ran and failed (a verification mismatch, ONNX Runtime failing on
a stage) is one line too, with exit 1; a bug is exit 3. `--json` prints one
JSON document on stdout.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import models
import numpy as np
import pytest

from masa.cli.main import main
from masa.common.errors import UserError, ValidationError
from model_prep.manifest import MANIFEST_NAME, load_manifest, sha256_file, write_manifest
from model_prep.prepare_cli import prepare_network

pytestmark = pytest.mark.real


def _tree(root: Path) -> dict[str, str]:
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    """A store that already holds one good network, so 'untouched' means something."""
    store_dir = tmp_path / "store"
    chain = models.save(models.conv_chain(np.random.default_rng(0)), tmp_path, "chain")
    prepare_network(chain, store_dir, "chain", profile=False)
    return store_dir


@pytest.fixture()
def good_model(tmp_path: Path) -> Path:
    return models.save(models.residual_branches(np.random.default_rng(1)), tmp_path, "good")


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str], *expected: str,
           code: int = 2) -> str:
    """Run the CLI; it must exit `code` (2: bad input) with one error line naming `expected`."""
    exit_code = main(argv)
    err = capsys.readouterr().err
    assert exit_code == code, err
    lines = [line for line in err.splitlines() if line.startswith("masa: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _prepare(model: Path | str, store: Path, *extra: str) -> list[str]:
    return ["prepare", str(model), "--store", str(store), "--no-profile", *extra]


def test_not_onnx(tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text_file = tmp_path / "notes.onnx"
    text_file.write_text("these are my notes, not a model\n" * 20)
    before = _tree(store)
    _fails(_prepare(text_file, store), capsys, str(text_file), "ONNX")
    assert _tree(store) == before


@pytest.mark.parametrize("keep_fraction", [0.5, 0.9, 0.999])
def test_truncated_model(tmp_path: Path, store: Path, good_model: Path,
                         capsys: pytest.CaptureFixture[str], keep_fraction: float) -> None:
    data = good_model.read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[:int(len(data) * keep_fraction)])
    before = _tree(store)
    _fails(_prepare(truncated, store, "--name", "good"), capsys, str(truncated))
    assert _tree(store) == before


def test_missing_file(tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.onnx"
    before = _tree(store)
    _fails(_prepare(missing, store), capsys, str(missing), "no such file")
    assert _tree(store) == before


def test_unwritable_store(tmp_path: Path, good_model: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "store-is-a-file"
    a_file.write_text("x")
    _fails(_prepare(good_model, a_file), capsys, str(a_file), "expected a directory")
    assert a_file.read_text() == "x"
    below_file = a_file / "store"
    _fails(_prepare(good_model, below_file), capsys, str(below_file), "cannot create")
    if os.geteuid() != 0:  # root ignores directory permissions
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        try:
            _fails(_prepare(good_model, locked), capsys, str(locked), "cannot write")
            assert list(locked.iterdir()) == []
        finally:
            locked.chmod(0o700)


def test_refuses_to_replace_something_that_is_not_a_network(
        tmp_path: Path, store: Path, good_model: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    other = store / "photos"
    other.mkdir()
    (other / "holiday.jpg").write_bytes(b"\xff\xd8")
    before = _tree(store)
    _fails(_prepare(good_model, store, "--name", "photos"), capsys, "not a prepared network")
    assert _tree(store) == before


def test_bad_network_name(store: Path, good_model: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree(store)
    _fails(_prepare(good_model, store, "--name", "../escape"), capsys, "--name", "../escape")
    assert _tree(store) == before


def test_unknown_input_shape_name(store: Path, good_model: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree(store)
    _fails(_prepare(good_model, store, "--input-shape", "image=1x3x16x16"), capsys,
           "--input-shape image", "has no input 'image'", "its inputs: x")
    assert _tree(store) == before


def test_input_shape_with_wrong_rank(store: Path, good_model: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree(store)
    _fails(_prepare(good_model, store, "--input-shape", "x=1x3x16"), capsys,
           "--input-shape x", "expected 4 dims", "got 3")
    assert _tree(store) == before


@pytest.mark.parametrize("text", ["x", "x=", "=1x3", "x=1x-3x16x16", "x=1x0x16x16"])
def test_malformed_input_shape(store: Path, good_model: Path,
                               capsys: pytest.CaptureFixture[str], text: str) -> None:
    before = _tree(store)
    _fails(_prepare(good_model, store, "--input-shape", text), capsys, "--input-shape")
    assert _tree(store) == before


def test_manifest_with_missing_stage_file_or_wrong_checksum(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    network = store / "chain"
    (network / "stages" / "s001.onnx").unlink()
    stage2 = network / "stages" / "s002.onnx"
    stage2.write_bytes(stage2.read_bytes() + b"\0")
    with pytest.raises(ValidationError) as caught:
        load_manifest(network)
    problems = caught.value.problems
    assert len(problems) == 2  # every problem, each with its path
    assert "at 'stages[1].file'" in problems[0] and "does not exist" in problems[0]
    assert "at 'stages[2].sha256'" in problems[1]
    before = _tree(store)
    _fails(["verify", str(network)], capsys, "stages[1].file", "stages[2].sha256")
    assert _tree(store) == before


def test_verify_mismatch_exits_1(tmp_path: Path, store: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = models.save(models.conv_chain(np.random.default_rng(5)), tmp_path, "other")
    before = _tree(store)
    # Same architecture, other weights: every stage loads, the outputs differ.
    _fails(["verify", str(store / "chain"), "--model", str(other)], capsys,
           "--verify failed", "output 'y' differs", code=1)
    assert _tree(store) == before


def test_failed_prepare_verify_leaves_store_untouched(
        tmp_path: Path, store: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from model_prep import verify

    def always_differs(expected: dict, actual: dict) -> tuple:
        return tuple(verify.OutputComparison(name, value.shape, 1.0, 1.0, 1e-5, False)
                     for name, value in expected.items())

    monkeypatch.setattr(verify, "compare_outputs", always_differs)
    chain2 = models.save(models.conv_chain(np.random.default_rng(0)), tmp_path, "chain2")
    before = _tree(store)
    _fails(_prepare(chain2, store, "--name", "chain", "--verify"), capsys, "--verify failed",
           code=1)
    assert _tree(store) == before


def test_verify_input_must_match_the_network(tmp_path: Path, store: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((1, 3, 8, 8), np.float32))
    _fails(["verify", str(store / "chain"), "--input", str(wrong)], capsys,
           "input 'x'", "expected shape 1x3x16x16")
    right = tmp_path / "right.npy"
    np.save(right, np.ones((1, 3, 16, 16), np.float32))
    assert main(["verify", str(store / "chain"), "--input", str(right)]) == 0


def test_prepare_network_api_raises_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        prepare_network(tmp_path / "nothing.onnx", tmp_path / "store", profile=False)
    assert not (tmp_path / "store").exists()


def test_onnx_runtime_failing_on_a_stage_exits_1_naming_it(
        store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    network = store / "chain"
    manifest = load_manifest(network)
    broken = network / manifest.stages[1].file
    broken.write_bytes(b"not an onnx model")
    # The manifest is made to agree, so the stage passes the sha256 check and
    # only ONNX Runtime finds it wrong.
    stages = list(manifest.stages)
    stages[1] = replace(stages[1], sha256=sha256_file(broken))
    write_manifest(replace(manifest, stages=tuple(stages)), network / MANIFEST_NAME)
    line = _fails(["verify", str(network)], capsys, "ONNX Runtime failed", "'s001'", code=1)
    assert str(broken) in line


def test_an_internal_error_exits_3(store: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from model_prep import prepare_cli

    def broken_verify(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(prepare_cli, "verify_network", broken_verify)
    assert main(["verify", str(store / "chain")]) == 3
    assert "internal error" in capsys.readouterr().err


def test_json_documents(tmp_path: Path, store: Path, good_model: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_prepare(good_model, store, "--verify", "--json")) == 0
    prepared = json.loads(capsys.readouterr().out)
    assert prepared["prepared"] and prepared["name"] == "good"
    assert prepared["directory"] == str(store / "good")
    assert prepared["stage_count"] == len(prepared["manifest"]["stages"]) == 6
    assert prepared["verify"]["ok"] and prepared["profile_time_s"] is None

    assert main(["verify", str(store / "good"), "--json"]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert verified["ok"] and verified["network"] == "good"
    assert [o["name"] for o in verified["outputs"]] == [t["name"] for t in
                                                        prepared["manifest"]["outputs"]]

    other = models.save(models.conv_chain(np.random.default_rng(5)), tmp_path, "other")
    assert main(["verify", str(store / "chain"), "--model", str(other), "--json"]) == 1
    captured = capsys.readouterr()
    mismatch = json.loads(captured.out)
    assert not mismatch["ok"] and not mismatch["outputs"][0]["passed"]
    assert "--verify failed" in captured.err
