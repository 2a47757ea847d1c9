"""The ONNX splitter's entry point: one model in, per-layer stage files and a manifest out.

`split_model` reads the model once (`load_model`, which refuses missing,
truncated and non-ONNX files), runs shape inference once and walks the node
list once; it never calls `onnx.utils.extract_model`, which re-reads and
re-infers the whole model for every stage. docs/manifest.md describes the
result. The work is done by one module per concern:

- model_prep.onnx_graph: node records and structure checks from the GraphProto;
- model_prep.shapes: `--input-shape`, shape inference, tensor specs;
- model_prep.planner: the cut rule (pure: which node goes into which stage);
- model_prep.stage_files: building and writing the stage files;
- model_prep.optimize: with `ort_optimize` (`--ort-optimize`, the default in
  load mode mmap for models with fixed input dims), the graph cut
  is the one ONNX Runtime optimises the model into: its weighted operators are
  contrib ones (com.microsoft.nchwc Conv, FusedConv, FusedGemm, ...), and the
  tensors crossing the cuts are those the whole model passes on, NCHWc-blocked
  ones included. The manifest then records the onnxruntime version, machine
  and graph level (`ort_optimized`).

This module also owns network names (`default_network_name`,
`check_network_name`). Dynamic dimensions stay dynamic unless `input_shapes`
fixes them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from masa.common.errors import UserError, one_line
from model_prep.manifest import (
    LOAD_MODES,
    MANIFEST_NAME,
    NetworkManifest,
    OrtOptimization,
    sha256_file,
    write_manifest,
)
from model_prep.onnx_graph import check_structure, read_graph
from model_prep.optimize import current_optimization, optimize_for_split
from model_prep.planner import DEFAULT_MAX_CUT_TENSORS, GraphAnalysis, NodeRecord, plan_network
from model_prep.shapes import has_known_type, infer_types, tensor_spec
from model_prep.slicing import slice_model
from model_prep.stage_files import (
    DEFAULT_EXTERNAL_DATA_BYTES,
    DEFAULT_LOAD_MODE,
    SplitProgress,
    write_stages,
)

log = logging.getLogger(__name__)

_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


# --------------------------------------------------------------- loading


def check_model_file(model_path: str | Path) -> Path:
    """The path, if it names an existing file; UserError otherwise."""
    path = Path(model_path)
    if not path.exists():
        raise UserError(f"{path}: no such file (expected an ONNX model)")
    if not path.is_file():
        raise UserError(f"{path}: not a file (expected an ONNX model)")
    return path


def load_model(model_path: str | Path) -> onnx.ModelProto:
    """Read and sanity-check an ONNX file (with its external data); UserError if bad."""
    path = check_model_file(model_path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise UserError(f"{path}: not a valid ONNX model: cannot parse it "
                        f"({one_line(exc)}); truncated or not ONNX?") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if model.ir_version <= 0 or not model.HasField("graph") or not model.opset_import:
        raise UserError(f"{path}: not an ONNX model: expected an IR version, a graph and "
                        "opset imports (truncated or not ONNX?)")
    if not model.graph.output:
        raise UserError(f"{path}: at 'graph.output': expected at least one graph output "
                        "(truncated or invalid model?)")
    check_structure(model.graph, path)
    try:  # a no-op unless some tensors live in external data files
        external_data_helper.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read its external data: {one_line(exc)}") from None
    return model


# --------------------------------------------------------------- names


def default_network_name(model_path: str | Path) -> str:
    """The model file's stem, with characters a directory name should not have replaced."""
    stem = Path(model_path).stem
    name = re.sub(r"[^A-Za-z0-9._-]", "_", stem).lstrip("._-")
    return name or "network"


def check_network_name(name: str) -> str:
    if not _NAME_PATTERN.fullmatch(name):
        raise UserError(f"--name {name!r}: expected letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit")
    return name


# --------------------------------------------------------------- splitting


