"""Stage files: build each stage's ONNX model from its planned layout, and write it.

This module owns every byte of a stage file. `build_stage_model` fills one
ModelProto per `StageLayout` (model_prep.planner): the stage's nodes, the
constant-making nodes and initializers it reads, typed inputs, outputs and
intermediate tensors, and the model's IR version, opsets and functions (with
IR < 4 its initializers are also listed as graph inputs, as that IR requires).
`write_stage_file` is the one place a stage file is written, fsynced, in one of
two load modes (`masa prepare --load-mode`):

- "mmap" (default): every initializer of at least `MIN_MAPPED_TENSOR_BYTES`
  goes to `<file>.data` beside the stage file, at an offset aligned so that
  ONNX Runtime maps it instead of copying it (it maps an external initializer
  only at a page-aligned offset). With prepacking off
  (model_prep.session) a LOAD then peaks at about 1.0x the weights instead
  of 2-5x (docs/load-bench.md), and the weights stay clean, shared,
  reclaimable file-backed pages;
- "copy": the weights inside the .onnx file (ONNX Runtime parses and copies
  them: load peak about 2x the weights), external only once they reach
  `DEFAULT_EXTERNAL_DATA_BYTES`, which protobuf requires.

`write_stages` does both for every stage and returns the manifest's `Stage`
records.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import numpy_helper

from model_prep.manifest import LOAD_MODES, Stage, sha256_file
from model_prep.planner import StageLayout
from model_prep.shapes import tensor_bytes_estimate, tensor_spec

# Protobuf refuses messages of 2 GiB and more; keep a margin for the graph itself.
# The other whole-model files the preparator writes for ONNX Runtime (the
# optimiser's input, verify's reshaped copy) use the same cap.
DEFAULT_EXTERNAL_DATA_BYTES = 1_800_000_000

DEFAULT_LOAD_MODE = "mmap"
# Smaller tensors stay inside the .onnx file: copying a bias costs nothing, and
# each mapped tensor costs a mapping and at least one page.
MIN_MAPPED_TENSOR_BYTES = 4096
# ONNX Runtime maps an external initializer only when its offset is a multiple
# of the allocation granularity: 4 KiB pages here, but 16 KiB (Raspberry Pi 5)
# or 64 KiB on some ARM kernels. Tensors of 1 MiB and more (where the weights
# are) are aligned for all of those; smaller ones to 4 KiB, so padding stays
# under 7% of the file. The same split as ONNX Runtime's own saver.
LARGE_TENSOR_BYTES = 1 << 20
LARGE_TENSOR_ALIGNMENT_BYTES = 64 * 1024
SMALL_TENSOR_ALIGNMENT_BYTES = 4096

SplitProgress = Callable[[int, int, str], None]  # (stages written, total, stage id)


def write_stages(
    model: onnx.ModelProto,
    layouts: Sequence[StageLayout],
    types: Mapping[str, onnx.TypeProto],
    output_types: Mapping[str, onnx.TypeProto],
    out_dir: Path,
    external_data_bytes: int = DEFAULT_EXTERNAL_DATA_BYTES,
    progress: SplitProgress | None = None,
    load_mode: str = DEFAULT_LOAD_MODE,
) -> list[Stage]:
    """Write `out_dir/stages/<id>.onnx` for every layout; their manifest records.

    One stage model at a time: each holds copies of its weights, so building
    them all first would hold the whole model's weights twice.
    """
    (out_dir / "stages").mkdir(parents=True, exist_ok=True)
    stages: list[Stage] = []
    for k, layout in enumerate(layouts):
        stage_model = build_stage_model(model, layout, types, output_types)
        file = f"stages/{layout.stage_id}.onnx"
        written = write_stage_file(stage_model, out_dir / file, external_data_bytes, load_mode)
        del stage_model
        stages.append(stage_record(layout, file, written, types, output_types))
        if progress is not None:
            progress(k + 1, len(layouts), layout.stage_id)
    return stages


def build_stage_model(
    model: onnx.ModelProto,
    layout: StageLayout,
    types: Mapping[str, onnx.TypeProto],
    output_types: Mapping[str, onnx.TypeProto],
) -> onnx.ModelProto:
    """The stage's self-contained model (its nodes read only its inputs and weights)."""
    graph = model.graph
    node_list = [graph.node[i] for i in layout.constant_nodes]
    node_list += [graph.node[i] for i in layout.nodes]
    initializers = [t for t in graph.initializer if t.name in layout.initializers]
    sparse = [t for t in graph.sparse_initializer if t.values.name in layout.initializers]

    # Filled in place: building a separate GraphProto and copying it in would
    # copy every weight twice.
    stage_model = onnx.ModelProto(
        ir_version=model.ir_version, producer_name="masa-prepare",
        producer_version=model.producer_version, domain=model.domain,
        model_version=model.model_version,
    )
    stage_model.opset_import.extend(model.opset_import)
    stage_model.functions.extend(model.functions)
    stage_graph = stage_model.graph
    stage_graph.name = f"{graph.name or 'graph'}_{layout.stage_id}"
    stage_graph.node.extend(node_list)
    stage_graph.input.extend(_value_info(n, types) for n in layout.inputs)
    if model.ir_version < 4:
        # IR < 4 requires every initializer to be listed as a graph input too;
        # ONNX Runtime still treats them as constants, not runtime inputs.
        stage_graph.input.extend(_value_info(t.name, types) for t in initializers)
    stage_graph.output.extend(_value_info(n, output_types) for n in layout.outputs)
    stage_graph.initializer.extend(initializers)
    stage_graph.sparse_initializer.extend(sparse)
    outputs = set(layout.outputs)
    internal = [n for node in node_list for n in node.output
                if n and n not in outputs and n in types]
    stage_graph.value_info.extend(_value_info(n, types) for n in internal)
    return stage_model


