"""A table of bad inputs (issue 13, part 3): each gives its exit code and one clear line,
never a traceback.

Exit 2 for bad usage or input (files, flags, YAML, manifests, solver instances),
1 for a valid run that failed (a full or read-only disk, a predicate that raised),
130/143 for SIGINT/SIGTERM. Every case runs `masa.cli.main.main` in-process; a
full disk is a mocked OSError and, where this machine lets us mount one, a
small tmpfs. tests/test_signals.py sends real signals to real processes.
"""

from __future__ import annotations

import errno
import json
import logging
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import models
import numpy as np
import onnx
import pytest
import yaml

from masa.cli.main import main
from model_prep.manifest import MANIFEST_NAME
from model_prep.prepare_cli import prepare_network

pytestmark = pytest.mark.real


@dataclass(frozen=True)
class Env:
    """What the cases refer to: a store with one prepared network, and scratch files."""

    root: Path
    store: Path
    workload: Path
    input_npy: Path

    def file(self, name: str, text: str | bytes) -> str:
        path = self.root / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return str(path)

    def workload_with(self, name: str, text: str) -> str:
        return self.file(name, text)

    def store_with(self, name: str, edit: Callable[[dict], None]) -> str:
        """A copy of the store whose manifest `edit` changed (a hand-edited manifest)."""
        copy = self.root / name
        subprocess.run(["cp", "-r", str(self.store), str(copy)], check=True)
        manifest = copy / "chain" / MANIFEST_NAME
        raw = yaml.safe_load(manifest.read_text())
        edit(raw)
        manifest.write_text(yaml.safe_dump(raw, sort_keys=False))
        return str(copy)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    root = tmp_path_factory.mktemp("bad-inputs")
    model = models.save(models.conv_chain(np.random.default_rng(0)), root, "chain")
    prepare_network(model, root / "store", "chain", profile=False, show_progress=False)
    workload = root / "w.yaml"
    workload.write_text("graph: [chain]\narrivals: {kind: periodic, interval_ms: 5, count: 2}\n")
    np.save(root / "x.npy", np.zeros((1, 3, 16, 16), np.float32))
    return Env(root, root / "store", workload, root / "x.npy")


def _run(env: Env, *extra: str) -> list[str]:
    return ["run", str(env.workload), "--store", str(env.store), "--simulate", *extra]


def _model_bytes(mangle: Callable[[onnx.ModelProto], None]) -> bytes:
    model = models.conv_chain(np.random.default_rng(2))
    mangle(model)
    return model.SerializeToString()


def _invalid_utf8_name() -> bytes:
    """A model whose graph name is not UTF-8 (a flipped byte in a string field)."""
    data = _model_bytes(lambda m: setattr(m.graph, "name", "GRAPHNAME"))
    return data.replace(b"GRAPHNAME", b"GRAPH\xca\xcaME")


def _unknown_dtype(model: onnx.ModelProto) -> None:
    model.graph.value_info.add().CopyFrom(
        onnx.helper.make_tensor_value_info("r1", onnx.TensorProto.FLOAT, [1, 8, 16, 16]))
    model.graph.value_info[0].type.tensor_type.elem_type = 63


def _stage(index: int, key: str, value: object) -> Callable[[dict], None]:
    def edit(raw: dict) -> None:
        raw["stages"][index][key] = value
    return edit


def _output_bytes(raw: dict) -> None:
    raw["stages"][0]["outputs"][0]["bytes"] = 1
    raw["stages"][1]["inputs"][0]["bytes"] = 1


def _profile(raw: dict) -> None:
    raw["stages"][0]["profile"] = {
        "load_time_us": 1, "exec_time_us": 1, "exec_runs": 1, "load_peak_bytes": -5,
        "resident_bytes": 1, "exec_peak_bytes": 1, "sampled_load_peak_bytes": 1,
        "sampled_exec_peak_bytes": 1, "sampling_interval_us": 1.0}


_INSTANCE = {"workers": 1, "memory": 10,
             "tasks": [{"id": "a", "kind": "exec", "duration": 1, "memory": 1}]}
