"""What `masa prepare`, `masa verify` and `masa profile` share: exit codes and `--json`.

Exit codes:
- 0: done;
- 1: the input was valid and the command ran, but what it ran failed
  (`RunFailed`: the stages do not match the whole model, ONNX Runtime failed
  on a stage, a profiling worker died); one line on stderr;
- 2: bad usage or input (`UserError`, argparse): one line, no traceback;
- 3: an internal error (a bug).
masa.cli.main maps UserError to 2 and any other exception to 3 (one line, the
traceback with --debug) for every command. `RunFailed` is a UserError (see
model_prep.errors), so `exit_codes` turns it into 1 before main sees it.

`--json`: the command prints one JSON document on stdout and nothing else
there (progress bars and logs go to stderr); on exit 2 and 3 stdout stays
empty.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

from masa.common.errors import one_line
from model_prep.errors import RunFailed

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

Handler = Callable[[argparse.Namespace], int]


def exit_codes(handler: Handler) -> Handler:
    """Wrap a command handler: a RunFailed (or running out of memory) is one line, exit 1.

    Everything else goes on to masa.cli.main: UserError (2), interrupts, bugs (3).
    """

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except RunFailed as failure:
            print(f"masa: error: {failure}", file=sys.stderr)
            return EXIT_FAILED
        except MemoryError as exc:  # the machine's limit: neither bad input nor a bug
            print(f"masa: error: out of memory ({one_line(exc)})", file=sys.stderr)
            return EXIT_FAILED

    return run


def add_json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as one JSON document on stdout instead of text")


def print_json(document: Any) -> None:
    """One JSON document on stdout (strict: no NaN or Infinity)."""
    print(json.dumps(document, indent=1, allow_nan=False))