def _value_info(name: str, table: Mapping[str, onnx.TypeProto]) -> onnx.ValueInfoProto:
    info = onnx.ValueInfoProto(name=name)
    if name in table:
        info.type.CopyFrom(table[name])
    return info


def stage_record(
    layout: StageLayout, file: str, written: WrittenStage, types: Mapping[str, onnx.TypeProto],
    output_types: Mapping[str, onnx.TypeProto],
) -> Stage:
    """The manifest's entry for a written stage file.

    A stage with mapped weights is created without prepacking until the
    profiler measures that prepacking pays for itself (model_prep.profile).
    """
    return Stage(
        stage_id=layout.stage_id, file=file, sha256=written.sha256, op_types=layout.op_types,
        mapped_bytes=written.mapped_bytes, prepack=written.mapped_bytes == 0,
        layer_type=layout.layer_type,
        inputs=tuple(tensor_spec(n, types.get(n)) for n in layout.inputs),
        outputs=tuple(tensor_spec(n, output_types.get(n)) for n in layout.outputs),
        producers=layout.producers, weight_bytes=layout.weight_bytes, note=layout.note,
        data_sha256=written.data_sha256,
    )


@dataclass(frozen=True)
class WrittenStage:
    sha256: str  # of the .onnx file
    mapped_bytes: int  # weight bytes in <file>.data, at aligned offsets (mmap mode)
    data_sha256: str | None = None  # of <file>.data; None when none was written


def write_stage_file(stage_model: onnx.ModelProto, path: Path, external_data_bytes: int,
                     load_mode: str = DEFAULT_LOAD_MODE) -> WrittenStage:
    """Write one stage file (fsynced: the directory rename must not outrun it).

    Moving weights out to external data empties the model's tensors, so
    `stage_model` is of no use afterwards.
    """
    if load_mode not in LOAD_MODES:
        raise ValueError(f"load mode {load_mode!r}: expected one of {', '.join(LOAD_MODES)}")
    mapped_bytes = 0
    if load_mode == "mmap":
        mapped_bytes = _write_mapped_weights(stage_model, path.with_name(f"{path.name}.data"))
    elif sum(tensor_bytes_estimate(t) for t in stage_model.graph.initializer) \
            >= external_data_bytes:
        return WrittenStage(_write_external(stage_model, path), 0, _data_sha256(path))
    data = stage_model.SerializeToString()
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return WrittenStage(hashlib.sha256(data).hexdigest(), mapped_bytes, _data_sha256(path))


def _data_sha256(path: Path) -> str | None:
    """The sha256 of the stage's data file (start-up checks cover it too), if any."""
    data_path = path.with_name(f"{path.name}.data")
    return sha256_file(data_path) if data_path.exists() else None


def _write_mapped_weights(stage_model: onnx.ModelProto, data_path: Path) -> int:
    """Move every initializer of MIN_MAPPED_TENSOR_BYTES or more to `data_path` at an
    aligned offset; the bytes moved (0: no data file is written)."""
    offset = mapped_bytes = 0
    handle = None
    try:
        for tensor in stage_model.graph.initializer:
            if tensor.data_type == onnx.TensorProto.STRING or \
                    tensor.data_location == onnx.TensorProto.EXTERNAL or \
                    tensor_bytes_estimate(tensor) < MIN_MAPPED_TENSOR_BYTES:
                continue
            # raw_data is little-endian by the ONNX spec; typed fields go through numpy,
            # whose bytes are the platform's (little-endian everywhere ORT runs).
            raw = tensor.raw_data if tensor.HasField("raw_data") else \
                numpy_helper.to_array(tensor).tobytes()
            if handle is None:
                handle = open(data_path, "wb")
            alignment = LARGE_TENSOR_ALIGNMENT_BYTES if len(raw) >= LARGE_TENSOR_BYTES \
                else SMALL_TENSOR_ALIGNMENT_BYTES
            offset = -(-offset // alignment) * alignment
            handle.seek(offset)  # padding is a hole: no disk space, read as zeros
            handle.write(raw)
            _point_to_external(tensor, data_path.name, offset, len(raw))
            offset += len(raw)
            mapped_bytes += len(raw)
        if handle is not None:
            handle.flush()
            os.fsync(handle.fileno())
    finally:
        if handle is not None:
            handle.close()
    return mapped_bytes


def _point_to_external(tensor: onnx.TensorProto, location: str, offset: int,
                       length: int) -> None:
    for field_name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                       "uint64_data"):
        tensor.ClearField(field_name)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _write_external(stage_model: onnx.ModelProto, path: Path) -> str:
    """Copy mode over protobuf's limit: onnx's own external-data writer; the sha256."""
    onnx.save_model(stage_model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=f"{path.name}.data",
                    size_threshold=1024)
    # onnx writes no data file when every tensor is under size_threshold.
    for written in (path, path.with_name(f"{path.name}.data")):
        if written.exists():
            with open(written, "rb+") as handle:
                os.fsync(handle.fileno())
    return sha256_file(path)
