"""Context-aware conditions and input transforms: safe predicates on upstream outputs.

Owns what a job graph's `when:` and `input:` entries mean at run time, as pure
functions on numpy arrays (no eval, no I/O, no clocks):

- predicates on one named output tensor of an upstream network: `max_above`,
  `any_above`, `count_above` (threshold + minimum count), `argmax_in` (class ids);
- `probability`: a seeded Bernoulli draw per (job, upstream network), the
  paper's fixed "label probability". The draw is keyed by the *upstream*
  network, so every downstream of the same upstream with the same p sees the
  same label (a face was found, or not), and the simulator and the real
  executor draw the same labels for the same seed;
- `call: "package.module:func"`: a user predicate receiving the upstream
  outputs ``{network: {tensor_name: array}}`` and returning a bool;
- input transforms for a downstream network: built-in `crop_best_box` (crop
  the job input to the best-scoring detector box, resize to the downstream's
  input shape) or `call: "package.module:func"`;
- user callables named either way or by a Python file, "rules.py:func"
  (`resolve_callable`, `callable_reference`): a file path is relative to the
  workload file, so an example directory can carry its own code;
- `fit_to_input` / `random_input`: turning an image or random data into a
  tensor of a network's input shape.

Upstream outputs everywhere are ``Mapping[network, Mapping[tensor, ndarray]]``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_prep.manifest import TensorSpec

PREDICATE_KINDS = ("max_above", "any_above", "count_above", "argmax_in", "probability", "call")
TENSOR_PREDICATE_KINDS = ("max_above", "any_above", "count_above", "argmax_in")
TRANSFORM_KINDS = ("crop_best_box", "call")
BOX_COORDS = ("pixels", "normalized")
# Random stand-in for a dynamic non-batch dimension (an image side) when the
# workload asks for random input of a model whose input shape is dynamic.
RANDOM_DYNAMIC_SIZE = 224
# Stream tags so condition draws and random inputs never share random numbers.
_CONDITION_STREAM = 1
_INPUT_STREAM = 2

UpstreamOutputs = Mapping[str, Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class Condition:
    """One `when:` predicate. A network runs when all of its conditions hold."""

    kind: str  # one of PREDICATE_KINDS
    network: str  # the upstream network it reads (or whose label is drawn)
    output: str | None = None  # tensor name; None: the upstream's only output
    threshold: float | None = None
    min_count: int = 1  # count_above
    class_ids: tuple[int, ...] = ()  # argmax_in
    column: int | None = None  # read only this index of the last axis (a score column)
    probability: float | None = None
    call: str | None = None  # "package.module:func" or "/absolute/file.py:func"


@dataclass(frozen=True)
class Transform:
    """A downstream network's `input:` derivation from the job input and upstream outputs."""

    kind: str  # one of TRANSFORM_KINDS
    network: str | None = None  # upstream whose outputs hold the boxes
    boxes: str | None = None  # tensor [..., N, 4] (x1, y1, x2, y2), or [..., N, >=5] with score
    scores: str | None = None  # tensor [..., N]; None: column 4 of `boxes`
    coords: str = "pixels"  # pixels of the job input, or normalized to [0, 1]
    margin: float = 0.0  # grow the box by this fraction of its size on every side
    call: str | None = None  # "package.module:func" or "/absolute/file.py:func"


# ------------------------------------------------------------ user callables


CALLABLE_FORMS = "'package.module:function' or 'file.py:function'"
# Prefix of the sys.modules names of user files, so they never shadow a real module.
_FILE_MODULE_PREFIX = "_masa_user_file_"


def _split_callable(spec: str) -> tuple[str, str]:
    # rpartition: a file path may contain ':', a function name never does.
    target, sep, attribute = spec.rpartition(":")
    if not sep or not target or not attribute:
        raise ValueError(f"expected {CALLABLE_FORMS}, got {spec!r}")
    return target, attribute


def _is_file_target(target: str) -> bool:
    return target.endswith(".py")


def callable_reference(spec: str, base_dir: Path | None = None) -> str:
    """The spec with a relative "file.py" made absolute against base_dir.

    Workload loaders store this form in Condition.call / Transform.call, so
    the callable resolves the same at run time whatever the working directory.
    "package.module:func" is returned unchanged. Raises ValueError if malformed.
    """
    target, attribute = _split_callable(spec)
    if not _is_file_target(target):
        return spec
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = (base_dir if base_dir is not None else Path.cwd()) / path
    return f"{path.resolve()}:{attribute}"


