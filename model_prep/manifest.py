"""The network manifest: what a prepared network is, as frozen data, and its YAML form.

`DIR/NAME/manifest.yaml` (format 1) describes one network split into stages:
the source model, its inputs and outputs, and per stage its file, checksum,
operators, layer type, tensors, weights and (optionally) its profile. The
format is documented in docs/manifest.md. `load_manifest` validates a manifest
and reports every problem with its path; `write_manifest` writes atomically.

The optional `ort_optimized` field marks stages cut from ONNX Runtime's
optimised graph (`masa prepare --ort-optimize`): such stage files hold
hardware-specific operators (NCHWc), so loading them where the onnxruntime
version or the machine differs logs a warning (`ort_mismatch`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from masa.common.atomic import atomic_write_text
from masa.common.errors import ErrorCollector, UserError
from masa.common.yamlsafe import bounded_loader

# libyaml's C loader and dumper when present: 4x faster than pure Python on a
# manifest of a few hundred stages (loading workloads is dominated by this).
# Integers of more than 40 characters are refused (masa.common.yamlsafe).
_YAML_LOADER = bounded_loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader))
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

MANIFEST_FORMAT = 1
MANIFEST_NAME = "manifest.yaml"
LAYER_TYPES = ("conv", "fc", "other")
LOAD_MODES = ("mmap", "copy")  # model_prep.stage_files
# onnxruntime.GraphOptimizationLevel names an optimised graph may be made at.
ORT_GRAPH_LEVELS = ("ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT",
                    "ORT_ENABLE_ALL")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSpec:
    """A tensor crossing a stage boundary. Dims are ints, or strings when dynamic."""

    name: str
    dtype: str  # numpy dtype name: float32, int64, ...
    shape: tuple[int | str, ...]
    size_bytes: int | None  # None while a dim is dynamic
    # The shape this tensor really had when prepare ran the stages on its sample
    # input (model_prep.sample_run); None: never run (--no-profile, older manifests).
    sample_shape: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SessionAlternative:
    """The figures of the session option the profiler measured and did not choose."""

    prepack: bool
    load_time_us: int
    exec_time_us: int
    load_peak_bytes: int
    resident_bytes: int
    exec_peak_bytes: int


@dataclass(frozen=True)
class StageProfile:
    """Measured cost of one stage, in one fresh worker, one stage at a time.

    Memory figures are increases over the RSS just before the operation:
    - load_peak_bytes: peak during file read + session creation (kernel VmHWM);
    - resident_bytes: what the stage holds from its load until it is unloaded:
      the session's anonymous memory after the load, plus mapped_bytes;
    - exec_peak_bytes: peak working memory of one run on a loaded session,
      less the weight pages the run mapped in (those are in resident_bytes);
    - mapped_bytes: file-backed weight pages the session maps from the stage's
      data file (0 when its weights are copied).
    The sampled_* figures are the same peaks seen by a /proc/self/statm polling
    thread, whose median interval was sampling_interval_us. `alternative` holds
    the figures of the other session option when both were measured.
    """

    load_time_us: int
    exec_time_us: int  # median of exec_runs runs after warm-up
    exec_runs: int
    load_peak_bytes: int
    resident_bytes: int
    exec_peak_bytes: int
    sampled_load_peak_bytes: int
    sampled_exec_peak_bytes: int
    sampling_interval_us: float
    mapped_bytes: int = 0
    alternative: SessionAlternative | None = None


@dataclass(frozen=True)
class Stage:
    stage_id: str
    file: str  # relative to the network directory
    sha256: str
    op_types: tuple[str, ...]
    layer_type: str  # one of LAYER_TYPES
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    producers: tuple[str, ...]  # ids of the stages whose outputs this stage reads
    weight_bytes: int
    note: str | None = None  # why the stage is larger than one weighted operator
    profile: StageProfile | None = None
    mapped_bytes: int = 0  # weight bytes in the stage's data file, mapped, not copied
    # Session with prepacking (graph level ALL), or without it (level EXTENDED)
    # so that mapped weights stay mapped (model_prep.session.stage_session_options).
    prepack: bool = True
    # sha256 of the `<file>.data` weights beside the stage file (load mode mmap, or
    # copy mode over protobuf's limit); None: no data file (or a manifest from before).
    data_sha256: str | None = None

    @property
    def data_file(self) -> str:
        """The stage's external-data file, relative to the network directory."""
        return f"{self.file}.data"

    @property
    def loaded_mapped_bytes(self) -> int:
        """Weight bytes a loaded stage keeps mapped from its data file, in the page
        cache; 0 when the session copies them (copy mode, or prepacked)."""
        return 0 if self.prepack else self.mapped_bytes


