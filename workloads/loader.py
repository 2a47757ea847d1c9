"""Reading and validating a workload file into a `Workload`, every problem at once.

Owns the checks of docs/workload-format.md: `load_workload` parses the YAML
(refusing duplicate keys), checks every section with one
`masa.common.errors.ErrorCollector`, so every problem is reported together,
each with its path (``lifelog.yaml: at 'graph.facenet.after': unknown network
'facenet2'``), and raises one `ValidationError` (a UserError: exit code 2 in
the CLI). With a store it also checks network and output names against the
manifests and resolves an `intensity:` into an arrival rate.

The objects it builds are workloads.model; what is derived from them (jobs,
run-time decisions, scenarios) is workloads.generation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from masa.common.errors import ErrorCollector, UserError
from masa.common.graphs import find_cycle, topological_order
from masa.common.yamlsafe import bounded_loader
from model_prep.manifest import MANIFEST_NAME, NetworkManifest, load_manifest
from workloads.arrivals import ARRIVAL_KINDS, Arrival, Composition
from workloads.conditions import CALLABLE_FORMS, resolve_callable
from workloads.generation import apply_intensity
from workloads.inputs import load_input_file
from workloads.model import (
    BOX_COORDS,
    PREDICATE_KINDS,
    TENSOR_PREDICATE_KINDS,
    WORKLOAD_FORMAT,
    Condition,
    InputSpec,
    NetworkNode,
    Transform,
    Workload,
)

_RATE_FIELDS = {"periodic": "interval_ms", "normal": "mean_ms", "poisson": "rate_per_s"}
_ARRIVAL_FIELDS = {
    "periodic": {"interval_ms"},
    "normal": {"mean_ms", "std_ms", "cv"},
    "poisson": {"rate_per_s"},
    "trace": {"times_ms"},
}
_TOP_FIELDS = {"format", "name", "description", "graph", "input", "arrivals", "composition",
               "intensity"}
# Size limits (docs/workload-format.md): beyond them a file is a mistake, and acting
# on it would exhaust the device (10**9 arrivals are 7.5 GiB of times before --jobs).
MAX_ARRIVALS = 1_000_000
MAX_NETWORKS = 256
MAX_TIME_MS = 1e9  # about 11.6 days: any time or gap in the file
MIN_RATE_PER_S, MAX_RATE_PER_S = 1e-6, 1e6
MAX_INTENSITY = 1e6


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys.

    PyYAML keeps the last of two equal keys silently; in a job graph that would
    drop a network (two `agenet:` entries) without a word.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_LOADER = bounded_loader(_StrictLoader)  # and no integer too long to print


def load_workload(path: str | Path, store_dir: Path | None = None) -> Workload:
    """Load and validate a workload file; raise UserError listing every problem.

    With store_dir, network names and output tensor names are checked against
    the store's manifests, and an `intensity:` sets the arrival rate.
    """
    source = Path(path)
    if not source.is_file():
        raise UserError(f"{source}: no such workload file")
    try:
        raw = yaml.load(source.read_text(), Loader=_LOADER)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(str(exc.problem or exc.context or "").split())
        raise UserError(f"{source}: {where}not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    except UnicodeDecodeError:
        raise UserError(f"{source}: not a text file") from None
    except RecursionError:
        raise UserError(f"{source}: not valid YAML: nested too deeply") from None
    except OSError as exc:
        raise UserError(f"{source}: cannot read the workload: {exc.strerror or exc}") from None
    errors = ErrorCollector(str(source))
    if not isinstance(raw, dict):
        errors.add("", f"expected a mapping at the top level, got {type(raw).__name__}")
        errors.raise_if_any()
    _unknown_keys(errors, raw, _TOP_FIELDS, "")
    fmt = errors.get(raw, "format", int, "", required=False, default=WORKLOAD_FORMAT)
    if fmt is not None and fmt != WORKLOAD_FORMAT:
        errors.add("format", f"expected {WORKLOAD_FORMAT}, got {fmt}")
    name = errors.get(raw, "name", str, "", required=False, default=source.stem)
    description = errors.get(raw, "description", str, "", required=False, default="")

    nodes = parse_graph(errors, raw.get("graph"))
    manifests = store_manifests(errors, store_dir, nodes) if store_dir is not None else {}
    if manifests:
        check_outputs(errors, nodes, manifests)
    ordered = network_order(errors, nodes)
    input_spec = _parse_input(errors, raw.get("input", "random"), source.parent)
    intensity = _parse_intensity(errors, raw)
    arrivals = _parse_arrivals(errors, raw.get("arrivals"), intensity is not None)
    composition = _parse_composition(errors, raw.get("composition", "all"), len(nodes), nodes)
    errors.raise_if_any()

    workload = Workload(
        name=name, source=source, nodes=ordered, input=input_spec, arrivals=arrivals,
        composition=composition, intensity=intensity, description=description,
    )
    if intensity is not None and len(manifests) == len(ordered):
        workload = apply_intensity(workload, manifests)
    return workload


def _unknown_keys(errors: ErrorCollector, raw: Mapping[str, Any], known: set[str],
                  path: str) -> None:
    for key in raw:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            errors.add(where, f"unknown field, expected one of {', '.join(sorted(known))}")


def _string_list(errors: ErrorCollector, value: Any, path: str) -> tuple[str, ...]:
    """A string or a list of strings."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    errors.add(path, f"expected a network name or a list of names, got {value!r}")
    return ()


