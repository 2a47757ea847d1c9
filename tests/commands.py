"""A masa command in a child process whose stderr a test waits on, line by line.

Tests of signals and of the device emulation start `python -m masa ...` and
must act at a given point of its run: they wait for the line the command logs
there (with -vv), never for an amount of time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

WAIT_S = 60.0  # generous on a loaded machine; the tests never assert durations


class Command:
    """`masa ARGV` in a child process. Its stderr is read line by line as it comes (and
    copied to stderr_path), so a test waits for what the command says, not for time."""

    def __init__(self, argv: list[str], stderr_path: Path, cwd: Path) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen([sys.executable, "-m", "masa", *argv], cwd=cwd,
                                        env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.ended = False  # stderr closed: the command is gone
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, args=(stderr_path,), daemon=True)
        self.reader.start()

    def _read(self, stderr_path: Path) -> None:
        assert self.process.stderr is not None
        with open(stderr_path, "w") as copy:
            for line in self.process.stderr:
                copy.write(line)
                copy.flush()
                with self.changed:
                    self.lines.append(line)
                    self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def wait_for_line(self, text: str) -> None:
        """Until a line of stderr holds `text`; fails if the command ends first."""
        def said() -> bool:
            return any(text in line for line in self.lines)

        with self.changed:
            self.changed.wait_for(lambda: said() or self.ended, WAIT_S)
            found = said()
        if not found:
            self.process.kill()
            pytest.fail(f"the command did not say {text!r} (exit {self.process.poll()}):\n"
                        + "".join(self.lines))

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self) -> int:
        code = self.process.wait(WAIT_S)
        self.reader.join(WAIT_S)  # the copy of stderr is complete
        return code
