"""A network's input tensors: read them from .npy/.npz, check them, or make seeded random ones.

Light on purpose: `masa infer` and the runtime use `load_feeds` and
`bind_feeds`, and the run path on a device must not import onnx (the protobuf
library), so this module imports NumPy and the manifest only.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from masa.common.errors import UserError
from model_prep.manifest import NetworkManifest, TensorSpec


def load_feeds(path: str | Path) -> dict[str, np.ndarray]:
    """Inputs from X.npz (one array per input name) or X.npy (the only input: key '',
    which `bind_feeds` binds to the network's single input). Bad file: UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such input file (expected .npy or .npz)")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a NumPy .npy/.npz file: {exc}") from None
    if isinstance(loaded, np.ndarray):
        return {"": loaded}
    with loaded:
        return {key: loaded[key] for key in loaded.files}


def bind_feeds(manifest: NetworkManifest, feeds: Mapping[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
    """Check user-given inputs against the network's; key '' means "the only input"."""
    expected = {spec.name: spec for spec in manifest.inputs}
    bound = dict(feeds)
    if "" in bound:
        if len(expected) != 1:
            raise UserError(f"network {manifest.name!r} has {len(expected)} inputs: expected an "
                            f".npz with arrays named {', '.join(expected)}")
        bound[next(iter(expected))] = bound.pop("")
    unknown = sorted(set(bound) - set(expected))
    missing = sorted(set(expected) - set(bound))
    if unknown or missing:
        raise UserError(f"network {manifest.name!r}: expected inputs {', '.join(expected)}, "
                        f"got {', '.join(sorted(bound)) or 'none'}")
    for name, value in bound.items():
        spec = expected[name]
        if value.dtype != numpy_dtype(spec):
            raise UserError(f"input {name!r}: expected dtype {spec.dtype}, got {value.dtype}")
        fixed = [(d, s) for d, s in zip(spec.shape, value.shape, strict=False)
                 if isinstance(d, int)]
        unknown_rank = spec.shape[:1] == ("*",)
        if not unknown_rank and (len(spec.shape) != value.ndim or any(d != s for d, s in fixed)):
            shape_text = "x".join(str(d) for d in spec.shape)
            raise UserError(f"input {name!r}: expected shape {shape_text}, got "
                            f"{'x'.join(str(s) for s in value.shape)}")
    return bound


def random_feeds(
    inputs: tuple[TensorSpec, ...], rng: np.random.Generator, dim_value: int = 1,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """Seeded random inputs for a network; dynamic dims take `dim_value`, or every
    dim comes from `shapes` for the inputs it names."""
    feeds: dict[str, np.ndarray] = {}
    for spec in inputs:
        if shapes is not None and spec.name in shapes:
            shape = tuple(shapes[spec.name])
        elif spec.shape and spec.shape[0] == "*":
            raise UserError(f"input {spec.name!r} has an unknown rank: fix its shape with "
                            "--input-shape")
        else:
            shape = tuple(d if isinstance(d, int) and d > 0 else dim_value for d in spec.shape)
        dtype = numpy_dtype(spec)
        if dtype.kind == "f":
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            feeds[spec.name] = rng.integers(0, 8, size=shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[spec.name] = np.asarray(rng.random(shape) < 0.5)
        else:
            raise UserError(f"input {spec.name!r}: cannot make random data of type {spec.dtype}")
    return feeds


def numpy_dtype(spec: TensorSpec) -> np.dtype:
    """The NumPy dtype of a tensor spec; UserError for ONNX types NumPy lacks."""
    try:
        return np.dtype(spec.dtype)
    except TypeError:
        raise UserError(f"input {spec.name!r}: type {spec.dtype} has no NumPy equivalent"
                        ) from None