def wants_ort_optimize(graph: onnx.GraphProto, runtime_inputs: Sequence[str],
                       input_shapes: Mapping[str, Sequence[int | str]] | None,
                       load_mode: str) -> bool:
    """Whether a split that was not told cuts ONNX Runtime's optimised graph.

    Yes in load mode mmap when every runtime input's dims are fixed (declared or
    given): stages cut from the model as given must be loaded below graph level
    ALL to keep their weights mapped, which leaves convolutions without the
    blocked NCHWc layout (up to 1.4x the EXEC time) and lets ONNX Runtime fuse
    BatchNorm into a private copy of the weights; the optimised graph holds
    both transformations already, so its stages run at full speed on mapped
    weights (docs/load-bench.md). Dynamic dims would need a probe run on
    guessed shapes (model_prep.optimize), so those models stay as given.
    """
    if load_mode != "mmap":
        return False
    given = dict(input_shapes or {})
    for value in graph.input:
        if value.name not in runtime_inputs:
            continue
        if value.name in given:
            if not all(isinstance(dim, int) for dim in given[value.name]):
                return False
            continue
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape") or any(
                not dim.HasField("dim_value") for dim in tensor_type.shape.dim):
            return False
    return True


@dataclass
class _TypedGraph:
    """The graph to cut, as read: its records, analysis and tensor types."""

    model: onnx.ModelProto
    records: list[NodeRecord]
    analysis: GraphAnalysis
    types: dict[str, onnx.TypeProto]
    output_types: dict[str, onnx.TypeProto]  # types, plus declared graph output types
    ort_optimized: OrtOptimization | None


def split_model(
    model_path: str | Path,
    out_dir: str | Path,
    name: str,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    *,
    max_cut_tensors: int = DEFAULT_MAX_CUT_TENSORS,
    min_stage_weight_bytes: int = 0,
    external_data_bytes: int = DEFAULT_EXTERNAL_DATA_BYTES,
    progress: SplitProgress | None = None,
    ort_optimize: bool | None = None,
    scratch_dir: str | Path | None = None,
    load_mode: str = DEFAULT_LOAD_MODE,
    max_stage_weight_bytes: int = 0,
) -> NetworkManifest:
    """Split MODEL into `out_dir/stages/*.onnx` and write `out_dir/manifest.yaml`.

    `out_dir` is the network directory itself (created; must be absent or
    empty); `masa prepare` passes a temporary directory and renames it into
    the store afterwards. `input_shapes` fixes input dims ({name: [1, 3, 224,
    224]}; a string dim stays symbolic). With `ort_optimize`, the graph split
    is ONNX Runtime's optimised version of the model (model_prep.optimize),
    made in a temporary directory under `scratch_dir` (default: the system's)
    that is gone when this returns. None (the default) optimises in load mode
    mmap when every input's dims are fixed (`wants_ort_optimize`), and splits
    the model as given if ONNX Runtime cannot optimise it. `load_mode` ("mmap" or "copy") is how
    stage files hold their weights (model_prep.stage_files).
    `max_stage_weight_bytes` > 0 slices every Gemm/MatMul/Conv whose weights
    exceed it into stages of at most that much (model_prep.slicing). Returns
    the manifest (without profiles), whose `directory` is `out_dir`.
    """
    check_network_name(name)
    if load_mode not in LOAD_MODES:
        raise UserError(f"--load-mode: expected one of {', '.join(LOAD_MODES)}, got "
                        f"{load_mode!r}")
    if max_cut_tensors < 1:
        raise UserError(f"--max-cut-tensors: expected a positive integer, got {max_cut_tensors}")
    if min_stage_weight_bytes < 0:
        raise UserError(f"--min-stage-bytes: expected a non-negative size, got "
                        f"{min_stage_weight_bytes}")
    model_path = Path(model_path)
    source = str(model_path)
    typed = _read_typed_graph(model_path, input_shapes, ort_optimize, scratch_dir, load_mode,
                              max_stage_weight_bytes)
    model, analysis, types = typed.model, typed.analysis, typed.types
    graph_outputs = [o.name for o in model.graph.output]
    for output in graph_outputs:
        if output in analysis.constant_names:
            raise UserError(f"{source}: graph output {output!r} is a constant: expected every "
                            "output to be computed from the inputs")
    constant_bytes = {n: tensor_spec(n, types.get(n)).size_bytes or 0
                      for n in analysis.constant_names}
    known = {n for n, value_type in types.items() if has_known_type(value_type)}
    layouts = plan_network(typed.records, analysis, graph_outputs, constant_bytes, known,
                           max_cut_tensors, min_stage_weight_bytes)

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"{out_dir}: expected an empty or new directory for the network")
    stages = write_stages(model, layouts, types, typed.output_types, out_dir,
                          external_data_bytes, progress, load_mode)
    manifest = NetworkManifest(
        name=name,
        source_path=str(model_path.resolve()),
        source_sha256=sha256_file(model_path),
        ir_version=model.ir_version,
        opsets=tuple((o.domain, o.version) for o in model.opset_import),
        inputs=tuple(tensor_spec(n, types.get(n)) for n in analysis.runtime_inputs),
        outputs=tuple(tensor_spec(n, typed.output_types.get(n)) for n in graph_outputs),
        stages=tuple(stages),
        directory=out_dir,
        ort_optimized=typed.ort_optimized,
        load_mode=load_mode,
    )
    write_manifest(manifest, out_dir / MANIFEST_NAME)
    log.info("split %s%s into %d stages (%d weighted operators)", source,
             " (ORT-optimised)" if typed.ort_optimized else "", len(stages),
             sum(layout.weighted_count for layout in layouts))
    return manifest


