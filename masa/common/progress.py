"""A small progress bar on stderr, for long offline steps (splitting, profiling).

It owns only drawing: callers report `(done, total, item)` through `update`
(also usable directly as a `(done, total, item)` callback). It draws nothing
when the stream is not a terminal or when the user asked for quiet output, so
logs and captured output stay clean. No dependency beyond the standard library.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

# (done, total, item): the callback shape model_prep.split and model_prep.profile use.
ProgressCallback = Callable[[int, int, str], None]


class ProgressBar:
    """`[#####.....] 12/40 label: item`, redrawn in place with a carriage return.

    Redraws at most every `min_interval_s` (except the final one), because a
    terminal write per DenseNet stage would cost more than the stage itself.
    The clock is injected so tests need no sleeps.
    """

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        width: int = 30,
        min_interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = _is_terminal(self.stream)
        self.enabled = enabled
        self.width = width
        self.min_interval_s = min_interval_s
        self.clock = clock
        self._last_draw_s: float | None = None
        self._drawn = False

    def update(self, done: int, total: int, item: str = "") -> None:
        if not self.enabled:
            return
        now_s = self.clock()
        final = total > 0 and done >= total
        if (not final and self._last_draw_s is not None
                and now_s - self._last_draw_s < self.min_interval_s):
            return
        self._last_draw_s = now_s
        self.stream.write("\r" + render(self.label, done, total, item, self.width) + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    __call__ = update

    def close(self) -> None:
        """End the bar's line so later output starts on a fresh one."""
        if self.enabled and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def render(label: str, done: int, total: int, item: str = "", width: int = 30) -> str:
    """One line of the bar; pure, so its format is testable."""
    fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 1.0
    filled = int(round(fraction * width))
    bar = "#" * filled + "." * (width - filled)
    suffix = f": {item}" if item else ""
    return f"{label} [{bar}] {done}/{total}{suffix}"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False
