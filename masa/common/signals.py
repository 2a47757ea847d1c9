"""SIGINT and SIGTERM as one exception, so every command stops the same clean way.

This module owns what a signal does to a `masa` command: `handle_signals()`
(entered by masa.cli.main around a command) makes SIGINT (Ctrl-C) and SIGTERM
(what systemd and `kill` send) raise `Interrupted` in the main thread, where
the command is. The exception unwinds like Ctrl-C always did: `finally`
blocks remove temporary folders (prepare's work folder, verify's copies), the
real executor terminates its running ONNX Runtime calls and releases every
session (masa.runtime.threads), a run writes its report marked partial
(masa.cli.run), and the command exits 128 + the signal's number (130, 143).

A second signal while the first is being handled ends the process at once
(the user asked twice); cleanup is then skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stopping signal arrived. A KeyboardInterrupt, so code that already stops
    cleanly on Ctrl-C stops cleanly on SIGTERM too.

    `partial` may carry what the interrupted work had done (a run's outcome), for
    the command to report before it exits with `exit_code`.
    """

    def __init__(self, signum: int = signal.SIGINT, partial: Any = None) -> None:
        self.signum = int(signum)
        self.partial = partial
        super().__init__(f"interrupted by {self.signal_name}")

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended."""
        return 128 + self.signum


def interrupted_exit_code(error: KeyboardInterrupt) -> int:
    """The exit code of an interruption: 130 for a plain Ctrl-C."""
    return error.exit_code if isinstance(error, Interrupted) else 128 + signal.SIGINT


class _Handler:
    """Raises Interrupted once; a second signal ends the process at once."""

    def __init__(self) -> None:
        self.first: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.first is not None:
            # The user insists: no more cleanup (it may be what hangs).
            os.write(2, b"masa: second signal, exiting at once\n")
            os._exit(128 + signum)
        self.first = signum
        raise Interrupted(signum)


@contextlib.contextmanager
def handle_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted inside the block (main thread only;
    elsewhere the block runs with the signals as they were)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Handler()
    previous = {signum: signal.getsignal(signum) for signum in HANDLED_SIGNALS}
    for signum in HANDLED_SIGNALS:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)