def _load_sliced(model_path: Path, max_stage_weight_bytes: int) -> tuple[onnx.ModelProto, bool]:
    """The model, with operators over the limit sliced (model_prep.slicing), and
    whether anything was sliced."""
    if max_stage_weight_bytes < 0:
        raise UserError(f"--max-stage-bytes: expected a non-negative size, got "
                        f"{max_stage_weight_bytes}")
    model = load_model(model_path)
    if not max_stage_weight_bytes:
        return model, False
    sliced, notes = slice_model(model, max_stage_weight_bytes)
    for note in notes:
        log.info("%s (%d weight bytes): %s", note.node, note.weight_bytes,
                 f"{note.slices} slices" if note.slices > 1 else f"left whole: {note.reason}")
    return sliced, sliced is not model


def _read_typed_graph(
    model_path: Path,
    input_shapes: Mapping[str, Sequence[int | str]] | None,
    ort_optimize: bool | None,
    scratch_dir: str | Path | None,
    load_mode: str,
    max_stage_weight_bytes: int = 0,
) -> _TypedGraph:
    """Load the model (slice oversized operators, then ORT-optimise it if asked),
    analyse its graph, type its tensors."""
    source = str(model_path)
    model, sliced = _load_sliced(model_path, max_stage_weight_bytes)
    records, analysis = read_graph(model.graph)
    ort_optimized = None
    optimize = (wants_ort_optimize(model.graph, analysis.runtime_inputs, input_shapes, load_mode)
                if ort_optimize is None else ort_optimize)
    if optimize:
        try:
            optimized = optimize_for_split(model, dict(input_shapes or {}), source,
                                           analysis.runtime_inputs, scratch_dir,
                                           None if sliced else model_path)
        except UserError as exc:
            if ort_optimize:
                raise
            # Asked for nothing: the model as given still splits (portable stages).
            log.warning("%s; splitting the model as given (pass --no-ort-optimize to skip "
                        "the attempt)", exc)
            # optimize_for_split changed it in place
            model, _ = _load_sliced(model_path, max_stage_weight_bytes)
        else:
            model, ort_optimized = optimized, current_optimization()
            records, analysis = read_graph(model.graph)
            input_shapes = None  # applied before optimising
    types, inferred_graph = infer_types(model, dict(input_shapes or {}), source,
                                        analysis.runtime_inputs)
    # Graph outputs keep their declared type where inference found nothing.
    output_types = dict(types)
    for output in inferred_graph.output:
        if output.type.WhichOneof("value") is not None:
            output_types[output.name] = output.type
    return _TypedGraph(model, records, analysis, types, output_types, ort_optimized)