def parse_graph(errors: ErrorCollector, raw: Any) -> list[NetworkNode]:
    """The job graph's nodes in file order."""
    if raw is None:
        errors.add("graph", "missing field, expected a mapping of network names")
        return []
    if isinstance(raw, list):  # a plain list of independent networks
        if not all(isinstance(item, str) for item in raw):
            errors.add("graph", f"expected a list of network names, got {raw!r}")
            return []
        raw = dict.fromkeys(raw)
    if not isinstance(raw, dict) or not raw:
        errors.add("graph", f"expected a non-empty mapping of network names, got {raw!r}")
        return []
    if len(raw) > MAX_NETWORKS:
        errors.add("graph", f"expected at most {MAX_NETWORKS} networks, got {len(raw)}")
        return []
    names = [str(name) for name in raw]
    nodes = []
    for name, entry in raw.items():
        path = f"graph.{name}"
        entry = {} if entry is None else entry
        if not isinstance(entry, dict):
            errors.add(path, f"expected a mapping (after, when, input) or nothing, got {entry!r}")
            continue
        _unknown_keys(errors, entry, {"after", "when", "input"}, path)
        after = _string_list(errors, entry.get("after", []), f"{path}.after")
        for upstream in after:
            if upstream not in names:
                errors.add(f"{path}.after", f"unknown network {upstream!r}")
        if len(set(after)) != len(after):
            errors.add(f"{path}.after", "lists a network twice")
        known_after = tuple(u for u in after if u in names)
        when: list[Condition] = []
        raw_when = entry.get("when")
        if raw_when is not None:
            if not known_after and after == ():
                errors.add(f"{path}.when", "a condition needs 'after:' upstream networks")
            is_list = isinstance(raw_when, list)
            items = raw_when if is_list else [raw_when]
            for index, item in enumerate(items):
                item_path = f"{path}.when[{index}]" if is_list else f"{path}.when"
                condition = _parse_condition(errors, item, item_path, known_after)
                if condition is not None:
                    when.append(condition)
        transform = None
        if entry.get("input") is not None:
            transform = _parse_transform(errors, entry["input"], f"{path}.input", known_after)
        nodes.append(NetworkNode(name=str(name), after=known_after, when=tuple(when),
                                 transform=transform))
    return nodes


def _upstream_for(errors: ErrorCollector, raw: Mapping[str, Any], path: str,
                  after: tuple[str, ...]) -> str | None:
    """The `network:` a predicate or transform reads: named, or the only upstream."""
    if "network" in raw:
        network = raw["network"]
        if not isinstance(network, str) or network not in after:
            errors.add(f"{path}.network", f"expected one of the upstream networks "
                       f"({', '.join(after) or 'none'}), got {network!r}")
            return None
        return network
    if len(after) == 1:
        return after[0]
    if after:
        errors.add(path, f"several upstreams ({', '.join(after)}): say which with 'network:'")
    return None