_CYCLE = {"workers": 1, "memory": 10,
          "tasks": [{"id": "a", "kind": "exec", "duration": 1, "memory": 1},
                    {"id": "b", "kind": "exec", "duration": 1, "memory": 1}],
          "precedence": [["a", "b"], ["b", "a"]]}

# (id, argv from the environment, exit code, text the error line holds)
CASES: list[tuple[str, Callable[[Env], list[str]], int, str]] = [
    # ---- flags
    ("memory-zero", lambda e: _run(e, "--memory", "0"), 2, "expected a positive size"),
    ("memory-one-byte", lambda e: _run(e, "--memory", "1B"), 2,
     "below what the largest task needs alone"),
    ("memory-bare-M", lambda e: _run(e, "--memory", "64M"), 2,
     "'64M' is ambiguous: write 64MiB (67108864 bytes) or 64MB (64000000 bytes)"),
    ("memory-negative", lambda e: _run(e, "--memory=-5MiB"), 2, "expected a size"),
    ("memory-exponent", lambda e: _run(e, "--memory", "1e3"), 2, "expected a size"),
    ("memory-huge", lambda e: _run(e, "--memory", "9" * 60 + "GiB"), 2, "at most 1 EiB"),
    ("workers-zero", lambda e: _run(e, "--workers", "0"), 2, "expected a positive integer"),
    ("jobs-negative", lambda e: _run(e, "--jobs", "-1"), 2, "expected a positive integer"),
    ("policy-unknown", lambda e: _run(e, "--policy", "fastest"), 2, "invalid choice"),
    ("infer-memory-zero", lambda e: ["infer", "--store", str(e.store), "--model", "chain",
                                     "--input", str(e.input_npy), "--out", "y.npz",
                                     "--memory", "0"], 2, "expected a positive size"),
    ("compare-policy-unknown", lambda e: ["compare", str(e.workload), "--store", str(e.store),
                                          "--policies", "masa,fastest", "--simulate"], 2,
     "--policies"),
    ("report-is-a-directory", lambda e: _run(e, "--report", str(e.root)), 2, "is a directory"),
    ("report-is-a-device", lambda e: _run(e, "--report", "/dev/null"), 2,
     "not a regular file"),
    ("out-is-a-directory", lambda e: ["infer", "--store", str(e.store), "--model", "chain",
                                      "--input", str(e.input_npy), "--out", str(e.root)], 2,
     "is a directory"),
    ("time-limit-infinite", lambda e: ["optimal", "--random", "networks=1,layers=1",
                                       "--time-limit", "inf"], 2, "finite"),
    ("time-limit-nan", lambda e: ["optimal", "--random", "networks=1,layers=1",
                                  "--time-limit", "nan"], 2, "finite"),
    ("min-stage-bytes-bare-k", lambda e: ["prepare", str(e.root / "chain.onnx"), "--store",
                                          str(e.root / "s2"), "--min-stage-bytes", "5k",
                                          "--no-profile"], 2, "ambiguous"),
    # ---- files
    ("workload-missing", lambda e: ["run", str(e.root / "nope.yaml"), "--store", str(e.store)],
     2, "no such workload file"),
    ("workload-binary", lambda e: ["run", e.file("bin.yaml", b"\xff\xfe\x00graph"), "--store",
                                   str(e.store)], 2, "not a text file"),
    ("model-missing", lambda e: ["prepare", str(e.root / "nope.onnx"), "--store",
                                 str(e.root / "s3")], 2, "no such file"),
    ("model-not-onnx", lambda e: ["prepare", e.file("text.onnx", "hello"), "--store",
                                  str(e.root / "s3"), "--no-profile"], 2, "not"),
    ("model-truncated", lambda e: ["prepare", e.file("cut.onnx", _model_bytes(lambda m: None)
                                                     [:300]), "--store", str(e.root / "s3"),
                                   "--no-profile"], 2, "cut.onnx"),
    ("model-invalid-utf8", lambda e: ["prepare", e.file("utf8.onnx", _invalid_utf8_name()),
                                      "--store", str(e.root / "s3"), "--no-profile"], 2,
     "not a valid ONNX model"),
    ("model-unknown-dtype", lambda e: ["prepare", e.file("dtype.onnx",
                                                         _model_bytes(_unknown_dtype)),
                                       "--store", str(e.root / "s3"), "--no-profile",
                                       "--no-ort-optimize"], 2, "dtype.onnx"),
    ("input-missing", lambda e: ["infer", "--store", str(e.store), "--model", "chain",
                                 "--input", str(e.root / "nope.npy"), "--out", "y.npz"], 2,
     "nope.npy"),
    ("input-wrong-shape", lambda e: ["infer", "--store", str(e.store), "--model", "chain",
                                     "--input", e.file("small.npy", _npy((1, 3, 4, 4))),
                                     "--out", "y.npz"], 2, "expected shape"),
    ("network-unknown", lambda e: ["infer", "--store", str(e.store), "--model", "facenet",
                                   "--input", str(e.input_npy), "--out", "y.npz"], 2,
     "no prepared network 'facenet'"),
    # ---- YAML
    ("count-a-billion", lambda e: _run_yaml(e, "count: 1000000000"), 2,
     "expected at most 1000000 jobs"),
    ("count-binary-huge", lambda e: _run_yaml(e, "count: 0b" + "1" * 200), 2, "integer of"),
    ("count-decimal-huge", lambda e: _run_yaml(e, "count: " + "9" * 5000), 2, "integer of"),
    ("interval-huge", lambda e: _run_yaml(e, "count: 2", interval="1e300"), 2,
     "arrivals.interval_ms"),
    ("rate-tiny", lambda e: ["run", e.workload_with("rate.yaml", "graph: [chain]\narrivals: "
                                                    "{kind: poisson, rate_per_s: 1e-300, "
                                                    "count: 2}\n"), "--store", str(e.store)],
     2, "arrivals.rate_per_s"),
    ("too-many-networks", lambda e: ["workload", "check", e.workload_with(
        "many.yaml", "graph: [" + ", ".join(f"n{i}" for i in range(300)) + "]\narrivals: "
        "{kind: periodic, interval_ms: 1, count: 1}\n")], 2, "at most 256 networks"),
    ("duplicate-key", lambda e: ["workload", "check", e.workload_with(
        "dup.yaml", "graph: [chain]\ngraph: [chain]\n")], 2, "duplicate key"),
    ("nested-too-deep", lambda e: ["workload", "check", e.workload_with(
        "deep.yaml", "graph: " + "[" * 3000 + "]" * 3000 + "\n")], 2, "deep.yaml"),
    ("call-a-file-path", lambda e: ["workload", "check", e.workload_with(
        "evil.yaml", "graph:\n  a: {}\n  b: {after: a, when: {call: 'evil.py:f'}}\n"
        "arrivals: {kind: periodic, interval_ms: 1, count: 1}\n")], 2, "no plugin 'evil.py'"),
    ("intensity-huge", lambda e: ["workload", "check", e.workload_with(
        "int.yaml", "graph: [chain]\nintensity: 1e9\narrivals: {kind: poisson, count: 2}\n")],
     2, "intensity"),
    # ---- manifests
    ("weight-bytes-negative", lambda e: _run_store(e, e.store_with(
        "m1", _stage(0, "weight_bytes", -896))), 2, "stages[0].weight_bytes"),
    ("tensor-bytes-one", lambda e: _run_store(e, e.store_with("m2", _output_bytes)), 2,
     "expected 8192 (shape [1, 8, 16, 16] of float32), got 1"),
    ("mapped-bytes-edited", lambda e: _run_store(e, e.store_with(
        "m3", _stage(1, "mapped_bytes", 1))), 2, "stages[1].mapped_bytes"),
    ("mapped-above-weights", lambda e: _run_store(e, e.store_with(
        "m4", _stage(1, "weight_bytes", 10))), 2, "expected at most weight_bytes"),
    ("profile-negative", lambda e: _run_store(e, e.store_with("m5", _profile)), 2,
     "load_peak_bytes"),
    ("producer-not-an-id", lambda e: _run_store(e, e.store_with(
        "m6", _stage(1, "producers", [[]]))), 2, "expected stage ids"),
    ("manifest-huge-int", lambda e: _run_store(e, _huge_int_manifest(e)), 2, "integer of"),
    # ---- solver instances
    ("instance-huge-int", lambda e: ["optimal", e.file("i1.json", json.dumps(
        _INSTANCE).replace('"memory": 10', '"memory": ' + "9" * 5000))], 2, "invalid JSON"),
    ("instance-nan", lambda e: ["optimal", e.file("i2.json", json.dumps(_INSTANCE).replace(
        '"memory": 10', '"memory": NaN'))], 2, "NaN is not a JSON number"),
    ("instance-binary", lambda e: ["optimal", e.file("i3.json", b"\x80\x81")], 2,
     "not a text file"),
    ("instance-cycle", lambda e: ["optimal", e.file("i4.json", json.dumps(_CYCLE))], 2,
     "cyclic precedence: a -> b -> a"),
    ("random-spec-zero", lambda e: ["optimal", "--random", "networks=0"], 2,
     "expected an integer >= 1"),
]