@dataclass(frozen=True)
class RuntimeBase:
    """Cost paid once per process, not per stage: importing and first session setup."""

    process_rss_bytes: int
    first_session_bytes: int
    first_session_time_us: int


@dataclass(frozen=True)
class OrtOptimization:
    """What ONNX Runtime optimised the graph the stages were cut from, and where.

    Graphs optimised at ORT_ENABLE_ALL on x86 hold NCHWc operators whose
    blocked layout suits that machine's vector width: ONNX Runtime itself says
    such a graph "should only be used in the same environment".
    """

    onnxruntime: str  # onnxruntime.__version__
    machine: str  # platform.machine()
    graph_level: str  # one of ORT_GRAPH_LEVELS


@dataclass(frozen=True)
class SampleInput:
    """The input `masa prepare` ran the stages on to fix shapes and profile them."""

    source: str  # "random" (seeded, from the declared shapes) or the .npz file's path
    seed: int  # of the random data (also of the probe run, model_prep.sample_run)
    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # (input name, its sample shape)


@dataclass(frozen=True)
class NetworkManifest:
    name: str
    source_path: str
    source_sha256: str
    ir_version: int
    opsets: tuple[tuple[str, int], ...]  # (domain, version)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    stages: tuple[Stage, ...]  # in a topological order
    runtime_base: RuntimeBase | None = None
    format: int = MANIFEST_FORMAT
    directory: Path = field(default=Path("."), compare=False)
    ort_optimized: OrtOptimization | None = None  # None: cut from the model as given
    load_mode: str = "copy"  # how the stage files hold their weights (LOAD_MODES)
    sample: SampleInput | None = None  # None: the stages never ran (--no-profile)

    def stage_path(self, stage: Stage) -> Path:
        return self.directory / stage.file

    def stage_files(self, stage: Stage) -> tuple[Path, ...]:
        """The files a LOAD of the stage reads: its graph and, where there is one, its
        external-data file (the weights)."""
        data = self.directory / stage.data_file
        return (self.stage_path(stage), data) if data.is_file() else (self.stage_path(stage),)

    @property
    def profiled(self) -> bool:
        return all(stage.profile is not None for stage in self.stages)

    def with_profiles(
        self, profiles: dict[str, StageProfile], runtime_base: RuntimeBase | None
    ) -> NetworkManifest:
        """The manifest with these profiles; each stage takes the session option its
        profile measured (prepack is the option `alternative` is not)."""
        stages = tuple(_with_profile(s, profiles.get(s.stage_id)) for s in self.stages)
        return replace(self, stages=stages, runtime_base=runtime_base)


def _with_profile(stage: Stage, profile: StageProfile | None) -> Stage:
    if profile is None:
        return stage
    if profile.alternative is None:
        return replace(stage, profile=profile)
    return replace(stage, profile=profile, prepack=not profile.alternative.prepack)


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------- YAML form


def _tensor_to_dict(tensor: TensorSpec) -> dict[str, Any]:
    sampled = ({"sample_shape": list(tensor.sample_shape)}
               if tensor.sample_shape is not None else {})
    return {"name": tensor.name, "dtype": tensor.dtype, "shape": list(tensor.shape),
            "bytes": tensor.size_bytes, **sampled}


def _sample_to_dict(sample: SampleInput) -> dict[str, Any]:
    return {"source": sample.source, "seed": sample.seed,
            "shapes": {name: list(shape) for name, shape in sample.shapes}}


