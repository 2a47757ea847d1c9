"""Request bodies into arrays, and arrays into each network's input tensors.

Owns what a client may send and how it reaches the networks:

- `decode_body`: a JPEG/PNG photo (Pillow, as height x width x 3 uint8 RGB or
  grey), a `.npy` array, a `.npz` of named arrays, or JSON
  ``{"inputs": {NAME: nested list | {"data": ..., "dtype": ..., "shape": ...}}}``;
  the kind is sniffed from the body's first bytes (the Content-Type only
  decides for JSON). Every size is checked before the data is decoded (image
  pixels from the header, .npz members from the archive's directory), so a
  small compressed body cannot expand past the limits. Raises `BadInput`
  (400) or `TooLarge` (413) with a one-line reason.
- `network_feeds`: one network's input tensors in one job: a named array
  (NAME is the input's name, or NETWORK.INPUT), else the job's image or
  array through the graph's `input:` transform, the network's `preprocess:`
  (`preprocess_image`), or workloads.inputs.fit_to_input.
- `encode_npz`: a job's output tensors as a `.npz` archive (what
  `GET /v1/jobs/{id}/outputs.npz` returns and the journal keeps).

Nothing here names a file: bodies are bytes in memory.
"""

from __future__ import annotations

import io
import json
import math
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from PIL import Image

from masa.serve.config import GraphSpec, Preprocess
from model_prep.manifest import NetworkManifest, TensorSpec
from workloads.inputs import apply_transform, fit_to_input, image_layout
from workloads.model import UpstreamOutputs

INPUT_KINDS = ("image", "npy", "npz", "json")
_NPY_MAGIC = b"\x93NUMPY"
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")
# Names a single job image or array may have among named inputs.
MAIN_INPUT_NAMES = ("image", "input")


class BadInput(ValueError):
    """The body cannot be decoded (400)."""


class TooLarge(ValueError):
    """The body decodes past a size limit (413)."""


@dataclass(frozen=True)
class Limits:
    max_image_pixels: int
    max_decoded_bytes: int


@dataclass(frozen=True)
class JobInput:
    """A job's decoded input: named arrays (one, unnamed, for a photo or a .npy)."""

    kind: str  # one of INPUT_KINDS
    arrays: Mapping[str, np.ndarray]

    def main(self) -> np.ndarray:
        """The job's image or array, for transforms and networks fed the job input."""
        if len(self.arrays) == 1:
            return next(iter(self.arrays.values()))
        for name in MAIN_INPUT_NAMES:
            if name in self.arrays:
                return self.arrays[name]
        raise ValueError(f"several named inputs ({', '.join(sorted(self.arrays))}) and none "
                         f"named {' or '.join(MAIN_INPUT_NAMES)} for the job's image")


def sniff_kind(body: bytes, content_type: str) -> str:
    if body.startswith(_NPY_MAGIC):
        return "npy"
    if body.startswith(b"PK\x03\x04") or body.startswith(b"PK\x05\x06"):
        return "npz"
    if any(body.startswith(magic) for magic in _IMAGE_MAGIC):
        return "image"
    media_type = content_type.split(";")[0].strip().lower()
    if media_type == "application/json" or body.lstrip()[:1] == b"{":
        return "json"
    raise BadInput("expected a JPEG or PNG image, a .npy or .npz file, or JSON "
                   f"{{\"inputs\": ...}} (Content-Type {content_type or 'none'})")


def decode_body(body: bytes, content_type: str, limits: Limits) -> JobInput:
    """The body as a JobInput; BadInput or TooLarge with a one-line reason."""
    if not body:
        raise BadInput("empty body: send an image, a .npy or .npz file, or JSON")
    kind = sniff_kind(body, content_type)
    if kind == "image":
        return JobInput(kind, {"image": _decode_image(body, limits)})
    if kind == "npy":
        return JobInput(kind, {"input": _decode_npy(body, limits, "body")})
    if kind == "npz":
        return JobInput(kind, _decode_npz(body, limits))
    return JobInput(kind, _decode_json(body, limits))


def _decode_image(body: bytes, limits: Limits) -> np.ndarray:
    try:
        with Image.open(io.BytesIO(body)) as image:
            width, height = image.size  # from the header: nothing decoded yet
            if width * height > limits.max_image_pixels:
                raise TooLarge(f"image of {width}x{height} = {width * height} pixels, more "
                               f"than the limit of {limits.max_image_pixels}")
            mode = "L" if image.mode in ("1", "L", "I;16") else "RGB"
            return np.asarray(image.convert(mode))
    except (OSError, Image.DecompressionBombError, ValueError) as error:
        if isinstance(error, TooLarge):
            raise
        raise BadInput(f"cannot decode the image: {error}") from None