def _npy(shape: tuple[int, ...]) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.zeros(shape, np.float32))
    return buffer.getvalue()


def _run_yaml(env: Env, count: str, interval: str = "5") -> list[str]:
    name = f"y{abs(hash((count, interval)))}.yaml"
    return ["run", env.workload_with(name, f"graph: [chain]\narrivals: {{kind: periodic, "
                                           f"interval_ms: {interval}, {count}}}\n"),
            "--store", str(env.store), "--jobs", "1", "--simulate"]


def _run_store(env: Env, store: str) -> list[str]:
    return ["run", str(env.workload), "--store", store, "--simulate"]


def _huge_int_manifest(env: Env) -> str:
    store = env.store_with("m7", lambda raw: None)
    manifest = Path(store) / "chain" / MANIFEST_NAME
    manifest.write_text(manifest.read_text().replace("ir_version: 8",
                                                     "ir_version: 0b" + "1" * 100))
    return store


def _check(argv: list[str], code: int, text: str, capsys: pytest.CaptureFixture[str]) -> str:
    """main(argv) exits `code` with one error line holding `text`, and no traceback."""
    try:
        exit_code = main(argv)
    except SystemExit as stop:  # argparse's usage errors
        exit_code = stop.code
    err = capsys.readouterr().err
    assert exit_code == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("masa") and "error" in line
             or "interrupted" in line]
    assert len(lines) == 1, err
    assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_bad_input(case: tuple, env: Env, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    _, argv, code, text = case
    monkeypatch.chdir(env.root)
    _check(argv(env), code, text, capsys)


def test_the_table_is_long_enough() -> None:
    assert len(CASES) >= 40


def test_a_file_path_in_call_runs_nothing(env: Env, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(env.root)
    marker = env.root / "marker"
    env.file("evil.py", f"open({str(marker)!r}, 'w').close()\ndef f(outputs):\n    return True\n")
    for spec in ("evil.py:f", str(env.root / "evil.py") + ":f"):
        workload = env.workload_with("evil2.yaml", "graph:\n  a: {}\n  b: {after: a, when: "
                                     f"{{call: '{spec}'}}}}\narrivals: {{kind: periodic, "
                                     "interval_ms: 1, count: 1}\n")
        _check(["workload", "check", workload], 2, "no plugin", capsys)
    assert not marker.exists()


# ---------------------------------------------------------------- runtime failures: exit 1


def _full_disk(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_report_onto_a_full_disk_exits_1(env: Env, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from masa.report import report

    monkeypatch.setattr(report, "atomic_write_text", _full_disk)
    line = _check(_run(env, "--report", str(tmp_path / "r.json")), 1,
                  "cannot write the report: No space left on device", capsys)
    assert str(tmp_path / "r.json") in line


def test_outputs_onto_a_read_only_disk_exit_1(env: Env, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from masa.cli import run

    def read_only(*args: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(run, "atomic_write_bytes", read_only)
    _check(["infer", "--store", str(env.store), "--model", "chain", "--input",
            str(env.input_npy), "--out", str(tmp_path / "y.npz")], 1,
           "cannot write the outputs: Read-only file system", capsys)


@pytest.fixture()
def small_fs(tmp_path: Path) -> Path:
    """A 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    (mount_point / "filler").write_bytes(b"\0" * 60 * 1024)
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=False)


def test_trace_onto_a_really_full_disk_exits_1(env: Env, small_fs: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = small_fs / "t.json"
    _check(_run(env, "--trace", str(trace)), 1, "cannot write the trace", capsys)
    assert not trace.exists()
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]  # no temporary left


def test_profile_on_a_read_only_store_refuses_before_profiling(
        env: Env, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from model_prep import profile_cli

    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount_point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        subprocess.run(["cp", "-r", str(env.store / "chain"), str(mount_point)], check=True)
        subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
        profiled: list[object] = []
        monkeypatch.setattr(profile_cli, "profile_network",
                            lambda *args, **kwargs: profiled.append(args))
        _check(["profile", str(mount_point / "chain")], 2, "cannot rewrite the manifest",
               capsys)
        assert not profiled
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_a_predicate_that_raises_fails_its_network(env: Env, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Part 2's last sentence: the network fails with the message, the run goes on."""
    prepare_network(env.root / "chain.onnx", env.store, "chain2", profile=False,
                    show_progress=False)
    plugin = tmp_path / "rules.py"
    plugin.write_text("def boom(outputs):\n    raise ValueError('predicate exploded')\n")
    workload = tmp_path / "cascade.yaml"
    workload.write_text("graph:\n  chain: {}\n  chain2: {after: chain, when: {call: "
                        "'rules:boom'}}\narrivals: {kind: periodic, interval_ms: 5, "
                        "count: 2}\n")
    for context in ("wait", "preempt"):
        report = tmp_path / f"{context}.json"
        assert main(["--plugin", str(plugin), "run", str(workload), "--store", str(env.store),
                     "--context", context, "--report", str(report)]) == 1
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        assert "failed: j0/chain2: condition of 'chain2' raised ValueError: predicate " \
               "exploded" in captured.out
        document = json.loads(report.read_text())
        networks = {n["group"]: n for job in document["jobs"] for n in job["networks"]}
        assert networks["j0/chain"]["status"] == "done"
        assert networks["j0/chain2"]["status"] == "failed"
        assert "ValueError: predicate exploded" in networks["j0/chain2"]["reason"]
        assert "Traceback" in document["meta"]["error_tracebacks"]["j0/chain2"]


def test_a_worker_failure_keeps_its_traceback(env: Env, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """Part 6: the full traceback of a failed task in the report, the cause in one line."""
    store = Path(env.store_with("broken", lambda raw: None))
    stage = store / "chain" / "stages" / "s002.onnx"
    stage.write_bytes(b"garbage")
    manifest = store / "chain" / MANIFEST_NAME
    raw = yaml.safe_load(manifest.read_text())
    import hashlib

    raw["stages"][2]["sha256"] = hashlib.sha256(b"garbage").hexdigest()
    manifest.write_text(yaml.safe_dump(raw, sort_keys=False))
    for stale in store.glob("chain/.verified*"):
        stale.unlink()
    report = tmp_path / "r.json"
    caplog.set_level(logging.DEBUG, logger="masa.runtime.driver")
    assert main(["--debug", "run", str(env.workload), "--store", str(store), "--report",
                 str(report)]) == 1
    document = json.loads(report.read_text())
    errors = document["meta"]["errors"]
    assert errors and all("s002" in error for error in errors.values())
    tracebacks = document["meta"]["error_tracebacks"]
    assert tracebacks.keys() == errors.keys()
    assert all(text.startswith("Traceback") for text in tracebacks.values())
    assert any("Traceback" in record.getMessage() for record in caplog.records
               if record.levelname == "DEBUG")  # the debug log has it as well


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_exits_128_plus_its_number(env: Env, signum: int, code: int,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The handler main installs: a signal while a command works is one line and 130/143."""
    from masa.runtime import runner

    def signalled(*args: object, **kwargs: object) -> None:
        signal.raise_signal(signum)

    monkeypatch.setattr(runner, "load_workload", signalled)
    _check(_run(env), code, f"interrupted by {signal.Signals(signum).name}", capsys)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
