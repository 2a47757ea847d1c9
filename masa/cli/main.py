"""The `masa` command: one argparse parser whose subcommands are imported only when chosen.

Each command module exposes `register(subparsers)`, which adds its parsers
and sets `handler` (a function of the parsed arguments returning an exit
code). `masa --help` lists every command from the table below without
importing any of them, and `masa run ...` imports the run module alone: a
device's run path never loads OR-Tools, onnx or matplotlib.

Exit codes, the same for every command: 0 ok; 1 ran but something failed (a
job, a verification mismatch, no schedule found); 2 bad usage or input (one
line on stderr, no traceback); 3 internal error (one line; the traceback with
--debug); 130/143 interrupted by SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from masa import __version__
from masa.common.errors import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    RunFailed,
    UserError,
    one_line,
    os_error_line,
)
from masa.common.signals import handle_signals, interrupted_exit_code

# command -> (module that registers it, one-line help), in `masa --help` order.
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("model_prep.prepare_cli", "split an ONNX model into stages and profile them"),
    "verify": ("model_prep.prepare_cli", "check a prepared network against its source model"),
    "zoo": ("workloads.zoo_cli", "prepare replicas of the paper's nine networks"),
    "profile": ("model_prep.profile_cli", "(re)profile every stage of a prepared network"),
    "workload": ("workloads.workload_cli", "validate workloads, list jobs and scenarios"),
    "run": ("masa.cli.run", "run a workload under one policy"),
    "compare": ("masa.cli.run", "run a workload under several policies and compare"),
    "infer": ("masa.cli.run", "run one network on one input through the layer scheduler"),
    "demo": ("masa.cli.demo", "prepare a scaled zoo and compare the policies on it"),
    "optimal": ("solver.cli", "optimal schedule (CP-SAT) vs the heuristic on an instance"),
    "serve": ("masa.serve.cli", "run the device daemon (HTTP API, journal, metrics)"),
    "submit": ("masa.serve.client", "send images or tensors to a running `masa serve`"),
}

def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command` fully registered (its module imported) and every
    other command as a one-line entry for `masa --help`."""
    parser = argparse.ArgumentParser(
        prog="masa",
        description="Memory-aware multi-DNN inference on small edge devices.",
    )
    parser.add_argument("--version", action="version", version=f"masa {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--debug", action="store_true",
                        help="debug log and full tracebacks of internal errors")
    parser.add_argument("--plugin", action="append", default=[], metavar="FILE.py|MODULE",
                        help="load your Python code so that workloads can name its "
                             "functions as 'plugin:function' in call: and transform: "
                             "(repeatable); a workload never loads code itself")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = {COMMANDS[command][0]} if command in COMMANDS else set()
    registered: set[str] = set()
    for name, (module, help_text) in COMMANDS.items():
        if module in modules:
            if module not in registered:
                registered.add(module)
                importlib.import_module(module).register(subparsers)
        else:
            subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def _chosen_command(argv: Sequence[str]) -> str | None:
    """The subcommand named in argv (the first word that is one), if any."""
    words = iter(argv)
    for word in words:
        if word in COMMANDS:
            return word
        if word == "--plugin":
            next(words, None)  # its value
        elif not word.startswith("-"):
            return None
    return None


def load_plugins(specs: Sequence[str]) -> None:
    """Import the `--plugin` code (the only code a workload can name)."""
    if not specs:
        return
    from workloads.conditions import load_plugin  # imports numpy: only when asked for

    for spec in specs:
        try:
            load_plugin(spec)
        except ValueError as error:
            raise UserError(f"--plugin {spec}: {error}") from None


def configure_logging(verbose: int, quiet: bool, debug: bool = False) -> None:
    level = (logging.WARNING if quiet else logging.DEBUG if verbose >= 2 or debug
             else logging.INFO)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def run_handler(parser: argparse.ArgumentParser, args: argparse.Namespace, prog: str) -> int:
    """Call the chosen handler and map every outcome to the exit-code convention."""
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    debug = bool(getattr(args, "debug", False))
    try:
        with handle_signals():  # SIGINT/SIGTERM raise Interrupted (masa.common.signals)
            load_plugins(getattr(args, "plugin", []))
            return int(handler(args) or 0)
    except RunFailed as failure:
        _print_error(prog, f"error: {failure}", debug)
        return EXIT_FAILED
    except MemoryError as error:  # the machine's limit: neither bad input nor a bug
        _print_error(prog, f"error: out of memory ({one_line(error)})", debug)
        return EXIT_FAILED
    except UserError as error:
        _print_error(prog, f"error: {error}", debug)
        return EXIT_USAGE
    except KeyboardInterrupt as interruption:  # Ctrl-C, or masa.common.signals.Interrupted
        print(f"{prog}: {interruption or 'interrupted'}", file=sys.stderr)
        return interrupted_exit_code(interruption)
    except BrokenPipeError:
        # The reader went away (`masa optimal ... | head`): not an error of ours.
        # Point stdout at devnull so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as error:  # the machine's (a full or read-only disk), not a bug of ours
        _print_error(prog, f"error: {os_error_line(error)}", debug)
        return EXIT_FAILED
    except Exception as error:  # a bug: one line, the traceback only when asked for
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"{prog}: internal error: {type(error).__name__}: {error} "
              "(run with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _print_error(prog: str, line: str, debug: bool) -> None:
    """One line on stderr; with --debug the traceback first."""
    if debug:
        traceback.print_exc()
    print(f"{prog}: {' '.join(line.split())}", file=sys.stderr)  # one line, always


def main(argv: Sequence[str] | None = None, prog: str = "masa") -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_chosen_command(words))
    parser.prog = prog
    args = parser.parse_args(words)
    configure_logging(args.verbose, args.quiet, args.debug)
    return run_handler(parser, args, prog)


def optimal_main(argv: Sequence[str] | None = None) -> int:
    """`masa-optimal ARGS` is exactly `masa optimal ARGS`."""
    words = list(sys.argv[1:] if argv is None else argv)
    return main(["optimal", *words])


if __name__ == "__main__":
    sys.exit(main())
