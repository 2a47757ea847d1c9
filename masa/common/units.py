"""Parsing and printing of memory sizes and durations with explicit units.

The size rule (docs/architecture.md, `--help` of every size option): a plain
number is bytes; `KiB`, `MiB`, `GiB`, `TiB` are binary (1024-based); `kB`, `MB`,
`GB`, `TB` are decimal (1000-based), as on a disk's or a device's label; case
does not matter. A bare `k`, `M`, `G` or `T` is refused, because tools disagree
on it (Docker reads `64m` as 64 MiB, Kubernetes `64M` as 64,000,000 bytes): the
message gives both readings in bytes.
"""

from __future__ import annotations

import re
from fractions import Fraction

from masa.common.errors import UserError

_MEMORY_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
# A bare prefix: ambiguous, refused with both readings.
_AMBIGUOUS_UNITS = {"k": ("KiB", "kB"), "m": ("MiB", "MB"), "g": ("GiB", "GB"),
                    "t": ("TiB", "TB")}
# Sizes above this are typing mistakes (16 EiB is 2**64): refused, not overflowed.
MAX_MEMORY_BYTES = 2**60
SIZE_RULE = ("a plain number is bytes; KiB/MiB/GiB are 1024-based, kB/MB/GB "
             "1000-based; a bare k/M/G is refused as ambiguous")


def parse_memory_bytes(text: str | int, what: str = "memory") -> int:
    """'512MiB' -> 536870912, '40MB' -> 40000000, '1000' -> 1000. Raises UserError
    (for '64M': ambiguous, with both readings)."""
    if isinstance(text, int) and not isinstance(text, bool):
        number, unit = Fraction(text), ""
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        unit = match.group(2).lower() if match else ""
        if match and len(match.group(1)) > 40:  # far beyond MAX_MEMORY_BYTES in any unit
            raise UserError(f"{what}: expected at most 1 EiB (2**60 bytes), got {_shown(text)}")
        if match and unit in _AMBIGUOUS_UNITS:
            binary, decimal = _AMBIGUOUS_UNITS[unit]
            number = Fraction(match.group(1))
            raise UserError(
                f"{what}: {_shown(str(text).strip())} is ambiguous: write "
                f"{match.group(1)}{binary} ({int(number * _MEMORY_UNITS[binary.lower()])} bytes) "
                f"or {match.group(1)}{decimal} "
                f"({int(number * _MEMORY_UNITS[decimal.lower()])} bytes)")
        if not match or unit not in _MEMORY_UNITS:
            raise UserError(
                f"{what}: expected a size such as 512MiB, 1GiB, 40MB or 1000000 (bytes), "
                f"got {_shown(text)}")
        number = Fraction(match.group(1))
    if number < 0:
        raise UserError(f"{what}: expected a non-negative size, got {text}")
    if number * _MEMORY_UNITS[unit] > MAX_MEMORY_BYTES:
        raise UserError(f"{what}: expected at most 1 EiB (2**60 bytes), got {_shown(text)}")
    return int(number * _MEMORY_UNITS[unit])


def _shown(text: object, limit: int = 40) -> str:
    """repr of a user's value, cut short: a message stays one readable line."""
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit] + "...'"


def format_bytes(memory_bytes: float) -> str:
    """Human-readable binary size: 1536 -> '1.5 KiB'."""
    value = float(memory_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