def _load_file_module(path: Path) -> Any:
    """Import a Python file once per process, under a name unique to its path."""
    if not path.is_file():
        raise ValueError(f"no Python file {str(path)!r}")
    name = f"{_FILE_MODULE_PREFIX}{path.stem}_{zlib.crc32(str(path).encode()):08x}"
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before running it, as the import system does: dataclasses and
    # pickling look their module up in sys.modules while it executes.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # any failure in user code is a bad workload entry
        del sys.modules[name]
        first_line = (str(error).strip().splitlines() or [""])[0]
        raise ValueError(f"cannot import {str(path)!r}: {type(error).__name__}: "
                         f"{first_line}") from None
    return module


def resolve_callable(spec: str, base_dir: Path | None = None) -> Callable[..., Any]:
    """Import "package.module:func" or load "path/to/file.py:func".

    A file path ends in ".py"; a relative one is taken from base_dir (the
    workload file's directory; default the working directory). The file is
    executed once per process and cached. Raises ValueError saying what is wrong.
    """
    target, attribute = _split_callable(spec)
    if _is_file_target(target):
        path = Path(callable_reference(spec, base_dir).rpartition(":")[0])
        module = _load_file_module(path)
        where = f"file {str(path)!r}"
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise ValueError(f"cannot import module {target!r}: {error}") from None
        where = f"module {target!r}"
    found: Any = module
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ValueError(f"{where} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ValueError(f"{spec!r} is not callable")
    return found


# ---------------------------------------------------------------- predicates


def max_above(values: np.ndarray, threshold: float) -> bool:
    """The largest value exceeds the threshold (a classifier's top score)."""
    return bool(values.size) and bool(np.max(values) > threshold)


def any_above(values: np.ndarray, threshold: float) -> bool:
    """Some value exceeds the threshold (some detection is confident).

    Equivalent to max_above; kept under its own name because it reads as the
    question asked of detection scores.
    """
    return bool(np.any(values > threshold))


def count_above(values: np.ndarray, threshold: float, min_count: int) -> bool:
    """At least min_count values exceed the threshold (e.g. two or more people)."""
    return int(np.count_nonzero(values > threshold)) >= min_count


def argmax_in(values: np.ndarray, class_ids: Sequence[int]) -> bool:
    """The top class (argmax over the last axis) of any row is one of class_ids."""
    if values.size == 0:
        return False
    rows = values.reshape(-1, values.shape[-1]) if values.ndim else values.reshape(1, 1)
    return bool(np.isin(np.argmax(rows, axis=-1), np.asarray(class_ids)).any())


def condition_draw(seed: int, job_id: int, upstream: str) -> float:
    """The uniform [0, 1) label draw of (job, upstream network) for `probability:`."""
    key = [seed, _CONDITION_STREAM, job_id, zlib.crc32(upstream.encode())]
    return float(np.random.default_rng(key).random())


def select_tensor(condition: Condition, upstream_outputs: UpstreamOutputs) -> np.ndarray:
    """The tensor a tensor predicate reads. Raises KeyError if it is missing."""
    outputs = upstream_outputs.get(condition.network)
    if outputs is None:
        raise KeyError(f"no outputs of upstream network {condition.network!r}")
    if condition.output is None:
        if len(outputs) != 1:
            raise KeyError(f"network {condition.network!r} has outputs "
                           f"{', '.join(outputs)}: name one with 'output'")
        values = np.asarray(next(iter(outputs.values())))
    elif condition.output not in outputs:
        raise KeyError(f"network {condition.network!r} has no output {condition.output!r}")
    else:
        values = np.asarray(outputs[condition.output])
    if condition.column is not None:
        values = values[..., condition.column]
    return values


def evaluate_condition(
    condition: Condition, upstream_outputs: UpstreamOutputs, seed: int, job_id: int
) -> bool:
    """Whether one predicate holds for this job."""
    if condition.kind == "probability":
        assert condition.probability is not None
        return condition_draw(seed, job_id, condition.network) < condition.probability
    if condition.kind == "call":
        assert condition.call is not None
        plain = {net: dict(tensors) for net, tensors in upstream_outputs.items()}
        return bool(resolve_callable(condition.call)(plain))
    values = select_tensor(condition, upstream_outputs)
    if condition.kind == "argmax_in":
        return argmax_in(values, condition.class_ids)
    assert condition.threshold is not None
    if condition.kind == "max_above":
        return max_above(values, condition.threshold)
    if condition.kind == "any_above":
        return any_above(values, condition.threshold)
    if condition.kind == "count_above":
        return count_above(values, condition.threshold, condition.min_count)
    raise ValueError(f"unknown predicate {condition.kind!r}")


def conditions_hold(
    conditions: Sequence[Condition], upstream_outputs: UpstreamOutputs, seed: int, job_id: int
) -> bool:
    """All predicates hold (an empty list always does)."""
    return all(evaluate_condition(c, upstream_outputs, seed, job_id) for c in conditions)


# ---------------------------------------------------------- input tensors


def input_rng(seed: int, job_id: int, network: str) -> np.random.Generator:
    """The generator for a network's random input in one job (same in every executor)."""
    return np.random.default_rng([seed, _INPUT_STREAM, job_id, zlib.crc32(network.encode())])


def concrete_shape(tensor: TensorSpec, dynamic_size: int = RANDOM_DYNAMIC_SIZE
                   ) -> tuple[int, ...]:
    """The tensor's shape with dynamic dims filled: batch (axis 0) 1, others dynamic_size."""
    return tuple(
        dim if isinstance(dim, int) and dim > 0 else (1 if axis == 0 else dynamic_size)
        for axis, dim in enumerate(tensor.shape)
    )


def random_input(tensor: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """Random data of the tensor's shape: floats uniform in [0, 1), integers 0..9, bools."""
    shape = concrete_shape(tensor)
    dtype = np.dtype(tensor.dtype)
    if dtype.kind == "f":
        return rng.random(shape, dtype=np.float64).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 10, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    raise ValueError(f"cannot make random input of dtype {tensor.dtype}")


def _as_hwc(image: np.ndarray) -> np.ndarray:
    """An image array as height x width x channels (accepts HW, HWC, CHW, NHWC, NCHW)."""
    array = np.asarray(image)
    if array.ndim == 4:
        array = array[0]
    if array.ndim == 2:
        return array[:, :, None]
    if array.ndim != 3:
        raise ValueError(f"expected an image (2 to 4 dimensions), got shape {array.shape}")
    if array.shape[-1] in (1, 3, 4):
        return array
    if array.shape[0] in (1, 3, 4):
        return np.transpose(array, (1, 2, 0))
    raise ValueError(f"cannot tell the channel axis of an image of shape {array.shape}")


def resize_bilinear(image_hwc: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize (pixel centres aligned, as OpenCV's INTER_LINEAR), float32."""
    source = np.asarray(image_hwc, dtype=np.float32)
    in_height, in_width = source.shape[:2]
    if (in_height, in_width) == (height, width):
        return source
    ys = np.clip((np.arange(height) + 0.5) * in_height / height - 0.5, 0, in_height - 1)
    xs = np.clip((np.arange(width) + 0.5) * in_width / width - 0.5, 0, in_width - 1)
    y0 = np.floor(ys).astype(int)
    x0 = np.floor(xs).astype(int)
    y1 = np.minimum(y0 + 1, in_height - 1)
    x1 = np.minimum(x0 + 1, in_width - 1)
    wy = (ys - y0)[:, None, None]
    wx = (xs - x0)[None, :, None]
    top = source[y0][:, x0] * (1 - wx) + source[y0][:, x1] * wx
    bottom = source[y1][:, x0] * (1 - wx) + source[y1][:, x1] * wx
    return (top * (1 - wy) + bottom * wy).astype(np.float32)


def _image_layout(shape: tuple[int | str, ...]) -> str:
    """'nchw' or 'nhwc' for a 4-D image input, from where its channel count sits."""
    if len(shape) != 4:
        raise ValueError(f"expected a 4-D image input (NCHW or NHWC), got shape {shape}")
    if isinstance(shape[1], int) and shape[1] in (1, 3):
        return "nchw"
    if isinstance(shape[3], int) and shape[3] in (1, 3):
        return "nhwc"
    raise ValueError(f"cannot tell the channel axis of input shape {shape}")


def fit_to_input(array: np.ndarray, tensor: TensorSpec) -> np.ndarray:
    """An array or image made into a tensor of this input's shape and dtype.

    An array already of the input's (concrete) shape is only cast. Otherwise it
    is read as an image, its channels adapted (RGBA -> RGB, RGB -> grey by mean,
    grey -> RGB by repetition), resized bilinearly to the input's height and
    width (dynamic sides keep the image's size) and laid out as NCHW or NHWC.
    Pixel values are not rescaled: normalisation is model-specific (use a
    `call:` transform for it).
    """
    dtype = np.dtype(tensor.dtype)
    source = np.asarray(array)
    shape = tensor.shape
    if all(isinstance(d, int) for d in shape) and source.shape == tuple(shape):
        return source.astype(dtype, copy=False)
    layout = _image_layout(shape)
    image = _as_hwc(source)
    channels = int(shape[1] if layout == "nchw" else shape[3])
    if image.shape[2] == 4:
        image = image[:, :, :3]
    if image.shape[2] != channels:
        image = (image.mean(axis=2, keepdims=True) if channels == 1
                 else np.repeat(image[:, :, :1], channels, axis=2))
    height_dim, width_dim = (shape[2], shape[3]) if layout == "nchw" else (shape[1], shape[2])
    height = height_dim if isinstance(height_dim, int) else image.shape[0]
    width = width_dim if isinstance(width_dim, int) else image.shape[1]
    resized = resize_bilinear(image, height, width)
    batched = resized[None]
    if layout == "nchw":
        batched = np.transpose(batched, (0, 3, 1, 2))
    return np.ascontiguousarray(batched).astype(dtype, copy=False)


# --------------------------------------------------------------- transforms


def best_box(boxes: np.ndarray, scores: np.ndarray | None) -> tuple[np.ndarray, float] | None:
    """The highest-scoring box (x1, y1, x2, y2) and its score, or None without boxes."""
    rows = np.asarray(boxes, dtype=np.float64)
    if scores is None:
        rows = rows.reshape(-1, rows.shape[-1]) if rows.size else rows.reshape(0, 5)
        if rows.shape[-1] < 5:
            raise ValueError(f"boxes without scores need >= 5 columns, got shape {boxes.shape}")
        box_rows, score_values = rows[:, :4], rows[:, 4]
    else:
        box_rows = rows.reshape(-1, 4)
        score_values = np.asarray(scores, dtype=np.float64).reshape(-1)
        if len(score_values) != len(box_rows):
            raise ValueError(f"{len(box_rows)} boxes but {len(score_values)} scores")
    if len(box_rows) == 0:
        return None
    best = int(np.argmax(score_values))
    return box_rows[best], float(score_values[best])


def crop_best_box(
    image: np.ndarray,
    boxes: np.ndarray,
    scores: np.ndarray | None,
    tensor: TensorSpec,
    coords: str = "pixels",
    margin: float = 0.0,
) -> np.ndarray:
    """Crop the image to the best box (grown by margin), fitted to the input tensor.

    Without any box, or with an empty one after clipping, the whole image is
    used: the downstream still gets a valid input.
    """
    hwc = _as_hwc(image)
    height, width = hwc.shape[:2]
    found = best_box(boxes, scores)
    crop = hwc
    if found is not None:
        x1, y1, x2, y2 = found[0]
        if coords == "normalized":
            x1, x2, y1, y2 = x1 * width, x2 * width, y1 * height, y2 * height
        grow_x, grow_y = margin * (x2 - x1), margin * (y2 - y1)
        left = int(np.clip(np.floor(x1 - grow_x), 0, width))
        right = int(np.clip(np.ceil(x2 + grow_x), 0, width))
        top = int(np.clip(np.floor(y1 - grow_y), 0, height))
        bottom = int(np.clip(np.ceil(y2 + grow_y), 0, height))
        if right > left and bottom > top:
            crop = hwc[top:bottom, left:right]
    return fit_to_input(crop, tensor)


def apply_transform(
    transform: Transform,
    job_input: np.ndarray,
    upstream_outputs: UpstreamOutputs,
    tensor: TensorSpec,
) -> np.ndarray:
    """The downstream network's input tensor derived by `transform`."""
    if transform.kind == "call":
        assert transform.call is not None
        plain = {net: dict(tensors) for net, tensors in upstream_outputs.items()}
        return np.asarray(resolve_callable(transform.call)(job_input, plain, tensor))
    if transform.kind == "crop_best_box":
        assert transform.network is not None and transform.boxes is not None
        outputs = upstream_outputs[transform.network]
        scores = outputs[transform.scores] if transform.scores is not None else None
        return crop_best_box(job_input, outputs[transform.boxes], scores, tensor,
                             transform.coords, transform.margin)
    raise ValueError(f"unknown transform {transform.kind!r}")
