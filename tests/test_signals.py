"""SIGINT and SIGTERM (issue 13, part 4): stop dispatching, terminate running ONNX Runtime
calls, release every session, write the partial report, remove temporary folders,
exit 130/143.

The acceptance test sends SIGTERM to a real `masa run` subprocess on a small model;
the in-process tests interrupt the real executor at a known point (an observer
raising KeyboardInterrupt where the signal handler would) and check what it leaves.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import models
import numpy as np
import onnxruntime as ort
import pytest
from commands import Command

from masa.common.signals import Interrupted, handle_signals, interrupted_exit_code
from masa.runtime.driver import Observer
from masa.runtime.runner import RunOutcome, RunSettings, execute, prepare_run
from masa.runtime.threads import RealRunConfig, ThreadBackend
from model_prep.prepare_cli import prepare_network


@pytest.fixture(scope="module")
def chain_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("signals")
    model = models.save(models.conv_chain(np.random.default_rng(0)), root, "chain")
    prepare_network(model, root / "store", "chain", profile=False, show_progress=False)
    return root / "store"


def _long_workload(directory: Path, count: int = 400) -> Path:
    path = directory / "long.yaml"
    path.write_text(f"graph: [chain]\narrivals: {{kind: periodic, interval_ms: 20, "
                    f"count: {count}}}\n")
    return path


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_run_writes_the_partial_report(chain_store: Path, tmp_path: Path,
                                                     signum: int, code: int) -> None:
    report, trace, stderr = tmp_path / "r.json", tmp_path / "t.json", tmp_path / "err.txt"
    command = Command(["-vv", "run", str(_long_workload(tmp_path)), "--store",
                        str(chain_store), "--memory", "64MiB", "--report", str(report),
                        "--trace", str(trace)], stderr, tmp_path)
    command.wait_for_line("real run of 400 jobs started")
    command.wait_for_line("job 2 ended")  # some jobs done, others running or still to arrive
    command.send_signal(signum)
    assert command.wait() == code
    text = stderr.read_text()
    assert f"interrupted by {signal.Signals(signum).name}" in text
    assert "Traceback" not in text
    document = json.loads(report.read_text())
    assert document["partial"] is True
    assert document["interrupted_by"] == signal.Signals(signum).name
    statuses = {job["status"] for job in document["jobs"]}
    assert "interrupted" in statuses and statuses <= {"done", "interrupted"}
    assert document["summary"]["jobs_interrupted"] == sum(
        job["status"] == "interrupted" for job in document["jobs"])
    assert json.loads(trace.read_text())["traceEvents"]
    # Nothing temporary left beside the report (atomic writes' temporary names).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["err.txt", "long.yaml", "r.json",
                                                          "t.json"]


def test_sigterm_during_prepare_removes_the_work_folder(tmp_path: Path) -> None:
    model = models.save(models.conv_chain(np.random.default_rng(1)), tmp_path, "chain")
    store = tmp_path / "store"
    command = Command(["-vv", "prepare", str(model), "--store", str(store), "--runs", "50"],
                       tmp_path / "err.txt", tmp_path)
    command.wait_for_line("preparing chain in")  # the work folder was made
    assert any(store.glob(".prepare~*"))
    command.send_signal(signal.SIGTERM)
    assert command.wait() == 143
    assert "interrupted by SIGTERM" in (tmp_path / "err.txt").read_text()
    assert not [p for p in store.iterdir() if not p.name.startswith(".lock~")], \
        list(store.iterdir())


class _InterruptAfter(Observer):
    """Raises KeyboardInterrupt in the driver's thread after N dispatches, as the signal
    handler (masa.common.signals) does wherever the main thread is."""

    def __init__(self, dispatches: int, signum: int = signal.SIGTERM) -> None:
        self.left = dispatches
        self.signum = signum

    def dispatched(self, task_id: str, worker: int, now_us: int) -> None:
        self.left -= 1
        if self.left == 0:
            raise Interrupted(self.signum)


def test_interrupted_executor_releases_everything(chain_store: Path, tmp_path: Path) -> None:
    prepared = prepare_run(_long_workload(tmp_path, 20), chain_store)
    with pytest.raises(Interrupted) as caught:
        execute(prepared, RunSettings(workers=2, memory_budget_bytes=64 * 2**20),
                simulate=False, observers=[_InterruptAfter(9)])
    outcome = caught.value.partial
    assert isinstance(outcome, RunOutcome)
    assert outcome.interrupted == "SIGTERM"
    assert outcome.live_sessions_after == 0
    statuses = set(outcome.network_status.values())
    assert "interrupted" in statuses and statuses <= {"done", "interrupted"}
    assert caught.value.exit_code == 143


def test_abandon_drops_queued_tasks_and_terminates_running_calls(chain_store: Path) -> None:
    from model_prep.manifest import load_store_network

    manifest = load_store_network(chain_store, "chain")
    backend = ThreadBackend({"chain": manifest}, lambda *args: {},
                            RealRunConfig(workers=2, memory_budget_bytes=2**30))
    options = [ort.RunOptions(), ort.RunOptions()]
    backend.stages.run_options.update({"a": options[0], "b": options[1]})
    backend.work_queues[0].put(None)
    backend.work_queues[1].put(None)
    backend.abandon()
    assert all(option.terminate for option in options)
    assert all(queue.empty() for queue in backend.work_queues)


def test_handlers_are_installed_and_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with handle_signals():
        with pytest.raises(Interrupted) as caught:
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before
    assert caught.value.exit_code == 143 and caught.value.signal_name == "SIGTERM"
    assert interrupted_exit_code(KeyboardInterrupt()) == 130
