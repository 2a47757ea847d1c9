"""Argparse types every command shares, so the same flag means the same thing everywhere.

`--memory` is always a size with a unit (`memory_size`), `--jobs` and
`--workers` always positive counts (`positive_int`), durations always carry
their unit (`duration_s`). A bad value is argparse's one-line usage error,
exit code 2.
"""

from __future__ import annotations

import argparse

from masa.common.errors import UserError
from masa.common.units import parse_memory_bytes

_DURATION_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def memory_size(text: str) -> int:
    """'512MiB' -> 536870912 bytes; plain numbers are bytes."""
    try:
        return parse_memory_bytes(text, "size")
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("size: ")) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def duration_s(text: str) -> float:
    """'250ms' -> 0.25, '2s' -> 2.0, '1.5' -> 1.5 seconds."""
    stripped = text.strip()
    for unit in sorted(_DURATION_UNITS_S, key=len, reverse=True):
        if stripped.endswith(unit):
            number, scale = stripped[: -len(unit)], _DURATION_UNITS_S[unit]
            break
    else:
        number, scale = stripped, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 250ms, 2s or 1.5, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative duration, got {text!r}")
    return value