def manifest_to_dict(manifest: NetworkManifest) -> dict[str, Any]:
    # ort_optimized is written only when set, so plain manifests stay as they were.
    optimized = ({"ort_optimized": asdict(manifest.ort_optimized)}
                 if manifest.ort_optimized is not None else {})
    return {
        "format": manifest.format,
        "name": manifest.name,
        "source": {"path": manifest.source_path, "sha256": manifest.source_sha256},
        "ir_version": manifest.ir_version,
        "opsets": [{"domain": d, "version": v} for d, v in manifest.opsets],
        "inputs": [_tensor_to_dict(t) for t in manifest.inputs],
        "outputs": [_tensor_to_dict(t) for t in manifest.outputs],
        **optimized,
        "load_mode": manifest.load_mode,
        **({"sample": _sample_to_dict(manifest.sample)} if manifest.sample else {}),
        "runtime_base": asdict(manifest.runtime_base) if manifest.runtime_base else None,
        "stages": [
            {
                "id": s.stage_id,
                "file": s.file,
                "sha256": s.sha256,
                "op_types": list(s.op_types),
                "layer_type": s.layer_type,
                "inputs": [_tensor_to_dict(t) for t in s.inputs],
                "outputs": [_tensor_to_dict(t) for t in s.outputs],
                "producers": list(s.producers),
                "weight_bytes": s.weight_bytes,
                "note": s.note,
                "mapped_bytes": s.mapped_bytes,
                "prepack": s.prepack,
                "data_sha256": s.data_sha256,
                "profile": asdict(s.profile) if s.profile else None,
            }
            for s in manifest.stages
        ],
    }


def write_manifest(manifest: NetworkManifest, path: str | Path) -> None:
    """Write atomically (temporary name, then rename)."""
    text = yaml.dump(manifest_to_dict(manifest), Dumper=_YAML_DUMPER, sort_keys=False,
                     width=120)
    atomic_write_text(path, text)


def _tensor_from_dict(errors: ErrorCollector, raw: Any, path: str) -> TensorSpec | None:
    if not isinstance(raw, dict):
        errors.add(path, f"expected a tensor mapping, got {raw!r}")
        return None
    name = errors.get(raw, "name", str, path)
    dtype = errors.get(raw, "dtype", str, path)
    shape = errors.get(raw, "shape", list, path)
    size_bytes = errors.get(raw, "bytes", (int, type(None)), path)
    if shape is not None:
        for index, dim in enumerate(shape):
            if isinstance(dim, bool) or not isinstance(dim, int | str) or \
                    (isinstance(dim, int) and dim < 0):
                errors.add(f"{path}.shape[{index}]", f"expected an integer >= 0 or a name, "
                           f"got {dim!r}")
                return None
    if None in (name, dtype, shape):
        return None
    if size_bytes is not None and not _tensor_bytes_consistent(errors, path, dtype, shape,
                                                               size_bytes):
        return None
    sample_shape = None
    if raw.get("sample_shape") is not None:
        sample_shape = _dims_from_list(errors, raw["sample_shape"], f"{path}.sample_shape")
        if sample_shape is None:
            return None
    return TensorSpec(name=name, dtype=dtype, shape=tuple(shape), size_bytes=size_bytes,
                      sample_shape=sample_shape)


def _dims_from_list(errors: ErrorCollector, raw: Any, path: str) -> tuple[int, ...] | None:
    """A concrete shape: a list of non-negative integers."""
    if not isinstance(raw, list) or not all(
            isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in raw):
        errors.add(path, f"expected a list of non-negative integers, got {raw!r}")
        return None
    return tuple(raw)


def _sample_from_dict(errors: ErrorCollector, raw: Any) -> SampleInput | None:
    if not isinstance(raw, dict):
        errors.add("sample", f"expected a mapping with source, seed and shapes, got {raw!r}")
        return None
    source = errors.get(raw, "source", str, "sample")
    seed = errors.get(raw, "seed", int, "sample")
    shapes_raw = errors.get(raw, "shapes", dict, "sample")
    if None in (source, seed, shapes_raw):
        return None
    shapes = []
    for name, dims in shapes_raw.items():
        shape = _dims_from_list(errors, dims, f"sample.shapes.{name}")
        if shape is None:
            return None
        shapes.append((str(name), shape))
    return SampleInput(source=source, seed=seed, shapes=tuple(shapes))


_ITEMSIZES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2,
              "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
              "complex64": 8, "complex128": 16}


def _tensor_bytes_consistent(errors: ErrorCollector, path: str, dtype: str,
                             shape: list[int | str], size_bytes: int) -> bool:
    """`bytes` is what the shape and dtype say (when both are known): a hand-edited
    size would make the scheduler reserve too little."""
    if size_bytes < 0:
        errors.add(f"{path}.bytes", f"expected a non-negative integer, got {size_bytes}")
        return False
    itemsize = _ITEMSIZES.get(dtype)  # None: a dtype such as bfloat16, not compared
    if itemsize is None or not all(isinstance(dim, int) for dim in shape):
        return True
    expected = math.prod(shape) * itemsize
    if size_bytes != expected:
        errors.add(f"{path}.bytes", f"expected {expected} (shape {shape} of {dtype}), "
                   f"got {size_bytes}")
        return False
    return True


