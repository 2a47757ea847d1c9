"""The device config of `masa serve`: read, validated with every problem at once, resolved.

Owns the `device.yaml` schema (docs/serve.md): the store, the memory budget
(a size, or `auto`), the scheduler settings, the listen address (loopback by
default; any other address only with a token file), the journal, the limits,
and the job graphs the device offers, each in the workload graph format
(docs/workload-format.md), inline or as the `graph:` of a workload file, with
optional per-network image preprocessing. Problems are collected as the
workload loader collects them (``device.yaml: at 'graphs.faces.graph.x.after':
unknown network 'y'``) and raised as one ValidationError (exit code 2).

Nothing in a request can name a file or code: every graph, network and
preprocessing step comes from here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from masa.common.errors import ErrorCollector, UserError, ValidationError
from masa.common.units import parse_memory_bytes
from masa.runtime.registry import KEEPING_POLICIES, POLICY_NAMES
from masa.runtime.threads import DEFAULT_MEMORY_SOURCE, MEMORY_SOURCES
from masa.sched.context import CONTEXT_MODES
from model_prep.manifest import NetworkManifest
from workloads.arrivals import Arrival

# The graph section's own validators: the same checks and messages as a
# workload file's `graph:`.
from workloads.loader import (
    check_outputs,
    load_workload,
    network_order,
    parse_graph,
    store_manifests,
)
from workloads.model import InputSpec, NetworkNode, Workload

DEFAULT_LISTEN = "127.0.0.1:8080"
CHANNEL_ORDERS = ("rgb", "bgr", "gray")
LAYOUTS = ("nchw", "nhwc")
JOURNAL_SYNC = ("full", "normal")
_TOP_FIELDS = {"store", "memory", "memory_margin", "read_ahead", "keep_cached", "keep_loaded",
               "workers", "policy", "context", "memory_source", "intra_op_threads", "listen",
               "token_file", "journal", "journal_sync", "retention_s", "limits",
               "shutdown_grace_s", "graphs"}
_LIMIT_DEFAULTS: dict[str, Any] = {
    "max_queued_jobs": 64,  # accepted jobs not yet ended; more: 429
    "max_body_bytes": 16 * 2**20,  # a request body; more: 413
    "max_image_pixels": 40_000_000,  # a decoded image (width x height); more: 413
    "max_decoded_bytes": 256 * 2**20,  # arrays decoded from one body; more: 413
    "inline_output_elements": 64,  # outputs up to this many elements are inlined in JSON
    "retry_after_s": 1,  # the Retry-After of a 429
}
_PREPROCESS_FIELDS = {"resize", "crop", "channels", "layout", "scale", "mean", "std", "dtype"}


@dataclass(frozen=True)
class Preprocess:
    """How a photo becomes one network's input tensor (Pillow, then numpy), in this order:
    resize (to height x width, or the shorter side to N keeping the aspect), centre
    crop, channel order, scale, (x - mean) / std per channel, layout and dtype."""

    resize: tuple[int, int] | int | None = None  # None: the input's height x width
    crop: tuple[int, int] | None = None
    channels: str = "rgb"
    layout: str | None = None  # None: from where the input shape has 1 or 3 channels
    scale: float = 1.0
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    dtype: str | None = None  # None: the input's dtype


@dataclass(frozen=True)
class GraphSpec:
    """One job graph the device offers."""

    name: str
    workload: Workload  # its nodes (conditions, transforms); input and arrivals unused
    preprocess: Mapping[str, Preprocess] = field(default_factory=dict)
    description: str = ""

    @property
    def networks(self) -> tuple[str, ...]:
        return self.workload.networks


@dataclass(frozen=True)
class ServeConfig:
    source: Path
    store: Path
    memory_budget_bytes: int | None  # None: auto (resolved at start, see budget.py)
    memory_margin_bytes: int
    read_ahead_bytes: int | None  # masa's read-ahead window (None: as memory allows)
    keep_cached_bytes: int | None  # stage files kept cached (None: the kernel decides)
    keep_loaded_bytes: int | None  # masa: bound on kept loaded stages (None: the budget)
    workers: int
    policy: str
    context: str
    memory_source: str
    intra_op_threads: int
    host: str | None  # None with a Unix socket
    port: int | None
    unix_socket: Path | None
    token_file: Path | None
    journal: Path
    journal_sync: str
    retention_s: float
    limits: Mapping[str, int]
    shutdown_grace_s: float
    graphs: Mapping[str, GraphSpec]
    manifests: Mapping[str, NetworkManifest]
    network_order: tuple[str, ...]  # every offered network, in first-seen order
    upstreams: Mapping[str, tuple[str, ...]]  # network -> its upstreams in any graph

    @property
    def url(self) -> str:
        if self.unix_socket is not None:
            return f"unix:{self.unix_socket}"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}"


class _Prefixed(ErrorCollector):
    """Problems of a nested section, with their path inside the config file."""

    def __init__(self, parent: ErrorCollector, prefix: str) -> None:
        super().__init__(parent.source)
        self.problems = parent.problems  # shared: one list for the whole file
        self.prefix = f"{parent.prefix}.{prefix}" if isinstance(parent, _Prefixed) else prefix

    def add(self, path: str, message: str) -> None:
        super().add(f"{self.prefix}.{path}" if path else self.prefix, message)


def load_config(path: str | Path) -> ServeConfig:
    """Read and validate a device config; raise UserError listing every problem."""
    source = Path(path)
    if not source.is_file():
        raise UserError(f"{source}: no such config file")
    try:
        raw = yaml.safe_load(source.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None
    except UnicodeDecodeError:
        raise UserError(f"{source}: not a text file") from None
    errors = ErrorCollector(str(source))
    if not isinstance(raw, dict):
        errors.add("", f"expected a mapping at the top level, got {type(raw).__name__}")
        errors.raise_if_any()
    for key in raw:
        if key not in _TOP_FIELDS:
            errors.add(str(key), f"unknown field, expected one of {', '.join(sorted(_TOP_FIELDS))}")
    base = source.parent
    settings = _parse_settings(errors, raw, base)
    store = settings.pop("store")
    graphs, manifests = _parse_graphs(errors, raw.get("graphs"), store, base)
    order, upstreams = _combine_graphs(graphs)
    errors.raise_if_any()
    return ServeConfig(source=source, store=store, graphs=graphs, manifests=manifests,
                       network_order=order, upstreams=upstreams, **settings)


def _path(errors: ErrorCollector, raw: Mapping[str, Any], key: str, base: Path, *,
          required: bool, default: str | None = None) -> Path | None:
    value = errors.get(raw, key, str, "", required=required, default=default)
    if value is None:
        return None
    candidate = Path(value).expanduser()
    return candidate if candidate.is_absolute() else base / candidate


def _positive(errors: ErrorCollector, raw: Mapping[str, Any], key: str, default: Any,
              kind: type | tuple[type, ...] = int, path: str = "") -> Any:
    value = errors.get(raw, key, kind, path, required=False, default=default)
    if value is not None and value <= 0:
        errors.add(f"{path}.{key}" if path else key, f"expected a positive number, got {value}")
        return default
    return value


def _size(errors: ErrorCollector, raw: Mapping[str, Any], key: str, default: int,
          path: str = "") -> int:
    where = f"{path}.{key}" if path else key
    if key not in raw:
        return default
    try:
        return parse_memory_bytes(raw[key], where)
    except UserError:
        errors.add(where, f"expected a size such as 512MiB or 1GiB, got {raw[key]!r}")
        return default


def _choice(errors: ErrorCollector, raw: Mapping[str, Any], key: str, choices: tuple[str, ...],
            default: str) -> str:
    value = errors.get(raw, key, str, "", required=False, default=default)
    if value not in choices:
        if value is not None:
            errors.add(key, f"expected one of {', '.join(choices)}, got {value!r}")
        return default
    return value


def _parse_settings(errors: ErrorCollector, raw: Mapping[str, Any], base: Path
                    ) -> dict[str, Any]:
    store = _path(errors, raw, "store", base, required=True)
    if store is not None and not store.is_dir():
        errors.add("store", f"{store} is not a directory (prepare networks into it with "
                   "`masa prepare MODEL.onnx --store DIR`)")
    memory = raw.get("memory", "auto")
    budget: int | None = None
    if memory != "auto":
        try:
            budget = parse_memory_bytes(memory, "memory")
        except UserError:
            budget = 0
        if budget <= 0:
            errors.add("memory", f"expected 'auto' or a positive size such as 512MiB, "
                       f"got {memory!r}")
    host, port, unix_socket = _parse_listen(errors, raw.get("listen", DEFAULT_LISTEN))
    token_file = _path(errors, raw, "token_file", base, required=False)
    if token_file is not None:
        try:
            if not token_file.read_text().strip():
                errors.add("token_file", f"{token_file} is empty")
        except OSError as error:
            errors.add("token_file", f"cannot read {token_file}: {error.strerror}")
    if host is not None and not _is_loopback(host) and token_file is None:
        errors.add("listen", f"{host} is not a loopback address: set token_file to accept "
                   "requests from other machines (or listen on 127.0.0.1)")
    return {
        "store": store or base,
        "memory_budget_bytes": budget,
        "memory_margin_bytes": _size(errors, raw, "memory_margin", 64 * 2**20),
        "read_ahead_bytes": (None if raw.get("read_ahead") is None
                             else _size(errors, raw, "read_ahead", 0)),
        "keep_cached_bytes": (None if raw.get("keep_cached") is None
                              else _size(errors, raw, "keep_cached", 0)),
        "keep_loaded_bytes": _keep_loaded(errors, raw),
        "workers": _positive(errors, raw, "workers", 2),
        "policy": _choice(errors, raw, "policy", POLICY_NAMES, "masa"),
        "context": _choice(errors, raw, "context", CONTEXT_MODES, "wait"),
        "memory_source": _choice(errors, raw, "memory_source", MEMORY_SOURCES,
                                 DEFAULT_MEMORY_SOURCE),
        "intra_op_threads": _positive(errors, raw, "intra_op_threads", 1),
        "host": host, "port": port, "unix_socket": unix_socket, "token_file": token_file,
        "journal": _path(errors, raw, "journal", base, required=False,
                         default="masa-journal.sqlite"),
        "journal_sync": _choice(errors, raw, "journal_sync", JOURNAL_SYNC, "full"),
        "retention_s": float(_positive(errors, raw, "retention_s", 86400, (int, float))),
        "limits": _parse_limits(errors, raw.get("limits", {})),
        "shutdown_grace_s": float(_positive(errors, raw, "shutdown_grace_s", 30,
                                            (int, float))),
    }


def _keep_loaded(errors: ErrorCollector, raw: Mapping[str, Any]) -> int | None:
    if "keep_loaded" not in raw:
        return None  # the budget, once it is resolved (keep_loaded_for)
    keep_bytes = _size(errors, raw, "keep_loaded", 0)
    policy = raw.get("policy", "masa")
    if keep_bytes and policy in POLICY_NAMES and policy not in KEEPING_POLICIES:
        errors.add("keep_loaded", f"policy {policy!r} does not keep stages; expected policy "
                   f"{' or '.join(KEEPING_POLICIES)}, or no keep_loaded")
    return keep_bytes


def _parse_listen(errors: ErrorCollector, value: Any
                  ) -> tuple[str | None, int | None, Path | None]:
    if not isinstance(value, str):
        errors.add("listen", f"expected HOST:PORT or unix:/PATH, got {value!r}")
        return "127.0.0.1", 8080, None
    if value.startswith("unix:"):
        return None, None, Path(value[len("unix:"):])
    host, _, port_text = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        errors.add("listen", f"expected HOST:PORT (port 0-65535) or unix:/PATH, got {value!r}")
        return "127.0.0.1", 8080, None
    return host, int(port_text), None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _parse_limits(errors: ErrorCollector, raw: Any) -> dict[str, int]:
    limits = dict(_LIMIT_DEFAULTS)
    if not isinstance(raw, dict):
        errors.add("limits", f"expected a mapping, got {raw!r}")
        return limits
    for key, value in raw.items():
        if key not in _LIMIT_DEFAULTS:
            errors.add(f"limits.{key}", f"unknown field, expected one of "
                       f"{', '.join(sorted(_LIMIT_DEFAULTS))}")
        elif key.endswith("_bytes"):
            limits[key] = _size(errors, raw, key, limits[key], "limits")
        else:
            minimum = 0 if key == "inline_output_elements" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                errors.add(f"limits.{key}", f"expected an integer >= {minimum}, got {value!r}")
            else:
                limits[key] = value
    return limits


def _parse_graphs(errors: ErrorCollector, raw: Any, store: Path | None, base: Path
                  ) -> tuple[dict[str, GraphSpec], dict[str, NetworkManifest]]:
    if not isinstance(raw, dict) or not raw:
        errors.add("graphs", "expected a mapping of graph names to {graph: ...} or "
                   "{workload: FILE}")
        return {}, {}
    graphs: dict[str, GraphSpec] = {}
    manifests: dict[str, NetworkManifest] = {}
    for name, entry in raw.items():
        nested = _Prefixed(errors, f"graphs.{name}")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            nested.add("", "expected a name of letters, digits, '-' and '_'")
            continue
        if not isinstance(entry, dict):
            nested.add("", f"expected {{graph: ...}} or {{workload: FILE}}, got {entry!r}")
            continue
        for key in entry:
            if key not in ("graph", "workload", "preprocess", "description"):
                nested.add(str(key), "unknown field, expected one of description, graph, "
                           "preprocess, workload")
        workload = _graph_workload(nested, name, entry, store, base, manifests)
        if workload is None:
            continue
        preprocess = _parse_preprocess(_Prefixed(nested, "preprocess"),
                                       entry.get("preprocess", {}), workload)
        description = entry.get("description", workload.description)
        graphs[name] = GraphSpec(name, workload, preprocess, str(description or ""))
    return graphs, manifests


def _graph_workload(errors: _Prefixed, name: str, entry: Mapping[str, Any], store: Path | None,
                    base: Path, manifests: dict[str, NetworkManifest]) -> Workload | None:
    """The graph as a Workload (its nodes; the job input and arrivals are the requests')."""
    if ("graph" in entry) == ("workload" in entry):
        errors.add("", "expected exactly one of 'graph' (inline) or 'workload' (a file)")
        return None
    before = len(errors.problems)
    if "workload" in entry:
        file = _path(errors, entry, "workload", base, required=True)
        if file is None:
            return None
        try:
            workload = load_workload(file, store_dir=store)
        except ValidationError as error:
            errors.problems.extend(error.problems)
            return None
        except UserError as error:
            errors.add("workload", str(error))
            return None
    else:
        # Paths come out as 'graphs.NAME.graph.NETWORK...', as in a workload file.
        nodes = parse_graph(errors, entry["graph"])
        ordered = network_order(errors, nodes)
        workload = Workload(name=name, source=Path(errors.source), nodes=ordered,
                            input=InputSpec(kind="random"),
                            arrivals=Arrival(kind="periodic", count=1, interval_us=1))
    if store is not None and store.is_dir() and len(errors.problems) == before:
        found = store_manifests(errors, store, list(workload.nodes))
        check_outputs(errors, list(workload.nodes), found)
        for network, manifest in found.items():
            manifests.setdefault(network, manifest)
    return workload if len(errors.problems) == before else None


def _parse_preprocess(errors: _Prefixed, raw: Any, workload: Workload) -> dict[str, Preprocess]:
    if not isinstance(raw, dict):
        errors.add("", f"expected a mapping of network names to preprocessing, got {raw!r}")
        return {}
    found: dict[str, Preprocess] = {}
    for network, spec in raw.items():
        path = str(network)
        node: NetworkNode | None = next((n for n in workload.nodes if n.name == network), None)
        if node is None:
            errors.add(path, f"unknown network {network!r} (the graph has: "
                       f"{', '.join(workload.networks)})")
            continue
        if node.transform is not None:
            errors.add(path, "this network's input comes from its 'input:' transform")
            continue
        if not isinstance(spec, dict):
            errors.add(path, f"expected a mapping of {', '.join(sorted(_PREPROCESS_FIELDS))}")
            continue
        parsed = _preprocess_fields(errors, spec, path)
        if parsed is not None:
            found[network] = parsed
    return found


def _int_pair(errors: ErrorCollector, value: Any, path: str, allow_single: bool
              ) -> tuple[int, int] | int | None:
    if allow_single and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        return (value[0], value[1])
    expected = "N or [height, width]" if allow_single else "[height, width]"
    errors.add(path, f"expected {expected} in pixels, got {value!r}")
    return None


def _floats(errors: ErrorCollector, value: Any, path: str) -> tuple[float, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, int | float) and not isinstance(v, bool)
                            for v in items):
        errors.add(path, f"expected a number or a list of numbers (one per channel), got {value!r}")
        return ()
    return tuple(float(v) for v in items)


