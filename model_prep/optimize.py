"""ORT-optimised splitting (`masa prepare --ort-optimize`): optimise once, type, then cut.

This module owns turning a model into the graph ONNX Runtime would run for it,
with every tensor typed, so that the splitter can cut *that* graph. Why: at
ORT_ENABLE_ALL on x86 the whole model keeps its activations in the blocked
NCHWc layout from the first convolution to the last, while a stage cut from
the model as given converts its input into NCHWc and its output back in every
stage file. On GoogleNet (58 stages) those reorders are about half of what the
stage chain costs over the whole model. Cutting the optimised graph instead
lets the blocked tensors cross the cuts, so stages run what the whole model
runs (same fused operators, same layout).

`optimize_for_split`:
1. applies what the splitter assumes of the model (`--input-shape`; weights an
   IR >= 4 model also lists as graph inputs are weights, not inputs) to a copy;
2. lets ONNX Runtime optimise it once, with `model_prep.session.session_options`
   (so at the graph level every stage session later runs at) and
   `optimized_model_filepath`, in a scratch directory;
3. types every tensor of the result: onnx shape inference first; ONNX
   Runtime's contrib operators (com.microsoft.nchwc Conv, ReorderInput, ...)
   have no onnx schema, so what inference leaves untyped is typed by one probe
   run on zeros that exposes those tensors as outputs. A probe run fixes every
   dim, so a runtime input with a dynamic dim is refused then (pass
   `--input-shape`): the probe could not say which dims of the blocked
   tensors follow it.

The optimised model lives in the scratch directory only (the caller's
temporary directory); the store only ever receives the stage files.
"""

from __future__ import annotations

import platform
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from masa.common.errors import UserError, one_line
from model_prep.manifest import OrtOptimization
from model_prep.session import session_options
from model_prep.shapes import apply_input_shapes, infer_types
from model_prep.stage_files import DEFAULT_EXTERNAL_DATA_BYTES


def current_optimization() -> OrtOptimization:
    """What `optimize_for_split` records: this onnxruntime, this machine, masa's level."""
    level = session_options().graph_optimization_level
    return OrtOptimization(onnxruntime=ort.__version__, machine=platform.machine(),
                           graph_level=level.name)


