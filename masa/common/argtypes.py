"""Argparse types every command shares, so the same flag means the same thing everywhere.

`--memory` is always a size with a unit (`memory_size`; a budget must be
positive: `memory_budget`), following masa.common.units' rule (plain number:
bytes; KiB/MiB/GiB 1024-based; kB/MB/GB 1000-based; a bare k/M/G refused as
ambiguous), `--jobs` and `--workers` always positive counts (`positive_int`),
durations always carry their unit (`duration_s`), files a command writes are
checked before any work (`output_file`). A bad value is argparse's one-line
usage error, exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from masa.common.errors import UserError
from masa.common.units import SIZE_RULE, parse_memory_bytes

_DURATION_UNITS_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def memory_size(text: str) -> int:
    """'512MiB' -> 536870912 bytes; plain numbers are bytes."""
    try:
        return parse_memory_bytes(text, "size")
    except UserError as error:
        raise argparse.ArgumentTypeError(str(error).removeprefix("size: ")) from None


def memory_budget(text: str) -> int:
    """A memory budget: a size (as memory_size) of at least one byte."""
    value = memory_size(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive size such as 512MiB, got {text!r}")
    return value


MEMORY_HELP = f"sizes: {SIZE_RULE}"


def output_file(text: str) -> Path:
    """A file the command will write: refused now, before any work, when it names a
    directory or a device, or when its folder cannot be created or written."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file path, got ''")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory, expected a file path")
    if path.exists() and not path.is_file():
        # An atomic write would replace the device or pipe itself by a plain file.
        raise argparse.ArgumentTypeError(f"{text}: not a regular file (a device or a pipe?)")
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the writer creates the missing folders
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot write in {folder} (permission "
                                         "denied or read-only)")
    return path


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
    if not math.isfinite(value) or value < 0:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"expected a finite non-negative number, got {text!r}")
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
    if not math.isfinite(value) or value < 0:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(
            f"expected a finite non-negative duration, got {text!r}")
    return value
