"""Property tests: every loader and parser gives a value or a one-line UserError, never
another exception (issue 13, part 7).

Fuzzed: the size and duration parsers and the CLI's argparse types; the workload,
manifest and solver-instance loaders, on valid documents with one field replaced
by an arbitrary YAML/JSON value (or deleted) and on arbitrary text; `--random`
specs. A state-machine test of the core is tests/test_core_properties.py.
Examples are few per test (the suite stays fast); a failure prints the input.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from masa.common.argtypes import (
    duration_s,
    memory_budget,
    memory_size,
    non_negative_float,
    output_file,
    positive_int,
)
from masa.common.errors import UserError
from masa.common.units import MAX_MEMORY_BYTES, parse_memory_bytes
from model_prep.manifest import load_manifest, manifest_from_dict, manifest_to_dict
from solver.instance import instance_from_dict, load_instance, parse_random_spec
from workloads.loader import load_workload

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# Any value a YAML or JSON document can hold, kept small.
_SCALARS = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12))
VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
# Text that often looks like a size or a duration.
SIZE_TEXT = (st.text(max_size=20)
             | st.from_regex(r"\s*-?[0-9]{0,45}(\.[0-9]{0,5})?\s*[A-Za-z]{0,4}\s*", fullmatch=True))


def _one_line_user_error(call: Any, *args: Any) -> Any:
    """The call's value, or None after a UserError of one line; anything else fails."""
    try:
        return call(*args)
    except UserError as error:
        text = str(error)
        assert text and "\n" not in text, text
        return None


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _paths(document: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (tuple of keys and indexes) into a nested document, the root included."""
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _paths(value, prefix + (index,))
    return found


def _mutate(document: Any, data: st.DataObject) -> Any:
    """The document with the value at one drawn path replaced by a drawn value, or removed."""
    document = copy.deepcopy(document)
    paths = _paths(document)
    path = data.draw(st.sampled_from(paths), label="path")
    if not path:
        return data.draw(VALUES, label="document")
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(VALUES, label="value")
    return document


# ---------------------------------------------------------------- sizes and durations


@FUZZ
@given(text=SIZE_TEXT | st.integers(-2**80, 2**80))
def test_size_parser_gives_a_size_or_one_line(text: str | int) -> None:
    value = _one_line_user_error(parse_memory_bytes, text)
    if value is not None:
        assert isinstance(value, int) and 0 <= value <= MAX_MEMORY_BYTES


@FUZZ
@given(text=SIZE_TEXT)
def test_argparse_types_give_a_value_or_a_usage_error(text: str) -> None:
    for parse in (memory_size, memory_budget, duration_s, positive_int, non_negative_float):
        try:
            value = parse(text)
        except argparse.ArgumentTypeError as error:
            assert str(error) and "\n" not in str(error)
            continue
        assert value >= (1 if parse in (memory_budget, positive_int) else 0)
        assert value == value and value != float("inf")  # neither NaN nor infinite


@FUZZ
@given(text=st.text(max_size=30))
def test_output_file_gives_a_path_or_a_usage_error(text: str, tmp_path: Path) -> None:
    try:
        output_file(str(tmp_path / text) if text else text)
    except argparse.ArgumentTypeError as error:
        assert "\n" not in str(error)
    except ValueError as error:  # a NUL byte: Python's own refusal, before any I/O
        assert "null" in str(error)


@pytest.mark.parametrize("text, expected", [
    ("512MiB", 512 * 2**20), ("1GiB", 2**30), ("40MB", 40_000_000), ("1000", 1000),
    ("1.5KiB", 1536), ("2 kb", 2000), ("0", 0)])
def test_size_rule(text: str, expected: int) -> None:
    assert parse_memory_bytes(text) == expected


@pytest.mark.parametrize("text", ["64M", "64m", "1G", "2k", "3T"])
def test_bare_prefix_is_refused_with_both_readings(text: str) -> None:
    with pytest.raises(UserError) as caught:
        parse_memory_bytes(text, "--memory")
    message = str(caught.value)
    assert "ambiguous" in message and "iB (" in message and "B (" in message


# ---------------------------------------------------------------- workloads


VALID_WORKLOAD = {
    "name": "w", "graph": {"a": None, "b": {"after": "a", "when": {"probability": 0.5}}},
    "input": "random",
    "arrivals": {"kind": "poisson", "rate_per_s": 5, "count": 3, "seed": 1},
}


@FUZZ
@given(data=st.data())
def test_workload_loader_gives_a_workload_or_one_line(data: st.DataObject,
                                                      tmp_path: Path) -> None:
    document = _mutate(VALID_WORKLOAD, data)
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(document))
    _one_line_user_error(load_workload, path)


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200))
def test_workload_loader_on_any_text(text: str | bytes, tmp_path: Path) -> None:
    _one_line_user_error(load_workload, _write(tmp_path / "w.yaml", text))


@pytest.mark.parametrize("text", [
    "graph: [a]\narrivals: {kind: periodic, interval_ms: 1, count: " + "9" * 5000 + "}\n",
    "graph: [a]\narrivals: {kind: periodic, interval_ms: 1, count: 0b" + "1" * 300 + "}\n",
    "graph: " + "[" * 5000 + "]" * 5000 + "\n",
    "graph: [a]\narrivals: {kind: poisson, rate_per_s: 1e-300, count: 2}\n",
    "graph: [a]\narrivals: {kind: periodic, interval_ms: 1e300, count: 2}\n",
])
def test_workload_loader_on_extreme_values(text: str, tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    assert _one_line_user_error(load_workload, path) is None


# ---------------------------------------------------------------- manifests


@pytest.fixture(scope="module")
def prepared_chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small network split (not profiled) into a store."""
    from models import conv_chain, save

    from model_prep.prepare_cli import prepare_network

    root = tmp_path_factory.mktemp("fuzz-manifest")
    model = save(conv_chain(np.random.default_rng(0)), root, "chain")
    return prepare_network(model, root / "store", "chain", profile=False,
                           show_progress=False).manifest.directory


@FUZZ
@given(data=st.data())
def test_manifest_loader_gives_a_manifest_or_one_line(data: st.DataObject,
                                                      prepared_chain: Path) -> None:
    valid = manifest_to_dict(load_manifest(prepared_chain))
    document = _mutate(valid, data)
    _one_line_user_error(manifest_from_dict, document, "manifest.yaml", prepared_chain, False)


@FUZZ
@given(text=st.text(max_size=200))
def test_manifest_loader_on_any_text(text: str, tmp_path: Path) -> None:
    (tmp_path / "manifest.yaml").write_text(text)
    _one_line_user_error(load_manifest, tmp_path)


# ---------------------------------------------------------------- solver instances


VALID_INSTANCE = {
    "workers": 2, "memory": 100,
    "tasks": [{"id": "a", "kind": "load", "duration": 4, "memory": 0},
              {"id": "b", "kind": "exec", "duration": 2, "memory": 5, "release": 1}],
    "precedence": [["a", "b"]],
    "locks": [{"from": "a", "until": "b", "memory": 30}],
}


@FUZZ
@given(data=st.data())
def test_instance_loader_gives_an_instance_or_one_line(data: st.DataObject) -> None:
    _one_line_user_error(instance_from_dict, _mutate(VALID_INSTANCE, data), "i.json")


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=100))
def test_instance_file_on_any_text(text: str | bytes, tmp_path: Path) -> None:
    _one_line_user_error(load_instance, _write(tmp_path / "i.json", text))


