"""YAML loading that cannot be made to fail outside the loaders' error reporting.

This module owns `bounded_loader`, the YAML loader class of every data file
(workloads, manifests): PyYAML's safe loader with integers of at most 40
characters. A longer integer is a mistake, and a harmful one: Python refuses
to print an integer of more than 4300 digits (ValueError from any error
message that shows it), and `0b1111...` builds one of any size without that
limit. The refusal is a YAML error at the integer's line, which the loaders
already report as one line.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_INT_CHARS = 40  # 10**40 is far beyond every count, size and time a file holds


def _bounded_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    if isinstance(text, str) and len(text.replace("_", "")) > MAX_INT_CHARS:
        raise yaml.constructor.ConstructorError(
            None, None, f"integer of {len(text)} characters (at most {MAX_INT_CHARS})",
            node.start_mark)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


def bounded_loader(base: type) -> type:
    """A subclass of the SafeLoader-like `base` (SafeLoader, CSafeLoader, or a subclass)
    that refuses over-long integers."""
    loader = type(f"Bounded{base.__name__}", (base,), {})
    loader.add_constructor("tag:yaml.org,2002:int", _bounded_int)
    return loader
