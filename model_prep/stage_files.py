"""Stage files: build each stage's ONNX model from its planned layout, and write it.

This module owns every byte of a stage file. `build_stage_model` fills one
ModelProto per `StageLayout` (model_prep.planner): the stage's nodes, the
constant-making nodes and initializers it reads, typed inputs, outputs and
intermediate tensors, and the model's IR version, opsets and functions (with
IR < 4 its initializers are also listed as graph inputs, as that IR requires).
`write_stage_file` is the one place a stage file is written: fsynced, with the
weights as external data (`<file>.data` beside it) once they reach
`DEFAULT_EXTERNAL_DATA_BYTES`. `write_stages` does both for every stage and
returns the manifest's `Stage` records.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import onnx

from model_prep.manifest import Stage, sha256_file
from model_prep.planner import StageLayout
from model_prep.shapes import tensor_bytes_estimate, tensor_spec

# Protobuf refuses messages of 2 GiB and more; keep a margin for the graph itself.
# The other whole-model files the preparator writes for ONNX Runtime (the
# optimiser's input, verify's reshaped copy) use the same cap.
DEFAULT_EXTERNAL_DATA_BYTES = 1_800_000_000

SplitProgress = Callable[[int, int, str], None]  # (stages written, total, stage id)


def write_stages(
    model: onnx.ModelProto,
    layouts: Sequence[StageLayout],
    types: Mapping[str, onnx.TypeProto],
    output_types: Mapping[str, onnx.TypeProto],
    out_dir: Path,
    external_data_bytes: int = DEFAULT_EXTERNAL_DATA_BYTES,
    progress: SplitProgress | None = None,
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
        sha256 = write_stage_file(stage_model, out_dir / file, external_data_bytes)
        del stage_model
        stages.append(stage_record(layout, file, sha256, types, output_types))
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
    layout: StageLayout, file: str, sha256: str, types: Mapping[str, onnx.TypeProto],
    output_types: Mapping[str, onnx.TypeProto],
) -> Stage:
    """The manifest's entry for a written stage file."""
    return Stage(
        stage_id=layout.stage_id, file=file, sha256=sha256, op_types=layout.op_types,
        layer_type=layout.layer_type,
        inputs=tuple(tensor_spec(n, types.get(n)) for n in layout.inputs),
        outputs=tuple(tensor_spec(n, output_types.get(n)) for n in layout.outputs),
        producers=layout.producers, weight_bytes=layout.weight_bytes, note=layout.note,
    )


def write_stage_file(stage_model: onnx.ModelProto, path: Path, external_data_bytes: int) -> str:
    """Write one stage file (fsynced: the directory rename must not outrun it); its sha256.

    With external data the model's tensors are emptied (onnx moves them out),
    so `stage_model` is of no use afterwards.
    """
    weights = sum(tensor_bytes_estimate(t) for t in stage_model.graph.initializer)
    if weights >= external_data_bytes:
        onnx.save_model(stage_model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=f"{path.name}.data",
                        size_threshold=1024)
        # onnx writes no data file when every tensor is under size_threshold.
        for written in (path, path.with_name(f"{path.name}.data")):
            if written.exists():
                with open(written, "rb+") as handle:
                    os.fsync(handle.fileno())
        return sha256_file(path)
    data = stage_model.SerializeToString()
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return hashlib.sha256(data).hexdigest()