def _number(errors: ErrorCollector, value: Any, path: str, *, low: float | None = None,
            high: float | None = None, positive: bool = False,
            limit: float | None = None) -> float | None:
    """A finite number within [low, high] (positive: > 0); `limit` is a size limit
    (MAX_TIME_MS...), reported on its own."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        errors.add(path, f"expected a number, got {value!r}")
        return None
    if isinstance(value, int) and abs(value) > 10**300:  # float() would overflow
        errors.add(path, "expected a number of a sensible size, got an integer of "
                   f"{len(str(abs(value)))} digits")
        return None
    if not math.isfinite(value):
        errors.add(path, f"expected a finite number, got {value!r}")
        return None
    if positive and value <= 0:
        errors.add(path, f"expected a positive number, got {value}")
        return None
    if (low is not None and value < low) or (high is not None and value > high):
        expected = (f"a number >= {low:g}" if high is None else
                    f"a number <= {high:g}" if low is None else f"a number in [{low:g}, {high:g}]")
        errors.add(path, f"expected {expected}, got {value}")
        return None
    if limit is not None and value > limit:
        errors.add(path, f"expected at most {limit:g}, got {value}")
        return None
    return float(value)


def _parse_callable(errors: ErrorCollector, value: Any, path: str) -> str | None:
    """A `call:` / transform callable: a function of a loaded plugin (nothing is imported)."""
    if not isinstance(value, str):
        errors.add(path, f"expected {CALLABLE_FORMS}, got {value!r}")
        return None
    try:
        resolve_callable(value)
    except ValueError as error:
        errors.add(path, str(error))
        return None
    return value


def _parse_condition(errors: ErrorCollector, raw: Any, path: str,
                     after: tuple[str, ...]) -> Condition | None:
    if not isinstance(raw, dict):
        errors.add(path, f"expected a predicate mapping such as {{max_above: 0.5}}, got {raw!r}")
        return None
    _unknown_keys(errors, raw, set(PREDICATE_KINDS) | {"network", "output", "column"}, path)
    kinds = [key for key in raw if key in PREDICATE_KINDS]
    if len(kinds) != 1:
        errors.add(path, f"expected exactly one predicate of {', '.join(PREDICATE_KINDS)}, "
                   f"got {', '.join(kinds) or 'none'}")
        return None
    kind = kinds[0]
    value = raw[kind]
    key_path = f"{path}.{kind}"
    before = len(errors.problems)
    network = _upstream_for(errors, raw, path, after)
    output = errors.get(raw, "output", str, path, required=False)
    column = errors.get(raw, "column", int, path, required=False)
    if kind not in TENSOR_PREDICATE_KINDS:
        for key in ("output", "column"):
            if key in raw:
                errors.add(f"{path}.{key}", f"not used by '{kind}'")
    fields: dict[str, Any] = {}
    if kind in ("max_above", "any_above"):
        fields["threshold"] = _number(errors, value, key_path)
    elif kind == "count_above":
        if not isinstance(value, dict):
            errors.add(key_path, f"expected {{threshold: T, min_count: N}}, got {value!r}")
        else:
            _unknown_keys(errors, value, {"threshold", "min_count"}, key_path)
            fields["threshold"] = _number(errors, value.get("threshold"), f"{key_path}.threshold")
            min_count = errors.get(value, "min_count", int, key_path)
            if min_count is not None and min_count < 1:
                errors.add(f"{key_path}.min_count", f"expected an integer >= 1, got {min_count}")
            fields["min_count"] = min_count
    elif kind == "argmax_in":
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                              for i in ids):
            errors.add(key_path, f"expected a list of class ids (integers >= 0), got {value!r}")
        else:
            fields["class_ids"] = tuple(ids)
    elif kind == "probability":
        fields["probability"] = _number(errors, value, key_path, low=0.0, high=1.0)
    elif kind == "call":
        fields["call"] = _parse_callable(errors, value, key_path)
    if len(errors.problems) > before or network is None:
        return None
    return Condition(kind=kind, network=network, output=output, column=column, **fields)


def _parse_transform(errors: ErrorCollector, raw: Any, path: str,
                     after: tuple[str, ...]) -> Transform | None:
    if not isinstance(raw, dict) or "transform" not in raw:
        errors.add(path, f"expected {{transform: crop_best_box | 'plugin:function', ...}}, "
                   f"got {raw!r}")
        return None
    name = raw["transform"]
    before = len(errors.problems)
    if isinstance(name, str) and ":" in name:
        _unknown_keys(errors, raw, {"transform"}, path)
        call = _parse_callable(errors, name, f"{path}.transform")
        if call is None or len(errors.problems) > before:
            return None
        return Transform(kind="call", call=call)
    if name != "crop_best_box":
        errors.add(f"{path}.transform", f"expected crop_best_box or {CALLABLE_FORMS}, "
                   f"got {name!r}")
        return None
    _unknown_keys(errors, raw, {"transform", "network", "boxes", "scores", "coords", "margin"},
                  path)
    if not after:
        errors.add(path, "crop_best_box needs an upstream detector in 'after:'")
    network = _upstream_for(errors, raw, path, after)
    boxes = errors.get(raw, "boxes", str, path)
    scores = errors.get(raw, "scores", str, path, required=False)
    coords = errors.get(raw, "coords", str, path, required=False, default="pixels")
    if coords is not None and coords not in BOX_COORDS:
        errors.add(f"{path}.coords", f"expected one of {', '.join(BOX_COORDS)}, got {coords!r}")
    margin = 0.0
    if "margin" in raw:
        margin = _number(errors, raw["margin"], f"{path}.margin", low=0.0, high=10.0) or 0.0
    if len(errors.problems) > before or network is None:
        return None
    return Transform(kind="crop_best_box", network=network, boxes=boxes, scores=scores,
                     coords=coords, margin=margin)


def network_order(errors: ErrorCollector, nodes: list[NetworkNode]
                  ) -> tuple[NetworkNode, ...]:
    """Nodes with upstreams first, otherwise in file order; a cycle is reported."""
    by_name = {node.name: node for node in nodes}
    names = list(by_name)
    # An upstream whose own entry was invalid (reported already) is not a node here.
    edges = [(up, node.name) for node in nodes for up in node.after if up in by_name]
    order = topological_order(names, edges)
    if order is not None:
        return tuple(by_name[name] for name in order)
    # Walk upstream edges from names in sorted order, each node's upstreams sorted
    # too, so the cycle reported (and where) depends only on the graph, never on
    # the file's order. find_cycle's path runs downstream -> upstream: reversed,
    # it reads as the data flows.
    cycle = find_cycle(sorted(names), sorted((after, up) for up, after in edges))
    cycle.reverse()
    errors.add(f"graph.{cycle[0]}.after", f"cycle in the job graph: {' -> '.join(cycle)}")
    return tuple(nodes)


def store_manifests(errors: ErrorCollector, store_dir: Path,
                    nodes: list[NetworkNode]) -> dict[str, NetworkManifest]:
    """Each node's manifest from the store; an unknown or unreadable network is an error."""
    store = Path(store_dir)
    if not store.is_dir():
        errors.add("", f"store {store} is not a directory")
        return {}
    available = sorted(p.parent.name for p in store.glob(f"*/{MANIFEST_NAME}"))
    manifests = {}
    for node in nodes:
        if node.name not in available:
            errors.add(f"graph.{node.name}", f"unknown network {node.name!r} (store {store} "
                       f"has: {', '.join(available) or 'nothing'})")
            continue
        try:
            # File checksums are checked when stages are loaded, not here: the
            # loader only needs names, outputs and costs, and hashing is slow.
            manifests[node.name] = load_manifest(store / node.name, check_files=False)
        except UserError as error:
            errors.add(f"graph.{node.name}", f"cannot read its manifest: {error}")
    return manifests


