"""What every command prints on stdout for `--json`: one strict JSON document."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_json_flag(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as one JSON document on stdout instead of text")


def print_json(document: Any) -> None:
    """One JSON document on stdout (strict: no NaN or Infinity)."""
    print(json.dumps(document, indent=1, allow_nan=False))