def _check_array_header(shape: tuple[int, ...], dtype: np.dtype, limits: Limits, what: str
                        ) -> int:
    size_bytes = math.prod(shape) * dtype.itemsize
    if size_bytes > limits.max_decoded_bytes:
        raise TooLarge(f"{what}: array of shape {shape} ({size_bytes} bytes), more than the "
                       f"limit of {limits.max_decoded_bytes} bytes")
    return size_bytes


# The header numpy writes for a plain array; anything else goes through numpy's parser.
_NPY_PLAIN_HEADER = re.compile(
    rb"\{'descr': '([<>|=]?[a-zA-Z]\d+)', 'fortran_order': (True|False), "
    rb"'shape': \(((?:\d+, )*\d*,?)\), \} *\n")


def _npy_header(data: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Shape, Fortran order, dtype and the data's offset of a .npy file.

    numpy's own parser (ast.literal_eval) costs ~60 us a call; numpy's plain
    header is matched directly."""
    if data[6:8] == b"\x01\x00" and len(data) >= 10:
        length = int.from_bytes(data[8:10], "little")
        match = _NPY_PLAIN_HEADER.fullmatch(data, 10, 10 + length)
        if match is not None:
            shape = tuple(int(side) for side in match[3].split(b",") if side.strip())
            return shape, match[2] == b"True", np.dtype(match[1].decode()), 10 + length
    stream = io.BytesIO(data)
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(stream)
    else:
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(stream)
    return shape, fortran_order, dtype, stream.tell()


def _decode_npy(data: bytes, limits: Limits, what: str) -> np.ndarray:
    """A .npy file's array, a read-only view of `data`: no copy of the body (copying
    600 KB into pages the allocator had just returned made the daemon's decoding
    step 0.56-0.71 ms at p50; without the copy, 0.40 ms)."""
    try:
        shape, fortran_order, dtype, offset = _npy_header(data)
        if dtype.hasobject:
            raise BadInput(f"{what}: object arrays are not accepted")
        _check_array_header(shape, dtype, limits, what)
        count = math.prod(shape)
        flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
        return flat.reshape(shape, order="F" if fortran_order else "C")
    except (ValueError, OSError, EOFError) as error:
        if isinstance(error, BadInput | TooLarge):
            raise
        raise BadInput(f"{what}: cannot read a .npy array: {error}") from None


_ZIP_DOS_DATE = 0x21  # 1980-01-01: outputs carry no file time
_ZIP_LOCAL = struct.Struct("<IHHHHHIIIHH")
_ZIP_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_ZIP_END = struct.Struct("<IHHHHIIH")
_ZIP32_LIMIT = 2**31  # beyond it, np.savez (zip64)


def encode_npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The arrays as an uncompressed .npz (what np.savez writes, read by np.load).

    Written here rather than by np.savez, whose zipfile machinery takes 160 us for a
    two-network result (measured in a loop; this writer: about 45 us), on the path
    to the client seeing its result."""
    members = []
    for name, value in arrays.items():
        stream = io.BytesIO()
        np.lib.format.write_array(stream, np.asarray(value), allow_pickle=False)
        members.append(((name + ".npy").encode(), stream.getvalue()))
    if sum(len(data) for _, data in members) >= _ZIP32_LIMIT:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        return buffer.getvalue()
    parts: list[bytes] = []
    central: list[bytes] = []
    offset = 0
    for name, data in members:
        crc = zlib.crc32(data)
        local = _ZIP_LOCAL.pack(0x04034B50, 20, 0, 0, 0, _ZIP_DOS_DATE, crc, len(data),
                                len(data), len(name), 0) + name
        central.append(_ZIP_CENTRAL.pack(0x02014B50, 20, 20, 0, 0, 0, _ZIP_DOS_DATE, crc,
                                         len(data), len(data), len(name), 0, 0, 0, 0, 0,
                                         offset) + name)
        parts += [local, data]
        offset += len(local) + len(data)
    directory = b"".join(central)
    end = _ZIP_END.pack(0x06054B50, 0, 0, len(members), len(members), len(directory),
                        offset, 0)
    return b"".join(parts) + directory + end


def _decode_npz(body: bytes, limits: Limits) -> dict[str, np.ndarray]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(body))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as error:
        raise BadInput(f"cannot read the .npz archive: {error}") from None
    total_bytes = sum(member.file_size for member in members)
    if total_bytes > limits.max_decoded_bytes:
        raise TooLarge(f".npz expands to {total_bytes} bytes, more than the limit of "
                       f"{limits.max_decoded_bytes}")
    arrays = {}
    for member in members:
        name = member.filename.removesuffix(".npy")
        with archive.open(member) as stream:
            # ZipExtFile cannot seek back cheaply on every Python: read the member
            # (its declared size is checked above, and reading stops there).
            data = stream.read(member.file_size + 1)
        arrays[name] = _decode_npy(data, limits, f".npz member {name!r}")
    if not arrays:
        raise BadInput("the .npz archive holds no arrays")
    return arrays