def _dataclass_from_dict(errors: ErrorCollector, cls: type, raw: Any, path: str,
                         nested: Mapping[str, type] | None = None) -> Any:
    """A dataclass of non-negative numbers and booleans, and of the dataclasses (or
    null) that `nested` names by field; fields with a default may be absent
    (manifests written before they existed)."""
    nested = nested or {}
    if not isinstance(raw, dict):
        errors.add(path, f"expected a mapping, got {raw!r}")
        return None
    defaults = {f.name for f in fields(cls)
                if f.default is not MISSING or f.default_factory is not MISSING}
    values = {}
    for name, kind in cls.__annotations__.items():
        if name in defaults and name not in raw:
            continue
        if kind == "bool":
            flag = errors.get(raw, name, bool, path)
            if flag is None:
                return None
            values[name] = flag
            continue
        if name in nested:
            if raw[name] is not None:
                values[name] = _dataclass_from_dict(errors, nested[name], raw[name],
                                                    f"{path}.{name}")
                if values[name] is None:
                    return None
            continue
        expected = (int, float) if kind == "float" else int
        value = errors.get(raw, name, expected, path)
        if value is None:
            return None
        if isinstance(value, bool) or value < 0:
            errors.add(f"{path}.{name}", f"expected a non-negative number, got {value}")
            return None
        values[name] = value
    return cls(**values)


def manifest_from_dict(
    raw: Any, source: str, directory: Path, check_files: bool = True, full_check: bool = False,
) -> NetworkManifest:
    """Validate a parsed manifest; raise ValidationError listing every problem.

    check_files: every stage file (and data file) must exist and match its
    sha256 (`check_stage_files`; full_check hashes every file, not only those
    changed since they were last verified)."""
    errors = ErrorCollector(source)
    if not isinstance(raw, dict):
        errors.add("", "expected a mapping at the top level")
        errors.raise_if_any()
    fmt = errors.get(raw, "format", int, "")
    if fmt is not None and fmt != MANIFEST_FORMAT:
        errors.add("format", f"expected {MANIFEST_FORMAT}, got {fmt}")
    name = errors.get(raw, "name", str, "")
    source_map = errors.get(raw, "source", dict, "") or {}
    source_path = errors.get(source_map, "path", str, "source") if source_map else None
    source_sha = errors.get(source_map, "sha256", str, "source") if source_map else None
    ir_version = errors.get(raw, "ir_version", int, "")
    opsets = []
    for index, entry in enumerate(errors.get(raw, "opsets", list, "") or []):
        opset_path = f"opsets[{index}]"
        if not isinstance(entry, dict):
            errors.add(opset_path, "expected a mapping with domain and version")
            continue
        domain = errors.get(entry, "domain", str, opset_path)
        version = errors.get(entry, "version", int, opset_path)
        if domain is not None and version is not None:
            opsets.append((domain, version))
    tensors: dict[str, tuple[TensorSpec, ...]] = {}
    for key in ("inputs", "outputs"):
        items = errors.get(raw, key, list, "") or []
        parsed = [_tensor_from_dict(errors, t, f"{key}[{i}]") for i, t in enumerate(items)]
        tensors[key] = tuple(t for t in parsed if t is not None)
    optimized_raw = raw.get("ort_optimized")
    ort_optimized = (_ort_optimization_from_dict(errors, optimized_raw)
                     if optimized_raw is not None else None)
    load_mode = errors.get(raw, "load_mode", str, "", required=False) or "copy"
    if load_mode not in LOAD_MODES:
        errors.add("load_mode", f"expected one of {', '.join(LOAD_MODES)}, got {load_mode!r}")
    sample = _sample_from_dict(errors, raw["sample"]) if raw.get("sample") is not None else None
    runtime_raw = raw.get("runtime_base")
    runtime_base = (
        _dataclass_from_dict(errors, RuntimeBase, runtime_raw, "runtime_base")
        if runtime_raw is not None else None
    )
    stages: list[Stage] = []
    seen_ids: set[str] = set()
    for index, entry in enumerate(errors.get(raw, "stages", list, "") or []):
        stage = _stage_from_dict(errors, entry, f"stages[{index}]", seen_ids)
        if stage is not None:
            stages.append(stage)
    if not stages and not errors.problems:
        errors.add("stages", "expected at least one stage")
    if check_files:
        _check_stage_sizes(errors, stages, directory)
    errors.raise_if_any()
    manifest = NetworkManifest(
        name=name, source_path=source_path, source_sha256=source_sha, ir_version=ir_version,
        opsets=tuple(opsets), inputs=tensors["inputs"], outputs=tensors["outputs"],
        stages=tuple(stages), runtime_base=runtime_base, format=fmt, directory=directory,
        ort_optimized=ort_optimized, load_mode=load_mode, sample=sample,
    )
    if check_files:
        check_stage_files(manifest, full=full_check, source=source)
    return manifest


