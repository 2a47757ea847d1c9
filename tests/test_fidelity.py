"""The budget holds in the process, not only in the ledger (issue 10's fidelity point).

A real `masa run` (its own process, as a user runs it) on profiled manifests, with a
budget far below what the networks need loaded together, must hold no more than the
budget plus 5% by the process's own measure: anonymous memory above the run's
baseline plus the loaded stages' weights in memory (masa.runtime.threads).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from masa.cli.demo import demo_budget_bytes, network_need_bytes
from masa.runtime.runner import prepare_run
from workloads.zoo import write_zoo

NETWORKS = ("agenet", "gendernet", "tinyyolo", "facenet")
SLACK = 1.05  # issue 10: measured peak at most budget x 1.05


@pytest.fixture(scope="module")
def profiled_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """The demo's networks at scale 0.4, profiled; six images at once; the budget."""
    store = tmp_path_factory.mktemp("profiled-zoo")
    manifests = write_zoo(store, list(NETWORKS), scale=0.4, profile=True, profile_runs=2)
    workload = store / "fidelity.yaml"
    workload.write_text(
        "name: fidelity\n"
        f"graph: [{', '.join(NETWORKS)}]\n"
        "input: random\n"
        "arrivals: {kind: periodic, interval_ms: 20, count: 6, seed: 1}\n")
    need_bytes = sum(network_need_bytes(m) for m in manifests)
    budget_bytes = demo_budget_bytes(prepare_run(workload, store), need_bytes)
    return store, budget_bytes, need_bytes


def masa_run(store: Path, policy: str, budget_bytes: int) -> dict[str, Any]:
    """`masa run --json` in a child process: its report."""
    completed = subprocess.run(
        [sys.executable, "-m", "masa", "run", str(store / "fidelity.yaml"), "--store",
         str(store), "--policy", policy, "--memory", str(budget_bytes), "--json"],
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.profile
def test_masa_holds_its_budget_in_the_process(profiled_store: tuple[Path, int, int]) -> None:
    store, budget_bytes, need_bytes = profiled_store
    assert need_bytes > 1.5 * budget_bytes  # the budget binds

    masa = masa_run(store, "masa", budget_bytes)
    assert {job["status"] for job in masa["jobs"]} == {"done"}
    # Measured memory the ledger does not model shrinks the budget the core sees
    # (memory source "measured", the default): a task may then run alone under the
    # progress rule, never beside another one.
    assert {o["reason"] for o in masa["over_commits"]} <= {"progress"}
    measured_bytes = masa["summary"]["peak_measured_bytes"]
    # On failure, say whether the ledger itself went over (a progress-rule over-commit)
    # or only what it does not model.
    over_commits = [(o["task_id"], o["footprint_bytes"], o["reserved_bytes"])
                    for o in masa["over_commits"]]
    assert measured_bytes <= SLACK * budget_bytes, (
        f"measured {measured_bytes} B, budget {budget_bytes} B: "
        f"{measured_bytes / budget_bytes:.3f}x; ledger peak "
        f"{masa['summary']['peak_reserved_bytes'] / budget_bytes:.3f}x; "
        f"over-commits (task, footprint, reserved after) {over_commits}")

    bulk = masa_run(store, "bulk", budget_bytes)
    assert {job["status"] for job in bulk["jobs"]} == {"done"}
    # Bulk loads whole networks before it runs them: the measure counts mapped weights
    # from their LOAD on, touched or not, so it sees what the ledger holds (the
    # resident set alone saw about 0.76x of it here: untouched weights are not in it).
    summary = bulk["summary"]
    assert summary["peak_measured_bytes"] >= 0.9 * summary["peak_reserved_bytes"]