@pytest.mark.parametrize("text", ['{"workers": 1, "memory": ' + "9" * 5000 + ', "tasks": []}',
                                  "[" * 100000 + "]" * 100000,
                                  '{"workers": 1, "memory": NaN, "tasks": []}'])
def test_instance_file_on_extreme_values(text: str, tmp_path: Path) -> None:
    path = tmp_path / "i.json"
    path.write_text(text)
    assert _one_line_user_error(load_instance, path) is None


@FUZZ
@given(text=st.text(max_size=60)
       | st.from_regex(r"(networks|layers|seed|tightness|workers)=-?[0-9.e]{0,8}"
                       r"(,(networks|layers|seed)=[0-9]{0,8})?", fullmatch=True))
def test_random_spec_gives_a_spec_or_one_line(text: str) -> None:
    _one_line_user_error(parse_random_spec, text)


def test_the_fuzzed_documents_are_valid_unmutated(prepared_chain: Path, tmp_path: Path) -> None:
    """The starting points load: the fuzzing explores around valid documents."""
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(VALID_WORKLOAD))
    assert load_workload(path).networks == ("a", "b")
    assert instance_from_dict(json.loads(json.dumps(VALID_INSTANCE))).num_tasks == 2
    valid = manifest_to_dict(load_manifest(prepared_chain))
    assert manifest_from_dict(valid, "m", prepared_chain).name == "chain"