def _check_stage_sizes(errors: ErrorCollector, stages: list[Stage], directory: Path) -> None:
    """Mapped weights consistent with the stage's data file: at most all of it, and more
    than half (the padding before each mapped tensor is smaller than the tensor,
    model_prep.stage_files), so neither can be edited down unnoticed."""
    for index, stage in enumerate(stages):
        data = directory / stage.data_file
        try:
            data_size = data.stat().st_size if data.is_file() else 0
        except OSError:
            continue  # reported by the file checks
        # (A data file with nothing mapped: copy mode over protobuf's 2 GB limit.)
        if stage.mapped_bytes > data_size or 0 < 2 * stage.mapped_bytes < data_size:
            errors.add(f"stages[{index}].mapped_bytes", f"inconsistent with the {data_size} "
                       f"bytes of {stage.data_file} (expected more than half of it, at most "
                       f"all), got {stage.mapped_bytes}")


def _ort_optimization_from_dict(errors: ErrorCollector, raw: Any) -> OrtOptimization | None:
    if not isinstance(raw, dict):
        errors.add("ort_optimized", "expected a mapping with onnxruntime, machine and "
                   f"graph_level, got {raw!r}")
        return None
    before = len(errors.problems)
    values = {}
    for key in ("onnxruntime", "machine", "graph_level"):
        value = errors.get(raw, key, str, "ort_optimized")
        if value is not None and not value.strip():
            errors.add(f"ort_optimized.{key}", "expected a non-empty string")
        values[key] = value
    level = values["graph_level"]
    if level is not None and level.strip() and level not in ORT_GRAPH_LEVELS:
        errors.add("ort_optimized.graph_level",
                   f"expected one of {', '.join(ORT_GRAPH_LEVELS)}, got {level!r}")
    for key in sorted(set(raw) - set(values)):
        errors.add(f"ort_optimized.{key}", "unknown field (expected onnxruntime, machine, "
                   "graph_level)")
    if len(errors.problems) > before:
        return None
    return OrtOptimization(**values)


def ort_mismatch(optimized: OrtOptimization, onnxruntime_version: str, machine: str
                 ) -> str | None:
    """Why stages optimised as `optimized` may not suit this runtime, or None if they do."""
    differences = []
    if optimized.onnxruntime != onnxruntime_version:
        differences.append(f"onnxruntime {optimized.onnxruntime}, this is "
                           f"{onnxruntime_version}")
    if optimized.machine != machine:
        differences.append(f"machine {optimized.machine}, this is {machine}")
    if not differences:
        return None
    return "; ".join(differences)


_warned_networks: set[Path] = set()


def _warn_if_ort_mismatch(manifest: NetworkManifest) -> None:
    """Log once per network directory: optimised stages from another runtime or machine."""
    if manifest.ort_optimized is None or manifest.directory in _warned_networks:
        return
    import onnxruntime  # only for optimised networks: importing it costs ~0.2 s

    mismatch = ort_mismatch(manifest.ort_optimized, onnxruntime.__version__,
                            platform.machine())
    if mismatch is not None:
        _warned_networks.add(manifest.directory)
        log.warning("network %r in %s: its stages were cut from a graph ONNX Runtime "
                    "optimised for another environment (%s); such graphs may hold "
                    "hardware-specific operators (NCHWc) and run slower, wrongly or not at "
                    "all: prepare it again here (masa prepare --ort-optimize)",
                    manifest.name, manifest.directory, mismatch)


