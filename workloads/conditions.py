"""Context-aware conditions: safe predicates on upstream outputs, and user callables.

Owns what a job graph's `when:` entries mean at run time, as pure functions on
numpy arrays (no eval, no I/O, no clocks):

- predicates on one named output tensor of an upstream network: `max_above`,
  `any_above`, `count_above` (threshold + minimum count), `argmax_in` (class ids);
- `probability`: a seeded Bernoulli draw per (job, upstream network), the
  paper's fixed "label probability". The draw is keyed by the *upstream*
  network, so every downstream of the same upstream with the same p sees the
  same label (a face was found, or not), and the simulator and the real
  executor draw the same labels for the same seed;
- `call: "package.module:func"`: a user predicate receiving the upstream
  outputs ``{network: {tensor_name: array}}`` and returning a bool;
- user callables named either way or by a Python file, "rules.py:func"
  (`resolve_callable`, `callable_reference`): a file path is relative to the
  workload file, so an example directory can carry its own code. Input
  transforms (workloads.inputs) name their callables the same way.

The `Condition` dataclass and the predicate kinds are in workloads.model.
Upstream outputs everywhere are ``Mapping[network, Mapping[tensor, ndarray]]``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workloads.model import CONDITION_STREAM, Condition, UpstreamOutputs

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
    key = [seed, CONDITION_STREAM, job_id, zlib.crc32(upstream.encode())]
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