def optimize_for_split(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int | str]],
    source: str,
    runtime_inputs: Sequence[str],
    scratch_dir: str | Path | None = None,
    model_path: str | Path | None = None,
) -> onnx.ModelProto:
    """ONNX Runtime's optimised version of `model` (modified in place), every tensor typed.

    `model` is the model as `model_prep.split.load_model` read it (external data
    loaded) from `model_path`, which ONNX Runtime then reads directly unless
    the model had to change; `input_shapes` fixes input dims as `--input-shape`
    does. The
    result carries a value_info for every node output and its inputs keep
    their names, so the stages it splits into read and write what the
    original model's session is fed and returns.
    """
    graph = model.graph
    apply_input_shapes(graph, input_shapes, source, runtime_inputs)
    changed = bool(input_shapes)
    if model.ir_version >= 4 and len(graph.input) > len(runtime_inputs):
        # The splitter treats initializers listed as graph inputs as weights;
        # left as inputs, ONNX Runtime would neither fold nor fuse them.
        runtime = [i for i in graph.input if i.name in runtime_inputs]
        del graph.input[:]
        graph.input.extend(runtime)
        changed = True
    with tempfile.TemporaryDirectory(prefix="masa-ort-optimize-", dir=scratch_dir) as temp:
        temp_dir = Path(temp)
        optimized_path = temp_dir / "optimized.onnx"
        if changed or model_path is None:
            given_path = temp_dir / "given.onnx"
            _save(model, given_path)
        else:
            given_path = Path(model_path)  # writing a copy of 377 MB took 3 s
        options = session_options()
        options.optimized_model_filepath = str(optimized_path)
        # Weights in a data file beside the graph: the probe's copy of the
        # graph then refers to them instead of rewriting them (and no 2 GiB cap).
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "optimized.onnx.data")
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        try:
            session = ort.InferenceSession(str(given_path), sess_options=options,
                                           providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
            raise UserError(f"{source}: --ort-optimize: ONNX Runtime cannot load the model: "
                            f"{one_line(exc)}") from None
        del session
        del model, graph
        optimized = onnx.load(str(optimized_path))  # with its external data, if any
        types, _ = infer_types(optimized, {}, source, runtime_inputs)
        untyped = [name for node in optimized.graph.node for name in node.output
                   if name and not _fully_typed(types.get(name))]
        if untyped:
            _check_static_inputs(optimized.graph, runtime_inputs, source, untyped[0])
            probed = _probe_types(optimized_path, untyped, source)
            types.update(probed)
    _drop_folded_inputs(optimized.graph, runtime_inputs)
    produced = {name for node in optimized.graph.node for name in node.output if name}
    graph_outputs = {o.name for o in optimized.graph.output}
    del optimized.graph.value_info[:]
    for name in sorted(produced - graph_outputs):
        if name in types:
            optimized.graph.value_info.append(
                helper.make_value_info(name, types[name]))
    return optimized


def _drop_folded_inputs(graph: onnx.GraphProto, runtime_inputs: Sequence[str]) -> None:
    """Forget graph inputs that are neither the model's runtime inputs nor initializers.

    An IR 3 model lists its initializers as inputs; ONNX Runtime's saved graph
    keeps listing those whose initializer it folded away (the onnx wheel's light
    models: every ConstantOfShape's shape), and the splitter would take them
    for runtime inputs the network must be fed."""
    initializers = {tensor.name for tensor in graph.initializer}
    kept = [value for value in graph.input
            if value.name in runtime_inputs or value.name in initializers]
    if len(kept) < len(graph.input):
        del graph.input[:]
        graph.input.extend(kept)


def _save(model: onnx.ModelProto, path: Path) -> None:
    """Write `model` for ONNX Runtime, large weights as external data (which empties
    the in-memory tensors: `model` is of no use afterwards then)."""
    weight_bytes = sum(t.ByteSize() for t in model.graph.initializer)
    onnx.save_model(model, str(path),
                    save_as_external_data=weight_bytes >= DEFAULT_EXTERNAL_DATA_BYTES,
                    all_tensors_to_one_file=True, location=f"{path.name}.data",
                    size_threshold=1024)


def _fully_typed(value_type: onnx.TypeProto | None) -> bool:
    """A tensor whose element type and rank are known (dims may be symbols)."""
    if value_type is None or value_type.WhichOneof("value") != "tensor_type":
        return value_type is not None and value_type.WhichOneof("value") is not None
    tensor_type = value_type.tensor_type
    return tensor_type.elem_type != 0 and tensor_type.HasField("shape")


def _check_static_inputs(graph: onnx.GraphProto, runtime_inputs: Sequence[str], source: str,
                         example: str) -> None:
    for value in graph.input:
        if value.name not in runtime_inputs:
            continue
        tensor_type = value.type.tensor_type
        dims = list(tensor_type.shape.dim) if tensor_type.HasField("shape") else None
        if dims is None or any(not d.HasField("dim_value") for d in dims):
            if dims is None:
                shape, suggestion = "unknown rank", "<dims such as 1x3x224x224>"
            else:
                shape = "x".join(str(d.dim_value) if d.HasField("dim_value")
                                 else (d.dim_param or "?") for d in dims)
                # Dynamic dims as 1: a batch of one is what the executors run.
                suggestion = "x".join(str(d.dim_value) if d.HasField("dim_value") else "1"
                                      for d in dims)
            raise UserError(
                f"{source}: --ort-optimize: input {value.name!r} has dynamic dims ({shape}) "
                f"and ONNX Runtime's optimised graph has tensors only a probe run can type "
                f"(e.g. {example!r}): expected fixed dims, pass --input-shape "
                f"{value.name}={suggestion} (or the dims you will run)")


def _probe_types(optimized_path: Path, names: list[str], source: str
                 ) -> dict[str, onnx.TypeProto]:
    """Type `names` from one run on zeros that exposes them as graph outputs."""
    # A copy of the saved graph beside it, without the weights: both refer to
    # the same external data file.
    probe = onnx.load(str(optimized_path), load_external_data=False)
    graph = probe.graph
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in names)
    path = optimized_path.with_name("probe.onnx")
    onnx.save_model(probe, str(path))
    options = session_options()
    # Run the graph exactly as saved: re-optimising could fuse a probed tensor away.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    declared = {i.name: i.type.tensor_type for i in graph.input}
    try:
        session = ort.InferenceSession(str(path), sess_options=options,
                                       providers=["CPUExecutionProvider"])
        feeds = {value.name: np.zeros(
                     [d.dim_value for d in declared[value.name].shape.dim],
                     dtype=helper.tensor_dtype_to_np_dtype(declared[value.name].elem_type))
                 for value in session.get_inputs()}
        outputs = session.run(names, feeds)
        del session  # its copy of the weights goes now, not at the caller's return
    except Exception as exc:  # noqa: BLE001 - ORT raises its own exception types
        raise UserError(f"{source}: --ort-optimize: the probe run that types ONNX Runtime's "
                        f"optimised graph failed: {one_line(exc)}") from None
    types: dict[str, onnx.TypeProto] = {}
    for name, value in zip(names, outputs, strict=True):
        if isinstance(value, np.ndarray):
            types[name] = helper.make_tensor_type_proto(
                helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
    return types