def check_outputs(errors: ErrorCollector, nodes: list[NetworkNode],
                  manifests: Mapping[str, NetworkManifest]) -> None:
    """The output names conditions and transforms read exist; a transformed network has one
    input."""
    for node in nodes:
        path = f"graph.{node.name}"
        for index, condition in enumerate(node.when):
            manifest = manifests.get(condition.network)
            if manifest is None or condition.kind not in TENSOR_PREDICATE_KINDS:
                continue
            where = f"{path}.when" if len(node.when) == 1 else f"{path}.when[{index}]"
            _check_output_name(errors, manifest, condition.output, f"{where}.output")
        transform = node.transform
        if transform is not None and transform.kind == "crop_best_box":
            manifest = manifests.get(transform.network or "")
            if manifest is not None:
                for key in ("boxes", "scores"):
                    name = getattr(transform, key)
                    if name is not None:
                        _check_output_name(errors, manifest, name, f"{path}.input.{key}")
        if node.transform is not None and node.name in manifests:
            if len(manifests[node.name].inputs) != 1:
                errors.add(f"{path}.input", f"a transform needs a network with one input, "
                           f"{node.name!r} has {len(manifests[node.name].inputs)}")


def _check_output_name(errors: ErrorCollector, manifest: NetworkManifest, name: str | None,
                       path: str) -> None:
    outputs = [tensor.name for tensor in manifest.outputs]
    if name is None:
        if len(outputs) != 1:
            errors.add(path, f"network {manifest.name!r} has outputs {', '.join(outputs)}: "
                       "name one with 'output:'")
    elif name not in outputs:
        errors.add(path, f"unknown output {name!r} of network {manifest.name!r} "
                   f"(it has: {', '.join(outputs)})")


