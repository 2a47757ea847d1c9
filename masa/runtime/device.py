"""Devices as data: what a small device gives a Masa process, read from YAML.

This module owns the device description (`Device`) and its loader. A device
is a YAML file (the presets ship in masa/runtime/devices/, described with the
sources of their figures in docs/device-emulation.md):

    name: pi4-2g
    memory: 2GiB            # the board's RAM
    reserved: 176MiB        # what the GPU split and the OS at idle keep
    storage: {read: 44MB/s, write: 35MB/s}
    swap: 0
    cores: 4
    cold_cache: true        # the page cache starts without the model files

The process's memory cap is memory - reserved; `default_budget_bytes` leaves
the runtime's own base (Python, ONNX Runtime, masa) out of it for the
scheduler's budget. masa.runtime.emulation turns a device into cgroups.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from masa.common.errors import ErrorCollector, UserError
from masa.common.units import parse_memory_bytes

PRESET_DIR = Path(__file__).with_name("devices")
# The runtime's own memory (Python, ONNX Runtime, masa, manifests, task graph) as
# measured by emulated runs here (32-36 MiB, docs/device-emulation.md): what the
# simulator assumes when it cannot measure it.
RUNTIME_BASE_BYTES = 34 * 2**20
# What `masa run` holds per ended task until its report is written (the task's
# schedule record, its place in the dispatch order, the memory samples taken around
# it, kept in columns: masa.common.columns): anonymous memory the base, measured
# before the first job, does not hold, and the simulator charges as tasks end.
# Measured with `python benchmarks/bench_device.py --measure-run-records`: 195 bytes
# on 2026-11-28 (small 149, mixed 242; 1116 before the columns and before the
# baseline held the scheduler's entries; docs/device-emulation.md).
RUN_RECORD_BYTES_PER_TASK = 195
# The scheduler's entry for each task of a batch, which `masa run` builds before its
# first job and holds in its base (masa.cli.emulation_child.runtime_base_bytes
# measures it with the rest): 616-711 bytes a task in small's 33,600 (2026-11-28,
# each policy's in a fresh process). A simulation assumes this much beside
# RUNTIME_BASE_BYTES.
SCHEDULER_BYTES_PER_TASK = 650
_FIELDS = ("name", "description", "memory", "reserved", "storage", "swap", "cores",
           "cold_cache")


def assumed_runtime_base_bytes(task_count: int) -> int:
    """The runtime's base a simulation assumes for a batch of `task_count` tasks."""
    return RUNTIME_BASE_BYTES + SCHEDULER_BYTES_PER_TASK * task_count


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    memory_bytes: int  # the board's RAM
    reserved_bytes: int  # GPU split + OS: not available to the process
    read_bytes_per_s: int | None  # storage read bandwidth; None: not throttled
    write_bytes_per_s: int | None
    swap_bytes: int
    cores: int
    cold_cache: bool
    source: str = ""  # the file it came from

    @property
    def memory_cap_bytes(self) -> int:
        """What the process may hold: the cgroup's memory limit."""
        return self.memory_bytes - self.reserved_bytes

    def default_budget_bytes(self, runtime_base_bytes: int) -> int:
        """The scheduler's budget: the cap less the runtime's own base."""
        return max(0, self.memory_cap_bytes - runtime_base_bytes)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "memory_bytes": self.memory_bytes, "reserved_bytes": self.reserved_bytes,
                "memory_cap_bytes": self.memory_cap_bytes,
                "read_bytes_per_s": self.read_bytes_per_s,
                "write_bytes_per_s": self.write_bytes_per_s, "swap_bytes": self.swap_bytes,
                "cores": self.cores, "cold_cache": self.cold_cache}


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def load_device(name_or_file: str | Path) -> Device:
    """A preset by name, or a device YAML file; UserError listing every problem."""
    text = str(name_or_file)
    path = PRESET_DIR / f"{text}.yaml"
    if not path.is_file():
        path = Path(text)
        if not path.is_file():
            raise UserError(f"--device {text}: neither a device file nor a preset "
                            f"(presets: {', '.join(preset_names())})")
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"{path}: cannot read the device: "
                        f"{str(error).splitlines()[0]}") from None
    return device_from_dict(raw, str(path))


def _size(errors: ErrorCollector, raw: dict, key: str, required: bool = True) -> int | None:
    if key not in raw and not required:
        return None
    value = errors.get(raw, key, (int, str), "")
    if value is None:
        return None
    try:
        return parse_memory_bytes(value, key)
    except UserError:
        errors.add(key, f"expected a size such as 512MiB or 40MB, got {value!r}")
        return None


def _bandwidth(errors: ErrorCollector, raw: Any, key: str) -> int | None:
    """'44MB/s' -> 44000000 bytes per second; null: not throttled."""
    if raw is None or key not in raw or raw[key] is None:
        return None
    text = str(raw[key])
    match = re.fullmatch(r"\s*(.+?)\s*/\s*s\s*", text)
    try:
        value = parse_memory_bytes(match.group(1) if match else "x", key)
    except UserError:
        value = 0
    if value <= 0:
        errors.add(f"storage.{key}", f"expected a bandwidth such as 40MB/s, got {text!r}")
        return None
    return value


def device_from_dict(raw: Any, source: str) -> Device:
    errors = ErrorCollector(source)
    if not isinstance(raw, dict):
        errors.add("", "expected a mapping with name, memory, storage, ...")
        errors.raise_if_any()
    for key in sorted(set(raw) - set(_FIELDS)):
        errors.add(key, f"unknown field (expected {', '.join(_FIELDS)})")
    name = errors.get(raw, "name", str, "")
    description = errors.get(raw, "description", str, "", required=False, default="")
    memory_bytes = _size(errors, raw, "memory")
    reserved_bytes = _size(errors, raw, "reserved", required=False) or 0
    swap_bytes = _size(errors, raw, "swap", required=False) or 0
    storage = errors.get(raw, "storage", (dict, type(None)), "", required=False)
    read_bps = _bandwidth(errors, storage, "read")
    write_bps = _bandwidth(errors, storage, "write")
    cores = errors.get(raw, "cores", int, "", required=False, default=1)
    if cores is not None and cores < 1:
        errors.add("cores", f"expected a positive integer, got {cores}")
    cold_cache = errors.get(raw, "cold_cache", bool, "", required=False, default=True)
    if memory_bytes is not None and reserved_bytes >= memory_bytes:
        errors.add("reserved", "expected less than memory (the process would get nothing)")
    errors.raise_if_any()
    return Device(name=name, description=description or name, memory_bytes=memory_bytes,
                  reserved_bytes=reserved_bytes, read_bytes_per_s=read_bps,
                  write_bytes_per_s=write_bps, swap_bytes=swap_bytes, cores=cores,
                  cold_cache=cold_cache, source=source)
