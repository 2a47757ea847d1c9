"""The sample run: the stage chain run once on a sample input, to see every cut tensor for real.

Shape inference cannot type every tensor of a real model: a Reshape whose
target is computed from an upstream `Shape`, an LSTM fed through such a
Reshape, a PaddleOCR export's `p2o.DynamicDimension` chains leave dims
unknown (`unk__1`) or even the rank. Tensors made up from those declared
shapes are wrong tensors, and ONNX Runtime refuses them. So `masa prepare`
runs the stages once, in order, on a sample input and keeps what each stage
really received and produced; this module owns that run:

- `sample_feeds`: the sample input, seeded random data of the declared shapes
  with every dynamic dim resolved (`SAMPLE_BATCH` for the first dim,
  `SAMPLE_DIM` for the others), or the user's `--sample-input FILE.npz`;
- `run_sample`: the chain on those feeds, recording the dtype and shape of
  every network input and stage output, and saving each stage's inputs to
  `<dir>/<stage id>.npz` (arrays in the order of the stage's inputs) for the
  profiler (model_prep.profile);
- `probe_feeds`: a second, smaller-stakes input (other random data, every
  dynamic input dim changed): a dim that differs between the two runs depends
  on the input's dims or values and stays dynamic (model_prep.stage_shapes
  fixes the others).

The stages run as model_prep.verify runs them (`run_stages`, one session at
a time, each tensor dropped after its last consumer).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from masa.common.errors import RunFailed, UserError, one_line
from model_prep.feeds import numpy_dtype, random_feeds
from model_prep.manifest import NetworkManifest, SampleInput, Stage, TensorSpec
from model_prep.verify import run_stages, run_whole_model

log = logging.getLogger(__name__)

SAMPLE_BATCH = 1  # a dynamic first dim (the batch, nearly always) in the sample input
# Other dynamic dims (image height and width, sequence length): large enough for
# the strided convolutions and pools of a CNN (a multiple of 32), small enough
# to keep the sample run and the profile quick.
SAMPLE_DIM = 64
PROBE_DIM_STEP = 32  # the probe run's dynamic dims: sample + this (a batch of 1: 2)


@dataclass(frozen=True)
class Observed:
    """A tensor as the sample run saw it."""

    dtype: str  # numpy dtype name
    shape: tuple[int, ...]


@dataclass
class SampleRun:
    """What one run of the stage chain saw."""

    tensors: dict[str, Observed] = field(default_factory=dict)  # inputs and stage outputs
    stage_inputs: dict[str, Path] = field(default_factory=dict)  # stage id -> its .npz


def is_dynamic(dim: int | str) -> bool:
    """A dim the input does not fix: a name, unknown, or a non-positive number (-1)."""
    return not isinstance(dim, int) or dim <= 0


def sample_shape(spec: TensorSpec) -> tuple[int, ...]:
    """The sample input's shape for a network input: its dims, dynamic ones resolved."""
    if spec.shape[:1] == ("*",):
        raise UserError(f"input {spec.name!r} has an unknown rank: fix its shape with "
                        "--input-shape or give a sample with --sample-input FILE.npz")
    return tuple((SAMPLE_BATCH if axis == 0 else SAMPLE_DIM) if is_dynamic(dim) else int(dim)
                 for axis, dim in enumerate(spec.shape))


def sample_feeds(manifest: NetworkManifest, seed: int,
                 given: Mapping[str, np.ndarray] | None = None, source: str = "random"
                 ) -> tuple[dict[str, np.ndarray], SampleInput]:
    """The sample input and its manifest record: `given` (already bound to the
    network's inputs, model_prep.feeds.bind_feeds) or seeded random data."""
    if given is not None:
        feeds = dict(given)
    else:
        shapes = {spec.name: sample_shape(spec) for spec in manifest.inputs}
        feeds = random_feeds(manifest.inputs, np.random.default_rng(seed), shapes=shapes)
    record = SampleInput(source=source, seed=seed,
                         shapes=tuple((name, tuple(int(d) for d in value.shape))
                                      for name, value in feeds.items()))
    return feeds, record


def recorded_sample_feeds(manifest: NetworkManifest, seed: int) -> dict[str, np.ndarray]:
    """Random feeds of the shapes the manifest's sample had (`masa profile`): the same
    shapes the stage files were fixed to, whatever the sample's data was."""
    if manifest.sample is None:
        return sample_feeds(manifest, seed)[0]
    shapes = dict(manifest.sample.shapes)
    return random_feeds(manifest.inputs, np.random.default_rng(seed), shapes=shapes)