def _decode_json(body: bytes, limits: Limits) -> dict[str, np.ndarray]:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadInput(f"not valid JSON: {error}") from None
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, dict) or not inputs:
        raise BadInput('expected JSON {"inputs": {NAME: [...] or {"data": [...], '
                       '"dtype": "float32", "shape": [...]}}}')
    arrays = {}
    total_bytes = 0
    for name, value in inputs.items():
        spec = value if isinstance(value, dict) else {"data": value}
        try:
            dtype = np.dtype(spec.get("dtype", "float32"))
            if dtype.kind not in "biuf":
                raise TypeError(f"dtype {dtype} is not numeric")
            array = np.asarray(spec.get("data"), dtype=dtype)
            if "shape" in spec:
                array = array.reshape(tuple(int(d) for d in spec["shape"]))
        except (TypeError, ValueError) as error:
            raise BadInput(f"input {name!r}: {error}") from None
        total_bytes += _check_array_header(array.shape, array.dtype, limits, f"input {name!r}")
        if total_bytes > limits.max_decoded_bytes:
            raise TooLarge(f"inputs of {total_bytes} bytes, more than the limit of "
                           f"{limits.max_decoded_bytes}")
        arrays[str(name)] = array
    return arrays


# ------------------------------------------------------------------ preprocessing


def _target_size(spec: Preprocess, tensor: TensorSpec, layout: str, image: Image.Image
                 ) -> tuple[int, int]:
    """(width, height) to resize the photo to."""
    if isinstance(spec.resize, int):  # the shorter side to N, keeping the aspect
        width, height = image.size
        factor = spec.resize / min(width, height)
        return max(1, round(width * factor)), max(1, round(height * factor))
    if spec.resize is not None:
        return spec.resize[1], spec.resize[0]
    if spec.crop is not None:
        return spec.crop[1], spec.crop[0]
    shape = tensor.shape
    height, width = (shape[2], shape[3]) if layout == "nchw" else (shape[1], shape[2])
    return (width if isinstance(width, int) else image.size[0],
            height if isinstance(height, int) else image.size[1])


def preprocess_image(array: np.ndarray, spec: Preprocess, tensor: TensorSpec) -> np.ndarray:
    """A photo (height x width x channels) as the network's input tensor (batch 1)."""
    layout = spec.layout or image_layout(tensor.shape)
    source = np.asarray(array)
    if source.ndim == 3 and source.shape[2] == 1:
        source = source[:, :, 0]
    if source.dtype != np.uint8 or source.ndim not in (2, 3):
        raise ValueError(f"preprocess expects a photo (height x width x 3 uint8), got "
                         f"{source.dtype} of shape {source.shape}")
    image = Image.fromarray(source)
    image = image.convert("L" if spec.channels == "gray" else "RGB")
    size = _target_size(spec, tensor, layout, image)
    if image.size != size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    if spec.crop is not None:
        crop_height, crop_width = spec.crop
        width, height = image.size
        left, top = max(0, (width - crop_width) // 2), max(0, (height - crop_height) // 2)
        image = image.crop((left, top, left + crop_width, top + crop_height))
    pixels = np.asarray(image, dtype=np.float32)
    pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
    if spec.channels == "bgr":
        pixels = pixels[:, :, ::-1]
    pixels = pixels * np.float32(spec.scale)
    if spec.mean:
        pixels = pixels - np.asarray(spec.mean, dtype=np.float32)
    if spec.std:
        pixels = pixels / np.asarray(spec.std, dtype=np.float32)
    batch = pixels[None]
    if layout == "nchw":
        batch = np.transpose(batch, (0, 3, 1, 2))
    dtype = np.dtype(spec.dtype or tensor.dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        batch = np.clip(np.rint(batch), info.min, info.max)
    return np.ascontiguousarray(batch.astype(dtype))


def network_feeds(graph: GraphSpec, manifest: NetworkManifest, job_input: JobInput,
                  upstream_outputs: UpstreamOutputs) -> dict[str, np.ndarray]:
    """One network's input tensors in one job, by input name (see the module docstring)."""
    node = graph.workload.node(manifest.name)
    feeds: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(manifest.inputs):
        named = job_input.arrays.get(f"{manifest.name}.{tensor.name}",
                                     job_input.arrays.get(tensor.name))
        if named is not None:
            feeds[tensor.name] = fit_to_input(named, tensor)
        elif index > 0:
            raise ValueError(f"no array for input {tensor.name!r} of network "
                             f"{manifest.name!r}: name it {tensor.name!r}")
        elif node.transform is not None:
            feeds[tensor.name] = np.asarray(apply_transform(
                node.transform, job_input.main(), upstream_outputs, tensor))
        elif manifest.name in graph.preprocess:
            feeds[tensor.name] = preprocess_image(job_input.main(),
                                                  graph.preprocess[manifest.name], tensor)
        else:
            feeds[tensor.name] = fit_to_input(job_input.main(), tensor)
    return feeds