def _parse_input(errors: ErrorCollector, raw: Any, base_dir: Path) -> InputSpec:
    if raw == "random" or raw is None:
        return InputSpec(kind="random")
    if isinstance(raw, dict):
        _unknown_keys(errors, raw, {"file"}, "input")
        raw = errors.get(raw, "file", str, "input")
        if raw is None:
            return InputSpec(kind="random")
    if not isinstance(raw, str):
        errors.add("input", f"expected 'random' or a file path, got {raw!r}")
        return InputSpec(kind="random")
    path = Path(raw) if Path(raw).is_absolute() else base_dir / raw
    if not path.is_file():
        errors.add("input", f"input file {path} does not exist")
        return InputSpec(kind="file", path=path)
    try:
        array = load_input_file(path)
    except ValueError as error:
        errors.add("input", str(error))
        return InputSpec(kind="file", path=path)
    return InputSpec(kind="file", path=path, array=array)


def _parse_intensity(errors: ErrorCollector, raw: Mapping[str, Any]) -> float | None:
    if "intensity" not in raw:
        return None
    value = _number(errors, raw["intensity"], "intensity", positive=True)
    if value is not None and value > MAX_INTENSITY:
        errors.add("intensity", f"expected a number <= {MAX_INTENSITY:g}, got {value}")
        return None
    return value


def _ms_to_us(value: float) -> int:
    return round(value * 1000)


def _parse_arrivals(errors: ErrorCollector, raw: Any, has_intensity: bool) -> Arrival:
    """The `arrivals:` section; a placeholder Arrival after a problem (it is never used)."""
    fallback = Arrival(kind="periodic", count=1, interval_us=1)
    if not isinstance(raw, dict):
        errors.add("arrivals", f"{'missing field, ' if raw is None else ''}expected a mapping "
                   f"with kind ({', '.join(ARRIVAL_KINDS)}), count and seed")
        return fallback
    kind = errors.get(raw, "kind", str, "arrivals")
    if kind is None:
        return fallback
    if kind not in ARRIVAL_KINDS:
        errors.add("arrivals.kind", f"expected one of {', '.join(ARRIVAL_KINDS)}, got {kind!r}")
        return fallback
    _unknown_keys(errors, raw, {"kind", "count", "seed", "start_ms"} | _ARRIVAL_FIELDS[kind],
                  "arrivals")
    count = errors.get(raw, "count", int, "arrivals", required=kind != "trace")
    if count is not None and count < 1:
        errors.add("arrivals.count", f"expected an integer >= 1, got {count}")
    elif count is not None and count > MAX_ARRIVALS:
        errors.add("arrivals.count", f"expected at most {MAX_ARRIVALS} jobs, got {count} "
                   "(run the first N with --jobs, or split the workload)")
        count = None
    seed = errors.get(raw, "seed", int, "arrivals", required=False, default=0)
    if seed is not None and seed < 0:
        errors.add("arrivals.seed", f"expected an integer >= 0, got {seed}")
    start_ms = raw.get("start_ms", 0)
    start = (_number(errors, start_ms, "arrivals.start_ms", low=0.0, limit=MAX_TIME_MS)
             if "start_ms" in raw else 0.0)
    rate_field = _RATE_FIELDS.get(kind)
    if has_intensity:
        if kind == "trace":
            errors.add("intensity", "cannot set the rate of trace arrivals (their times are fixed)")
        elif rate_field in raw:
            errors.add(f"arrivals.{rate_field}", "set either 'intensity' or this, not both")
    elif rate_field is not None and rate_field not in raw:
        errors.add(f"arrivals.{rate_field}", "missing field, expected a positive number "
                   "(or set 'intensity')")
    values, count = _arrival_values(errors, raw, kind, count)
    if (count is None or not 1 <= count <= MAX_ARRIVALS or seed is None or seed < 0
            or start is None):
        return fallback
    return Arrival(kind=kind, count=count, seed=seed, start_us=_ms_to_us(start), **values)