def probe_feeds(manifest: NetworkManifest, sample: Mapping[str, np.ndarray], seed: int
                ) -> dict[str, np.ndarray]:
    """Other random data with every dynamic input dim changed (1 -> 2, n -> n + 32)."""
    shapes = {}
    for spec in manifest.inputs:
        dims = sample[spec.name].shape
        declared = spec.shape if spec.shape[:1] != ("*",) else ("?",) * len(dims)
        shapes[spec.name] = tuple(
            (2 if size == 1 else size + PROBE_DIM_STEP) if is_dynamic(dim) else size
            for dim, size in zip(declared, dims, strict=True))
    return random_feeds(manifest.inputs, np.random.default_rng([seed, 1]), shapes=shapes)


def run_sample(manifest: NetworkManifest, feeds: Mapping[str, np.ndarray],
               save_dir: Path | None = None, into: SampleRun | None = None) -> SampleRun:
    """Run the stage chain once; what every tensor was (and, with `save_dir`, each
    stage's inputs saved there). RunFailed naming the stage if ONNX Runtime fails;
    UserError if a stage passes on something that is not a tensor. `into` is
    filled as the stages run, so it holds what was seen before a failure."""
    seen = into if into is not None else SampleRun()
    for name, value in feeds.items():
        seen.tensors[name] = _observe(manifest, name, value, "the sample input")
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)

    def record(stage: Stage, inputs: Mapping[str, np.ndarray], outputs: list[np.ndarray]
               ) -> None:
        if save_dir is not None:
            path = save_dir / f"{stage.stage_id}.npz"
            np.savez(path, *[inputs[spec.name] for spec in stage.inputs])
            seen.stage_inputs[stage.stage_id] = path
        for spec, value in zip(stage.outputs, outputs, strict=True):
            seen.tensors[spec.name] = _observe(manifest, spec.name, value,
                                               f"stage {stage.stage_id!r}")

    run_stages(manifest, feeds, on_stage=record, quiet=True)
    return seen


def _observe(manifest: NetworkManifest, name: str, value: object, where: str) -> Observed:
    if not isinstance(value, np.ndarray):
        raise UserError(f"network {manifest.name!r}: {where} gives {name!r} as a "
                        f"{type(value).__name__}, not a tensor: a sequence or map cannot "
                        "cross a stage boundary")
    return Observed(dtype=value.dtype.name, shape=tuple(int(d) for d in value.shape))


def run_sample_checked(manifest: NetworkManifest, model_path: Path,
                       feeds: Mapping[str, np.ndarray], record: SampleInput,
                       save_dir: Path | None) -> SampleRun:
    """`run_sample` for `masa prepare`: when a stage fails, say whose fault it is.

    If the whole model fails on the sample too, the sample does not suit the
    model (UserError, exit 2: give a real one); if only the stages fail, the
    split is wrong (RunFailed, exit 1)."""
    try:
        return run_sample(manifest, feeds, save_dir)
    except RunFailed as stage_failure:
        described = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'}"
                              for name, shape in record.shapes)
        try:
            run_whole_model(model_path, manifest, feeds, quiet=True)
        except RunFailed as whole_failure:
            raise UserError(
                f"{model_path}: the model fails on the sample input ({record.source}: "
                f"{described}): {one_line(whole_failure)}; give a real input with "
                "--sample-input FILE.npz or fix the input dims with --input-shape") from None
        raise RunFailed(f"{one_line(stage_failure)} (on the sample input {described}, "
                        "which the whole model runs on)") from None


def try_probe(manifest: NetworkManifest, sample: Mapping[str, np.ndarray], seed: int
              ) -> SampleRun:
    """The probe run: what it saw of every tensor, up to the stage that failed on
    it, if one did (tensors it did not reach are settled without it)."""
    seen = SampleRun()
    try:
        run_sample(manifest, probe_feeds(manifest, sample, seed), into=seen)
    except (RunFailed, UserError) as exc:
        log.info("probe run with changed input dims stopped (%s): tensors after that "
                 "stage keep the dynamic dims shape inference gave them", one_line(exc))
    return seen


def check_dtype(spec: TensorSpec, observed: Observed, stage: Stage, path: Path) -> None:
    """UserError when shape inference and the run disagree on a tensor's type."""
    if spec.dtype == "unknown":
        return
    try:
        declared = numpy_dtype(spec).name
    except UserError:
        return  # a type NumPy lacks (bfloat16): ONNX Runtime ran it, nothing to compare
    if declared != observed.dtype:
        raise UserError(f"{path}: cannot fix the shapes of stage {stage.stage_id!r}: tensor "
                        f"{spec.name!r} is declared {declared} but the sample run gave "
                        f"{observed.dtype}")