def _stage_from_dict(
    errors: ErrorCollector, raw: Any, path: str, seen_ids: set[str],
) -> Stage | None:
    if not isinstance(raw, dict):
        errors.add(path, f"expected a stage mapping, got {raw!r}")
        return None
    before = len(errors.problems)
    stage_id = errors.get(raw, "id", str, path)
    file_name = errors.get(raw, "file", str, path)
    sha256 = errors.get(raw, "sha256", str, path)
    op_types = errors.get(raw, "op_types", list, path)
    if op_types is not None and not all(isinstance(op, str) for op in op_types):
        errors.add(f"{path}.op_types", f"expected a list of operator names, got {op_types!r}")
    layer_type = errors.get(raw, "layer_type", str, path)
    if layer_type is not None and layer_type not in LAYER_TYPES:
        errors.add(f"{path}.layer_type", f"expected one of {', '.join(LAYER_TYPES)}, "
                   f"got {layer_type!r}")
    weight_bytes = errors.get(raw, "weight_bytes", int, path)
    if weight_bytes is not None and weight_bytes < 0:
        errors.add(f"{path}.weight_bytes", f"expected a non-negative integer, got {weight_bytes}")
    producers = errors.get(raw, "producers", list, path) or []
    for producer in producers:
        if not isinstance(producer, str):
            errors.add(f"{path}.producers", f"expected stage ids, got {producer!r}")
        elif producer not in seen_ids:
            errors.add(f"{path}.producers", f"unknown or later stage {producer!r} "
                       "(stages must be listed in topological order)")
    note = errors.get(raw, "note", (str, type(None)), path, required=False)
    mapped_bytes = errors.get(raw, "mapped_bytes", int, path, required=False) or 0
    if mapped_bytes < 0:
        errors.add(f"{path}.mapped_bytes", f"expected a non-negative integer, got {mapped_bytes}")
    elif weight_bytes is not None and mapped_bytes > weight_bytes >= 0:
        errors.add(f"{path}.mapped_bytes", f"expected at most weight_bytes ({weight_bytes}), "
                   f"got {mapped_bytes}")
    prepack = errors.get(raw, "prepack", bool, path, required=False)
    data_sha256 = errors.get(raw, "data_sha256", (str, type(None)), path, required=False)
    tensor_lists = {}
    for key in ("inputs", "outputs"):
        items = errors.get(raw, key, list, path) or []
        parsed = [_tensor_from_dict(errors, t, f"{path}.{key}[{i}]") for i, t in enumerate(items)]
        tensor_lists[key] = tuple(t for t in parsed if t is not None)
    profile_raw = raw.get("profile")
    profile = (
        _dataclass_from_dict(errors, StageProfile, profile_raw, f"{path}.profile",
                             nested={"alternative": SessionAlternative})
        if profile_raw is not None else None
    )
    if stage_id in seen_ids:
        errors.add(f"{path}.id", f"duplicate stage id {stage_id!r}")
    elif stage_id is not None:
        # Known even if this stage has other problems, so later stages that
        # read it are not also reported (one problem, one message).
        seen_ids.add(stage_id)
    if len(errors.problems) > before:
        return None
    return Stage(
        stage_id=stage_id, file=file_name, sha256=sha256, op_types=tuple(op_types),
        layer_type=layer_type, inputs=tensor_lists["inputs"], outputs=tensor_lists["outputs"],
        producers=tuple(producers), weight_bytes=weight_bytes, note=note, profile=profile,
        mapped_bytes=mapped_bytes, prepack=True if prepack is None else prepack,
        data_sha256=data_sha256,
    )


def load_manifest(network_dir: str | Path, check_files: bool = True,
                  full_check: bool = False) -> NetworkManifest:
    """Load and validate DIR/NAME/manifest.yaml (pass the DIR/NAME directory).

    With check_files, every stage file must exist and match its sha256: checked
    by size, modification time and inode against the last full check
    (`check_stage_files`), or by hashing every file with full_check.
    """
    directory = Path(network_dir)
    path = directory / MANIFEST_NAME
    if not path.is_file():
        raise UserError(f"{path}: no manifest here (run `masa prepare` first)")
    try:
        raw = yaml.load(path.read_text(), Loader=_YAML_LOADER)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise UserError(f"{path}: not a YAML manifest ({type(exc).__name__})") from None
    manifest = manifest_from_dict(raw, str(path), directory, check_files=check_files,
                                  full_check=full_check)
    _warn_if_ort_mismatch(manifest)
    return manifest


