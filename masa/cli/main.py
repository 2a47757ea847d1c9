"""The `masa` command: one argparse parser, subcommands registered by their modules.

Each command module exposes `register(subparsers)`, which adds its parser and
sets `handler` (a function of the parsed arguments returning an exit code).
User errors (`UserError`) print one line on stderr and exit 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from masa import __version__
from masa.common.errors import UserError

# Modules that register a subcommand, in the order `masa --help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "model_prep.prepare_cli",
    "workloads.zoo_cli",
    "model_prep.profile_cli",
    "workloads.workload_cli",
    "masa.cli.run",
    "masa.cli.demo",
    "solver.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="masa",
        description="Memory-aware multi-DNN inference on small edge devices.",
    )
    parser.add_argument("--version", action="version", version=f"masa {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def configure_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose >= 2 else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def run_handler(parser: argparse.ArgumentParser, args: argparse.Namespace, prog: str) -> int:
    """Call the chosen handler; turn user errors into one line and exit code 2."""
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`masa-optimal ... | head`): not an error of ours.
        # Point stdout at devnull so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose, args.quiet)
    return run_handler(parser, args, "masa")


if __name__ == "__main__":
    sys.exit(main())
