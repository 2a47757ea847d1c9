"""Input tensors of a network in a job: the job input file, random data, transforms.

Owns what a network is fed at run time (docs/workload-format.md, `input:`):

- the job input file, read once at load time (`load_input_file`: a .npy array,
  or an image as height x width x channels uint8);
- `random_input`: seeded random data of a tensor's shape, one generator per
  (seed, job, network) (`input_rng`), so every executor feeds the same data;
- `fit_to_input`: an image or array made into a tensor of a network's input
  shape (channels, bilinear resize, NCHW or NHWC);
- input transforms of a downstream network: built-in `crop_best_box` (crop the
  job input to the best-scoring detector box, resized to the downstream's
  input) or a user callable (`call`, resolved as in workloads.conditions);
- `network_inputs`: all of the above put together for one network of one job.

Pure numpy apart from reading the input file; no clocks, no global RNG.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

# Imported at module level: PIL.Image adds about 7 ms to a run's import time
# (python -X importtime, numpy already loaded), too little to defer.
from PIL import Image

from model_prep.manifest import NetworkManifest, TensorSpec
from workloads.conditions import resolve_callable
from workloads.model import INPUT_STREAM, NetworkNode, Transform, UpstreamOutputs, Workload

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff")
# Random stand-in for a dynamic non-batch dimension (an image side) when the
# workload asks for random input of a model whose input shape is dynamic.
RANDOM_DYNAMIC_SIZE = 224


# ---------------------------------------------------------- the job input


def load_input_file(path: Path) -> np.ndarray:
    """A .npy array, or an image as height x width x channels uint8. Raises ValueError."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except (ValueError, OSError) as error:
            raise ValueError(f"cannot read {path} as a .npy array: {error}") from None
    if suffix in IMAGE_SUFFIXES:
        try:
            with Image.open(path) as image:
                mode = "L" if image.mode in ("1", "L", "I;16") else "RGB"
                return np.asarray(image.convert(mode))
        except OSError as error:
            raise ValueError(f"cannot read {path} as an image: {error}") from None
    raise ValueError(f"input file {path}: expected a .npy file or an image "
                     f"({', '.join(IMAGE_SUFFIXES)})")


# ---------------------------------------------------------- input tensors


def input_rng(seed: int, job_id: int, network: str) -> np.random.Generator:
    """The generator for a network's random input in one job (same in every executor)."""
    return np.random.default_rng([seed, INPUT_STREAM, job_id, zlib.crc32(network.encode())])


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
    if dtype in (np.float32, np.float64):  # drawn at their width: no cast
        return rng.random(shape, dtype=dtype)
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


def image_layout(shape: tuple[int | str, ...]) -> str:
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
    layout = image_layout(shape)
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


# ------------------------------------------------------------ at run time


def network_inputs(workload: Workload, manifest: NetworkManifest, job_id: int,
                   upstream_outputs: UpstreamOutputs | None = None) -> dict[str, np.ndarray]:
    """The input tensors of one network in one job, by input name.

    With a transform: derived from the job input (or, with `input: random`,
    random data of this network's input shape) and the upstream outputs.
    Otherwise the job input file fitted to the first input, or random data;
    further inputs of a multi-input network are always random.
    """
    node = workload.node(manifest.name)
    rng = input_rng(workload.seed, job_id, manifest.name)
    inputs: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(manifest.inputs):
        if index == 0:
            inputs[tensor.name] = network_input(workload, node, tensor, rng, upstream_outputs)
        else:
            inputs[tensor.name] = random_input(tensor, rng)
    return inputs


def network_input(workload: Workload, node: NetworkNode, tensor: TensorSpec,
                  rng: np.random.Generator,
                  upstream_outputs: UpstreamOutputs | None = None) -> np.ndarray:
    """The first input tensor of `node` in one job (see network_inputs)."""
    job_input = workload.input.array
    if node.transform is not None:
        if job_input is None:
            job_input = random_input(tensor, rng)
        return apply_transform(node.transform, job_input, upstream_outputs or {}, tensor)
    if job_input is not None:
        return fit_to_input(job_input, tensor)
    return random_input(tensor, rng)