def load_store_network(store_dir: str | Path, name: str, check_files: bool = True
                       ) -> NetworkManifest:
    """The prepared network NAME in store DIR."""
    network_dir = Path(store_dir) / name
    if not network_dir.is_dir():
        available = sorted(p.parent.name for p in Path(store_dir).glob(f"*/{MANIFEST_NAME}")
                           if not p.parent.name.startswith("."))  # not a replaced version
        raise UserError(f"{store_dir}: no prepared network {name!r} "
                        f"(store has: {', '.join(p for p in available) or 'nothing'})")
    return load_manifest(network_dir, check_files=check_files)


# ------------------------------------------------------- start-up checks of stage files
#
# Hashing every stage file at start reads the whole network from storage (and
# warms the page cache, so a cold start could not even be measured). A full
# check records each file's size, modification time and inode with the sha256 it
# verified in `VERIFIED_NAME`; later checks hash only files whose stat differs
# (or whose expected sha256 is not the one recorded). `masa verify` hashes all.

VERIFIED_NAME = ".verified.json"
_VERIFIED_FORMAT = 1


def stage_file_checks(manifest: NetworkManifest) -> list[tuple[str, str, str, str]]:
    """(manifest path of the file's field, of its checksum's field, file relative to
    the network, expected sha256) for every stage file, and for every data file
    the manifest records a sha256 for."""
    checks = []
    for index, stage in enumerate(manifest.stages):
        checks.append((f"stages[{index}].file", f"stages[{index}].sha256", stage.file,
                       stage.sha256))
        if stage.data_sha256 is not None:
            checks.append((f"stages[{index}].data_sha256", f"stages[{index}].data_sha256",
                           stage.data_file, stage.data_sha256))
    return checks


def _stat_key(stat: Any) -> list[int]:
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def _read_verified(directory: Path) -> dict[str, Any]:
    try:
        raw = json.loads((directory / VERIFIED_NAME).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict) or raw.get("format") != _VERIFIED_FORMAT:
        return {}
    files = raw.get("files")
    return files if isinstance(files, dict) else {}


def check_stage_files(manifest: NetworkManifest, full: bool = False,
                      source: str | None = None) -> int:
    """Every stage and data file exists and matches its sha256; the bytes hashed.

    Without `full`, a file whose size, modification time and inode equal those
    recorded by the last check that hashed it, for the sha256 the manifest
    expects, is not read. Raises ValidationError listing every problem.
    """
    directory = manifest.directory
    errors = ErrorCollector(source or str(directory / MANIFEST_NAME))
    verified = {} if full else _read_verified(directory)
    recorded: dict[str, Any] = {}
    hashed_bytes = 0
    for file_path, sha_path, file_name, expected in stage_file_checks(manifest):
        target = directory / file_name
        kind = "data file" if file_name.endswith(".data") else "stage file"
        try:
            stat = target.stat()
        except OSError:
            errors.add(file_path, f"{kind} {target} does not exist")
            continue
        entry = [*_stat_key(stat), expected]
        if verified.get(file_name) == entry:
            recorded[file_name] = entry
            continue
        hashed_bytes += stat.st_size
        if sha256_file(target) != expected:
            errors.add(sha_path, f"{kind} {target} does not match its sha256 "
                       "(changed or corrupted after prepare)")
            continue
        recorded[file_name] = entry
    errors.raise_if_any()
    if hashed_bytes or set(recorded) != set(verified):
        _write_verified(directory, recorded)
    return hashed_bytes


def _write_verified(directory: Path, files: dict[str, Any]) -> None:
    """Best effort: a read-only store is checked in full on every start."""
    try:
        atomic_write_text(directory / VERIFIED_NAME,
                          json.dumps({"format": _VERIFIED_FORMAT, "files": files}))
    except OSError as error:
        log.debug("cannot record verified stage files in %s: %s", directory, error)


def record_stage_files(manifest: NetworkManifest) -> None:
    """Record the stage files just written (and hashed) by prepare as verified, so
    the first run does not read them all."""
    recorded = {}
    for _, _, file_name, expected in stage_file_checks(manifest):
        try:
            recorded[file_name] = [*_stat_key((manifest.directory / file_name).stat()),
                                   expected]
        except OSError:
            continue  # the next check reports it
    _write_verified(manifest.directory, recorded)
