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
- `call: "plugin:func"`: a user predicate receiving the upstream outputs
  ``{network: {tensor_name: array}}`` and returning a bool;
- plugins: a workload only *names* functions; code comes in only from whoever
  runs the command (`masa --plugin FILE.py|MODULE ...`, or `load_plugin` from
  Python). A workload naming anything else (a file path, "os:system") is
  refused when it is loaded, before anything runs. Input transforms
  (workloads.inputs) name their callables the same way.

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
from types import ModuleType
from typing import Any

import numpy as np

from workloads.model import CONDITION_STREAM, Condition, UpstreamOutputs

# ------------------------------------------------------------ user callables


CALLABLE_FORMS = "'plugin:function' (a function of a plugin loaded with --plugin)"
# Prefix of the sys.modules names of plugin files, so they never shadow a real module.
_FILE_MODULE_PREFIX = "_masa_plugin_"
# Plugin name -> module: the only code a workload can name. Filled by load_plugin.
_PLUGINS: dict[str, ModuleType] = {}


def _split_callable(spec: str) -> tuple[str, str]:
    target, sep, attribute = spec.partition(":")
    if not sep or not target or not attribute:
        raise ValueError(f"expected {CALLABLE_FORMS}, got {spec!r}")
    return target, attribute


def load_plugin(spec: str) -> str:
    """Import the operator's code: a module name, or a Python file ("rules.py",
    registered by its stem). Returns the plugin's name; ValueError says what is wrong."""
    if spec.endswith(".py"):
        path = Path(spec).expanduser().resolve()
        name, module = path.stem, _load_file_module(path)
    else:
        try:
            module = importlib.import_module(spec)
        except ImportError as error:
            raise ValueError(f"cannot import module {spec!r}: {error}") from None
        name = spec
    registered = _PLUGINS.get(name)
    if registered is not None and registered is not module:
        raise ValueError(f"two plugins are named {name!r} ({registered.__name__} and "
                         f"{spec}): rename one")
    _PLUGINS[name] = module
    return name


def _load_file_module(path: Path) -> ModuleType:
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
    except Exception as error:  # any failure in the plugin's code is a bad --plugin
        del sys.modules[name]
        first_line = (str(error).strip().splitlines() or [""])[0]
        raise ValueError(f"cannot import {str(path)!r}: {type(error).__name__}: "
                         f"{first_line}") from None
    return module


def resolve_callable(spec: str) -> Callable[..., Any]:
    """The function "plugin:func" (func may be dotted) of a loaded plugin.

    Never imports or runs anything: a plugin that was not loaded is an error.
    Raises ValueError saying what is wrong.
    """
    plugin, attribute = _split_callable(spec)
    module = _PLUGINS.get(plugin)
    if module is None:
        loaded = ", ".join(sorted(_PLUGINS)) or "none"
        raise ValueError(f"no plugin {plugin!r} is loaded (loaded: {loaded}); a workload "
                         "names functions, it never loads code: load it with "
                         "`masa --plugin FILE.py|MODULE ...`")
    found: Any = module
    for part in attribute.split("."):
        if part.startswith("_") or not hasattr(found, part):
            raise ValueError(f"plugin {plugin!r} has no function {attribute!r}")
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

