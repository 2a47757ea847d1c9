"""Atomic file writes: write to a temporary name beside the target, then rename.

A reader (or a crash) never sees a half-written file: the rename either
happened or it did not.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as temp_file:
            temp_file.write(data)
            temp_file.flush()
            os.fsync(temp_file.fileno())
        # mkstemp creates 0600; give the file the mode a plain open() would.
        os.chmod(temp_name, 0o666 & ~_UMASK)
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_save_png(figure: Any, path: str | Path, dpi: int = 110) -> None:
    """Render a matplotlib figure to PNG and write it atomically."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    atomic_write_bytes(path, buffer.getvalue())
