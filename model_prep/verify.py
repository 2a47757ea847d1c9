"""Checking a split: run the stage DAG and compare it with one whole-model run.

This module owns `run_stages` (execute a prepared network stage by stage with
plain ONNX Runtime, freeing every intermediate tensor after its last consumer)
and `verify_network` (the `masa prepare --verify` and `masa verify` check).
Both create sessions through model_prep.session so they run exactly what the
scheduler will run. Input feeds (reading, binding, random ones) are
model_prep.feeds'.

The pass criterion, per model output: max |stages - whole| <= 1e-5 * max |whole|
(exact equality for outputs that are not floating point, and identical NaN
positions). A mismatch raises `VerifyMismatch`, and ONNX Runtime failing on a
stage or on the whole model raises `RunFailed` naming it: the input was valid,
the check ran and failed (exit 1 on the command line, not 2).
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from masa.common.errors import RunFailed, UserError, one_line
from model_prep.feeds import random_feeds
from model_prep.manifest import NetworkManifest, Stage
from model_prep.session import create_session, load_stage, release_memory
from model_prep.shapes import tensor_bytes_estimate
from model_prep.stage_files import DEFAULT_EXTERNAL_DATA_BYTES

log = logging.getLogger(__name__)

RELATIVE_TOLERANCE = 1e-5
ORT_LOG_FATAL = 4  # onnxruntime's log severity levels: 0 verbose ... 4 fatal


@dataclass(frozen=True)
class OutputComparison:
    name: str
    shape: tuple[int, ...]
    max_abs_diff: float
    max_abs_output: float
    tolerance: float  # RELATIVE_TOLERANCE * max_abs_output
    passed: bool


@dataclass(frozen=True)
class VerifyResult:
    network: str
    stage_count: int
    input_shapes: dict[str, tuple[int, ...]]
    outputs: tuple[OutputComparison, ...]

    @property
    def ok(self) -> bool:
        return all(output.passed for output in self.outputs)

    def summary(self) -> str:
        parts = [f"{o.name}: max|diff| {o.max_abs_diff:.3g} (limit {o.tolerance:.3g})"
                 for o in self.outputs]
        verdict = "match" if self.ok else "MISMATCH"
        return (f"verify {self.network}: {self.stage_count} stages vs whole model: "
                f"{verdict}; " + "; ".join(parts))

    def to_dict(self) -> dict[str, Any]:
        """The `--json` form; an infinite or NaN figure (shapes differ) is null."""
        return {
            "network": self.network,
            "ok": self.ok,
            "stage_count": self.stage_count,
            "input_shapes": {name: list(shape) for name, shape in self.input_shapes.items()},
            "relative_tolerance": RELATIVE_TOLERANCE,
            "outputs": [
                {"name": o.name, "shape": list(o.shape),
                 "max_abs_diff": _finite_or_none(o.max_abs_diff),
                 "max_abs_output": _finite_or_none(o.max_abs_output),
                 "tolerance": _finite_or_none(o.tolerance), "passed": o.passed}
                for o in self.outputs
            ],
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


class VerifyMismatch(RunFailed):
    """The stages ran but differ from the whole model; `result` says where and by how much."""

    def __init__(self, message: str, result: VerifyResult) -> None:
        super().__init__(message)
        self.result = result


StageObserver = Callable[[Stage, Mapping[str, np.ndarray], list[np.ndarray]], None]


def run_stages(manifest: NetworkManifest, feeds: Mapping[str, np.ndarray],
               keep: Collection[str] = (), on_stage: StageObserver | None = None,
               quiet: bool = False) -> dict[str, np.ndarray]:
    """Run every stage in manifest order; return the network's outputs by name
    (and the stage-boundary tensors named in `keep`). `on_stage(stage, its
    inputs, its outputs)` is called after each stage (model_prep.sample_run).
    quiet: ONNX Runtime logs nothing while running (a failure is still raised).

    One session at a time, dropped right after its run; an intermediate tensor
    is dropped after its last consuming stage. The heap is trimmed once at the
    end, not per stage: a full `gc.collect()` costs ~40 ms in a process that
    has imported onnx, more than most stages take to run, and a session has
    no reference cycles, so dropping the last reference already frees it.
    """
    missing = [spec.name for spec in manifest.inputs if spec.name not in feeds]
    if missing:
        raise UserError(f"network {manifest.name!r}: missing input(s) {', '.join(missing)} "
                        f"(expected {', '.join(s.name for s in manifest.inputs)})")
    output_names = [spec.name for spec in manifest.outputs]
    boundary = {spec.name for stage in manifest.stages for spec in stage.outputs}
    unknown = sorted(set(keep) - boundary - set(feeds))
    if unknown:
        raise UserError(f"network {manifest.name!r}: {', '.join(unknown)} not a stage output")
    output_names += [name for name in keep if name not in output_names]
    last_use: dict[str, int] = {}
    for index, stage in enumerate(manifest.stages):
        for spec in stage.inputs:
            last_use[spec.name] = index
    values: dict[str, np.ndarray] = {spec.name: feeds[spec.name] for spec in manifest.inputs}
    for index, stage in enumerate(manifest.stages):
        stage_feeds = {spec.name: values[spec.name] for spec in stage.inputs}
        results = _run_stage(manifest, stage, stage_feeds, quiet)
        if on_stage is not None:
            on_stage(stage, stage_feeds, results)
        del stage_feeds
        for spec, value in zip(stage.outputs, results, strict=True):
            values[spec.name] = value
        for spec in stage.inputs:
            if last_use.get(spec.name) == index and spec.name not in output_names:
                del values[spec.name]
    release_memory()
    return {name: values[name] for name in output_names}


def _run_stage(manifest: NetworkManifest, stage: Stage, feeds: dict[str, np.ndarray],
               quiet: bool = False) -> list[np.ndarray]:
    """One run of one stage in a session of its own; RunFailed if ONNX Runtime fails."""
    path = manifest.stage_path(stage)
    session = None
    try:
        session = load_stage(path, stage.prepack, stage.mapped_bytes)
        return session.run([spec.name for spec in stage.outputs], feeds, _run_options(quiet))
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        raise RunFailed(f"{path}: ONNX Runtime failed on stage {stage.stage_id!r} of network "
                        f"{manifest.name!r}: {one_line(exc)}") from None
    finally:
        del session


def _run_options(quiet: bool) -> ort.RunOptions:
    options = ort.RunOptions()
    if quiet:  # the caller reports a failure in one line; ORT's own log is noise
        options.log_severity_level = ORT_LOG_FATAL
    return options


def run_whole_model(model_path: str | Path, manifest: NetworkManifest,
                    feeds: Mapping[str, np.ndarray], extra_outputs: Sequence[str] = (),
                    quiet: bool = False) -> dict[str, np.ndarray]:
    """One run of the source model, as the splitter read it, on the given inputs.

    Returns the model outputs, plus the intermediate tensors `extra_outputs`
    (which makes it run from a copy that exposes them). The model also runs
    from a temporary copy when the stages would otherwise be
    compared with something else: when `--input-shape` changed the input
    shapes (the declared ones would reject the inputs), or when an IR >= 4
    model lists initializers as graph inputs. ONNX Runtime treats those as
    overridable inputs, so it neither folds nor fuses them (batch-norm after
    a convolution stays separate), while the splitter, like the task says,
    treats them as weights: the stages then round differently (CenterFace:
    2e-5 relative) although both compute the same function.
    """
    output_names = [spec.name for spec in manifest.outputs]
    extra = [name for name in extra_outputs if name not in output_names]
    output_names += extra
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise UserError(f"{model_path}: cannot read the source model: {one_line(exc)} "
                        "(pass the model the network was prepared from with --model)") from None
    graph = model.graph
    initializer_names = {t.name for t in graph.initializer}
    overridable = model.ir_version >= 4 and any(i.name in initializer_names for i in graph.input)
    wanted = {spec.name: spec.shape for spec in manifest.inputs}
    reshaped = any(i.name in wanted and _declared_shape(i) != wanted[i.name]
                   for i in graph.input if i.name not in initializer_names)
    if not overridable and not reshaped and not extra:
        del model
        return _run_once(model_path, output_names, feeds, quiet)
    try:
        external_data_helper.load_external_data_for_model(model, str(Path(model_path).parent))
    except (OSError, ValueError) as exc:
        raise UserError(f"{model_path}: cannot read its external data: {one_line(exc)}") from None
    if overridable:
        runtime_inputs = [i for i in graph.input if i.name not in initializer_names]
        del graph.input[:]
        graph.input.extend(runtime_inputs)
    if reshaped:
        for value in graph.input:
            if value.name in wanted:
                value.type.tensor_type.ClearField("shape")
                for dim in wanted[value.name]:
                    new_dim = value.type.tensor_type.shape.dim.add()
                    if isinstance(dim, int):
                        new_dim.dim_value = dim
                    else:
                        new_dim.dim_param = dim
        del graph.value_info[:]
        for value in graph.output:
            value.type.tensor_type.ClearField("shape")
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
    with tempfile.TemporaryDirectory(prefix="masa-verify-") as temp_dir:
        path = Path(temp_dir) / "whole.onnx"
        weight_bytes = sum(tensor_bytes_estimate(t) for t in graph.initializer)
        onnx.save_model(model, str(path),
                        save_as_external_data=weight_bytes >= DEFAULT_EXTERNAL_DATA_BYTES,
                        location="whole.onnx.data")
        del model, graph
        return _run_once(path, output_names, feeds, quiet)


def _declared_shape(value: onnx.ValueInfoProto) -> tuple[int | str, ...] | None:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in tensor_type.shape.dim)


def _run_once(path: str | Path, output_names: list[str], feeds: Mapping[str, np.ndarray],
              quiet: bool = False) -> dict[str, np.ndarray]:
    """One run of the whole model; RunFailed if ONNX Runtime fails on it."""
    session = None
    try:
        session = create_session(path)
        outputs = session.run(output_names, dict(feeds), _run_options(quiet))
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        raise RunFailed(f"ONNX Runtime failed on the whole model ({path}): "
                        f"{one_line(exc)}") from None
    finally:
        del session
        release_memory()
    return dict(zip(output_names, outputs, strict=True))


def compare_outputs(
    expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray]
) -> tuple[OutputComparison, ...]:
    comparisons = []
    for name, whole in expected.items():
        staged = actual[name]
        if whole.shape != staged.shape:
            comparisons.append(OutputComparison(name, tuple(whole.shape), float("inf"),
                                                float("nan"), 0.0, False))
            continue
        if whole.dtype.kind in "fc":
            nan_whole, nan_staged = np.isnan(whole), np.isnan(staged)
            # Equal values (equal infinities too) differ by 0; inf - inf would be NaN.
            differ = ~nan_whole & ~nan_staged & (whole != staged)
            diff = np.abs(whole[differ].astype(np.float64) - staged[differ].astype(np.float64))
            max_diff = float(diff.max()) if diff.size else 0.0
            if not np.array_equal(nan_whole, nan_staged) or math.isnan(max_diff):
                max_diff = float("inf")
            finite_whole = np.abs(whole[np.isfinite(whole)].astype(np.float64))
            max_out = float(finite_whole.max()) if finite_whole.size else 0.0
            tolerance = RELATIVE_TOLERANCE * max_out
        else:
            max_diff = 0.0 if np.array_equal(whole, staged) else float("inf")
            max_out = float(np.abs(whole).max()) if whole.size and whole.dtype.kind in "iub" \
                else 0.0
            tolerance = 0.0
        comparisons.append(OutputComparison(name, tuple(whole.shape), max_diff, max_out,
                                            tolerance, max_diff <= tolerance))
    return tuple(comparisons)


def verify_network(
    manifest: NetworkManifest,
    model_path: str | Path,
    rng: np.random.Generator,
    *,
    check: bool = True,
    dim_value: int = 1,
    feeds: Mapping[str, np.ndarray] | None = None,
    extra_tensors: Sequence[str] = (),
) -> VerifyResult:
    """Stages vs whole model on one seeded random input (or on `feeds`).

    Dynamic dims of the random input take `dim_value`. `extra_tensors` names
    stage-boundary tensors to compare as well (found by pinpointing which stage
    diverges). With `check` (the default) a mismatch raises VerifyMismatch (a
    RunFailed, so a UserError) naming the tensor; otherwise the result says so
    (`result.ok`). ONNX Runtime failing on a stage or the whole model raises
    RunFailed either way.
    """
    if feeds is None:
        feeds = random_feeds(manifest.inputs, rng, dim_value)
    staged = run_stages(manifest, feeds, keep=extra_tensors)
    whole = run_whole_model(model_path, manifest, feeds, extra_outputs=extra_tensors)
    result = VerifyResult(
        network=manifest.name,
        stage_count=len(manifest.stages),
        input_shapes={name: tuple(value.shape) for name, value in feeds.items()},
        outputs=compare_outputs(whole, staged),
    )
    log.info("%s", result.summary())
    if check and not result.ok:
        bad = next(o for o in result.outputs if not o.passed)
        raise VerifyMismatch(
            f"{model_path}: --verify failed for network {manifest.name!r}: output "
            f"{bad.name!r} differs by {bad.max_abs_diff:.3g} between the stages and "
            f"the whole model (expected at most {bad.tolerance:.3g} = "
            f"{RELATIVE_TOLERANCE:g} x max|output| {bad.max_abs_output:.3g})", result)
    return result