def _preprocess_fields(errors: ErrorCollector, spec: Mapping[str, Any], path: str
                       ) -> Preprocess | None:
    before = len(errors.problems)
    for key in spec:
        if key not in _PREPROCESS_FIELDS:
            errors.add(f"{path}.{key}", f"unknown field, expected one of "
                       f"{', '.join(sorted(_PREPROCESS_FIELDS))}")
    resize = (_int_pair(errors, spec["resize"], f"{path}.resize", True)
              if "resize" in spec else None)
    crop = _int_pair(errors, spec["crop"], f"{path}.crop", False) if "crop" in spec else None
    channels = spec.get("channels", "rgb")
    if channels not in CHANNEL_ORDERS:
        errors.add(f"{path}.channels", f"expected one of {', '.join(CHANNEL_ORDERS)}, "
                   f"got {channels!r}")
    layout = spec.get("layout")
    if layout is not None and layout not in LAYOUTS:
        errors.add(f"{path}.layout", f"expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    scale = _floats(errors, spec.get("scale", 1.0), f"{path}.scale")
    mean = _floats(errors, spec["mean"], f"{path}.mean") if "mean" in spec else ()
    std = _floats(errors, spec["std"], f"{path}.std") if "std" in spec else ()
    if any(value == 0 for value in std):
        errors.add(f"{path}.std", "expected non-zero values")
    dtype = spec.get("dtype")
    if dtype is not None and dtype not in ("float32", "float16", "float64", "uint8", "int8",
                                           "int32", "int64"):
        errors.add(f"{path}.dtype", f"expected a numeric dtype such as float32 or uint8, "
                   f"got {dtype!r}")
    if len(errors.problems) > before:
        return None
    return Preprocess(resize=resize, crop=crop if not isinstance(crop, int) else None,
                      channels=channels, layout=layout, scale=scale[0] if scale else 1.0,
                      mean=mean, std=std, dtype=dtype)


def _combine_graphs(graphs: Mapping[str, GraphSpec]
                    ) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """One network order and the union of every graph's upstreams (the scheduler's
    context controller reads each job's own graph; see masa.serve.service)."""
    order: list[str] = []
    upstreams: dict[str, set[str]] = {}
    for graph in graphs.values():
        for node in graph.workload.nodes:
            if node.name not in order:
                order.append(node.name)
            upstreams.setdefault(node.name, set()).update(node.after)
    return tuple(order), {name: tuple(sorted(ups)) for name, ups in upstreams.items() if ups}
