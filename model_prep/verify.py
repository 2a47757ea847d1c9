"""Checking a split: run the stage DAG and compare it with one whole-model run.

This module owns `run_stages` (execute a prepared network stage by stage with
plain ONNX Runtime, freeing every intermediate tensor after its last consumer)
and `verify_network` (the `masa prepare --verify` check). Both create sessions
through model_prep.session so they run exactly what the scheduler will run.

The pass criterion, per model output: max |stages - whole| <= 1e-5 * max |whole|
(exact equality for outputs that are not floating point, and identical NaN
positions).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper

from masa.common.errors import UserError
from model_prep.manifest import NetworkManifest, TensorSpec
from model_prep.session import create_session, release_memory
from model_prep.split import DEFAULT_EXTERNAL_DATA_BYTES, tensor_bytes_estimate

log = logging.getLogger(__name__)

RELATIVE_TOLERANCE = 1e-5


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


def random_feeds(
    inputs: tuple[TensorSpec, ...], rng: np.random.Generator, dim_value: int = 1
) -> dict[str, np.ndarray]:
    """Seeded random inputs for a network; dynamic dims take `dim_value`."""
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        if spec.shape and spec.shape[0] == "*":
            raise UserError(f"input {spec.name!r} has an unknown rank: fix its shape with "
                            "--input-shape")
        shape = tuple(d if isinstance(d, int) else dim_value for d in spec.shape)
        dtype = _numpy_dtype(spec)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, 8, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = np.asarray(rng.random(shape) < 0.5)
        else:
            raise UserError(f"input {spec.name!r}: cannot make random data of type {spec.dtype}")
    return feeds


def _numpy_dtype(spec: TensorSpec) -> np.dtype:
    try:
        return np.dtype(spec.dtype)
    except TypeError:
        raise UserError(f"input {spec.name!r}: type {spec.dtype} has no NumPy equivalent"
                        ) from None


def load_feeds(path: str | Path) -> dict[str, np.ndarray]:
    """Inputs from X.npz (one array per input name) or X.npy (the only input: key '',
    which `bind_feeds` binds to the network's single input). Bad file: UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such input file (expected .npy or .npz)")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a NumPy .npy/.npz file: {exc}") from None
    if isinstance(loaded, np.ndarray):
        return {"": loaded}
    with loaded:
        return {key: loaded[key] for key in loaded.files}


def bind_feeds(manifest: NetworkManifest, feeds: Mapping[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
    """Check user-given inputs against the network's; key '' means "the only input"."""
    expected = {spec.name: spec for spec in manifest.inputs}
    bound = dict(feeds)
    if "" in bound:
        if len(expected) != 1:
            raise UserError(f"network {manifest.name!r} has {len(expected)} inputs: expected an "
                            f".npz with arrays named {', '.join(expected)}")
        bound[next(iter(expected))] = bound.pop("")
    unknown = sorted(set(bound) - set(expected))
    missing = sorted(set(expected) - set(bound))
    if unknown or missing:
        raise UserError(f"network {manifest.name!r}: expected inputs {', '.join(expected)}, "
                        f"got {', '.join(sorted(bound)) or 'none'}")
    for name, value in bound.items():
        spec = expected[name]
        if value.dtype != _numpy_dtype(spec):
            raise UserError(f"input {name!r}: expected dtype {spec.dtype}, got {value.dtype}")
        fixed = [(d, s) for d, s in zip(spec.shape, value.shape, strict=False)
                 if isinstance(d, int)]
        unknown_rank = spec.shape[:1] == ("*",)
        if not unknown_rank and (len(spec.shape) != value.ndim or any(d != s for d, s in fixed)):
            shape_text = "x".join(str(d) for d in spec.shape)
            raise UserError(f"input {name!r}: expected shape {shape_text}, got "
                            f"{'x'.join(str(s) for s in value.shape)}")
    return bound


def run_stages(manifest: NetworkManifest, feeds: Mapping[str, np.ndarray],
               keep: Collection[str] = ()) -> dict[str, np.ndarray]:
    """Run every stage in manifest order; return the network's outputs by name
    (and the stage-boundary tensors named in `keep`).

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
        session = create_session(manifest.stage_path(stage))
        try:
            results = session.run([spec.name for spec in stage.outputs],
                                  {spec.name: values[spec.name] for spec in stage.inputs})
        finally:
            del session
        for spec, value in zip(stage.outputs, results, strict=True):
            values[spec.name] = value
        for spec in stage.inputs:
            if last_use.get(spec.name) == index and spec.name not in output_names:
                del values[spec.name]
    release_memory()
    return {name: values[name] for name in output_names}


def run_whole_model(model_path: str | Path, manifest: NetworkManifest,
                    feeds: Mapping[str, np.ndarray], extra_outputs: Sequence[str] = ()
                    ) -> dict[str, np.ndarray]:
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
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    initializer_names = {t.name for t in graph.initializer}
    overridable = model.ir_version >= 4 and any(i.name in initializer_names for i in graph.input)
    wanted = {spec.name: spec.shape for spec in manifest.inputs}
    reshaped = any(i.name in wanted and _declared_shape(i) != wanted[i.name]
                   for i in graph.input if i.name not in initializer_names)
    if not overridable and not reshaped and not extra:
        del model
        return _run_once(model_path, output_names, feeds)
    external_data_helper.load_external_data_for_model(model, str(Path(model_path).parent))
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
        return _run_once(path, output_names, feeds)


def _declared_shape(value: onnx.ValueInfoProto) -> tuple[int | str, ...] | None:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in tensor_type.shape.dim)


def _run_once(path: str | Path, output_names: list[str], feeds: Mapping[str, np.ndarray]
              ) -> dict[str, np.ndarray]:
    session = create_session(path)
    try:
        return dict(zip(output_names, session.run(output_names, dict(feeds)), strict=True))
    finally:
        del session
        release_memory()


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
            finite = ~nan_whole & ~nan_staged
            diff = np.abs(whole[finite].astype(np.float64) - staged[finite].astype(np.float64))
            max_diff = float(diff.max()) if diff.size else 0.0
            if not np.array_equal(nan_whole, nan_staged):
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
    diverges). With `check` (the default) a mismatch raises UserError naming
    the tensor; otherwise the result says so (`result.ok`).
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
        raise UserError(f"{model_path}: --verify failed for network {manifest.name!r}: output "
                        f"{bad.name!r} differs by {bad.max_abs_diff:.3g} between the stages and "
                        f"the whole model (expected at most {bad.tolerance:.3g} = "
                        f"{RELATIVE_TOLERANCE:g} x max|output| {bad.max_abs_output:.3g})")
    return result
