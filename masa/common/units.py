"""Parsing and printing of memory sizes and durations with explicit units."""

from __future__ import annotations

import re

from masa.common.errors import UserError

_MEMORY_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}


def parse_memory_bytes(text: str | int, what: str = "memory") -> int:
    """'512MiB' -> 536870912. Plain numbers are bytes. Raises UserError."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UserError(f"{what}: expected a non-negative size, got {text}")
        return text
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _MEMORY_UNITS:
        raise UserError(
            f"{what}: expected a size such as 512MiB, 1GiB or 1000000, got {text!r}"
        )
    return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()])


def format_bytes(memory_bytes: float) -> str:
    """Human-readable binary size: 1536 -> '1.5 KiB'."""
    value = float(memory_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
