"""The shape of the code: layers, no import cycles, a pure core, a lean run path.

Imports are read from the source (every `import` statement, also inside
functions; those under `if TYPE_CHECKING:` are types only and do not count),
so a cycle hidden behind a function-level import fails here too.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from masa.cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("masa", "model_prep", "workloads", "solver")

# Lowest first: a module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("masa.common",),
    ("model_prep",),
    ("masa.sched",),
    ("workloads",),
    ("masa.runtime",),
    ("masa.report", "solver"),
    ("masa.serve",),
    ("masa.cli", "masa.__main__"),
)
# The scheduling core proper: plain data and functions.
CORE_MODULES = ("masa.sched.core", "masa.sched.policies", "masa.sched.taskgraph",
                "masa.sched.checker", "masa.sched.context")
HEAVY_MODULES = ("ortools", "onnx", "matplotlib")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST) -> Iterator[str]:
    """Every imported module name, skipping `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (name for child in node.orelse for name in _imports(child))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        yield from _imports(node)


def _graph() -> dict[str, set[str]]:
    files = {_module_name(path): path for package in PACKAGES
             for path in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        imported = set(_imports(ast.parse(path.read_text(), str(path))))
        graph[name] = {target for target in imported if target in files and target != name}
    return graph


def _layer(module: str) -> int | None:
    for index, layer in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in layer):
            return index
    return None


def _external(module: str, path: Path) -> Iterator[str]:
    for name in _imports(ast.parse(path.read_text())):
        yield name.split(".")[0]


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [m for m in _graph() if _layer(m) is None and m not in ("masa", *PACKAGES)]
    assert unplaced == []


def test_imports_only_go_down_the_layers() -> None:
    upward = [f"{module} -> {target}" for module, targets in _graph().items()
              for target in targets
              if (low := _layer(module)) is not None and (high := _layer(target)) is not None
              and high > low]
    assert upward == []


def test_no_import_cycle_between_modules() -> None:
    graph = _graph()
    colour: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str]:
        colour[module] = 1
        for target in sorted(graph[module]):
            if colour.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in colour and (cycle := visit(target, path + [target])):
                return cycle
        colour[module] = 2
        return []

    for module in sorted(graph):
        if module not in colour:
            cycle = visit(module, [module])
            assert cycle == [], " -> ".join(cycle)


def test_the_core_imports_only_the_standard_library_and_masa_common() -> None:
    allowed_own = ("masa.common", "masa.sched")
    for module in CORE_MODULES:
        path = ROOT / (module.replace(".", "/") + ".py")
        for name in _imports(ast.parse(path.read_text())):
            top = name.split(".")[0]
            if top in PACKAGES:
                assert name.startswith(allowed_own), f"{module} imports {name}"
            else:
                assert top in sys.stdlib_module_names or top == "__future__", \
                    f"{module} imports {name}"


def _run_python(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


_REPORT = f"""
import json, sys
from masa.common.procmem import peak_rss_bytes
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY_MODULES!r})
# VmHWM, not getrusage: ru_maxrss survives exec and would count the parent pytest.
rss_mib = peak_rss_bytes() / 2**20
print(json.dumps({{"heavy": heavy, "max_rss_mib": rss_mib}}))
"""


def test_importing_the_cli_loads_no_heavy_library() -> None:
    found = _run_python("import masa.cli.main" + _REPORT)
    assert found["heavy"] == []


@pytest.mark.parametrize("command", ["run", "infer", "compare"])
def test_run_help_is_lean(command: str) -> None:
    code = ("import contextlib, io\nfrom masa.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try: main([{command!r}, '--help'])\n"
            "    except SystemExit: pass\n" + _REPORT)
    found = _run_python(code)
    assert found["heavy"] == []
    assert found["max_rss_mib"] <= 60


@pytest.mark.slow
@pytest.mark.real
def test_a_real_run_and_infer_load_no_heavy_library(small_zoo_store: Path,
                                                    tmp_path: Path) -> None:
    import numpy as np

    from model_prep.feeds import random_feeds
    from model_prep.manifest import load_store_network

    manifest = load_store_network(small_zoo_store, "agenet")
    feeds = random_feeds(manifest.inputs, np.random.default_rng(1))
    np.save(tmp_path / "x.npy", next(iter(feeds.values())))
    workload = tmp_path / "w.yaml"
    workload.write_text("graph: [agenet, gendernet]\ninput: random\n"
                        "arrivals: {kind: periodic, interval_ms: 1, count: 2, seed: 1}\n")
    code = ("import contextlib, io\nfrom masa.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main(['-q', 'run', {str(workload)!r}, '--store', "
            f"{str(small_zoo_store)!r}, '--memory', '64MiB']) == 0\n"
            f"    assert main(['-q', 'infer', '--store', {str(small_zoo_store)!r}, "
            f"'--model', 'agenet', '--input', {str(tmp_path / 'x.npy')!r}, "
            f"'--out', {str(tmp_path / 'y.npz')!r}]) == 0\n" + _REPORT)
    assert _run_python(code)["heavy"] == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_listed_command_is_registered_by_its_module(command: str) -> None:
    parser = build_parser(command)
    subparsers = next(action for action in parser._actions
                      if isinstance(action, argparse._SubParsersAction))
    chosen = subparsers.choices[command]
    nested = any(isinstance(action, argparse._SubParsersAction) for action in chosen._actions)
    assert nested or chosen.get_default("handler") is not None


def test_no_function_is_longer_than_80_lines() -> None:
    long = []
    for folder in (*PACKAGES, "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 80:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {lines}")
    assert long == []