def _arrival_values(errors: ErrorCollector, raw: Mapping[str, Any], kind: str,
                    count: int | None) -> tuple[dict[str, Any], int | None]:
    """The Arrival fields of one kind, in microseconds, and the count (a trace may set it)."""
    values: dict[str, Any] = {}
    if kind == "periodic" and "interval_ms" in raw:
        interval = _number(errors, raw["interval_ms"], "arrivals.interval_ms", positive=True,
                           limit=MAX_TIME_MS)
        values["interval_us"] = max(1, _ms_to_us(interval)) if interval is not None else None
    elif kind == "normal":
        if "mean_ms" in raw:
            mean = _number(errors, raw["mean_ms"], "arrivals.mean_ms", positive=True,
                           limit=MAX_TIME_MS)
            values["mean_us"] = max(1, _ms_to_us(mean)) if mean is not None else None
        if "std_ms" in raw and "cv" in raw:
            errors.add("arrivals.cv", "set either std_ms or cv, not both")
        elif "std_ms" in raw:
            std = _number(errors, raw["std_ms"], "arrivals.std_ms", low=0.0, limit=MAX_TIME_MS)
            values["std_us"] = _ms_to_us(std) if std is not None else None
        elif "cv" in raw:
            values["cv"] = _number(errors, raw["cv"], "arrivals.cv", low=0.0, limit=1000.0)
        else:
            errors.add("arrivals.std_ms", "missing field, expected std_ms (or cv, the std as "
                       "a fraction of the mean)")
    elif kind == "poisson" and "rate_per_s" in raw:
        rate = _number(errors, raw["rate_per_s"], "arrivals.rate_per_s", positive=True,
                       limit=MAX_RATE_PER_S)
        if rate is not None and rate < MIN_RATE_PER_S:
            errors.add("arrivals.rate_per_s", f"expected a rate >= {MIN_RATE_PER_S:g} per "
                       f"second, got {rate}")
            rate = None
        values["rate_per_s"] = rate
    elif kind == "trace":
        times = errors.get(raw, "times_ms", list, "arrivals")
        if times is not None and len(times) > MAX_ARRIVALS:
            errors.add("arrivals.times_ms", f"expected at most {MAX_ARRIVALS} times, "
                       f"got {len(times)}")
            times = None
        if times is not None:
            parsed = [_number(errors, t, f"arrivals.times_ms[{i}]", low=0.0, limit=MAX_TIME_MS)
                      for i, t in enumerate(times)]
            if not parsed:
                errors.add("arrivals.times_ms", "expected at least one time")
            elif None not in parsed:
                times_us = tuple(_ms_to_us(t) for t in parsed if t is not None)
                if any(b < a for a, b in zip(times_us, times_us[1:], strict=False)):
                    errors.add("arrivals.times_ms", "expected non-decreasing times")
                if count is not None and count > len(times_us):
                    errors.add("arrivals.count", f"expected at most {len(times_us)} "
                               f"(the number of times), got {count}")
                values["times_us"] = times_us
                count = count if count is not None else len(times_us)
    return values, count


def _parse_composition(errors: ErrorCollector, raw: Any, network_count: int,
                       nodes: list[NetworkNode]) -> Composition:
    if raw in ("all", "one"):
        composition = Composition(kind=raw)
    elif isinstance(raw, dict):
        kind = errors.get(raw, "kind", str, "composition")
        if kind not in (None, "all", "one", "subset"):
            errors.add("composition.kind", f"expected all, one or subset, got {kind!r}")
            return Composition()
        if kind != "subset":
            _unknown_keys(errors, raw, {"kind"}, "composition")
            return Composition(kind=kind or "all")
        _unknown_keys(errors, raw, {"kind", "min_size", "max_size"}, "composition")
        min_size = errors.get(raw, "min_size", int, "composition", required=False, default=1)
        max_size = errors.get(raw, "max_size", int, "composition", required=False,
                              default=network_count)
        if min_size is None or max_size is None:
            return Composition()
        if not 1 <= min_size <= max_size:
            errors.add("composition.min_size", f"expected 1 <= min_size <= max_size, got "
                       f"{min_size} and {max_size}")
            return Composition()
        if network_count and max_size > network_count:
            errors.add("composition.max_size", f"expected at most {network_count} (the number "
                       f"of networks), got {max_size}")
            return Composition()
        composition = Composition(kind="subset", min_size=min_size, max_size=max_size)
    else:
        errors.add("composition", f"expected all, one or {{kind: subset, min_size: N, "
                   f"max_size: M}}, got {raw!r}")
        return Composition()
    if composition.kind != "all" and any(node.after for node in nodes):
        errors.add("composition", f"'{composition.kind}' draws networks independently; it "
                   "cannot be combined with 'after:' dependencies")
    return composition
