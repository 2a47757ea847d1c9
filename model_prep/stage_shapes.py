"""Fixing the stages' cut tensors to the shapes the sample run showed, in files and manifest.

After the sample run (model_prep.sample_run) this module owns what `masa
prepare` makes of it. `settle_shapes` gives every cut tensor the dtype and
shape it really had, where the probe run says the dim is fixed:

- a dim equal in the sample and the probe run (whose dynamic input dims and
  data differ) is fixed to that number, whatever shape inference said
  (`unk__1`, `?`, an unknown rank);
- a dim that differs stays dynamic (its symbol, or `?`): it follows the
  input's dims or values (a batch, an image width, a count of detections);
- for a tensor the probe run did not reach (a stage failed on the probe
  input) the sample's dims are fixed only when every network input dim is
  fixed; otherwise dims shape inference left dynamic stay so.

Every cut tensor records its sample shape (`TensorSpec.sample_shape`); stage
files whose input or output types changed are rewritten (only the graph's
input and output value infos; the weights and their data file are untouched)
and take their new sha256. A tensor whose dtype differs from the declared
one, or whose rank differs between the two runs, cannot be fixed: UserError
naming the stage file. `check_stages_load` creates a session per stage file
and drops it (what `--no-profile` still checks); `fix_shapes_on_sample` is
the whole step as `masa prepare` runs it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

from masa.common.atomic import atomic_write_bytes
from masa.common.errors import RunFailed, UserError, one_line
from model_prep.manifest import NetworkManifest, SampleInput, Stage, TensorSpec, sha256_file
from model_prep.sample_run import (
    Observed,
    SampleRun,
    check_dtype,
    is_dynamic,
    run_sample_checked,
    try_probe,
)
from model_prep.session import load_stage
from model_prep.shapes import UNKNOWN_DIM, UNKNOWN_RANK

log = logging.getLogger(__name__)


def settle_shapes(manifest: NetworkManifest, sample: SampleRun, probe: SampleRun | None,
                  record: SampleInput) -> NetworkManifest:
    """The manifest with every cut tensor's settled spec, its stage files rewritten
    where their declared types changed, and the sample recorded."""
    inputs_fixed = not any(is_dynamic(d) for spec in manifest.inputs for d in spec.shape)
    settled: dict[str, TensorSpec] = {}
    for spec in manifest.inputs:
        settled[spec.name] = replace(spec, sample_shape=sample.tensors[spec.name].shape)
    stages = []
    for stage in manifest.stages:
        path = manifest.stage_path(stage)
        for spec in stage.outputs:
            observed = sample.tensors[spec.name]
            check_dtype(spec, observed, stage, path)
            probed = probe.tensors.get(spec.name) if probe is not None else None
            settled[spec.name] = _settle(spec, observed, probed, inputs_fixed, stage, path)
        new_inputs = tuple(settled[spec.name] for spec in stage.inputs)
        new_outputs = tuple(settled[spec.name] for spec in stage.outputs)
        changed = [new for old, new in zip(stage.inputs + stage.outputs,
                                           new_inputs + new_outputs, strict=True)
                   if (old.dtype, old.shape) != (new.dtype, new.shape)]
        sha256 = _rewrite_stage_file(path, changed) if changed else stage.sha256
        stages.append(replace(stage, inputs=new_inputs, outputs=new_outputs, sha256=sha256))
    outputs = tuple(settled.get(spec.name, spec) for spec in manifest.outputs)
    return replace(manifest, inputs=tuple(settled[s.name] for s in manifest.inputs),
                   outputs=outputs, stages=tuple(stages), sample=record)


def _settle(spec: TensorSpec, observed: Observed, probed: Observed | None,
            inputs_fixed: bool, stage: Stage, path: Path) -> TensorSpec:
    """One stage output's spec from what the runs showed."""
    known_rank = spec.shape[:1] != (UNKNOWN_RANK,)
    if probed is not None and len(probed.shape) != len(observed.shape):
        raise UserError(f"{path}: cannot fix the shapes of stage {stage.stage_id!r}: tensor "
                        f"{spec.name!r} has rank {len(observed.shape)} on the sample input "
                        f"and {len(probed.shape)} on the probe input")
    dims: list[int | str] = []
    for axis, size in enumerate(observed.shape):
        declared = spec.shape[axis] if known_rank and axis < len(spec.shape) else UNKNOWN_DIM
        if probed is not None:
            fixed = probed.shape[axis] == size
        else:
            fixed = inputs_fixed or not is_dynamic(declared)
        if fixed:
            dims.append(size)
        else:
            dims.append(declared if isinstance(declared, str) else UNKNOWN_DIM)
    if known_rank and len(spec.shape) != len(observed.shape):
        log.info("%s: %s declared with rank %d, ran with rank %d: the run's is kept", path,
                 spec.name, len(spec.shape), len(observed.shape))
    shape = tuple(dims)
    static = all(isinstance(d, int) for d in shape)
    size_bytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(observed.dtype).itemsize \
        if static else None
    return TensorSpec(name=spec.name, dtype=observed.dtype, shape=shape, size_bytes=size_bytes,
                      sample_shape=observed.shape)


def _rewrite_stage_file(path: Path, changed: list[TensorSpec]) -> str:
    """Set the graph input/output types of the changed tensors; the file's new sha256.

    Loaded without its external data: only the small .onnx file is rewritten,
    its tensors still point into the untouched data file."""
    model = onnx.load(str(path), load_external_data=False)
    by_name = {spec.name: spec for spec in changed}
    for value in list(model.graph.input) + list(model.graph.output):
        spec = by_name.get(value.name)
        if spec is not None:
            _set_type(value, spec)
    atomic_write_bytes(path, model.SerializeToString())
    return sha256_file(path)


def _set_type(value: onnx.ValueInfoProto, spec: TensorSpec) -> None:
    tensor_type = value.type.tensor_type
    tensor_type.elem_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype))
    tensor_type.ClearField("shape")
    shape = tensor_type.shape
    for dim in spec.shape:
        new_dim = shape.dim.add()
        if isinstance(dim, int):
            new_dim.dim_value = dim
        elif dim != UNKNOWN_DIM:
            new_dim.dim_param = dim


def check_stages_load(manifest: NetworkManifest) -> None:
    """Create a session for every stage file and drop it; RunFailed naming the first
    stage ONNX Runtime refuses."""
    for stage in manifest.stages:
        path = manifest.stage_path(stage)
        session = None
        try:
            session = load_stage(path, stage.prepack, stage.mapped_bytes)
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise RunFailed(f"{path}: ONNX Runtime cannot load stage {stage.stage_id!r} of "
                            f"network {manifest.name!r}: {one_line(exc)}") from None
        finally:
            del session


def fix_shapes_on_sample(manifest: NetworkManifest, model_path: Path,
                         feeds: Mapping[str, np.ndarray], record: SampleInput,
                         save_dir: Path) -> tuple[NetworkManifest, dict[str, Path]]:
    """The sample run, the probe run and `settle_shapes`, then every (rewritten) stage
    file loaded once. Returns the settled manifest and each stage's saved inputs."""
    seen = run_sample_checked(manifest, model_path, feeds, record, save_dir)
    probe = try_probe(manifest, feeds, record.seed)
    settled = settle_shapes(manifest, seen, probe, record)
    check_stages_load(settled)
    fixed = sum(1 for stage in settled.stages for spec in stage.outputs
                if all(isinstance(d, int) for d in spec.shape))
    total = sum(len(stage.outputs) for stage in settled.stages)
    log.info("sample run: %d of %d cut tensors have fixed shapes", fixed, total)
    return settled, seen.stage_inputs
