"""User-facing errors and the error collector every loader uses.

A `UserError` is bad input, not a bug: the CLI prints its one-line message on
stderr and exits 2, with no traceback. Its subclass `RunFailed` is a valid
input whose run failed (a verification mismatch, a network that failed, a
stage ONNX Runtime refused): one line, exit 1. `ErrorCollector` gathers every problem in
a file before raising, each as ``file: at 'path': message`` (borgmatic style),
so a user fixes all of them in one go.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class RunFailed(UserError):
    """The input was fine and the command ran, but what it ran failed: exit code 1.

    A UserError on purpose: still one line with no traceback, and callers of
    the Python API that stop on UserError (prepare, verify, profile) keep doing so.
    """


class ValidationError(UserError):
    """Several problems found in one input file; `problems` lists them all."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


class ErrorCollector:
    """Collects validation problems for one source file.

    >>> errors = ErrorCollector("lifelog.yaml")
    >>> errors.add("graph.facenet.after", "unknown network 'facenet2'")
    >>> errors.problems
    ["lifelog.yaml: at 'graph.facenet.after': unknown network 'facenet2'"]
    """

    def __init__(self, source: str):
        self.source = source
        self.problems: list[str] = []

    def add(self, path: str, message: str) -> None:
        where = f"at '{path}': " if path else ""
        # A key or value from the file may hold a line break: the message stays one line.
        self.problems.append(f"{self.source}: {where}{message}".replace("\n", "\\n"))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ValidationError(self.problems)

    # Typed field access: each returns the value, or None after recording a problem.
    def get(
        self,
        mapping: Mapping[str, Any],
        key: str,
        expected: type | tuple[type, ...],
        path: str,
        *,
        required: bool = True,
        default: Any = None,
    ) -> Any:
        full_path = f"{path}.{key}" if path else key
        if key not in mapping:
            if required:
                self.add(full_path, f"missing field, expected {_type_name(expected)}")
            return default
        value = mapping[key]
        # bool is an int subclass; a YAML `true` is never a valid count or size.
        if isinstance(value, bool) and bool not in _as_tuple(expected):
            self.add(full_path, f"expected {_type_name(expected)}, got {value!r}")
            return default
        if not isinstance(value, expected):
            self.add(full_path, f"expected {_type_name(expected)}, got {value!r}")
            return default
        return value


def _as_tuple(expected: type | tuple[type, ...]) -> tuple[type, ...]:
    return expected if isinstance(expected, tuple) else (expected,)


def _type_name(expected: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping", bool: "true or false"}
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(expected))


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (ONNX Runtime's span many), or its type."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def os_error_line(exc: OSError, doing: str = "") -> str:
    """One line for a failed file operation: '<file>: cannot write the report: No space
    left on device'. `doing` says what was being done (optional)."""
    where = exc.filename if exc.filename is not None else ""
    cause = exc.strerror or one_line(exc)
    parts = [str(where)] if where != "" else []
    if doing:
        parts.append(doing)
    parts.append(cause)
    return ": ".join(parts)


@contextlib.contextmanager
def writing(path: object, what: str) -> Iterator[None]:
    """Turn a failed write of `path` (full or read-only disk, missing folder) into
    RunFailed: '<path>: cannot write <what>: No space left on device' (exit 1)."""
    try:
        yield
    except OSError as exc:
        raise RunFailed(f"{path}: cannot write {what}: {exc.strerror or one_line(exc)}"
                        ) from None


# The exit codes of every command (masa.cli.main maps exceptions to them).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
